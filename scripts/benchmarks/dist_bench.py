"""Data-parallel throughput: training samples per second of each engine on 1 and N processes.

For every (model, engine) below, scripts/train.py runs the same number of steps
with the same global batch three ways: one process with every thread, one
process with one thread, and N processes under torchrun (threads split evenly).
Each cell is the median over ``--repeats`` runs (the three ways interleaved)
of the median over the timed steps of rank 0's ``time/samples_per_s`` (global
batch / step time, gradient all-reduce included; warm-up steps and evaluation
excluded). On ``--device cuda`` every process takes its own GPU, and
the N-process runs need N GPUs.

    python scripts/benchmarks/dist_bench.py --out bench_out/dist            # CPU, N = 2
    python scripts/benchmarks/dist_bench.py --device cuda --procs 1 --out bench_out/dist_gpu
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from gradengines.trainers.bench import machine_description  # noqa: E402
from gradengines.trainers.cli import OneLineParser  # noqa: E402

# model flags -> engines that train it; sizes big enough that compute, not launch, sets the pace
SETUPS = {
    "mlp (orthogonal, 4 x 512)": (
        ["backprop", "foton", "pepita"],
        ["--model", "mlp", "--depth", "4", "--width", "512", "--activation", "tanh", "--orthogonal", "bjorck",
         "--task", "teacher", "--task-option", "in_features=512", "--task-option", "n_train=16384"],
        256),
    "residual_mlp (16 blocks, 256)": (
        ["backprop", "highway"],
        ["--model", "residual_mlp", "--depth", "16", "--width", "256", "--task", "teacher",
         "--task-option", "in_features=256", "--task-option", "n_train=16384"],
        256),
    "rnn_lm (GRU 256, T 64)": (
        ["backprop", "highway", "dsf", "ftbptt"],
        ["--model", "rnn_lm", "--cell", "gru", "--hidden", "256", "--depth", "1", "--task", "copy",
         "--vocab-size", "10", "--task-option", "length=16", "--task-option", "delay=32",
         "--task-option", "n_train=8192"],
        128),
}


def run_train(engine, flags, batch, procs, threads, args, logdir) -> float:
    """Median samples/s of one train.py run (rank 0's log)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
              if procs > 1 else [sys.executable])
    steps = args.steps + args.warmup
    cmd = [*launch, str(ROOT / "scripts" / "train.py"), "--trainer", engine, *flags,
           "--batch-size", str(batch // procs), "--steps", str(steps), "--eval-every", str(steps),
           "--log-every", "1", "--progress", "false", "--device", args.device, "--logdir", str(logdir),
           "--experiment", "bench", "--overwrite"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    lines = (logdir / "bench" / engine / "seed0" / "metrics.jsonl").read_text().splitlines()
    rates = [r["time/samples_per_s"] for r in map(json.loads, lines) if "time/samples_per_s" in r]
    return statistics.median(rates[args.warmup:])


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=2, help="processes of the data-parallel runs (default 2)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run (default 40)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell, interleaved; the median is kept")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--setups", default=None, help="comma list of model names to keep (e.g. mlp,rnn_lm)")
    parser.add_argument("--out", default="bench_out/dist")
    args = parser.parse_args(argv)
    if args.procs < 1 or args.steps < 20 or args.repeats < 1:
        print("error: --procs and --repeats must be >= 1 and --steps >= 20", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    on_gpu = args.device.startswith("cuda")
    ways = [("1 proc", 1, cores)] if on_gpu else [("1 proc x all threads", 1, cores), ("1 proc x 1 thread", 1, 1)]
    if args.procs > 1:
        ways.append((f"{args.procs} procs", args.procs, max(1, cores // args.procs)))
    keep = args.setups.split(",") if args.setups else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, (engines, flags, batch) in SETUPS.items():
            if keep and not any(model.startswith(k) for k in keep):
                continue
            for engine in engines:
                runs = {label: [] for label, _, _ in ways}
                for _ in range(args.repeats):
                    for label, procs, threads in ways:
                        runs[label].append(run_train(engine, flags, batch, procs, threads, args, Path(tmp)))
                row = {"model": model, "engine": engine, "global batch": batch,
                       **{label: statistics.median(r) for label, r in runs.items()}, "runs": runs}
                for label in runs:
                    print(f"{model:32s} {engine:9s} {label:22s} {row[label]:10.1f} samples/s "
                          f"(runs: {', '.join(f'{v:.0f}' for v in runs[label])})", flush=True)
                rows.append(row)
    labels = [w[0] for w in ways]
    header = ["model", "engine", "global batch", *[f"{w} (samples/s)" for w in labels]]
    if args.procs > 1:
        header += [f"{labels[-1]} / {w}" for w in labels[:-1]]
    header.append(f"{labels[-1]} vs backprop")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        base = next(r for r in rows if r["model"] == row["model"] and r["engine"] == "backprop")
        cells = [row["model"], row["engine"], str(row["global batch"]), *[f"{row[w]:.0f}" for w in labels]]
        if args.procs > 1:
            cells += [f"{row[labels[-1]] / row[w]:.2f}" for w in labels[:-1]]
        cells.append(f"{row[labels[-1]] / base[labels[-1]]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    machine = machine_description(torch.device(args.device)).replace(f"{torch.get_num_threads()} threads",
                                                                     f"{cores} cores")
    command = "python scripts/benchmarks/dist_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = f"Machine: {machine}\n\nCommand: `{command.strip()}`\n\n" + "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dist_bench.md").write_text(text)
    (out / "dist_bench.json").write_text(json.dumps({"machine": machine, "command": command, "rows": rows}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
