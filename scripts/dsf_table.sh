#!/usr/bin/env bash
# The DSF training tables of BENCHMARKS.md: bptt (the backprop engine), ftbptt and dsf with
# each feedback option (linspace = the authors', constant 0.5, tied, gate) on the authors'
# PTB model shape (rnn_lm: embedding, residual GRU layers, linear head), Adam 1e-3, cosine
# schedule, batch 32, gradient agreement with BPTT logged every 50 steps.
#
#   bash scripts/dsf_table.sh GRID [LOGDIR] [DEVICE] [SEEDS] [more scripts/compare.py flags]
#
#   GRID ptb-char | ptb-word: GRU hidden 256, 1 and 3 layers, weight decay 1e-4 (coupled, as
#        the authors). This checkout has no ptb.train.txt: the runs train on ptb.test.txt and
#        select and report on ptb.valid.txt (held out); their "test" split is then the
#        training text, so read best_val. PTB_DIR overrides ../shared/data/ptb.
#   GRID synthetic: copy (8 symbols, length 5, delay 20) and adding (length 50, 20 bins),
#        one GRU layer, hidden 128, Adam 3e-3; read test accuracy.
#
# Then: python scripts/table.py LOGDIR --value best_val (PTB) or test (synthetic)
#         --columns backprop,ftbptt,dsf,dsf-constant,dsf-tied,dsf-gate
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
GRID=${1:?"usage: dsf_table.sh ptb-char|ptb-word|synthetic [LOGDIR] [DEVICE] [SEEDS]"}
LOGDIR=${2:-runs/dsf-$GRID}
DEVICE=${3:-cpu}
SEEDS=${4:-0,1}
shift $(($# < 4 ? $# : 4))
EXTRA=("$@")
PTB_DIR=${PTB_DIR:-../shared/data/ptb}

compare() {  # compare EXPERIMENT FLAGS...: every trainer and feedback on one setting
  local exp=$1
  shift
  local c=("$@" --experiment "$exp" --logdir "$LOGDIR" --seeds "$SEEDS" --device "$DEVICE" --progress false "${EXTRA[@]}")
  $PY scripts/compare.py "${c[@]}" --trainers backprop,ftbptt,dsf > /dev/null
  for feedback in constant tied gate; do
    $PY scripts/compare.py "${c[@]}" --trainers dsf --dsf-feedback "$feedback" --run-name "dsf-$feedback" > /dev/null
  done
  echo "done $exp"
}

common=(--model rnn_lm --cell gru --optimizer adam --lr 1e-3 --schedule cosine --batch-size 32
        --eval-batch-size 256 --grad-agreement-every 50 --log-every 10)
case "$GRID" in
  ptb-char | ptb-word)
    if [ "$GRID" = ptb-char ]; then
      task=(--task ptb-char --task-option seq_len=128 --epochs "${EPOCHS:-8}")
    else
      task=(--task ptb-word --task-option seq_len=64 --epochs "${EPOCHS:-20}")
    fi
    for depth in 1 3; do
      compare "$GRID-gru-depth$depth" "${common[@]}" "${task[@]}" --data-dir "$PTB_DIR" \
          --task-option train_file=ptb.test.txt --hidden 256 --depth "$depth" --weight-decay 1e-4
    done
    ;;
  synthetic)
    synthetic=(--hidden 128 --depth 1 --epochs "${EPOCHS:-20}" --lr 3e-3)
    compare copy-delay20 "${common[@]}" "${synthetic[@]}" --task copy --task-option delay=20 \
        --task-option length=5 --vocab-size 10
    compare adding-50 "${common[@]}" "${synthetic[@]}" --task adding --task-option length=50 --input-dim 2
    ;;
  *)
    echo "error: unknown grid '$GRID' (ptb-char, ptb-word, synthetic)" >&2
    exit 2
    ;;
esac
