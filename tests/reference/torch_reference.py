#!/usr/bin/python3
"""torch_reference — small random GPT-2 and LLaMA models, their PyTorch logits, gradients and AdamW steps.

Run with Debian's Python (apt-get install -y python3-torch python3-numpy):

    /usr/bin/python3 tests/reference/torch_reference.py [--out tests/data/reference]

Writes, for each model NAME in MODELS, the project's own checkpoint directory (checkpoint.h):
    NAME/model.safetensors   written by hand: u64 LE header length, JSON header
                             {tensor: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}}
                             (padded with spaces to a multiple of 8), then the raw LE float32 data;
                             names and layouts of src/nn/model.h (Linear weights [out, in])
    NAME/config.json         {"mantis_format": 1, "arch": ..., every ModelConfig field}
and the reference run on fixed tokens:
    NAME/tokens.i32          int32 LE [T]
    NAME/logits.f32          float32 LE [T, V], the forward pass in torch.float32
    NAME/logits.f64          float64 LE [T, V], the same in torch.float64 from the same float32 weights
and the reference training step on those tokens (for the backward pass and the optimizer):
    NAME/targets.i32         int32 LE [T], next-token targets in [0, V), drawn by a separate generator
                             np.random.default_rng(seed + 1000) (the weight/token draws are untouched)
    NAME/grads.f32           float32 LE, d loss / d parameter for every parameter, concatenated in
                             parameter_shapes() order (= the safetensors order), each tensor in its
                             safetensors layout (row-major, Linear weights [out, in]); torch.float32 run
    NAME/grads.f64           float64 LE, the same from the torch.float64 run (same float32 weights)
    NAME/adamw_params.f32    float32 LE, the parameters after 10 AdamW steps (below), same layout
    NAME/adamw_params.f64    float64 LE, the same from the torch.float64 run
where loss = (1/T) sum_t [logsumexp(logits[t, :]) - logits[t, targets[t]]] (mean cross-entropy,
natural log; F.cross_entropy) of the same forward pass as the logits, on tokens/targets. With tied
embeddings (gpt2) the single wte tensor serves as both embedding and lm_head, so its gradient is the
sum of both contributions; wpe rows >= T get a zero gradient.
AdamW (written out by hand, exactly torch 1.13's single-tensor AdamW, foreach=False, amsgrad=False,
maximize=False): lr = 1e-3 constant, (beta1, beta2) = (0.9, 0.95), eps = 1e-8, weight decay wd = 0.1
for tensors with >= 2 dims and 0 for 1-D tensors (norm gains, biases), no gradient clipping; m = v = 0;
10 steps on the same (tokens, targets) batch; for step t = 1..10, with g = d loss / d p at the current
parameters, for each parameter p (tensors in the run's dtype, the scalars in Python float64):
    p     = p * (1 - lr * wd)
    m     = beta1 * m + (1 - beta1) * g
    v     = beta2 * v + (1 - beta2) * g * g
    bc1   = 1 - beta1**t ; bc2 = 1 - beta2**t
    denom = sqrt(v) / sqrt(bc2) + eps
    p     = p - (lr / bc1) * m / denom
(torch ops: p.mul_(1 - lr*wd); m.mul_(beta1).add_(g, alpha=1-beta1);
v.mul_(beta2).addcmul_(g, g, value=1-beta2); denom = (v.sqrt() / math.sqrt(bc2)).add_(eps);
p.addcdiv_(m, denom, value=-lr/bc1)). The loss of each step is recorded before that step's update.
plus index.json describing all of it; per model, besides the keys above: "targets", "loss_f32" and
"loss_f64" (the loss at the initial weights), "grads_f32", "grads_f64" and "adamw": {"lr", "betas",
"eps", "weight_decay", "decay_rule", "steps", "losses_f32", "losses_f64" (the 10 pre-update losses;
the first equals loss_f32 / loss_f64), "params_f32", "params_f64"}. Everything is deterministic
(numpy PCG64 seeds, one torch thread); re-running rewrites identical weights, tokens and targets (the
logits, losses, gradients and AdamW parameters can move by rounding across torch/BLAS builds).

The models are written by hand (no transformers package) and follow src/nn/forward.h exactly:
  gpt2 : wte + wpe, pre-LN LayerNorm, causal MHA with scores / sqrt(HS), GELU (erf or tanh),
         final LayerNorm, logits = x @ wte.T (tied).
  llama: RMSNorm, RoPE in the llama2.c / Meta convention — consecutive pairs (x[2i], x[2i+1]) of a
         head rotated by pos * theta^(-2i/HS), angles in float64 — grouped-query attention
         (query head h reads kv head h // (NH / NKV)), SwiGLU w2(silu(w1 x) * w3 x), final RMSNorm,
         untied output.
"""
import argparse
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

# Shapes are kept tiny so that everything stays well under 2 MB; T = 150 > 2 x 64 exercises the
# forward pass's three query blocks (the last one partial).
MODELS = [
    dict(name="gpt2_erf", seed=1, arch="gpt2", vocab=96, ctx=160, layers=2, heads=4, kv_heads=4, dim=32,
         hidden=128, gelu_tanh=False, tied=True, norm_eps=1e-5, rope_theta=10000.0, T=150),
    dict(name="gpt2_tanh", seed=2, arch="gpt2", vocab=96, ctx=160, layers=2, heads=4, kv_heads=4, dim=32,
         hidden=128, gelu_tanh=True, tied=True, norm_eps=1e-5, rope_theta=10000.0, T=150),
    dict(name="llama_gqa", seed=3, arch="llama", vocab=96, ctx=160, layers=2, heads=4, kv_heads=2, dim=32,
         hidden=88, gelu_tanh=False, tied=False, norm_eps=1e-5, rope_theta=10000.0, T=150),
]
CONFIG_FIELDS = ["vocab", "ctx", "layers", "heads", "kv_heads", "dim", "hidden", "gelu_tanh", "tied",
                 "norm_eps", "rope_theta"]


# ------------------------------------------------------------------------------------------ weights
def parameter_shapes(c):
    """Every parameter name and shape, in src/nn/model.h's order."""
    V, T, C, H, L = c["vocab"], c["ctx"], c["dim"], c["hidden"], c["layers"]
    HS = C // c["heads"]
    out = []
    if c["arch"] == "gpt2":
        out += [("wte", [V, C]), ("wpe", [T, C])]
        for l in range(L):
            p = f"h.{l}."
            out += [(p + "ln_1.weight", [C]), (p + "ln_1.bias", [C]),
                    (p + "attn.c_attn.weight", [3 * C, C]), (p + "attn.c_attn.bias", [3 * C]),
                    (p + "attn.c_proj.weight", [C, C]), (p + "attn.c_proj.bias", [C]),
                    (p + "ln_2.weight", [C]), (p + "ln_2.bias", [C]),
                    (p + "mlp.c_fc.weight", [H, C]), (p + "mlp.c_fc.bias", [H]),
                    (p + "mlp.c_proj.weight", [C, H]), (p + "mlp.c_proj.bias", [C])]
        out += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    else:
        KVC = c["kv_heads"] * HS
        out += [("tok_embeddings", [V, C])]
        for l in range(L):
            p = f"layers.{l}."
            out += [(p + "attention_norm", [C]), (p + "attention.wq", [C, C]), (p + "attention.wk", [KVC, C]),
                    (p + "attention.wv", [KVC, C]), (p + "attention.wo", [C, C]), (p + "ffn_norm", [C]),
                    (p + "feed_forward.w1", [H, C]), (p + "feed_forward.w3", [H, C]),
                    (p + "feed_forward.w2", [C, H])]
        out += [("norm", [C])]
        if not c["tied"]:
            out += [("output", [V, C])]
    return out


def random_weights(c, rng):
    """Scaled so that activations are O(1) and the logits O(3): distributions far from uniform."""
    P = {}
    for name, shape in parameter_shapes(c):
        leaf = name.split(".")[-1]
        if name in ("wte", "tok_embeddings", "output"):
            w = rng.normal(0.0, 0.5, shape)
        elif name == "wpe":
            w = rng.normal(0.0, 0.3, shape)
        elif len(shape) == 1 and (leaf == "bias"):
            w = rng.normal(0.0, 0.1, shape)
        elif len(shape) == 1:  # LayerNorm / RMSNorm gains
            w = 1.0 + rng.normal(0.0, 0.1, shape)
        else:  # Linear [out, in]
            w = rng.normal(0.0, 1.0 / math.sqrt(shape[1]), shape)
        P[name] = w.astype(np.float32)
    return P


# ------------------------------------------------------------------------------------------ models
def gpt2_forward(W, c, tokens):
    T, C, NH = len(tokens), c["dim"], c["heads"]
    HS = C // NH
    eps = c["eps"]
    x = W["wte"][tokens] + W["wpe"][:T]  # [T,C]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(c["layers"]):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"].T + W[p + "attn.c_attn.bias"]  # [T,3C]
        q, k, v = (t.view(T, NH, HS).transpose(0, 1) for t in qkv.split(C, dim=1))  # [NH,T,HS]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)  # [NH,T,T]
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)  # [T,C]
        x = x + y @ W[p + "attn.c_proj.weight"].T + W[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        h = h @ W[p + "mlp.c_fc.weight"].T + W[p + "mlp.c_fc.bias"]  # [T,H]
        h = F.gelu(h, approximate="tanh" if c["gelu_tanh"] else "none")
        x = x + h @ W[p + "mlp.c_proj.weight"].T + W[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), W["ln_f.weight"], W["ln_f.bias"], eps)
    return x @ W["wte"].T  # [T,V]


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, nh, cos, sin):
    """Rotate consecutive pairs (x[2i], x[2i+1]) of each head of x [T, nh*HS]."""
    T, HS = x.shape[0], x.shape[1] // nh
    x = x.view(T, nh, HS // 2, 2)
    x0, x1 = x[..., 0], x[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]  # [T,1,HS/2]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).reshape(T, nh * HS)


def llama_forward(W, c, tokens):
    T, C, NH, NKV = len(tokens), c["dim"], c["heads"], c["kv_heads"]
    HS, eps, dtype = C // NH, c["eps"], W["norm"].dtype
    freqs = 1.0 / (c["rope_theta"] ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))  # [HS/2]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freqs[None, :]  # [T,HS/2]
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = W["tok_embeddings"][tokens]  # [T,C]
    for l in range(c["layers"]):
        p = f"layers.{l}."
        h = rms_norm(x, W[p + "attention_norm"], eps)
        q = rope(h @ W[p + "attention.wq"].T, NH, cos, sin)   # [T,C]
        k = rope(h @ W[p + "attention.wk"].T, NKV, cos, sin)  # [T,NKV*HS]
        v = h @ W[p + "attention.wv"].T                       # [T,NKV*HS]
        q = q.view(T, NH, HS).transpose(0, 1)                 # [NH,T,HS]
        k = k.view(T, NKV, HS).transpose(0, 1).repeat_interleave(NH // NKV, dim=0)
        v = v.view(T, NKV, HS).transpose(0, 1).repeat_interleave(NH // NKV, dim=0)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ W[p + "attention.wo"].T
        h = rms_norm(x, W[p + "ffn_norm"], eps)
        g = F.silu(h @ W[p + "feed_forward.w1"].T) * (h @ W[p + "feed_forward.w3"].T)  # [T,H]
        x = x + g @ W[p + "feed_forward.w2"].T
    x = rms_norm(x, W["norm"], eps)
    out = W["tok_embeddings"] if c["tied"] else W["output"]
    return x @ out.T  # [T,V]


def run(P, c, tokens, dtype):
    W = {k: torch.from_numpy(v).to(dtype) for k, v in P.items()}  # float32 values, exactly
    cc = dict(c, eps=float(np.float32(c["norm_eps"])))  # the binary32 eps the C++ config holds
    t = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        f = gpt2_forward if c["arch"] == "gpt2" else llama_forward
        return f(W, cc, t).numpy()


# ------------------------------------------------------------------------------------------ training
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, steps=10)


def loss_and_grads(W, c, tokens, targets):
    """Mean cross-entropy of the forward pass at the parameters W (name -> tensor, any float dtype),
    and its gradient with respect to every one of them (name -> tensor, same dtype)."""
    X = {k: v.detach().clone().requires_grad_(True) for k, v in W.items()}
    cc = dict(c, eps=float(np.float32(c["norm_eps"])))  # as in run()
    t = torch.from_numpy(tokens.astype(np.int64))
    y = torch.from_numpy(targets.astype(np.int64))
    f = gpt2_forward if c["arch"] == "gpt2" else llama_forward
    loss = F.cross_entropy(f(X, cc, t), y)  # mean over the T positions, natural log
    loss.backward()
    return loss.detach(), {k: X[k].grad.detach() for k in X}


def adamw(P, c, tokens, targets, dtype):
    """ADAMW["steps"] hand-written AdamW steps from the float32 weights P in dtype (see the docstring).
    Returns (the loss before each step, the final parameters name -> tensor)."""
    lr, (beta1, beta2), eps, wd_2d = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]
    W = {k: torch.from_numpy(v).to(dtype).clone() for k, v in P.items()}  # updated in place: own copy
    m = {k: torch.zeros_like(v) for k, v in W.items()}
    v2 = {k: torch.zeros_like(v) for k, v in W.items()}
    losses = []
    for step in range(1, ADAMW["steps"] + 1):
        loss, G = loss_and_grads(W, c, tokens, targets)
        losses.append(float(loss))
        bc1 = 1.0 - beta1 ** step
        bc2 = 1.0 - beta2 ** step
        with torch.no_grad():
            for k, p in W.items():
                g = G[k]
                wd = wd_2d if p.dim() >= 2 else 0.0
                p.mul_(1.0 - lr * wd)
                m[k].mul_(beta1).add_(g, alpha=1.0 - beta1)
                v2[k].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                denom = (v2[k].sqrt() / math.sqrt(bc2)).add_(eps)
                p.addcdiv_(m[k], denom, value=-(lr / bc1))
    return losses, W


def flat(T, order, dtype):
    """The tensors T (name -> tensor) concatenated in order, raw little-endian dtype bytes."""
    return np.concatenate([T[name].detach().numpy().reshape(-1) for name, _ in order]).astype(dtype).tobytes()


# ------------------------------------------------------------------------------------------ files
def write_safetensors(path, P, order):
    header, offset, blobs = {}, 0, []
    for name, shape in order:
        data = np.ascontiguousarray(P[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Round-trip check of the writer."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in header.items()}


def write(path, data, written):
    with open(path, "wb") as f:
        f.write(data)
    written.append((path, len(data)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "data", "reference"))
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    written, index = [], {"generator": "tests/reference/torch_reference.py", "torch": torch.__version__,
                          "format": "raw little-endian: tokens int32 [T], logits float32/float64 [T, V]",
                          "models": []}
    for m in MODELS:
        c = {k: m[k] for k in ["arch"] + CONFIG_FIELDS}
        rng = np.random.default_rng(m["seed"])
        P = random_weights(c, rng)
        tokens = rng.integers(0, c["vocab"], size=m["T"]).astype("<i4")
        l32 = run(P, c, tokens, torch.float32)
        l64 = run(P, c, tokens, torch.float64)
        targets = np.random.default_rng(m["seed"] + 1000).integers(0, c["vocab"], size=m["T"]).astype("<i4")
        W32 = {k: torch.from_numpy(v) for k, v in P.items()}
        W64 = {k: torch.from_numpy(v).to(torch.float64) for k, v in P.items()}
        loss32, g32 = loss_and_grads(W32, c, tokens, targets)
        loss64, g64 = loss_and_grads(W64, c, tokens, targets)
        losses32, a32 = adamw(P, c, tokens, targets, torch.float32)
        losses64, a64 = adamw(P, c, tokens, targets, torch.float64)
        assert losses32[0] == float(loss32) and losses64[0] == float(loss64)

        d = os.path.join(out, m["name"])
        os.makedirs(d, exist_ok=True)
        order = parameter_shapes(c)
        write_safetensors(os.path.join(d, "model.safetensors"), P, order)
        written.append((os.path.join(d, "model.safetensors"), os.path.getsize(os.path.join(d, "model.safetensors"))))
        back = read_safetensors(os.path.join(d, "model.safetensors"))
        assert all(np.array_equal(back[k], P[k]) for k in P) and len(back) == len(P)
        write(os.path.join(d, "config.json"),
              (json.dumps({"mantis_format": 1, **c}, indent=1) + "\n").encode(), written)
        write(os.path.join(d, "tokens.i32"), tokens.tobytes(), written)
        write(os.path.join(d, "logits.f32"), l32.astype("<f4").tobytes(), written)
        write(os.path.join(d, "logits.f64"), l64.astype("<f8").tobytes(), written)
        write(os.path.join(d, "targets.i32"), targets.tobytes(), written)
        write(os.path.join(d, "grads.f32"), flat(g32, order, "<f4"), written)
        write(os.path.join(d, "grads.f64"), flat(g64, order, "<f8"), written)
        write(os.path.join(d, "adamw_params.f32"), flat(a32, order, "<f4"), written)
        write(os.path.join(d, "adamw_params.f64"), flat(a64, order, "<f8"), written)
        index["models"].append({
            "name": m["name"], "dir": m["name"], "arch": c["arch"], "T": int(m["T"]), "V": c["vocab"],
            "parameters": int(sum(v.size for v in P.values())),
            "tokens": m["name"] + "/tokens.i32", "logits_f32": m["name"] + "/logits.f32",
            "logits_f64": m["name"] + "/logits.f64",
            "max_abs_logit": float(np.abs(l64).max()),
            "max_abs_f32_minus_f64": float(np.abs(l32.astype(np.float64) - l64).max()),
            "targets": m["name"] + "/targets.i32",
            "loss_f32": float(loss32), "loss_f64": float(loss64),
            "grads_f32": m["name"] + "/grads.f32", "grads_f64": m["name"] + "/grads.f64",
            "adamw": {"lr": ADAMW["lr"], "betas": list(ADAMW["betas"]), "eps": ADAMW["eps"],
                      "weight_decay": ADAMW["weight_decay"], "decay_rule": "tensors with >= 2 dims",
                      "steps": ADAMW["steps"], "losses_f32": losses32, "losses_f64": losses64,
                      "params_f32": m["name"] + "/adamw_params.f32",
                      "params_f64": m["name"] + "/adamw_params.f64"},
        })
        print(f"{m['name']}: {c['arch']}, {index['models'][-1]['parameters']} parameters, T = {m['T']}, "
              f"max |logit| {np.abs(l64).max():.4f}, max |f32 - f64| {index['models'][-1]['max_abs_f32_minus_f64']:.3g}")
        print(f"  loss f32 {float(loss32):.9g}, f64 {float(loss64):.17g}; AdamW f64 losses "
              + " ".join(f"{x:.6f}" for x in losses64))
    write(os.path.join(out, "index.json"), (json.dumps(index, indent=1) + "\n").encode(), written)
    total = 0
    for path, n in written:
        print(f"  wrote {os.path.relpath(path)} ({n} bytes)")
        total += n
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
