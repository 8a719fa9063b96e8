#!/usr/bin/python3
"""Markdown tables of a `mantis lamp sweep` results directory (for experiments/lamp/README.md).

Usage: tools/lamp_table.py RESULTS_DIR [--mu 4,10]
Prints, per μ: uniform ps<μ> KL / flips / perplexity, then every LAMP cell of that μ (rule, τ):
recompute rate, KL, KL reduction vs uniform, flip rate, and the random control's KL reduction at
the same per-row counts.
"""
import argparse
import json
import os


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--mu", default="")
    a = ap.parse_args()
    cells = json.load(open(os.path.join(a.results, "results.json")))["cells"]
    fp32 = next(c for c in cells if c["kind"] == "fp32")
    mus = sorted({c["mu"] for c in cells if c["mu"] is not None})
    if a.mu:
        mus = [int(m) for m in a.mu.split(",")]
    print(f"FP32 perplexity {fp32['ppl']:.4f}.\n")
    print("| μ | uniform ps<μ> KL | top-1 flips | perplexity |")
    print("|---|---|---|---|")
    for mu in sorted({c["mu"] for c in cells if c["mu"] is not None}):
        u = next(c for c in cells if c["kind"] == "uniform" and c["mu"] == mu)
        print(f"| {mu} | {u['kl']:.3e} | {100 * u['flip_rate']:.2f} % | {u['ppl']:.4f} |")
    for mu in mus:
        u = next(c for c in cells if c["kind"] == "uniform" and c["mu"] == mu)
        print(f"\n**μ = {mu}** (uniform ps{mu}: KL {u['kl']:.3e}, flips {100 * u['flip_rate']:.2f} %)\n")
        print("| rule | τ | recompute | KL | KL reduction | flips | random control: KL reduction |")
        print("|---|---|---|---|---|---|---|")
        for rule in ("strict", "relaxed"):
            for c in cells:
                if c["kind"] != "lamp" or c["mu"] != mu or c["rule"] != rule or c["random_control"]:
                    continue
                r = next((x for x in cells if x["kind"] == "lamp" and x["mu"] == mu and x["rule"] == rule
                          and x["tau"] == c["tau"] and x["random_control"]), None)
                red = u["kl"] / c["kl"] if c["kl"] else float("inf")
                rred = u["kl"] / r["kl"] if r and r["kl"] else float("nan")
                print(f"| {rule} | {c['tau']:g} | {100 * c['recompute_rate']:.3f} % | {c['kl']:.3e} | {red:.1f}× | "
                      f"{100 * c['flip_rate']:.2f} % | {rred:.2f}× |")


if __name__ == "__main__":
    main()
