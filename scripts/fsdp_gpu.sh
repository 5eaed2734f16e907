#!/usr/bin/env bash
# ZeRO 3 (FSDP), hybrid sharding and the offloaded optimizer on a one-GPU machine, after
# scripts/device_gpu.sh has built build-gpu (it calls this with --fsdp). The ranks of a layout
# share the GPU, their collectives staged through host memory over MPI (--device-comm mpi).
#   1. fp32: `loom train` of a fresh 4-layer model, 10 steps of a global batch of 16, with ZeRO 3
#      at 2 ranks, HSDP 2 x 2, ZeRO 3 x tp 2, the optimizer offloaded on 1 rank and with ZeRO 3,
#      on cuda, against the one-process CPU run: the largest relative loss difference (bound 1e-5)
#      (and each --offload option: optimizer,params with ZeRO 3 on 1 and 2 ranks, activations
#      alone and with --recompute full, all three with ZeRO 3 on 2 ranks)
#   2. bf16: gpt2-mini (L=4) 50 steps with ZeRO 3 at 2 ranks, the optimizer offloaded on one rank
#      and with ZeRO 3, the parameters too, the activations, everything, beside one process on
#      the GPU, each against the fp32 CPU run
#   3. memory and speed on one GPU (loom bench, bf16): gpt2 B=16 with ZeRO 0 and ZeRO 3 on one
#      rank and on 2 ranks sharing the GPU: loom bench's row (step, forward, backward, optimizer
#      ms, tokens/s, MFU, peak memory) and its memory plan against the measured peak; offloaded
#      activations beside keeping them and beside --recompute full; ZeRO 3 with the optimizer
#      and parameters offloaded
# With --xl instead (its own device call: the machine's 10 minutes): gpt2-xl B=8 (--recompute
# gelu) with and without --offload optimizer, and the largest GPT-2-shaped models (C=2560,
# NH=20, --recompute full) that train at B=1, T=1024 without offloading (XL_LAYERS: the depths
# tried, 48 56) and with ZeRO 3 and --offload optimizer,params,activations (XL_OFFLOAD_LAYERS: 64).
# With --gpt2: gpt2 in bf16 with each offload option against keeping everything on the GPU, and
# the memory plan's refusal of a run planned for a 40 GiB device.
# Ranks are not bound to cores (--bind-to none), so the host's optimizer step has every core.
# Prints a table last. Exit 1 when a check failed.
NAME=fsdp_gpu
source "$(dirname "$0")/gpu_checks_lib.sh"
bench() { # NAME NP FLAGS...: one loom bench row (tokens/s, peak memory) and its plan
    local name=$1 np=$2
    shift 2
    if ran "$name" "$WORK/b.log" timeout 400 mpirun -np "$np" --bind-to none "$LOOM" bench --precision bf16 \
        --device-comm mpi "$@"; then
        row "$name" "$(grep -m1 '^| *[0-9]' "$WORK/b.log" | tr -s ' ')"
        cat "$WORK/b.log"
    else
        tail -5 "$WORK/b.log"
    fi
}
if [ "${1:-}" = "--gpt2" ]; then
    # gpt2 (124M) in bf16, 30 steps on the fixture shard: each offload option against keeping
    # everything on the GPU (the bf16 noise: bf16 against fp32, same GPU); then the memory plan's
    # refusal of gpt2-xl B=8 planned for a 40 GiB device
    maxdiff() { paste <(losses "$1") <(losses "$2") |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d; n++ } END { printf "%d steps, max |loss diff| %.4f", n, w }'; }
    args=(--model gpt2 --train-data "$FIX/gpt2_eval_shard.bin" --seq 256 --batch 8 --steps 30 --lr 6e-4 --warmup 5
          --seed 3 --device cuda)
    "$LOOM" train "${args[@]}" --precision fp32 --metrics "$WORK/fp32.jsonl" >"$WORK/fp32.log" 2>&1 || failed=1
    "$LOOM" train "${args[@]}" --precision bf16 --metrics "$WORK/bf16.jsonl" >"$WORK/bf16.log" 2>&1 || failed=1
    row "gpt2 bf16 vs fp32 (the noise)" "$(maxdiff "$WORK/bf16.jsonl" "$WORK/fp32.jsonl")"
    for flags in "--offload optimizer" "--zero 3 --offload optimizer,params" "--offload activations" \
        "--recompute full --offload activations" "--zero 3 --offload optimizer,params,activations"; do
        name=$(echo "$flags" | tr -d ' -,')
        # shellcheck disable=SC2086
        ran "gpt2 bf16 $flags" "$WORK/$name.log" "$LOOM" train "${args[@]}" --precision bf16 $flags \
            --metrics "$WORK/$name.jsonl" &&
            row "gpt2 bf16 $flags vs bf16" "$(maxdiff "$WORK/$name.jsonl" "$WORK/bf16.jsonl")"
        grep -E "memory per rank|offloaded|peak memory" "$WORK/$name.log"
    done
    LOOM_DEVICE_MEMORY_GIB=40 "$LOOM" train --model gpt2-xl --train-data "$FIX/gpt2_eval_shard.bin" --batch 8 \
        --device cuda --steps 1 >"$WORK/refuse.log" 2>&1 && { failed=1; row "refusal" "FAIL: gpt2-xl B=8 ran on 40 GiB"; }
    grep "loom: error" "$WORK/refuse.log" || { failed=1; row "refusal" "FAIL: $(tail -2 "$WORK/refuse.log")"; }
    finish
fi
if [ "${1:-}" = "--xl" ]; then
    bench "gpt2-xl B=8 gelu, 1 rank" 1 --model gpt2-xl --batch 8 --recompute gelu --steps 3
    bench "gpt2-xl B=8 gelu, 1 rank, offload optimizer" 1 --model gpt2-xl --batch 8 --recompute gelu --steps 3 \
        --offload optimizer
    for layers in ${XL_LAYERS:-48 56}; do
        bench "C=2560 L=$layers B=1, 1 rank" 1 --model gpt2-xl --channels 2560 --heads 20 --layers $layers --batch 1 \
            --recompute full --steps 2 --warmup 1
    done
    for layers in ${XL_OFFLOAD_LAYERS:-64}; do
        bench "C=2560 L=$layers B=1, 1 rank, ZeRO 3, offload optimizer,params,activations" 1 --model gpt2-xl \
            --channels 2560 --heads 20 --layers $layers --batch 1 --recompute full --steps 2 --warmup 1 --zero 3 \
            --offload optimizer,params,activations
    done
    finish
fi

# 1. fp32 on the GPU against the CPU
ARGS=(--model gpt2-mini --layers 4 --heads 2 --channels 16 --max-seq 16 --train-data "$FIX/gpt2_eval_shard.bin"
      --seq 16 --lr 5e-4 --warmup 2 --batch 2 --global-batch 16 --steps 10 --bucket-mb 0.01)
fp32_vs_cpu "2 --zero 3" "4 --zero 3 --dp-replicate 2" "4 --zero 3 --tp 2 --sp" "1 --offload optimizer" \
    "2 --zero 3 --offload optimizer" "1 --zero 3 --offload optimizer,params" "2 --zero 3 --offload optimizer,params" \
    "1 --offload activations" "1 --offload activations --recompute full" \
    "2 --zero 3 --offload optimizer,params,activations"

# 2. bf16 loss curves against the fp32 CPU run
bf16_curves 8 "2 --zero 3" "1 --offload optimizer" "2 --zero 3 --offload optimizer" \
    "1 --zero 3 --offload optimizer,params" "1 --offload activations" "1 --zero 3 --offload optimizer,params,activations"

# 3. memory and speed
bench "gpt2 B=16, 1 rank, ZeRO 0" 1 --model gpt2 --batch 16 --steps 5
bench "gpt2 B=16, 1 rank, ZeRO 3" 1 --model gpt2 --batch 16 --steps 5 --zero 3
bench "gpt2 B=8, 2 ranks sharing, ZeRO 0" 2 --model gpt2 --batch 8 --steps 3
bench "gpt2 B=8, 2 ranks sharing, ZeRO 3" 2 --model gpt2 --batch 8 --steps 3 --zero 3
bench "gpt2 B=16, 1 rank, offload activations" 1 --model gpt2 --batch 16 --steps 5 --offload activations
bench "gpt2 B=16, 1 rank, recompute full" 1 --model gpt2 --batch 16 --steps 5 --recompute full
bench "gpt2 B=16, 1 rank, recompute full + offload activations" 1 --model gpt2 --batch 16 --steps 5 --recompute full \
    --offload activations
bench "gpt2 B=16, 1 rank, ZeRO 3 + offload optimizer,params" 1 --model gpt2 --batch 16 --steps 5 --zero 3 \
    --offload optimizer,params
finish
