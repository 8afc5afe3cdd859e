#!/usr/bin/env python3
"""Train the default model of atlas: a small Qwen3-Next (--arch next: Gated
DeltaNet and gated attention, mixtures of experts, an MTP head) or a small
Qwen3 (--arch qwen3, atlas-tiny), with its own byte-level BPE tokenizer, on the corpus of make_data.py and the generated tasks of
data.py, within a wall-clock budget, and export it as a Hugging Face model
directory.

    python3 tools/train/train.py --data .train-data --work /tmp/run \\
        --model-out /tmp/run/atlas-tiny --budget-s 420 --compile

WORK gets the token caches, ckpt.pt (written every --ckpt-every-s seconds
and at the end; a later run with the same WORK resumes from it, its budget
counting the time already spent) and train-log.json. MODEL_OUT gets the
model: tokenizer files (trained here unless MODEL_OUT/tokenizer.json
exists), config.json, generation_config.json and bf16 safetensors shards.

The learning rate warms up over --warmup-steps steps and follows the elapsed
fraction of the budget (cosine decay to --min-lr-frac); the last --long-frac of the budget trains on
--long-len rows, the rest on --short-len rows, --batch-tokens per step.
For --arch next the loss adds the MTP head's (weight --mtp-weight) and the
routers' load-balancing loss (weight --aux-weight).
--toy runs a tiny configuration on the CPU (torch 1.13 works) for tests.
"""
import argparse
import dataclasses
import json
import lzma
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data as datamod  # noqa: E402
import export as exportmod  # noqa: E402
import qwen3  # noqa: E402
import qwen3_next  # noqa: E402
import tok as tokmod  # noqa: E402

SHORT_MIX = {"text": 0.55, "kv": 0.17, "kv_chat": 0.03, "copy": 0.1, "chat": 0.15}
LONG_MIX = {"text": 0.4, "kv": 0.3, "kv_chat": 0.05, "copy": 0.15, "chat": 0.1}

# Globals the loader workers inherit by fork.
SHARED = {}


def read_docs(path):
    """The documents of a make_data.py output file."""
    with lzma.open(path, "rb") as f:
        return f.read().decode().split(datamod.DOC_SEP)


def read_qa(path):
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def tokenize(tk, docs, cache):
    if os.path.exists(cache):
        return np.load(cache)
    eot = tk.token_to_id(tokmod.ENDOFTEXT)
    out = []
    for i in range(0, len(docs), 2048):
        for enc in tk.encode_batch(docs[i:i + 2048]):
            out.append(np.array(enc.ids + [eot], dtype=np.uint16))
    arr = np.concatenate(out)
    np.save(cache, arr)
    return arr


class Rows(torch.utils.data.IterableDataset):
    def __init__(self, t, b, mix, seed):
        super().__init__()
        self.t, self.b, self.mix, self.seed = t, b, mix, seed

    def __iter__(self):
        from tokenizers import Tokenizer
        info = torch.utils.data.get_worker_info()
        wid = info.id if info else 0
        tk = Tokenizer.from_file(SHARED["tokenizer"])
        s = datamod.Sampler(tk, SHARED["stream"], SHARED["qa"], SHARED["words"],
                            self.seed * 1000 + wid)
        while True:
            yield torch.from_numpy(s.batch(self.t, self.b, self.mix))


def loader(t, b, mix, seed, workers):
    ds = Rows(t, b, mix, seed)
    if workers == 0:
        return iter(ds)
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                            pin_memory=torch.cuda.is_available(),
                                            prefetch_factor=4, persistent_workers=False))


def lr_at(frac, step, args):
    """Linear warm-up over the first --warmup-steps steps, then cosine decay
    over the elapsed fraction of the budget (compilation time included)."""
    lo = args.lr * args.min_lr_frac
    lr = lo + (args.lr - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return lr * min(1.0, (step + 1) / args.warmup_steps)


@torch.no_grad()
def evaluate(model, stream, nbytes, t, max_rows, device):
    """Mean loss per token over non-overlapping windows of the held-out
    stream, in float32, and bits per byte. A model with an MTP head also
    gets the head's loss and how often its guess for row p + 2 equals the
    model's own argmax there (the head fed the text's token p + 1)."""
    model.eval()
    n_rows = min(max_rows, (len(stream) - 1) // t)
    total, count, bytes_total = 0.0, 0, 0
    mtp_total, agree, mtp_count = 0.0, 0, 0
    for i in range(n_rows):
        row = torch.from_numpy(stream[i * t:i * t + t + 1].astype(np.int64)).to(device)
        ids, targets = row[None, :-1], row[None, 1:]
        if hasattr(model, "mtp"):
            h, _ = model.body(ids)
            logits = model.logits(h).float()
            hm, _ = model.mtp_hidden(h[:, :-1], targets[:, :-1])
            mtp_logits = model.logits(hm).float()[0]
            mtp_total += float(torch.nn.functional.cross_entropy(
                mtp_logits, targets[0, 1:], reduction="sum"))
            agree += int((mtp_logits.argmax(-1) == logits[0, 1:].argmax(-1)).sum())
            mtp_count += t - 1
        else:
            logits = model(ids).float()
        losses = torch.nn.functional.cross_entropy(logits[0], targets[0], reduction="none")
        total += float(losses.sum())
        count += t
        bytes_total += int(nbytes[row[1:].cpu().numpy()].sum())
    model.train()
    loss = total / count
    out = {"rows": n_rows, "tokens": count, "loss": loss, "perplexity": math.exp(loss),
           "bits_per_byte": total / math.log(2) / bytes_total}
    if mtp_count:
        out.update(mtp_loss=mtp_total / mtp_count, mtp_agreement=agree / mtp_count)
    return out


def build_tokenizer(args, train_docs):
    from tokenizers import Tokenizer
    path = os.path.join(args.model_out, "tokenizer.json")
    os.makedirs(args.model_out, exist_ok=True)
    if not os.path.exists(path):
        t0 = time.time()
        step = max(1, int(sum(len(d) for d in train_docs) / args.tokenizer_bytes))
        tk = tokmod.train(train_docs[::step], args.vocab)
        tk.save(path)
        print(f"tokenizer: trained on 1/{step} of the documents in {time.time() - t0:.0f} s",
              flush=True)
    tk = Tokenizer.from_file(path)
    tokmod.write_configs(tk, args.model_out, args.long_len)
    return tk, path


def parse_shape(arg, cls):
    """--shape "hidden_size=448,num_experts=4": Config fields over the defaults,
    each parsed as its default's type."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            sys.exit(f"--shape: '{item}' is not FIELD=VALUE of {cls.__module__}.Config "
                     f"(fields: {', '.join(fields)})")
        try:
            out[key] = type(fields[key].default)(value.strip())
        except ValueError:
            sys.exit(f"--shape: {key}={value}: not a {type(fields[key].default).__name__}")
    return out


def make_config(args, vocab):
    """The model's Config: the defaults of --arch (or --toy's small one), then
    --shape's fields."""
    next_arch = args.arch == "next"
    cls = qwen3_next.Config if next_arch else qwen3.Config
    kw = {"vocab_size": vocab,
          "max_position_embeddings": args.max_positions if next_arch and not args.toy
          else args.long_len}
    if args.toy and next_arch:
        kw.update(hidden_size=64, num_hidden_layers=4, full_attention_interval=2,
                  num_attention_heads=4, head_dim=16, linear_key_head_dim=16,
                  linear_value_head_dim=16, num_experts=4, moe_intermediate_size=16,
                  shared_expert_intermediate_size=32)
    elif args.toy:
        kw.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    kw.update(parse_shape(args.shape, cls))
    return cls(**kw)


def save_ckpt(path, model, opt, state):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--arch", choices=("next", "qwen3"), default="next")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--aux-weight", type=float, default=0.01)
    ap.add_argument("--max-positions", type=int, default=32768,
                    help="next: max_position_embeddings of the export")
    ap.add_argument("--work", required=True)
    ap.add_argument("--model-out", required=True)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps")
    ap.add_argument("--session-s", type=float, default=0,
                    help="train at most this many seconds in this call, then checkpoint "
                         "and exit without exporting (a later call resumes)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--tokenizer-bytes", type=float, default=40e6)
    ap.add_argument("--short-len", type=int, default=2048)
    ap.add_argument("--long-len", type=int, default=8192)
    ap.add_argument("--long-frac", type=float, default=0.3)
    ap.add_argument("--batch-tokens", type=int, default=131072)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--ckpt-every-s", type=float, default=120)
    ap.add_argument("--val-rows", type=int, default=160)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--toy", action="store_true")
    ap.add_argument("--shape", default="",
                    help="FIELD=VALUE,... over the Config defaults of --arch "
                         "(qwen3_next.py, qwen3.py)")
    ap.add_argument("--max-mb", type=float, default=None,
                    help="refuse a shape whose bf16 weights pass this many MB "
                         "(default: 40, the default model's limit on disk, for "
                         "--arch next; none for --arch qwen3, atlas-tiny's 55 MB)")
    ap.add_argument("--init", default="",
                    help="start from the weights of a model directory export.py "
                         "wrote (same --arch and --shape), with a fresh optimiser "
                         "and this run's schedule: continued training")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t_setup = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    os.makedirs(args.work, exist_ok=True)

    train_docs = read_docs(os.path.join(args.data, "train.txt.xz"))
    val_docs = read_docs(os.path.join(args.data, "val.txt.xz"))
    tk, tok_path = build_tokenizer(args, train_docs)
    t0 = time.time()
    stream = tokenize(tk, train_docs, os.path.join(args.work, "train-tokens.npy"))
    val_stream = tokenize(tk, val_docs, os.path.join(args.work, "val-tokens.npy"))
    print(f"tokens: train {len(stream)}, val {len(val_stream)} ({time.time() - t0:.0f} s)",
          flush=True)
    SHARED.update(tokenizer=tok_path, stream=stream,
                  qa=read_qa(os.path.join(args.data, "qa-train.jsonl.xz")),
                  words=datamod.key_words(train_docs[::20]))
    del train_docs
    nbytes = np.array(tokmod.byte_lengths(tk), dtype=np.int64)

    cfg = make_config(args, tk.get_vocab_size(with_added_tokens=True))
    next_arch = args.arch == "next"
    model = (qwen3_next.Qwen3Next if next_arch else qwen3.Qwen3)(cfg).to(device)
    weights_mb = 2 * model.num_params() / 1e6
    max_mb = args.max_mb if args.max_mb is not None else (40 if next_arch else 0)
    if max_mb and weights_mb > max_mb:
        sys.exit(f"model: {model.num_params() / 1e6:.2f} M parameters, {weights_mb:.1f} MB "
                 f"in bf16, over --max-mb {max_mb:g}: {cfg}")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = {"fused": True} if device == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **opt_kw)
    ckpt = os.path.join(args.work, "ckpt.pt")
    state = {"step": 0, "elapsed": 0.0, "tokens": 0, "log": [], "args": vars(args)}
    if os.path.exists(ckpt):
        saved = torch.load(ckpt, map_location=device)
        was = saved["state"]["args"].get("shape", "")
        if was != args.shape:
            sys.exit(f"{ckpt}: a run of --shape '{was}', not '{args.shape}'; "
                     "resume it with its shape or give another --work")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        print(f"resumed at step {state['step']}, {state['elapsed']:.0f} s", flush=True)
    elif args.init:
        exportmod.load_weights(model, args.init)
        print(f"initialised from {args.init}", flush=True)
    print(f"model: {model.num_params() / 1e6:.2f} M parameters, {cfg}", flush=True)
    eager_fn = model.losses if next_arch else model
    step_fn = torch.compile(eager_fn) if args.compile else eager_fn
    # torch 2.11's inductor fails on the Qwen3-Next graph of 8K-token rows
    # (an assertion in its tiling analysis, after minutes): that phase runs
    # eagerly.
    long_fn = eager_fn if next_arch else step_fn
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    phase, rows, last_ckpt = None, None, time.time()
    t_start = time.time() - state["elapsed"]
    print(f"setup {time.time() - t_setup:.0f} s", flush=True)
    t_log, tok_log = time.time(), 0
    t_call, paused = time.time(), False
    while True:
        elapsed = time.time() - t_start
        frac = elapsed / args.budget_s
        if frac >= 1 or (args.max_steps and state["step"] >= args.max_steps):
            break
        if args.session_s and time.time() - t_call >= args.session_s:
            paused = True
            break
        want = "long" if frac >= 1 - args.long_frac else "short"
        if want != phase:
            t = args.long_len if want == "long" else args.short_len
            mix = LONG_MIX if want == "long" else SHORT_MIX
            rows = None    # stops the previous phase's workers first
            rows = loader(t, max(1, args.batch_tokens // t), mix,
                          args.seed * 7919 + state["step"], args.workers)
            phase = want
        lr = lr_at(frac, state["step"], args)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = next(rows).to(device, non_blocking=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            fn = long_fn if phase == "long" else step_fn
            if next_arch:
                loss, mtp_loss, aux = fn(batch[:, :-1], batch[:, 1:])
                total = loss + args.mtp_weight * mtp_loss + args.aux_weight * aux
            else:
                logits = fn(batch[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                         batch[:, 1:].flatten())
                total = loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] += 1
        state["tokens"] += batch.numel() - batch.shape[0]
        tok_log += batch.numel() - batch.shape[0]
        if state["step"] % 25 == 0 or state["step"] == 1:
            now = time.time()
            entry = {"step": state["step"], "elapsed": round(now - t_start, 1), "phase": phase,
                     "loss": round(loss.item(), 4), "lr": lr, "grad_norm": round(gnorm.item(), 3),
                     "tokens": state["tokens"], "tok_per_s": round(tok_log / (now - t_log))}
            if next_arch:
                entry.update(mtp_loss=round(mtp_loss.detach().item(), 4),
                             aux=round(float(aux.detach()), 4))
            state["log"].append(entry)
            print(json.dumps(entry), flush=True)
            t_log, tok_log = now, 0
        if time.time() - last_ckpt > args.ckpt_every_s:
            state["elapsed"] = time.time() - t_start
            save_ckpt(ckpt, model, opt, state)
            last_ckpt = time.time()
    state["elapsed"] = time.time() - t_start
    rows = None
    save_ckpt(ckpt, model, opt, state)
    if paused:
        print(f"paused at step {state['step']}, {state['elapsed']:.0f} s of "
              f"{args.budget_s:.0f}; run again to resume", flush=True)
        return

    exportmod.export(model, args.model_out, torch.bfloat16)
    # What atlas runs: the bf16 weights, computed in float32.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    val = evaluate(model, val_stream, nbytes, args.short_len, args.val_rows, device)
    summary = {"steps": state["step"], "train_seconds": round(state["elapsed"], 1),
               "tokens_seen": state["tokens"], "parameters": model.num_params(),
               "config": vars(cfg), "args": vars(args), "validation": val,
               "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "torch": torch.__version__, "log": state["log"]}
    with open(os.path.join(args.work, "train-log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in ("steps", "train_seconds", "tokens_seen",
                                              "validation")}), flush=True)


if __name__ == "__main__":
    main()
