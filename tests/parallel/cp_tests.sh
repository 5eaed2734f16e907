#!/usr/bin/env bash
# `loom train --cp` (context parallelism) on the CPU under mpirun: cp_tests.sh CASE LOOM COMPARE FIXTURES
#   parity:  ring attention at cp 2 and cp 4, Ulysses at cp 2 (and cp 2 x tp 2), cp 2 x tp 2 --sp,
#            cp 2 x pp 2 x tp 2 on 8 ranks (--sp, zb-v), cp 2 x dp 2 with ZeRO 1 and 3: 10 steps
#            of a global batch of 16 sequences (micro-batches of 2, accumulated) from a fresh
#            4-layer model, the loss at every step and 3 validation losses within 1e-5 relative of
#            the one-process run with the same global batch, and the final weights within 1e-5
#   long:    a fresh model with --max-seq 2048 trained at T = 2048 in one process, and with ring cp 2
#            and Ulysses cp 2: 3 steps whose losses agree within 1e-5
#   resume:  a cp 2 x dp 2 ZeRO-1 run killed and resumed equals the uninterrupted one bit for bit
#   errors:  layouts that cannot work (T not divisible by 2 x cp, Ulysses with heads not divisible
#            by cp, an unknown style, sampling) give one error line and every rank exits non-zero
set -uo pipefail
CASE=$1 LOOM=$2 COMPARE=$3 FIX=$4
source "$(dirname "$0")/train_lib.sh"
ARGS=(--model gpt2-mini --layers 4 --heads 4 --channels 32 --max-seq 16 --train-data "$FIX/gpt2_eval_shard.bin"
      --seq 16 --lr 5e-4 --warmup 2 --threads 1 --val-data "$FIX/gpt2_eval_shard.bin" --val-batches 4 --val-every 5)

QUICK="ring-cp4 ulysses-cp2-tp2 ring-cp2-pp2-tp2 ring-cp2-dp2-zero3"
case $CASE in
parity)
  train --batch 2 --global-batch 16 --steps 10 --ckpt-dir ref_16 --metrics ref_16.jsonl >/dev/null 2>&1 || fail "one-process run"
  grep -q "cp 2 x tp 1 = 2 ranks" <(rtrain 2 --cp 2 --batch 2 --steps 1 2>&1) || fail "the mesh line lacks cp 2"
  parity_check ring-cp2 2 16 --cp 2
  parity_check ring-cp4 4 16 --cp 4
  parity_check ulysses-cp2 2 16 --cp 2 --cp-style ulysses
  parity_check ulysses-cp2-tp2 4 16 --cp 2 --cp-style ulysses --tp 2
  parity_check ring-cp2-tp2-sp 4 16 --cp 2 --tp 2 --sp
  parity_check ring-cp2-pp2-tp2 8 16 --cp 2 --pp 2 --tp 2 --sp --pp-schedule zb-v
  parity_check ring-cp2-dp2-zero1 4 16 --cp 2 --zero 1
  parity_check ring-cp2-dp2-zero3 4 16 --cp 2 --zero 3
  ;;
long)
  long=(--model gpt2-mini --layers 1 --heads 2 --channels 16 --max-seq 2048 --seq 2048 --train-data "$FIX/gpt2_eval_shard.bin"
        --lr 5e-4 --threads 1 --batch 1 --steps 3)
  "$LOOM" train "${long[@]}" --metrics one.jsonl >one.txt 2>&1 || fail "one process at T = 2048: $(tail -3 one.txt)"
  grep -q "maxT=2048" one.txt || fail "the model is not the fresh --max-seq 2048 one: $(grep model one.txt)"
  for style in ring ulysses; do
    run 2 train "${long[@]}" --cp 2 --cp-style $style --metrics $style.jsonl >$style.txt 2>&1 || fail "$style: $(tail -3 $style.txt)"
    l=$(rel_err "$(losses $style.jsonl)" "$(losses one.jsonl)")
    [ "${l%% *}" -eq 3 ] && awk -v w="${l##* }" 'BEGIN { exit !(w <= 1e-5) }' || fail "$style cp 2 at T = 2048: losses $l"
    echo "ok: T = 2048 (--max-seq 2048, fresh), $style cp 2: 3 losses within ${l##* } of one process"
  done
  ;;
resume)
  kill_and_resume 4 --cp 2 --zero 1 --batch 2 --global-batch 8 --steps 6 --bucket-mb 0.01 --ckpt-every 3
  grep -q '"cp":\s*2' cut/ckpt_00000003.json || fail "metadata lacks cp 2"
  echo "ok: cp 2 x dp 2 ZeRO-1 resume is bit-identical"
  ;;
errors)
  expect_mpi_error 4 "sequence length 12 does not split into 2 x --cp 4 = 8 equal chunks" train "${ARGS[@]}" --cp 4 \
    --seq 12 --batch 1 --steps 1
  expect_mpi_error 4 "its 2 heads (heads / tp) do not divide by --cp 4" train "${ARGS[@]}" --cp 4 --heads 2 \
    --cp-style ulysses --batch 1 --steps 1
  expect_mpi_error 4 "its 1 heads (heads / tp) do not divide by --cp 2" train "${ARGS[@]}" --cp 2 --tp 2 --heads 2 \
    --cp-style ulysses --batch 1 --steps 1
  expect_mpi_error 2 "unknown --cp-style 'zigzag'" train "${ARGS[@]}" --cp 2 --cp-style zigzag --batch 1 --steps 1
  expect_mpi_error 2 "sampling during training under --cp 2" train "${ARGS[@]}" --cp 2 --sample-every 1 --batch 1 --steps 1
  expect_mpi_error 3 "3 ranks do not fill a mesh of --tp 1 x --pp 1 x --cp 2" train "${ARGS[@]}" --cp 2 --batch 1 --steps 1
  expect_mpi_error 2 "sequence length 32 exceeds the model's maximum 16" train "${ARGS[@]}" --cp 2 --seq 32 --batch 1 --steps 1
  ;;
*) fail "unknown case $CASE" ;;
esac
