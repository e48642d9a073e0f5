#!/usr/bin/env bash
# The DSF benchmark of BENCHMARKS.md: training-step time of bptt (backprop, fused nn.GRU),
# bptt_loop, ftbptt and dsf on a GRU language model, hidden 512, batch 128, 1 and 3 layers,
# sequence lengths 256 / 1024 / 4096, in fp32 and (on CUDA) with TF32 matmuls; then the scan alone.
#   usage: scripts/benchmarks/dsf_bench.sh DEVICE OUTDIR [more scripts/bench.py flags]
# One Markdown table per run in OUTDIR (recurrent_<precision>_depth<k>.md, scan.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
device=${1:-cpu}
out=${2:-bench_out/dsf}
shift 2 || true
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}  # the project's environment
tmp=$(mktemp -d)
mkdir -p "$out"
precisions=$([ "$device" = cpu ] && echo fp32 || echo "tf32 fp32")
for depth in 1 3; do
  for precision in $precisions; do
    flag=$([ "$precision" = tf32 ] && echo --tf32 || true)
    $py scripts/bench.py --suite recurrent --device "$device" --recurrent-depths "$depth" $flag \
        --out "$tmp/r" "$@" >/dev/null
    cp "$tmp/r/bench.md" "$out/recurrent_${precision}_depth${depth}.md"
    cat "$out/recurrent_${precision}_depth${depth}.md"
  done
done
$py scripts/bench.py --suite scan --device "$device" --out "$tmp/s" "$@" >/dev/null
cp "$tmp/s/bench.md" "$out/scan.md"
cat "$out/scan.md"
rm -rf "$tmp"
echo "tables in $out"
