#!/usr/bin/env bash
# The FOTON training table of BENCHMARKS.md: digits, depths 2/8/32/100, tanh and ReLU,
# seeds 0,1,2; backprop on a plain MLP, backprop and FOTON (output error temperature
# 1 and 8) on the same orthogonal (Bjorck x3) MLP, both PEPITA rules on the plain
# MLP (their published setting).
# Usage: bash scripts/benchmarks/foton_table.sh [LOGDIR] [EPOCHS]   (then: python scripts/table.py LOGDIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
LOGDIR=${1:-runs/foton-digits}
EPOCHS=${2:-30}
common=(--task digits --width 64 --epochs "$EPOCHS" --seeds 0,1,2 --logdir "$LOGDIR" --progress false
        --grad-agreement-every 100 --log-every 20)
for depth in 2 8 32 100; do
  for act in tanh relu; do
    exp="$act-depth$depth"
    m=(--model mlp --depth "$depth" --activation "$act" --experiment "$exp")
    $PY scripts/compare.py "${common[@]}" "${m[@]}" --orthogonal none --trainers backprop --run-name backprop-plain \
        --optimizer adam --lr 1e-3 > /dev/null
    $PY scripts/compare.py "${common[@]}" "${m[@]}" --orthogonal bjorck --trainers backprop,foton \
        --optimizer adam --lr 1e-3 > /dev/null
    $PY scripts/compare.py "${common[@]}" "${m[@]}" --orthogonal bjorck --trainers foton --foton-temperature 8 \
        --run-name foton-T8 --optimizer adam --lr 1e-3 > /dev/null
    for variant in iclr2024 icml2022; do
      $PY scripts/compare.py "${common[@]}" "${m[@]}" --orthogonal none --trainers pepita --pepita-variant "$variant" \
          --run-name "pepita-$variant" --optimizer sgd --lr 0.01 --momentum 0.9 > /dev/null
    done
    echo "done $exp"
  done
done
$PY scripts/table.py "$LOGDIR" --columns backprop-plain,backprop,foton,foton-T8,pepita-iclr2024,pepita-icml2022
