#!/usr/bin/env bash
# The GPU check: the tensor-core probe (`mantis probe-tensor-cores`: the measured test vectors of
# tests/data/tensor_core through this GPU, against every matrix-unit preset), the CUDA test suite,
# `mantis validate-gpu` (every contract) and `mantis bench-gpu`, gathered into one JSON report. Sized for a short GPU window (well under 5 minutes on one H100/H200
# with a prebuilt bundle).
#
#   scripts/gpu-check.sh --bundle      on the build machine (nvcc on PATH): builds the two programs
#                                      portably in build-gpu/ and copies them, with the shared
#                                      libraries a bare CUDA image lacks, into gpu-bundle/ (about
#                                      30 MB: carry that folder to the GPU machine)
#   scripts/gpu-check.sh [OUT]         on the GPU machine: runs everything from gpu-bundle/ (or from
#                                      build/, built here first when missing and meson is available),
#                                      writes OUT/report.json (default OUT: gpu-check/) and the logs
# The device tool carries the working tree, at most 64 MiB, and the tracked tree alone is about
# 80 MB (models/, data/, experiments/): none of those three is needed here, so move them out of
# the checkout for the call (mv models data experiments /tmp/aside/) and back after it.
# The bundle needs glibc ≥ 2.34 and libstdc++ of gcc ≥ 11 on the GPU machine.
# Exit status: 0 all passed; 1 a test or contract failed; 2 nothing to run (no binaries, no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

# The CUDA runtime and cuBLAS come from the GPU machine's CUDA installation (too large to carry):
# its usual places, searched once.
cuda_libs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
           /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libcublas.so.13" ] && { echo "$d"; return; }
  done
  find / -xdev -name 'libcublas.so.13' -printf '%h\n' 2>/dev/null | head -1
}

if [ "${1:-}" = "--bundle" ]; then
  # A portable build (-Dnative=false: the GPU machine's CPU may lack this one's instructions) of the
  # two programs, and the shared libraries a bare CUDA image lacks (not the C/C++ runtimes, the
  # CUDA runtime, cuBLAS or the driver: the image has those).
  [ -f build-gpu/build.ninja ] || meson setup build-gpu -Dnative=false -Dcuda=enabled >/dev/null || exit 2
  ninja -C build-gpu src/cli/mantis tests/test_cuda >/dev/null || { echo "gpu-check: the build failed" >&2; exit 2; }
  rm -rf gpu-bundle && mkdir -p gpu-bundle/lib
  cp build-gpu/src/cli/mantis build-gpu/tests/test_cuda gpu-bundle/
  ldd build-gpu/src/cli/mantis build-gpu/tests/test_cuda | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so' |
    xargs -r cp -L -t gpu-bundle/lib/
  git rev-parse HEAD > gpu-bundle/commit 2>/dev/null || echo unknown > gpu-bundle/commit
  du -sh gpu-bundle >&2
  exit 0
fi

out=${1:-gpu-check}
mkdir -p "$out"
if [ -x gpu-bundle/mantis ]; then
  mantis=gpu-bundle/mantis; test_cuda=gpu-bundle/test_cuda
  libs="$PWD/gpu-bundle/lib:$(cuda_libs)"
  commit=$(cat gpu-bundle/commit)
else
  if [ ! -x build/src/cli/mantis ] && command -v meson >/dev/null; then
    meson setup build >/dev/null && ninja -C build >/dev/null || { echo "gpu-check: the build failed" >&2; exit 2; }
  fi
  [ -x build/src/cli/mantis ] || { echo "gpu-check: no gpu-bundle/ and no build/ (run --bundle where it builds)" >&2; exit 2; }
  mantis=build/src/cli/mantis; test_cuda=build/tests/test_cuda
  libs=""
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"; } \
  > "$out/nvidia-smi.txt" 2>&1

tp=$(date +%s)
# 0. the tensor-core probe: the presets on this GPU's silicon (tests/data/tensor_core travels with the tree)
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 300 "$mantis" probe-tensor-cores --data tests/data/tensor_core --json > "$out/probe.json" 2> "$out/probe.log"; rc_probe=$?
t0=$(date +%s)
# 1. the cuda suite (what `meson test --suite cuda` runs)
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 600 "$test_cuda" --durations yes > "$out/test_cuda.log" 2>&1; rc_test=$?
t1=$(date +%s)
# 2. every contract at full size
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 900 "$mantis" validate-gpu --out "$out/validate" > "$out/validate.log" 2>&1; rc_val=$?
t2=$(date +%s)
# 3. the benchmarks
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 600 "$mantis" bench-gpu --json > "$out/bench.json" 2> "$out/bench.log"; rc_bench=$?
t3=$(date +%s)

python3 - "$out" "$commit" "$rc_test" "$rc_val" "$rc_bench" "$((t1 - t0))" "$((t2 - t1))" "$((t3 - t2))" \
  "$rc_probe" "$((t0 - tp))" <<'PY'
import json, os, sys
out, commit, rc_test, rc_val, rc_bench, s_test, s_val, s_bench, rc_probe, s_probe = sys.argv[1:]
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception as e:
        return {"error": f"{p}: {e}"}
report = {
    "commit": commit,
    "device": open(os.path.join(out, "nvidia-smi.txt")).read().strip(),
    "probe_tensor_cores": {"exit": int(rc_probe), "seconds": int(s_probe),
                           "results": load(os.path.join(out, "probe.json")).get("results")},
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
print(f"gpu-check: probe-tensor-cores exit {rc_probe} ({s_probe} s), test_cuda exit {rc_test} ({s_test} s), validate-gpu exit {rc_val} ({s_val} s), "
      f"bench-gpu exit {rc_bench} ({s_bench} s); {out}/report.json")
PY
[ "$rc_probe" -eq 0 ] && [ "$rc_test" -eq 0 ] && [ "$rc_val" -eq 0 ] && [ "$rc_bench" -eq 0 ] && exit 0
[ "$rc_test" -eq 77 ] && exit 2  # no device: the suite skipped
exit 1
