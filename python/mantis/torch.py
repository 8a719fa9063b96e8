"""mantis.torch — mantis's rounding and site GEMMs inside PyTorch programs (CPU tensors).

* ``round(x, fmt, ...)`` / ``quantize(x, scheme, ...)``: autograd functions whose forward is
  mantis's rounding (bit-identical to ``mantis.round``: element i of the flattened tensor uses the
  Philox word (seed, stream, index0 + i), so stochastic rounding is reproducible) and whose
  backward passes the gradient straight through.
* ``linear(x, weight, bias, entry, ...)``: a Linear's forward computed by a mantis policy entry's
  site GEMM (emulated accumulation, operand and output rounding: nn/linear.h), gradients those of
  the plain binary32 Linear (straight-through).
* ``apply_policy(model, policy)``: every projection of a Hugging Face-style GPT-2 or LLaMA module
  tree (``transformer.h.{i}.attn.c_attn``, ``model.layers.{i}.self_attn.q_proj``, ...; see SITES)
  computed through its site's entry, on the random streams mantis's own forward uses; returns the
  hook handles (``h.remove()`` undoes it).
* ``attention(q, k, v, policy, layer)``: causal attention whose key·query scores are the policy's
  attn.qk site GEMM (÷ √d inside the site, as mantis's forward) and whose probs·values product is
  its attn.pv site; softmax in binary32. ``hf_attention(policy)`` adapts it to the signature of
  transformers' attention functions (``AttentionInterface``: module, query, key, value, mask, ...).

CUDA tensors are refused (mantis.Error): this module runs the CPU library.
"""
import math
import re

import numpy as np
import torch

import mantis as _m

__all__ = ["round", "quantize", "linear", "apply_policy", "attention", "hf_attention", "SITES"]


def _tensor(x, call, what, dims=None):
    """x checked: a CPU float32 / float64 tensor (of len(dims) dimensions where given; dims names them)."""
    if not isinstance(x, torch.Tensor):
        raise _m.Error(f"{call}: {what} must be a torch.Tensor, got {_m._shown(x)}")
    if x.device.type != "cpu":
        raise _m.Error(f"{call}: mantis.torch runs on CPU tensors ({what} is on {x.device})")
    if x.dtype not in (torch.float32, torch.float64):
        raise _m.Error(f"{call}: {what} has dtype {x.dtype}; expected torch.float32 or torch.float64")
    if dims is not None and x.dim() != len(dims):
        raise _m.Error(f"{call}: {what} has shape {tuple(x.shape)}; expected [{', '.join(dims)}]")
    return x


def _numpy(x, call, what="x", dims=None):
    return _tensor(x, call, what, dims).detach().contiguous().numpy()


class _Round(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fmt, mode, seed, stream, index0, sr_bits, sr_packed):
        a = _numpy(x, "round")
        y = np.empty_like(a)  # x's dtype: a format wider than binary32 needs a float64 tensor
        _m.round(a, fmt, mode=mode, seed=seed, stream=stream, index0=index0, sr_bits=sr_bits, sr_packed=sr_packed,
                 out=y)
        return torch.from_numpy(y)

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None, None, None, None, None


class _Quantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scheme, mode, seed, stream, sr_bits):
        a = _numpy(x, "quantize")
        return torch.from_numpy(_m.quantize(a, scheme, mode=mode, seed=seed, stream=stream, sr_bits=sr_bits))

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None, None, None


@_m._api()
def round(x, fmt, mode="rne", seed=0, stream=0, index0=0, sr_bits=32, sr_packed=False):
    """x rounded to fmt (same dtype and shape); straight-through gradient."""
    return _Round.apply(x, fmt, mode, seed, stream, index0, sr_bits, sr_packed)


@_m._api()
def quantize(x, scheme, mode="rne", seed=0, stream=0, sr_bits=32):
    """x through a scaled format (its last axis the columns, as mantis.quantize); straight-through."""
    return _Quantize.apply(x, scheme, mode, seed, stream, sr_bits)


class _SiteLinear(torch.autograd.Function):
    # forward: the site GEMM's bits; backward: the binary32 Linear's gradients.
    @staticmethod
    def forward(ctx, x, weight, bias, entry, w_transposed, stream):
        x2 = _numpy(x, "linear").reshape(math.prod(x.shape[:-1]), x.shape[-1]).astype(np.float32, copy=False)
        w = _numpy(weight, "linear", "weight").astype(np.float32, copy=False)
        b = None if bias is None else _numpy(bias, "linear", "bias").astype(np.float32, copy=False)
        y = _m.site_gemm(x2, w, entry, w_transposed=w_transposed, bias=b, stream=stream)
        ctx.save_for_backward(x, weight)
        ctx.w_transposed, ctx.has_bias = w_transposed, bias is not None
        n = w.shape[0] if w_transposed else w.shape[1]
        return torch.from_numpy(y).reshape(*x.shape[:-1], n).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1]).to(weight.dtype)
        x2 = x.reshape(-1, x.shape[-1]).to(weight.dtype)
        if ctx.w_transposed:  # weight [out, in]
            dx, dw = g2 @ weight, g2.t() @ x2
        else:  # weight [in, out] (Conv1D)
            dx, dw = g2 @ weight.t(), x2.t() @ g2
        db = g2.sum(0) if ctx.has_bias else None
        return dx.reshape(x.shape).to(x.dtype), dw, db, None, None, None


@_m._api(w_transposed="bool", stream="u64")
def linear(x, weight, bias, entry, w_transposed=True, stream=0):
    """y = x·Wᵀ + b through a policy entry (``policy.site("mlp.fc", layer)``); W [out, in]
    (w_transposed=False: [in, out], GPT-2's Conv1D)."""
    if _tensor(x, "linear", "x").dim() == 0:
        raise _m.Error("linear: x has shape (); expected [..., in]")
    _tensor(weight, "linear", "weight", ("out", "in") if w_transposed else ("in", "out"))
    if bias is not None:
        _tensor(bias, "linear", "bias", ("out",))
    return _SiteLinear.apply(x, weight, bias, entry, w_transposed, stream)


# Module names of the Hugging Face GPT-2 and LLaMA / Mistral trees → (site, slot): the slot is the
# projection's index within its site in mantis's forward (q, k, v = 0, 1, 2; gate, up = 0, 1), so
# stochastic rounding draws the words mantis's own forward draws (nn/streams.h).
SITES = [
    (r"(^|\.)h\.(\d+)\.attn\.c_attn$", "attn.qkv", 0),
    (r"(^|\.)h\.(\d+)\.attn\.c_proj$", "attn.proj", 0),
    (r"(^|\.)h\.(\d+)\.mlp\.c_fc$", "mlp.fc", 0),
    (r"(^|\.)h\.(\d+)\.mlp\.c_proj$", "mlp.proj", 0),
    (r"(^|\.)layers\.(\d+)\.self_attn\.q_proj$", "attn.qkv", 0),
    (r"(^|\.)layers\.(\d+)\.self_attn\.k_proj$", "attn.qkv", 1),
    (r"(^|\.)layers\.(\d+)\.self_attn\.v_proj$", "attn.qkv", 2),
    (r"(^|\.)layers\.(\d+)\.self_attn\.o_proj$", "attn.proj", 0),
    (r"(^|\.)layers\.(\d+)\.mlp\.gate_proj$", "mlp.fc", 0),
    (r"(^|\.)layers\.(\d+)\.mlp\.up_proj$", "mlp.fc", 1),
    (r"(^|\.)layers\.(\d+)\.mlp\.down_proj$", "mlp.proj", 0),
    (r"(^|\.)lm_head$", "lm_head", 0),
]


def _site_of(name):
    for pattern, site, slot in SITES:
        m = re.search(pattern, name)
        if m:
            layer = -1 if site == "lm_head" else int(m.group(2))
            return site, layer, slot
    return None


@_m._api()
def apply_policy(model, policy, sites=None):
    """Route every projection of an HF-style GPT-2 / LLaMA module tree through its site's policy
    entry (forward hooks; a module whose entry is native is left alone). ``sites`` limits it to
    some site names (a list). Returns (handles, routed): the hooks and the (module name, site,
    layer) list."""
    if not isinstance(model, torch.nn.Module):
        raise _m.Error(f"apply_policy: model must be a torch.nn.Module, got {_m._shown(model)}")
    if sites is not None:
        if isinstance(sites, (str, bytes)) or not hasattr(sites, "__iter__"):
            raise _m.Error(f"apply_policy: sites must be a list of site names, got {_m._shown(sites)}")
        sites = {_m._mantis.convert("apply_policy", "sites", "site", s) for s in sites}
    policy = _m.Policy(policy)
    handles, routed = [], []
    for name, module in model.named_modules():
        hit = _site_of(name)
        if hit is None:
            continue
        site, layer, slot = hit
        if sites is not None and site not in sites:
            continue
        entry = policy.site(site, layer)
        if entry.native:
            continue
        kind = type(module).__name__
        if isinstance(module, torch.nn.Linear):
            transposed = True
        elif kind == "Conv1D":  # transformers' GPT-2 projection: weight [in, out], y = x·W + b
            transposed = False
        else:
            raise _m.Error(f"apply_policy: {name} is a {kind}, not a Linear or Conv1D")
        stream = _m._mantis.site_stream(site, layer, slot)

        def hook(mod, inputs, output, entry=entry, transposed=transposed, stream=stream):
            return linear(inputs[0], mod.weight, mod.bias, entry, w_transposed=transposed, stream=stream)

        handles.append(module.register_forward_hook(hook))
        routed.append((name, site, layer))
    if not routed and sites is None and not all(policy.site(s).native for s in ("attn.qkv", "mlp.fc")):
        raise _m.Error("apply_policy: no module of the model matches a GPT-2 or LLaMA projection name (SITES)")
    return handles, routed


def _site_matmul(a, b, entry, stream, b_transposed, divisor=1.0):
    """a [M, K] · b through a site entry (binary32); b is [N, K] (b_transposed) or [K, N]."""
    x = _numpy(a, "attention").astype(np.float32, copy=False)
    w = _numpy(b, "attention", "k or v").astype(np.float32, copy=False)
    return torch.from_numpy(_m.site_gemm(x, w, entry, w_transposed=b_transposed, divisor=divisor, stream=stream))


def _attention_shapes(call, qkv, lead):
    """(H, Hkv, T, D) of the query, key and value tensors qkv ((name, tensor) each): q [*lead, H, T,
    D], k and v [*lead, Hkv, T, D], the H query heads sharing the Hkv key/value heads evenly."""
    (qn, q), (kn, k), (vn, v) = qkv
    dims = (*lead, "H", "T", "D")
    kv_dims = (*lead, "Hkv", "T", "D")
    _tensor(q, call, qn, dims)
    _tensor(k, call, kn, kv_dims)
    _tensor(v, call, vn, kv_dims)
    for (an, a), (bn, b) in (((qn, q), (kn, k)), ((kn, k), (vn, v))):
        for i, dim in enumerate(kv_dims):
            grouped = a is q and dim == "Hkv"  # q's H heads may be a multiple of k's Hkv
            if a.shape[i] != b.shape[i] and not grouped:
                raise _m.Error(f"{call}: {an} {tuple(a.shape)} and {bn} {tuple(b.shape)} do not fit: they differ in "
                               f"{dim} ({qn} [{', '.join(dims)}], {kn} and {vn} [{', '.join(kv_dims)}])")
    H, T, D = q.shape[-3:]
    Hkv = k.shape[-3]
    if Hkv == 0 or H % Hkv:
        raise _m.Error(f"{call}: {H} query heads do not share {Hkv} key/value heads evenly")
    if D == 0:
        raise _m.Error(f"{call}: the head dimension D is 0")
    _m._mantis.convert(call, "head index", "slot", max(H - 1, 0))  # a head is its random stream's slot
    return H, Hkv, T, D


@_m._api(layer="layer", causal="bool")
def attention(q, k, v, policy, layer=0, causal=True):
    """Attention of one sequence: q [H, T, D], k and v [Hkv, T, D] (grouped-query: head h reads kv
    head h // (H / Hkv)). Scores: the attn.qk site GEMM of q·kᵀ ÷ √D; softmax in binary32 over the
    causal window; output: the attn.pv site GEMM of probs·v. Forward only (no autograd). Each head
    is one site call on stream site_stream(site, layer, head): for sr this is not the per-row-block
    streams of mantis's own forward, and LAMP's recomputation is not applied here."""
    H, Hkv, T, D = _attention_shapes("attention", (("q", q), ("k", k), ("v", v)), ())
    policy = _m.Policy(policy)
    qk, pv = policy.site("attn.qk", layer), policy.site("attn.pv", layer)
    out = torch.empty(H, T, D, dtype=torch.float32)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None
    for h in range(H):
        kv = h // (H // Hkv)
        s = _site_matmul(q[h], k[kv], qk, _m._mantis.site_stream("attn.qk", layer, h), True, divisor=math.sqrt(D))
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        out[h] = _site_matmul(p, v[kv], pv, _m._mantis.site_stream("attn.pv", layer, h), False)
    return out


@_m._api()
def hf_attention(policy):
    """A function with the signature of transformers' attention functions
    (``fn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw)``, tensors
    [B, H, T, D]) computing ``attention`` per batch row; the layer is ``module.layer_idx``. Causal;
    the mask argument is not read (padding masks are not supported), scaling must be 1/√D."""
    policy = _m.Policy(policy)

    @_m._api(dropout="real")
    def hf_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
        H, _, T, D = _attention_shapes("hf_attention", (("query", query), ("key", key), ("value", value)), ("B",))
        if scaling is not None:
            scaling = _m._mantis.convert("hf_attention", "scaling", "real", scaling)
            if abs(scaling - D ** -0.5) > 1e-12:
                raise _m.Error(f"hf_attention: scaling {scaling} is not 1/sqrt({D})")
        if dropout:
            raise _m.Error("hf_attention: dropout is not emulated")
        layer = _m._mantis.convert("hf_attention", "module.layer_idx", "layer", getattr(module, "layer_idx", 0))
        if query.shape[0] == 0:  # no batch row: the empty result, as torch's attention gives
            return torch.empty(0, T, H, D, dtype=query.dtype), None
        outs = [attention(query[b], key[b], value[b], policy, layer) for b in range(query.shape[0])]
        return torch.stack(outs).transpose(1, 2).contiguous().to(query.dtype), None

    return hf_attention
