#!/usr/bin/python3
"""atlas-next (Qwen3NextForCausalLM, bf16 safetensors) -> GGUF v3 that
llama.cpp loads as architecture `qwen3next`, so that llama.cpp can be run
beside atlas on the same weights.

usage: gguf_next.py MODEL_DIR OUT.gguf {bf16,f32} [--no-mtp]

Needs only numpy (no torch, no gguf-py): the GGUF container is written here
(header, key/values, tensor infos, data aligned to 32 bytes).

What maps to what, and why (llama.cpp's qwen3next loader and graph):
  - Names: model.embed_tokens -> token_embd, model.norm -> output_norm; per
    layer input_layernorm -> attn_norm, post_attention_layernorm ->
    post_attention_norm, self_attn.{q,k,v,o}_proj -> attn_{q,k,v,output},
    self_attn.{q,k}_norm -> attn_{q,k}_norm, mlp.gate -> ffn_gate_inp,
    mlp.shared_expert.{gate,up,down}_proj -> ffn_{gate,up,down}_shexp,
    mlp.shared_expert_gate [1, E] -> ffn_gate_inp_shexp [E] (one logit per
    token, sigmoid in the graph). No output.weight: the embeddings are tied
    and llama.cpp falls back to token_embd.
  - Experts: mlp.experts.N.{gate,up,down}_proj are stacked into
    ffn_{gate,up,down}_exps [n_expert, rows, cols] (ggml ne reversed).
  - Zero-centred RMSNorm (scale 1 + w): llama.cpp's RMS norm multiplies by
    the weight, so every *norm.weight gets + 1 (in float32), except
    linear_attn.norm, the delta rule's gated output norm whose weight is
    used as is.
  - Gated DeltaNet: in_proj_qkvz holds per key head [q | k | v | z] (v and z
    Hv/Hk heads wide); llama.cpp wants attn_qkv = [all q | all k | all v]
    (the conv's channel order) and attn_gate = [all z], so the rows are
    regrouped. in_proj_ba keeps its per-key-head [b | a] layout (ssm_ba;
    the graph splits it that way). conv1d [C, 1, K] -> ssm_conv1d [C, K];
    dt_bias -> ssm_dt.bias; A_log -> ssm_a = -exp(A_log) (the graph
    multiplies softplus(a + dt_bias) by it); out_proj -> ssm_out;
    linear_attn.norm -> ssm_norm.
  - Gated attention: q_proj stays [per head: query | gate]; the graph splits
    each head's 2 * head_dim rows that way.
  - MTP head (llama.cpp runs it as a NextN draft head; llama-bench skips
    it): block_count is num_hidden_layers + 1 and mtp.layers.0.* becomes the
    last block with the same names; mtp.fc [E, 2E] -> nextn.eh_proj (input
    [normed embedding | normed hidden], the order of atlas and llama.cpp),
    pre_fc_norm_embedding -> nextn.enorm, pre_fc_norm_hidden -> nextn.hnorm,
    mtp.norm -> nextn.shared_head_norm. --no-mtp leaves it out.
  - Types: as llama.cpp's own converter, 1-D tensors, norms, the routers
    (ffn_gate_inp, ffn_gate_inp_shexp), ssm_conv1d, ssm_a and ssm_dt stay
    float32; the other matrices are bf16 (bf16) or float32 (f32).
  - Metadata: ssm.conv_kernel = linear_conv_kernel_dim, ssm.state_size =
    linear_key_head_dim, ssm.group_count = linear_num_key_heads,
    ssm.time_step_rank = linear_num_value_heads, ssm.inner_size =
    linear_value_head_dim * linear_num_value_heads;
    attention.recurrent_layers from layer_types (false for the MTP block);
    rope.dimension_count = head_dim * partial_rotary_factor (llama.cpp's
    NeoX rope over the first dims, as transformers' rotate_half).
  - Tokenizer: byte-level BPE from tokenizer.json as `gpt2` with the
    `gpt-2` pre-tokenizer; the added tokens are control tokens; eos/eot
    <|im_end|>, no BOS added; the chat template of tokenizer_config.json.
"""
import json
import os
import struct
import sys

import numpy as np

ALIGN = 32
T_F32, T_BF16 = 0, 30                      # ggml tensor types
V_U32, V_F32, V_BOOL, V_STR, V_ARR = 4, 6, 7, 8, 9
V_I32 = 5                                  # GGUF value types
ARCH = "qwen3next"


def enc_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


class Gguf:
    """Key/values and tensors in the order they are added."""

    def __init__(self):
        self.kvs, self.infos, self.blobs, self.off = [], [], [], 0

    def kv(self, key, vt, v):
        scalar = {V_U32: "<I", V_F32: "<f", V_BOOL: "<?"}
        body = enc_str(v) if vt == V_STR else struct.pack(scalar[vt], v)
        self.kvs.append(enc_str(key) + struct.pack("<I", vt) + body)

    def arr(self, key, et, vals):
        if et == V_STR:
            body = b"".join(enc_str(x) for x in vals)
        else:
            body = np.asarray(vals, dtype={V_I32: "<i4", V_BOOL: "u1"}[et]).tobytes()
        self.kvs.append(enc_str(key) + struct.pack("<IIQ", V_ARR, et, len(vals)) + body)

    def tensor(self, name, a, typ):
        """a: float32 array in torch's dimension order."""
        data = to_bf16(a) if typ == T_BF16 else np.ascontiguousarray(a, "<f4").tobytes()
        ne = a.shape[::-1]
        self.infos.append(enc_str(name) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne) +
                          struct.pack("<IQ", typ, self.off))
        pad = -len(data) % ALIGN
        self.blobs.append(data + b"\0" * pad)
        self.off += len(data) + pad

    def write(self, path):
        with open(path, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.infos), len(self.kvs)))
            for part in self.kvs + self.infos:
                f.write(part)
            f.write(b"\0" * (-f.tell() % ALIGN))
            for b in self.blobs:
                f.write(b)


def to_bf16(a):
    """float32 -> bf16 bytes; exact for values that came from bf16."""
    u = np.ascontiguousarray(a, "<f4").view("<u4")
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


class Seen(dict):
    """The tensors by name, remembering which were read."""

    def __init__(self):
        super().__init__()
        self.read = set()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)


def load(model_dir):
    """All tensors of the shards as float32 arrays, by transformers name."""
    idx = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
    out = Seen()
    for shard in sorted(set(idx["weight_map"].values())):
        path = os.path.join(model_dir, shard)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            hdr = json.loads(f.read(n))
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            if t["dtype"] != "BF16":
                sys.exit(f"{name}: {t['dtype']}, only BF16 is handled")
            a, b = t["data_offsets"]
            u16 = np.frombuffer(raw[a:b], dtype="<u2").reshape(t["shape"])
            out[name] = (u16.astype(np.uint32) << 16).view(np.float32)
    return out


def regroup_qkvz(w, cfg):
    """[per key head: q | k | v | z] rows -> ([all q | all k | all v], [all z])."""
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    r = hv // hk
    g = w.reshape(hk, 2 * dk + 2 * r * dv, w.shape[1])
    q, k = g[:, :dk], g[:, dk:2 * dk]
    v, z = g[:, 2 * dk:2 * dk + r * dv], g[:, 2 * dk + r * dv:]
    flat = [x.reshape(-1, w.shape[1]) for x in (q, k, v, z)]
    return np.concatenate(flat[:3]), flat[3]


def block_tensors(W, src, cfg):
    """(gguf suffix, float32 array, keep float32) of one decoder layer whose
    transformers prefix is src (model.layers.N. or mtp.layers.0.)."""
    out = []

    def put(suffix, a, f32=False):
        out.append((suffix, a, f32 or a.ndim == 1))

    put("attn_norm.weight", 1.0 + W[src + "input_layernorm.weight"])
    put("post_attention_norm.weight", 1.0 + W[src + "post_attention_layernorm.weight"])
    if src + "self_attn.q_proj.weight" in W:
        for hf, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                      ("o_proj", "attn_output")):
            put(g + ".weight", W[f"{src}self_attn.{hf}.weight"])
        put("attn_q_norm.weight", 1.0 + W[src + "self_attn.q_norm.weight"])
        put("attn_k_norm.weight", 1.0 + W[src + "self_attn.k_norm.weight"])
    else:
        la = src + "linear_attn."
        qkv, z = regroup_qkvz(W[la + "in_proj_qkvz.weight"], cfg)
        put("attn_qkv.weight", qkv)
        put("attn_gate.weight", z)
        put("ssm_ba.weight", W[la + "in_proj_ba.weight"])
        conv = W[la + "conv1d.weight"]
        put("ssm_conv1d.weight", conv.reshape(conv.shape[0], conv.shape[2]), True)
        put("ssm_dt.bias", W[la + "dt_bias"])
        put("ssm_a", -np.exp(W[la + "A_log"]))
        put("ssm_norm.weight", W[la + "norm.weight"])
        put("ssm_out.weight", W[la + "out_proj.weight"])
    mlp = src + "mlp."
    put("ffn_gate_inp.weight", W[mlp + "gate.weight"], True)
    for p in ("gate", "up", "down"):
        put(f"ffn_{p}_exps.weight", np.stack(
            [W[f"{mlp}experts.{e}.{p}_proj.weight"] for e in range(cfg["num_experts"])]))
        put(f"ffn_{p}_shexp.weight", W[f"{mlp}shared_expert.{p}_proj.weight"])
    put("ffn_gate_inp_shexp.weight", W[mlp + "shared_expert_gate.weight"].reshape(-1))
    return out


def add_tokenizer(g, model_dir, n_vocab):
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    tcfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    tokens, types = [None] * n_vocab, [1] * n_vocab          # 1: normal
    for t, i in tok["model"]["vocab"].items():
        tokens[i] = t
    for t in tok["added_tokens"]:
        tokens[t["id"]] = t["content"]
        types[t["id"]] = 3 if t["special"] else 4             # control / user-defined
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        sys.exit(f"tokenizer.json lacks ids {missing[:8]}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    end = ids[tcfg["eos_token"]]
    g.kv("tokenizer.ggml.model", V_STR, "gpt2")
    g.kv("tokenizer.ggml.pre", V_STR, "gpt-2")
    g.arr("tokenizer.ggml.tokens", V_STR, tokens)
    g.arr("tokenizer.ggml.token_type", V_I32, types)
    g.arr("tokenizer.ggml.merges", V_STR, merges)
    g.kv("tokenizer.ggml.bos_token_id", V_U32, ids["<|endoftext|>"])
    g.kv("tokenizer.ggml.eos_token_id", V_U32, end)
    g.kv("tokenizer.ggml.eot_token_id", V_U32, end)
    g.kv("tokenizer.ggml.padding_token_id", V_U32, ids[tcfg["pad_token"]])
    g.kv("tokenizer.ggml.add_bos_token", V_BOOL, False)
    g.kv("tokenizer.chat_template", V_STR, tcfg["chat_template"])


def main(argv):
    if len(argv) not in (4, 5) or argv[3] not in ("bf16", "f32") or argv[4:] not in ([], ["--no-mtp"]):
        sys.exit("usage: gguf_next.py MODEL_DIR OUT.gguf {bf16,f32} [--no-mtp]")
    model_dir, out, ft = argv[1], argv[2], argv[3]
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    if cfg["architectures"] != ["Qwen3NextForCausalLM"]:
        sys.exit(f"{model_dir}: not a Qwen3NextForCausalLM")
    W = load(model_dir)
    n_layer = cfg["num_hidden_layers"]
    mtp = argv[4:] == [] and "mtp.fc.weight" in W
    n_block = n_layer + (cfg.get("mtp_num_hidden_layers", 1) if mtp else 0)
    if mtp and n_block != n_layer + 1:
        sys.exit("llama.cpp's qwen3next runs one MTP block only")
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))

    g = Gguf()
    g.kv("general.architecture", V_STR, ARCH)
    g.kv("general.name", V_STR, os.path.basename(os.path.normpath(model_dir)))
    g.kv("general.file_type", V_U32, {"f32": 0, "bf16": 32}[ft])
    g.kv("general.alignment", V_U32, ALIGN)
    u32 = {
        "block_count": n_block,
        "context_length": cfg["max_position_embeddings"],
        "embedding_length": cfg["hidden_size"],
        "feed_forward_length": cfg["intermediate_size"],
        "attention.head_count": cfg["num_attention_heads"],
        "attention.head_count_kv": cfg["num_key_value_heads"],
        "attention.key_length": cfg["head_dim"],
        "attention.value_length": cfg["head_dim"],
        "rope.dimension_count": int(cfg["head_dim"] * partial),
        "expert_count": cfg["num_experts"],
        "expert_used_count": cfg["num_experts_per_tok"],
        "expert_feed_forward_length": cfg["moe_intermediate_size"],
        "expert_shared_feed_forward_length": cfg["shared_expert_intermediate_size"],
        "ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
        "ssm.state_size": cfg["linear_key_head_dim"],
        "ssm.group_count": cfg["linear_num_key_heads"],
        "ssm.time_step_rank": cfg["linear_num_value_heads"],
        "ssm.inner_size": cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"],
        "full_attention_interval": cfg.get("full_attention_interval", 4),
    }
    if mtp:
        u32["nextn_predict_layers"] = n_block - n_layer
    for k, v in u32.items():
        g.kv(f"{ARCH}.{k}", V_U32, v)
    g.kv(f"{ARCH}.rope.freq_base", V_F32, float(theta))
    g.kv(f"{ARCH}.attention.layer_norm_rms_epsilon", V_F32, float(cfg["rms_norm_eps"]))
    g.kv(f"{ARCH}.expert_weights_norm", V_BOOL, bool(cfg.get("norm_topk_prob", True)))
    recurrent = [t == "linear_attention" for t in cfg["layer_types"]] + [False] * (n_block - n_layer)
    g.arr(f"{ARCH}.attention.recurrent_layers", V_BOOL, recurrent)
    add_tokenizer(g, model_dir, cfg["vocab_size"])

    mat = T_BF16 if ft == "bf16" else T_F32
    tensors = [("token_embd.weight", W["model.embed_tokens.weight"], False),
               ("output_norm.weight", 1.0 + W["model.norm.weight"], True)]
    for il in range(n_layer):
        tensors += [(f"blk.{il}.{s}", a, f) for s, a, f in block_tensors(W, f"model.layers.{il}.", cfg)]
    if mtp:
        b = f"blk.{n_layer}."
        tensors += [(b + s, a, f) for s, a, f in block_tensors(W, "mtp.layers.0.", cfg)]
        tensors += [(b + "nextn.eh_proj.weight", W["mtp.fc.weight"], False),
                    (b + "nextn.enorm.weight", 1.0 + W["mtp.pre_fc_norm_embedding.weight"], True),
                    (b + "nextn.hnorm.weight", 1.0 + W["mtp.pre_fc_norm_hidden.weight"], True),
                    (b + "nextn.shared_head_norm.weight", 1.0 + W["mtp.norm.weight"], True)]
    left = sorted(k for k in W if k not in W.read and (mtp or not k.startswith("mtp.")))
    if left:
        sys.exit(f"tensors not converted: {left[:8]}")
    for name, a, f32 in tensors:
        g.tensor(name, a.astype(np.float32), T_F32 if f32 else mat)
    g.write(out)
    print(f"wrote {out}: {os.path.getsize(out)} bytes, {len(tensors)} tensors, "
          f"{n_block} blocks ({'with' if mtp else 'no'} MTP), {ft}")


if __name__ == "__main__":
    main(sys.argv)
