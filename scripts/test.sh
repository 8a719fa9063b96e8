#!/usr/bin/env bash
# Quick start, step 2: install what is missing, build, run the whole test suite.
#   1. the release build: every test (GPU tests report SKIP where there is no GPU; where nvcc is
#      missing, as in CI, the cuda suite runs on cuda-emu, src/cuda_emu/emu.h). In an emulated build
#      it also turns on -Demulate_cuda_tsan: the kernels and the emulator once more under
#      ThreadSanitizer, linked with the uninstrumented CPU code (tests cuda_tsan, cuda_emu_tsan);
#   2. an AddressSanitizer + UndefinedBehaviorSanitizer build (-O1: it compiles in about half the
#      time of -O2; -g1: line tables for the reports' stack traces without full debug info, which
#      halves the compile again) of the CPU tests at reduced sample counts (MANTIS_TEST_SCALE),
#      linked -no-pie: UBSan's per-check data made the PIE CLI 5.3 million run-time relocations,
#      0.8 s of start-up for every one of the thousands of CLI runs the tests make (0.33 s without);
#      cuda-emu is in it where nvcc is missing (device buffers and fiber stacks under AddressSanitizer);
#   3. the fuzz targets (tests/fuzz) with clang's libFuzzer under ASan + UBSan, a bounded run
#      (scripts/fuzz.sh --ci: a fixed input count a target, two at a time, in build-fuzz; about 4 min
#      to build, 1 to run).
# Prints "N passed, N failed, N skipped" and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
# Each tier's wall time (build and tests), printed at the end: CI's budget is kept per tier.
t0=$(date +%s) times=()
lap() { local t; t=$(date +%s); times+=("$1 $((t - t0)) s"); t0=$t; }
scripts/setup.sh build || exit 2
# What only the tests need: a single-node Slurm (tests/run_slurm.sh starts it on localhost); clang and
# its libFuzzer / sanitizer runtimes (the fuzz tier, scripts/fuzz.sh).
if ! dpkg -s slurm-wlm munge clang libclang-rt-14-dev >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge \
    clang libclang-rt-14-dev >/dev/null || exit 2
fi
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if grep -q '#define MANTIS_CUDA_EMU 1' build/mantis_config.h; then
  meson configure build -Demulate_cuda_tsan=true >/dev/null && ninja -C build >/dev/null || exit 2
fi
lap "release build"
meson test -C build --print-errorlogs --num-processes 2
rc1=$?
lap "release tests"
if [ "${MANTIS_SKIP_SANITIZE:-0}" != 1 ]; then
  scripts/setup.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dpython_module=disabled \
    -Doptimization=1 -Ddebug=false -Dcpp_args=-g1 -Dcpp_link_args=-no-pie || exit 2
  lap "sanitizer build"
  MANTIS_TEST_SCALE=0.02 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ASAN_OPTIONS=detect_leaks=1 meson test -C build-asan --print-errorlogs --num-processes 2
  rc2=$?
  lap "sanitizer tests"
else
  rc2=0
fi
rc3=0 fuzz_dir=()
if [ "${MANTIS_SKIP_FUZZ:-0}" != 1 ]; then
  scripts/fuzz.sh --ci
  rc3=$? fuzz_dir=(build-fuzz)
  lap "fuzz build and run"
fi
for t in "${times[@]}"; do echo "time: $t"; done
python3 - build build-asan "${fuzz_dir[@]}" <<'PY'
import json, os, sys
p = f = s = 0
for d in sys.argv[1:]:
    # scripts/fuzz.sh: a line per target, "NAME ok" or "NAME finding"
    results = os.path.join(d, 'fuzz', 'results.txt')
    if os.path.exists(results):
        for line in open(results):
            name, st = line.split()
            if st == 'ok': p += 1
            else:
                f += 1
                print(f"FAILED: {d}: fuzz {name} ({st})")
    log = os.path.join(d, 'meson-logs', 'testlog.json')
    if not os.path.exists(log):
        continue
    for line in open(log):
        r = json.loads(line)
        st = r.get('result')
        if st == 'OK': p += 1
        elif st in ('SKIP',): s += 1
        else: f += 1
        if st not in ('OK', 'SKIP'):
            print(f"FAILED: {d}: {r.get('name')} ({st})")
print(f"{p} passed, {f} failed, {s} skipped")
PY
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ]
