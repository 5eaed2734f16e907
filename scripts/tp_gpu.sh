#!/usr/bin/env bash
# Tensor parallelism's CUDA path on a one-GPU machine, after scripts/device_gpu.sh has built
# build-gpu (it calls this with --tp). The ranks of a layout share the GPU, their collectives
# staged through host memory over MPI (--device-comm mpi), as NCCL refuses two ranks on one GPU.
#   1. fp32: test_tp on cuda (tp 2; tp 4 --sp; tp 2 x dp 2 --sp ZeRO 1) against the one-process
#      CPU run: losses every step and step-1 gradients within 1e-5
#   2. bf16: `loom train` gpt2-mini (L=4) 50 steps on the fixture shard, tp 2 --sp and tp 4 on the
#      GPU beside one process on the GPU, each against the fp32 CPU run: the largest loss
#      difference over the 50 steps (one-GPU bf16's is the bf16 noise the tp runs should match)
#   3. bench-comm on 2 ranks sharing the GPU: NCCL refuses with one line naming the shared GPU;
#      --device-comm mpi prints the table
#   4. loom bench gpt2 B=16 T=1024 (one GPU, bf16): the step after the restructure
# Prints a table last. Exit 1 when a check failed.
NAME=tp_gpu
source "$(dirname "$0")/gpu_checks_lib.sh"

# 1. fp32 on the GPU against the CPU
for layout in "2 2 0 0" "4 4 1 0" "4 2 1 1"; do
    read -r np tp sp zero <<<"$layout"
    out=$(timeout 300 mpirun -np "$np" "$BUILD/tests/test_tp" "$tp" "$sp" "$zero" "$FIX" cuda 2>&1)
    rc=$?
    echo "$out"
    line=$(echo "$out" | grep '^cuda: tp' | sed 's/^cuda: //')
    [ $rc -eq 0 ] || { failed=1; line="FAIL (exit $rc) $line"; }
    row "fp32 cuda vs cpu, $np ranks" "$line"
done

# 2. bf16 loss curves against the fp32 CPU run
bf16_curves 8 "2 --tp 2 --sp" "4 --tp 4"

# 3. bench-comm with 2 ranks on one GPU
out=$(timeout 120 mpirun -np 2 "$LOOM" bench-comm --device cuda --max-bytes 1M 2>&1)
n=$(echo "$out" | grep -c 'loom: error: .*share GPU')
[ "$n" -eq 1 ] && row "bench-comm nccl, 2 ranks on 1 GPU" "one line: $(echo "$out" | grep -o 'ranks 0 and 1 share GPU [^,]*')" ||
    { failed=1; row "bench-comm nccl, 2 ranks on 1 GPU" "FAIL: $(echo "$out" | tail -2 | tr '\n' ' ')"; }
out=$(timeout 120 mpirun -np 2 "$LOOM" bench-comm --device cuda --device-comm mpi --op allreduce --max-bytes 64M 2>&1)
echo "$out"
echo "$out" | grep -q '^  allreduce .*67108864' && row "bench-comm mpi (staged), 2 ranks" "$(echo "$out" | grep '67108864' | awk '{print "64 MiB allreduce busbw " $7 " GB/s"}')" ||
    { failed=1; row "bench-comm mpi (staged)" "FAIL"; }

# 4. the one-GPU step
out=$("$LOOM" bench --model gpt2 --batch 16 --seq 1024 --steps 10 --warmup 3 2>&1)
echo "$out"
row "loom bench gpt2 B=16 T=1024" "$(echo "$out" | tail -1 | awk -F'|' '{print "step " $2 "ms, " $6 " tok/s, MFU" $10}')"

finish
