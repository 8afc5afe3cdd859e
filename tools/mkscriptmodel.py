#!/usr/bin/env python3
"""Write the model directory of the scripted family (AtlasScriptForCausalLM).

    tools/mkscriptmodel.py --out tests/fs/script-model

The scripted family (engine/model/script/script.h) answers by rules instead
of weights, for tests of the filesystem and of pipelines. Its vocabulary is
fixed: ids 0-255 are the 256 bytes, then five special tokens. This writes:

  config.json              the architecture and the shapes the family wants
  generation_config.json   both end tokens
  tokenizer.json           byte-level BPE without merges: one token per byte,
                           id = byte value, plus the special tokens
  tokenizer_config.json    eos_token and a ChatML chat template
  model.safetensors        a header without tensors (the loader wants the file;
                           the family has no weights)

The output is committed (tests/fs/script-model); rerun after changing this
script. Python 3 standard library only.
"""
import argparse
import json
import os
import struct

SPECIALS = [  # (id, content), as script.h numbers them
    (256, "<|endoftext|>"),
    (257, "<|im_start|>"),
    (258, "<|im_end|>"),
    (259, "<|answer|>"),
    (260, "<|wait|>"),
]
VOCAB = 261

CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = {}
    extra = 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tokenizer():
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    chars = bytes_to_unicode()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, c in SPECIALS],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {chars[b]: b for b in range(256)}, "merges": []},
    }


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "config.json"), {
        "architectures": ["AtlasScriptForCausalLM"],
        "model_type": "atlas_script",
        "vocab_size": VOCAB,
        "hidden_size": 2,
        "intermediate_size": 2,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": 2,
        "max_position_embeddings": 4096,
        "eos_token_id": 256,
        "dtype": "float32",
    })
    write_json(os.path.join(args.out, "generation_config.json"), {"eos_token_id": [256, 258]})
    write_json(os.path.join(args.out, "tokenizer.json"), tokenizer())
    write_json(os.path.join(args.out, "tokenizer_config.json"), {
        "eos_token": "<|endoftext|>",
        "chat_template": CHATML,
    })
    header = b"{}" + b" " * 6  # padded to 8 bytes, as safetensors writers do
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)


if __name__ == "__main__":
    main()
