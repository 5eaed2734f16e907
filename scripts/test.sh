#!/usr/bin/env bash
# `make test`: the whole test suite, as CI runs it on a fresh Debian machine (2 cores, no GPU).
#   1. set-up and the Release build (scripts/setup.sh), then ctest in build/
#   2. the same ctest suite built with ASan + UBSan (scripts/sanitize.sh, build-asan/; the three
#      longest parity scripts run one layout of each kind there: LOOM_QUICK)
#   3. each libFuzzer target for LOOM_FUZZ_SECONDS (default 20) from its seed corpus, after
#      replaying its committed regression inputs (scripts/fuzz.sh, build-fuzz/)
# Stops at the first phase that fails; prints each phase's time last.
set -euo pipefail
cd "$(dirname "$0")/.."
times=()
phase() {
  local name=$1 t0=$SECONDS; shift
  echo "==== test: $name"
  "$@"
  times+=("$(printf '%-34s %5d s' "$name" $((SECONDS - t0)))")
}
phase "build (scripts/setup.sh)" bash scripts/setup.sh
phase "ctest (build/)" bash -c 'cd build && ctest --output-on-failure -j"$(nproc)"'
phase "ctest, ASan + UBSan (build-asan/)" bash scripts/sanitize.sh
phase "fuzz regressions" bash scripts/fuzz.sh --regress
phase "fuzz, ${LOOM_FUZZ_SECONDS:-20} s per target" bash scripts/fuzz.sh "${LOOM_FUZZ_SECONDS:-20}"
echo "==== test: all phases passed"
printf '%s\n' "${times[@]}"
