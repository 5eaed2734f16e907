#!/usr/bin/env bash
# `loom schedule` end to end: schedule_tests.sh CASE LOOM
#   timeline: each schedule's drawing has one row per rank and the closed-form bubble line
#   errors:   bad values exit 1 with one `loom: error: ... (hint: ...)` line and print nothing else
set -uo pipefail
CASE=$1 LOOM=$2
OUT=$(mktemp -d /tmp/loom_schedule_XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail() { echo "FAIL [$CASE]: $*" >&2; exit 1; }

# expect_timeline "flags" "bubble line" ranks
expect_timeline() {
  local flags=$1 want=$2 ranks=$3
  # shellcheck disable=SC2086
  "$LOOM" schedule $flags >"$OUT/out.txt" 2>"$OUT/err.txt" || fail "'$flags' exited non-zero: $(cat "$OUT/err.txt")"
  [ -s "$OUT/err.txt" ] && fail "'$flags' wrote to stderr: $(cat "$OUT/err.txt")"
  grep -q -F -x "$want" "$OUT/out.txt" || fail "'$flags' lacks '$want': $(grep bubble "$OUT/out.txt")"
  [ "$(grep -c '^rank ' "$OUT/out.txt")" -eq "$ranks" ] || fail "'$flags' does not draw $ranks ranks"
  grep -q "^peak in flight per rank:" "$OUT/out.txt" || fail "'$flags' has no peak line"
  echo "ok: $flags: $want"
}

# expect_error "words" flags...
expect_error() {
  local want=$1; shift
  "$LOOM" schedule "$@" >"$OUT/out.txt" 2>"$OUT/err.txt"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "'$*' exited $rc, not 1"
  [ -s "$OUT/out.txt" ] && fail "'$*' printed to stdout: $(head -3 "$OUT/out.txt")"
  [ "$(wc -l <"$OUT/err.txt")" -eq 1 ] || fail "'$*' printed $(wc -l <"$OUT/err.txt") lines: $(cat "$OUT/err.txt")"
  grep -q "^loom: error: .* (hint: .*)$" "$OUT/err.txt" || fail "'$*': error line format: $(cat "$OUT/err.txt")"
  grep -q -F -- "$want" "$OUT/err.txt" || fail "'$*' error lacks '$want': $(cat "$OUT/err.txt")"
  echo "ok: $(cat "$OUT/err.txt")"
}

case $CASE in
timeline)
  # pp 4, M 8: (pp-1)/(M+pp-1) = 3/11; interleaved V 2: 3/19; zb-h1 3/27; zb-v and dualpipev 3/51
  expect_timeline "--pp 4 --micro-batches 8 --pp-schedule gpipe" "bubble: 0.272727 (36 idle of 132 rank-time units)" 4
  expect_timeline "--pp 4 --micro-batches 8 --pp-schedule 1f1b" "bubble: 0.272727 (36 idle of 132 rank-time units)" 4
  expect_timeline "--pp 4 --micro-batches 8 --pp-schedule interleaved --virtual-stages 2" \
    "bubble: 0.157895 (36 idle of 228 rank-time units)" 4
  expect_timeline "--pp 4 --micro-batches 8 --pp-schedule zb-h1" "bubble: 0.111111 (12 idle of 108 rank-time units)" 4
  expect_timeline "--pp 4 --micro-batches 8 --pp-schedule zb-v" "bubble: 0.058824 (12 idle of 204 rank-time units)" 4
  expect_timeline "--pp 4 --micro-batches 8 --pp-schedule dualpipev" "bubble: 0.058824 (12 idle of 204 rank-time units)" 4
  expect_timeline "--pp 8 --micro-batches 32 --pp-schedule interleaved --virtual-stages 4" \
    "bubble: 0.051852 (168 idle of 3240 rank-time units)" 8
  expect_timeline "--pp 1 --micro-batches 3" "bubble: 0.000000 (0 idle of 9 rank-time units)" 1
  grep -q "^peak in flight per rank: 4 3 2 1$" <("$LOOM" schedule --pp 4 --micro-batches 8 --pp-schedule 1f1b) ||
    fail "1f1b peaks are not 4 3 2 1"
  ;;
errors)
  expect_error "--pp must be in [1, 64], got 0" --pp 0
  expect_error "--pp must be in [1, 64], got 65" --pp 65
  expect_error "--micro-batches must be in [1, 1024], got 0" --micro-batches 0
  expect_error "unknown pipeline schedule 'zb-h2'" --pp-schedule zb-h2
  expect_error "--virtual-stages 2 is for the interleaved schedule, not --pp-schedule 1f1b" --virtual-stages 2
  expect_error "needs --virtual-stages 2 or more, got 0" --pp-schedule interleaved
  expect_error "a multiple of --pp 4, got 6" --pp-schedule interleaved --virtual-stages 2 --micro-batches 6
  expect_error "at least 2 x --pp = 8 micro-batches, got 6" --pp-schedule dualpipev --micro-batches 6
  expect_error "at least --pp 4 micro-batches, got 3" --pp-schedule zb-v --micro-batches 3
  expect_error "'x' is not an integer" --pp x
  ;;
*) fail "unknown case" ;;
esac
