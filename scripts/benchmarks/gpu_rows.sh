#!/usr/bin/env bash
# Every GPU row BENCHMARKS.md is missing, in one run on one GPU (issues 22 and 32; about 8 minutes on an H200
# by the CPU/H200 step-time ratios of earlier rows), one folder per table under OUT, each with its
# bench.json and bench.md:
#   highway_gru_<precision>_T<length>  Highway-BP over time, 1-layer GRU LM (hidden 512, batch 128):
#                                      backprop (cuDNN), bptt_loop, highway k = 0, 5, 10 (paper Table 3)
#   highway_residual_<precision>       Highway-BP on the 32-block residual MLP (width 256, batch 256), both paths
#   engines_<upkeep>                   backprop and FOTON steps on the orthogonal tanh MLP (depth 8, 32;
#                                      width 256, 1024; batch 256) with Björck x3 and with the retraction
#   upkeep                             orthogonal / plain step: Björck (adaptive, at most 8 iterations) and
#                                      retraction, backprop and FOTON, depth 8, 32, width 256, 1024, batch 64, 256
#   grads_ortho_lenet                  gradient computation alone of backprop, FA, DFA, FOTON, PEPITA on the
#                                      orthogonal CNN (8 x 8 inputs, batch 64): each orthogonal weight once per step
#   upkeep_optimizers                  orthogonal / plain step under momentum SGD, Adam, AdamW: Björck x3, adaptive,
#                                      x3 every 4 steps, geotorch expm and cayley, geoopt; depth 4, width 256, 1024,
#                                      batch 64 (issue 32)
#   grads_foton_b<batch>               gradient computation alone, FOTON against backprop (and the bare pass) on the
#                                      orthogonal tanh MLP, depth 8, 32, 64, width 256, 1024 (issue 32, item 1)
#   precision_compile.md               every engine's step in float32, bf16-mixed, 16-mixed and compiled (inductor)
#                                      on the zoo's GPT and the orthogonal MLP (issue 49; scripts/benchmarks/precision_bench.py)
# <precision> is tf32 and fp32 on CUDA. OUT/times.txt has the seconds each part took.
#   usage: scripts/benchmarks/gpu_rows.sh [OUT]         on the GPU (DEVICE=cuda; PYTHON=python)
#          DRY_RUN=1 scripts/benchmarks/gpu_rows.sh OUT  the same commands at tiny sizes on the CPU, in seconds
#                                             (tests/test_gpu_rows.py runs it, so the script is known to work)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench_out/gpu_rows}
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}  # the project's environment
mkdir -p "$out"
: > "$out/times.txt"
if [ "${DRY_RUN:-0}" = 1 ]; then
  device=cpu precisions=fp32
  lengths="8" hidden=8 rbatch=4 rdepth=3 widths=8 depths=2 fdepths=2 batch=8 batches=4 steps=20 warmup=1 obatch=4
else
  device=${DEVICE:-cuda} precisions="tf32 fp32"
  lengths="256 1024" hidden=512 rbatch=128 rdepth=32 widths=256,1024 depths=8,32 fdepths=8,32,64 batch=256
  batches=64,256
  steps=30 warmup=5 obatch=64
fi
common=(--device "$device" --steps "$steps" --warmup "$warmup")

part() {  # part NAME -- bench.py flags: one bench run into OUT/NAME, its time in times.txt
  local name=$1
  shift
  local start=$SECONDS
  echo "[gpu_rows] $name" >&2
  "$py" scripts/bench.py "$@" "${common[@]}" --out "$out/$name" > /dev/null
  echo "$name $((SECONDS - start)) s" >> "$out/times.txt"
}

for precision in $precisions; do
  tf32=$([ "$precision" = tf32 ] && echo --tf32 || true)
  for T in $lengths; do
    part "highway_gru_${precision}_T$T" --suite recurrent --cell gru --hidden "$hidden" --recurrent-depths 1 \
        --lengths "$T" --recurrent-batch-size "$rbatch" \
        --trainers 'backprop;bptt_loop;highway:k=0;highway:k=5;highway:k=10' $tf32
  done
  part "highway_residual_$precision" --suite residual --residual-depth "$rdepth" --widths "${widths%%,*}" \
      --batch-size "$batch" $tf32
done
for upkeep in bjorck retraction; do
  part "engines_$upkeep" --suite engines --trainers 'backprop;foton' --depths "$depths" --widths "$widths" \
      --batch-size "$batch" --orthogonal "$upkeep"
done
part upkeep --suite upkeep --trainers 'backprop;foton' --depths "$depths" --widths "$widths" --batch-sizes "$batches"
part grads_ortho_lenet --suite grads --grads-model ortho_lenet --trainers 'backprop;fa;dfa;foton;pepita' \
    --batch-size "$obatch"
part upkeep_optimizers --suite upkeep-optimizers --depths 4 --widths "$widths" --batch-size "$obatch"
for b in ${batches//,/ }; do
  part "grads_foton_b$b" --suite grads --trainers 'backprop;foton' --depths "$fdepths" --widths "$widths" --batch-size "$b"
done
# every engine's step at each precision and compiled (issue 49): scripts/benchmarks/precision_bench.py, a Markdown table
start=$SECONDS
echo "[gpu_rows] precision_compile" >&2
if [ "${DRY_RUN:-0}" = 1 ]; then
  "$py" scripts/benchmarks/precision_bench.py --device cpu --models gpt --engines backprop --precisions 32,bf16-mixed \
      --compile aot_eager --rounds 1 --steps 2 --depth 1 --width 16 --vocab 50 --seq-len 8 > "$out/precision_compile.md"
else
  "$py" scripts/benchmarks/precision_bench.py --device "$device" --precisions 32,bf16-mixed,16-mixed --compile inductor \
      --rounds 5 --steps 20 > "$out/precision_compile.md"
fi
echo "precision_compile $((SECONDS - start)) s" >> "$out/times.txt"
cat "$out/times.txt"
