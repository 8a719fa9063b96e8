#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz (README.md there) under ASan + UBSan.
#   scripts/fuzz.sh [--ci | --time SECONDS | --runs N] [--jobs J] [--build DIR] [TARGET...]
# Sets up DIR (default build-fuzz: CXX=clang++, -Dfuzz=enabled, -O0, no tests, CLI or Python), builds
# only the targets and the library layers they link (`ninja fuzz`), and runs every target (or those
# named) for SECONDS each (default 60) or N inputs, J at a time (default 2), with -timeout,
# -rss_limit_mb, its seeds (the tree's, tests/fuzz/seeds/<t>/, tests/fuzz/regress/<t>/) and
# dictionary. The corpus grows in DIR/fuzz/corpus/<t>; findings land in DIR/fuzz/findings/<t>/.
# --ci (CI's bounded run): each target the input count tests/fuzz/ci-runs gives it, libFuzzer seed 1,
# from the seeds alone (a fresh corpus): how much CI fuzzes does not depend on the machine's speed
# (the mutations still drift a little between runs: coverage feedback sees the library's threads).
# Prints per target the inputs run, coverage (cov/ft, and what this run added), corpus
# size and any finding; exits 1 on a finding, 2 when it cannot build or run.
# Environment: CXX (default clang++), MANTIS_FUZZ_TIMEOUT (seconds per input, default 10),
# MANTIS_FUZZ_RSS_MB (default 2048).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
time_s=60 runs= ci= jobs=2 dir=build-fuzz targets=()
while (($#)); do
  case $1 in
    --ci) ci=1; runs=; shift ;;
    --time) time_s=$2; runs=; ci=; shift 2 ;;
    --runs) runs=$2; ci=; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --build) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(for f in tests/fuzz/fuzz_*.cpp; do f=${f#tests/fuzz/fuzz_}; printf '%s ' "${f%.cpp}"; done)
((${#targets[@]})) || read -ra targets <<<"$all"
for t in "${targets[@]}"; do
  [[ " $all " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (known: $all)" >&2; exit 2; }
  if [ -n "$ci" ] && ! awk -v t="$t" '$1 == t && $2 ~ /^[1-9][0-9]*$/ { f = 1 } END { exit !f }' tests/fuzz/ci-runs; then
    echo "fuzz.sh: tests/fuzz/ci-runs gives target '$t' no input count (a line '$t N')" >&2; exit 2
  fi
done

work=$dir/fuzz
# The targets' scratch directories (fuzz.h), removed at the end: a crash leaves its own behind.
scratch=$(mktemp -d "$([ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/mantis-fuzz.XXXXXX")
export MANTIS_FUZZ_SCRATCH=$scratch
trap 'rm -rf "$scratch"' EXIT
# "NAME ok" or "NAME finding" a line (scripts/test.sh counts them); "build failed" when it did not build.
results=$work/results.txt
failed() { echo "fuzz.sh: $1" >&2; mkdir -p "$work" && echo "build failed" >"$results"; exit 2; }
rm -f "$results"
built=$(date +%s)
if [ ! -f "$dir/build.ninja" ]; then
  CXX=${CXX:-clang++} meson setup "$dir" -Dfuzz=enabled -Dtests=disabled -Dcuda=disabled -Demulate_cuda=disabled -Dpython_module=disabled \
    -Doptimization=0 -Ddebug=false -Dcpp_args=-g1 >/dev/null || failed "meson setup $dir failed"
fi
ninja -C "$dir" -j"$jobs" fuzz >/dev/null || failed "build failed (ninja -C $dir fuzz)"
echo "fuzz: built $dir/tests/fuzz/mantis_fuzz in $(($(date +%s) - built)) s"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# One target: its seeds gathered into $work/seeds/<t> (the tree's by the patterns of
# tests/fuzz/seeds/<t>.seeds, copied so that libFuzzer reads one folder), then the run.
run_one() {
  local t=$1 seeds=$work/seeds/$1 corpus=$work/corpus/$1 found=$work/findings/$1 log=$work/logs/$1.log
  rm -rf "$seeds"
  mkdir -p "$seeds" "$corpus" "$found" "$work/logs"
  while read -r pat; do
    [[ -z $pat || $pat == \#* ]] && continue
    for f in $root/$pat; do [ -f "$f" ] && cp "$f" "$seeds/$(tr / _ <<<"${f#"$root"/}")"; done
  done <"tests/fuzz/seeds/$t.seeds"
  local args=(-timeout="${MANTIS_FUZZ_TIMEOUT:-10}" -rss_limit_mb="${MANTIS_FUZZ_RSS_MB:-2048}" -print_final_stats=1
              -artifact_prefix="$found/")
  [ -f "tests/fuzz/dict/$t.dict" ] && args+=(-dict="tests/fuzz/dict/$t.dict")
  if [ -n "$ci" ]; then
    corpus=$work/ci-corpus/$t  # fresh each time: the same inputs on every run
    rm -rf "$corpus" && mkdir -p "$corpus"
    args+=(-seed=1 -runs="$(awk -v t="$t" '$1 == t { print $2 }' tests/fuzz/ci-runs)")
  elif [ -n "$runs" ]; then args+=(-runs="$runs")
  else args+=(-max_total_time="$time_s"); fi
  local dirs=("$corpus" "$seeds")
  for d in "tests/fuzz/seeds/$t" "tests/fuzz/regress/$t"; do [ -d "$d" ] && dirs+=("$d"); done
  "$dir/tests/fuzz/mantis_fuzz" --target="$t" "${args[@]}" "${dirs[@]}" </dev/null >"$log" 2>&1
  echo $? >"$log.rc"
}

summary() {
  local t=$1 log=$work/logs/$1.log rc
  rc=$(cat "$log.rc" 2>/dev/null || echo 2)
  local inited done_ execs crash
  inited=$(grep -m1 -oE "INITED cov: [0-9]+ ft: [0-9]+" "$log" | grep -oE "[0-9]+" | tr '\n' ' ')
  done_=$(grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+" | tr '\n' ' ')
  execs=$(grep -oE "stat::number_of_executed_units: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+$")
  read -r c0 f0 <<<"$inited"
  read -r c1 f1 n1 <<<"$done_"
  printf '%-16s %9s inputs  cov %5s (+%s)  ft %6s (+%s)  corpus %5s' "$t" "${execs:-?}" "${c1:-?}" \
    "$(( ${c1:-0} - ${c0:-0} ))" "${f1:-?}" "$(( ${f1:-0} - ${f0:-0} ))" "${n1:-?}"
  crash=$(grep -oE "Test unit written to [^ ]+" "$log" | sed 's/Test unit written to //' | tr '\n' ' ')
  if [ "$rc" != 0 ] || [ -n "$crash" ]; then
    local what
    what=$(grep -m1 -oE "ERROR: [A-Za-z]+Sanitizer: [a-z-]+|runtime error: .*|deadly signal|out-of-memory[^)]*\)|ALARM: working on the last Unit for [0-9]+ seconds|uncaught exception|FINDING: .*" "$log")
    printf '  FINDING (exit %s): %s %s (log: %s)\n' "$rc" "${what:-see log}" "$crash" "$log"
    return 1
  fi
  printf '\n'
}

each="${time_s} s"
[ -n "$runs" ] && each="$runs inputs"
[ -n "$ci" ] && each="tests/fuzz/ci-runs' inputs"
start=$(date +%s)
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then wait -n; running=$((running - 1)); fi
done
wait
status=0
for t in "${targets[@]}"; do
  if summary "$t"; then echo "$t ok" >>"$results"; else status=1; echo "$t finding" >>"$results"; fi
done
echo "fuzz: ${#targets[@]} targets in $(($(date +%s) - start)) s ($each each, $jobs at a time): $([ $status = 0 ] && echo "no finding" || echo "FINDINGS")"
exit $status
