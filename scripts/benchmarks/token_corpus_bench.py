"""The memory-mapped token corpus (issue 48): resident memory at 1x and 10x the file size, and training steps/s
against the same windows held in memory (``ptb-word``), same model and batch.

    python scripts/benchmarks/token_corpus_bench.py --ptb ../shared/data/ptb --out bench_out/tokens \
        [--sizes 10000000,100000000]

Steps/s: one process holds two Trainers on the PTB words, ``ptb-word`` (tensors) and ``tokens`` (the same ids
written by ``scripts/token_file.py``, read through the memory map), each with the zoo's GPT (``--depth`` blocks,
same initial weights), batch ``--batch-size``, backprop; round-robin over ``--rounds`` rounds of ``--steps``
iterations each (the Trainer's own batch draw and update), the ratio of the two times per round, its median.
Memory: for random corpora of each ``--sizes`` (vocabulary 10,000, uint16; val.bin 100,000 ids at every size),
a fresh process per case trains ``--steps`` x ``--rounds`` steps and reads its resident memory (VmRSS) after
training and its peak (VmHWM) from /proc. Prints Markdown tables and writes them with the raw rows to ``--out``.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _trainer(task_name: str, data_dir: str, depth: int, batch_size: int):
    import torch

    from gradengines import models, tasks, trainers

    task = tasks.build(task_name, data_dir=data_dir)
    torch.manual_seed(0)
    model = models.build("gpt", in_features=task.in_features, out_features=task.num_outputs, depth=depth,
                         vocab_size=task.num_outputs)
    return trainers.Trainer(model, trainers.build_engine("backprop"), task, batch_size=batch_size,
                            eval_every=10 ** 9, eval_batches=1, eval_batch_size=64, evaluate_test=False,
                            progress=False)


def memory_case(data_dir: str, steps: int, depth: int, batch_size: int) -> dict:
    """Train ``steps`` steps on the token files of ``data_dir`` in this process; its resident memory from /proc."""
    rss_start = _status_mb("VmRSS")
    trainer = _trainer("tokens", data_dir, depth, batch_size)
    rss_task = _status_mb("VmRSS")
    trainer.fit(steps=steps)
    return {"data_dir": data_dir, "train_tokens": (trainer.task.train.end - trainer.task.train.begin),
            "rss_start_mb": rss_start, "rss_task_mb": rss_task, "rss_after_mb": _status_mb("VmRSS"),
            "peak_mb": _status_mb("VmHWM"), "step_ms": 1000 * statistics.median(trainer.step_times[2:])}


def timing_case(ptb: str, token_dir: str, steps: int, rounds: int, depth: int, batch_size: int) -> dict:
    """Round-robin: ``steps`` iterations of each Trainer per round (module docstring)."""
    runs = {"ptb-word": _trainer("ptb-word", ptb, depth, batch_size),
            "tokens": _trainer("tokens", token_dir, depth, batch_size)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds + 1):  # the first round warms up
        for name, trainer in runs.items():
            start = time.perf_counter()
            for _ in range(steps):
                x, y = trainer._batch(trainer.step)
                trainer.train_step(x, y)
                trainer.step += 1
            times[name].append((time.perf_counter() - start) / steps)
    ratios = [m / f for m, f in zip(times["ptb-word"][1:], times["tokens"][1:], strict=True)]
    return {"ms_per_step": {k: [1000 * t for t in v[1:]] for k, v in times.items()}, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ptb", default="../shared/data/ptb", help="folder of the PTB text files")
    parser.add_argument("--out", default="bench_out/tokens", help="folder of the corpora and results")
    parser.add_argument("--sizes", default="10000000,100000000", help="random corpus sizes in tokens")
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = dict(steps=args.steps, depth=args.depth, batch_size=args.batch_size)
    if args.case == "timing":
        print(json.dumps(timing_case(args.ptb, str(Path(args.out) / "ptb"), rounds=args.rounds, **sizes)))
        return
    if args.case:
        print(json.dumps(memory_case(args.case, **{**sizes, "steps": args.steps * args.rounds})))
        return
    out = Path(args.out)
    writer = [sys.executable, str(ROOT / "scripts" / "token_file.py")]
    if not (out / "ptb" / "meta.json").is_file():
        subprocess.run([*writer, "--train", f"{args.ptb}/ptb.train.txt", "--val", f"{args.ptb}/ptb.valid.txt",
                        "--test", f"{args.ptb}/ptb.test.txt", "--out", str(out / "ptb")], check=True)
    folders = []
    for size in (int(s) for s in args.sizes.split(",")):
        folders.append(out / f"random-{size}")
        if not (folders[-1] / "meta.json").is_file():
            subprocess.run([*writer, "--random", str(size), "--vocab-size", "10000", "--out", str(folders[-1])],
                           check=True)
    started = time.time()
    flags = ["--ptb", args.ptb, "--out", args.out, "--steps", str(args.steps), "--rounds", str(args.rounds),
             "--depth", str(args.depth), "--batch-size", str(args.batch_size)]

    def case(name: str) -> dict:
        done = subprocess.run([sys.executable, __file__, *flags, "--case", name], check=True, capture_output=True,
                              text=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    timing = case("timing")
    memory = [case(str(folder)) for folder in folders]
    ratios = sorted(timing["ratios"])
    per_step = {k: statistics.median(v) for k, v in timing["ms_per_step"].items()}
    lines = [f"GPT depth {args.depth}, batch {args.batch_size}, backprop; {args.rounds} rounds of {args.steps} steps",
             "", "| data | ms per step (median of rounds) | steps/s, memory map / in memory (median of rounds, "
             "min-max) |", "|---|---|---|",
             f"| ptb-word, tensors in memory | {per_step['ptb-word']:.1f} | 1 |",
             f"| tokens, the same ids in a uint16 file | {per_step['tokens']:.1f} | "
             f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}) |", "",
             "| random corpus | train.bin MB | RSS after the task is made MB | RSS after training MB | peak RSS MB |",
             "|---|---|---|---|---|"]
    for row in memory:
        megabytes = (Path(row["data_dir"]) / "train.bin").stat().st_size / 2 ** 20
        lines.append(f"| {row['train_tokens']:,} tokens | {megabytes:.0f} | {row['rss_task_mb']:.0f} | "
                     f"{row['rss_after_mb']:.0f} | {row['peak_mb']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"timing": timing, "memory": memory,
                                                "wall_s": time.time() - started}, indent=1))
    (out / "bench.md").write_text(text)


if __name__ == "__main__":
    main()
