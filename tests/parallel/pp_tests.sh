#!/usr/bin/env bash
# `loom train --pp` on the CPU under mpirun: pp_tests.sh CASE LOOM COMPARE FIXTURES
#   parity:  every schedule at pp 2 and pp 4 (interleaved with 2 stages per rank), and
#            pp 2 x tp 2 x dp 2 on 8 ranks (--sp, ZeRO 1 and 2), pp 2 with --recompute selective
#            (1f1b, interleaved, zb-v), 10 steps of 8 micro-batches from a
#            fresh 8-layer model: the loss at every step within 1e-5 relative of the one-process
#            run with the same global batch, and the final weights (the model file gathered from
#            the stages) within 1e-5 relative
#   resume:  a zb-v pp 2 x dp 2 run killed and resumed equals the uninterrupted one bit for bit;
#            a schedule that places the blocks otherwise reshards its state (reshard_tests.sh)
#   errors:  layouts that cannot work give one error line and every rank exits non-zero, no hang
set -uo pipefail
CASE=$1 LOOM=$2 COMPARE=$3 FIX=$4
source "$(dirname "$0")/train_lib.sh"
# a fresh model deep enough for 8 stages (the fixture model has 2 layers)
ARGS=(--model gpt2-mini --layers 8 --heads 2 --channels 16 --max-seq 16 --train-data "$FIX/gpt2_eval_shard.bin"
      --seq 16 --lr 5e-4 --warmup 2 --threads 1 --val-data "$FIX/gpt2_eval_shard.bin" --val-batches 4 --val-every 5)

# check NAME NP FLAGS...: the run's 10 losses and its final weights against the one-process run
check() {
  local name=$1 np=$2; shift 2
  quick_skips "$name" && return 0
  rtrain "$np" "$@" --batch 2 --global-batch 16 --steps 10 --bucket-mb 0.01 --ckpt-dir "$name" \
    --metrics "$name.jsonl" >"$name.txt" 2>&1 || fail "$name: $(tail -3 "$name.txt")"
  [ "$(losses "$name.jsonl" | wc -l)" -eq 10 ] || fail "$name: not 10 steps"
  worst=$(rel_err "$(losses "$name.jsonl")" "$(losses ref.jsonl)")
  worst=${worst##* }
  awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' || fail "$name: loss rel err $worst > 1e-5"
  vals=$(rel_err "$(val_losses "$name.jsonl")" "$(val_losses ref.jsonl)")
  [ "${vals%% *}" -eq 3 ] && awk -v w="${vals##* }" 'BEGIN { exit !(w <= 1e-5) }' ||
    fail "$name: validation losses (count, rel err) $vals"
  err=$("$COMPARE" "$name/model_00000010.bin" ref/model_00000010.bin 1e-5) || fail "$name: weights vs one process: $err"
  grep -q "pipeline .*theory: bubble" "$name.txt" || fail "$name: no pipeline report: $(tail -5 "$name.txt")"
  echo "ok: $name: 10 losses within $worst, 3 validations within ${vals##* }, weights $err"
}

QUICK="pp4-interleaved pp4-zb-v pp4-dualpipev pp2-tp2-dp2-zero1 pp2-tp2-dp2-zero2"
case $CASE in
parity)
  train --batch 2 --global-batch 16 --steps 10 --ckpt-dir ref --metrics ref.jsonl >/dev/null 2>&1 || fail "one-process run"
  for pp in 2 4; do
    for s in gpipe 1f1b interleaved zb-h1 zb-v dualpipev; do
      v=(); [ $s = interleaved ] && v=(--virtual-stages 2)
      check "pp$pp-$s" "$pp" --pp "$pp" --pp-schedule "$s" "${v[@]}"
    done
  done
  check "pp2-tp2-dp2-zero1" 8 --pp 2 --tp 2 --sp --zero 1 --pp-schedule zb-v
  check "pp2-tp2-dp2-zero2" 8 --pp 2 --tp 2 --zero 2 --pp-schedule interleaved --virtual-stages 2
  # the LayerNorm outputs recomputed, in one buffer per slot (zb-v: kept per block, as gelu)
  check "pp2-1f1b-selective" 2 --pp 2 --pp-schedule 1f1b --recompute selective
  check "pp2-interleaved-selective" 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 --recompute selective
  check "pp2-zbv-selective" 2 --pp 2 --pp-schedule zb-v --recompute selective
  ;;
resume)
  common=(--pp 2 --pp-schedule zb-v --zero 1 --batch 2 --global-batch 16 --steps 6 --bucket-mb 0.01 --ckpt-every 3)
  kill_and_resume 4 "${common[@]}"
  grep -q '"v_shape":\s*1' cut/ckpt_00000003.json || fail "metadata lacks the stage placement"
  rtrain 4 "${common[@]/zb-v/1f1b}" --ckpt-dir cut --resume >other.txt 2>&1 || fail "1f1b resume: $(tail -2 other.txt)"
  grep -q "resharded onto 4 ranks (tp 1 pp 2 cp 1, ZeRO 1, 2 data-parallel)" other.txt ||
    fail "another stage placement: $(grep note other.txt)"
  echo "ok: zb-v pp 2 x dp 2 ZeRO-1 resume is bit-identical; another stage placement reshards"
  ;;
errors)
  expect_mpi_error 3 "8 layers do not split into --pp 3 x 1 stages per rank" train "${ARGS[@]}" --pp 3 --batch 1 --global-batch 3 --steps 1
  expect_mpi_error 2 "virtual-stages" train "${ARGS[@]}" --pp 2 --virtual-stages 2 --batch 1 --global-batch 4 --steps 1
  expect_mpi_error 2 "unknown" train "${ARGS[@]}" --pp 2 --pp-schedule zigzag --batch 1 --steps 1
  expect_mpi_error 4 "multiple" train "${ARGS[@]}" --pp 4 --pp-schedule interleaved --virtual-stages 2 --batch 1 --global-batch 6 --steps 1
  expect_mpi_error 2 "dualpipev" train "${ARGS[@]}" --pp 2 --pp-schedule dualpipev --batch 1 --global-batch 2 --steps 1
  expect_mpi_error 2 "use --recompute none, gelu or selective with a zero-bubble schedule" train "${ARGS[@]}" --pp 2 \
    --pp-schedule zb-h1 --recompute full --batch 1 --global-batch 2 --steps 1
  expect_mpi_error 2 "sampling during training under --pp 2" train "${ARGS[@]}" --pp 2 --sample-every 1 --batch 1 --steps 1
  expect_mpi_error 1 "--virtual-stages 2 needs a pipeline" train "${ARGS[@]}" --virtual-stages 2 --batch 1 --steps 1
  ;;
*) fail "unknown case $CASE" ;;
esac
