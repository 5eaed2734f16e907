#!/usr/bin/env python3
"""Joins the tables of bench/cuda/bench_attention.c (loom) and bench/peer/attention_torch.py
(PyTorch SDPA, flash and cuDNN backends) of one device call into one table: TFLOP/s of each and
loom's ratio to each backend, forward and forward+backward, with the fwd+bwd milliseconds.
    attention_ratio.py LOOM_TABLE.md TORCH_TABLE.md"""
import sys


def rows(path):
    """The markdown table's data rows as lists of cells."""
    out = []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("B", "backend") and not cells[0].startswith("-"):
            out.append(cells)
    return out


def main():
    loom = {tuple(r[:4]): r for r in rows(sys.argv[1])}  # B NH hs T fwd_ms fwd_tf fb_ms fb_tf
    torch = {(r[0],) + tuple(r[1:5]): r for r in rows(sys.argv[2])}  # backend B NH hs T ...
    print("| B | NH | hs | T | fwd TFLOP/s loom / flash / cuDNN | loom/flash | loom/cuDNN "
          "| fwd+bwd ms loom / flash / cuDNN | fwd+bwd TFLOP/s loom / flash / cuDNN | loom/flash | loom/cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, l in loom.items():
        f, c = torch.get(("flash",) + key), torch.get(("cudnn",) + key)
        if f is None or c is None:
            print(f"| {' | '.join(key)} | {l[5]} / - / - | - | - | {l[6]} / - / - | {l[7]} / - / - | - | - |")
            continue
        lf, ff, cf = float(l[5]), float(f[6]), float(c[6])
        lb, fb, cb = float(l[7]), float(f[8]), float(c[8])
        print(f"| {' | '.join(key)} | {lf:.0f} / {ff:.0f} / {cf:.0f} | {lf / ff:.2f}x | {lf / cf:.2f}x "
              f"| {l[6]} / {f[7]} / {c[7]} | {lb:.0f} / {fb:.0f} / {cb:.0f} | {lb / fb:.2f}x | {lb / cb:.2f}x |")


if __name__ == "__main__":
    main()
