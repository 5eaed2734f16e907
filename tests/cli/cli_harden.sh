#!/usr/bin/env bash
# Bad input that loom refuses with one clear line instead of crashing, hanging or going on:
# `cli_harden.sh CASE LOOM FIXTURES`. Each case exits non-zero on failure, printing what differed.
set -uo pipefail
CASE=$1 LOOM=$2 FIX=$3
source "$(dirname "$0")/cli_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# put FILE OFFSET BYTES: overwrite bytes (printf escapes) in place
put() { printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
# int64 at byte OFFSET of FILE
i64() { od -An -td8 -j"$2" -N8 "$1" | tr -d ' '; }
# the optimizer state's checksum (header[10]) recomputed over its payload, as a save writes it:
# the CRC-32 of gzip's trailer, little-endian
fix_crc() { put "$1" 80 "$(tail -c +257 "$1" | gzip -c | tail -c 8 | head -c 4 | od -An -tx1 | sed 's/ /\\x/g')"; }
# edit_json FILE 'JS statements on j'
edit_json() {
  node -e 'const fs = require("fs"), f = process.argv[1], j = JSON.parse(fs.readFileSync(f, "utf8"));
           new Function("j", process.argv[2])(j); fs.writeFileSync(f, JSON.stringify(j, null, 1));' "$1" "$2"
}
EVAL=(--data "$FIX/gpt2_eval_shard.bin" --batch 1 --seq 8 --batches 1)

case $CASE in
nonfinite)
  # model files holding NaN, and a finite model whose loss overflows
  cp "$FIX/gpt2_tiny.bin" nan.bin && put nan.bin $((1024 + 4 * 100)) '\x00\x00\xc0\x7f'
  expect_error "model file nan.bin: parameter 100 of" "$LOOM" eval --model nan.bin "${EVAL[@]}"
  expect_error "is nan, not a finite number" train --init nan.bin
  cp "$FIX/gpt2_tiny.bin" huge.bin
  for k in 0 1 2 3; do put huge.bin $((1024 + 4 * k)) '\xff\xff\x7f\x7f'; done # FLT_MAX in wte
  expect_error "not a finite number" "$LOOM" eval --model huge.bin "${EVAL[@]}"
  # optimizer state: a flipped byte fails the checksum; a negative second moment with a valid
  # checksum is refused by value
  train --steps 2 --ckpt-dir ck >/dev/null || fail "setup run"
  S=ck/state_00000002_00000.bin n=$(i64 ck/state_00000002_00000.bin 40)
  cp "$S" state.orig
  put "$S" $((256 + 4 * n + 4 * 5)) '\x00\x00\x80\xbf' # v[5] = -1
  expect_error "checksum" train --steps 4 --ckpt-dir ck --resume
  fix_crc "$S"
  expect_error "second moment 5 of $n is -1, below 0" train --steps 4 --ckpt-dir ck --resume
  cp state.orig "$S"
  cp ck/model_00000002.bin model.orig
  put ck/model_00000002.bin $((1024 + 4 * 7)) '\x01' # still a finite parameter: only the checksum sees it
  expect_error "model file ck/model_00000002.bin: checksum" train --steps 4 --ckpt-dir ck --resume
  cp model.orig ck/model_00000002.bin
  train --steps 4 --ckpt-dir ck --resume >/dev/null || fail "the restored checkpoint does not resume"
  # a diverging run (lr 1e30) stops at its first step whose loss or norm is not finite, naming
  # it, and saves nothing of it; with --skip-nonfinite such steps are skipped and counted
  train --lr 1e30 --warmup 0 --ckpt-dir dv --ckpt-every 1 >out.txt 2>err.txt && fail "a diverging run succeeded"
  [ "$(wc -l <err.txt)" -eq 1 ] && grep -Eq "^loom: error: step 2: loss -?nan, gradient norm -?nan: not finite" err.txt ||
    fail "diverging run: $(cat err.txt)"
  [ "$(ls dv | tr '\n' ' ')" = "ckpt_00000001.json model_00000001.bin state_00000001_00000.bin " ] ||
    fail "checkpoints of the diverged run: $(ls dv)"
  train --lr 1e30 --warmup 0 --ckpt-dir sk --ckpt-every 1 --skip-nonfinite >out.txt || fail "--skip-nonfinite run"
  grep -q "skipped 5 of 6 steps: loss or gradient norm not finite" out.txt || fail "no count: $(tail -3 out.txt)"
  cmp sk/model_00000001.bin sk/model_00000006.bin || fail "a skipped step changed the parameters"
  echo "ok: diverging run stopped at step 2; --skip-nonfinite skipped 5 of 6 steps"
  ;;

ranges)
  expect_error "--threads must be in [0, 1024], got 100000" train --threads 100000
  expect_error "--global-batch must be in [0, 1048576], got 2147483646" train --global-batch 2147483646
  expect_error "--sample-tokens must be in [1, 1048576], got 2147483647" train --sample-tokens 2147483647
  expect_error "--logits-chunk must be in [0, 16777216], got -1" "$LOOM" bench --logits-chunk -1
  for f in layers max-seq; do expect_error "--$f must be in [0, " train --$f -1; done
  expect_error "--steps must be in [1, 1000000000000], got 0" train --steps 0
  expect_error "--lr must be > 0, got 0" train --lr 0
  expect_error "--beta2 must be in [0, 1), got 1" train --beta2 1
  expect_error "--beta2 must be in [0, 1), got .99999999991 (1 as a float)" train --beta2 .99999999991
  expect_error "--bucket-mb must be in (0, 65536], got 1e6" train --bucket-mb 1e6
  expect_error "--seed must be >= 0, got -1" train --seed -1
  expect_error "--batch must be in [1, 65536], got 0" "$LOOM" eval --model "$FIX/gpt2_tiny.bin" --data x --batch 0
  expect_error "--tokens must be in [1, 1048576], got 0" "$LOOM" sample --model "$FIX/gpt2_tiny.bin" --tokens 0
  expect_error "--threads must be in [0, 1024], got -1" "$LOOM" tokenize --out o --threads -1 x.txt
  expect_error "--micro-batches must be in [1, 1024], got 0" "$LOOM" schedule --micro-batches 0
  expect_error "--iters must be in [1, 1000000], got 0" "$LOOM" bench-comm --iters 0
  expect_error "--max-bytes: '1e30' is not a size from 1 byte to 1024G" "$LOOM" bench-comm --max-bytes 1e30
  expect_error "--steps must be in [1, 1000000], got 0" "$LOOM" bench --steps 0
  # every numeric flag of every command documents its range in --help
  for c in tokenize encode decode train eval sample bench bench-comm schedule; do
    "$LOOM" $c --help >help.txt || fail "$c --help"
    bare=$(grep -E '\(default -?[0-9][0-9.e+-]*\)$' help.txt) && fail "$c: numeric flags without a range: $bare"
  done
  echo "ok: every numeric flag has its range, printed by --help"
  ;;

not_regular)
  mkfifo fifo && mkdir adir && touch afile
  expect_error "input fifo is a FIFO (named pipe), not a file or folder" timeout 20 "$LOOM" tokenize --out o fifo
  expect_error "token shard fifo is a FIFO (named pipe), not a regular file" timeout 20 "$LOOM" eval --model "$FIX/gpt2_tiny.bin" --data fifo
  expect_error "token shard adir is a directory, not a regular file" "$LOOM" eval --model "$FIX/gpt2_tiny.bin" --data adir
  expect_error "model file adir is a directory, not a regular file" "$LOOM" eval --model adir "${EVAL[@]}"
  expect_error "model file fifo is a FIFO (named pipe), not a regular file" timeout 20 "$LOOM" eval --model fifo "${EVAL[@]}"
  expect_error "file fifo is a FIFO (named pipe), not a regular file" timeout 20 "$LOOM" encode fifo
  expect_error "checkpoint folder afile is a regular file, not a folder" train --ckpt-dir afile
  ;;

ckpt_meta)
  train --steps 2 --ckpt-dir ck >/dev/null || fail "setup run"
  M=ck/ckpt_00000002.json
  cp $M meta.orig
  # bad "words of the error" 'edit of j': the edited metadata is refused on resume, nothing changes
  bad() { cp meta.orig $M; edit_json $M "$2"; expect_error "$1" train --steps 4 --ckpt-dir ck --resume; }
  bad "'format' is not \"loom-checkpoint\"" 'j.format = "other"'
  bad "version 99; this loom reads versions 3 to 4" 'j.version = 99'
  bad "'seed' is '12abc', not an unsigned 64-bit integer" 'j.seed = "12abc"'
  bad "'seed' is '-1', not an unsigned 64-bit integer" 'j.seed = "-1"'
  bad "'seed' is '18446744073709551616'" 'j.seed = "18446744073709551616"'
  bad "'state_files' is 1000000000, but ZeRO 0 on 1 ranks saves 1" 'j.state_files = 1e9'
  bad "'world_size' is 0, not an integer in [1, " 'j.world_size = 0'
  bad "'step' is 5, not 2" 'j.step = 5'
  bad "'data_position' is 7, but 2 steps of 1 dp ranks x accumulation 2 make 4" 'j.data_position = 7'
  bad "1 ranks do not fill a mesh of tp 2" 'j.tp = 2'
  bad "'model' is not \"model_00000002.bin\"" 'j.model = "../model.bin"'
  bad "'states' is not a list of state_files = 1 names" 'j.states = []'
  bad "'states' entry 0 is not \"state_00000002_00000.bin\"" 'j.states = ["state_00000001_00000.bin"]'
  bad "'model_crc32' is -5, not an integer" 'j.model_crc32 = -5'
  cp meta.orig $M
  mv ck/model_00000002.bin model.bin
  expect_error "names model file ck/model_00000002.bin, which is missing" train --steps 4 --ckpt-dir ck --resume
  mv model.bin ck/model_00000002.bin
  train --steps 4 --ckpt-dir ck --resume >/dev/null || fail "the restored checkpoint does not resume"
  ;;

output_errors)
  expect_error "cannot write metrics file /dev/full: No space left on device" train --metrics /dev/full
  expect_error "cannot write in checkpoint folder /proc" train --ckpt-dir /proc
  ! grep -q "^step" out.txt || fail "trained before finding --ckpt-dir unwritable: $(grep ^step out.txt | head -2)"
  ;;

lock)
  # a run holds busy/ (its output goes outside the scratch folder, which expect_error watches)
  "$LOOM" train --init "$FIX/gpt2_tiny.bin" --train-data "$FIX/gpt2_eval_shard.bin" --batch 2 --seq 16 --threads 1 \
    --steps 1000000 --ckpt-dir busy >/dev/null 2>&1 &
  pid=$!
  for i in $(seq 100); do grep -q "^pid $pid on" busy/loom.lock 2>/dev/null && break; sleep 0.2; done
  grep -q "^pid $pid on" busy/loom.lock 2>/dev/null || { kill $pid; fail "the run did not take the lock"; }
  expect_error "checkpoint folder busy is in use by another run (pid $pid on" train --ckpt-dir busy --resume
  kill -9 $pid
  wait $pid 2>/dev/null
  train --ckpt-dir busy --steps 2 --resume >/dev/null || fail "the lock of a killed run blocks the next one"
  echo "ok: a second run on a held checkpoint folder names the holder; a killed holder blocks nothing"
  ;;

orphan)
  # mpirun killed while rank 0 writes checkpoint 2 (LOOM_FAULT=...:parent on rank 0 only): both
  # ranks finish writing their files, see their launcher gone and stop without the metadata
  A=(train --init "$FIX/gpt2_tiny.bin" --train-data "$FIX/gpt2_eval_shard.bin" --batch 2 --seq 16 --global-batch 4
     --steps 6 --threads 1 --ckpt-dir "$WORK/orph" --ckpt-every 2)
  mpirun -np 1 --oversubscribe env LOOM_FAULT=save-write:1:parent "$LOOM" "${A[@]}" : \
         -np 1 --oversubscribe "$LOOM" "${A[@]}" >mpi.txt 2>&1
  [ $? -eq 137 ] || fail "mpirun was not killed: $(tail -3 mpi.txt)"
  for i in $(seq 100); do pgrep -f -- "--ckpt-dir $WORK/orph" >/dev/null || break; sleep 0.2; done
  if pids=$(pgrep -f -- "--ckpt-dir $WORK/orph"); then kill -9 $pids; fail "ranks still running 20 s after mpirun died"; fi
  [ -f orph/model_00000002.bin ] || fail "rank 0 did not go on writing after mpirun died (test set-up): $(ls orph)"
  [ ! -f orph/ckpt_00000002.json ] || fail "orphaned ranks committed checkpoint 2"
  echo "ok: orphaned ranks stopped before committing the checkpoint"
  ;;

messages)
  train --steps 2 --ckpt-dir fresh --resume >out.txt || fail "--resume on an empty folder"
  grep -q "note: --resume: no checkpoint in fresh yet, so the run starts from step 0" out.txt || fail "no note: $(head -2 out.txt)"
  train --steps 4 --ckpt-dir ext >/dev/null || fail "setup run"
  train --steps 8 --ckpt-dir ext --resume >out.txt || fail "resume with more steps"
  grep -q "note: --steps 8 differs from the checkpoint's 4: the learning-rate schedule now ends at step 8" out.txt ||
    fail "no note on the schedule: $(grep -i note out.txt)"
  mpirun -np 2 --oversubscribe "$LOOM" train --init "$FIX/gpt2_tiny.bin" --train-data "$FIX/gpt2_eval_shard.bin" \
    --batch 2 --seq 16 --global-batch 4 --steps 2 --threads 1 --ckpt-dir two >/dev/null 2>&1 || fail "2-rank run"
  expect_error "checkpoint step 2 was trained with B=2 T=16 and a global batch of 4 sequences, not B=2 T=16 and 8" \
    train --ckpt-dir two --resume --steps 4 --global-batch 8
  ;;

*) fail "unknown case" ;;
esac
