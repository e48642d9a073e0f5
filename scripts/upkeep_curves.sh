#!/usr/bin/env bash
# Björck projection against the Cayley retraction on digits (BENCHMARKS.md, issue 15): backprop and FOTON on
# the same orthogonal tanh MLP of width 64, depths 8 and 32, kept orthogonal either by 3 Björck iterations
# after every step or by the Cayley retraction of the step (orthogonal=retraction). Both upkeeps take the
# same plain SGD step, FOTON's published setting for every run (lr 0.5, no momentum, batch 256); 60 epochs
# (300 steps), seeds 0,1,2. One experiment folder per depth: its summary.md and comparison.png hold the
# four runs' curves side by side.
#
#   bash scripts/upkeep_curves.sh [LOGDIR] [EPOCHS]
# Then: python scripts/table.py LOGDIR --columns backprop-bjorck,backprop-retraction,foton-bjorck,foton-retraction
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LOGDIR=${1:-runs/upkeep-digits}
EPOCHS=${2:-60}
common=(--task digits --model mlp --width 64 --activation tanh --optimizer sgd --momentum 0 --lr 0.5
        --batch-size 256 --epochs "$EPOCHS" --seeds 0,1,2 --logdir "$LOGDIR" --log-every 5 --resume)
for depth in 8 32; do
  for upkeep in bjorck retraction; do
    for trainer in backprop foton; do
      $PY scripts/compare.py "${common[@]}" --depth "$depth" --orthogonal "$upkeep" --trainers "$trainer" \
          --run-name "$trainer-$upkeep" --experiment "depth$depth" > /dev/null || echo "a run diverged (summary.md)"
    done
  done
  echo "$(date +%T) done depth $depth"
done
$PY scripts/table.py "$LOGDIR" --columns backprop-bjorck,backprop-retraction,foton-bjorck,foton-retraction
