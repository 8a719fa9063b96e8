#!/bin/sh
# 1. tests/test_results_py.py: tools/results.py refuses a result set changed after its manifest
#    (results.csv with one more byte, results.json likewise, no manifest, a listed file missing),
#    and tools/lamp_table.py prints every table of tests/data/lamp-small and of a partial copy.
# 2. Executes notebooks/lamp.ipynb headless (jupyter nbconvert, Debian's jupyter-nbconvert +
#    python3-matplotlib + python3-ipykernel, installed by scripts/setup.sh) on the committed result
#    set tests/data/lamp-small (from tests/data/lamp-small.toml), and checks that it wrote both
#    figures (KL vs recompute rate; per-layer recompute rate) as PNGs. Exit 77 (SKIP) without
#    nbconvert (after step 1 passed). Step 2 is repeated on a partial copy of the set with an
#    infinite KL (left by step 1): the notebook must still write both figures.
set -eu
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree
src=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 "$src/tests/test_results_py.py" "$src" "$out/partial"
command -v jupyter-nbconvert >/dev/null 2>&1 || { echo "SKIP: jupyter-nbconvert is not installed"; exit 77; }
LAMP_RESULTS="$src/tests/data/lamp-small" LAMP_FIGURE="$out/figure.png" LAMP_LAYER_FIGURE="$out/layers.png" \
  MANTIS_TOOLS="$src/tools" \
  jupyter-nbconvert --to notebook --execute "$src/notebooks/lamp.ipynb" --output-dir "$out" --output executed.ipynb
for f in figure.png layers.png; do
  test -s "$out/$f" || { echo "FAIL: the notebook wrote no $f"; exit 1; }
  head -c 8 "$out/$f" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "FAIL: $f is not a PNG"; exit 1; }
done
test "$(grep -c '"wrote ' "$out/executed.ipynb")" -ge 2 || { echo "FAIL: the notebook did not print 'wrote' for both figures"; exit 1; }
# the same on a partial set with an infinite KL (the copy test_results_py.py left): it must still
# write both figures, and say what it left out
LAMP_RESULTS="$out/partial" LAMP_FIGURE="$out/partial-figure.png" LAMP_LAYER_FIGURE="$out/partial-layers.png" \
  MANTIS_TOOLS="$src/tools" \
  jupyter-nbconvert --to notebook --execute "$src/notebooks/lamp.ipynb" --output-dir "$out" --output partial.ipynb
test -s "$out/partial-figure.png" && test -s "$out/partial-layers.png" || { echo "FAIL: no figures of the partial set"; exit 1; }
grep -q 'PARTIAL result set' "$out/partial.ipynb" || { echo "FAIL: the notebook did not call the partial set partial"; exit 1; }
grep -q 'non-finite' "$out/partial.ipynb" || { echo "FAIL: the notebook did not note the non-finite KL it left out"; exit 1; }
echo "notebook executed; figures $(wc -c < "$out/figure.png") and $(wc -c < "$out/layers.png") bytes"
