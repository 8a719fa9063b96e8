#!/usr/bin/python3
"""figures — the PNG(s) of any mantis result set, headless (matplotlib's Agg backend).

    python3 tools/figures.py DIR... [--out FIGDIR]

Each DIR is verified against its manifest first (tools/results.py: a set changed after it was
written is refused) and drawn by what wrote it (manifest "generator") from the bytes whose SHA-256
was checked (read_result_set), never from the file opened again:
  mantis sweep        the μ-sweep: median relative error of dot products (and GEMMs) against the
                      length, one line per μ, beside the γ_n = n·u/(1 − n·u) bound
  mantis eval         per-window KL and flip rate of the policy against FP32, and the range health
                      per (site, layer) where the policy overflowed
  mantis lamp sweep   KL against the recomputed fraction of scores, per μ and rule (LAMP's figure)
  mantis policy sweep KL of every cell with its 95 % interval, grouped by site (log scale)
  mantis optim-study  validation curves per optimizer (curves.csv)
  mantis gnmr study   validation curves per arm (curves.csv)
  mantis train        training and validation loss against the step (log.csv)
  mantis bench        the benchmark's table (results.json rows) as a figure
Writes FIGDIR/<set name>-<figure>.png (default FIGDIR: DIR itself) and prints one "wrote PATH"
line per figure. Exit 1 with a one-line message for a set it cannot read or draw.
"""
import argparse
import functools
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import ResultSetError, csv_rows, json_of, read_result_set  # noqa: E402

try:
    import matplotlib  # noqa: E402
except ImportError:
    sys.exit(f"figures: matplotlib is not installed for {sys.executable} (Debian: apt install python3-matplotlib)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _num(v):
    if v in ("", None):
        return math.nan
    try:
        return float(v)
    except ValueError:
        return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(v, math.nan)


def _save(fig, out, name, written):
    path = os.path.join(out, name + ".png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)


def mu_sweep(d, res, out, tag, written):
    rows = res["results"]
    for kind in sorted({r["kind"] for r in rows}):
        fig, ax = plt.subplots(figsize=(6, 4))
        by_mu = defaultdict(list)
        mus = sorted({r["mu"] for r in rows if r["kind"] == kind})
        shown = set(mus if len(mus) <= 6 else [mus[round(i * (len(mus) - 1) / 5)] for i in range(6)])
        for r in rows:
            if r["kind"] == kind and r["mu"] in shown:
                by_mu[r["mu"]].append((r["shape"][2], _num(r["median_rel_err"]), _num(r["gamma"])))
        for i, (mu, pts) in enumerate(sorted(by_mu.items())):
            pts.sort()
            color = f"C{i % 10}"
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=f"μ = {mu}")
            ok = [p for p in pts if math.isfinite(p[2]) and 0 < p[2] <= 1]  # γ_n bounds only while n·u < 1/2
            ax.loglog([p[0] for p in ok], [p[2] for p in ok], "--", color=color, alpha=0.6)
        ax.set_xlabel("length n (K)")
        ax.set_ylabel("median relative error (dashed: γ_n bound)")
        ax.set_title(f"μ-sweep: {kind}")
        ax.legend(fontsize=7, ncol=2)
        _save(fig, out, f"{tag}-{kind}-error-vs-gamma", written)


def eval_set(d, res, out, tag, written):
    seqs = res["sequences"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = list(range(len(seqs)))
    ax.bar(x, [_num(s["kl_mean"]) for s in seqs], color="C0", label="KL(FP32 || policy), nats")
    ax2 = ax.twinx()
    ax2.plot(x, [_num(s["flip_rate"]) for s in seqs], "o", color="C3", label="top-1 flip rate")
    ax.set_xlabel("window")
    ax.set_ylabel("mean KL per position (nats)")
    ax2.set_ylabel("flip rate")
    ax.set_title("eval: the policy against FP32, per window")
    fig.legend(fontsize=7, loc="upper right")
    _save(fig, out, f"{tag}-windows", written)
    health = res.get("health") or []
    if health:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        labels = [f"{h['site']}@{h['layer']}" for h in health]
        for k, key in enumerate(("overflow", "nan", "inf")):
            ax.bar([i + 0.27 * k for i in range(len(health))], [_num(h[key]) for h in health], width=0.27, label=key)
        ax.set_xticks(range(len(health)), labels, rotation=60, fontsize=7)
        ax.set_ylabel("values out of range (count)")
        ax.set_title("eval: range health per site and layer")
        ax.legend(fontsize=7)
        _save(fig, out, f"{tag}-site-health", written)


def lamp_sweep(d, res, out, tag, written):
    cells = [c for c in res["cells"] if c.get("kind") in ("lamp", "uniform")]
    fig, ax = plt.subplots(figsize=(6, 4))
    series = defaultdict(list)
    for c in cells:
        rule = "uniform" if c["kind"] == "uniform" else f"{c['rule']}{' random' if c.get('random_control') else ''}"
        series[(c["mu"], rule)].append((_num(c["recompute_rate"]), _num(c["kl"])))
    for i, ((mu, rule), pts) in enumerate(sorted(series.items(), key=lambda t: (t[0][0], t[0][1]))):
        pts.sort()
        style = "s" if rule == "uniform" else ("x--" if "random" in rule else "o-")
        ax.plot([max(p[0], 1e-6) for p in pts], [max(p[1], 1e-12) for p in pts], style, color=f"C{i % 10}",
                label=f"ps{mu} {rule}" + (" (none recomputed: at 1e-6)" if rule == "uniform" else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("recomputed fraction of causal scores")
    ax.set_ylabel("KL(FP32 || run), nats")
    ax.set_title("LAMP: accuracy against recomputation")
    ax.legend(fontsize=6, ncol=2)
    _save(fig, out, f"{tag}-kl-vs-recompute", written)


def policy_sweep(d, res, out, tag, written):
    cells = [c for c in res["cells"] if c.get("site")]
    if not cells:
        raise ResultSetError(f"{d}: no swept cells to draw")
    fig, ax = plt.subplots(figsize=(max(6, 0.28 * len(cells) + 2), 4.5))
    sites = sorted({c["site"] for c in cells})
    for i, c in enumerate(cells):
        kl, (lo, hi) = _num(c["kl"]), (_num(v) for v in c.get("kl_interval", [math.nan, math.nan]))
        color = f"C{sites.index(c['site']) % 10}"
        ax.bar(i, max(kl, 1e-12), color=color)
        if math.isfinite(lo) and math.isfinite(hi):
            ax.plot([i, i], [max(lo, 1e-12), max(hi, 1e-12)], "k-", lw=1)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cells)), [c["name"] for c in cells], rotation=75, fontsize=6)
    ax.set_ylabel("KL(FP32 || cell), nats (bar: 95 % interval)")
    ax.set_title("policy sweep")
    for k, site in enumerate(sites):
        ax.bar([], [], color=f"C{k % 10}", label=site)
    ax.legend(fontsize=7)
    _save(fig, out, f"{tag}-kl", written)


def curves(d, rows, out, tag, written, group_cols, title):
    lines = defaultdict(list)
    for r in rows:
        key = " ".join(r[c] for c in group_cols if r.get(c))
        lines[key].append((_num(r["step"]), _num(r["val_loss_nats"])))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (key, pts) in enumerate(sorted(lines.items())):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=f"C{i % 10}", label=key, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats per token)")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2)
    _save(fig, out, f"{tag}-val-curves", written)


def train_log(d, rows, out, tag, written):
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([_num(r["step"]) for r in rows], [_num(r["loss_nats"]) for r in rows], "-", lw=0.8, label="training loss")
    val = [(_num(r["step"]), _num(r["val_loss_nats"])) for r in rows if r.get("val_loss_nats")]
    ax.plot([v[0] for v in val], [v[1] for v in val], "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("training")
    ax.legend(fontsize=7)
    _save(fig, out, f"{tag}-training", written)


def bench(d, res, out, tag, written):
    rows = res.get("results") or res.get("rows") or []
    if not rows or not isinstance(rows[0], dict):
        raise ResultSetError(f"{d}: no benchmark rows in results.json")
    cols = list(rows[0].keys())[:8]
    fig, ax = plt.subplots(figsize=(min(14, 1.6 * len(cols)), 0.4 * len(rows) + 1))
    ax.axis("off")
    cell = [[(f"{v:.4g}" if isinstance(v, float) else str(v)) for v in (r.get(c, "") for c in cols)] for r in rows]
    ax.table(cellText=cell, colLabels=cols, loc="center").auto_set_font_size(False)
    _save(fig, out, f"{tag}-table", written)


def plan(gen):
    """(the file of the set a set written by `gen` is drawn from, the function drawing it from that
    file's content: f(d, content, out, tag, written)), or None where there is no figure for it."""
    if not isinstance(gen, str):
        return None
    if gen.startswith("mantis bench"):
        return "results.json", bench
    return {"mantis sweep": ("results.json", mu_sweep),
            "mantis eval": ("results.json", eval_set),
            "mantis lamp sweep": ("results.json", lamp_sweep),
            "mantis policy sweep": ("results.json", policy_sweep),
            "mantis optim-study": ("curves.csv", functools.partial(curves, group_cols=("optimizer", "variant", "seed"),
                                                                   title="optimizer study: validation loss")),
            "mantis gnmr study": ("curves.csv", functools.partial(curves, group_cols=("arm", "seed"),
                                                                  title="GNMR study: validation loss")),
            "mantis train": ("log.csv", train_log)}.get(gen)


def content_of(name, raw, path):
    """What a drawing function gets of the file `name` (bytes raw, read from path): results.json
    parsed as JSON (results.json_of), a CSV file as its rows (results.csv_rows)."""
    return json_of(raw, path) if name.endswith(".json") else csv_rows(raw, path)


def draw(d, out):
    d = d.rstrip("/")
    tag = os.path.basename(os.path.abspath(d))
    written = []

    def reads(man):  # the file the figure is drawn from, where the manifest lists it
        p = plan(man.get("generator", ""))
        return [p[0]] if p and p[0] in man["files"] else []

    man, content = read_result_set(d, reads)  # the whole set verified; the file drawn from read once
    gen = man.get("generator", "")
    p = plan(gen)
    if p is None:
        raise ResultSetError(f"{d}: no figure for a result set written by {gen or 'an unknown generator'!r}")
    name, fn = p
    if name not in content:
        raise ResultSetError(f"{d}: no {name} to draw (its manifest does not list it)")
    fn(d, content_of(name, content[name], os.path.join(d, name)), out, tag, written)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out", help="where the PNGs go (default: each set's own directory)")
    a = ap.parse_args()
    for d in a.dirs:
        out = a.out or d
        os.makedirs(out, exist_ok=True)
        for p in draw(d, out):
            print("wrote", p)


if __name__ == "__main__":
    main()
