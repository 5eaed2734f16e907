#!/usr/bin/env python3
"""PyTorch's causal scaled_dot_product_attention, bf16, with its flash and cuDNN backends
(torch.nn.attention.sdpa_kernel), forward and forward+backward in TFLOP/s, for the same cases
as bench/cuda/bench_attention.c (FLOPs counted the same way: forward 4 B NH T^2 hs / 2,
backward 2.5x). Run on the device machine beside it."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES = [(16, 16, 64, 1024), (8, 16, 64, 2048), (4, 16, 64, 4096), (2, 16, 64, 8192), (1, 16, 64, 16384),
         (16, 16, 128, 1024), (8, 16, 128, 2048), (4, 16, 128, 4096), (2, 16, 128, 8192), (1, 16, 128, 16384)]


def median_ms(fn, reps=10):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[reps // 2]


def main():
    print("| backend | B | NH | hs | T | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        for B, NH, hs, T in CASES:
            q, k, v = (torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            do = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16)
            flops = 4.0 * B * NH * T * T * hs / 2
            with sdpa_kernel(backend):
                fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                fb = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do))
            print(f"| {name} | {B} | {NH} | {hs} | {T} | {fwd:.3f} | {flops / fwd / 1e9:.1f} | {fb:.3f} | "
                  f"{3.5 * flops / fb / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
