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
# over its timed steps (NVML: an H100 or H200 at full load runs at or near its 700 W limit) as a table; the raw
# outputs go to $OUT (or /tmp). A config may name loom's precision (bf16 by default, or fp8: the
# blocks' matmuls in FP8), its FP8 recipe (tensorwise by default, or delayed) and options, a comma
# list of `graphs` for loom's --cuda-graphs (the whole step replayed as one CUDA graph; launched
# op by op by default), `autotune` for --gemm-autotune (matmul algorithms chosen by timing) and
# `logitsROWS` (e.g. logits8192) for --logits-chunk ROWS (the output layer's rows at a time) and
# `fastdgrad` for --fp8-fast-dgrad (fp8's input-gradient products with fast accumulation);
# the peer runs in bf16, once per model and batch a round, in torch.compile's modes without CUDA graphs.
# PEER_TIMEOUT (seconds, default none) bounds each peer mode's run, compile included: a mode cut
# off is left out (its stderr says so) and the table names the mode whose figure it shows, so a
# slow max-autotune compile no longer costs the whole table. STEPS (default 40) sets the timed steps
# of each run: the power figures need at least 1 s of them (NVML's energy counter moves every
# ~100 ms). REPEAT (default 1) runs the whole sequence, loom's configs and the peer, that many
# rounds in turn; the table then shows each side's median run (the lower middle one of an even
# count) and the median of the rounds' ratios, and a line a config lists every round's ratio (a
# mark within a few percent of the ratio wants several pairings: between calls the peer moves by
# ~1%).
#   bash scripts/bench_gpu.sh [MODEL:BATCH[:RECOMPUTE[:PRECISION[:RECIPE[:OPTIONS]]]] ...]   (RECOMPUTE: none, gelu, full;
#   OPTIONS: a comma list of graphs, autotune, logitsROWS, fastdgrad)
set -u
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${OUT:-/tmp}
CONFIGS=("$@")
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(gpt2:16 gpt2-medium:16 gpt2-xl:8 gpt2-xl:8:gelu:fp8)
REPEAT=${REPEAT:-1}
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || { echo "bench_gpu.sh: REPEAT='$REPEAT' is not a positive count of rounds" >&2; exit 2; }
failed=0
for round in $(seq 1 "$REPEAT"); do
    rs=$([ "$REPEAT" -gt 1 ] && echo "_r$round") # the round's suffix on its output files
    declare -A peer_done=() # model:batch pairs whose peer ran in this round
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
            "${opts[@]}" > "$OUTDIR/bench_loom_${m}_${b}_${r:-none}_${p:-bf16}${f:+_$f}${g:+_${g//,/_}}$rs.txt" || failed=1
        peer="$OUTDIR/bench_torch_${m}_$b$rs"
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
    unset peer_done
done
python3 - "$OUTDIR" "$REPEAT" "${CONFIGS[@]}" <<'PY'
import json, statistics, sys
out, repeat, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
suffixes = [f"_r{k}" for k in range(1, repeat + 1)] if repeat > 1 else [""]
median = lambda xs: statistics.median(xs) if xs else float("nan")
print("| model | B | loom recompute | loom precision | loom step | loom tokens/s | loom MFU | loom peak GiB | PyTorch (bf16) tokens/s | PyTorch compile | PyTorch MFU | PyTorch peak GiB | loom / PyTorch | W loom / PyTorch |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
def loom_of(name): # (tokens/s, MFU, peak GiB, W) of one loom run's output
    try:
        row = [l for l in open(name) if l.startswith("|") and "step ms" not in l][-1]
        f = [x.strip() for x in row.strip().strip("|").split("|")]
        lw = ([l.split()[1] for l in open(name) if l.startswith("power:") and l.split()[1].isdigit()] or ["-"])[-1]
        return float(f[4]), f[8], f[9].replace(" GiB", ""), lw
    except (OSError, IndexError, ValueError):
        return float("nan"), "-", "-", "-"
def peer_of(name): # (tokens/s, compile mode, MFU, peak GiB, W) of the peer's faster mode in one round
    try:
        t = json.loads(open(name).read().strip().splitlines()[-1])
        tw = f"{t['watts']:.0f}" if "watts" in t else "-"
        return t["tokens_per_s"], t["compile"], f"{100 * t['mfu']:.1f}%", f"{t['peak_mem_gib']:.2f}", tw
    except (OSError, IndexError, ValueError, KeyError):
        return float("nan"), "-", "-", "-", "-"
def middle(runs): # the run with the median tokens/s (the lower one of an even count), or the first
    ok = sorted((x for x in runs if x[0] == x[0]), key=lambda x: x[0])
    return ok[(len(ok) - 1) // 2] if ok else runs[0]
notes = []
for c in configs:
    m, b, r, p, recipe, g = (c.split(":") + ["", "", "", ""])[:6]
    r, p = r or "none", p or "bf16" # the defaults the loom runs above took
    stem = f"{out}/bench_loom_{m}_{b}_{r}_{p}{'_' + recipe if recipe else ''}{'_' + g.replace(',', '_') if g else ''}"
    louts = [loom_of(f"{stem}{sfx}.txt") for sfx in suffixes]
    pouts = [peer_of(f"{out}/bench_torch_{m}_{b}{sfx}.json") for sfx in suffixes]
    ratios = [l[0] / t[0] for l, t in zip(louts, pouts) if l[0] == l[0] and t[0] == t[0]]
    (ltok, lmfu, lpeak, lw), (ttok, tmode, tmfu, tpeak, tw) = middle(louts), middle(pouts)
    ratio = median(ratios)
    logits = [o[len("logits"):] for o in g.split(",") if o.startswith("logits")]
    print(f"| {m} | {b} | {r} | {p}{' ' + recipe if recipe else ''} | {'CUDA graph' if 'graphs' in g else 'launches'}{', autotuned' if 'autotune' in g else ''}{', logits chunk ' + logits[0] if logits else ''}{', fast dgrad' if 'fastdgrad' in g else ''} | {ltok:.0f} | {lmfu} | {lpeak} | {ttok:.0f} | {tmode} | {tmfu} | {tpeak} | {ratio:.2f}x | {lw} / {tw} |")
    if repeat > 1:
        notes.append(f"{c}: loom / PyTorch by round " + " ".join(f"{x:.3f}x" for x in ratios) +
                     " (loom " + " ".join(f"{l[0]:.0f}" for l in louts) + "; PyTorch " + " ".join(f"{t[0]:.0f}" for t in pouts) + ")")
if repeat > 1:
    print(f"\nOver {repeat} rounds: each side's median run (the lower middle one of an even count), the ratio the median of the rounds' ratios.")
    print("\n".join(notes))
PY
exit $failed
