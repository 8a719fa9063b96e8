#!/usr/bin/env bash
# The GPU check: the CUDA test suite, `mantis validate-gpu` (every contract) and `mantis bench-gpu`,
# gathered into one JSON report. Sized for a short GPU window (well under 5 minutes on one H100/H200
# with a prebuilt bundle).
#
#   scripts/gpu-check.sh --bundle      on the build machine (needs build/ with CUDA): copies the
#                                      binaries and the shared libraries a bare CUDA image may lack
#                                      into gpu-bundle/ (carry that folder to the GPU machine)
#   scripts/gpu-check.sh [OUT]         on the GPU machine: runs everything from gpu-bundle/ (or from
#                                      build/, built here first when missing and meson is available),
#                                      writes OUT/report.json (default OUT: gpu-check/) and the logs
# Exit status: 0 all passed; 1 a test or contract failed; 2 nothing to run (no binaries, no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

if [ "${1:-}" = "--bundle" ]; then
  [ -x build/src/cli/mantis ] && [ -x build/tests/test_cuda ] || {
    echo "gpu-check: build/ has no CUDA binaries (scripts/setup.sh build with nvcc on PATH)" >&2; exit 2; }
  rm -rf gpu-bundle && mkdir -p gpu-bundle/lib
  cp build/src/cli/mantis build/tests/test_cuda gpu-bundle/
  # every shared library but the C runtime and the GPU driver (the CUDA image brings those)
  ldd build/src/cli/mantis build/tests/test_cuda | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda)\.so' | xargs -r cp -L -t gpu-bundle/lib/
  git rev-parse HEAD > gpu-bundle/commit 2>/dev/null || echo unknown > gpu-bundle/commit
  du -sh gpu-bundle >&2
  exit 0
fi

out=${1:-gpu-check}
mkdir -p "$out"
if [ -x gpu-bundle/mantis ]; then
  bin=gpu-bundle; mantis=gpu-bundle/mantis; test_cuda=gpu-bundle/test_cuda
  export LD_LIBRARY_PATH="$PWD/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  commit=$(cat gpu-bundle/commit)
else
  if [ ! -x build/src/cli/mantis ] && command -v meson >/dev/null; then
    meson setup build >/dev/null && ninja -C build >/dev/null || { echo "gpu-check: the build failed" >&2; exit 2; }
  fi
  [ -x build/src/cli/mantis ] || { echo "gpu-check: no gpu-bundle/ and no build/ (run --bundle where it builds)" >&2; exit 2; }
  bin=build; mantis=build/src/cli/mantis; test_cuda=build/tests/test_cuda
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/nvidia-smi.txt" 2>&1

t0=$(date +%s)
# 1. the cuda suite (what `meson test --suite cuda` runs)
timeout 600 "$test_cuda" --durations yes > "$out/test_cuda.log" 2>&1; rc_test=$?
t1=$(date +%s)
# 2. every contract at full size
timeout 900 "$mantis" validate-gpu --out "$out/validate" > "$out/validate.log" 2>&1; rc_val=$?
t2=$(date +%s)
# 3. the benchmarks
timeout 600 "$mantis" bench-gpu --json > "$out/bench.json" 2> "$out/bench.log"; rc_bench=$?
t3=$(date +%s)

python3 - "$out" "$commit" "$rc_test" "$rc_val" "$rc_bench" "$((t1 - t0))" "$((t2 - t1))" "$((t3 - t2))" <<'PY'
import json, os, sys
out, commit, rc_test, rc_val, rc_bench, s_test, s_val, s_bench = sys.argv[1:]
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception as e:
        return {"error": f"{p}: {e}"}
report = {
    "commit": commit,
    "device": open(os.path.join(out, "nvidia-smi.txt")).read().strip(),
    "test_cuda": {"exit": int(rc_test), "seconds": int(s_test),
                  "tail": open(os.path.join(out, "test_cuda.log")).read()[-2000:]},
    "validate_gpu": {"exit": int(rc_val), "seconds": int(s_val),
                     "results": load(os.path.join(out, "validate", "results.json")).get("results")},
    "bench_gpu": {"exit": int(rc_bench), "seconds": int(s_bench),
                  "results": load(os.path.join(out, "bench.json")).get("results")},
}
tmp = os.path.join(out, ".report.json.tmp")
with open(tmp, "w") as f:
    json.dump(report, f, indent=1)
os.replace(tmp, os.path.join(out, "report.json"))
print(f"gpu-check: test_cuda exit {rc_test} ({s_test} s), validate-gpu exit {rc_val} ({s_val} s), "
      f"bench-gpu exit {rc_bench} ({s_bench} s); {out}/report.json")
PY
[ "$rc_test" -eq 0 ] && [ "$rc_val" -eq 0 ] && [ "$rc_bench" -eq 0 ] && exit 0
[ "$rc_test" -eq 77 ] && exit 2  # no device: the suite skipped
exit 1
