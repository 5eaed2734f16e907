#!/usr/bin/env bash
# The pipeline bubble measured on CPU ranks beside each schedule's theory: bubble.sh LOOM [PP [THREADS]]
# A model whose stages cost the same (8 blocks of C=256, a 256-token vocabulary, so the output
# layer is small), micro-batches of 4 x 64 tokens, 8 of them per step (global batch 32), one
# pipeline of PP ranks (default 2) with THREADS threads each (default 1; PP x THREADS should not
# exceed the cores). Every schedule trains 6 steps; `loom train` reports each stage's busy and
# bubble fractions over steps 2..6 and the theory at F = I = W. Prints one markdown table.
set -uo pipefail
LOOM=$1 PP=${2:-2} THREADS=${3:-1}
FIX=$(cd "$(dirname "$0")/../../tests/fixtures" && pwd)
WORK=$(mktemp -d /tmp/loom_bubble_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=$THREADS
ARGS=(--model gpt2-mini --layers 8 --heads 4 --channels 256 --max-seq 64 --vocab 256 --seq 64 --batch 4
      --global-batch 32 --steps 6 --train-data "$FIX/gpt2_eval_shard.bin" --threads "$THREADS" --pp "$PP" --device cpu)
echo "| schedule (pp $PP, 8 micro-batches) | bubble, theory | bubble, measured | per stage | step ms |"
echo "|---|---|---|---|---|"
for s in gpipe 1f1b interleaved zb-h1 zb-v dualpipev; do
  v=(); [ $s = interleaved ] && v=(--virtual-stages 2)
  if ! mpirun -np "$PP" --oversubscribe --bind-to none "$LOOM" train "${ARGS[@]}" --pp-schedule $s "${v[@]}" >"$WORK/$s.txt" 2>&1; then
    echo "| $s | FAIL: $(grep -m1 error "$WORK/$s.txt") | | | |"
    continue
  fi
  theory=$(grep -o 'theory: bubble [0-9.]*%' "$WORK/$s.txt" | awk '{print $3}')
  measured=$(grep -o 'all ranks: bubble [0-9.]*%' "$WORK/$s.txt" | awk '{print $4}')
  stages=$(grep -o 'rank [0-9]*: busy [0-9.]*%, bubble [0-9.]*%' "$WORK/$s.txt" | awk '{printf "%s%s", sep, $6; sep=" / "}')
  ms=$(grep '^step' "$WORK/$s.txt" | tail -5 | sed 's/.*| \([0-9.]*\) ms.*/\1/' | awk '{t += $1; n++} END {printf "%.0f", t / n}')
  echo "| $s | $theory | $measured | $stages | $ms |"
done
