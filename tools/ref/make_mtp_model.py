#!/usr/bin/env python3
"""A tiny random-weight Qwen3 model with a multi-token-prediction head, and the head's reference.

transformers loads such a checkpoint as a plain Qwen3ForCausalLM and ignores
the mtp.* tensors, so the head's reference is computed here, in float64,
by a forward pass written out below. That code is first checked against
transformers on the model itself (the same decoder layer code computes the
model's logits, which must match transformers' to 1e-4), and the head then
reuses the decoder layer for its own layer. The head, as Qwen3-Next and
Qwen3.5 checkpoints lay it out:

    row p:  x = fc · [rmsnorm_e(embed(token[p + 1])) | rmsnorm_h(hidden[p])]
            x = decoder layer(x) at position p      (mtp.layers.0, causal)
            out[p] = rmsnorm(x, mtp.norm); logits[p] = lm_head · out[p]

where hidden[p] is the model's final hidden row (after its last norm), and
logits[p] guess token[p + 2]. Further drafts chain: the pair at p + 1 is
(out[p], the draft).

    python3 tools/ref/make_mtp_model.py --out tests/fidelity/models

writes OUT/qwen3_f32_mtp/ (config.json with mtp_num_hidden_layers 1, the
model's and the head's tensors in model.safetensors) and its ref/:

    mtp.json             versions, the check against transformers, and per
                         sequence: ids, the head's greedy drafts chained
                         from the end (4) and the top-2 gap of each
    mtp_logits_<i>.f32   the head's logits of rows 0 .. len(ids) - 2,
                         float32 little-endian, [len(ids) - 1 x vocab]

Needs torch, transformers and safetensors; CPU, deterministic.
"""
import argparse
import json
import os
import random
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as tiny  # noqa: E402

SPEC = dict(name="qwen3_f32_mtp", family="qwen3", dtype="float32", vocab=384, hidden=64,
            intermediate=128, heads=4, kv_heads=2, head_dim=32, tie=True, theta=1e6, eos=2,
            seed=21)
SEQ_LENGTHS = (5, 17, 64)
DRAFTS = 4
EPS = 1e-6


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x, pos):
    """Rotate-half rotary embedding of x [T, H, D] at positions pos [T]."""
    d = x.shape[-1]
    inv = 1.0 / SPEC["theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def layer(x, w, pre, pos):
    """One Qwen3 decoder layer over rows x [T, E] at positions pos, causal."""
    t, hq, hkv, d = x.shape[0], SPEC["heads"], SPEC["kv_heads"], SPEC["head_dim"]
    h = rms(x, w[pre + "input_layernorm.weight"])
    q = (h @ w[pre + "self_attn.q_proj.weight"].T).view(t, hq, d)
    k = (h @ w[pre + "self_attn.k_proj.weight"].T).view(t, hkv, d)
    v = (h @ w[pre + "self_attn.v_proj.weight"].T).view(t, hkv, d)
    q = rope(rms(q, w[pre + "self_attn.q_norm.weight"]), pos)
    k = rope(rms(k, w[pre + "self_attn.k_norm.weight"]), pos)
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("thd,shd->hts", q, k) / d ** 0.5
    s = s + torch.triu(torch.full((t, t), float("-inf"), dtype=s.dtype), 1)
    a = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(t, hq * d)
    x = x + a @ w[pre + "self_attn.o_proj.weight"].T
    h = rms(x, w[pre + "post_attention_layernorm.weight"])
    g = h @ w[pre + "mlp.gate_proj.weight"].T
    u = h @ w[pre + "mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(g) * u) @ w[pre + "mlp.down_proj.weight"].T


def model_hidden(w, ids):
    """The model's final hidden rows [T, E] (after model.norm)."""
    x = w["model.embed_tokens.weight"][ids]
    pos = torch.arange(len(ids))
    for l in range(2):
        x = layer(x, w, f"model.layers.{l}.", pos)
    return rms(x, w["model.norm.weight"])


def head(w, hidden, next_ids):
    """The head's final rows [T, E] for pairs (hidden[p], next_ids[p]) at p = 0..T-1."""
    e = rms(w["model.embed_tokens.weight"][next_ids], w["mtp.pre_fc_norm_embedding.weight"])
    h = rms(hidden, w["mtp.pre_fc_norm_hidden.weight"])
    x = torch.cat([e, h], -1) @ w["mtp.fc.weight"].T
    x = layer(x, w, "mtp.layers.0.", torch.arange(len(next_ids)))
    return rms(x, w["mtp.norm.weight"])


def head_weights(gen):
    """The head's tensors, drawn as make_tiny_models draws the model's."""
    e, i = SPEC["hidden"], SPEC["intermediate"]
    q, kv, d = SPEC["heads"] * SPEC["head_dim"], SPEC["kv_heads"] * SPEC["head_dim"], SPEC["head_dim"]
    shapes = {
        "mtp.pre_fc_norm_embedding.weight": (e,), "mtp.pre_fc_norm_hidden.weight": (e,),
        "mtp.fc.weight": (e, 2 * e), "mtp.norm.weight": (e,),
        "mtp.layers.0.input_layernorm.weight": (e,),
        "mtp.layers.0.self_attn.q_proj.weight": (q, e),
        "mtp.layers.0.self_attn.k_proj.weight": (kv, e),
        "mtp.layers.0.self_attn.v_proj.weight": (kv, e),
        "mtp.layers.0.self_attn.o_proj.weight": (e, q),
        "mtp.layers.0.self_attn.q_norm.weight": (d,),
        "mtp.layers.0.self_attn.k_norm.weight": (d,),
        "mtp.layers.0.post_attention_layernorm.weight": (e,),
        "mtp.layers.0.mlp.gate_proj.weight": (i, e), "mtp.layers.0.mlp.up_proj.weight": (i, e),
        "mtp.layers.0.mlp.down_proj.weight": (e, i),
    }
    out = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        out[name] = 1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fidelity/models", help="output folder")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out = os.path.join(args.out, SPEC["name"])
    shutil.rmtree(out, ignore_errors=True)

    torch.manual_seed(SPEC["seed"])
    config, cls = tiny.make_config(SPEC)
    model = cls(config)
    tiny.init_weights(model, SPEC["seed"])
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tiny.BOS, eos_token_id=SPEC["eos"], pad_token_id=tiny.PAD)
    model.save_pretrained(out)
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    tensors.update(head_weights(torch.Generator().manual_seed(SPEC["seed"] + 1)))
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        conf = json.load(f)
    conf["mtp_num_hidden_layers"] = 1
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")

    model = tiny.load(out, torch.float32)
    w = {k: v.double() for k, v in load_file(path).items()}
    if "lm_head.weight" not in w:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    rng = random.Random(SPEC["seed"])
    ref_dir = os.path.join(out, "ref")
    os.makedirs(ref_dir)
    ref = {"name": SPEC["name"], "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "vocab_size": SPEC["vocab"], "sequences": []}
    check = 0.0
    for i, n in enumerate(SEQ_LENGTHS):
        ids = [rng.randrange(SPEC["vocab"]) for _ in range(n)]
        t = torch.tensor(ids)
        hidden = model_hidden(w, t)
        ours = hidden @ w["lm_head.weight"].T
        check = max(check, float((ours - tiny.logits_of(model, ids).double()).abs().max()))
        logits = head(w, hidden[:-1], t[1:]) @ w["lm_head.weight"].T
        tiny.write_f32(os.path.join(ref_dir, f"mtp_logits_{i}.f32"), logits.float())
        hs, nxt, drafts, gaps = list(hidden[:-1]), list(ids[1:]), [], []
        for _ in range(DRAFTS):
            o = head(w, torch.stack(hs), torch.tensor(nxt))
            lg = o[-1] @ w["lm_head.weight"].T
            drafts.append(int(lg.argmax()))
            gaps.append(tiny.top2_gap(lg))
            hs.append(o[-1])
            nxt.append(drafts[-1])
        ref["sequences"].append({"ids": ids, "logits": f"mtp_logits_{i}.f32", "drafts": drafts,
                                 "gaps": gaps})
    ref["model_logits_vs_transformers_max_abs"] = check
    if check > 1e-4:
        sys.exit(f"the forward pass written here differs from transformers' by {check}")
    with open(os.path.join(ref_dir, "mtp.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"{SPEC['name']}: {tiny.tree_bytes(out)} bytes; the model's logits here vs "
          f"transformers' max-abs {check:.3g}", file=sys.stderr)


if __name__ == "__main__":
    main()
