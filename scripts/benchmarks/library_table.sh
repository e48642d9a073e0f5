#!/usr/bin/env bash
# The BENCHMARKS.md rows of models from transformers and timm, unmodified, through compare.py:
# backprop, Highway-BP at k = 1, 2, 4 (the residual stack found from an example run), FA and DFA
# (every weight layer's backward swapped in place), 3 seeds, Adam 1e-3 (the shared defaults).
#
#   bash scripts/benchmarks/library_table.sh GRID [LOGDIR] [SEEDS] [TRAINERS] [more scripts/compare.py flags]
#
#   GRID gpt2:   transformers' GPT2LMHeadModel, 4 layers (L = 8 residual sublayers), width 64, 2 heads,
#                random init sized to PTB words (vocabulary 10000), sequences of 32 words, batch 16,
#                300 steps on the full ptb.train.txt (PTB_DIR, default ../shared/data/ptb).
#   GRID resnet: timm's resnet34 at a quarter width (channels 16, 32, 64, 128), 1 input channel, on
#                scikit-learn's digits as 1 x 8 x 8 images, batch 64, 15 epochs (needs .venv-timm:
#                bash scripts/setup.sh timm). Its 16 blocks are 4 segments of 3, 3, 5 and 2 residual
#                blocks between 3 downsampling blocks, which Highway-BP backpropagates exactly.
#   TRAINERS default: backprop,highway:k=1,highway:k=2,highway:k=4,fa,dfa
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${1:?"usage: library_table.sh gpt2|resnet [LOGDIR] [SEEDS] [TRAINERS]"}
LOGDIR=${2:-runs/library}
SEEDS=${3:-0,1,2}
TRAINERS=${4:-backprop,highway:k=1,highway:k=2,highway:k=4,fa,dfa}
shift $(($# < 4 ? $# : 4))
EXTRA=("$@")
PTB_DIR=${PTB_DIR:-../shared/data/ptb}
common=(--logdir "$LOGDIR" --seeds "$SEEDS" --trainers "$TRAINERS" --settings shared --resume auto --log-every 10
        --grad-agreement-every 50 --progress false)
case "$GRID" in
  gpt2)
    PY=${PYTHON:-.venv/bin/python}
    $PY scripts/compare.py "${common[@]}" --experiment gpt2-ptb-word --task ptb-word --data-dir "$PTB_DIR" \
        --task-option seq_len=32 --model transformers:GPT2LMHeadModel --model-option n_layer=4 \
        --model-option n_embd=64 --model-option n_head=2 --batch-size 16 --steps "${STEPS:-300}" --eval-every 50 \
        --eval-batches 8 --eval-batch-size 128 "${EXTRA[@]}"
    ;;
  resnet)
    PY=${PYTHON:-.venv-timm/bin/python}
    $PY scripts/compare.py "${common[@]}" --experiment resnet34-digits --task digits --task-option flatten=False \
        --model timm:create_model --model-option model_name=resnet34 --model-option "channels=(16,32,64,128)" \
        --model-option num_classes=10 --model-option in_chans=1 --batch-size 64 --epochs "${EPOCHS:-15}" \
        "${EXTRA[@]}"
    ;;
  *)
    echo "unknown grid '$GRID' (gpt2, resnet)" >&2
    exit 2
    ;;
esac
