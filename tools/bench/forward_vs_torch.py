#!/usr/bin/python3
"""FP32 forward tokens/s: mantis beside Debian's PyTorch 1.13 (OpenBLAS) in the same run.

Same GPT-2 shape (default GPT-2 small: 12 layers, d = 768, 12 heads, V = 50257, T = 1024),
random weights, one sequence, same thread count — PyTorch's OpenBLAS pool pinned too (pinned.py);
medians of --reps timed runs after a warm-up.
PyTorch runs the textbook GPT-2 forward (as Hugging Face's GPT2Model does in 1.13): LayerNorm,
fused qkv Linear, full T×T scores with a causal mask, softmax, GELU (erf), tied lm_head, under
torch.inference_mode(). mantis runs `mantis bench forward --json` (FP32 and LAMP ps4 policies).

Usage: /usr/bin/python3 tools/bench/forward_vs_torch.py [--mantis build/src/cli/mantis]
       [--threads 1,2] [--reps 3] [--layers 12 --dim 768 --heads 12 --ctx 1024]
Needs python3-torch (and libopenblas0-pthread for a multithreaded BLAS).
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


def torch_forward_seconds(torch, L, C, NH, V, T, reps):
    F = torch.nn.functional
    g = torch.Generator().manual_seed(1)

    def w(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std

    wte, wpe = w(V, C), w(T, C, std=0.01)
    layers = [dict(ln1=(torch.ones(C), torch.zeros(C)), qkv=(w(3 * C, C), torch.zeros(3 * C)),
                   proj=(w(C, C), torch.zeros(C)), ln2=(torch.ones(C), torch.zeros(C)),
                   fc=(w(4 * C, C), torch.zeros(4 * C)), fcp=(w(C, 4 * C), torch.zeros(C)))
              for _ in range(L)]
    lnf = (torch.ones(C), torch.zeros(C))
    tokens = torch.randint(0, V, (1, T), generator=g)
    mask = torch.full((T, T), float("-inf")).triu(1)
    HS = C // NH

    def forward():
        x = wte[tokens] + wpe[:T]
        for p in layers:
            h = F.layer_norm(x, (C,), *p["ln1"])
            q, k, v = F.linear(h, *p["qkv"]).split(C, dim=-1)
            q, k, v = (t.view(1, T, NH, HS).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(HS) + mask
            y = (att.softmax(-1) @ v).transpose(1, 2).reshape(1, T, C)
            x = x + F.linear(y, *p["proj"])
            h = F.layer_norm(x, (C,), *p["ln2"])
            x = x + F.linear(F.gelu(F.linear(h, *p["fc"])), *p["fcp"])
        return F.linear(F.layer_norm(x, (C,), *lnf), wte)

    with torch.inference_mode():
        forward()  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            forward()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    child = pinned.child_threads()
    argv = sys.argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mantis", default="build/src/cli/mantis")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ctx", type=int, default=1024)
    a = ap.parse_args()
    V = 50257
    if child is not None:
        return pinned.run_child(child, lambda torch: torch_forward_seconds(torch, a.layers, a.dim, a.heads, V, a.ctx, a.reps))
    try:
        import torch
    except ImportError:
        print("error: PyTorch is not installed (apt-get install python3-torch libopenblas0-pthread)", file=sys.stderr)
        return 2
    threads = [int(t) for t in a.threads.split(",")]
    out = subprocess.run([a.mantis, "bench", "forward", "--json", "--reps", str(a.reps), "--threads", a.threads,
                          "--layers", str(a.layers), "--dim", str(a.dim), "--heads", str(a.heads), "--ctx", str(a.ctx)],
                         check=True, capture_output=True, text=True).stdout
    mantis = {r["threads"]: r for r in json.loads(out)["results"]}
    print(f"GPT-2 shape L={a.layers} C={a.dim} NH={a.heads} V={V} T={a.ctx}; median of {a.reps}; "
          f"torch {torch.__version__}")
    print(f"{'threads':>7} {'torch tok/s':>12} {'mantis tok/s':>13} {'mantis/torch':>13} {'lamp-ps4 tok/s':>15} "
          f"{'lamp/fp32 time':>15}")
    rows = []
    for th in threads:
        ts = pinned.measure(__file__, th, argv)
        m = mantis[th]
        row = dict(threads=th, torch_tokens_per_s=a.ctx / ts, mantis_tokens_per_s=m["fp32_tokens_per_s"],
                   speedup_vs_torch=m["fp32_tokens_per_s"] / (a.ctx / ts),
                   lamp_ps4_tokens_per_s=m["lamp_ps4_tokens_per_s"], lamp_over_fp32=m["lamp_over_fp32"])
        rows.append(row)
        print(f"{th:>7} {row['torch_tokens_per_s']:>12.1f} {row['mantis_tokens_per_s']:>13.1f} "
              f"{row['speedup_vs_torch']:>13.2f} {row['lamp_ps4_tokens_per_s']:>15.1f} {row['lamp_over_fp32']:>15.2f}")
    print(json.dumps({"results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
