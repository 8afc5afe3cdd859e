"""A Qwen3-Next decoder in plain PyTorch with transformers' parameter names
(model_type qwen3_next), plus the multi-token-prediction head that
transformers does not run (the `mtp.*` tensors), so that its state_dict is
a Hugging Face checkpoint as it stands.

Layers mix positions with Gated DeltaNet (linear attention) or, every
`full_attention_interval`-th layer, gated full attention; every MLP is a
mixture of experts with a shared expert. Shapes: E hidden, V vocab; full
attention Hq heads, Hkv kv heads, D head_dim, partial rotary (R dims);
linear Hk key heads and Hv value heads of dk and dv, conv kernel K; N
experts of moe_intermediate_size, top-k, a shared expert of
shared_expert_intermediate_size.

What transformers computes, and atlas after it:
  - RMSNorms of the residual stream and of q/k are zero-centred: x / rms(x)
    * (1 + w), in float32, w initialised to 0. The delta rule's output norm
    is not (x / rms(x) * w * silu(z)).
  - q_proj gives per head [query (D) | output gate (D)]; the attention's
    output is multiplied by sigmoid(gate) before o_proj.
  - in_proj_qkvz gives per key head [q (dk) | k (dk) | v (Hv/Hk * dv) |
    z (Hv/Hk * dv)], in_proj_ba per key head [b (Hv/Hk) | a (Hv/Hk)]; the
    conv runs over [all q | all k | all v] with silu; beta = sigmoid(b),
    g = -exp(A_log) * softplus(a + dt_bias) (the log of a step's decay).
  - The delta rule, per value head with its key head's q and k (l2-normed,
    q scaled by dk^-1/2): S = S * exp(g); S += k (beta (v - S^T k))^T;
    o = S^T q. Here it runs in chunks of 64 (the WY form), in float32.
  - The router's softmax is over all experts in float32; the top-k weights
    are renormalised (norm_topk_prob); the shared expert's output is scaled
    by sigmoid(shared_expert_gate(x)).
  - The MTP head: row p is fc · [norm_e(embed(id[p+1])) | norm_h(h[p])],
    h the model's output after model.norm, then one full-attention MoE
    decoder layer over the head's own rows (positions p), mtp.norm, and the
    tied lm_head; it guesses id[p+2].

The MoE runs every expert on every row and weights the outputs (zero for
the experts not chosen): with 8 small experts that is simple and keeps the
shapes static for torch.compile, at 4x the experts' arithmetic. Runs on
torch 1.13 (CPU, for tests) and 2.x.
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from qwen3 import causal_attention, rotate_half

CHUNK = 64


@dataclasses.dataclass
class Config:
    vocab_size: int = 4096
    hidden_size: int = 384
    num_hidden_layers: int = 8
    full_attention_interval: int = 4
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    head_dim: int = 64
    partial_rotary_factor: float = 0.25
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 112
    shared_expert_intermediate_size: int = 256
    mtp_num_hidden_layers: int = 1
    max_position_embeddings: int = 32768
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6

    @classmethod
    def from_hf(cls, c):
        """From a config.json dict as export.hf_config_next writes it."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in c.items() if k in fields}
        kw["rope_theta"] = c["rope_parameters"]["rope_theta"]
        kw["partial_rotary_factor"] = c["rope_parameters"].get(
            "partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
        cfg = cls(**kw)
        assert cfg.layer_types() == c["layer_types"], "layer_types: not every n-th full"
        return cfg

    def layer_types(self):
        n = self.full_attention_interval
        return ["full_attention" if (i + 1) % n == 0 else "linear_attention"
                for i in range(self.num_hidden_layers)]


class RMSNorm(nn.Module):
    """Zero-centred: scale 1 + w."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * (1.0 + self.weight.float())).to(dtype)


class GatedRMSNorm(nn.Module):
    """The delta rule's output norm: x / rms(x) * w * silu(z), w from 1."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, z):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.weight * x.to(dtype)
        return (x * F.silu(z.float())).to(dtype)


def rope_tables(cfg, n, device):
    """cos and sin [n, R] for positions 0..n-1, R = head_dim * factor."""
    r = int(cfg.head_dim * cfg.partial_rotary_factor)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float32,
                                                 device=device) / r))
    freqs = torch.outer(torch.arange(n, dtype=torch.float32, device=device), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x [B, H, T, D]: the first R dims rotated, the rest passed."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.h, self.kvh, self.d = h, kvh, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d * 2, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kvh * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, gate = self.q_proj(x).view(b, t, self.h, 2 * self.d).chunk(2, dim=-1)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kvh, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kvh, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.h // self.kvh
        y = causal_attention(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1))
        y = y.transpose(1, 2).reshape(b, t, self.h * self.d)
        return self.o_proj(y * torch.sigmoid(gate.reshape(b, t, -1)))


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_rule_recurrent(q, k, v, g, beta):
    """The reference: q, k [B, H, T, dk] (normed, q scaled), v [B, H, T, dv],
    g, beta [B, H, T]; float32. Returns [B, H, T, dv]."""
    b, h, t, dk = k.shape
    s = q.new_zeros(b, h, dk, v.shape[-1])
    out = []
    for i in range(t):
        s = s * g[:, :, i].exp()[..., None, None]
        mem = (s * k[:, :, i, :, None]).sum(-2)
        delta = (v[:, :, i] - mem) * beta[:, :, i, None]
        s = s + k[:, :, i, :, None] * delta[:, :, None, :]
        out.append((s * q[:, :, i, :, None]).sum(-2))
    return torch.stack(out, dim=2)


def delta_rule_chunked(q, k, v, g, beta):
    """The same in chunks of CHUNK rows: within a chunk the rows' updates
    are solved at once (a unit lower-triangular system), and the state at
    each chunk's start comes from a scan over the chunks. Arguments as
    delta_rule_recurrent; T is padded to a multiple of CHUNK with rows that
    change nothing (k = 0, g = 0)."""
    b, h, t, dk = k.shape
    pad = -t % CHUNK
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (t + pad) // CHUNK
    q, k, v = (x.reshape(b, h, n, CHUNK, -1) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, CHUNK), beta.reshape(b, h, n, CHUNK)
    gc = g.cumsum(-1)                                            # [b, h, n, C]
    tri = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~tri, -float("inf")).exp()
    kb = k * beta[..., None]
    a = ((kb @ k.transpose(-1, -2)) * decay).tril(-1)             # strictly lower
    eye = torch.eye(CHUNK, dtype=q.dtype, device=q.device)
    tinv = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False)
    u = tinv @ (v * beta[..., None])                             # [b, h, n, C, dv]
    w = tinv @ (kb * gc.exp()[..., None])                        # [b, h, n, C, dk]
    qk = (q @ k.transpose(-1, -2)) * decay                       # lower incl. diagonal
    last = gc[..., -1]                                           # [b, h, n]
    qg = q * gc.exp()[..., None]
    kd = k * (last[..., None] - gc).exp()[..., None]
    before = states_before(u, w, kd, last.exp())                 # [b, h, n, dk, dv]
    v_new = u - w @ before
    out = qg @ before + qk @ v_new
    return out.reshape(b, h, n * CHUNK, -1)[:, :, :t]


def states_before(u, w, kd, decay_last):
    """The state at the start of every chunk. Chunk i maps the state S to
    A_i S + B_i, A_i = decay_last_i I - kd_i^T w_i [dk, dk], B_i = kd_i^T
    u_i [dk, dv]; the maps compose in log2(n) rounds of an inclusive scan
    (round r joins each chunk's map with the one 2^r chunks before), so
    that no loop over the chunks runs, which torch.compile would unroll.
    u [b, h, n, C, dv], w and kd [b, h, n, C, dk], decay_last [b, h, n]."""
    b, h, n, _, dk = w.shape
    eye = torch.eye(dk, dtype=w.dtype, device=w.device)
    kdt = kd.transpose(-1, -2)
    a = decay_last[..., None, None] * eye - kdt @ w
    s = kdt @ u
    shift = 1
    while shift < n:
        a_prev = torch.cat([eye.expand(b, h, shift, dk, dk), a[:, :, :-shift]], dim=2)
        s_prev = torch.cat([s.new_zeros(b, h, shift, dk, s.shape[-1]), s[:, :, :-shift]],
                           dim=2)
        s = a @ s_prev + s
        a = a @ a_prev
        shift *= 2
    return torch.cat([s.new_zeros(b, h, 1, dk, s.shape[-1]), s[:, :, :-1]], dim=2)


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.kernel = cfg.linear_conv_kernel_dim
        key_dim, value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * key_dim + value_dim
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, 2 * key_dim + 2 * value_dim, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * self.hv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, bias=False,
                                groups=self.conv_dim, padding=self.kernel - 1)
        self.A_log = nn.Parameter(torch.empty(self.hv).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, cfg.hidden_size, bias=False)

    def forward(self, x, recurrent=False):
        b, t, _ = x.shape
        r = self.hv // self.hk
        qkvz = self.in_proj_qkvz(x).view(b, t, self.hk, 2 * self.dk + 2 * r * self.dv)
        q, k, v, z = torch.split(qkvz, [self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        ba = self.in_proj_ba(x).view(b, t, self.hk, 2 * r)
        bb, aa = torch.split(ba, [r, r], dim=-1)
        mixed = torch.cat([q.reshape(b, t, -1), k.reshape(b, t, -1), v.reshape(b, t, -1)], -1)
        mixed = F.silu(self.conv1d(mixed.transpose(1, 2))[..., :t]).transpose(1, 2)
        kd = self.hk * self.dk
        q, k, v = torch.split(mixed, [kd, kd, self.hv * self.dv], dim=-1)
        q = q.reshape(b, t, self.hk, self.dk).float()
        k = k.reshape(b, t, self.hk, self.dk).float()
        v = v.reshape(b, t, self.hv, self.dv).float()
        beta = torch.sigmoid(bb.reshape(b, t, self.hv).float())
        g = -self.A_log.float().exp() * F.softplus(aa.reshape(b, t, self.hv).float()
                                                    + self.dt_bias.float())
        q = l2norm(q).repeat_interleave(r, dim=2) / math.sqrt(self.dk)
        k = l2norm(k).repeat_interleave(r, dim=2)
        args = [y.transpose(1, 2).contiguous() for y in (q, k, v, g, beta)]
        rule = delta_rule_recurrent if recurrent else delta_rule_chunked
        with torch.autocast(device_type=x.device.type, enabled=False):
            o = rule(*args).transpose(1, 2)                      # [b, t, Hv, dv]
        o = self.norm(o.to(x.dtype), z.reshape(b, t, self.hv, self.dv))
        return self.out_proj(o.reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """N SwiGLU experts as stacked tensors (exported as experts.{e}.*)."""

    def __init__(self, n, hidden, inter):
        super().__init__()
        self.gate_up = nn.Parameter(torch.empty(n, 2 * inter, hidden))
        self.down = nn.Parameter(torch.empty(n, hidden, inter))
        self.inter = inter

    def forward(self, x, weights):
        """x [M, E], weights [M, N] (zero for experts not chosen) -> [M, E]."""
        gu = torch.einsum("me,nie->mni", x, self.gate_up.to(x.dtype))
        gate, up = gu.split(self.inter, dim=-1)
        h = F.silu(gate) * up * weights.to(x.dtype)[..., None]
        return torch.einsum("mni,nei->me", h, self.down.to(x.dtype))


class SparseMoe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x):
        """Returns the output and the load-balancing loss (Switch style:
        N * sum_e fraction routed to e * mean probability of e)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        top, idx = probs.topk(self.top_k, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, idx, top)
        y = self.experts(x, weights)
        y = y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        n = probs.shape[-1]
        routed = torch.zeros_like(probs).scatter(-1, idx, 1.0).mean(0) / self.top_k
        aux = n * (routed * probs.mean(0)).sum()
        return y.reshape(shape), aux


class Layer(nn.Module):
    def __init__(self, cfg, kind):
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.mlp = SparseMoe(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, recurrent=False):
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            x = x + self.linear_attn(h, recurrent)
        else:
            x = x + self.self_attn(h, cos, sin)
        y, aux = self.mlp(self.post_attention_layernorm(x))
        return x + y, aux


class Body(nn.Module):
    """transformers' Qwen3NextModel: the names under `model.`."""

    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, kind) for kind in cfg.layer_types())
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Mtp(nn.Module):
    """The names under `mtp.`."""

    def __init__(self, cfg):
        super().__init__()
        e = cfg.hidden_size
        self.fc = nn.Linear(2 * e, e, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(e, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(e, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(cfg, "full_attention")
                                    for _ in range(cfg.mtp_num_hidden_layers))
        self.norm = RMSNorm(e, cfg.rms_norm_eps)


class Qwen3Next(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        self.mtp = Mtp(cfg)
        self.init_weights()

    def init_weights(self, std=0.02):
        """Normal(0, std) matrices, output projections scaled down by the
        depth; norms, A_log and dt_bias as their modules set them."""
        depth = math.sqrt(2 * (self.cfg.num_hidden_layers + self.cfg.mtp_num_hidden_layers))
        for name, p in self.named_parameters():
            if "norm" in name or name.endswith(("A_log", "dt_bias")):
                continue
            if name.endswith("conv1d.weight"):
                nn.init.normal_(p, std=1 / math.sqrt(p.shape[-1]))
            elif name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight",
                                "experts.down")):
                nn.init.normal_(p, std=std / depth)
            else:
                nn.init.normal_(p, std=std)

    def body(self, ids, recurrent=False):
        """ids [B, T] -> the hidden rows after model.norm [B, T, E], the
        mean load-balancing loss."""
        cos, sin = rope_tables(self.cfg, ids.shape[1], ids.device)
        x = self.model.embed_tokens(ids)
        aux = 0.0
        for layer in self.model.layers:
            x, a = layer(x, cos, sin, recurrent)
            aux = aux + a
        return self.model.norm(x), aux / len(self.model.layers)

    def logits(self, h):
        return F.linear(h, self.model.embed_tokens.weight)

    def mtp_hidden(self, h, next_ids):
        """h [B, T, E] the body's rows, next_ids [B, T] the ids one ahead:
        the head's output rows [B, T, E] and its load-balancing loss."""
        m = self.mtp
        e = m.pre_fc_norm_embedding(self.model.embed_tokens(next_ids))
        x = m.fc(torch.cat([e, m.pre_fc_norm_hidden(h)], dim=-1))
        cos, sin = rope_tables(self.cfg, x.shape[1], x.device)
        aux = 0.0
        for layer in m.layers:
            x, a = layer(x, cos, sin)
            aux = aux + a
        return m.norm(x), aux

    def forward(self, ids):
        """ids [B, T] -> logits [B, T, V]."""
        return self.logits(self.body(ids)[0])

    def losses(self, ids, targets):
        """ids [B, T], targets [B, T] (ids shifted by one): the main loss,
        the MTP head's (guessing targets[p + 1] from row p and targets[p])
        and the load-balancing loss."""
        h, aux = self.body(ids)
        logits = self.logits(h)
        main = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        hm, aux_m = self.mtp_hidden(h[:, :-1], targets[:, :-1])
        mtp_logits = self.logits(hm)
        mtp = F.cross_entropy(mtp_logits.float().flatten(0, 1), targets[:, 1:].flatten())
        return main, mtp, aux + aux_m

    def state_dict_hf(self):
        """The parameters under transformers' names (experts one by one)."""
        out = {}
        for name, t in self.state_dict().items():
            if name.endswith("experts.gate_up"):
                base = name[:-len("gate_up")]
                i = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"{base}{e}.gate_proj.weight"] = t[e, :i]
                    out[f"{base}{e}.up_proj.weight"] = t[e, i:]
            elif name.endswith("experts.down"):
                base = name[:-len("down")]
                for e in range(t.shape[0]):
                    out[f"{base}{e}.down_proj.weight"] = t[e]
            else:
                out[name] = t
        return out

    def load_state_dict_hf(self, state):
        """The inverse of state_dict_hf (tensors in any dtype: cast here)."""
        own = self.state_dict()
        out = {}
        for name, t in own.items():
            if name.endswith("experts.gate_up"):
                base = name[:-len("gate_up")]
                out[name] = torch.stack([torch.cat([state[f"{base}{e}.gate_proj.weight"],
                                                    state[f"{base}{e}.up_proj.weight"]])
                                         for e in range(t.shape[0])])
            elif name.endswith("experts.down"):
                base = name[:-len("down")]
                out[name] = torch.stack([state[f"{base}{e}.down_proj.weight"]
                                         for e in range(t.shape[0])])
            else:
                out[name] = state[name]
        self.load_state_dict({k: v.to(own[k].dtype) for k, v in out.items()})

    def num_params(self):
        return sum(p.numel() for p in self.parameters())
