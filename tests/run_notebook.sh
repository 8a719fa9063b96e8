#!/bin/sh
# Executes notebooks/lamp.ipynb headless (jupyter nbconvert, Debian's jupyter-nbconvert +
# python3-matplotlib + python3-ipykernel, installed by scripts/setup.sh) on a small committed
# results set, and checks that it wrote its figure as a PNG. Exit 77 (SKIP) without nbconvert.
set -eu
src=$1
command -v jupyter-nbconvert >/dev/null 2>&1 || { echo "SKIP: jupyter-nbconvert is not installed"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
LAMP_RESULTS="$src/tests/data/lamp-small" LAMP_FIGURE="$out/figure.png" \
  jupyter-nbconvert --to notebook --execute "$src/notebooks/lamp.ipynb" --output-dir "$out" --output executed.ipynb
test -s "$out/figure.png"
head -c 8 "$out/figure.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a"
grep -q '"wrote' "$out/executed.ipynb"
echo "notebook executed; figure $(wc -c < "$out/figure.png") bytes"
