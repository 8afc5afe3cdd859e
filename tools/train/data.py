"""Training rows: plain text from the corpus mixed with generated tasks that
teach retrieval and copying over long contexts, and chat exchanges.

Every row is T+1 token ids (inputs are row[:-1], targets row[1:]); the loss
covers every position. Kinds of row:

  text   a window of the token stream (documents joined by <|endoftext|>)
  kv     key-value recall: facts "The code for <word> is <number>." put at
         random places among filler text, then 1-3 questions about them, each
         answered by restating the fact:
             Question: What is the code for <word>?
             Answer: The code for <word> is <number>.
         (3 phrasings; sometimes as a chat exchange whose user message holds
         the text and the question)
  copy   a span of 32-512 tokens that appears earlier in the row, repeated
  chat   ChatML exchanges from the question/answer pairs of the corpus
         (definitions, commands, verses, sayings), one to three per
         conversation, conversations joined by <|endoftext|>

The evaluation (eval_recall.py) builds its prompts with kv_prompt(), the same
code with the first phrasing.
"""
import random
import re

import numpy as np

import tok as tokmod

DOC_SEP = "\x1e"   # between the documents of make_data.py's output
KV_TEMPLATES = [
    ("The code for {k} is {v}.", "What is the code for {k}?", "The code for {k} is"),
    ("The secret number of {k} is {v}.", "What is the secret number of {k}?",
     "The secret number of {k} is"),
    ("Remember: {k} has the number {v}.", "Which number does {k} have?", "{K} has the number"),
]
SYSTEMS = [None, None, None, "You are a helpful assistant.", "Answer briefly."]
# How often a recall row's first fact opens the row (or the user's message),
# with no text before it: random places almost never put it there, and the
# first atlas-next models missed a needle at the very start of a prompt more
# often than anywhere else.
START_FACT = 0.15


def key_words(texts, n=4000, skip=150):
    """Common lowercase words of 4-10 letters (ranks skip..skip+n), the keys
    of the recall tasks."""
    counts = {}
    for t in texts:
        for w in re.findall(r"\b[a-z]{4,10}\b", t):
            counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return ranked[skip:skip + n]


def random_value(rng):
    digits = rng.randint(2, 6)
    return str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))


def kv_facts(rng, words, n_pairs, template):
    keys = rng.sample(words, n_pairs)
    values = [random_value(rng) for _ in keys]
    fact, _, _ = KV_TEMPLATES[template]
    return keys, values, [fact.format(k=k, v=v, K=k.capitalize()) for k, v in zip(keys, values)]


def kv_question(key, value, template):
    _, question, answer = KV_TEMPLATES[template]
    a = answer.format(k=key, K=key.capitalize())
    return f"Question: {question.format(k=key)}\nAnswer: {a}", f" {value}."


def cut_points(rng, total, n):
    return sorted(rng.randint(0, total) for _ in range(n))


class Sampler:
    """Makes rows from the token stream `stream` (np.uint16), the question/
    answer pairs `qa` (list of dicts q, a) and the key words `words`, with
    the tokenizer `tk` (a tokenizers.Tokenizer)."""

    def __init__(self, tk, stream, qa, words, seed):
        self.tk, self.stream, self.qa, self.words = tk, stream, qa, words
        self.rng = random.Random(seed)
        self.eot = tk.token_to_id(tokmod.ENDOFTEXT)

    def enc(self, text):
        return self.tk.encode(text).ids

    def window(self, n):
        start = self.rng.randint(0, len(self.stream) - n - 1)
        return self.stream[start:start + n].astype(np.int64)

    def text_row(self, t):
        return self.window(t + 1)

    def copy_row(self, t):
        n = self.rng.randint(32, min(512, t // 4))
        span = self.window(n)
        rest = t + 1 - 2 * n
        a, b = cut_points(self.rng, rest, 2)
        return np.concatenate([self.window(a), span, self.window(b - a), span,
                               self.window(rest - b)])

    def kv_row(self, t, chat=False):
        rng = self.rng
        template = rng.randrange(len(KV_TEMPLATES))
        n_pairs = rng.randint(1, max(1, min(16, t // 256)))
        keys, values, facts = kv_facts(rng, self.words, n_pairs, template)
        asked = rng.sample(range(n_pairs), rng.randint(1, min(3, n_pairs)))
        fact_ids = [self.enc("\n" + f + "\n") for f in facts]
        if chat:
            i = asked[0]
            q = KV_TEMPLATES[template][1].format(k=keys[i])
            head = self.enc(f"{tokmod.IM_START}user\n")
            tail = self.enc(f"\n{q}{tokmod.IM_END}\n{tokmod.IM_START}assistant\n"
                            f"{KV_TEMPLATES[template][2].format(k=keys[i], K=keys[i].capitalize())}"
                            f" {values[i]}.{tokmod.IM_END}\n")
        else:
            head = []
            tail = []
            for i in asked:
                question, answer = kv_question(keys[i], values[i], template)
                tail += self.enc("\n" + question + answer + "\n")
        filler = t + 1 - len(head) - len(tail) - sum(len(f) for f in fact_ids)
        if filler < 0:
            return self.text_row(t)
        cuts = [0] + cut_points(rng, filler, n_pairs) + [filler]
        if rng.random() < START_FACT:
            cuts[1] = 0
        parts = [np.array(head, dtype=np.int64)]
        for i in range(n_pairs):
            parts.append(self.window(cuts[i + 1] - cuts[i]))
            parts.append(np.array(fact_ids[i], dtype=np.int64))
        parts.append(self.window(cuts[-1] - cuts[-2]))
        parts.append(np.array(tail, dtype=np.int64))
        return np.concatenate(parts)

    def chat_row(self, t):
        ids = []
        while len(ids) < t + 1:
            system = self.rng.choice(SYSTEMS)
            text = ""
            for i in range(self.rng.randint(1, 3)):
                p = self.qa[self.rng.randrange(len(self.qa))]
                text += tokmod.chat_turn(p["q"], p["a"], system if i == 0 else None)
            ids += self.enc(text) + [self.eot]
        return np.array(ids[:t + 1], dtype=np.int64)

    def row(self, t, kind):
        if kind == "text":
            return self.text_row(t)
        if kind == "copy":
            return self.copy_row(t)
        if kind == "chat":
            return self.chat_row(t)
        if kind == "kv":
            return self.kv_row(t)
        return self.kv_row(t, chat=True)

    def batch(self, t, b, mix):
        kinds, weights = zip(*mix.items())
        rows = [self.row(t, self.rng.choices(kinds, weights)[0]) for _ in range(b)]
        return np.stack(rows)


def kv_prompt(tk, stream, words, seed, n_tokens, depth, n_pairs=4):
    """An evaluation prompt of about n_tokens tokens: n_pairs facts in
    filler text from `stream`, the asked one (the needle) at relative depth
    `depth` (0 start .. 1 end), the others at random places, then the
    question with the answer's opening. Returns (prompt text, value)."""
    rng = random.Random(seed)
    keys, values, facts = kv_facts(rng, words, n_pairs, 0)
    q, a = kv_question(keys[0], values[0], 0)
    fact_len = sum(len(tk.encode("\n" + f + "\n").ids) for f in facts)
    filler = n_tokens - fact_len - len(tk.encode("\n" + q).ids)
    start = rng.randint(0, len(stream) - filler - 1)
    text_ids = stream[start:start + filler].astype(np.int64).tolist()
    others = sorted(rng.randint(0, filler) for _ in range(n_pairs - 1))
    places = sorted([(int(depth * filler), 0)] + [(p, i + 1) for i, p in enumerate(others)])
    pieces, prev = [], 0
    for pos, i in places:
        pieces.append(tk.decode(text_ids[prev:pos]))
        pieces.append("\n" + facts[i] + "\n")
        prev = pos
    pieces.append(tk.decode(text_ids[prev:]))
    pieces.append("\n" + q)
    return "".join(pieces), values[0]
