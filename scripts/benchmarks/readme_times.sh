#!/usr/bin/env bash
# The README's stated times, measured on the commands as written (run from the repository root; only --logdir
# is added, so that each command writes into OUT). One run each; prints a Markdown table with the machine.
#
#   bash scripts/benchmarks/readme_times.sh OUT [RNN_MODEL_DIR]
#
# RNN_MODEL_DIR: a folder holding pytorch/examples' word_language_model/model.py saved as rnn_model.py (the
# README's unmodified-model comparison); without it that row is left out. Needs ../shared/data/ptb.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: bash scripts/benchmarks/readme_times.sh OUT [RNN_MODEL_DIR]}
RNN_DIR=${2:-}
mkdir -p "$OUT"
PY=.venv/bin/python
ROWS=()

measure() {  # name, then the command
    local name=$1
    shift
    local start end
    start=$(date +%s.%N)
    "$@" >"$OUT/$name.log" 2>&1 || { echo "failed: $name (see $OUT/$name.log)" >&2; return 1; }
    end=$(date +%s.%N)
    ROWS+=("| $name | \`$*\` | $(echo "$end - $start" | bc | xargs printf '%.0f') |")
    echo "${ROWS[-1]}" >&2
}

measure default-comparison $PY scripts/compare.py --logdir "$OUT/default"
measure default-comparison-threads-1 $PY scripts/compare.py --threads 1 --logdir "$OUT/threads1"
measure default-comparison-threads-2 $PY scripts/compare.py --threads 2 --logdir "$OUT/threads2"
measure bert-copy $PY scripts/compare.py --model transformers:BertForTokenClassification \
    --model-option num_hidden_layers=2 --model-option hidden_size=32 --model-option num_attention_heads=2 \
    --model-option intermediate_size=64 --task copy --task-option delay=5 --trainers backprop,highway:k=2,fa,dfa \
    --epochs 3 --seeds 0 --logdir "$OUT/bert"
measure gpt2-highway $PY scripts/train.py --model transformers:GPT2LMHeadModel --model-option n_layer=2 \
    --model-option n_embd=64 --model-option n_head=2 --task ptb-word --data-dir ../shared/data/ptb \
    --task-option seq_len=32 --batch-size 16 --steps 200 --eval-batches 4 --trainer highway --highway-k 2 \
    --logdir "$OUT/gpt2"
measure dsf-ptb-char $PY scripts/train.py --trainer dsf --model rnn_lm --cell gru --hidden 256 --depth 3 \
    --task ptb-char --data-dir ../shared/data/ptb --dsf-feedback linspace --grad-agreement-every 50 \
    --steps 800 --eval-every 200 --eval-batches 8 --eval-batch-size 256 --logdir "$OUT/dsf"
if [ -n "$RNN_DIR" ]; then
    DATA=$(pwd)/../shared/data/ptb
    measure rnnmodel-comparison bash -c "cd '$RNN_DIR' && $(pwd)/$PY $(pwd)/scripts/compare.py \
        --model rnn_model.py:RNNModel --model-call layout=time_first \
        --model-option rnn_type=LSTM --model-option ntoken=10000 --model-option ninp=64 --model-option nhid=64 \
        --model-option nlayers=2 --model-option dropout=0.0 --trainers backprop,dsf,ftbptt,highway \
        --task ptb-word --data-dir '$DATA' --steps 100 --seeds 0 --eval-batches 4 --logdir '$OUT/rnnmodel'"
fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%F)"
echo "| command | as run | wall s |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
