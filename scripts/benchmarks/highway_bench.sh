#!/usr/bin/env bash
# The Highway-BP benchmark of BENCHMARKS.md in one command (the GPU rows need only DEVICE=cuda):
# step time of backprop (fused nn.GRU), bptt_loop and highway at k = 0, 5, 10 on a 1-layer GRU
# language model (hidden 512, sequence lengths 256 and 1024, batch BATCH, default 128), in fp32
# and (on CUDA) with TF32 matmuls; then the 32-block residual MLP on both Highway-BP paths.
#   usage: scripts/benchmarks/highway_bench.sh DEVICE OUTDIR [more scripts/bench.py flags]
# One Markdown table per run in OUTDIR (gru_<precision>_T<length>.md, residual_<precision>.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
device=${1:-cpu}
out=${2:-bench_out/highway}
shift 2 || true
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}  # the project's environment
batch=${BATCH:-128}
tmp=$(mktemp -d)
mkdir -p "$out"
precisions=$([ "$device" = cpu ] && echo fp32 || echo "tf32 fp32")
trainers='backprop;bptt_loop;highway:k=0;highway:k=5;highway:k=10'
for precision in $precisions; do
  flag=$([ "$precision" = tf32 ] && echo --tf32 || true)
  for T in 256 1024; do
    $py scripts/bench.py --suite recurrent --device "$device" --cell gru --hidden 512 --recurrent-depths 1 \
        --lengths "$T" --recurrent-batch-size "$batch" --trainers "$trainers" $flag --out "$tmp/r" "$@" >/dev/null
    cp "$tmp/r/bench.md" "$out/gru_${precision}_T${T}.md"
    cat "$out/gru_${precision}_T${T}.md"
  done
  $py scripts/bench.py --suite residual --device "$device" --residual-depth 32 --widths 256 --batch-size 256 \
      $flag --out "$tmp/m" "$@" >/dev/null
  cp "$tmp/m/bench.md" "$out/residual_${precision}.md"
  cat "$out/residual_${precision}.md"
done
rm -rf "$tmp"
echo "tables in $out"
