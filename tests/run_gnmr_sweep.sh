#!/bin/sh
# tools/gnmr_sweep.py on a synthetic norm stream whose exceedances are known: 4 units with
# constant norms for 60 steps, except unit u2, whose norm is 100× larger at step 50 only. After
# a warm-up of 30 steps, 30 × 4 = 120 unit-steps are eligible; the jump exceeds every grid
# threshold (GNMR = 100, ΔGNMR = 100: under OR and AND alike), and nothing else can, so every
# row's exceedance rate
# is 1/120 = 0.833 %: no row meets the 0.2 % target, and with a 1 % target the least strict point
# (alpha 1.5, beta 1.25) is chosen. A small grid keeps the replays few.
set -eu
src=$1
bin=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
{
  echo "step,unit,grad_norm"
  for t in $(seq 1 60); do
    for u in u0 u1 u2 u3; do
      if [ "$u" = u2 ] && [ "$t" = 50 ]; then echo "$t,$u,100"; else echo "$t,$u,1"; fi
    done
  done
} >"$out/norms.csv"
grid="--alphas 1.5,6 --betas 1.25,8 --deltas 4,8"  # 2 × 2 × 2 × (or, and) = 16 rows: quick under ASAN
python3 "$src/tools/gnmr_sweep.py" --mantis "$bin" $grid "$out/norms.csv" >"$out/a.txt"
grep -q "no grid point with combine or and delta 8 stays within the target" "$out/a.txt" || { echo "FAIL: target 0.2 %"; cat "$out/a.txt"; exit 1; }
rows=$(grep -c " 0.833% " "$out/a.txt" || true)
[ "$rows" = 16 ] || { echo "FAIL: expected all 16 rows at 0.833 %, got $rows"; head -20 "$out/a.txt"; exit 1; }
python3 "$src/tools/gnmr_sweep.py" --mantis "$bin" $grid --target 0.01 "$out/norms.csv" >"$out/b.txt"
grep -q "alpha 1.5, beta 1.25: max exceedance 0.833 %" "$out/b.txt" || { echo "FAIL: target 1 %"; cat "$out/b.txt"; exit 1; }
# a missing file: one line, exit 2
if python3 "$src/tools/gnmr_sweep.py" --mantis "$bin" "$out/none.csv" 2>"$out/err.txt"; then echo "FAIL: no error"; exit 1; fi
if python3 "$src/tools/gnmr_sweep.py" --mantis "$bin" --betas 1,x "$out/norms.csv" 2>"$out/err2.txt"; then echo "FAIL: no error"; exit 1; fi
grep -q "a grid axis is not a list of numbers" "$out/err2.txt" || { echo "FAIL: grid error text"; cat "$out/err2.txt"; exit 1; }
grep -q "none.csv: no such file" "$out/err.txt" || { echo "FAIL: error text"; cat "$out/err.txt"; exit 1; }
echo "ok"
