#!/usr/bin/env bash
# `loom train --tp` on the CPU under mpirun: tp_tests.sh CASE LOOM COMPARE FIXTURES
#   parity:  tp 2, tp 4 and tp 2 x dp 2 (with --sp, ZeRO 1 and 2; tp 2 --sp with the LayerNorm
#            outputs recomputed and gathered again in the backward; tp 2 with the vocabulary-parallel
#            output layer in chunks of 8 rows, against the reference's one chunk), 10 steps with gradient
#            accumulation from the fixture model: the loss at every step within 1e-5 relative of
#            the one-process run with the same global batch, and the final weights (the model
#            file gathered from the shards) within 1e-5 relative (whole model)
#   resume:  a tp 2 x dp 2 --sp ZeRO-1 run killed and resumed equals the uninterrupted one bit for
#            bit; resuming on another mesh reshards its state (reshard_tests.sh)
#   errors:  layouts that cannot work give one error line and every rank exits non-zero, no hang
#   sample:  sampling during a tp 2 --sp run prints the same text as `loom sample` on the saved
#            model file in one process
set -uo pipefail
CASE=$1 LOOM=$2 COMPARE=$3 FIX=$4
source "$(dirname "$0")/train_lib.sh"

case $CASE in
parity)
  # global batch 8 = dp x accumulation x micro-batch 2
  train --batch 2 --global-batch 8 --steps 10 --ckpt-dir ref --metrics ref.jsonl >/dev/null || fail "one-process run"
  for layout in "2 --tp 2" "2 --tp 2 --sp" "4 --tp 4 --sp" "4 --tp 2 --sp --zero 1" "4 --tp 2 --zero 2" \
    "2 --tp 2 --sp --recompute selective" "2 --tp 2 --logits-chunk 8"; do
    read -r np flags <<<"$layout"
    name=$(echo "$np$flags" | tr -d ' -')
    # shellcheck disable=SC2086
    rtrain "$np" $flags --batch 2 --global-batch 8 --steps 10 --bucket-mb 0.01 --ckpt-dir "$name" \
      --metrics "$name.jsonl" >log.txt 2>&1 || fail "$np ranks $flags: $(tail -3 log.txt)"
    grep -q "mesh .*= $np ranks" log.txt || fail "$np ranks $flags: no mesh line: $(head -20 log.txt)"
    worst=$(paste <(losses "$name.jsonl") <(losses ref.jsonl) |
      awk '{ d = $1 - $2; if (d < 0) d = -d; e = d / $2; if (e > w) w = e } END { printf "%.3g", w }')
    [ "$(losses "$name.jsonl" | wc -l)" -eq 10 ] || fail "$np ranks $flags: not 10 steps"
    awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' || fail "$np ranks $flags: loss rel err $worst > 1e-5"
    err=$("$COMPARE" "$name/model_00000010.bin" ref/model_00000010.bin 1e-5) ||
      fail "$np ranks $flags: weights vs one process: $err"
    echo "ok: $np ranks $flags: 10 losses within $worst, weights $err"
  done
  ;;
resume)
  common=(--tp 2 --sp --zero 1 --batch 2 --global-batch 8 --steps 6 --bucket-mb 0.01 --ckpt-every 3)
  kill_and_resume 4 "${common[@]}"
  grep -q '"tp":\s*2' cut/ckpt_00000003.json && grep -q '"shard":\s*"vocab"' cut/ckpt_00000003.json ||
    fail "metadata lacks the mesh or the shard specs"
  rtrain 4 --tp 4 --sp --zero 1 --batch 2 --global-batch 8 --steps 6 --bucket-mb 0.01 --ckpt-dir cut --resume \
    >other.txt 2>&1 || fail "tp 4 resume: $(tail -2 other.txt)"
  grep -q "saved over 4 ranks (tp 2 pp 1 cp 1, ZeRO 1, 2 data-parallel); its optimizer state is resharded onto 4 ranks (tp 4" \
    other.txt || fail "another mesh: $(grep note other.txt)"
  echo "ok: tp 2 x dp 2 --sp ZeRO-1 resume is bit-identical; another mesh reshards"
  ;;
errors)
  expect_mpi_error 3 "splits whole heads, but the model has 4 heads" train "${ARGS[@]}" --tp 3 --batch 1 --steps 1
  expect_mpi_error 3 "3 ranks do not fill a mesh of --tp 2" train "${ARGS[@]}" --tp 2 --batch 1 --steps 1
  expect_mpi_error 2 "--sp needs --tp 2 or more, got --tp 1" train "${ARGS[@]}" --sp --batch 1 --steps 1
  expect_mpi_error 2 "but the sequence length is 15" train "${ARGS[@]}" --tp 2 --sp --seq 15 --batch 1 --steps 1
  expect_mpi_error 4 "--global-batch 6 is not a positive multiple of 2 data-parallel ranks x --batch 2" train "${ARGS[@]}" \
    --tp 2 --batch 2 --global-batch 6 --steps 1
  expect_mpi_error 2 "unknown --device-comm 'gloo'" train "${ARGS[@]}" --tp 2 --device-comm gloo --batch 1 --steps 1
  # a padded vocabulary (50304) that 5 ranks cannot split, with heads they can
  expect_mpi_error 5 "splits the padded vocabulary 50304 unevenly" train --model gpt2-mini --layers 1 --heads 5 --channels 40 \
    --train-data "$FIX/gpt2_eval_shard.bin" --seq 16 --threads 1 --tp 5 --batch 1 --steps 1
  ;;
sample)
  rtrain 2 --tp 2 --sp --batch 2 --steps 2 --sample-every 2 --sample-tokens 12 --seed 5 --ckpt-dir s >out.txt 2>err.txt ||
    fail "run: $(cat err.txt)"
  [ "$(grep -ac '^sample (step 2): ' out.txt)" -eq 1 ] || fail "want one sample line: $(cat out.txt)"
  got=$(grep -a '^sample (step 2): ' out.txt | sed 's/^sample (step 2): //')
  want=$("$LOOM" sample --model s/model_00000002.bin --tokens 12 --seed 7 --top-k 40 --temperature 1 --device cpu) ||
    fail "loom sample"
  [ "$got" = "$want" ] || fail "tp sample '$got' differs from one-process '$want'"
  echo "ok: tp 2 --sp sample equals the one-process sample: $got"
  ;;
*) fail "unknown case" ;;
esac
