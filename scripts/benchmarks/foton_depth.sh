#!/usr/bin/env bash
# The FOTON depth table of BENCHMARKS.md (Scale: "FOTON at depth", "FA and DFA at depth"): FOTON, PEPITA, FA, DFA and backprop on the same
# orthogonal (Bjorck x3) tanh MLP of width 64, depths 2 / 8 / 32 / 100, each trainer at its
# recipe (trainers/experiments/recipes.py: FOTON SGD 0.5 batch 256, PEPITA SGD 0.01 momentum 0.9 batch 64,
# backprop, FA and DFA Adam 1e-3 batch 64), seeds 0,1,2, per-layer gradient agreement every 10 steps.
# Then FOTON tuned at depths 32 and 100 (compare.py --tune, validation split only).
#
#   bash scripts/benchmarks/foton_depth.sh TASK [LOGDIR] [EPOCHS]
#   TASK digits (30 epochs) or mnist-t10k (10 epochs; MNIST's t10k files in
#        ../shared/data/mnist-t10k, or DATA_DIR/mnist-t10k)
# Then: python scripts/table.py LOGDIR --columns backprop,foton,pepita,fa,dfa,foton-tuned
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
TASK=${1:?"usage: foton_depth.sh digits|mnist-t10k [LOGDIR] [EPOCHS]"}
LOGDIR=${2:-runs/foton-depth-$TASK}
case "$TASK" in
  digits) EPOCHS=${3:-30}; data=() ;;
  mnist-t10k) EPOCHS=${3:-10}; data=(--data-dir "${DATA_DIR:-../shared/data}") ;;
  *) echo "error: unknown task '$TASK' (digits, mnist-t10k)" >&2; exit 2 ;;
esac
common=(--task "$TASK" "${data[@]}" --model mlp --width 64 --activation tanh --orthogonal bjorck
        --epochs "$EPOCHS" --seeds 0,1,2 --logdir "$LOGDIR" --grad-agreement-every 10
        --log-every 10)
for depth in 2 8 32 100; do
  $PY scripts/compare.py "${common[@]}" --depth "$depth" --experiment "depth$depth" \
      --trainers "${TRAINERS:-backprop,foton,pepita,fa,dfa}" --resume auto > /dev/null || echo "a run diverged (summary.md)"
  echo "$(date +%T) done depth $depth"
done
for depth in 32 100; do  # FOTON tuned: Adam (per-coordinate steps undo its per-layer scale) x temperature
  $PY scripts/compare.py "${common[@]}" --depth "$depth" --experiment "depth$depth" --trainers foton \
      --run-name foton-tuned --tune --optimizer adam --tune-grid lr=1e-4,3e-4,1e-3,3e-3 \
      --tune-grid foton.temperature=1,8 --resume auto > /dev/null || echo "a run diverged (summary.md)"
  echo "$(date +%T) done tuned depth $depth"
done
$PY scripts/table.py "$LOGDIR" --columns backprop,foton,pepita,fa,dfa,foton-tuned
