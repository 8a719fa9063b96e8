#!/bin/sh
# Executes notebooks/gnmr.ipynb headless (jupyter nbconvert) on the committed result set
# tests/data/gnmr-small (from tests/data/gnmr-small.toml) and checks that it printed its tables
# and, where the kernel has matplotlib, wrote its two figures as PNGs; then that it refuses a copy
# of the set with one file changed after its manifest. Exit 77 (SKIP) without nbconvert.
set -eu
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree
src=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
command -v jupyter-nbconvert >/dev/null 2>&1 || { echo "SKIP: jupyter-nbconvert is not installed"; exit 77; }
GNMR_RESULTS="$src/tests/data/gnmr-small" GNMR_FIGURES="$out" MANTIS_TOOLS="$src/tools" \
  jupyter-nbconvert --to notebook --execute "$src/notebooks/gnmr.ipynb" --output-dir "$out" --output executed.ipynb
# what the cells printed (not their source)
python3 -c 'import json, sys
nb = json.load(open(sys.argv[1], encoding="utf-8"))
print("".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", [])))' \
  "$out/executed.ipynb" >"$out/printed.txt"
for t in "95% interval" "paired by seed" "gnmr2t-8" "random2t-8" "unit-steps recovered over seeds"; do
  grep -q "$t" "$out/printed.txt" || { echo "FAIL: the notebook printed no '$t'"; cat "$out/printed.txt"; exit 1; }
done
if grep -q "matplotlib is not installed" "$out/printed.txt"; then
  echo "note: the kernel has no matplotlib; figures not checked"
else
  for f in val_curves.png recoveries.png; do
    test -s "$out/$f" || { echo "FAIL: the notebook wrote no $f"; exit 1; }
    head -c 8 "$out/$f" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "FAIL: $f is not a PNG"; exit 1; }
    grep -q "wrote $out/$f" "$out/printed.txt" || { echo "FAIL: the notebook did not print 'wrote' for $f"; exit 1; }
  done
fi
# a set changed after its manifest must be refused
cp -r "$src/tests/data/gnmr-small" "$out/changed"
chmod -R u+w "$out/changed"
printf 'x' >> "$out/changed/summary.csv"
if GNMR_RESULTS="$out/changed" GNMR_FIGURES="$out" MANTIS_TOOLS="$src/tools" \
  jupyter-nbconvert --to notebook --execute "$src/notebooks/gnmr.ipynb" --output-dir "$out" --output changed.ipynb \
  >"$out/changed.log" 2>&1; then
  echo "FAIL: the notebook read a result set whose summary.csv changed after its manifest"; exit 1
fi
grep -q "summary.csv" "$out/changed.log" || { echo "FAIL: the refusal does not name summary.csv"; cat "$out/changed.log"; exit 1; }
echo "ok"
