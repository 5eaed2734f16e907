#!/usr/bin/env bash
# Pipeline parallelism's CUDA path on a one-GPU machine, after scripts/device_gpu.sh has built
# build-gpu (it calls this with --pp). The ranks of a layout share the GPU, their activations,
# gradients and collectives staged through host memory over MPI (--device-comm mpi).
#   1. fp32: `loom train` of a fresh 8-layer model, 10 steps of 8 micro-batches, with 1f1b and
#      zb-v at pp 2 and 4, dualpipev at pp 4 and 1f1b at pp 2 x tp 2 --sp, on cuda, against the
#      one-process CPU run: the largest relative loss difference over the 10 steps (bound 1e-5)
#   2. bf16: gpt2-mini (L=4) 50 steps, zb-v pp 2 beside one process on the GPU, each against the
#      fp32 CPU run (one-GPU bf16's difference is the bf16 noise the pipeline should match)
# Prints a table last. Exit 1 when a check failed.
NAME=pp_gpu
source "$(dirname "$0")/gpu_checks_lib.sh"

# 1. fp32 on the GPU against the CPU
ARGS=(--model gpt2-mini --layers 8 --heads 2 --channels 16 --max-seq 16 --train-data "$FIX/gpt2_eval_shard.bin"
      --seq 16 --lr 5e-4 --warmup 2 --batch 2 --global-batch 16 --steps 10)
fp32_vs_cpu "2 --pp 2 --pp-schedule 1f1b" "2 --pp 2 --pp-schedule zb-v" "4 --pp 4 --pp-schedule 1f1b" \
    "4 --pp 4 --pp-schedule zb-v" "4 --pp 4 --pp-schedule dualpipev" "4 --pp 2 --tp 2 --sp --pp-schedule 1f1b"

# 2. bf16 loss curves against the fp32 CPU run
bf16_curves 16 "2 --pp 2 --pp-schedule zb-v"

finish
