#!/usr/bin/env bash
# The Highway-BP training tables of BENCHMARKS.md: final metric against the number of
# iterations k (0, 1, 2, 4, 8 and k = L, which is exact) with backprop beside it, Adam,
# warmup + cosine schedule, gradient agreement with backprop logged every 50 steps.
#
#   bash scripts/benchmarks/highway_table.sh GRID [LOGDIR] [DEVICE] [SEEDS] [more scripts/compare.py flags]
#
#   GRID digits:   residual_mlp (16 blocks, width 64; L = 16) and resnet (pre-activation,
#                  depth 20, width 8, invertible downsampling; L = 9) on scikit-learn's
#                  8x8 digits; read test accuracy.
#   GRID ptb-char: rnn_lm, one GRU layer, hidden 128, sequences of 64 characters (time is
#                  the depth: L = 64, so k = 8 is far from exact; the exact column is
#                  backprop itself), STEPS (default 1730) steps; read best_val perplexity.
#   GRID ptb-word: gpt (4 layers = L = 8 sublayers, width 64, 4 heads, gamma 0.2),
#                  sequences of 64 words, STEPS (default 240) steps; read best_val perplexity.
#   GRID seq-digits: rnn_lm, one GRU layer, hidden 64, digits read as 64 pixels (L = 64),
#                  with FPI (--highway-mode fpi) at k = 0, 2, 8 beside Highway-BP; read test.
#   The PTB grids train on the full ptb.train.txt (PTB_DIR, default ../shared/data/ptb) for a
#   number of steps (the step budgets of the tables made when only a tenth of the text was
#   here: 8 and 6 epochs of it), evaluate every 40 (words) or 216 (characters) steps.
#
# Then: python scripts/table.py LOGDIR --value test|best_val \
#         --columns backprop,highway-k0,highway-k1,highway-k2,highway-k4,highway-k8,highway-exact \
#         --plot LOGDIR/k.png        (the metric against k, one panel per experiment)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
GRID=${1:?"usage: highway_table.sh digits|ptb-char|ptb-word|seq-digits [LOGDIR] [DEVICE] [SEEDS]"}
LOGDIR=${2:-runs/highway-$GRID}
DEVICE=${3:-cpu}
SEEDS=${4:-0,1,2}
shift $(($# < 4 ? $# : 4))
EXTRA=("$@")
PTB_DIR=${PTB_DIR:-../shared/data/ptb}

compare() {  # compare EXPERIMENT L FLAGS...: backprop, then highway at each k and at k = L
  local exp=$1 L=$2
  shift 2
  local c=("$@" --experiment "$exp" --logdir "$LOGDIR" --seeds "$SEEDS" --device "$DEVICE" --settings shared --resume auto
           "${EXTRA[@]}")
  $PY scripts/compare.py "${c[@]}" --trainers backprop > /dev/null
  for k in 0 1 2 4 8; do
    $PY scripts/compare.py "${c[@]}" --trainers highway --highway-k "$k" --run-name "highway-k$k" > /dev/null
  done
  if [ "$L" != none ]; then
    $PY scripts/compare.py "${c[@]}" --trainers highway --highway-k "$L" --run-name highway-exact > /dev/null
  fi
  echo "done $exp"
}

common=(--optimizer adam --lr 1e-3 --schedule cosine --grad-agreement-every 50 --log-every 10)
case "$GRID" in
  digits)
    compare residual-mlp-16 16 "${common[@]}" --task digits --model residual_mlp --depth 16 --width 64 \
        --batch-size 64 --epochs "${EPOCHS:-20}"
    compare resnet20-preact 9 "${common[@]}" --task digits --model resnet --depth 20 --width 8 \
        --batch-size 64 --epochs "${EPOCHS:-15}"
    ;;
  ptb-char)
    compare ptb-char-gru none "${common[@]}" --task ptb-char --data-dir "$PTB_DIR" --task-option seq_len=64 \
        --model rnn_lm --cell gru --hidden 128 --depth 1 --batch-size 32 --eval-batch-size 256 \
        --steps "${STEPS:-1730}" --eval-every 216
    ;;
  ptb-word)
    compare ptb-word-gpt 8 "${common[@]}" --task ptb-word --data-dir "$PTB_DIR" --task-option seq_len=64 \
        --model gpt --depth 4 --width 64 --heads 4 --batch-size 32 --eval-batch-size 128 --warmup-steps 20 \
        --steps "${STEPS:-240}" --eval-every 40
    ;;
  seq-digits)
    # the paper's pixel-level setting in small: FPI beside Highway-BP at the same k
    c=("${common[@]}" --task seq-digits --model rnn_lm --cell gru --hidden 64 --depth 1 --input-dim 1
       --batch-size 64 --lr 3e-3 --epochs "${EPOCHS:-15}")
    compare seq-digits-gru none "${c[@]}"
    for k in 0 2 8; do
      $PY scripts/compare.py "${c[@]}" --experiment seq-digits-gru --logdir "$LOGDIR" --seeds "$SEEDS" \
          --device "$DEVICE" --progress false --trainers highway --highway-mode fpi --highway-k "$k" \
          --run-name "fpi-k$k" "${EXTRA[@]}" > /dev/null
    done
    ;;
  *)
    echo "unknown grid '$GRID' (digits, ptb-char, ptb-word, seq-digits)" >&2
    exit 2
    ;;
esac
