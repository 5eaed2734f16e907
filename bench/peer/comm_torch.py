#!/usr/bin/env python3
"""The PyTorch peer of `loom bench-comm` (on the device machine only): torch.distributed's NCCL
collectives over the same sizes, timed as nccl-tests and loom time them (warm-up operations, then
the mean of timed ones between two synchronisations), with nccl-tests' bus bandwidth.

  torchrun --nproc-per-node 2 comm_torch.py --op all --min-bytes 1M --max-bytes 4G [--dtype bf16]

size is the bytes of the larger buffer (nccl-tests' convention, as loom's): all-reduce the
buffer; reduce-scatter the input of all ranks; all-gather the output; all-to-all each rank's
buffer. busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for the other three.
Prints the rows on rank 0 in loom bench-comm's columns.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(s):
    return int(s[:-1]) * SUFFIX[s[-1]] if s[-1] in SUFFIX else int(s)


def run(op, size, dtype, n, warmup, iters):
    es = torch.tensor([], dtype=dtype).element_size()
    count = size // es
    if op == "allreduce":
        x = torch.randn(count, device="cuda").to(dtype)
        fn, factor = (lambda: dist.all_reduce(x)), 2 * (n - 1) / n
    elif op == "reduce_scatter":
        count -= count % n
        x, y = torch.randn(count, device="cuda").to(dtype), torch.empty(count // n, device="cuda", dtype=dtype)
        fn, factor = (lambda: dist.reduce_scatter_tensor(y, x)), (n - 1) / n
    elif op == "allgather":
        count -= count % n
        x, y = torch.randn(count // n, device="cuda").to(dtype), torch.empty(count, device="cuda", dtype=dtype)
        fn, factor = (lambda: dist.all_gather_into_tensor(y, x)), (n - 1) / n
    else:  # alltoall
        count -= count % n
        x, y = torch.randn(count, device="cuda").to(dtype), torch.empty(count, device="cuda", dtype=dtype)
        fn, factor = (lambda: dist.all_to_all_single(y, x)), (n - 1) / n
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    t = (time.perf_counter() - t0) / iters
    algbw = count * es / t / 1e9
    return count * es, count if op == "allreduce" else count // n, t, algbw, algbw * factor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="allreduce", choices=["allreduce", "reduce_scatter", "allgather", "alltoall", "all"])
    ap.add_argument("--min-bytes", default="1M")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    a = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    n, rank = dist.get_world_size(), dist.get_rank()
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    ops = ["allreduce", "reduce_scatter", "allgather", "alltoall"] if a.op == "all" else [a.op]
    if rank == 0:
        print(f"# torch {torch.__version__} NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: {n} ranks")
        print("# op                   size(B)        count   type    time(us) algbw(GB/s) busbw(GB/s)")
    for op in ops:
        size = parse_bytes(a.min_bytes)
        while size <= parse_bytes(a.max_bytes):
            nbytes, count, t, algbw, busbw = run(op, size, dtype, n, a.warmup, a.iters)
            if rank == 0:
                print(f"  {op:<16} {nbytes:>12} {count:>12} {a.dtype:>6} {t * 1e6:>11.1f} {algbw:>11.2f} {busbw:>11.2f}",
                      flush=True)
            size *= 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
