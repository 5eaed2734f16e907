#!/usr/bin/env python3
"""The PyTorch peer of loom's pipeline parallelism (`--pp N --pp-schedule 1f1b`): gpt2_torch.py's
GPT-2 cut into one stage a rank by torch.distributed.pipelining, stage 0 holding the embeddings
and the first L/N blocks, the last stage the last L/N, the final LayerNorm and an output layer of
its own (an untied copy of wte: loom sums the two copies' gradients, this peer leaves that out),
each block compiled, run by Schedule1F1B over --accum micro-batches of --batch sequences; then
the clipping by the global norm (the stages' sums of squares all-reduced) and fused AdamW.

  torchrun --nproc-per-node 2 gpt2_torch_pp.py --model gpt2-xl --batch 4 --accum 8 --steps 10

Prints gpt2_torch.py's JSON line (tokens/s of a step of batch x accum sequences; the loss is the
last stage's mean over the micro-batches).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from gpt2_torch import CONFIGS, GPT2, accum_flag, adamw, report, setup, timed, tokens


class Stage(nn.Module):
    """Blocks [lo, hi) of model, after the embeddings when lo == 0, before the final LayerNorm and
    the output layer when hi == L: token ids (B, T) in, or activations (B, T, C); logits (B, T, VP)
    out from the last stage, activations from the others."""

    def __init__(self, model, lo, hi, L):
        super().__init__()
        self.first, self.last = lo == 0, hi == L
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        if self.first:
            self.wte, self.wpe = model.wte, model.wpe
        if self.last:
            self.lnf = model.lnf
            self.head = nn.Parameter(model.wte.weight.detach().clone())

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.lnf(x), self.head) if self.last else x


def main():
    a, world, rank, local = setup(accum_flag)
    L, NH, C = CONFIGS[a.model]
    if L % world:
        raise SystemExit(f"gpt2_torch_pp: {a.model}'s {L} blocks do not split into {world} stages")
    stage = Stage(GPT2(L, NH, C).cuda(), rank * L // world, (rank + 1) * L // world, L)
    if not a.no_compile:
        for i, b in enumerate(stage.blocks):
            stage.blocks[i] = torch.compile(b, mode=a.compile_mode)
    opt = adamw(stage.parameters())

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    sched = Schedule1F1B(PipelineStage(stage, rank, world, torch.device("cuda", local)), a.accum, loss_fn=loss_fn)
    x, y = tokens(a, 0, a.batch * a.accum)  # one pipeline: every micro-batch of the step

    def step():
        losses = []
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if stage.first:
                sched.step(x)
            elif stage.last:
                sched.step(target=y, losses=losses)
            else:
                sched.step()
        params = [p for p in stage.parameters() if p.grad is not None]
        sumsq = torch.nn.utils.get_total_norm([p.grad for p in params]) ** 2
        torch.distributed.all_reduce(sumsq)
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, torch.sqrt(sumsq))
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros((), device="cuda")
        torch.distributed.all_reduce(loss)  # the last stage's
        return loss

    seconds, loss = timed(a, step)
    report(a, rank, world, a.batch * a.accum * a.seq, f"pp{world} 1f1b", seconds, loss.item())


if __name__ == "__main__":
    main()
