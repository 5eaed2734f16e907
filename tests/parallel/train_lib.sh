# Shared by dp_tests.sh, tp_tests.sh, pp_tests.sh, fsdp_tests.sh and cp_tests.sh (sourced, with CASE LOOM FIX
# set; COMPARE for parity_check): a scratch folder, failure reporting, mpirun as CI runs it, `loom train` on
# the fixture model and shard, the parity check against one process and the kill-and-resume check.
WORK=$(mktemp -d /tmp/loom_parallel_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
fail() { echo "FAIL [$CASE]: $*" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# lr 5e-4: Adam turns the rounding noise of zero-gradient parameters (attention's key bias)
# into +-lr steps whatever the order of summation, so the parity error grows with lr
ARGS=(--init "$FIX/gpt2_tiny.bin" --train-data "$FIX/gpt2_eval_shard.bin" --seq 16 --lr 5e-4 --warmup 2 --threads 1)
run() { local np=$1; shift; timeout 120 mpirun -np "$np" --oversubscribe "$LOOM" "$@"; }
train() { "$LOOM" train "${ARGS[@]}" "$@"; }
rtrain() { local np=$1; shift; run "$np" train "${ARGS[@]}" "$@"; }
losses() { grep '"loss"' "$1" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
val_losses() { grep val_loss "$1" | sed 's/.*"val_loss":\([^}]*\)}.*/\1/'; }
# rel_err A B: "COUNT WORST" of two columns of numbers (A against B: |a - b| / b)
rel_err() {
  paste <(echo "$1") <(echo "$2") | awk '{ d = $1 - $2; if (d < 0) d = -d; e = d / $2; if (e > w) w = e; n++ }
    END { printf "%d %.3g", n, w }'
}
# expect_mpi_error NP WANT ARGS...: `loom ARGS` on NP ranks exits non-zero with loom's error line
# exactly once, containing WANT, and does not hang
expect_mpi_error() {
  local np=$1 want=$2; shift 2
  run "$np" "$@" >out.txt 2>err.txt && fail "'$*' on $np ranks succeeded"
  [ $? -ne 124 ] || fail "'$*' on $np ranks hung"
  [ "$(grep -c 'loom: error: ' err.txt)" -eq 1 ] || fail "'$*': $(grep -c 'loom: error' err.txt) error lines: $(cat err.txt)"
  grep 'loom: error: ' err.txt | grep -q -F -- "$want" || fail "'$*' error lacks '$want': $(cat err.txt)"
  echo "ok: $(grep 'loom: error: ' err.txt)"
}
# kill_and_resume NP ARGS...: a run of ARGS (--steps 6 --ckpt-every 3) whole into full/, then
# killed after step 4 into cut/ (its checkpoint 3 complete: metadata and every rank's state) and
# resumed there: the final model, every rank's state and the losses of steps 4-6 equal the whole
# run's bit for bit
kill_and_resume() {
  local np=$1; shift
  rtrain "$np" "$@" --ckpt-dir full --metrics full.jsonl >/dev/null 2>&1 || fail "full run"
  LOOM_FAULT=step:4 rtrain "$np" "$@" --ckpt-dir cut --metrics cut.jsonl >/dev/null 2>&1 && fail "the run was not killed"
  [ -f cut/ckpt_00000003.json ] || fail "checkpoint 3 incomplete: $(ls cut)"
  for f in full/state_00000003_*.bin; do [ -f "cut/${f#full/}" ] || fail "the cut run lacks ${f#full/}"; done
  rtrain "$np" "$@" --ckpt-dir cut --metrics cut.jsonl --resume >resume.txt 2>&1 || fail "resume: $(tail -3 resume.txt)"
  grep -q "from step 3" resume.txt || fail "did not resume from step 3"
  cmp full/model_00000006.bin cut/model_00000006.bin || fail "final weights differ"
  for f in full/state_00000006_*.bin; do cmp "$f" "cut/${f#full/}" || fail "${f#full/} differs"; done
  [ "$(grep '"loss"' cut.jsonl | sed 's/"step_time_s.*//' | tail -3)" = \
    "$(grep '"loss"' full.jsonl | sed 's/"step_time_s.*//' | tail -3)" ] || fail "losses of steps 4-6 differ"
}
# parity_check NAME NP GLOBAL FLAGS...: a run of ARGS FLAGS on NP ranks (10 steps of a global batch of
# GLOBAL sequences in micro-batches of 2, with ARGS' validation every 5 steps): its 10 losses, 3
# validation losses and final weights within 1e-5 relative of the one-process run ref_GLOBAL (made
# by the caller with the same ARGS and --ckpt-dir ref_GLOBAL --metrics ref_GLOBAL.jsonl)
# quick_skips NAME: true (with a line saying so) when LOOM_QUICK is set (make test's second pass,
# under ASan + UBSan: scripts/sanitize.sh) and NAME is not in the script's QUICK list; the
# Release pass runs every check.
quick_skips() {
  [ -n "${LOOM_QUICK:-}" ] && [[ " ${QUICK:-} " != *" $1 "* ]] || return 1
  echo "skip (LOOM_QUICK): $1"
}
parity_check() {
  local name=$1 np=$2 g=$3; shift 3
  quick_skips "$name" && return 0
  rtrain "$np" "$@" --batch 2 --global-batch "$g" --steps 10 --bucket-mb 0.01 --ckpt-dir "$name" \
    --metrics "$name.jsonl" >"$name.txt" 2>&1 || fail "$name: $(tail -3 "$name.txt")"
  local l v err
  l=$(rel_err "$(losses "$name.jsonl")" "$(losses "ref_$g.jsonl")")
  v=$(rel_err "$(val_losses "$name.jsonl")" "$(val_losses "ref_$g.jsonl")")
  [ "${l%% *}" -eq 10 ] && awk -v w="${l##* }" 'BEGIN { exit !(w <= 1e-5) }' || fail "$name: losses (count, rel err) $l"
  [ "${v%% *}" -eq 3 ] && awk -v w="${v##* }" 'BEGIN { exit !(w <= 1e-5) }' || fail "$name: validation losses $v"
  err=$("$COMPARE" "$name/model_00000010.bin" "ref_$g/model_00000010.bin" 1e-5) || fail "$name: weights vs one process: $err"
  echo "ok: $name: 10 losses within ${l##* }, 3 validations within ${v##* }, weights $err"
}
