#!/usr/bin/env bash
# `loom launch`: a 2-rank job that crashes or hangs is stopped, restarted from its last checkpoint
# and ends with the files of an uninterrupted run, bit for bit; a stopped launcher stops its job;
# bad input is refused with one line. `launch_tests.sh CASE LOOM FIXTURES`.
set -uo pipefail
CASE=$1 LOOM=$2 FIX=$3
source "$(dirname "$0")/cli_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# the job's loom train words: 2 ranks x accumulation 2, a checkpoint every 2 steps, --resume
job() { echo train --init "$FIX/gpt2_tiny.bin" --train-data "$FIX/gpt2_eval_shard.bin" --batch 2 --seq 16 \
  --global-batch 8 --lr 1e-3 --warmup 2 --threads 1 --ckpt-every 2 --resume "$@"; }
mpi() { mpirun -np 2 --oversubscribe "$@"; }

# same_files A B STEP: B holds checkpoint STEP's model and both ranks' optimizer states as A does
same_files() {
  for f in model_$(printf %08d "$3").bin state_$(printf %08d "$3")_0000{0,1}.bin; do
    [ -f "$2/$f" ] || fail "$2/$f missing: $(ls "$2")"
    cmp -s "$1/$f" "$2/$f" || fail "$2/$f differs from the uninterrupted run's"
  done
}

# wait_ckpt2 DIR LOG: until DIR's checkpoint 2 is complete (20 s at most; else the LOG's tail)
wait_ckpt2() {
  for i in $(seq 200); do [ -f "$1/ckpt_00000002.json" ] && return 0; sleep 0.1; done
  fail "no checkpoint 2 in $1 within 20 s: $(tail -3 "$2")"
}

# long_job NAME: `loom launch` of a 2-rank job without end into NAME/ (stdout NAME.out, stderr
# NAME.err) in the background, its pid in $launcher; returns once its checkpoint 2 is complete
long_job() {
  "$LOOM" launch -- mpirun -np 2 --oversubscribe "$LOOM" $(job --steps 1000000 --ckpt-dir "$WORK/$1") \
    >"$1.out" 2>"$1.err" &
  launcher=$!
  wait_ckpt2 "$1" "$1.err"
}

# no process of the job left (its folder is on every rank's command line)
none_left() {
  if pids=$(pgrep -f -- "--ckpt-dir $WORK/$1"); then kill -9 $pids; fail "job processes left running: $pids"; fi
}

case $CASE in
crash)
  # both ranks killed after step 5 (LOOM_FAULT=step:5, before checkpoint 6): the launcher
  # restarts the job, which resumes at step 4 and runs to 8 (the new processes count from 0)
  mpi "$LOOM" $(job --steps 8 --ckpt-dir "$WORK/ref") >ref.txt 2>&1 || fail "reference run: $(tail -3 ref.txt)"
  LOOM_FAULT=step:5 "$LOOM" launch --max-restarts 2 -- mpirun -np 2 --oversubscribe "$LOOM" \
    $(job --steps 8 --ckpt-dir "$WORK/run") >out.txt 2>err.txt || fail "launch failed: $(tail -3 err.txt)"
  grep -q "attempt 1 ended after .* s: exit status [0-9]*; restarting from the last checkpoint (restart 1 of 2)" err.txt ||
    fail "no restart line: $(grep 'loom launch' err.txt)"
  grep -q "loom launch: the job finished in .* s, attempt 2 (1 restart)" err.txt || fail "$(grep 'loom launch' err.txt)"
  grep -q "steps .* 8 (from step 4)" out.txt || fail "the second attempt did not resume at step 4"
  same_files ref run 8
  none_left run
  echo "ok: crashed at step 5, restarted from checkpoint 4, checkpoint 8 equals the uninterrupted run's"
  ;;

hang)
  # rank 1 stops after step 3 (LOOM_FAULT=step:3:hang) while rank 0 waits in step 4's
  # collectives: the watchdog names rank 1 as behind, stops the job and restarts it; the second
  # attempt resumes at step 2 and finishes at 4, before rank 1's third step there
  mpi "$LOOM" $(job --steps 4 --ckpt-dir "$WORK/ref") >ref.txt 2>&1 || fail "reference run: $(tail -3 ref.txt)"
  "$LOOM" launch --max-restarts 1 --hang-timeout 8 --grace 2 -- \
    mpirun -np 1 --oversubscribe "$LOOM" $(job --steps 4 --ckpt-dir "$WORK/run") : \
           -np 1 --oversubscribe env LOOM_FAULT=step:3:hang "$LOOM" $(job --steps 4 --ckpt-dir "$WORK/run") \
    >out.txt 2>err.txt &
  launcher=$!
  # SIGUSR1 while rank 1 hangs: the report, and the job goes on to the watchdog
  wait_ckpt2 run err.txt
  sleep 2
  kill -USR1 $launcher
  wait $launcher || fail "launch failed: $(tail -3 err.txt)"
  grep -q "attempt 1 hung: no rank made progress for 8 s" err.txt || fail "no hang line: $(grep 'loom launch' err.txt)"
  grep -q "attempt 1, .* s in (SIGUSR1); where each rank is:" err.txt || fail "no SIGUSR1 report: $(grep 'loom launch' err.txt)"
  grep -q "rank 0 (pid [0-9]*): step, step 4, .* collectives" err.txt || fail "rank 0's record: $(grep rank err.txt)"
  grep -q "rank 1 (pid [0-9]*): stepped, step 3, .* <- behind: the others wait for it" err.txt ||
    fail "rank 1 not named as behind: $(grep rank err.txt)"
  grep -q "rank 0 .*<- behind" err.txt && fail "rank 0 named as behind: $(grep rank err.txt)"
  grep -q "loom launch: the job finished in .* s, attempt 2 (1 restart)" err.txt || fail "$(grep 'loom launch' err.txt)"
  same_files ref run 4
  none_left run
  echo "ok: rank 1's hang found and named, the job restarted, checkpoint 4 equals the uninterrupted run's"
  ;;

stop)
  # SIGTERM to the launcher stops the job (no restart), leaves no process and frees the folder
  long_job run
  kill -TERM $launcher
  wait $launcher && fail "the stopped launcher exited 0"
  grep -q "loom: error: loom launch was stopped by signal 15 (Terminated), and stopped the job" run.err ||
    fail "$(tail -2 run.err)"
  grep -q "restarting" run.err && fail "restarted after SIGTERM"
  none_left run
  mpi "$LOOM" $(job --steps 1 --ckpt-dir "$WORK/run") >again.txt 2>&1 || fail "folder still locked: $(tail -2 again.txt)"
  # a launcher killed by SIGKILL: its command gets SIGTERM (the parent-death signal) and mpirun
  # stops the ranks
  long_job run9
  kill -KILL $launcher
  for i in $(seq 100); do pgrep -f -- "--ckpt-dir $WORK/run9" >/dev/null || break; sleep 0.2; done
  none_left run9
  echo "ok: SIGTERM stopped the job, nothing left running, the folder free; SIGKILL to the launcher stopped it too"
  ;;

bad_input)
  expect_error "loom launch needs the job after '--'" "$LOOM" launch --max-restarts 1
  expect_error "--max-restarts must be in [0, 1000000], got -1" "$LOOM" launch --max-restarts -1 -- true
  expect_error "--hang-timeout must be in [0, 10000000], got -5" "$LOOM" launch --hang-timeout -5 -- true
  expect_error "cannot run 'no-such-command-x': No such file or directory" "$LOOM" launch -- no-such-command-x
  expect_error "the job has no --resume, so each restart would train from step 0 again" \
    "$LOOM" launch -- "$LOOM" train --init "$FIX/gpt2_tiny.bin" --ckpt-dir x
  # a job that fails every time: 1 + 2 attempts, then one error line naming the last failure
  "$LOOM" launch --max-restarts 2 -- sh -c 'exit 3' 2>err.txt && fail "a failing job succeeded"
  [ "$(grep -c 'exit status 3; restarting' err.txt)" -eq 2 ] || fail "$(cat err.txt)"
  grep -q "loom: error: the job ended without success 3 times (last: exit status 3)" err.txt || fail "$(cat err.txt)"
  echo "ok: a job failing every time ends after 3 attempts"
  ;;

*) fail "unknown case" ;;
esac
