# Shared by scripts/tp_gpu.sh, pp_gpu.sh, fsdp_gpu.sh, cp_gpu.sh, graphs_gpu.sh and multi_gpu.sh (sourced, with NAME set): build-gpu's loom,
# the fixtures, a scratch folder, mpirun with ranks sharing the GPU, and the table of checks.
# DEVICE_COMM=nccl (scripts/multi_gpu.sh): the layouts' collectives over NCCL, one GPU per rank.
# LAYOUT_TIMEOUT: seconds a layout's run may take (300).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build-gpu
LOOM=$BUILD/loom
FIX=$ROOT/tests/fixtures
WORK=$(mktemp -d "/tmp/loom_${NAME}_XXXXXX")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
declare -a ROWS
failed=0
# row NAME RESULT: a row of the final table, also printed at once (a run cut short by its time
# limit still shows what it measured)
row() { ROWS+=("$(printf '| %-46s | %-60s |' "$1" "$2")"); echo "row: ${ROWS[-1]}"; }
# ran NAME LOG COMMAND...: runs COMMAND with its output in LOG; when it fails, marks the checks
# failed with a row NAME "FAIL: <the log's first error line>" and returns non-zero
ran() {
    local name=$1 log=$2
    shift 2
    "$@" >"$log" 2>&1 && return 0
    failed=1
    row "$name" "FAIL: $(grep -m1 -i 'error' "$log")"
    return 1
}
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
# bench_row LOG: the first row of a `loom bench` table in LOG (a GPU's, with its MFU column) as
# "STEP_MS TOKENS_PER_S MFU PEAK UNIT"
bench_row() { awk -F'|' '/^\| *[0-9]/ {print $2, $6, $10, $(NF-1); exit}' "$1"; }
# worst RUN REF: the largest loss difference of metrics file RUN from REF's, and RUN's last loss
worst() { paste <(losses "$1") <(losses "$2") |
          awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d; l = $1 } END { printf "max |loss - cpu fp32| %.4f, last loss %.4f", w, l }'; }
# fp32_vs_cpu "NP FLAGS"...: `loom train "${ARGS[@]}"` in one CPU process (one thread), then
# with each layout's NP ranks sharing the GPU in fp32 (collectives staged over MPI): a row each
# with the largest relative loss difference from the CPU run (bound 1e-5); the pipeline report
# lines of each log are echoed
fp32_vs_cpu() {
    local np flags name result
    "$LOOM" train "${ARGS[@]}" --device cpu --threads 1 --metrics "$WORK/cpu.jsonl" >"$WORK/cpu.log" 2>&1 ||
        { failed=1; row "fp32 reference" "FAIL: the CPU run: $(tail -1 "$WORK/cpu.log")"; }
    for layout in "$@"; do
        read -r np flags <<<"$layout"
        name=$(echo "$np$flags" | tr -d ' -')
        # shellcheck disable=SC2086
        if ran "fp32 cuda, $np ranks $flags" "$WORK/$name.log" timeout "${LAYOUT_TIMEOUT:-300}" mpirun -np "$np" "$LOOM" train "${ARGS[@]}" \
            $flags --device cuda --precision fp32 --device-comm "${DEVICE_COMM:-mpi}" --metrics "$WORK/$name.jsonl"; then
            result=$(paste <(losses "$WORK/$name.jsonl") <(losses "$WORK/cpu.jsonl") |
                awk '{ d = $1 - $2; if (d < 0) d = -d; e = d / $2; if (e > w) w = e; n++ }
                     END { printf "%d steps, max rel loss err %.3g", n, w }')
            awk -v w="${result##* }" 'BEGIN { exit !(w <= 1e-5) }' || { failed=1; result="FAIL $result"; }
            row "fp32 cuda vs cpu, $np ranks $flags" "$result"
        fi
        grep -E "pipeline|rank [0-9]:" "$WORK/$name.log"
    done
}

# bf16_curves G "NP FLAGS"...: gpt2-mini 50 steps (fixture shard, B=4 T=64, global batch G) on the
# CPU in fp32, then in bf16 on one GPU and with each layout's NP ranks sharing the GPU: a row with
# each one's largest loss difference from the fp32 CPU run (one GPU's is the bf16 noise the others
# should match)
bf16_curves() {
    local G=$1 np flags name
    shift
    local args=(--model gpt2-mini --train-data "$FIX/gpt2_eval_shard.bin" --seq 64 --batch 4 --global-batch "$G"
                --steps 50 --lr 1e-3 --warmup 5 --seed 3)
    "$LOOM" train "${args[@]}" --device cpu --metrics "$WORK/bf16_ref.jsonl" >"$WORK/bf16_ref.log" 2>&1 ||
        { failed=1; row "bf16 curves" "FAIL: the CPU run: $(tail -1 "$WORK/bf16_ref.log")"; }
    "$LOOM" train "${args[@]}" --device cuda --precision bf16 --metrics "$WORK/gpu1.jsonl" >"$WORK/gpu1.log" 2>&1 &&
        row "bf16 cuda, 1 rank, 50 steps" "$(worst "$WORK/gpu1.jsonl" "$WORK/bf16_ref.jsonl")" ||
        { failed=1; row "bf16 cuda 1 rank" "FAIL"; }
    for layout in "$@"; do
        read -r np flags <<<"$layout"
        name=bf16_$(echo "$np$flags" | tr -d ' -')
        # shellcheck disable=SC2086
        ran "bf16 cuda, $np ranks $flags" "$WORK/$name.log" timeout "${LAYOUT_TIMEOUT:-300}" mpirun -np "$np" "$LOOM" train "${args[@]}" \
            $flags --device cuda --precision bf16 --device-comm "${DEVICE_COMM:-mpi}" --metrics "$WORK/$name.jsonl" &&
            row "bf16 cuda, $np ranks $flags, 50 steps" "$(worst "$WORK/$name.jsonl" "$WORK/bf16_ref.jsonl")"
        grep -E "mesh|memory|peak|pipeline" "$WORK/$name.log"
    done
}

# The table of checks; removes the scratch folder (unless KEEP_WORK is set) and exits 1 when a
# check failed.
finish() {
    echo
    printf '| %-46s | %-60s |\n' "check" "result"
    printf '|%s|%s|\n' "$(printf -- '-%.0s' {1..48})" "$(printf -- '-%.0s' {1..62})"
    printf '%s\n' "${ROWS[@]}"
    [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
    exit $failed
}
