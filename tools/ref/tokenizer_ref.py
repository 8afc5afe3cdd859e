#!/usr/bin/env python3
"""Reference output of Hugging Face tokenizers for atlas' tokenizer tests.

The tests in tests/tokenizer/ compare atlas' tokenizer with what this script
records. It needs the `tokenizers` and `transformers` packages (written for
tokenizers 0.23 and transformers 5.17; no torch, no network) and the Qwen3
tokenizer that tools/fetch-tokenizer fetches:

    tools/fetch-tokenizer /tmp/qwen3-tokenizer
    python3 tools/ref/tokenizer_ref.py /tmp/qwen3-tokenizer \\
        tests/tokenizer/texts.json tests/tokenizer

It writes, under the output directory:

    qwen3_ref.json         for every text of texts.json: the ids with
                           add_special_tokens False and True, and the decode of
                           the first with skip_special_tokens False and True;
                           then chat templates that transformers'
                           apply_chat_template renders for a few conversations
                           (add_generation_prompt=True, enable_thinking=False)
    small/<name>/          tokenizer.json (and tokenizer_config.json) of three
                           small byte-level BPE tokenizers trained here, each
                           using pipeline pieces that Qwen3 does not use
    small_ref.json         the same ids and decodes for those tokenizers

Everything is deterministic: the training corpus is in this file, training
runs on one thread, and the JSON is written with sorted keys. The output stays
well under 2 MB.
"""
import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,  # noqa: E402
                        normalizers, pre_tokenizers, processors, trainers)

# A few KB of text to train the small tokenizers on: prose, code, numbers,
# some other scripts, so that merges exist for the test texts.
CORPUS = """\
The sky looks blue because air scatters short wavelengths of sunlight more than long ones.
At sunset the light travels through more air, so the blue is scattered away and the sky turns red.
A filesystem is a good interface: every program already knows how to read and write files.
The daemon mounts a tree; you write a prompt to a file and read the answer from another file.
It's a simple idea, and we'll see whether it works. They've tried it before; I'm not sure they'd agree.
Don't worry about the details yet. You're going to read them later, aren't you?
THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG. the quick brown fox jumps over the lazy dog.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 65536 3.14159 2.71828 1,234,567 1e-9
Prices went from $19.99 to $24.50 in 2023, and to $31.00 in 2024; that is 55% in two years.
def main(argv):
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            print(f"option {i}: {arg}")
        else:
            return 1
    return 0

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		printf("%d: %s\\n", i, argv[i]);
	return 0;
}

for f in *.txt; do echo "$f"; wc -l "$f"; done | sort -n | head -n 10
SELECT name, count(*) FROM words WHERE length(name) > 3 GROUP BY name ORDER BY 2 DESC;
{"model": "qwen3", "layers": 28, "hidden": 1024, "heads": 16, "tie_embeddings": true}
Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9, \u00fcber Stra\u00dfe, se\u00f1or a\u00f1o, \u0107evap\u010di\u0107i.
\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002\u673a\u5668\u5b66\u4e60\u548c\u4eba\u5de5\u667a\u80fd\u3002
\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002\u3072\u3089\u304c\u306a\u3068\u30ab\u30bf\u30ab\u30ca\u3002
\uc548\ub155\ud558\uc138\uc694. \ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.
\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430? \u042d\u0442\u043e \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442.
\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u03ba\u03cc\u03c3\u03bc\u03b5. \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645. \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd.
Emoji: \U0001f600 \U0001f44d\U0001f3fd \U0001f1fa\U0001f1f8 \u2764\ufe0f \U0001f469\u200d\U0001f4bb
A word, a name, a hello world, another word; words and wordy words.
    indented line
        more indented line
\tindented with a tab
trailing spaces   
Windows line\r\nendings\r\n
"""

SMALL_VOCAB = 420


def qwen3_chat_cases():
    """Conversations for the chat template. Multi-turn ones also record the
    history without the last user message (add_generation_prompt False): what
    the engine's context holds after the earlier answers."""
    return [
        ("user", [{"role": "user", "content": "Why is the sky blue?"}]),
        ("system_user", [{"role": "system", "content": "You are a terse assistant."},
                         {"role": "user", "content": "Why is the sky blue?"}]),
        ("multiline", [{"role": "user", "content": "Line one\nLine two\n\n  indented\n"}]),
        ("unicode", [{"role": "system", "content": "R\u00e9ponds en fran\u00e7ais."},
                     {"role": "user", "content": "\u4f60\u597d \U0001f600"}]),
        ("two_turns", [{"role": "user", "content": "Hi!"},
                       {"role": "assistant", "content": "Hello. How can I help?"},
                       {"role": "user", "content": "Tell me a joke."}]),
        ("two_turns_system", [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4"},
                              {"role": "user", "content": "And 3+3?"}]),
    ]


def record(tok, texts):
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_special": ids_special,
            "decode": tok.decode(ids, skip_special_tokens=False),
            "decode_skip": tok.decode(ids, skip_special_tokens=True),
        })
    return cases


def render(hf_tok, messages, generation_prompt):
    return hf_tok.apply_chat_template(messages, tokenize=False,
                                      add_generation_prompt=generation_prompt,
                                      enable_thinking=False)


def qwen3_reference(tok_dir, texts):
    from transformers import AutoTokenizer
    import transformers

    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    chat = []
    for name, messages in qwen3_chat_cases():
        entry = {"name": name, "messages": messages,
                 "rendered": render(hf_tok, messages, True)}
        if sum(m["role"] == "user" for m in messages) > 1:
            entry["history"] = render(hf_tok, messages[:-1], False)
        chat.append(entry)
    return {
        "tokenizers_version": tokenizers.__version__,
        "transformers_version": transformers.__version__,
        "tokenizer_json_sha256": sha256_file(os.path.join(tok_dir, "tokenizer.json")),
        "bos_token_id": hf_tok.bos_token_id,
        "eos_token_id": hf_tok.eos_token_id,
        "cases": record(tok, texts),
        "chat": chat,
    }


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def train(tok, special_tokens):
    trainer = trainers.BpeTrainer(vocab_size=SMALL_VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok


def legacy_merges(tok):
    """tokenizer.json with the merges in the older "a b" spelling."""
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                               for m in data["model"]["merges"]]
    return data


# Each small_* returns the tokenizer.json data and a tokenizer_config.json.

def small_gpt2():
    """GPT-2's own pre-tokenizer: ByteLevel with its regex and a prefix space;
    merges saved as "a b" strings; no normalizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    train(tok, ["<|endoftext|>"])
    return legacy_merges(tok), {"bos_token": None, "eos_token": "<|endoftext|>"}


# A Llama-3 style split: numbers in groups of up to three digits.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def small_bos():
    """ignore_merges, a Split regex before ByteLevel, NFC, and a
    TemplateProcessing post-processor that adds a BOS."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    train(tok, ["<s>", "</s>"])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                      special_tokens=[("<s>", bos)]),
    ])
    return json.loads(tok.to_str()), {"bos_token": "<s>",
                                      "eos_token": {"content": "</s>", "lstrip": False}}


def small_added():
    """Added tokens with every option: lstrip, rstrip, single_word,
    normalized true and false, special and not."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, ["<|endoftext|>"])
    tok.add_special_tokens([
        AddedToken("<mask>", lstrip=True, normalized=False),
        AddedToken("[SEP]", rstrip=True, normalized=False),
        AddedToken("<both>", lstrip=True, rstrip=True, normalized=False),
    ])
    tok.add_tokens([
        AddedToken("word", single_word=True),
        AddedToken("<sw>", single_word=True, lstrip=True, normalized=False),
        AddedToken("caf\u00e9", normalized=True),
        AddedToken("\u212bngstr\u00f6m", normalized=True),
        AddedToken("\ufb01x", normalized=False),
        AddedToken("hello world", normalized=False),
        AddedToken("<|tool|>", normalized=False),
    ])
    return json.loads(tok.to_str()), {"eos_token": "<|endoftext|>"}


ADDED_TEXTS = [
    "a <mask> b", "a    <mask>b", "<mask>", "x<mask>  <mask>", "\t<mask>\t<mask>\t",
    "[SEP] x", "[SEP]   x  [SEP]", "a [SEP]\n\nnext", "a <both>   b", "  <both>  ", "<both><both>",
    "a word here", "awordhere", "words", "word", "_word_", "a-word-b", "\u00e9word", "word\u0301",
    "(word)", "word.", "<sw>", "x <sw> y", "x<sw> y", "  <sw>", "x  <sw>  y",
    "caf\u00e9", "cafe\u0301 au lait", "CAF\u00c9", "\u212bngstr\u00f6m", "A\u030angstro\u0308m",
    "\u00c5ngstr\u00f6m", "\ufb01x fix", "hello world", "hello  world", "Hello world",
    "<|tool|>call<|tool|>", "<|endoftext|>hi", "hi<|endoftext|>there", "<mask><mask>",
    "a\u2000<mask>", "nb\u00a0<mask>", "",
]


def small_reference(out_dir, texts):
    builders = {"gpt2": small_gpt2, "bos": small_bos, "added": small_added}
    result = {"tokenizers_version": tokenizers.__version__, "tokenizers": {}}
    for name, build in builders.items():
        data, config = build()
        d = os.path.join(out_dir, "small", name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
            f.write("\n")
        write_json(os.path.join(d, "tokenizer_config.json"), config)
        # The reference comes from the file just written, as atlas reads it.
        saved = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        result["tokenizers"][name] = {"cases": record(saved, texts + ADDED_TEXTS)}
    return result


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=True, sort_keys=True, separators=(",", ":"))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("qwen3_dir", help="directory with Qwen3's tokenizer.json and tokenizer_config.json")
    ap.add_argument("texts", help="tests/tokenizer/texts.json")
    ap.add_argument("out", help="output directory (tests/tokenizer)")
    args = ap.parse_args()

    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        sys.exit(f"{args.texts}: not a JSON list of strings")
    os.makedirs(args.out, exist_ok=True)

    write_json(os.path.join(args.out, "qwen3_ref.json"), qwen3_reference(args.qwen3_dir, texts))
    write_json(os.path.join(args.out, "small_ref.json"), small_reference(args.out, texts))

    total = 0
    for root, _, files in os.walk(args.out):
        for name in files:
            if name.endswith(".json") and name != os.path.basename(args.texts):
                total += os.path.getsize(os.path.join(root, name))
    print(f"tokenizers {tokenizers.__version__}: wrote {args.out}/qwen3_ref.json, "
          f"small_ref.json and small/ ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
