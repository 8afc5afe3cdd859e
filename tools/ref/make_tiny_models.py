#!/usr/bin/env python3
"""Tiny random-weight models and the reference outputs of Hugging Face transformers.

The model tests of atlas (tests/model/test_fidelity.c) load these directories
and compare atlas' logits and greedy tokens with what transformers computed.
Needs torch and transformers (written for transformers 5.17 / torch 2.11, also
runs with 4.x), no network. Everything runs on the CPU, one thread, in
eval mode, with eager attention, so that the output is deterministic:

    python3 tools/ref/make_tiny_models.py --out tests/fidelity/models [--only NAME[,NAME]]

(--only remakes the named models and leaves the others as they are.) The
Qwen3-MoE models come from the sibling make_moe_models.py, which imports
this script's helpers and writes the same layout; make_mtp_model.py makes
qwen3_f32_mtp; make_hybrid_models.py the Qwen3-Next and Qwen3.5 models
(Gated DeltaNet layers), with a multi-turn and an MTP-head reference.

For each model, OUT/<name>/ gets what save_pretrained writes (config.json,
generation_config.json, model.safetensors or shards and their index) and
OUT/<name>/ref/ gets:

    ref.json               versions, dtype, vocab, the token sequences, greedy
                           continuations (tokens and the top-2 logit gap of
                           every step), and for bf16/f16 models the largest
                           difference between their logits and the float32
                           upcast model's
    logits_<i>.f32         sequence i's logits computed by the model in its own
                           dtype: float32 little-endian, [len(ids) x vocab]
    logits_<i>.upcast.f32  bf16/f16 models only: the same weights upcast to
                           float32 (what a float32 engine should reproduce)

The whole output stays well under 6 MB.
"""
import argparse
import array
import json
import os
import random
import shutil
import sys

import torch
import transformers
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

V5 = int(transformers.__version__.split(".")[0]) >= 5

SEQ_LENGTHS = (1, 5, 17, 64, 200)
PROMPT_LENGTHS = (4, 11)
NEW_TOKENS = 24
MAX_POSITIONS = 512
BOS, PAD = 1, 0

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

# (a)-(e) of the task: every family, dtype, attention layout and config
# feature the loader supports, at sizes that keep the files small.
MODELS = [
    dict(name="qwen3_f32_gqa_tied", family="qwen3", dtype="float32", vocab=384, hidden=64,
         intermediate=128, heads=4, kv_heads=2, head_dim=32, tie=True, theta=1e6, eos=2, seed=11),
    dict(name="qwen3_bf16_mha_untied", family="qwen3", dtype="bfloat16", vocab=256, hidden=64,
         intermediate=160, heads=4, kv_heads=4, head_dim=16, tie=False, theta=1e4, eos=2,
         seed=12),
    dict(name="llama_f32_gqa_llama3_bias", family="llama", dtype="float32", vocab=320,
         hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, tie=False, theta=1e4,
         llama3=LLAMA3, attention_bias=True, mlp_bias=True, eos=2, seed=13),
    dict(name="llama_bf16_mha_tied_odd", family="llama", dtype="bfloat16", vocab=317, hidden=72,
         intermediate=100, heads=6, kv_heads=6, head_dim=12, tie=True, theta=5e5, eos=2,
         seed=14),
    dict(name="qwen3_f16_gqa_sharded", family="qwen3", dtype="float16", vocab=384, hidden=64,
         intermediate=128, heads=4, kv_heads=2, head_dim=32, tie=False, theta=1e6, eos=[2, 3],
         shard="100KB", seed=15),
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_config(spec):
    rope = {"rope_type": "default", "rope_theta": spec["theta"]}
    if "llama3" in spec:
        rope = {"rope_type": "llama3", "rope_theta": spec["theta"], **spec["llama3"]}
    kw = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
              intermediate_size=spec["intermediate"], num_hidden_layers=2,
              num_attention_heads=spec["heads"], num_key_value_heads=spec["kv_heads"],
              head_dim=spec["head_dim"], max_position_embeddings=MAX_POSITIONS,
              rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=spec["tie"],
              attention_bias=spec.get("attention_bias", False), bos_token_id=BOS,
              eos_token_id=spec["eos"], pad_token_id=PAD)
    if V5:
        kw["rope_parameters"] = rope
    else:
        kw["rope_theta"] = spec["theta"]
        kw["rope_scaling"] = {"rope_type": "llama3", **spec["llama3"]} if "llama3" in spec else None
    if spec["family"] == "llama":
        return LlamaConfig(mlp_bias=spec.get("mlp_bias", False), **kw), LlamaForCausalLM
    return Qwen3Config(**kw), Qwen3ForCausalLM


def init_weights(model, seed):
    """Weights large enough that logits spread over several units: matrices
    N(0, 0.1^2), embeddings N(0, 0.5^2), biases N(0, 0.1^2), norm weights
    1 + N(0, 0.1^2). named_parameters() lists tied weights once."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.1 * noise)


def load(path, dtype):
    kw = {"dtype" if V5 else "torch_dtype": dtype}
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **kw).eval()


def top2_gap(logits):
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def greedy(model, prompts):
    runs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=PAD)
        tokens = out.sequences[0, len(prompt):].tolist()
        runs.append({"prompt": prompt, "tokens": tokens,
                     "gaps": [top2_gap(step[0]) for step in out.logits[:len(tokens)]]})
    return runs


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def write_f32(path, tensor):
    values = array.array("f", tensor.flatten().tolist())
    if sys.byteorder != "little":
        values.byteswap()
    with open(path, "wb") as f:
        values.tofile(f)


def make_model(spec, out_root):
    out = os.path.join(out_root, spec["name"])
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(spec["seed"])
    config, cls = make_config(spec)
    model = cls(config)
    init_weights(model, spec["seed"])
    dtype = DTYPES[spec["dtype"]]
    model = model.to(dtype)
    if V5:
        model.config.dtype = dtype
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=spec["eos"],
                                               pad_token_id=PAD)
    save_kw = {"max_shard_size": spec["shard"]} if "shard" in spec else {}
    model.save_pretrained(out, **save_kw)

    # The references come from the saved files, as atlas will read them.
    model = load(out, dtype)
    upcast = load(out, torch.float32) if dtype != torch.float32 else None
    rng = random.Random(spec["seed"])
    ref_dir = os.path.join(out, "ref")
    os.makedirs(ref_dir)
    ref = {"name": spec["name"], "architecture": cls.__name__, "dtype": spec["dtype"],
           "vocab_size": spec["vocab"], "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "max_new_tokens": NEW_TOKENS, "sequences": []}
    lowp_diff = 0.0
    for i, n in enumerate(SEQ_LENGTHS):
        ids = [rng.randrange(spec["vocab"]) for _ in range(n)]
        seq = {"ids": ids, "logits": f"logits_{i}.f32"}
        logits = logits_of(model, ids)
        write_f32(os.path.join(ref_dir, seq["logits"]), logits)
        if upcast is not None:
            seq["logits_upcast"] = f"logits_{i}.upcast.f32"
            up = logits_of(upcast, ids)
            write_f32(os.path.join(ref_dir, seq["logits_upcast"]), up)
            lowp_diff = max(lowp_diff, float((logits - up).abs().max()))
        ref["sequences"].append(seq)
    prompts = [[BOS] + [rng.randrange(3, spec["vocab"]) for _ in range(n - 1)]
               for n in PROMPT_LENGTHS]
    ref["greedy"] = greedy(model, prompts)
    if upcast is not None:
        ref["greedy_upcast"] = greedy(upcast, prompts)
        ref["lowp_vs_upcast_max_abs"] = lowp_diff
    with open(os.path.join(ref_dir, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    return out


def parse_only(values, names):
    """--only's names (given as NAME[,NAME] and/or several words) as a set,
    all of names when none; an unknown name ends the script."""
    if not values:
        return set(names)
    wanted = {n for v in values for n in v.split(",") if n}
    unknown = sorted(wanted - set(names))
    if unknown:
        sys.exit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(names)}")
    return wanted


def tree_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fidelity/models", help="output folder")
    ap.add_argument("--only", nargs="*", metavar="NAME[,NAME]",
                    help="names of the models to make (default: all)")
    args = ap.parse_args()
    names = parse_only(args.only, [spec["name"] for spec in MODELS])
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    for spec in MODELS:
        if spec["name"] not in names:
            continue
        path = make_model(spec, args.out)
        with open(os.path.join(path, "ref", "ref.json")) as f:
            ref = json.load(f)
        extra = ""
        if "lowp_vs_upcast_max_abs" in ref:
            extra = f", {spec['dtype']} vs float32 max-abs {ref['lowp_vs_upcast_max_abs']:.4g}"
        print(f"{spec['name']}: {tree_bytes(path)} bytes{extra}", file=sys.stderr)
    print(f"total: {tree_bytes(args.out)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
