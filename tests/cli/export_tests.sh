#!/usr/bin/env bash
# `loom export`: a model file as a Hugging Face transformers folder. `export_tests.sh CASE LOOM FIXTURES`
#   forward:   the trained fixture exported in fp32 and bf16; hf_gpt2_forward.js checks each file
#              against the safetensors format and GPT2LMHeadModel's tensor set and computes the
#              loss the way transformers' GPT-2 does (float64): within 1e-6 relative of `loom eval`
#              on the same tokens in fp32, within 1e-3 in bf16
#   bad_input: missing flags, an unknown --dtype, a malformed model file, an --out that cannot
#              be made: one line, nothing written
set -uo pipefail
CASE=$1 LOOM=$2 FIX=$3
source "$(dirname "$0")/cli_lib.sh"
FORWARD="$(dirname "$0")/hf_gpt2_forward.js"
EVAL=(--data "$FIX/gpt2_eval_shard.bin" --batch 2 --seq 16 --batches 3 --threads 1)

case $CASE in
forward)
  want=$("$LOOM" eval --model "$FIX/gpt2_trained.bin" "${EVAL[@]}" | sed -n 's/^val_loss: //p')
  for dtype in fp32 bf16; do
    "$LOOM" export --model "$FIX/gpt2_trained.bin" --out "hf_$dtype" --dtype "$dtype" >out.txt 2>&1 ||
      fail "export $dtype: $(cat out.txt)"
    got=$(node "$FORWARD" "hf_$dtype" "$FIX/gpt2_eval_shard.bin" 2 16 3 | sed -n 's/^loss: //p')
    [ -n "$got" ] || fail "$dtype: no loss from hf_gpt2_forward.js"
    tol=1e-6
    [ "$dtype" = bf16 ] && tol=1e-3
    close "$got" "$want" "$tol" || fail "$dtype: transformers-style loss $got, loom eval $want (tolerance $tol)"
    echo "ok: $dtype: transformers-style loss $got, loom eval $want"
  done
  grep -q '"torch_dtype":	"bfloat16"' hf_bf16/config.json || fail "bf16 config.json: $(cat hf_bf16/config.json)"
  ;;
bad_input)
  expect_error "--model and --out are required" "$LOOM" export --out hf
  expect_error "unknown --dtype 'fp16'" "$LOOM" export --model "$FIX/gpt2_trained.bin" --out hf --dtype fp16
  head -c 2000 "$FIX/gpt2_trained.bin" >short.bin
  expect_error "short.bin" "$LOOM" export --model short.bin --out hf
  touch afile
  expect_error "cannot create the folder afile/hf" "$LOOM" export --model "$FIX/gpt2_trained.bin" --out afile/hf
  ;;
*) fail "unknown case" ;;
esac
