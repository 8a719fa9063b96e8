#!/usr/bin/python3
"""Hugging Face LLaMA checkpoints in mantis against transformers' LlamaForCausalLM math.

Writes a small random checkpoint in Hugging Face's layout (config.json + model.safetensors, q_proj
and k_proj in HF's row order, grouped-query attention, untied lm_head, a non-default rope_theta),
computes its logits with the formulas of transformers' modeling_llama.py written out in PyTorch
(float64: RMSNorm, rotate_half RoPE on the weights as stored, repeat_kv, causal softmax, SiLU MLP;
transformers itself is not needed), and compares them with `mantis logits` on the same directory:
float32 within 1e-5 x max |logit|. Since the reference never permutes anything, a loader that
applied the wrong RoPE row order (or none) fails. Then `mantis export --hf` of the checkpoint must
give the same logits bit for bit.

usage: check_hf_llama.py MANTIS_BINARY. Exit status 77 (Meson: SKIP) when PyTorch or NumPy is
missing, 1 on a difference, 0 when everything agrees.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e} (apt-get install python3-torch python3-numpy; run with /usr/bin/python3)")
    sys.exit(77)

CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 37, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "torch_dtype": "float32",
}


def weights(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    C, H, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    KV = cfg["num_key_value_heads"] * C // cfg["num_attention_heads"]

    def rnd(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).float()

    w = {"model.embed_tokens.weight": rnd(V, C, scale=1.0), "model.norm.weight": 1 + rnd(C), "lm_head.weight": rnd(V, C)}
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + rnd(C)
        w[p + "post_attention_layernorm.weight"] = 1 + rnd(C)
        w[p + "self_attn.q_proj.weight"] = rnd(C, C)
        w[p + "self_attn.k_proj.weight"] = rnd(KV, C)
        w[p + "self_attn.v_proj.weight"] = rnd(KV, C)
        w[p + "self_attn.o_proj.weight"] = rnd(C, C)
        w[p + "mlp.gate_proj.weight"] = rnd(H, C)
        w[p + "mlp.up_proj.weight"] = rnd(H, C)
        w[p + "mlp.down_proj.weight"] = rnd(C, H)
    return w


def write_safetensors(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_llama_logits(cfg, w, tokens):
    """modeling_llama.py's LlamaForCausalLM.forward, float64, one sequence."""
    w = {k: v.double() for k, v in w.items()}
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    HS, T, eps = C // NH, len(tokens), cfg["rms_norm_eps"]

    def rms(x, g):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [T, HS]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)

    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, NH, HS).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, NKV, HS).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, NKV, HS).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // NKV, dim=0), v.repeat_interleave(NH // NKV, dim=0)  # repeat_kv
        att = torch.softmax(q @ k.transpose(1, 2) / HS**0.5 + mask, dim=-1) @ v
        x = x + att.transpose(0, 1).reshape(T, C) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return (rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T).numpy()


def mantis_logits(binary, model, tokens, out):
    r = subprocess.run([binary, "logits", "--model", model, "--tokens", " ".join(map(str, tokens)), "--out", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: mantis logits --model {model}: {r.stderr.strip()}")
    return np.load(out)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: check_hf_llama.py MANTIS_BINARY")
    binary, failures = sys.argv[1], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in [("llama", CFG), ("mistral", dict(CFG, model_type="mistral", max_position_embeddings=4096, sliding_window=16))]:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            w = weights(cfg, 1234)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            write_safetensors(os.path.join(d, "model.safetensors"), w)
            tokens = [int(t) for t in torch.randint(0, cfg["vocab_size"], (16,),
                                                    generator=torch.Generator().manual_seed(7))]
            ref = hf_llama_logits(cfg, w, tokens)
            got = mantis_logits(binary, d, tokens, os.path.join(tmp, name + ".npy"))
            err = float(np.abs(got.astype(np.float64) - ref).max()) if got.shape == ref.shape else float("inf")
            tol = 1e-5 * max(1.0, float(np.abs(ref).max()))
            print(f"{name}: logits {got.shape}, max |mantis - transformers math| = {err:.3e} (tolerance {tol:.3e})")
            if err > tol:
                print(f"FAIL: {name}: logits differ from LlamaForCausalLM's by {err:.3e} > {tol:.3e}")
                failures += 1
            out = os.path.join(tmp, name + "-export")
            r = subprocess.run([binary, "export", d, "--hf", "--out", out], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"FAIL: mantis export: {r.stderr.strip()}")
            again = mantis_logits(binary, out, tokens, os.path.join(tmp, name + "-export.npy"))
            if again.tobytes() != got.tobytes():
                print(f"FAIL: {name}: the exported checkpoint's logits differ from the original's")
                failures += 1
            with open(os.path.join(out, "config.json")) as f:
                exported = json.load(f)
            if (exported["model_type"] != "llama" or exported["num_key_value_heads"] != cfg["num_key_value_heads"]
                    or exported["max_position_embeddings"] != 16):  # Mistral's: capped to its window
                print(f"FAIL: {name}: exported config.json {exported}")
                failures += 1
    print("FAIL" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
