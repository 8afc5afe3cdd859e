"""The model's tokenizer: byte-level BPE trained with Hugging Face
`tokenizers` on the training corpus, and the files that describe it.

tokenizer.json: NFC normalizer, ByteLevel pre-tokenizer (GPT-2's regex) and
decoder, BPE; the special tokens <|endoftext|> (0, between documents),
<|im_start|> (1) and <|im_end|> (2, end of a chat answer) come first.
tokenizer_config.json carries a ChatML chat template.
"""
import json
import os

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [ENDOFTEXT, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def chat_turn(question, answer=None, system=None):
    """One exchange in the template's text (what the template renders)."""
    text = f"{IM_START}system\n{system}{IM_END}\n" if system else ""
    text += f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"
    if answer is not None:
        text += f"{answer}{IM_END}\n"
    return text


def train(texts, vocab_size):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def write_configs(tok, out, max_len):
    added = {}
    for name in SPECIALS:
        added[str(tok.token_to_id(name))] = {
            "content": name, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}
    conf = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": max_len,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(conf, f, indent=2)
        f.write("\n")


def byte_lengths(tok):
    """Bytes each token id stands for (ByteLevel: one character per byte;
    special tokens count 0), for bits per byte."""
    n = tok.get_vocab_size(with_added_tokens=True)
    special = {tok.token_to_id(s) for s in SPECIALS}
    return [0 if i in special else len(tok.id_to_token(i)) for i in range(n)]
