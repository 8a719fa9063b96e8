#!/bin/sh
# tools/figures.py on a result set of every kind: the committed μ-sweep, LAMP, optimizer and GNMR
# sets, and an eval set, a training run, a policy sweep and a benchmark made here; checks that each wrote its PNG(s) and that a
# set changed after its manifest is refused. Usage: run_figures.sh SOURCE_ROOT MANTIS_BIN.
# Exit 77 (SKIP) without matplotlib.
set -eu
export PYTHONDONTWRITEBYTECODE=1
src=$1
bin=$2
py=/usr/bin/python3
$py -c "import matplotlib" 2>/dev/null || { echo "SKIP: matplotlib is not installed (python3-matplotlib)"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$src"
"$bin" eval --model models/llama-bytes --policy lamp:4 --data kjv/test --seqs 2 --ctx 32 --out "$out/eval" -q >/dev/null
sed 's|^out = .*|out = "'"$out"'/train"|; s|^steps = .*|steps = 6|' experiments/train-tiny.toml >"$out/tiny.toml"
"$bin" train "$out/tiny.toml" -q >/dev/null
cat >"$out/sweep.toml" <<EOF2
model = "models/llama-bytes"
data = "test"
seqs = 2
ctx = 16
sites = ["attn.qk", "mlp.fc"]
mu = [3, 7]
EOF2
"$bin" sweep "$out/sweep.toml" --out "$out/policy" -q >/dev/null
"$bin" bench round --n 10000 --reps 1 -j 1 --out "$out/bench" -q >/dev/null  # the table's drawing, not its numbers
$py tools/figures.py experiments/mu-sweep tests/data/lamp-small tests/data/optim-small tests/data/gnmr-small \
  "$out/eval" "$out/train" "$out/policy" "$out/bench" --out "$out/figs" >"$out/printed.txt"
cat "$out/printed.txt"
for f in mu-sweep-dot-error-vs-gamma mu-sweep-gemm-error-vs-gamma lamp-small-kl-vs-recompute \
  optim-small-val-curves gnmr-small-val-curves eval-windows train-training policy-kl bench-table; do
  p="$out/figs/$f.png"
  test -s "$p" || { echo "FAIL: no $f.png"; exit 1; }
  head -c 8 "$p" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "FAIL: $f.png is not a PNG"; exit 1; }
  grep -qF "wrote $p" "$out/printed.txt" || { echo "FAIL: no 'wrote' line for $f.png"; exit 1; }
done
# a set changed after its manifest is refused, naming the file
cp -r tests/data/lamp-small "$out/changed"
chmod -R u+w "$out/changed"
printf ' ' >>"$out/changed/results.json"
if $py tools/figures.py "$out/changed" --out "$out/figs" >"$out/changed.log" 2>&1; then
  echo "FAIL: a changed result set was drawn"; exit 1
fi
grep -q "results.json" "$out/changed.log" || { echo "FAIL: the refusal does not name results.json"; cat "$out/changed.log"; exit 1; }
echo ok
