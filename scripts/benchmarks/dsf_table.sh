#!/usr/bin/env bash
# The DSF training tables of BENCHMARKS.md: bptt (the backprop engine), ftbptt and dsf on the
# authors' PTB model shape (rnn_lm: embedding, residual GRU layers, linear head), gradient
# agreement with BPTT logged every 50 steps. Every (experiment, trainer, seed) is its own
# resumable run (compare.py --resume auto); finished ones are skipped, so the script can be killed
# and started again, and several copies can share the work (one per seed).
#
#   bash scripts/benchmarks/dsf_table.sh GRID [LOGDIR] [DEVICE] [SEEDS]   (env: EPOCHS, DEPTHS, TRAINERS, FEEDBACKS, PTB_DIR)
#
#   GRID ptb-sentences: the DSF paper's setting on full PTB (../shared/data/ptb, or PTB_DIR):
#        sentence-level ptb-word (each line <bos> ... <eos>, 64-token context), GRU 256 with
#        DEPTHS layers (default "1 3"), Adam 1e-3, weight decay 1e-4 (coupled, as the authors),
#        batch 128, eval batch 256, x0.1 every 10 epochs, EPOCHS (paper: 30; default 1 here,
#        about 10-15 min per run on one CPU core), 5 evaluations per epoch. dsf runs the
#        authors' linspace feedback; FEEDBACKS (default "tied gate") adds runs dsf-<feedback>
#        on seed 0. Read best_val (the paper reports best validation perplexity).
#   GRID ptb-char: characters of full PTB, 128-character windows, GRU 256 with DEPTHS layers,
#        Adam 1e-3, batch 32, EPOCHS (default 1), evaluation every 500 steps on 8 validation batches.
#   GRID synthetic: copy (8 symbols, length 5, delay 20) and adding (length 50, 20 bins),
#        one GRU layer, hidden 128, Adam 3e-3, cosine schedule, batch 32; read test accuracy.
#
# Then: python scripts/table.py LOGDIR --value best_val (PTB) or test (synthetic)
#         --columns backprop,ftbptt,dsf,dsf-tied,dsf-gate
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
GRID=${1:?"usage: dsf_table.sh ptb-sentences|ptb-char|synthetic [LOGDIR] [DEVICE] [SEEDS]"}
LOGDIR=${2:-runs/dsf-$GRID}
DEVICE=${3:-cpu}
SEEDS=${4:-0,1,2}
PTB_DIR=${PTB_DIR:-../shared/data/ptb}

run() {  # run EXPERIMENT TRAINER RUN_NAME SEED FLAGS...: one resumable run, skipped once finished
  local exp=$1 trainer=$2 name=$3 seed=$4
  shift 4
  [ -f "$LOGDIR/$exp/$name/seed$seed/result.json" ] && return 0
  echo "$(date +%T) start $exp $name seed $seed"
  $PY scripts/compare.py "$@" --experiment "$exp" --trainers "$trainer" --run-name "$name" --seeds "$seed" \
      --logdir "$LOGDIR" --device "$DEVICE" --settings shared --resume auto \
      > "$LOGDIR/log-${exp//\//-}-$name-$seed.txt" 2>&1 || echo "$(date +%T) failed $exp $name seed $seed (see its log)"
}

grid() {  # grid EXPERIMENT FLAGS...: TRAINERS (bptt, ftbptt, dsf) on every seed, the other feedbacks on seed 0
  local exp=$1
  shift
  for seed in ${SEEDS//,/ }; do
    for trainer in ${TRAINERS-backprop ftbptt dsf}; do
      run "$exp" "$trainer" "$trainer" "$seed" "$@"
    done
  done
  for feedback in ${FEEDBACKS-tied gate}; do
    run "$exp" dsf "dsf-$feedback" 0 "$@" --dsf-feedback "$feedback"
  done
}

mkdir -p "$LOGDIR"
case "$GRID" in
  ptb-sentences)
    steps_per_epoch=329  # 42,068 training sentences / 128
    for depth in ${DEPTHS:-1 3}; do
      grid "gru-${depth}x256" --task ptb-word --data-dir "$PTB_DIR" --task-option sentences=True \
          --task-option seq_len=64 --model rnn_lm --cell gru --hidden 256 --depth "$depth" --optimizer adam \
          --lr 1e-3 --weight-decay 1e-4 --schedule step --step-size $((10 * steps_per_epoch)) --gamma 0.1 \
          --batch-size 128 --eval-batch-size 256 --eval-every 66 --log-every 10 --grad-agreement-every 50 \
          --epochs "${EPOCHS:-1}"
    done
    ;;
  ptb-char)
    for depth in ${DEPTHS:-1 3}; do
      grid "char-gru-${depth}x256" --task ptb-char --data-dir "$PTB_DIR" --task-option seq_len=128 --model rnn_lm \
          --cell gru --hidden 256 --depth "$depth" --optimizer adam --lr 1e-3 --batch-size 32 \
          --eval-batch-size 128 --eval-every 500 --eval-batches 8 --log-every 10 --grad-agreement-every 50 \
          --epochs "${EPOCHS:-1}"
    done
    ;;
  synthetic)
    common=(--model rnn_lm --cell gru --hidden 128 --depth 1 --optimizer adam --lr 3e-3 --schedule cosine
            --batch-size 32 --eval-batch-size 256 --grad-agreement-every 50 --log-every 10 --epochs "${EPOCHS:-20}")
    FEEDBACKS=${FEEDBACKS-constant tied gate} grid copy-delay20 "${common[@]}" --task copy --task-option delay=20 \
        --task-option length=5 --vocab-size 10
    FEEDBACKS=${FEEDBACKS-constant tied gate} grid adding-50 "${common[@]}" --task adding --task-option length=50 \
        --input-dim 2
    ;;
  *)
    echo "error: unknown grid '$GRID' (ptb-sentences, ptb-char, synthetic)" >&2
    exit 2
    ;;
esac
