#!/usr/bin/env bash
# On a GPU machine, after a build into build-gpu (scripts/device_gpu.sh): loom and the PyTorch
# peer (bench/peer/gpt2_torch.py: BF16 autocast, SDPA, fused AdamW, torch.compile) train the same
# GPT-2 configs on the same GPU, one after the other, T=1024: gpt2 and gpt2-medium at B=16,
# gpt2-xl at B=8, in bf16 (the GELU output kept: 42.57 GiB against the peer's 42.84 on an H200
# since the output layer's logits chunk is at most 256 MiB; --recompute gelu would save 4.6 GiB
# for ~2% of the step) and in fp8 (--recompute gelu, auto's choice there).
# The peer runs with each torch.compile mode of PEER_MODES (default: default and
# max-autotune-no-cudagraphs) and the faster one is kept. Prints tokens/s, MFU (6N + 6LTC FLOPs
# per token against 989 TFLOP/s), peak memory, the loom/PyTorch ratio and each one's mean power
# over its timed steps (NVML: an H100 or H200 at full load sits at its 700 W limit) as a table; the raw
# outputs go to $OUT (or /tmp). A config may name loom's precision (bf16 by default, or fp8: the
# blocks' matmuls in FP8), its FP8 recipe (tensorwise by default, or delayed) and options, a comma
# list of `graphs` for loom's --cuda-graphs (the whole step replayed as one CUDA graph; launched
# op by op by default), `autotune` for --gemm-autotune (matmul algorithms chosen by timing) and
# `logitsROWS` (e.g. logits8192) for --logits-chunk ROWS (the output layer's rows at a time) and
# `fastdgrad` for --fp8-fast-dgrad (fp8's input-gradient products with fast accumulation);
# the peer runs in bf16, once per model and batch, in torch.compile's modes without CUDA graphs.
# PEER_TIMEOUT (seconds, default none) bounds each peer mode's run, compile included: a mode cut
# off is left out (its stderr says so) and the table names the mode whose figure it shows, so a
# slow max-autotune compile no longer costs the whole table. STEPS (default 40) sets the timed steps
# of each run: the power figures need at least 1 s of them (NVML's energy counter moves every
# ~100 ms).
#   bash scripts/bench_gpu.sh [MODEL:BATCH[:RECOMPUTE[:PRECISION[:RECIPE[:OPTIONS]]]] ...]   (RECOMPUTE: none, gelu, full;
#   OPTIONS: a comma list of graphs, autotune, logitsROWS, fastdgrad)
set -u
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${OUT:-/tmp}
CONFIGS=("$@")
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(gpt2:16 gpt2-medium:16 gpt2-xl:8 gpt2-xl:8:gelu:fp8)
failed=0
declare -A peer_done=() # model:batch pairs whose peer ran in this call
for c in "${CONFIGS[@]}"; do
    IFS=: read -r m b r p f g <<< "$c"
    opts=()
    for o in ${g//,/ }; do
        case $o in
        graphs) opts+=(--cuda-graphs) ;;
        autotune) opts+=(--gemm-autotune) ;;
        logits[0-9]*) opts+=(--logits-chunk "${o#logits}") ;;
        fastdgrad) opts+=(--fp8-fast-dgrad) ;;
        *) echo "bench_gpu.sh: '$o' in $c is not 'graphs', 'autotune', 'logitsROWS' or 'fastdgrad'" >&2; exit 2 ;;
        esac
    done
    # shellcheck disable=SC2046
    build-gpu/loom bench --model "$m" --batch "$b" --seq 1024 --steps "${STEPS:-40}" --warmup 3 --device cuda \
        --recompute "${r:-none}" --precision "${p:-bf16}" $([ -n "$f" ] && echo "--fp8-recipe $f") \
        "${opts[@]}" > "$OUTDIR/bench_loom_${m}_${b}_${r:-none}_${p:-bf16}${f:+_$f}${g:+_${g//,/_}}.txt" || failed=1
    peer="$OUTDIR/bench_torch_${m}_$b"
    [ -n "${peer_done[$m:$b]:-}" ] && continue
    peer_done[$m:$b]=1
    : > "$peer.all"
    for mode in ${PEER_MODES:-default max-autotune-no-cudagraphs}; do # the peer at its fastest: the faster mode
        PYTHONUNBUFFERED=1 timeout "${PEER_TIMEOUT:-0}" python3 bench/peer/gpt2_torch.py --model "$m" --batch "$b" \
            --seq 1024 --steps "${STEPS:-40}" --compile-mode "$mode" >> "$peer.all" 2>> "$peer.err"
        rc=$?
        [ $rc -eq 124 ] && echo "bench_gpu.sh: the peer's $mode mode ran past PEER_TIMEOUT=${PEER_TIMEOUT:-0} s: left out" | tee -a "$peer.err" >&2
        [ $rc -ne 0 ] && failed=1
    done
    python3 -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(json.dumps(max(rows, key=lambda r: r["tokens_per_s"])) if rows else "")' "$peer.all" > "$peer.json"
    cat "$peer.all"
done
python3 - "$OUTDIR" "${CONFIGS[@]}" <<'PY'
import json, sys
out, configs = sys.argv[1], sys.argv[2:]
print("| model | B | loom recompute | loom precision | loom step | loom tokens/s | loom MFU | loom peak GiB | PyTorch (bf16) tokens/s | PyTorch compile | PyTorch MFU | PyTorch peak GiB | loom / PyTorch | W loom / PyTorch |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for c in configs:
    m, b, r, p, recipe, g = (c.split(":") + ["", "", "", ""])[:6]
    r, p = r or "none", p or "bf16" # the defaults the loom runs above took
    try:
        name = f"{out}/bench_loom_{m}_{b}_{r}_{p}{'_' + recipe if recipe else ''}{'_' + g.replace(',', '_') if g else ''}.txt"
        row = [l for l in open(name) if l.startswith("|") and "step ms" not in l][-1]
        f = [x.strip() for x in row.strip().strip("|").split("|")]
        ltok, lmfu, lpeak = float(f[4]), f[8], f[9].replace(" GiB", "")
        lw = ([l.split()[1] for l in open(name) if l.startswith("power:") and l.split()[1].isdigit()] or ["-"])[-1]
    except (OSError, IndexError, ValueError):
        ltok, lmfu, lpeak, lw = float("nan"), "-", "-", "-"
    try:
        t = json.loads(open(f"{out}/bench_torch_{m}_{b}.json").read().strip().splitlines()[-1])
        ttok, tmode, tmfu, tpeak = t["tokens_per_s"], t["compile"], f"{100 * t['mfu']:.1f}%", f"{t['peak_mem_gib']:.2f}"
        tw = f"{t['watts']:.0f}" if "watts" in t else "-"
    except (OSError, IndexError, ValueError, KeyError):
        ttok, tmode, tmfu, tpeak, tw = float("nan"), "-", "-", "-", "-"
    logits = [o[len("logits"):] for o in g.split(",") if o.startswith("logits")]
    print(f"| {m} | {b} | {r} | {p}{' ' + recipe if recipe else ''} | {'CUDA graph' if 'graphs' in g else 'launches'}{', autotuned' if 'autotune' in g else ''}{', logits chunk ' + logits[0] if logits else ''}{', fast dgrad' if 'fastdgrad' in g else ''} | {ltok:.0f} | {lmfu} | {lpeak} | {ttok:.0f} | {tmode} | {tmfu} | {tpeak} | {ltok / ttok:.2f}x | {lw} / {tw} |")
PY
exit $failed
