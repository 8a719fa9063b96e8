#!/usr/bin/python3
"""Markdown tables of a `mantis lamp sweep` result set (for experiments/lamp/README.md).

Usage: tools/lamp_table.py RESULTS_DIR [--section NAME] [--mu MU]

The set is read through tools/results.py, which refuses it unless manifest.json is there and every
file has the SHA-256 the manifest lists. A partial set (merged with --allow-partial) is said to be
partial at the top; what its missing cells would have shown is skipped.

Sections (all by default, in this order):
  uniform  per μ: uniform ps<μ> KL [95 % interval], top-1 flips, perplexity
  best     per μ: the largest KL reduction KL(uniform)/KL(cell) [interval] at recompute ≤ 1/2/5/10 %,
           over the rule cells (strict or relaxed, any τ) and over the random controls
  curve    the strict and the relaxed curve at μ = MU (default 4): τ, recompute rate, KL,
           KL reduction [interval], and the random control's reduction at the same counts
  paper    our strict and relaxed KL reduction at μ = MU read at the LAMP paper's recompute rates
           (0.3 %, 1.6 %, 7.6 %; GPT-2 XL, μ = 4, strict: 12×, 83×, 385×), by log–log interpolation
           of the reduction-vs-rate curve; the interval ends are interpolated the same way
  layers   per-layer recompute rates of strict μ = MU τ = 1 and of the relaxed μ = MU cell whose
           recompute rate is nearest it (log scale)

Intervals are the merge's 95 % percentile bootstrap over windows. Point values are rounded to the
digits their interval supports (results.round_to_interval: down to the decade of the half-width,
1 to 4 significant figures); values without an interval get 3 figures.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import fmt_interval, fmt_num, is_finite, load_result_set, loglog_interp  # noqa: E402

SECTIONS = ("uniform", "best", "curve", "paper", "layers")
CAPS = (0.01, 0.02, 0.05, 0.10)
# LAMP paper (GPT-2 XL, μ = 4, strict rule): KL reduction vs uniform at these recompute rates
PAPER = ((0.003, 12.0), (0.016, 83.0), (0.076, 385.0))


def pct(x):
    """A rate as a percentage, 3 significant figures."""
    return fmt_num(100 * x, 3) + " %" if is_finite(x) else fmt_num(x)


def interval(c, key):
    iv = c.get(key + "_interval")
    return (iv[0], iv[1]) if isinstance(iv, list) and len(iv) == 2 else (None, None)


def kl_str(c):
    return fmt_interval(c["kl"], *interval(c, "kl"))


def ratio_str(c):
    if c is None or "kl_ratio" not in c:
        return "—"
    return fmt_interval(c["kl_ratio"], *interval(c, "kl_ratio"), suffix="×")


class Sweep:
    def __init__(self, manifest, cells):
        self.manifest, self.cells = manifest, cells
        self.mus = sorted({c["mu"] for c in cells if c.get("mu") is not None})
        self.mus_config = configured_mus(manifest) or self.mus  # μ of the sweep, present or not
        self.uniform = {c["mu"]: c for c in cells if c["kind"] == "uniform"}

    def lamp(self, mu, rule=None, random=None):
        return [c for c in self.cells if c["kind"] == "lamp" and c["mu"] == mu
                and (rule is None or c["rule"] == rule) and (random is None or c["random_control"] == random)]

    def control_of(self, c):
        return next((x for x in self.lamp(c["mu"], c["rule"], True) if x["tau"] == c["tau"]), None)

    def curve(self, mu, rule, key="kl_ratio"):
        """[(recompute rate, value)] of the rule cells; key "kl_ratio_lo"/"_hi" for the interval ends."""
        pts = []
        for c in self.lamp(mu, rule, False):
            if key == "kl_ratio":
                v = c.get("kl_ratio")
            else:
                lo, hi = interval(c, "kl_ratio")
                v = lo if key.endswith("lo") else hi
            if v is not None:
                pts.append((c["recompute_rate"], v))
        return pts


def configured_mus(manifest):
    """The sweep configuration's μ list (the manifest holds the TOML text), or None."""
    try:
        import tomllib
        mu = tomllib.loads(manifest.get("config", "")).get("mu")
        return sorted(int(m) for m in mu) if isinstance(mu, list) else None
    except Exception:  # an older Python, or a configuration without mu (mantis's default list)
        return None


def header(s, results_dir):
    m = s.manifest
    data = m.get("data", {})
    print(f"Result set `{results_dir}` ({m.get('generator', '?')}, mantis {m.get('mantis_version', '?')}, "
          f"commit {str(m.get('git_commit', '?'))[:12]}; config `{m.get('config_file', '?')}`): "
          f"{len(s.cells)} of {m.get('cells', '?')} cells, {data.get('windows', '?')} windows of "
          f"{data.get('ctx', '?')} tokens; intervals: {m.get('intervals', {}).get('method', '?')}.")
    if m.get("partial"):
        miss = m.get("cells_missing", [])
        shown = ", ".join(str(i) for i in miss[:12]) + (", …" if len(miss) > 12 else "")
        print(f"\n**PARTIAL result set: {len(miss)} cells missing ({shown}); tables skip what they need.**")
    fp32 = next((c for c in s.cells if c["kind"] == "fp32"), None)
    if fp32:
        print(f"\nFP32 perplexity {fmt_num(fp32['ppl'], 5)}.")


def section_uniform(s, mu_sel):
    print("\n| μ | uniform ps<μ> KL [95 %] | top-1 flips | perplexity |")
    print("|---|---|---|---|")
    for mu in s.mus_config:
        u = s.uniform.get(mu)
        if u is None:
            print(f"| {mu} | (uniform cell missing) | | |")
            continue
        print(f"| {mu} | {kl_str(u)} | {pct(u['flip_rate'])} | {fmt_num(u['ppl'], 5)} |")


def best_at(cells, cap):
    ok = [c for c in cells if is_finite(c["recompute_rate"]) and c["recompute_rate"] <= cap
          and c.get("kl_ratio") is not None and not math.isnan(c["kl_ratio"])]
    return max(ok, key=lambda c: c["kl_ratio"], default=None)


def section_best(s, mu_sel):
    print("\n| μ | recompute ≤ | best rule cell (recompute) | KL reduction [95 %] | best random control (recompute) "
          "| KL reduction [95 %] |")
    print("|---|---|---|---|---|---|")
    for mu in s.mus_config:
        if mu not in s.uniform:
            print(f"| {mu} | | (uniform cell missing: no reductions) | | | |")
            continue
        for cap in CAPS:
            b, r = best_at(s.lamp(mu, random=False), cap), best_at(s.lamp(mu, random=True), cap)

            def name(c):
                return "—" if c is None else f"{c['rule']} τ={c['tau']:g} ({pct(c['recompute_rate'])})"
            print(f"| {mu} | {fmt_num(100 * cap, 2)} % | {name(b)} | {ratio_str(b)} | {name(r)} | {ratio_str(r)} |")


def section_curve(s, mu):
    u = s.uniform.get(mu)
    if mu not in s.mus:
        print(f"\n(no cells at μ = {mu})")
        return
    print(f"\n**μ = {mu}**" + (f" (uniform ps{mu}: KL {kl_str(u)})" if u else " (uniform cell missing)"))
    for rule in ("strict", "relaxed"):
        cells = sorted(s.lamp(mu, rule, False), key=lambda c: -c["tau"] if rule == "strict" else c["tau"])
        cells = sorted(cells, key=lambda c: c["recompute_rate"])
        if not cells:
            print(f"\n({rule}: no cells)")
            continue
        print(f"\n{rule} rule, μ = {mu}:\n")
        print("| τ | recompute | KL [95 %] | KL reduction [95 %] | flips | random control: KL reduction [95 %] |")
        print("|---|---|---|---|---|---|")
        for c in cells:
            print(f"| {c['tau']:g} | {pct(c['recompute_rate'])} | {kl_str(c)} | {ratio_str(c)} | "
                  f"{pct(c['flip_rate'])} | {ratio_str(s.control_of(c))} |")


def section_paper(s, mu):
    print(f"\nKL reduction at μ = {mu} read at the paper's recompute rates (log–log interpolation between our "
          "cells; the interval ends interpolated the same way); paper: GPT-2 XL, μ = 4, the rule not stated in our source.\n")
    print("| recompute | paper | ours, strict [95 %] | ours, relaxed [95 %] |")
    print("|---|---|---|---|")
    curves = {rule: [s.curve(mu, rule, k) for k in ("kl_ratio", "kl_ratio_lo", "kl_ratio_hi")]
              for rule in ("strict", "relaxed")}
    for rate, red in PAPER:
        cols = []
        for rule in ("strict", "relaxed"):
            pts, lo, hi = curves[rule]
            x = loglog_interp(pts, rate)
            if x is None:
                rates = [r for r, v in pts if is_finite(r, v) and r > 0 and v > 0]
                cols.append("— (outside " + (f"{pct(min(rates))} – {pct(max(rates))}" if rates else "no cells") + ")")
            else:
                cols.append(fmt_interval(x, loglog_interp(lo, rate), loglog_interp(hi, rate), suffix="×"))
        print(f"| {pct(rate)} | {red:g}× | {cols[0]} | {cols[1]} |")


def layer_rates(c):
    pl = c.get("per_layer", {})
    return [r / n if n else math.nan for r, n in zip(pl.get("recomputed", []), pl.get("causal_scores", []))]


def section_layers(s, mu):
    sel = []
    strict = next((c for c in s.lamp(mu, "strict", False) if c["tau"] == 1), None)
    if strict is None:  # τ = 1 not in the sweep: the strict cell nearest 1 % recompute
        strict = nearest(s.lamp(mu, "strict", False), 0.01)
    if strict:
        sel.append(strict)
        relaxed = nearest(s.lamp(mu, "relaxed", False), strict["recompute_rate"])
        if relaxed:
            sel.append(relaxed)
    sel = [c for c in sel if layer_rates(c)]
    if not sel:
        print(f"\n(no per-layer data at μ = {mu})")
        return
    layers = max(len(layer_rates(c)) for c in sel)
    print(f"\nPer-layer recompute rate (recomputed / causal scores of the layer), μ = {mu}:\n")
    print("| cell | all layers | " + " | ".join(f"layer {i}" for i in range(layers)) + " |")
    print("|---|---|" + "---|" * layers)
    for c in sel:
        print(f"| {c['rule']} τ={c['tau']:g} | {pct(c['recompute_rate'])} | "
              + " | ".join(pct(x) for x in layer_rates(c)) + " |")


def nearest(cells, rate):
    ok = [c for c in cells if is_finite(c["recompute_rate"]) and c["recompute_rate"] > 0]
    if not ok or not is_finite(rate) or rate <= 0:
        return None
    return min(ok, key=lambda c: abs(math.log(c["recompute_rate"] / rate)))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Markdown tables of a mantis lamp sweep result set")
    ap.add_argument("results", help="result set directory (results.json + manifest.json)")
    ap.add_argument("--section", choices=SECTIONS, action="append",
                    help="print only this section (repeatable; default: all)")
    ap.add_argument("--mu", type=int, default=4, help="μ of the curve, paper and layers sections (default 4)")
    a = ap.parse_args(argv)
    print_tables(a.results, a.section or SECTIONS, a.mu)


def print_tables(results_dir, sections=SECTIONS, mu=4, loaded=None):
    """Prints the header and `sections`; `loaded` = (manifest, cells) if already read."""
    s = Sweep(*(loaded or load_result_set(results_dir)))
    header(s, results_dir)
    fns = {"uniform": section_uniform, "best": section_best, "curve": section_curve, "paper": section_paper,
           "layers": section_layers}
    for name in sections:
        fns[name](s, mu)


if __name__ == "__main__":
    main()
