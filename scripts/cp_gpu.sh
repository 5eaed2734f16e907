#!/usr/bin/env bash
# Context parallelism on a one-GPU machine, after scripts/device_gpu.sh has built build-gpu (it
# calls this with --cp). The ranks of a layout share the GPU, their keys/values, gradients and
# collectives staged through host memory over MPI (--device-comm mpi).
#   1. fp32: `loom train` of a fresh 4-layer model, 10 steps of a global batch of 16, with ring
#      cp 2 and cp 4, Ulysses cp 2, and ring cp 2 x tp 2 --sp, on cuda, against the one-process CPU
#      run: the largest relative loss difference (bound 1e-5)
#   2. bf16: gpt2-mini 50 steps with ring cp 2 and Ulysses cp 2 beside one process on the GPU, each
#      against the fp32 CPU run
#   3. long sequences, bf16: gpt2's shape (L=12, NH=12, C=768) fresh with --max-seq T, B=1, 2 steps
#      of `loom train` on the fixture shard repeated (a glob over copies of it): for T = 4K, 8K,
#      16K, 32K the activation memory per rank (the plan) and the measured peak, on one rank and with
#      ring cp 2 and cp 4 sharing the GPU; then the longest T (doubling from 32K, LONG_MAX: the last
#      tried, 262144) that trains one step with --recompute full on one rank and with ring cp 2
#      (attention's work grows as T^2: a step at 512K takes minutes)
# CP_LONGEST_ONLY=1 runs only the longest-T search, from LONG_MIN (default 32768); LONG_CP_ONLY=1
# only its cp 2 half.
# Prints a table last. Exit 1 when a check failed (a T that runs out of memory is a result, not a
# failure).
NAME=cp_gpu
source "$(dirname "$0")/gpu_checks_lib.sh"

if [ -z "${CP_LONGEST_ONLY:-}" ]; then
# 1. fp32 on the GPU against the CPU
ARGS=(--model gpt2-mini --layers 4 --heads 4 --channels 32 --max-seq 16 --train-data "$FIX/gpt2_eval_shard.bin"
      --seq 16 --lr 5e-4 --warmup 2 --batch 2 --global-batch 16 --steps 10)
fp32_vs_cpu "2 --cp 2" "4 --cp 4" "2 --cp 2 --cp-style ulysses" "4 --cp 2 --tp 2 --sp"

# 2. bf16 loss curves against the fp32 CPU run
bf16_curves 8 "2 --cp 2" "2 --cp 2 --cp-style ulysses"

fi

# 3. long sequences
copies=$(( ${LONG_MAX:-262144} / 4000 + 2 )) # the fixture shard holds about 4,300 tokens
for i in $(seq 1 "$copies"); do cp "$FIX/gpt2_eval_shard.bin" "$WORK/long_$(printf %03d "$i").bin"; done
long() { # NAME NP T FLAGS...: 2 steps at T; a row with the memory plan and the measured peak per rank
    local name=$1 np=$2 T=$3
    shift 3
    if timeout 280 mpirun -np "$np" "$LOOM" train --model gpt2 --max-seq "$T" --seq "$T" --batch 1 --steps "${STEPS:-2}" \
        --train-data "$WORK/long_*.bin" --device cuda --precision bf16 --device-comm mpi "$@" >"$WORK/long.log" 2>&1; then
        row "$name" "$(grep -o '[0-9.]* [MG]iB activations' "$WORK/long.log" | head -1) (plan); peak $(grep -o 'peak memory.*' "$WORK/long.log" | sed 's/peak memory //; s/ (allocations.*//')"
        return 0
    fi
    row "$name" "does not train: $(grep -m1 -o 'loom: error.*' "$WORK/long.log" | cut -c1-50)"
    return 1
}
for T in 4096 8192 16384 32768; do
    [ -n "${CP_LONGEST_ONLY:-}" ] && break
    long "gpt2 bf16 T=$T, 1 rank" 1 "$T"
    long "gpt2 bf16 T=$T, ring cp 2 (2 ranks)" 2 "$T" --cp 2
    long "gpt2 bf16 T=$T, ring cp 4 (4 ranks)" 4 "$T" --cp 4
done
layouts=("1" "2 --cp 2")
[ -n "${LONG_CP_ONLY:-}" ] && layouts=("2 --cp 2")
for layout in "${layouts[@]}"; do
    read -r np flags <<<"$layout"
    T=${LONG_MIN:-32768}
    # shellcheck disable=SC2086
    while [ "$T" -le "${LONG_MAX:-262144}" ] && STEPS=1 long "longest T: $np rank(s) $flags, recompute full, T=$T" "$np" "$T" \
        --recompute full $flags; do T=$((2 * T)); done
done
finish
