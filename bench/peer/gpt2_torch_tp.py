#!/usr/bin/env python3
"""The PyTorch peer of loom's tensor parallelism (`--tp N`, no sequence parallelism): gpt2_torch.py's
GPT-2 with every block split Megatron-LM's way by DTensor (torch.distributed.tensor.parallel):
qkv and fc column-parallel, the attention projection and fcproj row-parallel (each an all-reduce
of the block's activations in the forward, and of its input gradient in the backward), each block
then compiled (torchtitan's order); the embeddings, the final LayerNorm and the tied output layer
replicated, as the peer has no vocabulary-parallel loss. The column-parallel qkv gives each rank a
contiguous third of its 3C/N output columns for each of q, k and v: its heads' under a permuted
parameterisation of the same model (the run starts from random weights). All ranks form one
tensor-parallel group and read the same micro-batches; a step is --accum micro-batches of --batch
sequences (loom's global batch / batch), then the clipping and fused AdamW.

  torchrun --nproc-per-node 2 gpt2_torch_tp.py --model gpt2-medium --batch 4 --accum 8 --steps 10

Prints gpt2_torch.py's JSON line (tokens/s of a step of batch x accum sequences).
"""
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from gpt2_torch import CONFIGS, GPT2, accum_flag, adamw, report, setup, timed, tokens


def main():
    a, world, rank, local = setup(accum_flag)
    L, NH, C = CONFIGS[a.model]
    if NH % world:
        raise SystemExit(f"gpt2_torch_tp: {a.model}'s {NH} heads do not split over {world} ranks")
    model = GPT2(L, NH, C).cuda()
    mesh = init_device_mesh("cuda", (world,))
    plan = {"qkv": ColwiseParallel(), "proj": RowwiseParallel(), "fc": ColwiseParallel(), "fcproj": RowwiseParallel()}
    for i, b in enumerate(model.blocks):
        parallelize_module(b, mesh, plan)
        if not a.no_compile:
            model.blocks[i] = torch.compile(b, mode=a.compile_mode)
    # DTensor and plain parameters apart: fused AdamW and the norm take one kind a list
    split = [p for p in model.parameters() if isinstance(p, DTensor)]
    whole = [p for p in model.parameters() if not isinstance(p, DTensor)]
    opts = [adamw(split), adamw(whole)]
    x, y = tokens(a, 0, a.batch)  # every rank the same micro-batch

    def step():
        for _ in range(a.accum):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y, a.loss_over == "real") / a.accum
            loss.backward()
        norms = [torch.nn.utils.get_total_norm([p.grad for p in ps]) for ps in (split, whole)]
        norms = [n.full_tensor() if isinstance(n, DTensor) else n for n in norms]
        total = torch.sqrt(norms[0] ** 2 + norms[1] ** 2)
        for ps, opt in zip((split, whole), opts):
            torch.nn.utils.clip_grads_with_norm_(ps, 1.0, total)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss * a.accum

    seconds, loss = timed(a, step)
    report(a, rank, world, a.batch * a.accum * a.seq, f"tp{world}", seconds, loss.item())


if __name__ == "__main__":
    main()
