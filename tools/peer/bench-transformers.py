#!/usr/bin/env python3
"""The peer of docs/perf.md's GPU tables: transformers on the same machine,
in the same device call as `atlas bench`, with the same shapes and rows.

    python3 tools/peer/bench-transformers.py --shape 8b --csv-out "$OUT/peer-qwen3-8b.csv"

The model is a Qwen3 shape with random bf16 weights (no download: the GPU
machine reaches nothing), built by transformers from its config. Decoding
uses transformers' static KV cache, which generate() compiles with
torch.compile (its compile_config); prefill runs the compiled forward pass
on one prompt, keeping the last position's logits. The rows are atlas
bench's:

- prefill L: one sequence of L random tokens, tokens/s = L / seconds;
- decode B: B sequences of --context random tokens, then greedy tokens.
  The rate is B * (N2 - N1) / (t(N2) - t(N1)) for two generate() calls of
  N1 and N2 new tokens, so the prompt's prefill and generate()'s own setup
  cancel out.

Each row is warmed up first (compilation, CUDA graphs), then timed as the
median of --repeats runs. The CSV has atlas bench's columns (the bound's
are left empty), so that tools/plot-bench.py reads both. A row that fails
prints its error and the others go on; the exit status is the number of
failed rows.
"""
import argparse
import csv
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, Qwen3Config

# The published configurations (config.json on the Hugging Face hub), as
# atlas' dummy shapes have them (engine/model/shapes.c).
SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 tie_word_embeddings=True),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               tie_word_embeddings=False),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
              rms_norm_eps=1e-6, attention_bias=False, hidden_act="silu")


def ints(s):
    return [int(x) for x in s.split(",") if x]


def timed(fn, repeats):
    """The median of repeats runs of fn, in seconds, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def build(shape, attn):
    cfg = Qwen3Config(**COMMON, **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                 attn_implementation=attn)
    model.eval()
    # Random weights of the magnitude atlas' dummy weights have.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.uniform_(-0.035, 0.035)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def prefill_row(model, length, repeats, compiled):
    ids = torch.randint(3, model.config.vocab_size, (1, length), device="cuda")

    def run():
        with torch.no_grad():
            compiled(input_ids=ids, use_cache=False, logits_to_keep=1)
    s = timed(run, repeats)
    return dict(test="prefill", batch=1, context=length, tokens=length, seconds=s,
                tokens_per_s=length / s)


def decode_row(model, batch, context, gen, repeats):
    ids = torch.randint(3, model.config.vocab_size, (batch, context), device="cuda")
    first = 16

    def generate(n):
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           cache_implementation="static")
    # The longer call first: generate() keeps the static cache of the
    # longest call so far for a shorter one, so the two calls share one
    # cache length and one compilation instead of compiling twice.
    t2 = timed(lambda: generate(first + gen), repeats)
    t1 = timed(lambda: generate(first), repeats)
    s = t2 - t1
    return dict(test="decode", batch=batch, context=context, tokens=batch * gen, seconds=s,
                tokens_per_s=batch * gen / s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--batch", type=ints, default=[1, 8, 32, 64, 128])
    ap.add_argument("--prompt-tokens", type=ints, default=[512, 2048, 8192])
    ap.add_argument("--context", type=int, default=32,
                    help="prompt tokens of each decoding sequence")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--attn", default="sdpa", help="transformers' attention implementation")
    ap.add_argument("--csv-out")
    args = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = True
    # Every batch, cache length and prompt length is a graph of its own;
    # past dynamo's default of 8 per function it would run eagerly.
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    model = build(args.shape, args.attn)
    compiled = torch.compile(model, dynamic=False)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, qwen3-{args.shape} "
          f"({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, bf16, "
          f"{args.attn}, static cache, torch.compile)", flush=True)
    print(f"{'test':8} {'batch':>6} {'context':>8} {'tokens':>8} {'seconds':>9} "
          f"{'tokens/s':>11}", flush=True)
    # Each row goes to the CSV as soon as it is measured, so that a call
    # cut off by its time limit keeps the rows it made.
    cols = ["test", "batch", "context", "tokens", "seconds", "tokens_per_s",
            "bytes_per_token", "bound_tokens_per_s", "percent_of_bound"]
    csv_file = open(args.csv_out, "w", newline="") if args.csv_out else None
    writer = csv.DictWriter(csv_file, fieldnames=cols) if csv_file else None
    if writer:
        writer.writeheader()
        csv_file.flush()
    failed = 0
    jobs = [("prefill", n) for n in args.prompt_tokens] + [("decode", b) for b in args.batch]
    for kind, n in jobs:
        try:
            if kind == "prefill":
                r = prefill_row(model, n, args.repeats, compiled)
            else:
                r = decode_row(model, n, args.context, args.gen_tokens, args.repeats)
        except Exception as e:  # one row's failure (memory, compilation) is reported
            print(f"{kind} {n}: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            failed += 1
            torch.cuda.empty_cache()
            continue
        print(f"{r['test']:8} {r['batch']:>6} {r['context']:>8} {r['tokens']:>8} "
              f"{r['seconds']:>9.3f} {r['tokens_per_s']:>11.1f}", flush=True)
        if writer:
            writer.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v)
                             for k, v in r.items()})
            csv_file.flush()
    if csv_file:
        csv_file.close()
    return failed


if __name__ == "__main__":
    sys.exit(main())
