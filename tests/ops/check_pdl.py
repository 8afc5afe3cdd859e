#!/usr/bin/env python3
"""The contract of kernels/cuda/cuda_pdl.cuh, checked in the sources: every
kernel that cu_launch or cu_launch_cluster launches (with programmatic dependent launch it may
start while the kernel before it still runs) calls pdl_wait() and
pdl_launch_dependents(), itself or through a device function that does
(gemv_tile_warp). A kernel that forgot the wait would race with its
predecessor only on a Hopper GPU, and only sometimes; this test fails on any
machine instead.

    check_pdl.py KERNELS_CUDA_DIR
"""
import glob
import os
import re
import sys


def bodies(text):
    """{name: body} of the functions defined in text (device and global)."""
    out = {}
    for m in re.finditer(r"\b(\w+)\s*\([^;{)]*(?:\([^)]*\)[^;{)]*)*\)\s*\{", text):
        name = m.group(1)
        if name in ("if", "for", "while", "switch", "sizeof", "return"):
            continue
        depth, i = 0, m.end() - 1
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        out.setdefault(name, text[m.end():i])
    return out


def main():
    src = sys.argv[1]
    text = ""
    for path in sorted(glob.glob(os.path.join(src, "*.cu")) + glob.glob(os.path.join(src, "*.cuh"))):
        with open(path, encoding="utf-8") as f:
            text += f.read() + "\n"
    funcs = bodies(text)
    launched = set(re.findall(r"\bcu_launch(?:_cluster)?\(\s*[^,]+,\s*(\w+)", text))
    launched.discard("void")  # cu_launch's own parameter list, in its definition
    launched.discard("kernel")  # cu_launch passing its parameter on to cu_launch_cluster
    if not launched:
        print("check_pdl: no cu_launch call found: the scan is broken")
        return 1

    def does(name, call, seen=()):
        body = funcs.get(name, "")
        if re.search(r"\b" + call + r"\s*\(\s*\)", body):
            return True
        return any(does(callee, call, seen + (name,))
                   for callee in set(re.findall(r"\b(\w+)\s*(?:<[^<>;]*>)?\s*\(", body))
                   if callee in funcs and callee not in seen and callee != name)

    failed = 0
    for k in sorted(launched):
        if k not in funcs:
            print(f"check_pdl: {k}: launched by cu_launch, definition not found")
            failed += 1
            continue
        for call in ("pdl_wait", "pdl_launch_dependents"):
            if not does(k, call):
                print(f"check_pdl: {k}: launched by cu_launch but never calls {call}()")
                failed += 1
    print(f"check_pdl: {len(launched)} kernels launched by cu_launch, {failed} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
