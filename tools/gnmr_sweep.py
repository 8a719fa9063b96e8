#!/usr/bin/env python3
"""The GNMR threshold sweep on recorded norm streams (experiments/gnmr/README.md, "Defaults").

Runs `mantis gnmr replay --json` (the controller alone, src/exp/gnmr_replay.h) over a grid of
alpha, beta, delta and combine on each norms.csv given (a training run's, written with a
[controller]; a logging-only controller with max_recover = 0 records the low path undisturbed),
and prints per setting the exceedance rate (exceeding unit-steps / eligible unit-steps after
warm-up) of every stream and its maximum. Replay cannot say what a setting does to the loss: it
calibrates how often the rule fires on the static low path, which is what the paper's
"exceedances below 0.2 % of eligible blocks" measures. The default chosen is the least strict
grid point (smallest alpha, then beta, then delta 8) whose exceedance stays at or below the target
on every stream.

Usage: tools/gnmr_sweep.py [--mantis BIN] [--target 0.002] [--warmup 30] [--alphas A,A,..] [--betas B,..]
                           [--deltas D,..] NORMS.csv [NORMS.csv ...]   (the grid's axes; default below)
Errors (a missing file, a failing replay) print one line on stderr and exit 2.
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

ALPHAS = [1.5, 2.0, 2.5, 3.0, 4.0, 6.0]
BETAS = [1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0]
DELTAS = [4, 8, 16]
COMBINES = ["or", "and"]


def fail(msg):
    print(f"gnmr_sweep: error: {msg}", file=sys.stderr)
    sys.exit(2)


def replay(binary, norms, opts, tmp):
    cfg = os.path.join(tmp, "c.toml")
    with open(cfg, "w", encoding="utf-8") as f:
        f.write('[controller]\nname = "gnmr"\nmax_recover = 1\n')
        for k, v in opts.items():
            f.write(f'{k} = "{v}"\n' if isinstance(v, str) else f"{k} = {v}\n")
    p = subprocess.run([binary, "gnmr", "replay", "--config", cfg, "--norms", norms, "--out",
                        os.path.join(tmp, "d.csv"), "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"replay of {norms} with {opts}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("norms", nargs="+")
    ap.add_argument("--mantis", default=os.path.join(os.path.dirname(__file__), "..", "build", "src", "cli", "mantis"))
    ap.add_argument("--target", type=float, default=0.002)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--alphas", default=",".join(map(str, ALPHAS)))
    ap.add_argument("--betas", default=",".join(map(str, BETAS)))
    ap.add_argument("--deltas", default=",".join(map(str, DELTAS)))
    a = ap.parse_args()
    try:
        alphas = [float(x) for x in a.alphas.split(",")]
        betas = [float(x) for x in a.betas.split(",")]
        deltas = [int(x) for x in a.deltas.split(",")]
    except ValueError as e:
        fail(f"a grid axis is not a list of numbers: {e}")
    for n in a.norms:
        if not os.path.isfile(n):
            fail(f"{n}: no such file")
    if not os.access(a.mantis, os.X_OK):
        fail(f"{a.mantis}: not an executable mantis (give --mantis)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for alpha, beta, delta, combine in itertools.product(alphas, betas, deltas, COMBINES):
            opts = {"alpha": alpha, "beta": beta, "delta": delta, "combine": combine, "warmup": a.warmup}
            rates = [replay(a.mantis, n, opts, tmp)["exceedance_rate"] for n in a.norms]
            rows.append((opts, rates))
    names = [os.path.basename(os.path.dirname(os.path.abspath(n))) or n for n in a.norms]
    print(f"exceedance rate per eligible unit-step (warm-up {a.warmup}), target <= {100 * a.target:.2f} %")
    print(f"{'alpha':>5} {'beta':>5} {'delta':>5} {'combine':>7} " + " ".join(f"{n[:14]:>14}" for n in names) + f" {'max':>8}")
    for opts, rates in rows:
        print(f"{opts['alpha']:>5} {opts['beta']:>5} {opts['delta']:>5} {opts['combine']:>7} "
              + " ".join(f"{100 * r:>13.3f}%" for r in rates) + f" {100 * max(rates):>7.3f}%")
    ok = [(o, r) for o, r in rows if o["combine"] == "or" and o["delta"] == 8 and max(r) <= a.target]
    if ok:
        o, r = min(ok, key=lambda x: (x[0]["alpha"], x[0]["beta"]))
        print(f"chosen (combine or, delta 8, the smallest alpha then beta within the target): alpha {o['alpha']}, "
              f"beta {o['beta']}: max exceedance {100 * max(r):.3f} %")
    else:
        print("no grid point with combine or and delta 8 stays within the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
