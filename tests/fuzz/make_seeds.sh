#!/usr/bin/env bash
# Regenerates the committed seed corpora in tests/fuzz/corpus/<target>/ (a few small valid
# inputs per target). Files of loom's own formats are written by loom itself (build/loom:
# tokenize, and one 1-step training run of a tiny model with a checkpoint); the rest are
# written by hand below (python3 only packs the hand-made binary headers). Not run by CI: the
# seeds are committed, and scripts/fuzz.sh only reads them.
#   usage: tests/fuzz/make_seeds.sh [LOOM_BINARY]   (default build/loom)
set -euo pipefail
cd "$(dirname "$0")/../.."
LOOM="$(realpath "${1:-build/loom}")"
C=tests/fuzz/corpus
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
mkdir -p $C/{shard,llmc_model,ckpt_meta,ckpt_state,tokenizer_bytes,tokenizer_jsonl,flags}

# ---- hand-made binaries: a shard of 200 small ids, an empty shard, tiny fp32/bf16 models,
# optimizer states of 16 elements (fp32, with master weights, and with FP8 scaling state too) ----
python3 - "$W" "$C" <<'PY'
import struct, sys, zlib
w, c = sys.argv[1], sys.argv[2]
toks = [(i * 7 + 3) % 32 for i in range(200)]
hdr = lambda *v: struct.pack('<256i', *(list(v) + [0] * (256 - len(v))))
open(f'{w}/tiny_train_000000.bin', 'wb').write(hdr(20240520, 1, len(toks)) + struct.pack(f'<{len(toks)}H', *toks))
open(f'{c}/shard/tiny_ids.bin', 'wb').write(open(f'{w}/tiny_train_000000.bin', 'rb').read())
open(f'{c}/shard/empty.bin', 'wb').write(hdr(20240520, 1, 0))
# L=1 NH=1 C=1 maxT=1 V=1 Vp=1: (Vp + maxT) C + L (12 C^2 + 13 C) + 2 C = 29 elements
n = 29
vals = [0.5 * ((i % 5) - 2) for i in range(n)]
open(f'{c}/llmc_model/min_fp32.bin', 'wb').write(hdr(20240326, 3, 1, 1, 1, 1, 1, 1) + struct.pack(f'<{n}f', *vals))
bf16 = [struct.unpack('<I', struct.pack('<f', v))[0] >> 16 for v in vals]
open(f'{c}/llmc_model/min_bf16.bin', 'wb').write(hdr(20240326, 5, 1, 1, 1, 1, 1, 1) + struct.pack(f'<{n}H', *bf16))
def state(master, version=3, fp8=()):  # 3, 4: header[10] is the CRC-32 of the payload (2 has none); 4: header[11] FP8 values
    payload = b''.join(struct.pack('<16f', *[0.01 * (i + k) for i in range(16)]) for k in range(3 if master else 2))
    payload += struct.pack(f'<{len(fp8)}f', *fp8)
    crc = zlib.crc32(payload) if version >= 3 else 0
    h = struct.pack('<32q', *([20241122, version, 0, 1, 1, 16, 8, 1337, 1, int(master), crc, len(fp8)] + [0] * 20))
    return h + payload
open(f'{c}/ckpt_state/n16_fp32.bin', 'wb').write(state(False))
open(f'{c}/ckpt_state/n16_master.bin', 'wb').write(state(True))
open(f'{c}/ckpt_state/n16_version2.bin', 'wb').write(state(False, 2))
# FP8 delayed scaling's state (backend.h's fp8_save): history 2, 3 slots, ring position 1, their flags, their rings
open(f'{c}/ckpt_state/n16_fp8.bin', 'wb').write(state(True, 4, [2, 3, 1, 1, 0, 1, 0.5, 0.7, 0, 0, 3.1, 2.9]))
PY

# ---- made by loom: a GPT-2 shard, and a checkpoint of a tiny model (V=32, L=1, C=4) ----
printf 'The jury said it did find that many of the voters were "confused".\n' > "$W/doc.txt"
"$LOOM" tokenize --out "$W/tok" --val-fraction 0 "$W/doc.txt" >/dev/null
cp "$W"/tok/data_train_000000.bin $C/shard/gpt2_sentence.bin
"$LOOM" train --train-data "$W/tiny_train_000000.bin" --vocab 32 --layers 1 --heads 1 --channels 4 \
  --max-seq 8 --batch 1 --seq 8 --steps 1 --threads 1 --ckpt-dir "$W/ck" >/dev/null
cp "$W"/ck/model_00000001.bin $C/llmc_model/loom_tiny.bin
cp "$W"/ck/state_00000001_00000.bin $C/ckpt_state/loom_tiny.bin
cp "$W"/ck/ckpt_00000001.json $C/ckpt_meta/loom_tiny.json
# the same metadata compact, and as an older loom wrote it (version 3: without the pipeline's
# fields, the model's checksum and the schedule's horizon)
python3 - "$W/ck/ckpt_00000001.json" "$C/ckpt_meta" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
open(f'{sys.argv[2]}/compact.json', 'w').write(json.dumps(j, separators=(',', ':')))
for k in ('virtual_stages', 'v_shape', 'params', 'model_crc32', 'lr_total_steps'): j.pop(k, None)
j['version'] = 3
open(f'{sys.argv[2]}/older.json', 'w').write(json.dumps(j, indent=1))
PY

# ---- text: English with contractions and numbers, many scripts, whitespace runs, invalid UTF-8 ----
cp tests/data/tokenizer_sample.txt $C/tokenizer_bytes/sample.txt
printf "Hello, world! It's 12:30pm -- we'll see.\n\n  \t indented\r\nend  " > $C/tokenizer_bytes/english.txt
printf 'caf\xc3\xa9 \xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xef\xbb\xbf\xe2\x80\xa8x' > $C/tokenizer_bytes/unicode.txt
printf 'ok \xff\xfe bad \xc3 cut \xe2\x82 \xed\xa0\x80 surrogate \xf4\x90\x80\x80 \xc0\xaf end\xf0\x9f' > $C/tokenizer_bytes/invalid_utf8.txt

# ---- JSON Lines: plain, escapes and \u sequences, blank lines and CRLF, other fields ----
printf '{"text": "The jury said it."}\n{"text": "Second document.\\nWith two lines."}\n' > $C/tokenizer_jsonl/plain.jsonl
printf '{"text": "tab\\tquote\\" slash\\\\ caf\\u00e9 \\ud83d\\ude00 \\u4f60"}\n' > $C/tokenizer_jsonl/escapes.jsonl
printf '\n  \n{"id": 1, "text": "crlf line", "meta": {"a": [1, 2.5, null, true]}}\r\n\r\n{"text": ""}\n{"text":"no newline at end"}' > $C/tokenizer_jsonl/mixed.jsonl
printf '{"text": "caf\xc3\xa9 raw UTF-8 \xe4\xbd\xa0\xe5\xa5\xbd"}\n' > $C/tokenizer_jsonl/raw_utf8.jsonl

# ---- argument vectors (NUL-separated, argv[0] first) for fuzz_flags' table ----
printf '%s\0' fuzz --steps 300 --lr 1e-3 --out dir --resume > $C/flags/long_values.bin
printf '%s\0' fuzz --lr=0.5 --shard-tokens=-9223372036854775808 input --sp --model gpt2 > $C/flags/equals_positional.bin
printf '%s\0' fuzz --threads '' --beta2 nan > $C/flags/bad_values.bin
printf '%s\0' fuzz -h > $C/flags/help.bin
printf '%s\0' fuzz -- --steps a > $C/flags/double_dash.bin
printf '%s\0' fuzz --ste 2 --res -x > $C/flags/abbrev_unknown.bin
du -ab $C | sort -k2
