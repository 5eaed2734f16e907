#!/usr/bin/env bash
# Data-parallel training on the CPU under mpirun: dp_tests.sh CASE LOOM COMPARE FIXTURES
#   parity:  for 1-4 ranks and ZeRO 0/1/2, a few steps with gradient accumulation match the
#            one-process run with the same global batch (1e-6 relative); ZeRO 0 and 1 are
#            bit-identical; without accumulation ZeRO 2 is bit-identical to ZeRO 1 too
#   resume:  a 2-rank ZeRO-1 run killed and resumed equals the uninterrupted one bit for bit; one
#            with another global batch is refused; --zero's default, as the checkpoints record it
#            (a resume with another --zero reshards, naming both): 1 on 2 ranks, 0 on one
#   errors:  impossible layouts give one error line and every rank exits non-zero, no hang
#   bench_comm: the bench-comm table's rows and bandwidths; unknown --op and --device-comm
#            values give one error line
#   bench:   `loom bench` over 2 ranks with several buckets: its row adds up (step = fwd + bwd +
#            opt, tokens/s = the step's tokens / step), its wait line is within the step;
#            --bucket-mb 0 gives one error line
set -uo pipefail
CASE=$1 LOOM=$2 COMPARE=$3 FIX=$4
source "$(dirname "$0")/train_lib.sh"
first_loss() { losses "$1" | head -1; }
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; exit !(d <= t * b) }'; }

case $CASE in
parity)
  # global batch 12 = ranks x accumulation x micro-batch 1; small buckets (several, the last ragged)
  train --batch 1 --global-batch 12 --steps 4 --ckpt-dir ref --metrics ref.jsonl >/dev/null || fail "one-process run"
  for np in 1 2 3 4; do
    for z in 0 1 2; do
      rtrain $np --batch 1 --global-batch 12 --steps 4 --zero $z --bucket-mb 0.01 --ckpt-dir d${np}_$z \
        --metrics d${np}_$z.jsonl >log.txt 2>&1 || fail "np=$np zero=$z: $(tail -3 log.txt)"
      err=$("$COMPARE" d${np}_$z/model_00000004.bin ref/model_00000004.bin 1e-6) ||
        fail "np=$np zero=$z vs one process: $err"
      close "$(first_loss d${np}_$z.jsonl)" "$(first_loss ref.jsonl)" 1e-6 || fail "np=$np zero=$z: first loss differs"
      echo "ok: $np ranks, ZeRO $z: weights after 4 steps vs one process: $err"
    done
    "$COMPARE" d${np}_1/model_00000004.bin d${np}_0/model_00000004.bin 0 >/dev/null ||
      fail "np=$np: ZeRO 1 differs from ZeRO 0"
    echo "ok: $np ranks: ZeRO 0 and 1 bit-identical"
  done
  # no accumulation (micro-batch = global batch / ranks), one 25 MB bucket: ZeRO 2 == ZeRO 1
  for np in 2 3; do
    for z in 1 2; do
      rtrain $np --batch $((12 / np)) --global-batch 12 --steps 3 --zero $z --ckpt-dir a${np}_$z >/dev/null 2>&1 ||
        fail "np=$np zero=$z without accumulation"
    done
    "$COMPARE" a${np}_2/model_00000003.bin a${np}_1/model_00000003.bin 0 >/dev/null ||
      fail "np=$np: ZeRO 2 differs from ZeRO 1 without accumulation"
    echo "ok: $np ranks without accumulation: ZeRO 2 bit-identical to ZeRO 1"
  done
  ;;
resume)
  kill_and_resume 2 --batch 1 --global-batch 4 --steps 6 --zero 1 --bucket-mb 0.01 --ckpt-every 3
  rtrain 3 --batch 1 --global-batch 6 --steps 6 --zero 1 --bucket-mb 0.01 --ckpt-dir cut --resume >err.txt 2>&1 &&
    fail "resume on 3 ranks accepted"
  grep -q "trained with B=1 T=16 and a global batch of 4 sequences, not B=1 T=16 and 6" err.txt ||
    fail "wrong-layout resume message: $(cat err.txt)"
  echo "ok: 2-rank ZeRO-1 resume is bit-identical; a resume with another global batch is refused"
  # --zero's default: 1 with several data-parallel ranks, 0 with one (the checkpoint records it)
  rtrain 2 --batch 1 --global-batch 2 --steps 1 --ckpt-dir dflt2 >/dev/null 2>&1 || fail "2 ranks, default --zero"
  rtrain 2 --batch 1 --global-batch 2 --steps 2 --zero 0 --ckpt-dir dflt2 --resume >out.txt 2>&1 ||
    fail "a default 2-rank checkpoint resumed with --zero 0: $(tail -2 out.txt)"
  grep -q "saved over 2 ranks (tp 1 pp 1 cp 1, ZeRO 1, 2 data-parallel); its optimizer state is resharded onto 2 ranks (tp 1 pp 1 cp 1, ZeRO 0" \
    out.txt || fail "2 ranks' default: $(grep note out.txt)"
  train --batch 1 --steps 1 --ckpt-dir dflt1 >/dev/null 2>&1 || fail "1 rank, default --zero"
  train --batch 1 --steps 2 --zero 1 --ckpt-dir dflt1 --resume >out.txt 2>&1 ||
    fail "a default 1-rank checkpoint resumed with --zero 1: $(tail -2 out.txt)"
  grep -q "saved over 1 rank (tp 1 pp 1 cp 1, ZeRO 0, 1 data-parallel); its optimizer state is resharded onto 1 rank (tp 1 pp 1 cp 1, ZeRO 1" \
    out.txt || fail "1 rank's default: $(grep note out.txt)"
  echo "ok: --zero defaults to 1 on 2 data-parallel ranks and to 0 on one"
  ;;
errors)
  expect_mpi_error 3 "--global-batch 4 is not a positive multiple of 3 ranks x --batch 1" train "${ARGS[@]}" --batch 1 --global-batch 4 --steps 1
  expect_mpi_error 2 "--bucket-mb must be in (0, 65536], got 0" train "${ARGS[@]}" --batch 1 --steps 1 --bucket-mb 0
  expect_mpi_error 2 "--zero must be in [-1, 3], got 4" train "${ARGS[@]}" --batch 1 --steps 1 --zero 4
  expect_mpi_error 4 "exceeds the 6000 tokens" train "${ARGS[@]}" --batch 400 --seq 16 --steps 1
  ;;
bench_comm)
  # every op and size gets a row; busbw = algbw x the op's factor for n = 3; algbw = size / time
  # (within the rounding of the printed two decimals)
  run 3 bench-comm --op all --min-bytes 3K --max-bytes 96K --warmup 1 --iters 2 >out.txt 2>err.txt || fail "$(cat err.txt)"
  rows=$(grep -c '^  ' out.txt)
  [ "$rows" -eq 30 ] || fail "$rows rows, want 5 ops x 6 sizes: $(cat out.txt)"
  awk '/^  / { f = ($1 == "allreduce") ? 4/3 : ($1 == "broadcast") ? 1 : 2/3;
               d = $7 - f * $6; if (d < 0) d = -d; if (d > 0.02 * f * $6 + 0.011) { print "busbw factor", $0; bad = 1 }
               a = $2 / ($5 * 1e-6) / 1e9; if ($6 < a * 0.95 - 0.01 || $6 > a * 1.05 + 0.01) { print "algbw", $0; bad = 1 } }
       END { exit bad }' out.txt || fail "inconsistent bandwidths"
  expect=$(run 2 bench-comm --op gather 2>&1 >/dev/null | grep -c "unknown collective 'gather'")
  [ "$expect" -eq 1 ] || fail "unknown op not reported once"
  run 2 bench-comm --device-comm shm >/dev/null 2>err.txt && fail "--device-comm shm accepted"
  [ "$(grep -c 'loom: error: ' err.txt)" -eq 1 ] || fail "--device-comm shm: not one error line: $(cat err.txt)"
  grep 'loom: error: ' err.txt | grep -q -F "unknown --device-comm 'shm'" || fail "--device-comm shm: $(cat err.txt)"
  echo "ok: bench-comm table over 3 ranks ($rows rows, busbw factors checked)"
  ;;
bench)
  # ZeRO 0 over 2 ranks, buckets of 0.05 MiB (the all-gathers start during backward); the global
  # batch is 2 ranks x 2 sequences of 64 tokens
  run 2 bench --model gpt2-mini --layers 2 --batch 2 --seq 64 --zero 0 --bucket-mb 0.05 --steps 2 --warmup 1 \
    --device cpu --threads 1 >out.txt 2>err.txt || fail "$(cat err.txt)"
  awk -F'|' '/^\| *[0-9]/ { n++; d = $2 - ($3 + $4 + $5); if (d < 0) d = -d; if (d > 0.2) { print "step", $0; bad = 1 }
                            t = 256 / ($2 / 1000); if ($6 < 0.98 * t || $6 > 1.02 * t) { print "tokens/s", $0; bad = 1 } }
       END { exit bad || n != 1 }' out.txt || fail "the bench row does not add up: $(cat out.txt)"
  # the ranks' waits for the slowest: one line, the longest first, both within the step (a median
  # of waits, each inside its step's fwd + bwd, is at most the median of those)
  step=$(awk -F'|' '/^\| *[0-9]/ { print $2 }' out.txt)
  awk -v step="$step" '/^wait ms: / { n++; hi = $3; lo = $7; if (!(0 <= lo && lo <= hi && hi <= step)) bad = 1 }
       END { exit bad || n != 1 }' out.txt || fail "the wait line is missing or out of bounds (step $step ms): $(cat out.txt)"
  run 2 bench --model gpt2-mini --bucket-mb 0 --device cpu >/dev/null 2>err.txt && fail "--bucket-mb 0 accepted"
  [ "$(grep -c 'loom: error: ' err.txt)" -eq 1 ] && grep -q -F -- "--bucket-mb must be in (0, 65536], got 0" err.txt ||
    fail "--bucket-mb 0: $(cat err.txt)"
  echo "ok: bench over 2 ranks: $(grep -E '^\| *[0-9]' out.txt); $(grep -o '^wait ms: [^:]*' out.txt)"
  ;;
*) fail "unknown case" ;;
esac
