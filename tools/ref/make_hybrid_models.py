#!/usr/bin/env python3
"""Tiny random-weight hybrid Gated DeltaNet models and the reference outputs of transformers.

The sibling of make_tiny_models.py and make_moe_models.py for the models that
mix linear-attention (Gated DeltaNet) layers with full-attention layers:
Qwen3-Next and the Qwen3.5 text models. Written for transformers 5.17 /
torch 2.11 and safetensors (transformers 5.x is required: 4.x has no
Qwen3.5), no network, and deterministic: CPU, one thread, eval mode, eager
attention, the eager experts loop, and transformers' pure-torch Gated
DeltaNet (the script makes the kernel packages fla and causal_conv1d
unimportable before transformers loads, so that its hub-kernel decorators
bind their torch fallbacks, then checks which functions the layers call):

    python3 tools/ref/make_hybrid_models.py --out tests/fidelity/models [--only NAME[,NAME]]

The models (all three with their references estimated at 0.68 MB; the
script prints the total and fails when it passes 700 KB). Every one has
vocab 64, hidden 32, 4 layers of types [linear_attention x3, full_attention], full
attention with 4 heads, 2 kv heads, head_dim 16, a q_proj of twice the
heads (query and output gate), q/k RMSNorm, partial rotary 0.25 (rotary dim
4, read by transformers from rope_parameters["partial_rotary_factor"]), and
zero-centred (1 + w) RMSNorms; eos 2, bos 1, pad 0:

    qwen3next_f32   Qwen3NextForCausalLM (qwen3_next), float32, untied;
                    GDN: linear_num_key_heads 2, linear_num_value_heads 4,
                    key/value head dim 16, conv kernel 4, fused projections
                    in_proj_qkvz and in_proj_ba; MoE on layers 0, 2, 3
                    (8 experts, top-2, norm_topk_prob, moe_intermediate 8,
                    shared expert 8 with its sigmoid gate), layer 1 dense
                    (mlp_only_layers [1], intermediate 32); experts as
                    save_pretrained writes them; plus a multi-token-
                    prediction head (mtp_num_hidden_layers 1, mtp.* tensors)
    qwen35_bf16     Qwen3_5ForCausalLM (qwen3_5_text), bfloat16, tied; GDN
                    2 key heads, 2 value heads, dims 16, separate projections
                    in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; dense MLP
                    of intermediate 64 on every layer
    qwen35moe_bf16  Qwen3_5MoeForCausalLM (qwen3_5_moe_text), bfloat16,
                    untied; GDN 2 key heads, 4 value heads, dims 16; MoE on
                    every layer (8 experts, top-2, always renormalised,
                    moe_intermediate 8, shared expert 8); the fused expert
                    tensors mlp.experts.gate_up_proj [E, 2I, H] and
                    mlp.experts.down_proj [E, H, I] (what transformers 5.x
                    keeps in memory; the script writes the file itself when
                    save_pretrained converts to the per-expert layout)

The sizes are below the usual ones (hidden 64, vocab 256, experts of 32)
because the repository is near its size limit: the three models and their
references must stay under 700 KB together.

Weights are drawn so that a wrong formula in an engine shows, not as
transformers initialises them: matrices N(0, 0.1^2), embeddings and lm_head
N(0, 0.5^2), routers N(0, 0.5^2), experts' down_proj as make_moe_models
draws it, zero-centred norm weights N(0, 0.1^2) (so 1 + w varies around 1),
the gated norm of the GDN (which multiplies by w itself) 1 + N(0, 0.1^2),
conv1d weights N(0, 0.5^2), dt_bias N(0, 0.5^2), and A_log = log(A) with A
uniform in [0.02, 0.5], so that the state decays by 0.7 to 0.99 a step and
what a layer carries from earlier tokens (and earlier turns) matters. Each
model is re-seeded until no router of any reference run has a near tie
between its k-th and (k+1)-th expert ((p_k - p_(k+1)) / p_k >= 1e-3, in the
float32 run; for qwen3next_f32 also in the MTP head's layer) and until each
greedy run makes at least 12 tokens before an eos.

For each model, OUT/<name>/ gets config.json (as save_pretrained writes it;
qwen3next_f32 gains "mtp_num_hidden_layers": 1), generation_config.json and
model.safetensors, and OUT/<name>/ref/ gets:

    ref.json            what make_tiny_models.py writes (the C model tests read
                        it: dtype, vocab_size, max_new_tokens 20, sequences,
                        greedy, greedy_upcast and lowp_vs_upcast_max_abs for
                        bf16) and the fields below
    logits_<i>.f32      sequence i's logits, float32 little-endian [len x vocab]:
                        the model's own dtype run
    logits_<i>.upcast.f32  bf16 models: the same weights upcast to float32
    multi_turn.f32      qwen3next_f32: the second turn's logits [12 x vocab]

The sequences with logits files are 5, 17 and 40 tokens for qwen3next_f32
and only 5 and 17 for the bf16 models (the C harness needs both files for
every sequence; the size budget allows no more); the bf16 models' 40-token
sequence is in "argmax_sequences" instead: per position the argmax id and
the top-2 gap, for the bf16 run and the float32 upcast run. Gaps are rounded
to 6 decimals. The greedy prompts are 4, 11 and 37 tokens, 20 new tokens.
The other fields of ref.json:

    seed, seed_attempts     the seed used, how many were drawn
    model_type, layer_types, config (config.json as written)
    rotary                  partial_rotary_factor, rotary dim, where
                            transformers reads the factor
    tensors                 name -> shape of one linear-attention layer and
                            one full-attention layer (as in the file),
                            expert_layout, weights_written_by, gate_up_order
    gdn                     the projection layouts, the functions the layers
                            call (each a transformers.* torch function), and
                            that transformers runs the chunked algorithm
                            (chunk 64) for several tokens and the recurrent
                            one for a single cached token
    multi_turn              turn 1 (the 40-token sequence) runs on a fresh
                            cache (transformers' DynamicCache with the conv
                            and recurrent states of the linear layers), turn
                            2 (12 more tokens) continues that cache; for
                            turn 2: logits file (f32), argmax and gaps (and
                            the upcast ones for bf16), how it was run, and
                            how far it is from one uncached forward of both
    consistency             transformers against itself in float32: greedy
                            steps (prefill + one-token decode on the cache)
                            against one uncached forward, the multi-turn run
                            likewise; over 1e-4 the script stops
    router_min_gap, moe     MoE models: the smallest (p_k - p_(k+1)) / p_k met;
                            the MoE settings and which layers are MoE
    argmax_sequences        see above (empty for qwen3next_f32)

qwen3next_f32's ref/ also gets the MTP head's reference (transformers loads
the checkpoint as Qwen3NextForCausalLM and ignores mtp.*, so it is computed
here, in float64, like make_mtp_model.py's):

    row p:  x = fc · [rmsnorm_e(embed(token[p + 1])) | rmsnorm_h(hidden[p])]
            x = decoder layer(x) at position p    (mtp.layers.0, causal over
                                                   the head's own rows)
            out[p] = rmsnorm(x, mtp.norm); logits[p] = lm_head · out[p]

hidden[p] being the model's final hidden row (after model.norm, from the
float32 model), the three norms zero-centred (1 + w) RMSNorms, logits[p]
guessing token[p + 2]. The decoder layer is transformers' own
Qwen3NextDecoderLayer, built from a config copy whose layer 0 is
full_attention and MoE, loaded with the file's mtp.layers.0.* (named as the
model.layers.L.* tensors are, in the same expert layout), run in float64
(transformers' norms and softmaxes inside it compute in float32) with a
float64 rotary table and an explicit causal mask; the same way of running a
layer is first checked against the model's own full-attention layer inside
a transformers forward (to 1e-4). Files:

    mtp.json             versions, the checks, the head's tensors, and per
                         sequence (5 and 17 tokens): ids, the head's greedy
                         drafts chained from the end (4) and their gaps
    mtp_logits_<i>.f32   the head's logits of rows 0 .. len(ids) - 2,
                         float32 little-endian [len(ids) - 1 x vocab]

Every written weight file is checked before its references are: the tensors
equal the model's (and the head's) bit for bit after mapping the names back,
and from_pretrained loads every tensor (none missing or unexpected besides
mtp.*) and gives the model's logits bit for bit. The models land next to the
others, so the model tests load them too: make them there once atlas can
load these model types (or pass --out elsewhere and point
ATLAS_FIDELITY_MODELS at it).
"""
import sys

# transformers binds its Gated DeltaNet and causal-conv1d functions when a
# model module is imported: to the fla / causal_conv1d kernels where those
# import, else to its own torch code. A None entry makes an import fail
# (and importlib.util.find_spec say "absent"), so the torch code is bound.
BLOCKED_PACKAGES = ("fla", "causal_conv1d")
for _package in BLOCKED_PACKAGES:
    if _package not in sys.modules:
        sys.modules[_package] = None

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import GenerationConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_moe_models as moe  # noqa: E402
import make_tiny_models as tiny  # noqa: E402

if not tiny.V5:
    sys.exit("make_hybrid_models.py needs transformers 5.x (written for 5.17); "
             f"this is {transformers.__version__}")

NEW_TOKENS = 20
PROMPT_LENGTHS = (4, 11, 37)
SECOND_TURN = 12                # tokens of the multi-turn reference's turn 2
MTP_SEQ_LENGTHS = (5, 17)
MTP_DRAFTS = 4
MIN_GREEDY = 12                 # tokens each greedy run makes before an eos
MIN_REL_GAP = moe.MIN_REL_GAP
MAX_TRIES = 200
CONSISTENCY_TOL = 1e-4          # float32: transformers' cached runs vs uncached ones
EPS = 1e-6
SIZE_LIMIT = 700 * 1024

COMMON = dict(vocab=64, hidden=32, layers=4, heads=4, kv_heads=2, head_dim=16, rotary=0.25,
              lin_dim=16, conv=4, eos=2)
MODELS = [
    dict(COMMON, name="qwen3next_f32", model_type="qwen3_next", config_class="Qwen3NextConfig",
         cls="Qwen3NextForCausalLM", dtype="float32", theta=1e4, lin_k_heads=2, lin_v_heads=4,
         intermediate=32, experts=8, top_k=2, norm_topk=True, moe_intermediate=8,
         shared_intermediate=8, mlp_only=[1], tie=False, layout=None, mtp=True, seed=51,
         seq_lengths=(5, 17, 40), argmax_lengths=()),
    dict(COMMON, name="qwen35_bf16", model_type="qwen3_5_text", config_class="Qwen3_5TextConfig",
         cls="Qwen3_5ForCausalLM", dtype="bfloat16", theta=1e6, mrope_section=[1, 1, 0],
         lin_k_heads=2, lin_v_heads=2, intermediate=64, experts=0, tie=True, layout=None,
         mtp=False, seed=52, seq_lengths=(5, 17), argmax_lengths=(40,)),
    # Qwen3.5-MoE routers always renormalise the top-k (no norm_topk_prob key).
    dict(COMMON, name="qwen35moe_bf16", model_type="qwen3_5_moe_text",
         config_class="Qwen3_5MoeTextConfig", cls="Qwen3_5MoeForCausalLM", dtype="bfloat16",
         theta=1e7, mrope_section=[1, 1, 0], lin_k_heads=2, lin_v_heads=4, intermediate=0,
         experts=8, top_k=2, norm_topk=True, moe_intermediate=8, shared_intermediate=8,
         tie=False, layout="fused", mtp=False, seed=53, seq_lengths=(5, 17),
         argmax_lengths=(40,)),
]

GDN_PROJECTIONS = {
    "qwen3_next": "in_proj_qkvz [2*Hk*dk + 2*Hv*dv, H] grouped by key head: for each of the Hk "
                  "key heads, rows q (dk), k (dk), v (Hv/Hk*dv), z (Hv/Hk*dv); in_proj_ba "
                  "[2*Hv, H] grouped by key head: b (Hv/Hk), a (Hv/Hk); then q, k, v are "
                  "concatenated as [q heads | k heads | v heads] for conv1d (transformers' "
                  "fix_query_key_value_ordering)",
    "qwen3_5_text": "in_proj_qkv [2*Hk*dk + Hv*dv, H] as [q | k | v], in_proj_z [Hv*dv, H], "
                    "in_proj_b [Hv, H], in_proj_a [Hv, H]",
}
GDN_PROJECTIONS["qwen3_5_moe_text"] = GDN_PROJECTIONS["qwen3_5_text"]
GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                 "causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                 "recurrent_gated_delta_rule")
MTP_NORMS = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
             "mtp.norm.weight")
MTP_LAYER = "mtp.layers.0."


def transformers_class(name):
    if not hasattr(transformers, name):
        sys.exit(f"transformers {transformers.__version__} has no {name} (written for 5.17)")
    return getattr(transformers, name)


def layer_types(spec):
    return ["linear_attention"] * (spec["layers"] - 1) + ["full_attention"]


def make_config(spec):
    rope = {"rope_type": "default", "rope_theta": spec["theta"],
            "partial_rotary_factor": spec["rotary"]}
    if "mrope_section" in spec:
        # Text positions are the same on all three mrope axes, so the
        # sections change nothing; they sum to rotary dim / 2 as real ones do.
        rope.update(mrope_section=list(spec["mrope_section"]), mrope_interleaved=True)
    kw = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
              num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
              num_key_value_heads=spec["kv_heads"], head_dim=spec["head_dim"],
              max_position_embeddings=tiny.MAX_POSITIONS, rms_norm_eps=EPS, hidden_act="silu",
              tie_word_embeddings=spec["tie"], attention_bias=False, rope_parameters=rope,
              layer_types=layer_types(spec), linear_num_key_heads=spec["lin_k_heads"],
              linear_num_value_heads=spec["lin_v_heads"], linear_key_head_dim=spec["lin_dim"],
              linear_value_head_dim=spec["lin_dim"], linear_conv_kernel_dim=spec["conv"],
              bos_token_id=tiny.BOS, eos_token_id=spec["eos"], pad_token_id=tiny.PAD)
    if spec["intermediate"]:
        kw["intermediate_size"] = spec["intermediate"]
    if spec["experts"]:
        kw.update(num_experts=spec["experts"], num_experts_per_tok=spec["top_k"],
                  moe_intermediate_size=spec["moe_intermediate"],
                  shared_expert_intermediate_size=spec["shared_intermediate"])
    if spec["model_type"] == "qwen3_next":
        kw.update(norm_topk_prob=spec["norm_topk"], decoder_sparse_step=1,
                  mlp_only_layers=list(spec["mlp_only"]))
    config = transformers_class(spec["config_class"])(**kw)
    if config.model_type != spec["model_type"] or list(config.layer_types) != layer_types(spec):
        sys.exit(f"{spec['name']}: the config is {config.model_type} {config.layer_types}")
    # The in-memory model computes as the references do (not serialized).
    config._attn_implementation = "eager"
    if spec["experts"]:
        config._experts_implementation = "eager"
    return config


def draw(name, shape, gen, spec):
    """One parameter's random values (the rules of the module docstring)."""
    noise = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("linear_attn.norm.weight"):      # gated norm: x̂ * w * silu(z)
        return 1.0 + 0.1 * noise
    if name.endswith("norm.weight") or name in MTP_NORMS:   # x̂ * (1 + w)
        return 0.1 * noise
    if name.endswith("A_log"):
        return torch.log(0.02 + 0.48 * torch.rand(shape, generator=gen))
    if name.endswith("dt_bias") or name.endswith("conv1d.weight"):
        return 0.5 * noise
    if "embed_tokens" in name or name.startswith("lm_head"):
        return 0.5 * noise
    if moe.ROUTER.search(name):
        return moe.ROUTER_STD * noise
    if moe.EXPERT_DOWN.search(name):
        return 0.1 * max(1.0, (128 / spec["moe_intermediate"]) ** 0.5) * noise
    return 0.1 * noise


def randomize(named_parameters, gen, spec, prefix=""):
    with torch.no_grad():
        for name, p in named_parameters:
            p.copy_(draw(prefix + name, p.shape, gen, spec))


def build(spec, seed):
    torch.manual_seed(seed)
    model = transformers_class(spec["cls"])(make_config(spec))
    randomize(model.named_parameters(), torch.Generator().manual_seed(seed), spec)
    dtype = tiny.DTYPES[spec["dtype"]]
    model = model.to(dtype).eval()
    model.config.dtype = dtype
    model.generation_config = GenerationConfig(bos_token_id=tiny.BOS, eos_token_id=spec["eos"],
                                               pad_token_id=tiny.PAD)
    return model


# ---- the MTP head's layer ----

def eager_copy(config):
    cfg = copy.deepcopy(config)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def mtp_layer(config, layer_class):
    """transformers' decoder layer as the head's: a config copy whose layer 0
    is full attention with the MoE mlp."""
    cfg = eager_copy(config)
    cfg.layer_types = ["full_attention"] + list(cfg.layer_types[1:])
    cfg.mlp_only_layers = []
    return layer_class(cfg, 0).eval()


def mtp_tensors(model, spec, seed):
    """The head's tensors in memory layout (fused experts), drawn as the model's."""
    gen = torch.Generator().manual_seed(seed + 1)
    layer = mtp_layer(model.config, type(model.model.layers[0]))
    randomize(layer.named_parameters(), gen, spec, MTP_LAYER)
    h = spec["hidden"]
    out = {MTP_LAYER + k: v.detach().clone() for k, v in layer.state_dict().items()}
    for name, shape in (("mtp.fc.weight", (h, 2 * h)),) + tuple((n, (h,)) for n in MTP_NORMS):
        out[name] = draw(name, shape, gen, spec)
    return out


def rotary(pos, spec, dtype):
    """cos, sin [1, T, rotary dim] of the rotate-half rotary embedding."""
    dim = int(spec["head_dim"] * spec["rotary"])
    inv = 1.0 / spec["theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = pos.double()[:, None] * inv[None]
    emb = torch.cat([ang, ang], -1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def run_layer(layer, x, pos, spec):
    """A decoder layer over rows x [T, H] at positions pos, causal, no cache."""
    t = x.shape[0]
    mask = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None]
    with torch.no_grad():
        out = layer(x[None], position_embeddings=rotary(pos, spec, x.dtype),
                    attention_mask=mask, position_ids=pos[None], past_key_values=None)
    return (out[0] if isinstance(out, tuple) else out)[0]


def check_layer_call(model, spec, ids):
    """run_layer on a standalone copy of the model's full-attention layer
    against that layer inside a transformers forward: the max-abs difference."""
    idx = model.config.layer_types.index("full_attention")
    seen = {}

    def hook(_mod, args, kwargs, out):
        seen["x"] = args[0] if args else kwargs["hidden_states"]
        seen["y"] = out[0] if isinstance(out, tuple) else out
    handle = model.model.layers[idx].register_forward_hook(hook, with_kwargs=True)
    try:
        tiny.logits_of(model, ids)
    finally:
        handle.remove()
    layer = type(model.model.layers[idx])(eager_copy(model.config), idx).eval()
    layer.load_state_dict(model.model.layers[idx].state_dict(), strict=True)
    layer = layer.double()
    y = run_layer(layer, seen["x"][0].double(), torch.arange(len(ids)), spec)
    return float((y - seen["y"][0].double()).abs().max())


def zc_rms(x, w):
    """The zero-centred RMSNorm of Qwen3-Next: x / rms(x) * (1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w)


def mtp_head(w, layer, hidden, next_ids, spec):
    """The head's final rows [T, H] for the pairs (hidden[p], next_ids[p])."""
    e = zc_rms(w["model.embed_tokens.weight"][next_ids], w["mtp.pre_fc_norm_embedding.weight"])
    h = zc_rms(hidden, w["mtp.pre_fc_norm_hidden.weight"])
    x = torch.cat([e, h], -1) @ w["mtp.fc.weight"].T
    x = run_layer(layer, x, torch.arange(len(next_ids)), spec)
    return zc_rms(x, w["mtp.norm.weight"])


# ---- routers, paths, runs ----

class RouterWatch:
    """Hooks every MoE router under module: the smallest (p_k - p_(k+1)) / p_k
    of the float32 softmax of the router logits (the model's dtype, as
    transformers computes them), and that transformers' own choice is the top k."""

    def __init__(self, module, k):
        self.k, self.worst, self.hooks = k, float("inf"), []
        for m in module.modules():
            if hasattr(m, "experts") and hasattr(m, "gate"):
                self.hooks.append(m.gate.register_forward_hook(self.hook))

    def hook(self, gate, args, out):
        h = args[0].reshape(-1, gate.weight.shape[1])
        probs = F.softmax(F.linear(h, gate.weight).float(), dim=-1, dtype=torch.float32)
        p = probs.double().sort(dim=-1, descending=True).values
        rel = (p[:, self.k - 1] - p[:, self.k]) / p[:, self.k - 1]
        self.worst = min(self.worst, float(rel.min()))
        chosen = out[-1] if isinstance(out, tuple) else None
        if torch.is_tensor(chosen) and chosen.shape == (h.shape[0], self.k):
            mine = probs.topk(self.k, dim=-1).indices.sort(dim=-1).values
            if not torch.equal(mine, chosen.sort(dim=-1).values):
                sys.exit("a router chose other experts than the top-k of its softmax")

    def close(self):
        for handle in self.hooks:
            handle.remove()


def bound_function(fn):
    """What a transformers hub-kernel wrapper calls (its closure's
    `implementation`, 5.x), else fn itself."""
    code = getattr(fn, "__code__", None)
    if code is not None and fn.__closure__ and "implementation" in code.co_freevars:
        return fn.__closure__[code.co_freevars.index("implementation")].cell_contents
    return fn


def gdn_path(model):
    """The functions the Gated DeltaNet layers call; all must be transformers' torch code."""
    mixer = next(m for m in model.modules() if hasattr(m, "A_log"))
    module = sys.modules[type(mixer).__module__]
    used = {}
    for name in GDN_FUNCTIONS:
        fn = getattr(mixer, name, None) or getattr(module, name, None)
        if callable(fn):
            impl = bound_function(fn)
            used[name] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', impl)}"
    used["gated_norm"] = f"{type(mixer.norm).__module__}.{type(mixer.norm).__qualname__}"
    foreign = {k: v for k, v in used.items() if not v.startswith("transformers.")}
    if foreign:
        sys.exit(f"the Gated DeltaNet does not run transformers' torch code: {foreign}")
    return used


def gap(row):
    return round(tiny.top2_gap(row), 6)


def argmax_and_gaps(logits):
    return [int(r.argmax()) for r in logits], [gap(r) for r in logits]


def greedy(model, prompts):
    """generate()'s tokens and per-step gaps, and the largest difference
    between its step logits (prefill, then one-token steps on the cache) and
    one uncached forward over prompt + tokens."""
    runs, diff = [], 0.0
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=tiny.PAD)
        tokens = out.sequences[0, len(prompt):].tolist()
        steps = torch.stack([s[0].float() for s in out.logits[:len(tokens)]])
        full = tiny.logits_of(model, prompt + tokens[:-1])[len(prompt) - 1:]
        diff = max(diff, float((steps - full).abs().max()))
        runs.append({"prompt": prompt, "tokens": tokens, "gaps": [gap(s) for s in steps]})
    return runs, diff


def continue_on_cache(model, first, second, one_by_one):
    """Turn 2's logits [len(second), vocab]: first runs on a fresh cache, then
    second continues it in one forward (or one forward per token)."""
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([first]), use_cache=True).past_key_values
        if not one_by_one:
            return model(input_ids=torch.tensor([second]), past_key_values=cache,
                         use_cache=True).logits[0].float()
        rows = []
        for token in second:
            out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0, -1].float())
        return torch.stack(rows)


def multi_turn(exact, main, first, second):
    """The multi-turn reference: turn 2 in one forward on the cache unless
    that differs from the uncached run in float32 (transformers versions that
    drop the linear layers' state in a multi-token continuation), then one
    token at a time."""
    full = tiny.logits_of(exact, first + second)[len(first):]
    tried = {}
    for one_by_one in (False, True):
        logits = continue_on_cache(exact, first, second, one_by_one)
        tried[one_by_one] = float((logits - full).abs().max())
        if tried[one_by_one] <= CONSISTENCY_TOL:
            break
    else:
        sys.exit(f"transformers' turn 2 on the cache differs from the uncached run: {tried}")
    mode = (f"{len(second)} one-token forwards" if one_by_one else
            f"one forward of {len(second)} tokens") + " on the cache turn 1 left"
    turn = {"first": first, "second": second, "continuation": mode,
            "cache_vs_uncached_max_abs": tried[one_by_one]}
    if one_by_one:
        turn["one_forward_vs_uncached_max_abs"] = tried[False]
    if main is exact:
        turn["argmax"], turn["gaps"] = argmax_and_gaps(logits)
        return turn, logits
    lowp = continue_on_cache(main, first, second, one_by_one)
    turn["argmax"], turn["gaps"] = argmax_and_gaps(lowp)
    turn["argmax_upcast"], turn["gaps_upcast"] = argmax_and_gaps(logits)
    return turn, logits


# ---- the files ----

def same(a, b):
    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k])
        for k in a)


def gate_up_order(model):
    """Which half of a fused gate_up_proj[e] transformers' experts use as the
    gate (see make_moe_models.find_gate_up_order), found on the model's own
    experts module; "gate_up" where nothing is fused."""
    experts = next((m for m in model.modules() if hasattr(m, "gate_up_proj")), None)
    if experts is None:
        return "gate_up"
    e = copy.deepcopy(experts).float()
    w, d = e.gate_up_proj[0].detach(), e.down_proj[0].detach()
    half, h = w.shape[0] // 2, model.config.hidden_size
    if w.shape[1] != h or tuple(d.shape) != (h, half):
        sys.exit(f"the experts are not gate_up_proj [E, 2I, H], down_proj [E, H, I]: "
                 f"{tuple(e.gate_up_proj.shape)}, {tuple(e.down_proj.shape)}")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        x = torch.randn(4, h, generator=gen)
        y = e(x, torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1))
        a, b = x @ w[:half].T, x @ w[half:].T
        err = {"gate_up": float(((F.silu(a) * b) @ d.T - y).abs().max()),
               "up_gate": float(((F.silu(b) * a) @ d.T - y).abs().max())}
    best, other = sorted(err, key=err.get)
    if err[best] > 1e-4 or err[other] < 1e-2:
        sys.exit(f"cannot tell the gate/up order of gate_up_proj: {err}")
    return best


def write_model(model, spec, out, order, head):
    """save_pretrained, then the weights file rewritten where the layout asked
    for differs from save_pretrained's or the head's tensors join it; checked."""
    model.save_pretrained(out)
    saved = moe.read_weights(out)
    target = spec["layout"] or moe.layout_of(saved)
    want = moe.to_layout(moe.model_tensors(model), target, order)
    if head:
        want.update(moe.to_layout(head, target, order))
    info = {"expert_layout": target, "save_pretrained_layout": moe.layout_of(saved),
            "weights_written_by": "save_pretrained"}
    if not same(saved, want):
        for f in moe.weight_files(out):
            os.remove(os.path.join(out, f))
        save_file(want, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        info["weights_written_by"] = "make_hybrid_models.py" + (" (with mtp.*)" if head else "")
    written = moe.read_weights(out)
    moe.same_tensors(written, want, out + " vs the model")
    path = os.path.join(out, "config.json")
    with open(path) as f:
        conf = json.load(f)
    if head:
        conf["mtp_num_hidden_layers"] = 1
        with open(path, "w") as f:
            json.dump(conf, f, indent=2, sort_keys=True)
            f.write("\n")
    return info, written, conf


def load(out, spec, dtype):
    """The model as transformers loads out, every tensor accounted for."""
    kw = {"dtype": dtype, "attn_implementation": "eager", "output_loading_info": True}
    if spec["experts"]:
        kw["experts_implementation"] = "eager"
    model, info = transformers_class(spec["cls"]).from_pretrained(out, **kw)
    info = dict(info)
    # transformers ignores mtp.* by design (_keys_to_ignore_on_load_unexpected)
    info["unexpected_keys"] = [k for k in info.get("unexpected_keys", ())
                               if not k.startswith("mtp.")]
    bad = {k: sorted(map(str, v))[:6] for k, v in info.items()
           if k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs") and v}
    if bad:
        sys.exit(f"{out}: from_pretrained: {bad}")
    return model.eval()


def layer_tensors(written, config):
    types = list(config.layer_types)
    out = {}
    for kind in ("linear_attention", "full_attention"):
        prefix = f"model.layers.{types.index(kind)}."
        out[kind + "_layer"] = {n: list(t.shape) for n, t in sorted(written.items())
                                if n.startswith(prefix)}
    return out


# ---- one model ----

def make_model(spec, out_root):
    out = os.path.join(out_root, spec["name"])
    rng = random.Random(spec["seed"])
    seqs = [[rng.randrange(spec["vocab"]) for _ in range(n)] for n in spec["seq_lengths"]]
    long_seqs = [[rng.randrange(spec["vocab"]) for _ in range(n)] for n in spec["argmax_lengths"]]
    prompts = [[tiny.BOS] + [rng.randrange(3, spec["vocab"]) for _ in range(n - 1)]
               for n in PROMPT_LENGTHS]
    second = [rng.randrange(3, spec["vocab"]) for _ in range(SECOND_TURN)]
    mtp_seqs = [[rng.randrange(spec["vocab"]) for _ in range(n)] for n in MTP_SEQ_LENGTHS]
    inputs = dict(seqs=seqs, long_seqs=long_seqs, prompts=prompts, second=second,
                  mtp_seqs=mtp_seqs)
    for attempt in range(MAX_TRIES):
        seed = spec["seed"] + 1000 * attempt
        ref = try_seed(spec, seed, out, inputs)
        if ref is not None:
            ref["seed_attempts"] = attempt + 1
            with open(os.path.join(out, "ref", "ref.json"), "w") as f:
                json.dump(ref, f, indent=1)
                f.write("\n")
            return out, ref
    sys.exit(f"{spec['name']}: no seed of {MAX_TRIES} gives decisive routers and long greedy runs")


def try_seed(spec, seed, out, inputs):
    shutil.rmtree(out, ignore_errors=True)
    model = build(spec, seed)
    order = gate_up_order(model)
    head = mtp_tensors(model, spec, seed) if spec["mtp"] else None
    info, written, conf = write_model(model, spec, out, order, head)
    dtype = tiny.DTYPES[spec["dtype"]]
    lowp = dtype != torch.float32
    main = load(out, spec, dtype)
    exact = load(out, spec, torch.float32) if lowp else main   # what a float32 engine reproduces
    gdn = gdn_path(main)
    seqs, long_seqs, prompts = inputs["seqs"], inputs["long_seqs"], inputs["prompts"]
    if not torch.equal(tiny.logits_of(main, seqs[-1]), tiny.logits_of(model, seqs[-1])):
        sys.exit(f"{out}: the reloaded model's logits differ from the model's")
    rot = main.model.rotary_emb.inv_freq.numel() * 2
    if rot != int(spec["head_dim"] * spec["rotary"]):
        sys.exit(f"{out}: transformers rotates {rot} of {spec['head_dim']} dims, "
                 f"not partial_rotary_factor {spec['rotary']}")

    watch = RouterWatch(exact, spec["top_k"]) if spec["experts"] else None
    greedy_exact, greedy_diff = greedy(exact, prompts)
    short = [len(g["tokens"]) for g in greedy_exact if len(g["tokens"]) < MIN_GREEDY]
    greedy_main = greedy(main, prompts)[0] if lowp else greedy_exact
    short += [len(g["tokens"]) for g in greedy_main if len(g["tokens"]) < MIN_GREEDY]
    if short:
        if watch:
            watch.close()
        print(f"{spec['name']}: seed {seed}: a greedy run stops at eos after {short[0]} tokens",
              file=sys.stderr)
        return None
    first = max(seqs + long_seqs, key=len)
    turn, turn_logits = multi_turn(exact, main, first, inputs["second"])
    for ids in seqs + long_seqs:
        tiny.logits_of(exact, ids)
    router_gap = None
    if watch:
        watch.close()
        router_gap = watch.worst
        print(f"{spec['name']}: seed {seed}: router min (p_k - p_k+1) / p_k {router_gap:.3g}",
              file=sys.stderr)
        if router_gap < MIN_REL_GAP:
            return None
    if greedy_diff > CONSISTENCY_TOL:
        sys.exit(f"{out}: transformers' greedy steps on the cache differ from its uncached "
                 f"forward by {greedy_diff:.3g}")

    ref_dir = os.path.join(out, "ref")
    os.makedirs(ref_dir)
    mtp = make_mtp_ref(exact, spec, out, written, order, inputs["mtp_seqs"], ref_dir) \
        if spec["mtp"] else None
    if mtp is not None and mtp["router_min_gap"] < MIN_REL_GAP:
        shutil.rmtree(ref_dir)
        print(f"{spec['name']}: seed {seed}: MTP router min gap {mtp['router_min_gap']:.3g}",
              file=sys.stderr)
        return None

    ref = {"name": spec["name"], "architecture": spec["cls"], "model_type": spec["model_type"],
           "dtype": spec["dtype"], "vocab_size": spec["vocab"],
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "max_new_tokens": NEW_TOKENS, "seed": seed, "layer_types": layer_types(spec),
           "config": conf,
           "rotary": {"partial_rotary_factor": spec["rotary"], "rotary_dim": rot,
                      "read_from": "rope_parameters['partial_rotary_factor']",
                      "in_config_json": sorted(
                          k for k, v in (("rope_parameters", conf.get("rope_parameters") or {}),
                                         ("top level", conf))
                          if "partial_rotary_factor" in v)},
           "tensors": dict(layer_tensors(written, main.config), **info, gate_up_order=order),
           "gdn": {"projections": GDN_PROJECTIONS[spec["model_type"]], "functions": gdn,
                   "blocked_imports": list(BLOCKED_PACKAGES),
                   "algorithms": "several tokens (prefill, a multi-token continuation): "
                                 "torch_chunk_gated_delta_rule, chunks of 64; one token on a "
                                 "cache: torch_recurrent_gated_delta_rule"},
           "sequences": []}
    lowp_diff = 0.0
    for i, ids in enumerate(seqs):
        seq = {"ids": ids, "logits": f"logits_{i}.f32"}
        logits = tiny.logits_of(main, ids)
        tiny.write_f32(os.path.join(ref_dir, seq["logits"]), logits)
        if lowp:
            seq["logits_upcast"] = f"logits_{i}.upcast.f32"
            up = tiny.logits_of(exact, ids)
            tiny.write_f32(os.path.join(ref_dir, seq["logits_upcast"]), up)
            lowp_diff = max(lowp_diff, float((logits - up).abs().max()))
        ref["sequences"].append(seq)
    ref["argmax_sequences"] = []
    for ids in long_seqs:
        entry = {"ids": ids}
        entry["argmax"], entry["gaps"] = argmax_and_gaps(tiny.logits_of(main, ids))
        entry["argmax_upcast"], entry["gaps_upcast"] = argmax_and_gaps(tiny.logits_of(exact, ids))
        ref["argmax_sequences"].append(entry)
    ref["greedy"] = greedy_main
    if lowp:
        ref["greedy_upcast"] = greedy_exact
        ref["lowp_vs_upcast_max_abs"] = lowp_diff
    if not lowp:
        turn["logits"] = "multi_turn.f32"
        tiny.write_f32(os.path.join(ref_dir, turn["logits"]), turn_logits)
    ref["multi_turn"] = turn
    ref["consistency"] = {"over": "the float32 run" + (" (upcast)" if lowp else ""),
                          "limit": CONSISTENCY_TOL,
                          "greedy_cache_vs_uncached_max_abs": greedy_diff,
                          "multi_turn_cache_vs_uncached_max_abs": turn["cache_vs_uncached_max_abs"]}
    if router_gap is not None:
        ref["router_min_gap"] = {"prob_rel": router_gap, "threshold": MIN_REL_GAP,
                                 "over": "every MoE layer and position of the sequences, the "
                                         "greedy runs and the multi-turn runs (float32 run)"}
        ref["moe"] = {"num_experts": spec["experts"], "num_experts_per_tok": spec["top_k"],
                      "norm_topk_prob": spec["norm_topk"],
                      "moe_intermediate_size": spec["moe_intermediate"],
                      "shared_expert_intermediate_size": spec["shared_intermediate"],
                      "shared_expert": "sigmoid(shared_expert_gate · x) * shared_expert(x), "
                                       "added to the routed experts' sum",
                      "moe_layers": [i for i, layer in enumerate(main.model.layers)
                                     if hasattr(layer.mlp, "experts")]}
    return ref


def make_mtp_ref(model, spec, out, written, order, seqs, ref_dir):
    """The MTP head's reference (mtp.json, mtp_logits_<i>.f32); returns mtp.json's fields."""
    layer_class = type(model.model.layers[0])
    check = check_layer_call(model, spec, seqs[-1])
    if check > CONSISTENCY_TOL:
        sys.exit(f"{out}: a decoder layer run here differs from transformers' by {check:.3g}")
    w = {k: v.double() for k, v in written.items()}
    lm_head = w["model.embed_tokens.weight"] if spec["tie"] else w["lm_head.weight"]
    file_head = {k: v for k, v in written.items() if k.startswith("mtp.")}
    layer = mtp_layer(model.config, layer_class)
    in_memory = moe.to_layout(file_head, moe.layout_of(
        {MTP_LAYER + k: v for k, v in layer.state_dict().items()}), order)
    layer.load_state_dict({k[len(MTP_LAYER):]: v for k, v in in_memory.items()
                           if k.startswith(MTP_LAYER)}, strict=True)
    layer = layer.double()
    watch = RouterWatch(layer, spec["top_k"])
    ref = {"name": spec["name"], "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "vocab_size": spec["vocab"],
           "layer_call_vs_transformers_max_abs": check,
           "mtp_tensors": {n: list(t.shape) for n, t in sorted(file_head.items())},
           "sequences": []}
    hidden_check = 0.0
    try:
        for i, ids in enumerate(seqs):
            t = torch.tensor(ids)
            with torch.no_grad():
                hidden = model.model(input_ids=t[None]).last_hidden_state[0].double()
            hidden_check = max(hidden_check, float(
                (hidden @ lm_head.T - tiny.logits_of(model, ids).double()).abs().max()))
            logits = mtp_head(w, layer, hidden[:-1], t[1:], spec) @ lm_head.T
            tiny.write_f32(os.path.join(ref_dir, f"mtp_logits_{i}.f32"), logits.float())
            hs, nxt, drafts, gaps = list(hidden[:-1]), list(ids[1:]), [], []
            for _ in range(MTP_DRAFTS):
                o = mtp_head(w, layer, torch.stack(hs), torch.tensor(nxt), spec)
                lg = o[-1] @ lm_head.T
                drafts.append(int(lg.argmax()))
                gaps.append(gap(lg))
                hs.append(o[-1])
                nxt.append(drafts[-1])
            ref["sequences"].append({"ids": ids, "logits": f"mtp_logits_{i}.f32",
                                     "drafts": drafts, "gaps": gaps})
    finally:
        watch.close()
    if hidden_check > CONSISTENCY_TOL:
        sys.exit(f"{out}: lm_head · last_hidden_state differs from the logits by "
                 f"{hidden_check:.3g}")
    ref["hidden_vs_logits_max_abs"] = hidden_check
    ref["router_min_gap"] = watch.worst
    with open(os.path.join(ref_dir, "mtp.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    return ref


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fidelity/models", help="output folder")
    ap.add_argument("--only", nargs="*", metavar="NAME[,NAME]",
                    help="names of the models to make (default: all)")
    args = ap.parse_args()
    names = tiny.parse_only(args.only, [s["name"] for s in MODELS])
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    for spec in MODELS:
        if spec["name"] not in names:
            continue
        path, ref = make_model(spec, args.out)
        extra = ""
        if "lowp_vs_upcast_max_abs" in ref:
            extra = f", {spec['dtype']} vs float32 max-abs {ref['lowp_vs_upcast_max_abs']:.4g}"
        files = ref["tensors"]
        print(f"{spec['name']}: {tiny.tree_bytes(path)} bytes, seed {ref['seed']}, "
              f"{files['expert_layout']} experts ({files['weights_written_by']}), "
              f"turn 2 as {ref['multi_turn']['continuation']}{extra}", file=sys.stderr)
    total = sum(tiny.tree_bytes(os.path.join(args.out, s["name"])) for s in MODELS
                if os.path.isdir(os.path.join(args.out, s["name"])))
    print(f"hybrid models: {total} bytes", file=sys.stderr)
    if total > SIZE_LIMIT:
        sys.exit(f"over the {SIZE_LIMIT} bytes the repository can take")


if __name__ == "__main__":
    main()
