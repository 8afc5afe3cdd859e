"""Write a qwen3.Qwen3 or a qwen3_next.Qwen3Next as a Hugging Face model directory: config.json in the
spelling transformers 5.x writes, generation_config.json, and the weights as
safetensors (written here: an 8-byte little-endian header size, a JSON header
of names, dtypes, shapes and byte ranges, then the raw little-endian data),
in shards of at most `shard_bytes` with model.safetensors.index.json when
they do not fit one file; and read such a directory's weights back into a
model (load_weights: check_hf.py, train.py --init).
"""
import json
import os
import struct

import torch

DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
CONFIG_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def tensor_bytes(t):
    """Little-endian bytes of t (bf16 through its int16 view: numpy has no bf16)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    a = t.numpy()
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        data = tensor_bytes(t.to(dtype))
        header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def hf_config(cfg, dtype, bos, eos, pad):
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "dtype": CONFIG_DTYPES[dtype],
        "eos_token_id": eos,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.intermediate_size,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "max_position_embeddings": cfg.max_position_embeddings,
        "max_window_layers": cfg.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "pad_token_id": pad,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": True,
        "transformers_version": "5.17.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": cfg.vocab_size,
    }


def hf_config_next(cfg, dtype, bos, eos, pad):
    """config.json of a qwen3_next.Qwen3Next, as transformers 5.x writes a
    Qwen3NextConfig, plus mtp_num_hidden_layers (read by atlas)."""
    rope = {"partial_rotary_factor": cfg.partial_rotary_factor, "rope_theta": cfg.rope_theta,
            "rope_type": "default"}
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "decoder_sparse_step": 1,
        "dtype": CONFIG_DTYPES[dtype],
        "eos_token_id": eos,
        "full_attention_interval": cfg.full_attention_interval,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.shared_expert_intermediate_size,
        "layer_types": cfg.layer_types(),
        "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
        "linear_key_head_dim": cfg.linear_key_head_dim,
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_value_head_dim": cfg.linear_value_head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "mlp_only_layers": [],
        "model_type": "qwen3_next",
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "mtp_num_hidden_layers": cfg.mtp_num_hidden_layers,
        "norm_topk_prob": True,
        "num_attention_heads": cfg.num_attention_heads,
        "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "output_router_logits": False,
        "pad_token_id": pad,
        "partial_rotary_factor": cfg.partial_rotary_factor,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": rope,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": cfg.shared_expert_intermediate_size,
        "tie_word_embeddings": True,
        "transformers_version": "5.17.0",
        "use_cache": True,
        "vocab_size": cfg.vocab_size,
    }


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def export(model, out, dtype=torch.bfloat16, shard_bytes=32 << 20, bos=0, eos=(0, 2), pad=0):
    """Write model (a qwen3.Qwen3 or qwen3_next.Qwen3Next) to the folder
    out. Returns the weight files."""
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.startswith("model") and f.endswith((".safetensors", ".safetensors.index.json")):
            os.remove(os.path.join(out, f))
    next_arch = hasattr(model, "state_dict_hf")
    state = model.state_dict_hf() if next_arch else dict(model.state_dict())
    elem = torch.tensor([], dtype=dtype).element_size()
    shards, cur, size = [], {}, 0
    for name, t in state.items():
        n = t.numel() * elem
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += n
    shards.append(cur)
    files = []
    if len(shards) == 1:
        files.append("model.safetensors")
        write_safetensors(os.path.join(out, files[0]), shards[0], dtype)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(out, fn), shard, dtype)
            files.append(fn)
            weight_map.update({name: fn for name in shard})
        total = sum(t.numel() for t in state.values()) * elem
        write_json(os.path.join(out, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": weight_map})
    make_config = hf_config_next if next_arch else hf_config
    write_json(os.path.join(out, "config.json"), make_config(model.cfg, dtype, bos, list(eos), pad))
    write_json(os.path.join(out, "generation_config.json"),
               {"bos_token_id": bos, "eos_token_id": list(eos), "pad_token_id": pad,
                "transformers_version": "5.17.0"})
    return files


def load_weights(model, path):
    """The inverse of export for the weights: reads every safetensors file
    of the directory path into model (a qwen3.Qwen3 or qwen3_next.Qwen3Next
    of the export's shape), cast to the model's dtype. A shape that differs
    fails in load_state_dict, naming the tensor."""
    from safetensors.torch import load_file
    state = {}
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".safetensors"):
            state.update(load_file(os.path.join(path, fn)))
    if hasattr(model, "load_state_dict_hf"):
        model.load_state_dict_hf(state)
    else:
        model.load_state_dict({k: v.float() for k, v in state.items()})
