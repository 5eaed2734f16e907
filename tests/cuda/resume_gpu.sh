#!/usr/bin/env bash
# bf16 training on the GPU killed after step 8 and resumed from its checkpoint of step 6 ends as
# the uninterrupted run, bit for bit (the model, the optimizer state and the losses of steps
# 7-12): the master weights held split (each bf16 parameter and 16 more bits, optim/adamw.h),
# saved as fp32 and cut again on resume; so with --stochastic-rounding (master weights kept whole),
# in FP8 with delayed scaling (its amax histories in the checkpoint too) and with ZeRO 1 on 2 ranks
# sharing the GPU (collectives staged over MPI), and that ZeRO 1 checkpoint resumed with ZeRO 0
# (resharded) as well.
#   resume_gpu.sh LOOM FIXTURES MPIEXEC. Exit 77 without a CUDA device.
set -uo pipefail
LOOM=$(realpath "$1") FIX=$(realpath "$2") MPIEXEC=$3
WORK=$(mktemp -d /tmp/loom_resume_gpu_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
A=(train --model gpt2-mini --train-data "$FIX/gpt2_eval_shard.bin" --seq 64 --batch 4 --global-batch 8 --steps 12
   --lr 1e-3 --warmup 3 --device cuda)
if ! "$LOOM" "${A[@]}" --steps 1 >probe.txt 2>&1; then
    grep -q 'no CUDA device' probe.txt && exit 77
    fail "$(tail -1 probe.txt)"
fi
losses() { grep '"loss"' "$1" | sed 's/"step_time_s.*//' | tail -6; }
# check NAME NP FLAGS...: the whole run, the run killed after step 8, its resumption; compared
check() {
    local n=$1 np=$2 run=("$LOOM") cut=(env LOOM_FAULT=step:8 "$LOOM")
    shift 2
    if [ "$np" -gt 1 ]; then
        run=("$MPIEXEC" -np "$np" --oversubscribe "$LOOM")
        cut=("$MPIEXEC" -np "$np" --oversubscribe env LOOM_FAULT=step:8 "$LOOM")
    fi
    local B=("${A[@]}" "$@" --ckpt-every 6)
    "${run[@]}" "${B[@]}" --ckpt-dir "$n-full" --metrics "$n-full.jsonl" >"$n-full.txt" 2>&1 || fail "$n: whole run"
    "${cut[@]}" "${B[@]}" --ckpt-dir "$n-cut" --metrics "$n-cut.jsonl" >"$n-cut.txt" 2>&1
    [ -f "$n-cut/ckpt_00000006.json" ] && [ ! -f "$n-cut/model_00000012.bin" ] || fail "$n: checkpoints $(ls "$n-cut")"
    "${run[@]}" "${B[@]}" --ckpt-dir "$n-cut" --metrics "$n-cut.jsonl" --resume >"$n-res.txt" 2>&1 || fail "$n: resume"
    grep -q "from step 6" "$n-res.txt" || fail "$n: did not resume from step 6"
    for f in "$n-full"/model_00000012.bin "$n-full"/state_00000012_*.bin; do
        cmp "$f" "$n-cut/${f#*/}" || fail "$n: ${f#*/} differs"
    done
    diff <(losses "$n-full.jsonl") <(losses "$n-cut.jsonl") || fail "$n: losses of steps 7-12 differ"
    echo "ok: $n: resumed from step 6, model, state and losses of steps 7-12 bit-identical"
}
check split 1
check stochastic 1 --stochastic-rounding
check fp8 1 --precision fp8 --fp8-recipe delayed
check zero1 2 --device-comm mpi --zero 1
# the ZeRO 1 checkpoint of step 6 resumed with ZeRO 0 on the same 2 ranks (train/reshard.c: the
# split master weights assembled from both shards' files): ZeRO 0 and 1 give the same weights, so
# the run ends as the uninterrupted ZeRO 1 one, bit for bit
rm -f zero1-cut/model_00000012.bin zero1-cut/ckpt_00000012.json zero1-cut/state_00000012_*.bin
"$MPIEXEC" -np 2 --oversubscribe "$LOOM" "${A[@]}" --device-comm mpi --zero 0 --ckpt-every 6 --ckpt-dir zero1-cut \
    --metrics zero1-z0.jsonl --resume >zero1-z0.txt 2>&1 || fail "zero1 -> zero 0: resume: $(tail -2 zero1-z0.txt)"
grep -q "resharded onto 2 ranks (tp 1 pp 1 cp 1, ZeRO 0" zero1-z0.txt || fail "zero1 -> zero 0: no resharding note"
cmp zero1-full/model_00000012.bin zero1-cut/model_00000012.bin || fail "zero1 -> zero 0: model differs"
diff <(losses zero1-full.jsonl) <(losses zero1-z0.jsonl) || fail "zero1 -> zero 0: losses of steps 7-12 differ"
echo "ok: zero1 -> zero 0: resharded from step 6, model and losses of steps 7-12 bit-identical"
