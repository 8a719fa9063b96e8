#!/bin/sh
# Executes notebooks/python.ipynb headless (jupyter nbconvert) with the Python module of the build
# tree: rounding against the unit roundoff (and its figure), the shipped GPT-2 under lamp:<μ>, the
# shipped LLaMA exported in Hugging Face layout and read back bit for bit, and a plain-PyTorch
# LLaMA routed through a policy by mantis.torch. Checks what it printed and the PNG.
# Usage: run_python_notebook.sh SOURCE_ROOT MANTIS_BIN PYTHONPATH. Exit 77 (SKIP) without nbconvert.
set -eu
export PYTHONDONTWRITEBYTECODE=1
src=$1
command -v jupyter-nbconvert >/dev/null 2>&1 || { echo "SKIP: jupyter-nbconvert is not installed"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
MANTIS_ROOT="$src" MANTIS_BIN="$2" PYTHONPATH="$3" PY_FIGURES="$out" PYDEVD_DISABLE_FILE_VALIDATION=1 \
  jupyter-nbconvert --to notebook --execute "$src/notebooks/python.ipynb" --output-dir "$out" --output executed.ipynb
python3 -c 'import json, sys
nb = json.load(open(sys.argv[1], encoding="utf-8"))
print("".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", [])))' \
  "$out/executed.ipynb" >"$out/printed.txt"
for t in "rne: every relative error within the unit roundoff u" "KL(FP32 || policy)" \
  "HF-layout logits equal to the shipped checkpoint's, bit for bit: True" "PyTorch vs mantis, FP32" \
  "apply_policy routed 28 projections"; do
  grep -qF "$t" "$out/printed.txt" || { echo "FAIL: the notebook printed no '$t'"; cat "$out/printed.txt"; exit 1; }
done
if grep -q "matplotlib is not installed" "$out/printed.txt"; then
  echo "note: the kernel has no matplotlib; the figure not checked"
else
  test -s "$out/rounding_error.png" || { echo "FAIL: no rounding_error.png"; exit 1; }
  head -c 8 "$out/rounding_error.png" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || { echo "FAIL: not a PNG"; exit 1; }
fi
echo "ok"
