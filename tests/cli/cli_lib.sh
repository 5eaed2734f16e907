# Shared by the CLI test scripts (cli_tests.sh, cli_harden.sh, first_hour_tests.sh): sourced with
# CASE, LOOM and FIX set; makes and enters a scratch folder (removed at exit) and defines the
# helpers below.
WORK=$(mktemp -d /tmp/loom_cli_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
fail() { echo "FAIL [$CASE]: $*" >&2; exit 1; }

# A tiny training run on the fixture shard (vocabulary 200), quick on any machine.
train() { "$LOOM" train --init "$FIX/gpt2_tiny.bin" --train-data "$FIX/gpt2_eval_shard.bin" \
    --batch 2 --seq 16 --global-batch 4 --steps 6 --lr 1e-3 --warmup 2 --threads 2 "$@"; }

# Every path and file checksum below the working folder (but the captured output).
snapshot() { find . ! -name out.txt ! -name err.txt | sort; find . -type f ! -name out.txt ! -name err.txt -exec md5sum {} + | sort; }

# expect_error "words in the message" command...: non-zero exit, exactly one line on stderr,
# in loom's error format, naming the problem; and nothing created or changed on disk.
expect_error() {
  local want=$1; shift
  local before; before=$(snapshot)
  "$@" >out.txt 2>err.txt && fail "'$*' succeeded; expected an error about '$want'"
  local lines; lines=$(wc -l <err.txt)
  [ "$lines" -eq 1 ] || fail "'$*' printed $lines lines on stderr: $(cat err.txt)"
  grep -q "^loom: error: " err.txt || fail "error line format: $(cat err.txt)"
  grep -q -F -- "$want" err.txt || fail "'$*' error lacks '$want': $(cat err.txt)"
  [ "$(snapshot)" = "$before" ] || fail "'$*' changed files on disk"
  echo "ok: $(cat err.txt)"
}

# numbers a and b agree within relative tolerance tol
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; exit !(d <= t * b) }'; }
