#!/usr/bin/env bash
# --precision fp8 on one GPU, after scripts/device_gpu.sh has built build-gpu
# (`bash scripts/device_gpu.sh --fp8` builds, then runs this; carry data/brown for the curves),
# each FP8 recipe (--fp8-recipe tensorwise, the default, and delayed):
#   1. which FP8 products cuBLASLt takes: one gpt2 step with LOOM_CUDA_DEBUG=1, whose fallbacks
#      to bf16 are counted
#   2. the same mathematics with --cuda-graphs: gpt2-mini (fixture shard, B=4 T=64, 2 micro-batches
#      a step) 20 steps in fp8 with and without graphs, each recipe: every loss and the model
#      bit-identical; so with --recompute gelu against auto's selective (the LayerNorm outputs
#      not kept where their FP8 copies were, written again where not); delayed scaling's histories
#      in the checkpoint: a delayed run killed after step 14 and resumed from step 10 ends
#      bit-identical to the whole run, and resuming it with another --fp8-history is refused
#   3. the loss curve: gpt2 on the Brown shards, B=16 T=1024, FP8_STEPS (1000) steps in bf16 and in
#      fp8 with each recipe (delayed with --recompute gelu: its fastest form, the GELU's output
#      handed over in FP8): the validation losses side by side and each recipe's last relative
#      difference (mark: 1%)
#   4. speed: `loom bench` (median of 20 steps after 3) of gpt2 B=16 and gpt2-xl B=8 (--recompute
#      gelu) in bf16 and fp8 with each recipe, and gpt2 delayed with --recompute gelu, tokens/s,
#      MFU, peak memory and the ratio; FP8_PEER=1 adds the PyTorch peer of gpt2 B=16
#      (scripts/bench_gpu.sh's, both compile modes) in the same call
# Prints a table last; exit 1 when a check failed.
NAME=fp8_gpu
source "$(dirname "$0")/gpu_checks_lib.sh"
OUTDIR=${OUT:-/tmp}
RECIPES=(tensorwise delayed)

LOOM_CUDA_DEBUG=1 "$LOOM" bench --model gpt2 --batch 4 --seq 1024 --steps 1 --warmup 0 --device cuda --precision fp8 \
    >"$WORK/debug.log" 2>&1 || { failed=1; row "fp8 gpt2 step" "FAIL: $(grep -m1 -i error "$WORK/debug.log")"; }
row "fp8 products left in bf16 (one gpt2 step)" \
    "$(grep -c 'no cuBLASLt algorithm.* fp8' "$WORK/debug.log") ($(grep -m1 'fp8 (epilogue' "$WORK/debug.log" | cut -c1-40))"

ARGS=(--model gpt2-mini --train-data "$FIX/gpt2_eval_shard.bin" --seq 64 --batch 4 --global-batch 8 --steps 20
      --lr 1e-3 --warmup 5 --device cuda --precision fp8)
for r in "${RECIPES[@]}"; do
    for graphs in "" "--cuda-graphs" "--recompute gelu"; do
        # shellcheck disable=SC2086
        ran "fp8 $r $graphs" "$WORK/mini$r$graphs.log" "$LOOM" train "${ARGS[@]}" --fp8-recipe $r $graphs \
            --metrics "$WORK/mini$r$graphs.jsonl" --ckpt-dir "$WORK/mini$r$graphs"
    done
    # auto's --recompute selective: the LayerNorm outputs not kept where their FP8 copies were
    if diff <(losses "$WORK/mini$r.jsonl") <(losses "$WORK/mini$r--recompute gelu.jsonl") >/dev/null &&
        cmp -s "$WORK/mini$r/model_00000020.bin" "$WORK/mini$r--recompute gelu/model_00000020.bin"; then
        row "fp8 $r: --recompute selective vs gelu (gpt2-mini)" "bit-identical: 20 losses, the model after 20 steps"
    else
        failed=1
        row "fp8 $r: --recompute selective vs gelu (gpt2-mini)" "FAIL: the losses or the model differ"
    fi
    if diff <(losses "$WORK/mini$r.jsonl") <(losses "$WORK/mini$r--cuda-graphs.jsonl") >/dev/null &&
        cmp -s "$WORK/mini$r/model_00000020.bin" "$WORK/mini$r--cuda-graphs/model_00000020.bin" &&
        [ "$(losses "$WORK/mini$r.jsonl" | wc -l)" -eq 20 ]; then
        row "fp8 $r: --cuda-graphs vs launches (gpt2-mini)" "bit-identical: 20 losses, the model after 20 steps"
    else
        failed=1
        row "fp8 $r: --cuda-graphs vs launches (gpt2-mini)" "FAIL: the losses or the model differ"
    fi
done

# delayed scaling's histories in the checkpoint: a run killed after step 14 and resumed from its
# checkpoint of step 10 ends as the whole run does (model, state file, losses of steps 11-20)
RES=("${ARGS[@]}" --fp8-recipe delayed --ckpt-every 10)
ran "fp8 delayed, whole" "$WORK/res_full.log" "$LOOM" train "${RES[@]}" --ckpt-dir "$WORK/full" --metrics "$WORK/full.jsonl"
LOOM_FAULT=step:14 "$LOOM" train "${RES[@]}" --ckpt-dir "$WORK/cut" --metrics "$WORK/cut.jsonl" >"$WORK/res_cut.log" 2>&1
ran "fp8 delayed, resumed" "$WORK/res_resume.log" "$LOOM" train "${RES[@]}" --ckpt-dir "$WORK/cut" --metrics "$WORK/cut.jsonl" --resume
if grep -q "from step 10" "$WORK/res_resume.log" && cmp -s "$WORK/full/model_00000020.bin" "$WORK/cut/model_00000020.bin" &&
    cmp -s "$WORK/full/state_00000020_00000.bin" "$WORK/cut/state_00000020_00000.bin" &&
    [ "$(losses "$WORK/full.jsonl" | tail -10)" = "$(losses "$WORK/cut.jsonl" | tail -10)" ]; then
    row "fp8 delayed: killed at 14, resumed from 10" "bit-identical: model, state file, losses of steps 11-20"
else
    failed=1
    row "fp8 delayed: killed at 14, resumed from 10" "FAIL: $(grep -m1 -i error "$WORK/res_resume.log")"
fi
"$LOOM" train "${RES[@]}" --ckpt-dir "$WORK/cut" --resume --fp8-history 8 >"$WORK/res_h8.log" 2>&1
row "fp8 delayed: resumed with --fp8-history 8" "$(grep -c "a history of 16 steps, this run's is 8" "$WORK/res_h8.log") error line(s) naming both"

STEPS=${FP8_STEPS:-1000}
if [ -f "$ROOT/data/brown/brown_train_000000.bin" ] && [ "$STEPS" -gt 0 ]; then
    for p in bf16 fp8:tensorwise fp8:delayed; do
        # shellcheck disable=SC2046
        ran "brown gpt2 $p" "$OUTDIR/fp8_brown_${p#*:}.log" "$LOOM" train --model gpt2 \
            --train-data "$ROOT/data/brown/brown_train_*.bin" --val-data "$ROOT/data/brown/brown_val_*.bin" \
            --batch 16 --seq 1024 --steps "$STEPS" --lr 6e-4 --warmup 100 --val-every $((STEPS / 10)) --val-batches 8 \
            --device cuda --precision "${p%:*}" $([ "$p" = bf16 ] || echo "--fp8-recipe ${p#*:}") \
            $([ "$p" = fp8:delayed ] && echo "--recompute gelu") \
            --metrics "$OUTDIR/fp8_brown_${p#*:}.jsonl"
    done
    echo "gpt2 on Brown, validation loss: bf16, fp8 tensorwise, fp8 delayed"
    paste <(grep val_loss "$OUTDIR/fp8_brown_bf16.jsonl") <(grep val_loss "$OUTDIR/fp8_brown_tensorwise.jsonl") \
        <(grep val_loss "$OUTDIR/fp8_brown_delayed.jsonl") | sed 's/[{}",:]/ /g' |
        awk '{printf "| %d | %.4f | %.4f | %.4f | %+.2f%% | %+.2f%% |\n", $2, $4, $8, $12, 100 * ($8 - $4) / $4, 100 * ($12 - $4) / $4}' |
        tee "$WORK/curve.md"
    last=$(tail -1 "$WORK/curve.md")
    for k in 0 1; do
        rel=$(echo "$last" | awk -F'|' -v k=$k '{v = $(6 + k); gsub(/[ %+-]/, "", v); print v}')
        what="Brown gpt2 $STEPS steps: val loss bf16, fp8 ${RECIPES[$k]}"
        if [ -n "$rel" ] && awk -v r="$rel" 'BEGIN { exit !(r <= 1) }'; then
            row "$what" "$(echo "$last" | awk -F'|' -v k=$k '{print $3 "," $(4 + k) "(" $(6 + k) ")"}')"
        else
            failed=1
            row "$what" "FAIL: ${last:-no validation losses}"
        fi
    done
else
    row "Brown gpt2 curves" "skipped (carry data/brown, or FP8_STEPS=0)"
fi

for c in gpt2:16:none gpt2-xl:8:gelu; do
    IFS=: read -r m b r <<<"$c"
    for p in bf16 tensorwise delayed; do
        # shellcheck disable=SC2046
        ran "bench $m $p" "$OUTDIR/fp8_bench_${m}_$p.log" "$LOOM" bench --model "$m" --batch "$b" --seq 1024 --steps 20 \
            --warmup 3 --device cuda --recompute "$r" $([ $p = bf16 ] && echo "--precision bf16" || echo "--precision fp8 --fp8-recipe $p")
    done
    read -r _ btps bmfu bpeak < <(bench_row "$OUTDIR/fp8_bench_${m}_bf16.log")
    for p in tensorwise delayed; do
        read -r _ ftps fmfu fpeak < <(bench_row "$OUTDIR/fp8_bench_${m}_$p.log")
        row "$m B=$b: bf16 / fp8 $p tokens/s" \
            "${btps:-?} / ${ftps:-?} ($(awk -v a="${btps:-0}" -v b="${ftps:-0}" 'BEGIN {printf "%.3fx", a ? b / a : 0}')), MFU ${bmfu:-?} / ${fmfu:-?}, peak ${bpeak:-?} / ${fpeak:-?}"
        [ "$m" = gpt2 ] && gpt2_bf16=${btps:-0} && eval "gpt2_$p=${ftps:-0}"
    done
done
ran "bench gpt2 delayed gelu" "$OUTDIR/fp8_bench_gpt2_delayed_gelu.log" "$LOOM" bench --model gpt2 --batch 16 \
    --seq 1024 --steps 20 --warmup 3 --device cuda --recompute gelu --precision fp8 --fp8-recipe delayed
read -r _ gtps gmfu gpeak < <(bench_row "$OUTDIR/fp8_bench_gpt2_delayed_gelu.log")
gpt2_gelu=${gtps:-0}
row "gpt2 B=16: fp8 delayed --recompute gelu tokens/s" \
    "${gtps:-?} ($(awk -v a="${gpt2_bf16:-0}" -v b="$gpt2_gelu" 'BEGIN {printf "%.3fx", a ? b / a : 0}') bf16), MFU ${gmfu:-?}, peak ${gpeak:-?}"
if [ -n "${FP8_PEER:-}" ]; then
    OUT=$WORK bash "$ROOT/scripts/bench_gpu.sh" gpt2:16 >"$WORK/peer.log" 2>&1 || failed=1
    ptps=$(python3 -c 'import json, sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' \
        "$WORK/bench_torch_gpt2_16.json" 2>/dev/null)
    ratio() { awk -v a="${ptps:-0}" -v b="$1" 'BEGIN {printf "%.3fx", a ? b / a : 0}'; }
    row "gpt2 B=16: PyTorch peer tokens/s; loom / peer" \
        "${ptps:-?}; fp8 delayed $(ratio "${gpt2_delayed:-0}") (--recompute gelu $(ratio "$gpt2_gelu")), tensorwise $(ratio "${gpt2_tensorwise:-0}"), bf16 $(ratio "$gpt2_bf16")"
fi
finish
