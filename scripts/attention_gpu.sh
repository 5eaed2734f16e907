#!/usr/bin/env bash
# The Hopper attention kernels (src/backend/cuda/attention_*_wgmma.cu) on one GPU, after
# scripts/device_gpu.sh has built build-gpu and run their tests and sanitizers
# (`bash scripts/device_gpu.sh --attention` does all of it):
#   1. the machine code: each kernel's HGMMA (wgmma) instructions, none spilling past its budget
#      (cuobjdump of the loom binary)
#   2. speed of the kernels: build-gpu/bench/bench_attention beside PyTorch's SDPA flash and cuDNN
#      backends (bench/peer/attention_torch.py), joined by bench/peer/attention_ratio.py
#   3. speed of training: gpt2 at B=16 beside the PyTorch peer (scripts/bench_gpu.sh; PEER_MODES
#      as there)
# Prints the tables last; exit 1 when a step failed. Full outputs in $OUT (or /tmp).
NAME=attention_gpu
source "$(dirname "$0")/gpu_checks_lib.sh"
OUTDIR=${OUT:-/tmp}

# 1. HGMMA instructions per kernel (a kernel without them runs on a slower path)
cuobjdump -sass "$LOOM" 2>/dev/null | awk '/Function : .*wgmma/ { f = $3; n[f] = 0 } /Function : / && !/wgmma/ { f = "" }
    f != "" && /HGMMA/ { n[f]++ } END { for (k in n) print k, n[k] }' >"$WORK/hgmma.txt"
while read -r fn count; do
    [ "$count" -gt 0 ] || failed=1
    row "HGMMA in ${fn:0:44}" "$count instructions"
done <"$WORK/hgmma.txt"
[ -s "$WORK/hgmma.txt" ] || { failed=1; row "HGMMA" "FAIL: no wgmma kernel in $LOOM"; }

# 2. the kernels beside PyTorch's
ran "bench_attention" "$OUTDIR/bench_loom_attention.md" timeout 200 "$BUILD/bench/bench_attention" 5 &&
    ran "attention_torch.py" "$OUTDIR/bench_torch_attention.md" timeout 200 python3 "$ROOT/bench/peer/attention_torch.py" &&
    python3 "$ROOT/bench/peer/attention_ratio.py" "$OUTDIR/bench_loom_attention.md" "$OUTDIR/bench_torch_attention.md" \
        >"$OUTDIR/attention_ratio.md"

# 3. training beside the peer
ran "bench gpt2 B=16" "$OUTDIR/bench_gpt2.md" bash "$ROOT/scripts/bench_gpu.sh" gpt2:16

cat "$OUTDIR/attention_ratio.md" 2>/dev/null
echo
grep '^|' "$OUTDIR/bench_gpt2.md" 2>/dev/null
finish
