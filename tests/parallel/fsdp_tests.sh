#!/usr/bin/env bash
# `loom train --zero 3` (FSDP) and `--dp-replicate` (HSDP) on the CPU under mpirun:
# fsdp_tests.sh CASE LOOM COMPARE FIXTURES
#   parity:  ZeRO 3 at 2, 3 and 4 ranks (the 3-rank shards padded), HSDP 2 x 2 (ZeRO 3, and
#            ZeRO 2), ZeRO 3 x tp 2 (--sp), ZeRO 3 x pp 2 x tp 2 on 8 ranks, ZeRO 3 on one rank, the
#            optimizer offloaded (--offload optimizer) on one rank, with ZeRO 3 and with ZeRO 2 x tp 2,
#            the parameter shard offloaded too (--offload optimizer,params, ZeRO 3 on 1 and 2 ranks),
#            the activations offloaded (alone, with --recompute full, with ZeRO 3 on 2 ranks, with
#            ZeRO 3 x tp 2 and everything offloaded):
#            10 steps of a global batch of 16 sequences (12 on 3 ranks; micro-batches of 2,
#            accumulated) from a fresh 4-layer model, the loss at every
#            step and 3 validation losses within 1e-5 relative of the one-process run with the
#            same global batch, and the final weights (the model file gathered unit by unit)
#            within 1e-5 relative
#   resume:  a ZeRO 3 HSDP run on 4 ranks killed and resumed equals the uninterrupted one bit for
#            bit; resuming with another global batch is refused with one line (other layouts
#            reshard: reshard_tests.sh); the same for a ZeRO 3 run with the optimizer offloaded
#   errors:  layouts that cannot work give one error line and every rank exits non-zero, no hang;
#            so does a run whose memory plan does not fit, before it allocates, naming what would fit
set -uo pipefail
CASE=$1 LOOM=$2 COMPARE=$3 FIX=$4
source "$(dirname "$0")/train_lib.sh"
ARGS=(--model gpt2-mini --layers 4 --heads 2 --channels 16 --max-seq 16 --train-data "$FIX/gpt2_eval_shard.bin"
      --seq 16 --lr 5e-4 --warmup 2 --threads 1 --val-data "$FIX/gpt2_eval_shard.bin" --val-batches 4 --val-every 5)

QUICK="zero3-np3 hsdp-2x2 zero3-pp2-tp2 offload-zero2-tp2 offload-acts-full-np1 offload-all-zero3-tp2"
case $CASE in
parity)
  for g in 12 16; do
    train --batch 2 --global-batch $g --steps 10 --ckpt-dir ref_$g --metrics ref_$g.jsonl >/dev/null 2>&1 || fail "one-process run"
  done
  grep -q "ZeRO 3 (FSDP): 6 units sharded over 2 ranks" <(rtrain 2 --zero 3 --batch 2 --steps 1 2>&1) ||
    fail "the configuration does not name the 6 units (embeddings, 4 blocks, final norm)"
  parity_check zero3-np1 1 16 --zero 3
  parity_check zero3-np2 2 16 --zero 3
  parity_check zero3-np3 3 12 --zero 3
  parity_check zero3-np4 4 16 --zero 3
  parity_check hsdp-2x2 4 16 --zero 3 --dp-replicate 2
  parity_check hsdp-zero2-2x2 4 16 --zero 2 --dp-replicate 2
  parity_check zero3-tp2 4 16 --zero 3 --tp 2 --sp
  parity_check zero3-pp2-tp2 8 16 --zero 3 --pp 2 --tp 2 --sp --pp-schedule zb-v
  parity_check offload-np1 1 16 --offload optimizer
  parity_check offload-zero3-np2 2 16 --zero 3 --offload optimizer
  parity_check offload-zero2-tp2 4 16 --zero 2 --tp 2 --offload optimizer
  parity_check offload-params-np1 1 16 --zero 3 --offload optimizer,params
  parity_check offload-params-np2 2 16 --zero 3 --offload optimizer,params
  parity_check offload-acts-np1 1 16 --offload activations
  parity_check offload-acts-full-np1 1 16 --offload activations --recompute full
  parity_check offload-acts-zero3-np2 2 16 --zero 3 --offload activations
  parity_check offload-all-zero3-tp2 4 16 --zero 3 --tp 2 --sp --offload optimizer,params,activations
  [ -n "${LOOM_QUICK:-}" ] && exit 0 # the checks below read runs the quick pass skips
  grep -q "offloaded .* in host memory (optimizer)" offload-np1.txt || fail "the configuration does not say the optimizer is offloaded"
  grep -q "offloaded .* in host memory (activations)" offload-acts-np1.txt || fail "no offloaded activations in the configuration"
  # the offloaded copies are exact: the same bits as the run that keeps everything on the backend
  cmp -s <(losses offload-acts-np1.jsonl) <(losses ref_16.jsonl) || fail "offloaded activations change the losses"
  cmp -s <(losses offload-params-np2.jsonl) <(losses zero3-np2.jsonl) || fail "the offloaded parameter shard changes the losses"
  ;;
resume)
  common=(--zero 3 --dp-replicate 2 --batch 2 --global-batch 8 --steps 6 --bucket-mb 0.01 --ckpt-every 3)
  kill_and_resume 4 "${common[@]}"
  grep -q '"dp_replicate":\s*2' cut/ckpt_00000003.json || fail "metadata lacks the replicas"
  expect_mpi_error 4 "checkpoint step 6 was trained with B=2 T=16 and a global batch of 8 sequences, not B=2 T=16 and 16" \
    train "${ARGS[@]}" "${common[@]}" --global-batch 16 --ckpt-dir cut --resume
  echo "ok: ZeRO 3 HSDP 2 x 2 resume is bit-identical; another global batch is refused"
  rm -rf full cut
  kill_and_resume 2 --zero 3 --offload optimizer,params,activations --batch 2 --global-batch 8 --steps 6 \
    --bucket-mb 0.01 --ckpt-every 3
  echo "ok: ZeRO 3 with the optimizer, parameters and activations offloaded resumes bit-identically"
  ;;
errors)
  expect_mpi_error 2 "--zero must be in [-1, 3], got 5" train "${ARGS[@]}" --zero 5 --batch 1 --steps 1
  expect_mpi_error 4 "--dp-replicate 3 does not divide the 4 data-parallel ranks" train "${ARGS[@]}" --zero 3 \
    --dp-replicate 3 --batch 1 --steps 1
  expect_mpi_error 2 "--dp-replicate 2 needs a ZeRO stage of 1 or more, got --zero 0" train "${ARGS[@]}" \
    --dp-replicate 2 --zero 0 --batch 1 --steps 1
  expect_mpi_error 2 "--dp-replicate must be in [1, 65536], got 0" train "${ARGS[@]}" --dp-replicate 0 --batch 1 --steps 1
  expect_mpi_error 2 "unknown --offload item 'gpu'" train "${ARGS[@]}" --offload optimizer,gpu --batch 1 --steps 1
  expect_mpi_error 2 "--offload params needs ZeRO 3's parameter shard and the offloaded optimizer, got --zero 1" \
    train "${ARGS[@]}" --zero 1 --offload optimizer,params --batch 1 --steps 1
  expect_mpi_error 1 "--offload params needs ZeRO 3's parameter shard and the offloaded optimizer, got --zero 3 --offload params" \
    train "${ARGS[@]}" --zero 3 --offload params --batch 1 --steps 1
  expect_mpi_error 2 "drop --offload activations with a zero-bubble schedule" train "${ARGS[@]}" --pp 2 \
    --pp-schedule zb-h1 --offload activations --batch 1 --global-batch 2 --steps 1
  expect_mpi_error 1 "offloaded optimizer rounds the parameters to nearest" train "${ARGS[@]}" --offload optimizer \
    --stochastic-rounding --batch 1 --steps 1
  expect_mpi_error 2 "--cuda-graphs records one rank's step, without collectives; this run has 2 ranks" \
    train "${ARGS[@]}" --cuda-graphs --batch 1 --steps 1
  expect_mpi_error 1 "--cuda-graphs: --zero 3 copies" train "${ARGS[@]}" --cuda-graphs --zero 3 --batch 1 --steps 1
  expect_mpi_error 2 "--precision fp8 scales each tensor by its own amax, which --tp 2 --cp 1 would split" \
    train "${ARGS[@]}" --precision fp8 --tp 2 --batch 1 --steps 1
  # the memory plan refuses a run that does not fit before allocating anything: gpt2-xl at B=64 on
  # the CPU (about 330 GiB), and a run planned for a small device that twice the ranks would fit
  t0=$SECONDS
  expect_mpi_error 2 "this run needs about " train --model gpt2-xl --train-data "$FIX/gpt2_eval_shard.bin" --batch 64 \
    --seq 1024 --steps 1 --threads 1
  [ $((SECONDS - t0)) -le 20 ] || fail "the refusal took $((SECONDS - t0)) s: it allocated first"
  grep -q "none of --zero 3, --offload, --recompute full or twice the ranks fits alone" err.txt || fail "no hint: $(cat err.txt)"
  export LOOM_DEVICE_MEMORY_GIB=0.21
  expect_mpi_error 2 "would fit: twice the ranks (105.5 MiB)" train --model gpt2-mini --train-data "$FIX/gpt2_eval_shard.bin" \
    --seq 64 --threads 1 --batch 2 --global-batch 8 --steps 1 --zero 1
  grep -q "needs about 126.3 MiB of memory per rank .*, 2 ranks sharing it; 215.0 MiB is free" err.txt ||
    fail "the plan's line: $(cat err.txt)"
  unset LOOM_DEVICE_MEMORY_GIB
  ;;
*) fail "unknown case $CASE" ;;
esac
