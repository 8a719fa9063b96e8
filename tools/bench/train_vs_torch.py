#!/usr/bin/python3
"""Training tokens/s: mantis beside Debian's PyTorch 1.13 (OpenBLAS) in the same run.

The model, batch and thread count of a mantis training configuration (default
experiments/train-gpt2-bytes.toml, a GPT-2-style model; LLaMA configs are not supported here):
one step = forward + mean cross-entropy + backward + AdamW on batch x accum sequences of ctx
tokens, float32, random weights (GPT-2 init), medians of --reps steps after a warm-up. PyTorch runs
the textbook GPT-2 (LayerNorm, fused qkv, full causal-masked T x T attention, GELU erf, tied
lm_head) with torch.optim.AdamW (foreach=False); the sequences of a step are one batched tensor.
mantis runs `mantis bench train --json` (which also reports 4-bit saved activations). Same
thread count on both sides, PyTorch's OpenBLAS pool pinned too (pinned.py).

Usage: /usr/bin/python3 tools/bench/train_vs_torch.py [--mantis build/src/cli/mantis]
       [--config experiments/train-gpt2-bytes.toml] [--threads 1,2] [--reps 3]
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pinned  # noqa: E402
import tomllib


def torch_step_seconds(torch, cfg, reps):
    F = torch.nn.functional
    m, t = cfg["model"], cfg["train"]
    L, C, NH, T = m["layers"], m["dim"], m["heads"], m["ctx"]
    H, V = m.get("hidden", 4 * C), 256
    B = t.get("batch", 8) * t.get("accum", 1)
    g = torch.Generator().manual_seed(1)

    def w(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).requires_grad_()

    def ones(n):
        return torch.ones(n).requires_grad_()

    def zeros(n):
        return torch.zeros(n).requires_grad_()

    params = dict(wte=w(V, C), wpe=w(T, C, std=0.01), lnfw=ones(C), lnfb=zeros(C))
    layers = []
    for _ in range(L):
        p = dict(ln1w=ones(C), ln1b=zeros(C), qkvw=w(3 * C, C), qkvb=zeros(3 * C),
                 projw=w(C, C, std=0.02 / math.sqrt(2 * L)), projb=zeros(C), ln2w=ones(C), ln2b=zeros(C),
                 fcw=w(H, C), fcb=zeros(H), fcpw=w(C, H, std=0.02 / math.sqrt(2 * L)), fcpb=zeros(C))
        layers.append(p)
    all_params = list(params.values()) + [v for p in layers for v in p.values()]
    decay = [p for p in all_params if p.dim() >= 2]
    no_decay = [p for p in all_params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    tokens = torch.randint(0, V, (B, T + 1), generator=g)
    x_in, y = tokens[:, :T], tokens[:, 1:]
    mask = torch.full((T, T), float("-inf")).triu(1)
    HS = C // NH

    def step():
        x = params["wte"][x_in] + params["wpe"][:T]
        for p in layers:
            h = F.layer_norm(x, (C,), p["ln1w"], p["ln1b"])
            q, k, v = F.linear(h, p["qkvw"], p["qkvb"]).split(C, dim=-1)
            q, k, v = (a.view(B, T, NH, HS).transpose(1, 2) for a in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(HS) + mask
            o = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(o, p["projw"], p["projb"])
            h = F.layer_norm(x, (C,), p["ln2w"], p["ln2b"])
            x = x + F.linear(F.gelu(F.linear(h, p["fcw"], p["fcb"])), p["fcpw"], p["fcpb"])
        logits = F.linear(F.layer_norm(x, (C,), params["lnfw"], params["lnfb"]), params["wte"])
        loss = F.cross_entropy(logits.reshape(B * T, V), y.reshape(B * T))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(all_params, 1.0)
        opt.step()

    step()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), B * T


def main():
    child = pinned.child_threads()
    argv = sys.argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mantis", default="build/src/cli/mantis")
    ap.add_argument("--config", default="experiments/train-gpt2-bytes.toml")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if child is not None:
        cfg = tomllib.load(open(a.config, "rb"))
        return pinned.run_child(child, lambda torch: torch_step_seconds(torch, cfg, a.reps))
    try:
        import torch
    except ImportError:
        print("error: PyTorch is not installed (apt-get install python3-torch libopenblas0-pthread)", file=sys.stderr)
        return 2
    cfg = tomllib.load(open(a.config, "rb"))
    if cfg["model"].get("arch", "gpt2") != "gpt2" or cfg.get("data", {}).get("tokenizer", "bytes") != "bytes":
        print("error: only GPT-2-style byte-vocabulary configurations are supported", file=sys.stderr)
        return 2
    out = subprocess.run([a.mantis, "bench", "train", "--json", "--config", a.config, "--reps", str(a.reps),
                          "--threads", a.threads], check=True, capture_output=True, text=True).stdout
    mantis = {r["threads"]: r for r in json.loads(out)["results"]}
    print(f"{a.config}: training step, median of {a.reps}; torch {torch.__version__}")
    print(f"{'threads':>7} {'torch tok/s':>12} {'mantis tok/s':>13} {'mantis/torch':>13} {'4-bit saved tok/s':>18} "
          f"{'overhead':>9}")
    rows = []
    for th in [int(t) for t in a.threads.split(",")]:
        ts, ntok = pinned.measure(__file__, th, argv)
        m = mantis[th]
        row = dict(threads=th, torch_tokens_per_s=ntok / ts, mantis_tokens_per_s=m["tokens_per_s"],
                   speedup_vs_torch=m["tokens_per_s"] / (ntok / ts), act4_tokens_per_s=m["act4_tokens_per_s"],
                   act4_overhead=m["act4_overhead"])
        rows.append(row)
        print(f"{th:>7} {row['torch_tokens_per_s']:>12.1f} {row['mantis_tokens_per_s']:>13.1f} "
              f"{row['speedup_vs_torch']:>13.2f} {row['act4_tokens_per_s']:>18.1f} {100 * row['act4_overhead']:>8.1f}%")
    print(json.dumps({"results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
