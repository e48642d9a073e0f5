"""Adam on digits with the adaptive Björck projection against Adam with three fixed Björck iterations, at equal
compute time (issue 32): the two runs' steps interleaved (one step of each in turn, each timed), validation
accuracy every --eval-every steps against the cumulative time of the steps; a figure, a JSON and a Markdown line.

    python scripts/benchmarks/upkeep_adam_curve.py --width 128 --steps 1000 --out bench_out/adam_curve_128
    python scripts/benchmarks/upkeep_adam_curve.py --width 1024 --steps 100 --eval-every 10 \
        --out bench_out/adam_curve_1024
"""

import argparse
import json
import time
from pathlib import Path

import torch

from gradengines import tasks, trainers
from gradengines.trainers.bench.timing import engine_from_spec
from gradengines.trainers.bench.upkeep import UpkeepCandidate

CANDIDATES = ("Björck x3", "Björck adaptive")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--out", default="bench_out/adam_curve")
    args = parser.parse_args()
    trainers.set_threads("auto")
    digits = tasks.build("digits")  # its training split for the steps, its validation split for the curve
    train, val = digits.train, digits.val
    engine = engine_from_spec("backprop")
    runs = {name: UpkeepCandidate(name, "adam", depth=args.depth, width=args.width, in_features=64, device="cpu")
            for name in CANDIDATES}
    curves = {name: [] for name in CANDIDATES}
    clock = dict.fromkeys(CANDIDATES, 0.0)
    worst = dict.fromkeys(CANDIDATES, 0.0)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, len(train.targets), (args.batch_size,), generator=gen)
        for name, run in runs.items():  # the same batch for both, one step of each in turn
            start = time.perf_counter()
            run.step(engine, train.inputs[idx], train.targets[idx])
            clock[name] += time.perf_counter() - start
            worst[name] = max(worst[name], run.error())
            if step % args.eval_every == 0 or step == args.steps:
                with torch.no_grad():
                    acc = (run.model(val.inputs).argmax(-1) == val.targets).float().mean().item()
                curves[name].append((step, clock[name], acc))
    horizon = min(clock.values())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {name: {"seconds": clock[name], "max_orthogonality_error": worst[name],
                      "best_val_within_horizon": max(a for _, t, a in curves[name] if t <= horizon + 1e-12),
                      "curve": curves[name]} for name in CANDIDATES}
    (out / "curve.json").write_text(json.dumps({"args": vars(args), "horizon_s": horizon, "runs": summary},
                                               indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in CANDIDATES:
        ax.plot([t for _, t, _ in curves[name]], [a for _, _, a in curves[name]], marker=".", label=name)
    ax.axvline(horizon, color="grey", linestyle=":", label="equal-time horizon")
    ax.set_xlabel("training-step time (s)")
    ax.set_ylabel("validation accuracy")
    ax.set_title(f"Adam lr 1e-3, depth {args.depth}, width {args.width}, digits")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    for name in CANDIDATES:
        s = summary[name]
        print(f"| {args.width} | {name} | {args.steps} | {s['seconds']:.2f} | {s['best_val_within_horizon']:.4f} | "
              f"{s['max_orthogonality_error']:.2g} |")


if __name__ == "__main__":
    main()
