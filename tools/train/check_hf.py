#!/usr/bin/env python3
"""Check an exported model with Hugging Face transformers and write the
goldens of the agreement test (tests/default_model/).

    python3 tools/train/check_hf.py --model models/atlas-tiny \\
        --goldens tests/default_model/golden

1. transformers loads the directory (AutoModelForCausalLM, float32 upcast,
   eager attention, its own torch Gated DeltaNet) and its logits equal those
   of qwen3.Qwen3 or qwen3_next.Qwen3Next loaded from the same files (this
   proves the export: names, layout, config);
2. AutoTokenizer loads tokenizer.json and tokenizer_config.json, encodes as
   the `tokenizers` file does, and its chat template renders tok.chat_turn();
3. for each prompt of PROMPTS, GOLDENS/golden.json gets the token ids, the
   greedy continuation of NEW_TOKENS tokens of the float32-upcast model (what
   atlas computes: float32 arithmetic on the bf16 weights) with the top-2
   logit gap of every step, the bf16 model's continuation, and the largest
   difference between bf16 and upcast logits; GOLDENS/logits_<i>.f32 gets
   the upcast logits of the last LAST positions (float32 little-endian,
   [LAST x vocab]);
4. a model with an MTP head (which transformers does not run) also gets
   GOLDENS/mtp.json and mtp_logits_<i>.f32, what tests/engine/test_mtp.c
   reads: for each of MTP_PROMPTS, the head's logits of every pair (the
   model's output row p after model.norm, token p + 1) computed by
   qwen3_next.py in float32 on the bf16 weights, and the head's 4 greedy
   drafts chained from the end with their top-2 gaps.

Runs on the CPU, one thread, deterministic. Needs torch, transformers,
safetensors.
"""
import sys

# transformers binds its Gated DeltaNet to the fla kernels where they import;
# a None entry makes the import fail, so that its torch code runs.
for _package in ("fla", "causal_conv1d"):
    sys.modules.setdefault(_package, None)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export as exportmod  # noqa: E402
import qwen3  # noqa: E402
import qwen3_next  # noqa: E402
import tok as tokmod  # noqa: E402

PROMPTS = [
    "Once upon a time",
    tokmod.chat_turn("What does the word \"river\" mean?"),
    "The code for lamp is 4821.\nThe code for stone is 77.\n"
    "Question: What is the code for lamp?\nAnswer: The code for lamp is",
]
NEW_TOKENS = 24
LAST = 6
MTP_PROMPTS = ["The quick brown fox", "Question: What is the code for lamp?"]
MTP_DRAFTS = 4


def load_ours(path):
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    if c["model_type"] == "qwen3_next":
        model = qwen3_next.Qwen3Next(qwen3_next.Config.from_hf(c))
    else:
        model = qwen3.Qwen3(qwen3.Config(
            vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
            num_hidden_layers=c["num_hidden_layers"],
            num_attention_heads=c["num_attention_heads"],
            num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
            max_position_embeddings=c["max_position_embeddings"],
            rope_theta=c["rope_parameters"]["rope_theta"], rms_norm_eps=c["rms_norm_eps"]))
    exportmod.load_weights(model, path)
    return model.eval()


def top2_gap(logits):
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def greedy(model, ids, eos):
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=NEW_TOKENS, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0, eos_token_id=eos)
    tokens = out.sequences[0, len(ids):].tolist()
    return tokens, [top2_gap(s[0]) for s in out.logits[:len(tokens)]]


def mtp_goldens(ours, at, out, vocab):
    """GOLDENS/mtp.json and mtp_logits_<i>.f32 (see the header)."""
    ref = {"name": "default model", "vocab_size": vocab, "sequences": []}
    for i, text in enumerate(MTP_PROMPTS):
        ids = at(text).input_ids
        t = torch.tensor([ids])
        with torch.no_grad():
            h, _ = ours.body(t)
            hm, _ = ours.mtp_hidden(h[:, :-1], t[:, 1:])
            logits = ours.logits(hm)[0]
            fn = f"mtp_logits_{i}.f32"
            logits.contiguous().numpy().astype("<f4").tofile(os.path.join(out, fn))
            hs, nxt, drafts, gaps = h[0, :-1], t[0, 1:], [], []
            for _ in range(MTP_DRAFTS):
                o, _ = ours.mtp_hidden(hs[None], nxt[None])
                lg = ours.logits(o[0, -1])
                drafts.append(int(lg.argmax()))
                gaps.append(top2_gap(lg))
                hs = torch.cat([hs, o[0, -1:]])
                nxt = torch.cat([nxt, torch.tensor([drafts[-1]])])
        ref["sequences"].append({"text": text, "ids": ids, "logits": fn, "drafts": drafts,
                                 "gaps": gaps})
        print(f"mtp {i}: {text!r} drafts {drafts} (gaps {min(gaps):.3g} and more)")
    with open(os.path.join(out, "mtp.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--goldens", help="folder for the agreement test's goldens")
    args = ap.parse_args()
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    hf16 = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                attn_implementation="eager").eval()
    ours = load_ours(args.model)
    gen = torch.Generator().manual_seed(5)
    worst = 0.0
    for n in (7, 100, 300):
        ids = torch.randint(3, hf.config.vocab_size, (1, n), generator=gen)
        with torch.no_grad():
            a = hf(input_ids=ids).logits[0]
            b = ours(ids)[0]
        worst = max(worst, float((a - b).abs().max()))
    print(f"export: max |transformers - {type(ours).__name__}| = {worst:.3g}")
    assert worst < 1e-3, "the export does not compute what the trained model computes"

    at = AutoTokenizer.from_pretrained(args.model)
    raw = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    for p in PROMPTS + ["Héllo,  wörld!\n\n\tdef f(x): return x ** 2  # ok"]:
        assert at(p).input_ids == raw.encode(p).ids, p
    rendered = at.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                      add_generation_prompt=True)
    assert rendered == tokmod.chat_turn("Hi"), rendered
    print("tokenizer: AutoTokenizer agrees; chat template renders ChatML")

    if not args.goldens:
        return
    os.makedirs(args.goldens, exist_ok=True)
    eos = hf.generation_config.eos_token_id
    ref = {"model": os.path.basename(os.path.normpath(args.model)),
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "vocab_size": hf.config.vocab_size, "new_tokens": NEW_TOKENS, "last_positions": LAST,
           "prompts": []}
    lowp = 0.0
    for i, text in enumerate(PROMPTS):
        ids = at(text).input_ids
        with torch.no_grad():
            up = hf(input_ids=torch.tensor([ids])).logits[0].float()
            lo = hf16(input_ids=torch.tensor([ids])).logits[0].float()
        lowp = max(lowp, float((up - lo).abs().max()))
        fn = f"logits_{i}.f32"
        up[-LAST:].contiguous().numpy().astype("<f4").tofile(os.path.join(args.goldens, fn))
        tokens, gaps = greedy(hf, ids, eos)
        tokens16, _ = greedy(hf16, ids, eos)
        ref["prompts"].append({"text": text, "ids": ids, "logits": fn, "greedy": tokens,
                               "gaps": gaps, "greedy_bf16": tokens16,
                               "continuation": at.decode(tokens)})
        print(f"prompt {i}: {text!r} -> {at.decode(tokens)!r}")
    ref["bf16_vs_upcast_max_abs"] = lowp
    with open(os.path.join(args.goldens, "golden.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"goldens in {args.goldens}; bf16 vs float32 max-abs {lowp:.4g}")
    if hasattr(ours, "mtp"):
        mtp_goldens(ours, at, args.goldens, hf.config.vocab_size)


if __name__ == "__main__":
    main()
