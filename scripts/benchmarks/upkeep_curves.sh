#!/usr/bin/env bash
# Björck projection against the Cayley retraction on digits (BENCHMARKS.md "Training with the Cayley retraction"): backprop and FOTON on
# the same orthogonal tanh MLP of width 64, depths 8 and 32, kept orthogonal either by 3 Björck iterations
# after every step or by the Cayley retraction of the step (orthogonal=retraction). Both upkeeps take the
# same plain SGD step, FOTON's published setting for every run (lr 0.5, no momentum, batch 256), and lr 0.05
# at depth 32; 60 epochs (300 steps), seeds 0,1,2. One experiment folder per setting: its summary.md and
# comparison.png hold the four runs' curves side by side.
#
#   bash scripts/benchmarks/upkeep_curves.sh [LOGDIR] [EPOCHS]
# Then the table is printed (scripts/table.py), and the orthogonality error the retraction keeps over
# 1000 steps in float32 and float64 (width 1024).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
LOGDIR=${1:-runs/upkeep-digits}
EPOCHS=${2:-60}
common=(--task digits --model mlp --width 64 --activation tanh --optimizer sgd --momentum 0
        --batch-size 256 --epochs "$EPOCHS" --seeds 0,1,2 --logdir "$LOGDIR" --log-every 5 --resume auto)
for setting in 8:0.5 32:0.5 32:0.05; do  # depth:lr (0.5 is too large for depth 32, for both upkeeps alike)
  depth=${setting%:*} lr=${setting#*:}
  experiment=depth$depth$([ "$lr" = 0.5 ] || echo "-lr$lr")
  for upkeep in bjorck retraction; do
    for trainer in backprop foton; do
      $PY scripts/compare.py "${common[@]}" --depth "$depth" --lr "$lr" --orthogonal "$upkeep" --trainers "$trainer" \
          --run-name "$trainer-$upkeep" --experiment "$experiment" > /dev/null || echo "a run diverged (summary.md)"
    done
  done
  echo "$(date +%T) done $experiment"
done
$PY scripts/table.py "$LOGDIR" --columns backprop-bjorck,backprop-retraction,foton-bjorck,foton-retraction

# The orthogonality error the retraction keeps over 1000 steps (width 1024, batch 64, SGD 0.5), in float32
# and float64: the largest engine/orthogonality_error logged (every 50 steps) of each run.
for dtype in float32 float64; do
  for trainer in backprop foton; do
    $PY scripts/train.py --task digits --model mlp --width 1024 --depth 4 --activation tanh --orthogonal retraction \
        --optimizer sgd --momentum 0 --lr 0.5 --batch-size 64 --steps 1000 --log-every 50 --eval-every 1000 \
        --dtype "$dtype" --trainer "$trainer" --experiment "drift-$dtype" --logdir "$LOGDIR" --progress false \
        --resume auto > /dev/null
    $PY - "$LOGDIR/drift-$dtype/$trainer/seed0/metrics.jsonl" "$dtype" "$trainer" <<'PY'
import json, sys
errors = [r["engine/orthogonality_error"] for r in map(json.loads, open(sys.argv[1]))
          if "engine/orthogonality_error" in r]
print(f"{sys.argv[2]} {sys.argv[3]}: orthogonality error after step 50 {errors[0]:.2e}, "
      f"after step 1000 {errors[-1]:.2e}, largest {max(errors):.2e}")
PY
  done
done
