#!/usr/bin/env python3
"""Write a random-weight Qwen3ForCausalLM model directory for a tokenizer.

    tools/mkmodel.py --tokenizer DIR --out DIR [--hidden 64 --layers 2 --heads 4
                     --kv-heads 2 --intermediate 128 --dtype bf16 --seed 1]

DIR of --tokenizer holds a Hugging Face tokenizer.json and tokenizer_config.json;
both are copied into --out next to config.json (transformers 5.x spelling),
generation_config.json (eos from the tokenizer config) and model.safetensors.
The vocabulary is the tokenizer's highest id + 1 rounded up to a multiple of
64; the embeddings are tied to the output layer. The weights are random
(deterministic for a seed): the model produces noise, but with the real shapes
and files of a Qwen3 checkpoint. Python 3 standard library only.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import struct
import sys

DTYPES = {  # name: (safetensors dtype, torch dtype name, bytes per element)
    "bf16": ("BF16", "bfloat16", 2),
    "f16": ("F16", "float16", 2),
    "f32": ("F32", "float32", 4),
}


def encode(value, dtype):
    """The little-endian bytes of one value in dtype (bf16 rounded to nearest even)."""
    if dtype == "f32":
        return struct.pack("<f", value)
    if dtype == "f16":
        return struct.pack("<e", value)
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return struct.pack("<H", bits)


class Filler:
    """Random normal values, fast: each random byte picks one of 256 quantiles
    of N(0, std^2), and bytes.translate maps bytes to each byte of the encoding."""

    def __init__(self, dtype, seed):
        self.dtype = dtype
        self.size = DTYPES[dtype][2]
        self.rng = random.Random(seed)
        self.tables = {}

    def _tables(self, std):
        if std not in self.tables:
            normal = statistics.NormalDist(0.0, std)
            values = [encode(normal.inv_cdf((i + 0.5) / 256), self.dtype) for i in range(256)]
            self.tables[std] = [bytes(v[j] for v in values) for j in range(self.size)]
        return self.tables[std]

    def normal(self, count, std):
        picks = self.rng.randbytes(count)
        out = bytearray(count * self.size)
        for j, table in enumerate(self._tables(std)):
            out[j::self.size] = picks.translate(table)
        return bytes(out)

    def constant(self, count, value):
        return encode(value, self.dtype) * count


def tokenizer_info(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        conf = json.load(f)
    ids = dict(tok["model"]["vocab"])
    for added in tok.get("added_tokens", []):
        ids[added["content"]] = added["id"]

    def token_id(key):
        token = conf.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if token is None:
            return None
        if token not in ids:
            sys.exit(f"mkmodel: {tok_dir}/tokenizer_config.json: {key} {token!r} is not in "
                     "tokenizer.json")
        return ids[token]

    vocab = (max(ids.values()) + 1 + 63) // 64 * 64
    return vocab, token_id("bos_token"), token_id("eos_token")


def tensors(args, vocab):
    """(name, shape, std) of every tensor of the model, in file order; std None
    for norm weights (all ones). Linear weights get std 1.5/sqrt(fan_in) and
    the embeddings std 1: large enough that the tokens depend on the context,
    so that an engine test which breaks positions or the KV cache sees other
    tokens."""
    e, i, d = args.hidden, args.intermediate, args.hidden // args.heads
    q, kv = args.heads * d, args.kv_heads * d

    def linear(name, rows, cols):
        return (name, [rows, cols], 1.5 / cols ** 0.5)

    out = [("model.embed_tokens.weight", [vocab, e], 1.0)]
    for layer in range(args.layers):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", [e], None),
                linear(p + "self_attn.q_proj.weight", q, e),
                linear(p + "self_attn.k_proj.weight", kv, e),
                linear(p + "self_attn.v_proj.weight", kv, e),
                linear(p + "self_attn.o_proj.weight", e, q),
                (p + "self_attn.q_norm.weight", [d], None),
                (p + "self_attn.k_norm.weight", [d], None),
                (p + "post_attention_layernorm.weight", [e], None),
                linear(p + "mlp.gate_proj.weight", i, e),
                linear(p + "mlp.up_proj.weight", i, e),
                linear(p + "mlp.down_proj.weight", e, i)]
    out.append(("model.norm.weight", [e], None))
    return out


def write_safetensors(path, args, vocab):
    """Header first (offsets are known from the shapes), then each tensor's data."""
    st_dtype, _, size = DTYPES[args.dtype]
    header, offset, plan = {"__metadata__": {"format": "pt"}}, 0, tensors(args, vocab)
    for name, shape, _ in plan:
        count = 1
        for dim in shape:
            count *= dim
        header[name] = {"dtype": st_dtype, "shape": shape,
                        "data_offsets": [offset, offset + count * size]}
        offset += count * size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    filler = Filler(args.dtype, args.seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, std in plan:
            count = 1
            for dim in shape:
                count *= dim
            f.write(filler.constant(count, 1.0) if std is None else filler.normal(count, std))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    ap.add_argument("--out", required=True, help="model folder to write")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if min(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate) <= 0:
        ap.error("sizes must be positive")
    if args.hidden % args.heads or (args.hidden // args.heads) % 2 or args.heads % args.kv_heads:
        ap.error("hidden / heads must be an even head size and kv-heads must divide heads")

    vocab, bos, eos = tokenizer_info(args.tokenizer)
    os.makedirs(args.out, exist_ok=True)
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": vocab, "hidden_size": args.hidden, "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "head_dim": args.hidden // args.heads,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "bos_token_id": bos, "eos_token_id": eos, "dtype": DTYPES[args.dtype][1],
        "use_cache": True,
    }
    generation = {"bos_token_id": bos, "eos_token_id": eos}
    for name, obj in (("config.json", config), ("generation_config.json", generation)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    write_safetensors(os.path.join(args.out, "model.safetensors"), args, vocab)


if __name__ == "__main__":
    main()
