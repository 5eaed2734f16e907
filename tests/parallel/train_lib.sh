# Shared by dp_tests.sh and tp_tests.sh (sourced, with CASE LOOM FIX set): a scratch folder,
# failure reporting, mpirun as CI runs it, and `loom train` on the fixture model and shard.
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
