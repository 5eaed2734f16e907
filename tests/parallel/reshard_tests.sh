#!/usr/bin/env bash
# A checkpoint resumed in another layout (ranks, tp, pp and stage placement, cp, sp, ZeRO stage,
# HSDP replicas, bucket size) than it was saved in, under mpirun:
# reshard_tests.sh CASE LOOM COMPARE FIXTURES
#   dp:     2 ranks ZeRO 1 -> 1 rank ZeRO 0, -> 4 ranks ZeRO 2 with other buckets, and -> 2 ranks
#           ZeRO 0 (there bit for bit: ZeRO 0 and 1 give the same weights)
#   fsdp:   4 ranks ZeRO 3 HSDP 2 x 2 -> 2 ranks ZeRO 1, and -> 2 ranks ZeRO 3; ZeRO 3 with the
#           optimizer and parameters offloaded -> 4 ranks ZeRO 1 with the optimizer offloaded
#   tp_cp:  tp 2 x dp 2 ZeRO 1 -> tp 2 alone; cp 2 x dp 2 ZeRO 2 -> cp 2 x dp 1 ZeRO 0; pp 2 x dp 2
#           ZeRO 1 -> pp 2 alone (1F1B over 2, then 4 micro-batches)
#   mesh:   the model shards change: tp 2 -> tp 4 and -> 1 rank, pp 2 -> tp 2, zb-v -> interleaved
#           (pp 2, 2 stages a rank each), cp 2 -> pp 2
#   errors: another global batch, micro-batch or sequence length is refused with one line
# Each: a run of 8 steps killed after step 5 (its checkpoint 4 complete), resumed in the new
# layout to step 8: the resharding note, then the losses of steps 5-8 and the final weights
# within 1e-5 relative of the uninterrupted run in the old layout (as parity tests, DESIGN
# principle 2: the same global batch is the same mathematics).
set -uo pipefail
CASE=$1 LOOM=$2 COMPARE=$3 FIX=$4
source "$(dirname "$0")/train_lib.sh"
STEPS=(--batch 2 --global-batch 8 --steps 8 --ckpt-every 4)

# reshard NAME NP FLAGS... -- NP2 FLAGS2...: the old layout's whole run (ref_NAME) and its run cut
# after step 5 (cut_NAME), then the resume of the cut run on NP2 ranks with FLAGS2
reshard() {
  local name=$1 np=$2; shift 2
  local old=() new=()
  while [ "$1" != "--" ]; do old+=("$1"); shift; done
  shift
  local np2=$1; shift
  new=("$@")
  rtrain "$np" "${STEPS[@]}" "${old[@]}" --ckpt-dir "ref_$name" --metrics "ref_$name.jsonl" >"ref_$name.txt" 2>&1 ||
    fail "$name: whole run: $(tail -3 "ref_$name.txt")"
  LOOM_FAULT=step:5 rtrain "$np" "${STEPS[@]}" "${old[@]}" --ckpt-dir "cut_$name" --metrics "cut_$name.jsonl" \
    >/dev/null 2>&1 && fail "$name: the run was not killed"
  [ -f "cut_$name/ckpt_00000004.json" ] || fail "$name: checkpoint 4 incomplete: $(ls "cut_$name")"
  rtrain "$np2" "${STEPS[@]}" "${new[@]}" --ckpt-dir "cut_$name" --metrics "cut_$name.jsonl" --resume \
    >"res_$name.txt" 2>&1 || fail "$name: resume: $(tail -3 "res_$name.txt")"
  grep -q "note: checkpoint step 4 was saved over $np ranks .* resharded onto $np2 rank" "res_$name.txt" ||
    fail "$name: no resharding note: $(grep note "res_$name.txt")"
  local l err
  l=$(rel_err "$(losses "cut_$name.jsonl" | tail -4)" "$(losses "ref_$name.jsonl" | tail -4)")
  [ "${l%% *}" -eq 4 ] && awk -v w="${l##* }" 'BEGIN { exit !(w <= 1e-5) }' || fail "$name: losses 5-8 (count, rel err) $l"
  err=$("$COMPARE" "cut_$name/model_00000008.bin" "ref_$name/model_00000008.bin" 1e-5) || fail "$name: weights: $err"
  echo "ok: $name: $np -> $np2 ranks: losses 5-8 within ${l##* }, weights $err"
}

case $CASE in
dp)
  reshard dp_to1 2 --zero 1 --bucket-mb 0.01 -- 1 --zero 0
  reshard dp_to4 2 --zero 1 --bucket-mb 0.01 -- 4 --zero 2 --bucket-mb 0.02
  # the same 2 ranks from ZeRO 1 to ZeRO 0, stages that give bit-identical weights
  # (data_parallel.h): the resharded run is the uninterrupted one bit for bit
  reshard z1_to_z0 2 --zero 1 --bucket-mb 0.01 -- 2 --zero 0 --bucket-mb 0.01
  cmp -s cut_z1_to_z0/model_00000008.bin ref_z1_to_z0/model_00000008.bin || fail "z1_to_z0: weights not bit-identical"
  [ "$(losses cut_z1_to_z0.jsonl | tail -4)" = "$(losses ref_z1_to_z0.jsonl | tail -4)" ] ||
    fail "z1_to_z0: losses 5-8 not bit-identical"
  echo "ok: z1_to_z0: weights and losses 5-8 bit-identical"
  ;;
fsdp)
  reshard hsdp_to_z1 4 --zero 3 --dp-replicate 2 --bucket-mb 0.01 -- 2 --zero 1 --bucket-mb 0.01
  reshard hsdp_to_z3 4 --zero 3 --dp-replicate 2 --bucket-mb 0.01 -- 2 --zero 3
  reshard offload_to_z1 2 --zero 3 --offload optimizer,params -- 4 --zero 1 --offload optimizer
  ;;
tp_cp)
  reshard tp 4 --tp 2 --sp --zero 1 --bucket-mb 0.01 -- 2 --tp 2 --sp --zero 1 --bucket-mb 0.01
  reshard cp 4 --cp 2 --zero 2 --bucket-mb 0.01 -- 2 --cp 2 --zero 0
  reshard pp 4 --pp 2 --zero 1 --bucket-mb 0.01 -- 2 --pp 2 --zero 0
  ;;
mesh)
  # the model shards themselves change: another tp (vocabulary, column and row shards), another
  # pp and stage placement (the tied embedding's two copies), cp and sp on and off
  reshard tp_to4 2 --tp 2 --sp --zero 1 --bucket-mb 0.01 -- 4 --tp 4 --zero 2
  reshard tp_to1 4 --tp 2 --zero 1 --bucket-mb 0.01 -- 1
  reshard pp_to_tp 4 --pp 2 --zero 1 --bucket-mb 0.01 -- 4 --tp 2 --zero 1
  # 4 stages need 4 layers: a fresh 4-layer model
  ARGS=(--model gpt2-mini --layers 4 --heads 4 --channels 32 --max-seq 16 --vocab 200
        --train-data "$FIX/gpt2_eval_shard.bin" --seq 16 --lr 5e-4 --warmup 2 --threads 1)
  reshard zbv_to_interleaved 2 --pp 2 --pp-schedule zb-v -- 4 --pp 2 --pp-schedule interleaved --virtual-stages 2
  reshard cp_to_pp 4 --cp 2 --zero 1 -- 2 --pp 2
  ;;
errors)
  rtrain 2 "${STEPS[@]}" --zero 1 --ckpt-dir two >/dev/null 2>&1 || fail "2-rank run"
  expect_mpi_error 1 "checkpoint step 8 was trained with B=2 T=16 and a global batch of 8 sequences, not B=2 T=16 and 4" \
    train "${ARGS[@]}" --batch 2 --global-batch 4 --steps 9 --ckpt-dir two --resume
  expect_mpi_error 2 "checkpoint step 8 was trained with B=2 T=16 and a global batch of 8 sequences, not B=1 T=16 and 8" \
    train "${ARGS[@]}" --batch 1 --global-batch 8 --steps 9 --ckpt-dir two --resume
  expect_mpi_error 2 "checkpoint step 8 was trained with B=2 T=16 and a global batch of 8 sequences, not B=2 T=32 and 8" \
    train "${ARGS[@]}" --seq 32 --batch 2 --global-batch 8 --steps 9 --ckpt-dir two --resume
  ;;
*) fail "unknown case" ;;
esac
