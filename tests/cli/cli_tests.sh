#!/usr/bin/env bash
# End-to-end tests of the loom command line: `cli_tests.sh CASE LOOM FIXTURES`.
# Each case exits non-zero on failure, printing what differed.
set -uo pipefail
CASE=$1 LOOM=$2 FIX=$3
source "$(dirname "$0")/cli_lib.sh"

case $CASE in
eval_fixture)
  read -r B T N want want16 <"$FIX/gpt2_eval_expected.txt"
  got=$("$LOOM" eval --model "$FIX/gpt2_trained.bin" --data "$FIX/gpt2_eval_shard.bin" --batch "$B" --seq "$T" --batches "$N")
  [[ $got =~ ^val_loss:\ ([0-9.]+)$ ]] || fail "output '$got'"
  close "${BASH_REMATCH[1]}" "$want" 1e-5 || fail "val_loss ${BASH_REMATCH[1]}, PyTorch $want"
  got=$("$LOOM" eval --model "$FIX/gpt2_trained_bf16.bin" --data "$FIX/gpt2_eval_shard.bin" --batch "$B" --seq "$T" --batches "$N")
  close "${got#val_loss: }" "$want16" 1e-5 || fail "bf16 val_loss $got, PyTorch $want16"
  echo "ok: val_loss matches PyTorch ($want, bf16 $want16)"
  ;;

resume_bitexact)
  # uninterrupted run vs a run killed after step 4 (checkpoint at 3) and resumed
  train --ckpt-dir full --ckpt-every 3 --metrics full.jsonl >/dev/null || fail "full run"
  LOOM_FAULT=step:4 train --ckpt-dir cut --ckpt-every 3 --metrics cut.jsonl >/dev/null 2>&1
  [ $? -eq 137 ] || fail "the run was not killed after step 4"
  [ -f cut/ckpt_00000003.json ] && [ ! -f cut/model_00000006.bin ] || fail "unexpected checkpoints: $(ls cut)"
  train --ckpt-dir cut --ckpt-every 3 --metrics cut.jsonl --resume >resume.txt || fail "resume"
  grep -q "from step 3" resume.txt || fail "did not resume from step 3: $(grep steps resume.txt)"
  cmp full/model_00000006.bin cut/model_00000006.bin || fail "final weights differ"
  cmp full/state_00000006_00000.bin cut/state_00000006_00000.bin || fail "final optimizer state differs"
  diff <(grep '"loss"' full.jsonl | sed 's/"step_time_s.*//' | tail -3) \
       <(grep '"loss"' cut.jsonl | sed 's/"step_time_s.*//' | tail -3) || fail "losses of steps 4-6 differ"
  echo "ok: resumed run is bit-identical (weights, moments, losses)"
  ;;

kill_during_save)
  # writes per checkpoint: model header+params (2), state header+m+v (3), metadata (1); the
  # 8th write is inside the second checkpoint's model file, the 9th inside its optimizer state
  train --ckpt-dir ref --ckpt-every 2 >/dev/null || fail "reference run"
  for point in 8 9; do
    rm -rf ck
    LOOM_FAULT=save-write:$point train --ckpt-dir ck --ckpt-every 2 >/dev/null 2>&1
    [ $? -eq 137 ] || fail "the run was not killed during the save (write $point)"
    [ -f ck/ckpt_00000002.json ] || fail "first checkpoint missing: $(ls ck)"
    [ ! -f ck/ckpt_00000004.json ] || fail "write $point: partial checkpoint marked complete: $(ls ck)"
    [ $point -eq 8 ] && [ -f ck/model_00000004.bin ] && fail "write 8: partial model file visible"
    "$LOOM" eval --model ck/model_00000002.bin --data "$FIX/gpt2_eval_shard.bin" --batch 2 --seq 16 --batches 2 >/dev/null ||
      fail "previous checkpoint not loadable"
    # left: write 8, the model file's temporary; write 9, the model file and the state's temporary
    left=$(ls ck | grep -c -E '\.tmp\.|_00000004')
    [ "$left" -eq $((point - 7)) ] || fail "write $point: expected $((point - 7)) leftovers: $(ls ck)"
    train --ckpt-dir ck --ckpt-every 2 --resume >resume.txt || fail "resume after the crash"
    grep -q "from step 2" resume.txt || fail "did not resume from step 2"
    grep -q "removed $left leftover file.* of an interrupted save from ck" resume.txt || fail "no clean-up: $(head -3 resume.txt)"
    ! ls ck | grep -q '\.tmp\.' || fail "temporaries left: $(ls ck)"
    for f in ck/model_*.bin; do s=${f#ck/model_}; [ -f "ck/ckpt_${s%.bin}.json" ] || fail "$f without metadata"; done
    [ ! -e ck/loom.lock ] || fail "the lock file outlived its run"
    cmp ref/model_00000006.bin ck/model_00000006.bin || fail "weights after crash+resume differ"
  done
  echo "ok: a kill during a save leaves the previous checkpoint; resume removes the leftovers and is exact"
  ;;

bad_input)
  cp "$FIX/gpt2_eval_shard.bin" good.bin
  head -c 5000 good.bin >truncated.bin
  cp good.bin magic.bin && printf '\x01\x00\x00\x00' | dd of=magic.bin bs=1 conv=notrunc status=none
  cp good.bin vocab.bin && printf '\x60\xea' | dd of=vocab.bin bs=1 seek=1100 conv=notrunc status=none
  head -c 100000 "$FIX/gpt2_tiny.bin" >model_short.bin
  M=(--model "$FIX/gpt2_tiny.bin")
  expect_error "truncated.bin" "$LOOM" eval "${M[@]}" --data truncated.bin --batch 1 --seq 8 --batches 1
  expect_error "magic" "$LOOM" eval "${M[@]}" --data magic.bin --batch 1 --seq 8 --batches 1
  expect_error "60000" "$LOOM" eval "${M[@]}" --data vocab.bin --batch 1 --seq 8 --batches 1
  expect_error "header describes" "$LOOM" eval --model model_short.bin --data good.bin
  expect_error "nope.bin" "$LOOM" eval --model nope.bin --data good.bin
  expect_error "missing_*.bin" "$LOOM" eval "${M[@]}" --data 'missing_*.bin'
  expect_error "nope.bin" "$LOOM" train --init nope.bin --train-data good.bin
  expect_error "unknown flag '--bogus'" "$LOOM" train --bogus 3
  expect_error "'abc' is not a finite number" "$LOOM" train --train-data good.bin --lr abc
  expect_error "'x' is not an integer" "$LOOM" eval "${M[@]}" --data good.bin --batch x
  expect_error "needs a value" "$LOOM" eval "${M[@]}" --data good.bin --batch
  expect_error "exceeds" "$LOOM" eval "${M[@]}" --data good.bin --batch 100 --seq 80 --batches 1
  expect_error "exceeds the model's maximum 80" "$LOOM" eval "${M[@]}" --data good.bin --seq 100
  expect_error "exceeds the model's maximum 80" train --seq 100
  expect_error "--global-batch 3" train --global-batch 3
  expect_error "unknown command 'trian'" "$LOOM" trian
  expect_error "unknown model 'gpt5'" "$LOOM" train --model gpt5 --train-data good.bin
  expect_error "--cuda-graphs needs a GPU: the cpu backend" train --cuda-graphs --device cpu
  expect_error "--gemm-autotune times cuBLASLt's matmul algorithms: the cpu backend has one" train --gemm-autotune --device cpu
  expect_error "--gemm-autotune times cuBLASLt's matmul algorithms: the cpu backend has one" "$LOOM" bench --model gpt2-mini --gemm-autotune --device cpu
  expect_error "--cuda-graphs: --offload activations copies" train --cuda-graphs --offload activations
  expect_error "--cuda-graphs: --offload optimizer copies" train --cuda-graphs --offload optimizer
  expect_error "precision fp8 needs a GPU: the cpu backend has no FP8 products" train --precision fp8 --device cpu
  expect_error "unknown precision 'fp4'" train --precision fp4
  expect_error "unknown --fp8-recipe 'current'" train --precision fp8 --fp8-recipe current
  expect_error "--fp8-recipe delayed scales FP8 copies, and --precision bf16 makes none" train --precision bf16 --fp8-recipe delayed
  expect_error "--fp8-history 8 is the delayed recipe's" train --precision fp8 --fp8-history 8
  expect_error "--fp8-history" train --precision fp8 --fp8-recipe delayed --fp8-history 2000
  expect_error "unknown --fp8-recipe 'x'" "$LOOM" bench --model gpt2-mini --precision fp8 --fp8-recipe x
  expect_error "--fp8-fast-dgrad sets how FP8 products accumulate, and --precision bf16 makes none" train --precision bf16 --fp8-fast-dgrad
  expect_error "--fp8-fast-dgrad sets how FP8 products accumulate, and --precision fp32 makes none" "$LOOM" bench --model gpt2-mini --precision fp32 --fp8-fast-dgrad
  expect_error "--global-batch 3 is not a multiple of 2" "$LOOM" bench --model gpt2-mini --batch 2 --global-batch 3
  # a failing run must not touch an existing checkpoint folder
  train --ckpt-dir keep --steps 2 >/dev/null || fail "setup run"
  before=$(cd keep && md5sum ./*)
  expect_error "'abc' is not a finite number" train --ckpt-dir keep --resume --lr abc
  expect_error "not B=3" train --ckpt-dir keep --resume --batch 3 --global-batch 6
  [ "$(cd keep && md5sum ./*)" = "$before" ] || fail "checkpoint folder changed by a failed run"
  ;;

tokenize)
  # a text file and three JSON Lines records -> shards; the split and every token checked
  # against the npm package's encoder (EOT before each document)
  printf 'A plain text document.\nWith two lines, caf\xc3\xa9 and 123.\n' >a.txt
  printf '%s\n' '{"text": "first record", "id": 1}' '' '{"text": "second \u00e9\u4e16 record\nnext line"}' \
    '{"meta": 0, "text": "  third  "}' >docs.jsonl
  "$LOOM" tokenize --out out --name t --val-fraction 0.5 --shard-tokens 7 a.txt docs.jsonl >log.txt || fail "tokenize"
  node -e '
    const enc = require(process.argv[1]); const fs = require("fs");
    const docs = [fs.readFileSync("a.txt", "utf8")].concat(
      fs.readFileSync("docs.jsonl", "utf8").split("\n").filter(l => l.trim()).map(l => JSON.parse(l).text));
    const split = (keep) => docs.filter((_, i) => keep(Math.floor((i + 1) * 0.5) > Math.floor(i * 0.5)))
      .flatMap(d => [50256].concat(enc.encode(d))).join(" ");
    fs.writeFileSync("want_train.txt", split(v => !v) + "\n"); fs.writeFileSync("want_val.txt", split(v => v) + "\n");
  ' "$FIX/../../data/npm/node_modules/gpt-3-encoder" || fail "reference"
  for split in train val; do
    got=$(for f in out/t_${split}_*.bin; do
      n=$(od -An -td4 -j8 -N4 "$f" | tr -d ' ')
      [ "$(od -An -td4 -N4 "$f" | tr -d ' ')" = 20240520 ] || fail "$f magic"
      [ "$(stat -c %s "$f")" -eq $((1024 + 2 * n)) ] || fail "$f size vs count $n"
      [ "$n" -le 7 ] || fail "$f holds $n > 7 tokens"
      od -An -tu2 -v -j1024 "$f"; done | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
    [ "$got" = "$(cat want_$split.txt)" ] || fail "$split tokens: got '$got', want '$(cat want_$split.txt)'"
  done
  echo "ok: $(tail -1 log.txt)"
  printf '%s\n' '{"text": "ok"}' '{"txt": "no text field"}' >bad.jsonl
  expect_error "bad.jsonl:2" "$LOOM" tokenize --out out2 bad.jsonl
  printf '%s\n' '{"text": "ok"' >broken.jsonl
  expect_error "broken.jsonl:1: not valid JSON" "$LOOM" tokenize --out out2 broken.jsonl
  expect_error "nowhere.txt does not exist" "$LOOM" tokenize --out out2 a.txt nowhere.txt
  expect_error "--val-fraction must be in [0, 1), got 1.5" "$LOOM" tokenize --out out2 --val-fraction 1.5 a.txt
  expect_error "unknown input format 'xml'" "$LOOM" tokenize --out out2 --format xml a.txt
  expect_error "'abc' is not a token id" "$LOOM" decode 1 2 abc
  expect_error "token id 60000" "$LOOM" decode 60000
  ;;

*) fail "unknown case" ;;
esac
