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
#   scripts/gpu-check.sh --emulated [OUT]
#                                      the same report from an emulated build's build/ (no nvcc:
#                                      cuda-emu, src/cuda_emu/emu.h), on any x86-64 machine: the same
#                                      kernels on the CPU, validate-gpu at MANTIS_GPU_CHECK_SCALE
#                                      (default 0.02; a real GPU runs 1), no benchmark (speed is not
#                                      emulated); "emulated": true in the report (default OUT:
#                                      gpu-check-emu/)
#   scripts/gpu-check.sh --compare A/report.json B/report.json
#                                      two reports (a GPU's and the emulated one) contract by contract:
#                                      each contract's verdict and counts on both sides, and where the
#                                      verdicts differ; exit 1 when they do
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

if [ "${1:-}" = "--compare" ]; then
  [ $# -eq 3 ] || { echo "gpu-check: --compare A/report.json B/report.json" >&2; exit 2; }
  exec python3 - "$2" "$3" <<'PY'
import json, sys
def load(p):
    try:
        with open(p) as f:
            r = json.load(f)
        cs = {c["contract"]: {"ok": bool(c["ok"]), "cases": c["cases"], "mismatches": c["mismatches"]}
              for c in (r.get("validate_gpu", {}).get("results") or [])}
        if not cs:  # validate-gpu did not run there: nothing to compare is not agreement
            raise ValueError("no validate-gpu results")
        return r, cs
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        print(f"gpu-check --compare: {p}: not a gpu-check report ({e})", file=sys.stderr)
        sys.exit(2)
(ra, a), (rb, b) = load(sys.argv[1]), load(sys.argv[2])
for name, r in (("A", ra), ("B", rb)):
    print(f"{name}: {r.get('device', '?')} (commit {r.get('commit', '?')}, emulated {r.get('emulated', False)}, "
          f"validate-gpu scale {r.get('validate_gpu', {}).get('scale', '?')})")
def side(c):
    if c is None:
        return "absent"
    return f"{'ok' if c['ok'] else 'FAILED'} {c['cases']} cases {c['mismatches']} mismatches"
differ = 0
print(f"{'contract':32} {'A':40} {'B':40}")
for name in sorted(set(a) | set(b)):
    ca, cb = a.get(name), b.get(name)
    same = ca is not None and cb is not None and ca["ok"] == cb["ok"]
    differ += not same
    print(f"{name:32} {side(ca):40} {side(cb):40}{'' if same else '  <- differs'}")
for key in ("probe_tensor_cores", "test_cuda", "bench_gpu"):
    print(f"{key}: A exit {ra.get(key, {}).get('exit')}, B exit {rb.get(key, {}).get('exit')}")
print(f"{len(set(a) | set(b))} contracts, {differ} with different verdicts")
sys.exit(1 if differ else 0)
PY
fi

emulated=0
if [ "${1:-}" = "--emulated" ]; then emulated=1; shift; fi
out=${1:-$([ $emulated = 1 ] && echo gpu-check-emu || echo gpu-check)}
mkdir -p "$out"
scale=1
if [ $emulated = 1 ]; then
  # cuda-emu runs the kernels of an emulated build (meson chose it where nvcc is missing)
  scale=${MANTIS_GPU_CHECK_SCALE:-0.02}
  if [ ! -x build/src/cli/mantis ] && command -v meson >/dev/null; then
    meson setup build -Dcuda=disabled >/dev/null && ninja -C build >/dev/null || { echo "gpu-check: the build failed" >&2; exit 2; }
  fi
  [ -x build/src/cli/mantis ] || { echo "gpu-check: --emulated needs build/ (an emulated build)" >&2; exit 2; }
  mantis=build/src/cli/mantis; test_cuda=build/tests/test_cuda
  libs=""
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  grep -q '#define MANTIS_CUDA_EMU 1' build/mantis_config.h ||
    { echo "gpu-check: build/ is not an emulated build (configure it with -Dcuda=disabled, or where nvcc is missing)" >&2; exit 2; }
elif [ -x gpu-bundle/mantis ]; then
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
if [ $emulated = 1 ]; then
  echo "cuda-emu (the CUDA kernels emulated on the CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))" \
    > "$out/nvidia-smi.txt"
else
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"; } \
    > "$out/nvidia-smi.txt" 2>&1
fi
device=$([ $emulated = 1 ] && echo cuda-emu || echo cuda)

tp=$(date +%s)
# 0. the tensor-core probe: the presets on this GPU's silicon (tests/data/tensor_core travels with the tree)
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 300 "$mantis" probe-tensor-cores --data tests/data/tensor_core --json > "$out/probe.json" 2> "$out/probe.log"; rc_probe=$?
t0=$(date +%s)
# 1. the cuda suite (what `meson test --suite cuda` runs)
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 600 "$test_cuda" --durations yes > "$out/test_cuda.log" 2>&1; rc_test=$?
t1=$(date +%s)
# 2. every contract at full size
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 900 "$mantis" validate-gpu --device $device --scale $scale --out "$out/validate" > "$out/validate.log" 2>&1; rc_val=$?
t2=$(date +%s)
# 3. the benchmarks (not emulated: speed is what cuda-emu cannot show)
if [ $emulated = 1 ]; then
  echo '{"results": null, "skipped": "cuda-emu: speed is not emulated"}' > "$out/bench.json"; rc_bench=0
else
  LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 600 "$mantis" bench-gpu --json > "$out/bench.json" 2> "$out/bench.log"; rc_bench=$?
fi
t3=$(date +%s)

python3 - "$out" "$commit" "$rc_test" "$rc_val" "$rc_bench" "$((t1 - t0))" "$((t2 - t1))" "$((t3 - t2))" \
  "$rc_probe" "$((t0 - tp))" "$emulated" "$scale" <<'PY'
import json, os, sys
out, commit, rc_test, rc_val, rc_bench, s_test, s_val, s_bench, rc_probe, s_probe, emulated, scale = sys.argv[1:]
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception as e:
        return {"error": f"{p}: {e}"}
report = {
    "commit": commit,
    "device": open(os.path.join(out, "nvidia-smi.txt")).read().strip(),
    "emulated": emulated == "1",
    "probe_tensor_cores": {"exit": int(rc_probe), "seconds": int(s_probe),
                           "results": load(os.path.join(out, "probe.json")).get("results")},
    "test_cuda": {"exit": int(rc_test), "seconds": int(s_test),
                  "tail": open(os.path.join(out, "test_cuda.log")).read()[-2000:]},
    "validate_gpu": {"exit": int(rc_val), "seconds": int(s_val), "scale": float(scale),
                     "results": load(os.path.join(out, "validate", "results.json")).get("results")},
    "bench_gpu": {"exit": int(rc_bench), "seconds": int(s_bench),
                  "results": load(os.path.join(out, "bench.json")).get("results"),
                  "skipped": load(os.path.join(out, "bench.json")).get("skipped")},
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
