#!/usr/bin/env bash
# CUDA graphs (`--cuda-graphs`) on one GPU, after scripts/device_gpu.sh has built build-gpu
# (`bash scripts/device_gpu.sh --graphs` builds, then runs this):
#   1. the same mathematics: `loom train` of gpt2-mini (fixture shard, B=4 T=64, global batch 8:
#      2 micro-batches a step, validation every 10 steps), 20 steps in fp32, in bf16 and in bf16
#      with --recompute full, each with and without --cuda-graphs: every loss and the final model
#      file must be bit-identical
#   2. steps that are not finite: the same gpt2-mini in bf16 at --lr 1e30 --warmup 0, 6 steps, so
#      every step after the first is not finite (skipped by the device inside the replayed step):
#      with --skip-nonfinite, with and without --cuda-graphs, the same steps skipped (at least
#      one), every loss and the final model bit-identical; without it, both stop with the same error
#   3. speed: `loom bench --model gpt2 --seq 1024 --precision bf16` at B = 1, 2, 4, 16 with and
#      without --cuda-graphs (median of 20 steps after 3): step ms, tokens/s, the ratio
# Prints a table last; exit 1 when a check failed.
NAME=graphs_gpu
source "$(dirname "$0")/gpu_checks_lib.sh"

ARGS=(--model gpt2-mini --train-data "$FIX/gpt2_eval_shard.bin" --seq 64 --batch 4 --global-batch 8 --steps 20
      --lr 1e-3 --warmup 5 --val-every 10 --val-batches 2 --device cuda)
for variant in "fp32" "bf16" "bf16 --recompute full"; do
    read -r precision flags <<<"$variant"
    name=$(echo "$variant" | tr -d ' -')
    for graphs in "" "--cuda-graphs"; do
        # shellcheck disable=SC2086
        ran "$variant $graphs" "$WORK/$name$graphs.log" "$LOOM" train "${ARGS[@]}" --precision "$precision" $flags \
            $graphs --metrics "$WORK/$name$graphs.jsonl" --ckpt-dir "$WORK/$name$graphs" || continue 2
    done
    n=$(losses "$WORK/$name.jsonl" | wc -l)
    if diff <(losses "$WORK/$name.jsonl") <(losses "$WORK/$name--cuda-graphs.jsonl") >/dev/null &&
        cmp -s "$WORK/$name/model_00000020.bin" "$WORK/$name--cuda-graphs/model_00000020.bin" && [ "$n" -eq 20 ]; then
        row "--cuda-graphs vs launches, $variant" "bit-identical: $n losses, the model after 20 steps"
    else
        failed=1
        row "--cuda-graphs vs launches, $variant" "FAIL: differ ($(paste <(losses "$WORK/$name.jsonl") \
            <(losses "$WORK/$name--cuda-graphs.jsonl") | awk '$1 != $2 {print NR": "$1" vs "$2; exit}'))"
    fi
done

NF=(--model gpt2-mini --train-data "$FIX/gpt2_eval_shard.bin" --seq 64 --batch 4 --global-batch 8 --steps 6
    --lr 1e30 --warmup 0 --device cuda --precision bf16)
nf_ran=1
for graphs in "" "--cuda-graphs"; do
    # shellcheck disable=SC2086
    ran "not finite, --skip-nonfinite $graphs" "$WORK/nf$graphs.log" "$LOOM" train "${NF[@]}" $graphs --skip-nonfinite \
        --metrics "$WORK/nf$graphs.jsonl" --ckpt-dir "$WORK/nf$graphs" || nf_ran=0
    # shellcheck disable=SC2086
    "$LOOM" train "${NF[@]}" $graphs >"$WORK/nf_stop$graphs.log" 2>&1 && { nf_ran=0; failed=1; row "not finite $graphs" "FAIL: ran on"; }
done
if [ "$nf_ran" = 1 ]; then
    skips=$(grep -c '"skipped"' "$WORK/nf.jsonl")
    stop=$(grep -m1 'error:' "$WORK/nf_stop.log")
    if diff <(losses "$WORK/nf.jsonl") <(losses "$WORK/nf--cuda-graphs.jsonl") >/dev/null && [ "$skips" -ge 1 ] &&
        [ "$skips" -eq "$(grep -c '"skipped"' "$WORK/nf--cuda-graphs.jsonl")" ] &&
        cmp -s "$WORK/nf/model_00000006.bin" "$WORK/nf--cuda-graphs/model_00000006.bin" && [ -n "$stop" ] &&
        [ "$stop" = "$(grep -m1 'error:' "$WORK/nf_stop--cuda-graphs.log")" ]; then
        row "--cuda-graphs vs launches, steps not finite" "bit-identical: $skips of 6 skipped alike, the model; same stop"
    else
        failed=1
        row "--cuda-graphs vs launches, steps not finite" "FAIL: differ ($skips skipped; stop: ${stop:0:30})"
    fi
fi

for B in 1 2 4 16; do
    for graphs in "" "--cuda-graphs"; do
        # shellcheck disable=SC2086
        "$LOOM" bench --model gpt2 --batch "$B" --seq 1024 --steps 20 --warmup 3 --device cuda --precision bf16 \
            $graphs >"$WORK/bench$B$graphs.log" 2>&1 || { failed=1; row "bench gpt2 B=$B $graphs" "FAIL"; }
    done
    read -r ms tps _ < <(bench_row "$WORK/bench$B.log")
    read -r gms gtps _ < <(bench_row "$WORK/bench$B--cuda-graphs.log")
    row "gpt2 bf16 B=$B T=1024: launches / --cuda-graphs" \
        "$ms / $gms ms, $tps / $gtps tokens/s, $(awk -v a="$tps" -v b="$gtps" 'BEGIN {printf "%.3fx", b / a}')"
done
finish
