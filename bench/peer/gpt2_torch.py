#!/usr/bin/env python3
"""The PyTorch peer that loom's GPU benchmarks run beside (on the device machine only; loom
itself never runs Python). The same GPT-2 as loom: learned positions, pre-LayerNorm blocks,
causal attention through scaled_dot_product_attention, GELU (tanh), tied output layer over the
vocabulary padded to a multiple of 128, trained with BF16 autocast, TF32 for fp32 products,
fused AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matrices and embeddings) and
torch.compile, on random tokens. PyTorch at its fastest for this model: by default the loss runs
over the padded logits as they come (nanoGPT's way: targets never name a pad column, whose
logits learn to fall) instead of slicing the real 50257 columns out first (--loss-over real, a
copy of the logits); --compile-mode picks torch.compile's mode (scripts/bench_gpu.sh runs
default and max-autotune-no-cudagraphs and keeps the faster).

  python3 gpt2_torch.py --model gpt2 --batch 16 --seq 1024 --steps 20 [--compile-mode max-autotune-no-cudagraphs]
  torchrun --nproc-per-node 2 gpt2_torch.py ...       # DDP over NCCL, batch per GPU
  torchrun --nproc-per-node 2 gpt2_torch.py --fsdp ... # FSDP2 (ZeRO 3) instead: fully_shard per block
                                                       # and the root, each block compiled (torchtitan's way)

Prints one JSON line: tokens/s (all ranks), MFU (6N + 6LTC FLOPs per token against 989 TFLOP/s
per GPU), median step time, peak memory per GPU.
"""
import argparse
import ctypes
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # L, NH, C
    "gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280), "gpt2-xl": (48, 25, 1600),
}
V, VP, MAXT, PEAK = 50257, 50304, 1024, 989e12


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.hs = C // NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):  # the heads from qkv's width: a tensor-parallel rank's own (gpt2_torch_tp.py)
        B, T, _ = x.shape
        qkv = self.qkv(self.ln1(x))
        Cl = qkv.shape[-1] // 3
        q, k, v = (t.view(B, T, Cl // self.hs, self.hs).transpose(1, 2) for t in qkv.split(Cl, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, Cl)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, NH, C):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VP, C), nn.Embedding(MAXT, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "fcproj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets, real_vocab=False):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)
        if real_vocab:
            logits = logits[..., :V]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.view(-1))


def setup(extra=None):
    """The peers' flags (extra(ap) adds a peer's own) and the process's place: (args, world size,
    rank, local rank), with the GPU set, the process group made when world > 1, seed and TF32."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2", choices=CONFIGS)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-mode", default="default", choices=["default", "max-autotune-no-cudagraphs"])
    ap.add_argument("--loss-over", default="padded", choices=["padded", "real"])
    if extra:
        extra(ap)
    a = ap.parse_args()
    world, rank, local = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    if world > 1:
        torch.distributed.init_process_group("nccl")
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return a, world, rank, local


def accum_flag(ap):
    """The model-parallel peers' flag: micro-batches a step (loom's global batch / batch)."""
    ap.add_argument("--accum", type=int, default=8, help="micro-batches a step")


def adamw(params):
    """Fused AdamW as every peer trains: weight decay 0.1 on matrices and embeddings."""
    params = list(params)
    decay, rest = [p for p in params if p.dim() == 2], [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)


def tokens(a, rank, batch):
    """Random inputs and targets (batch, a.seq), seeded by the rank."""
    g = torch.Generator(device="cuda").manual_seed(rank)
    return (torch.randint(0, V, (batch, a.seq), device="cuda", generator=g),
            torch.randint(0, V, (batch, a.seq), device="cuda", generator=g))


class Power:
    """This GPU's energy counter (J) and SM clock (MHz) through NVML by ctypes, as loom's
    core/power.c reads them; read() gives None where NVML or the counter is missing."""

    def __init__(self):
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0".encode()
            self.dev = ctypes.c_void_p()
            ok = self.nvml.nvmlInit_v2() == 0 and self.nvml.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.dev)) == 0
        except (OSError, AttributeError):
            ok = False
        self.ok = ok and self.read() is not None

    def read(self):
        mj, mhz = ctypes.c_ulonglong(), ctypes.c_uint()
        if (self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(mj)) != 0 or
                self.nvml.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(mhz)) != 0):
            return None
        return mj.value / 1000.0, mhz.value


def timed(a, step):
    """Median seconds of step() (which returns the loss) over a.steps after a.warmup,
    synchronised around each, and the last loss; a.power: the GPU's mean watts and SM clock over
    the timed steps where NVML can read them over at least 1 s (as loom bench takes them: the
    energy counter moves every ~100 ms, so between the first and last step ends it had moved at)."""
    times, loss, meter, mhz, moves, last = [], None, Power(), [], [], None
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        if i >= a.warmup - 1 and meter.ok:  # after the step's time: a read takes up to milliseconds
            joules, clock = meter.read()
            if last is not None and joules != last:
                moves.append((time.perf_counter(), joules))
            if i >= a.warmup:
                mhz.append(clock)
            last = joules
    a.power = None
    if len(moves) >= 2 and moves[-1][0] - moves[0][0] >= 1.0:
        a.power = {"watts": (moves[-1][1] - moves[0][1]) / (moves[-1][0] - moves[0][0]), "sm_mhz": sum(mhz) / len(mhz)}
    return sorted(times)[len(times) // 2], loss


def report(a, rank, gpus, step_tokens, sharding, seconds, loss):
    """Rank 0 prints the JSON line for steps of step_tokens tokens over `gpus` GPUs (every rank
    calls it: the peak is the largest rank's), then the process group ends."""
    L, NH, C = CONFIGS[a.model]
    peak = torch.tensor(float(torch.cuda.max_memory_allocated()), device="cuda")
    if gpus > 1:
        torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
    n_params = 12 * L * C * C + 13 * L * C + V * C + MAXT * C + 2 * C  # GPT-2's, the real vocabulary
    flops = (6 * n_params + 6 * L * a.seq * C) * step_tokens
    out = {"peer": "pytorch", "torch": torch.__version__, "compile": "none" if a.no_compile else a.compile_mode,
           "loss_over": a.loss_over, "model": a.model, "gpus": gpus, "sharding": sharding, "batch": a.batch,
           "seq": a.seq, "step_ms": seconds * 1e3, "tokens_per_s": step_tokens / seconds,
           "mfu": flops / seconds / (PEAK * gpus), "peak_mem_gib": peak.item() / 2**30,
           "loss": loss}
    if gpus == 1 and getattr(a, "power", None):
        out.update(a.power, joules_per_step=a.power["watts"] * seconds,
                   tokens_per_joule=step_tokens / (a.power["watts"] * seconds))
    if rank == 0:
        print(json.dumps(out), flush=True)
    if gpus > 1:
        torch.distributed.destroy_process_group()


def main():
    a, world, rank, local = setup(lambda ap: ap.add_argument("--fsdp", action="store_true",
                                                            help="shard with FSDP2 (fully_shard) instead of DDP"))
    model = GPT2(*CONFIGS[a.model]).cuda()
    if a.fsdp:  # each block compiled, then sharded block by block and at the root (wte, wpe, lnf)
        from torch.distributed.fsdp import fully_shard
        for i, b in enumerate(model.blocks):
            if not a.no_compile:
                model.blocks[i] = torch.compile(b, mode=a.compile_mode)
            fully_shard(model.blocks[i])
        fully_shard(model)
    opt = adamw(model.parameters())
    if world > 1 and not a.fsdp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local], gradient_as_bucket_view=True,
                                                          static_graph=True)
    step_fn = model if a.no_compile or a.fsdp else torch.compile(model, mode=a.compile_mode)
    x, y = tokens(a, rank, a.batch)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y, a.loss_over == "real")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    seconds, loss = timed(a, step)
    report(a, rank, world, a.batch * a.seq * world, "fsdp2" if a.fsdp else "ddp" if world > 1 else "none", seconds,
           loss.item())


if __name__ == "__main__":
    main()
