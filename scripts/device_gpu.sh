#!/usr/bin/env bash
# On a GPU machine (nvcc 13, cmake, compute-sanitizer; no network needed): configure and build
# loom into build-gpu (Release) with the CUDA backend, run the CUDA tests (every op against the
# CPU; the PyTorch model fixtures in fp32 and bf16; the whole model, tiny and gpt2, against the
# CPU; bf16 training killed and resumed against the whole run), compute-sanitizer (memcheck on the op tests' small shapes and on the model fixtures in
# fp32 and bf16, racecheck on the op tests' small shapes and on gemm_fp8.cu's kernel alone), with --bench the
# training benchmarks beside the PyTorch peer (scripts/bench_gpu.sh) and the attention
# benchmarks beside PyTorch's SDPA (joined with ratios by bench/peer/attention_ratio.py), with
# --tp tensor parallelism's CUDA path with ranks sharing the GPU (scripts/tp_gpu.sh), with --pp
# pipeline parallelism's (scripts/pp_gpu.sh), with --fsdp ZeRO 3's and the offloaded optimizer's
# (scripts/fsdp_gpu.sh), with --cp context parallelism's (scripts/cp_gpu.sh), with --graphs
# --cuda-graphs against launching op by op (scripts/graphs_gpu.sh), with --fp8 --precision fp8's
# products, loss curve and speed against bf16 (scripts/fp8_gpu.sh), with --attention the Hopper
# attention kernels' machine code and speed beside PyTorch's (scripts/attention_gpu.sh), with
# --multi (on a machine with 2 or more GPUs) every layout over NCCL and the scaling beside PyTorch (scripts/multi_gpu.sh),
# and print a summary table last (with --bench or a layout's flag, their tables after it).
# LOOM_SKIP_SANITIZERS=1 leaves out the compute-sanitizer steps.
#   scripts/fetch_device_deps.sh            (here, first: the Debian packages the GPU image lacks)
#   device run, carry [".deps"]: bash scripts/device_gpu.sh [--bench | --tp | --pp | --fsdp | --cp | --graphs | --fp8 | --attention | --multi | --build-only]
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
# The GPU image lacks some Debian libraries: unpack the carried packages (.deps) and search there.
DEPS_ARGS=()
if [ -d "$ROOT/.deps" ]; then
    DEPS=/tmp/loom_deps
    mkdir -p "$DEPS"
    for deb in "$ROOT"/.deps/*.deb; do dpkg -x "$deb" "$DEPS"; done
    DEPS_ARGS=(-DLOOM_DEPS_ROOT="$DEPS")
    export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:$DEPS/usr/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}"
    export PKG_CONFIG_SYSROOT_DIR="$DEPS" PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
fi
LIBROOT=${DEPS:-}
missing=()
command -v nvcc >/dev/null || missing+=("nvcc (CUDA toolkit)")
command -v cmake >/dev/null || missing+=("cmake")
command -v compute-sanitizer >/dev/null || missing+=("compute-sanitizer")
[ -f "$LIBROOT"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so ] || missing+=("OpenBLAS, OpenMP flavour (libopenblas0-openmp + libopenblas-openmp-dev)")
[ -f "$LIBROOT"/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ] || missing+=("cblas.h of OpenBLAS-openmp")
pkg-config --exists libpcre2-8 2>/dev/null || missing+=("PCRE2 (libpcre2-dev) or pkg-config")
pkg-config --exists libcjson 2>/dev/null || missing+=("cJSON (libcjson-dev)")
pkg-config --exists libprotobuf-c 2>/dev/null || missing+=("protobuf-c (libprotobuf-c-dev)")
pkg-config --exists libisal 2>/dev/null || missing+=("ISA-L (libisal-dev)")
command -v protoc-c >/dev/null || [ -x "$LIBROOT"/usr/bin/protoc-c ] || missing+=("protoc-c (protobuf-c-compiler)")
[ -f "$LIBROOT"/usr/include/uthash.h ] || missing+=("uthash (uthash-dev)")
[ -f "$LIBROOT"/usr/include/zlib.h ] || [ -f /usr/include/zlib.h ] || missing+=("zlib (zlib1g-dev)")
command -v mpicc >/dev/null || missing+=("MPI (libopenmpi-dev)")
if [ ${#missing[@]} -gt 0 ]; then
    echo "device_gpu.sh: this machine cannot build loom; missing:"
    printf '  - %s\n' "${missing[@]}"
    echo "(run scripts/fetch_device_deps.sh on the development machine and carry .deps)"
    STEPS+=("prerequisites"); RESULTS+=("MISSING ${#missing[@]}"); TIMES+=(0)
    summary
    exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# racecheck_only TEST LOG REGEX: test_TEST's small shapes under racecheck, passing when every
# hazard reported lies where REGEX says. cuda_fp8: in cuBLASLt's own Hopper FP8 kernels
# (nvjet_sm90_*, closed: 320 in one product on an H100, 2026-11-25), none in loom's (leaving them
# out with --kernel-name-exclude makes the sanitizer fail on a hardware exception instead; with the
# 580 drivers it fails so at the first case whatever is filtered, 2026-11-27: then the step fails,
# and racecheck of gemm_fp8.cu's kernel alone, sanitize_gemm_fp8 below, still runs).
racecheck_only() {
    env LOOM_CUDA_TEST_QUICK=1 timeout 150 compute-sanitizer --tool racecheck "$BUILD/tests/test_$1" >"$2" 2>&1 ||
        { tail -3 "$2"; return 1; }
    grep -E "access at" "$2" | grep -vE "$3" && return 1
    grep -E "RACECHECK SUMMARY" "$2"
}

failed=0
step "configure" cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLOOM_DATA_DIR="$ROOT/data" "${DEPS_ARGS[@]}" ||
    { summary; exit 1; }
step "build" cmake --build "$BUILD" -j"$(nproc)" || { summary; exit 1; }
if [ ! -x "$BUILD/tests/test_cuda_backend" ]; then
    echo "device_gpu.sh: the CUDA backend was not built (did cmake find nvcc?)"
    STEPS+=("cuda backend built"); RESULTS+=("FAIL"); TIMES+=(0)
    summary
    exit 1
fi
[ "${1:-}" = "--build-only" ] && { summary; exit 0; }
step "cuda op tests" "$BUILD/tests/test_cuda_backend" || failed=1
step "cuda attention tests (blocks at offsets, merge)" "$BUILD/tests/test_cuda_attention" || failed=1
step "cuda fp8 tests (products)" "$BUILD/tests/test_cuda_fp8" || failed=1
step "cuda ctest (fixtures, staged comm, resume)" ctest --test-dir "$BUILD" -L cuda -E 'cuda_backend|cuda_attention|cuda_fp8|gpt2_devices' \
    --output-on-failure || failed=1
step "gpt2 GPU vs CPU" "$BUILD/tests/test_gpt2_devices" || failed=1
if [ -z "${LOOM_SKIP_SANITIZERS:-}" ]; then
    for t in cuda_backend cuda_attention cuda_fp8; do
        step "memcheck ($t, small shapes)" env LOOM_CUDA_TEST_QUICK=1 compute-sanitizer --tool memcheck \
            --leak-check full --error-exitcode 99 "$BUILD/tests/test_$t" || failed=1
    done
    for precision in fp32 bf16; do # the whole model: forward, backward, AdamW steps
        step "memcheck (fixtures, $precision)" compute-sanitizer --tool memcheck --leak-check full \
            --error-exitcode 99 "$BUILD/tests/test_gpt2_fixture" "$ROOT/tests/fixtures" cuda $precision || failed=1
    done
    for t in cuda_backend cuda_attention; do
        step "racecheck ($t, small shapes)" env LOOM_CUDA_TEST_QUICK=1 timeout 150 compute-sanitizer \
            --tool racecheck --error-exitcode 99 "$BUILD/tests/test_$t" || failed=1
    done
    step "racecheck (cuda_fp8, small shapes)" racecheck_only cuda_fp8 "${OUT:-/tmp}/racecheck_fp8.txt" nvjet || failed=1
    step "racecheck (gemm_fp8.cu's kernel alone)" timeout 150 compute-sanitizer --tool racecheck --error-exitcode 99 \
        "$BUILD/tests/sanitize_gemm_fp8" || failed=1
fi
case "${1:-}" in # a parallel layout's checks with ranks sharing the GPU: scripts/<layout>_gpu.sh
    --tp) layout="tensor parallel" ;;
    --pp) layout="pipeline parallel" ;;
    --fsdp) layout="ZeRO 3 / offload" ;;
    --cp) layout="context parallel" ;;
    --graphs) layout="CUDA graphs" ;;
    --fp8) layout="precision fp8" ;;
    --attention) layout="Hopper attention" ;;
    --multi) layout="several GPUs over NCCL" ;;
    *) layout="" ;;
esac
if [ -n "$layout" ]; then
    OUTDIR=${OUT:-/tmp}
    script=${1#--}_gpu
    step "$layout on the GPU" sh -c "bash '$ROOT/scripts/$script.sh' > '$OUTDIR/$script.txt' 2>&1" || failed=1
fi
if [ "${1:-}" = "--bench" ]; then # loom beside the PyTorch peers on the same GPU
    OUTDIR=${OUT:-/tmp}
    step "bench gpt2 (loom, pytorch)" sh -c "bash '$ROOT/scripts/bench_gpu.sh' | tee '$OUTDIR/bench_gpt2.md'" || failed=1
    step "bench loom attention" sh -c "'$BUILD/bench/bench_attention' | tee '$OUTDIR/bench_loom_attention.md'" || failed=1
    step "bench pytorch attention" sh -c "python3 '$ROOT/bench/peer/attention_torch.py' | tee '$OUTDIR/bench_torch_attention.md'" ||
        failed=1
fi
summary
if [ -n "$layout" ]; then
    echo; sed -n '/^| check/,$p' "$OUTDIR/$script.txt"
fi
if [ "${1:-}" = "--bench" ]; then
    echo; cat "$OUTDIR/bench_gpt2.md"
    echo; python3 "$ROOT/bench/peer/attention_ratio.py" "$OUTDIR/bench_loom_attention.md" "$OUTDIR/bench_torch_attention.md"
fi
exit $failed
