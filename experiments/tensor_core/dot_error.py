#!/usr/bin/env python3
"""Relative error of one dot product through each GPU's matrix unit (core/matrix_unit.h) against
its exact value, versus K: the figure of experiments/tensor_core/README.md.

  PYTHONPATH=<build>/python python3 experiments/tensor_core/dot_error.py [--trials 200] [--out DIR]

For each input format (fp16, bf16, e4m3) and K = 16 .. 16384, `trials` dot products of vectors
with independent standard normal entries (numpy's PCG64, seed 2026 + K), rounded to nearest into
the input format (mantis does it: input=...); the exact value is the correctly rounded binary64
sum of the exact products (math.fsum). Each unit's output is binary32 (toward zero, as the
units round), and each K's point is the median over trials of |D − exact| / |exact|, with the
10th–90th percentile band. Also: DeepSeek-V3's recipe on the h100 (e4m3, wgmma, promotion into
binary32 every 128 products) and binary32 FMA accumulation (strict fp32) for reference.
Writes dot_error.csv and dot_error.png; deterministic (same bits for any thread count)."""
import argparse
import csv
import math
import os
import sys

import numpy as np

import mantis

UNITS = {
    "fp16": ["v100", "a100", "ada", "h100", "b200"],
    "bf16": ["a100", "ada", "h100", "b200"],
    "e4m3": ["ada", "h100", "h100:mma", "b200"],
}
KS = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def run(trials):
    rows = []
    for inp, gpus in UNITS.items():
        for K in KS:
            rng = np.random.default_rng(2026 + K)
            a = rng.standard_normal((trials, K)).astype(np.float32)
            b = rng.standard_normal((trials, K)).astype(np.float32)
            # operands as the units see them: rounded to the input format
            ar = mantis.round(a, inp)
            br = mantis.round(b, inp)
            exact = np.array([math.fsum((ar[t].astype(np.float64) * br[t].astype(np.float64)).tolist())
                              for t in range(trials)])
            cases = [(g, dict(accumulation="tensor_core", tensor_core=g, input=inp)) for g in gpus]
            if inp == "e4m3":
                cases.append(("h100 + promotion/128", dict(accumulation="tensor_core", tensor_core="h100", input=inp,
                                                           promote_every=128)))
            cases.append(("fp32 FMA", dict(accumulation="strict", input=inp)))
            for name, kw in cases:
                err = np.empty(trials)
                for t in range(trials):
                    d = mantis.gemm(ar[t:t + 1], br[t].reshape(K, 1).copy(), acc="fp32", **kw)[0, 0]
                    err[t] = abs(d - exact[t]) / abs(exact[t]) if exact[t] != 0 else 0.0
                q10, q50, q90 = np.percentile(err, [10, 50, 90])
                rows.append({"input": inp, "unit": name, "K": K, "trials": trials, "median": q50, "p10": q10,
                             "p90": q90})
        print(f"{inp}: done", file=sys.stderr)
    return rows


FLOOR = 1e-9  # an error of 0 (the exact value) is drawn here on the log axis


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), sharey=True)
    for ax, inp in zip(axes, UNITS):
        units = sorted({r["unit"] for r in rows if r["input"] == inp}, key=lambda u: (u == "fp32 FMA", u))
        for u in units:
            rs = [r for r in rows if r["input"] == inp and r["unit"] == u]
            K = [r["K"] for r in rs]
            style = "--" if u == "fp32 FMA" else "-"
            fl = lambda v: max(v, FLOOR)
            ax.plot(K, [fl(r["median"]) for r in rs], style, marker="o", ms=3, label=u)
            ax.fill_between(K, [fl(r["p10"]) for r in rs], [fl(r["p90"]) for r in rs], alpha=0.12)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{inp} inputs, binary32 output")
        ax.set_xlabel("K (dot-product length)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("|D − exact| / |exact| (median, 10–90 % band; 0 drawn at 1e-9)")
    axes[0].set_ylim(FLOOR / 2, 3e-2)
    fig.suptitle("Dot products through GPU matrix units (mantis models fitted to measured hardware outputs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = p.parse_args()
    rows = run(a.trials)
    tmp = os.path.join(a.out, "dot_error.csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, os.path.join(a.out, "dot_error.csv"))
    plot(rows, os.path.join(a.out, "dot_error.png"))
