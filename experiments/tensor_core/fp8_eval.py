#!/usr/bin/env python3
"""experiments/policies/h100-fp8.toml (E4M3 operands through the h100's measured wgmma unit,
promoted into binary32 every 128 products) on the shipped models, beside FP32, with the same
operands accumulated otherwise: the unit without promotion (cuBLASLt's fast accumulation),
binary32 FMA accumulation, and deepseek-fp8.toml (the recipe's per-tile scales, an assumed
14-bit accumulator).

  PYTHONPATH=<build>/python python3 experiments/tensor_core/fp8_eval.py [--windows 32]

Windows: mantis.eval's `windows` windows of 256 tokens spread evenly over the validation split
of every corpus (byte tokens), the same for every policy, so that each policy's KL against FP32
is paired by window (results.json's per-sequence values). Differences of mean KL between policies get percentile-bootstrap intervals over
windows (10,000 resamples, seed 1) at 95 % / 3 (Bonferroni over the three comparisons per model).
Writes fp8_eval.csv (one row per model, policy and window) and prints the summary that
README.md quotes. Deterministic."""
import argparse
import csv
import os
import sys
import tempfile

import numpy as np

import mantis

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
HERE = os.path.dirname(os.path.abspath(__file__))


def policies(tmp):
    pol = {"h100-fp8": os.path.join(ROOT, "experiments/policies/h100-fp8.toml"),
           "deepseek-fp8": os.path.join(ROOT, "experiments/policies/deepseek-fp8.toml")}
    sites = ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]
    variants = {"h100 no promotion": 'input = "e4m3"\ntensor_core = "h100"\n',
                "e4m3, fp32 FMA": 'input = "e4m3"\naccumulation = "strict"\naccumulator = "fp32"\n'}
    for name, keys in variants.items():
        p = os.path.join(tmp, name.replace(" ", "_").replace(",", "") + ".toml")
        with open(p, "w") as f:
            for s in sites:
                f.write(f'[site."{s}"]\n{keys}')
        pol[name] = p
    return pol


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=32)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fp8-eval-")
    pol = policies(tmp)
    rows = []
    for model in ("gpt2-bytes", "llama-bytes"):
        m = mantis.load_model(os.path.join(ROOT, "models", model))
        for name, p in pol.items():
            r = mantis.eval(m, mantis.Policy(p), data="validation", seqs=a.windows, ctx=256)["results"]
            for w, q in enumerate(r["sequences"]):
                rows.append({"model": model, "policy": name, "window": w, "start": q["start"], "kl": q["kl_mean"],
                             "flips": q["flips"], "ppl_ref": q["ppl_ref"], "ppl_test": q["ppl_test"]})
        print(f"{model}: done", file=sys.stderr)
    wins = range(a.windows)
    with open(os.path.join(HERE, "fp8_eval.csv.tmp"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    os.replace(os.path.join(HERE, "fp8_eval.csv.tmp"), os.path.join(HERE, "fp8_eval.csv"))
    rng = np.random.default_rng(1)
    print(f"{len(wins)} windows of 256 tokens; KL(FP32 || policy) in nats, mean over windows")
    for model in ("gpt2-bytes", "llama-bytes"):
        kl = {n: np.array([r["kl"] for r in rows if r["model"] == model and r["policy"] == n]) for n in pol}
        for n in pol:
            print(f"{model:12} {n:20} mean KL {kl[n].mean():.3e}")
        idx = rng.integers(0, len(wins), (10000, len(wins)))
        for other in ("h100 no promotion", "e4m3, fp32 FMA", "deepseek-fp8"):
            d = kl["h100-fp8"] - kl[other]
            boot = d[idx].mean(axis=1)
            lo, hi = np.percentile(boot, [100 * 0.025 / 3, 100 * (1 - 0.025 / 3)])
            print(f"{model:12} h100-fp8 − {other:18}: {d.mean():+.3e} [{lo:+.3e}, {hi:+.3e}]")


if __name__ == "__main__":
    main()
