#!/usr/bin/env bash
# On a GPU machine (nvcc 13, cmake, compute-sanitizer; no network needed): configure and build
# loom into build-gpu (Release) with the CUDA backend, run the CUDA op tests, run them again
# under compute-sanitizer memcheck (small shapes), and print a summary table last.
# Exit status: 0 when every step passed, 1 when one failed, 2 when the machine lacks something
# the build needs (the script says what).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build-gpu
export PATH="$PATH:/usr/local/cuda/bin"
declare -a STEPS RESULTS TIMES

step() { # step NAME COMMAND...: runs it, records pass/fail and seconds
    local name=$1 t0=$SECONDS rc
    shift
    echo "=== $name: $*"
    "$@"
    rc=$?
    STEPS+=("$name")
    TIMES+=("$((SECONDS - t0))")
    case $rc in
    0) RESULTS+=("pass") ;;
    77) RESULTS+=("skipped (no CUDA device)") ;;
    *) RESULTS+=("FAIL (exit $rc)") ;;
    esac
    return $rc
}

summary() {
    echo
    printf '%-28s %-28s %s\n' "step" "result" "seconds"
    printf '%-28s %-28s %s\n' "----" "------" "-------"
    for i in "${!STEPS[@]}"; do printf '%-28s %-28s %s\n' "${STEPS[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}"; done
}

# ---- what the build needs: CUDA, and the CPU build's libraries (CMakeLists.txt) ----
missing=()
command -v nvcc >/dev/null || missing+=("nvcc (CUDA toolkit)")
command -v cmake >/dev/null || missing+=("cmake")
command -v compute-sanitizer >/dev/null || missing+=("compute-sanitizer")
[ -f /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so ] || missing+=("OpenBLAS, OpenMP flavour (libopenblas0-openmp + libopenblas-openmp-dev)")
[ -f /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ] || missing+=("cblas.h of OpenBLAS-openmp")
pkg-config --exists libpcre2-8 2>/dev/null || missing+=("PCRE2 (libpcre2-dev) or pkg-config")
pkg-config --exists libcjson 2>/dev/null || missing+=("cJSON (libcjson-dev)")
[ -f /usr/include/uthash.h ] || missing+=("uthash (uthash-dev)")
command -v mpicc >/dev/null || missing+=("MPI (libopenmpi-dev)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "device_gpu.sh: this machine cannot build loom; missing:"
    printf '  - %s\n' "${missing[@]}"
    echo "(the top-level CMakeLists.txt requires the CPU build's libraries even for the CUDA backend;"
    echo " this machine has no network, so they cannot be installed here)"
    STEPS+=("prerequisites"); RESULTS+=("MISSING ${#missing[@]}"); TIMES+=(0)
    summary
    exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

failed=0
step "configure" cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLOOM_DATA_DIR="$ROOT/data" ||
    { summary; exit 1; }
step "build" cmake --build "$BUILD" -j"$(nproc)" || { summary; exit 1; }
if [ ! -x "$BUILD/tests/test_cuda_backend" ]; then
    echo "device_gpu.sh: the CUDA backend was not built (did cmake find nvcc?)"
    STEPS+=("cuda backend built"); RESULTS+=("FAIL"); TIMES+=(0)
    summary
    exit 1
fi
step "cuda op tests" "$BUILD/tests/test_cuda_backend" || failed=1
step "cuda op tests (ctest)" ctest --test-dir "$BUILD" -L cuda --output-on-failure || failed=1
step "memcheck (small shapes)" env LOOM_CUDA_TEST_QUICK=1 compute-sanitizer --tool memcheck \
    --leak-check full --error-exitcode 99 "$BUILD/tests/test_cuda_backend" || failed=1
summary
exit $failed
