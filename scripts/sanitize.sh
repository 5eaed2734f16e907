#!/usr/bin/env bash
# The ctest suite once more with AddressSanitizer + UndefinedBehaviorSanitizer (gcc, CPU build),
# in build-asan (never build/). Any sanitizer report fails the test that produced it: UBSan
# halts on the first error, ASan on any memory error. Leak checking is off: Open MPI's
# one-time allocations are not loom's (run one command with ASAN_OPTIONS=detect_leaks=1 to
# look at loom's own). Used by `make test` after the normal suite (scripts/test.sh).
#   scripts/sanitize.sh [CTEST ARGS...]    e.g. scripts/sanitize.sh -R fsdp
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-asan
if [ ! -f $BUILD/CMakeCache.txt ]; then
  cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=ON -DLOOM_CUDA=OFF >/dev/null
fi
cmake --build $BUILD -j"$(nproc)" >$BUILD/build.log 2>&1 || { tail -40 $BUILD/build.log; exit 1; }
# the parity scripts' quick subset (tests/parallel/train_lib.sh: one layout of each kind; the
# Release pass runs them all), so the three passes of make test fit CI's 20 minutes
export LOOM_QUICK=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd $BUILD && ctest --output-on-failure -j"$(nproc)" "$@"
