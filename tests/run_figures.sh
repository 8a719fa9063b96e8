#!/bin/sh
# The PNG(s) of every kind of result set: the ones the commands draw themselves after writing a set
# (eval, train, policy sweep, μ-sweep, bench; MANTIS_NO_FIGURES unset), and tools/figures.py on the
# committed μ-sweep, LAMP, optimizer and GNMR sets; a set changed after its manifest is refused, and a
# command whose figures cannot be drawn says so in one line and keeps its results.
# Usage: run_figures.sh SOURCE_ROOT MANTIS_BIN. Exit 77 (SKIP) without matplotlib.
set -eu
unset MANTIS_NO_FIGURES MANTIS_PYTHON
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
printf 'mu = [3, 7]\nlengths = [16, 64]\ngemm_shapes = [[4, 4, 16]]\ntrials = 3\n' >"$out/mu.toml"
"$bin" mu-sweep "$out/mu.toml" --out "$out/mu" -q >/dev/null
is_png() {
  test -s "$1" || { echo "FAIL: no $1"; exit 1; }
  head -c 8 "$1" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "FAIL: $1 is not a PNG"; exit 1; }
}
for f in eval/eval-windows train/train-training policy/policy-kl bench/bench-table mu/mu-dot-error-vs-gamma \
  mu/mu-gemm-error-vs-gamma; do
  is_png "$out/$f.png"
done
$py tools/figures.py experiments/mu-sweep tests/data/lamp-small tests/data/optim-small tests/data/gnmr-small \
  --out "$out/figs" >"$out/printed.txt"
cat "$out/printed.txt"
for f in mu-sweep-dot-error-vs-gamma mu-sweep-gemm-error-vs-gamma lamp-small-kl-vs-recompute \
  optim-small-val-curves gnmr-small-val-curves; do
  is_png "$out/figs/$f.png"
  grep -qF "wrote $out/figs/$f.png" "$out/printed.txt" || { echo "FAIL: no 'wrote' line for $f.png"; exit 1; }
done
# A command whose figures cannot be drawn: its results, exit 0, one line saying why.
MANTIS_PYTHON=/nonexistent/python3 "$bin" mu-sweep "$out/mu.toml" --out "$out/mu2" -q >/dev/null 2>"$out/nofig.err"
[ "$(wc -l <"$out/nofig.err")" = 1 ] && grep -q "figures not drawn: /nonexistent/python3" "$out/nofig.err" ||
  { echo "FAIL: a command without its figures:"; cat "$out/nofig.err"; exit 1; }
cmp "$out/mu/results.csv" "$out/mu2/results.csv" || { echo "FAIL: the results differ"; exit 1; }
! ls "$out/mu2"/*.png 2>/dev/null || { echo "FAIL: PNGs without an interpreter"; exit 1; }
# a set changed after its manifest is refused, naming the file
cp -r tests/data/lamp-small "$out/changed"
chmod -R u+w "$out/changed"
printf ' ' >>"$out/changed/results.json"
if $py tools/figures.py "$out/changed" --out "$out/figs" >"$out/changed.log" 2>&1; then
  echo "FAIL: a changed result set was drawn"; exit 1
fi
grep -q "results.json" "$out/changed.log" || { echo "FAIL: the refusal does not name results.json"; cat "$out/changed.log"; exit 1; }
echo ok
