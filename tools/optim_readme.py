"""Draft tables for experiments/optim/README.md from a merged `mantis optim-study` result set.

Usage: python3 tools/optim_readme.py RESULT_DIR > tables.md

Reads the set through results.load_result_set_csvs (refused unless its manifest matches; the CSV
files parsed from the bytes that were hashed, not opened again) and prints
Markdown: per model, the optimizers' final validation loss with the 95 % t interval over seeds (or
"single-seed"), perplexity, state bytes per parameter and the reduction against AdamW, median step
time and peak RSS; Gefen's momentum error per role at the last measured step (mean over seeds); the
codebook distortion of the step-0 codebook against a re-learned one (mean over measurements); and
what the P = 1 tensors cost. The prose of the README is the lead's; this only prints numbers.
Standard library only.
"""
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import is_finite, load_result_set_csvs  # noqa: E402

CSVS = ("summary.csv", "gefen_error.csv", "gefen_distortion.csv")


def num(x):
    return float(x) if x not in ("", None) else math.nan


def main(d):
    manifest, cells, tables = load_result_set_csvs(d, CSVS)
    summary = tables["summary.csv"]
    print(f"Result set `{d}`: {len(cells)} of {manifest.get('cells', '?')} cells"
          + (" (PARTIAL)" if manifest.get("partial") else "") + ".\n")
    for m in dict.fromkeys(r["model"] for r in summary):
        rows = [r for r in summary if r["model"] == m]
        base = next((num(r["bytes_per_param"]) for r in rows if r["optimizer"] == "adamw"), math.nan)
        print(f"### {m}\n")
        print("| optimizer | seeds | final val loss (95 % t) | ppl | state B/param | vs AdamW | step ms | peak RSS MiB |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for r in rows:
            lo, hi = num(r["t_lo_nats"]), num(r["t_hi_nats"])
            loss = num(r["mean_final_val_loss_nats"])
            iv = f"{loss:.4f} [{lo:.4f}, {hi:.4f}]" if r["interval"] == "t95" and is_finite(lo, hi) else f"{loss:.4f} (single seed)"
            bpp = num(r["bytes_per_param"])
            rel = f"{base / bpp:.2f}×" if is_finite(base, bpp) and bpp > 0 else ""
            print(f"| {r['optimizer']} | {r['seeds']} | {iv} | {num(r['ppl']):.2f} | {bpp:.3f} | {rel} | "
                  f"{1e3 * num(r['median_step_seconds']):.1f} | {int(r['peak_rss_bytes']) / 2**20:.0f} |")
        print()
    err = tables["gefen_error.csv"]
    if err:
        last = defaultdict(int)
        for r in err:
            k = (r["model"], r["variant"] or r["optimizer"])
            last[k] = max(last[k], int(r["step"]))
        acc = defaultdict(list)
        for r in err:
            k = (r["model"], r["variant"] or r["optimizer"])
            if int(r["step"]) == last[k]:
                acc[k + (r["role"],)].append(num(r["rel_error"]))
        print("### Gefen momentum against the FP32 shadow (relative error at the last measured step, mean over seeds)\n")
        print("| model | optimizer | step | role | ‖m_deq − m_fp32‖/‖m_fp32‖ |")
        print("|---|---|---:|---|---:|")
        for (m, o, role), v in acc.items():
            print(f"| {m} | {o} | {last[(m, o)]} | {role} | {sum(v) / len(v):.4g} |")
        print()
    dist = tables["gefen_distortion.csv"]
    if dist:
        acc = defaultdict(list)
        for r in dist:
            acc[(r["model"], r["variant"] or r["optimizer"])].append((num(r["distortion_step0"]), num(r["distortion_relearned"])))
        print("### Codebook distortion on later steps' gradients (mean over measurements and seeds)\n")
        print("| model | optimizer | measurements | step-0 codebook | re-learned | ratio |")
        print("|---|---|---:|---:|---:|---:|")
        for (m, o), v in acc.items():
            a = sum(x for x, _ in v) / len(v)
            b = sum(y for _, y in v) / len(v)
            print(f"| {m} | {o} | {len(v)} | {a:.4g} | {b:.4g} | {a / b:.3g} |" if b > 0 else f"| {m} | {o} | {len(v)} | {a:.4g} | {b:.4g} | |")
        print()
    seen = set()
    lines = []
    for c in cells:
        g = c.get("gefen")
        if not g or (c["model"], c["variant"] or c["optimizer"]) in seen:
            continue
        seen.add((c["model"], c["variant"] or c["optimizer"]))
        per = defaultdict(int)
        for t in g["tensors"]:
            per[t["period"]] += 1
        hist = ", ".join(f"P={p}: {n}" for p, n in sorted(per.items()))
        p1 = f"{g['p1_state_bytes']} B for {g['p1_params']} params" if g["p1_params"] else "none"
        lines.append(f"| {c['model']} | {c['variant'] or c['optimizer']} | {hist} | {p1} |")
    if lines:
        print("### Detected periods (tensors per period) and the P = 1 tensors' state\n")
        print("| model | optimizer | periods | P = 1 tensors |")
        print("|---|---|---|---|")
        print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: optim_readme.py RESULT_DIR")
    main(sys.argv[1])
