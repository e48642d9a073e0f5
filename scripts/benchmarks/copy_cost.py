"""What the caller's-data copies cost (issue 47): one ``compute_grads`` step with the copies made (``own_copy`` at
the engine's entry and in every ``call_model``) against the same step with them turned off, round-robin in one
process, medians of the per-round ratio. The worst cases are large inputs through small models.

    python scripts/benchmarks/copy_cost.py [--rounds 30] [--threads 1]

Prints a Markdown table: case, engine, batch bytes, median step with and without the copies (ms), the median
of the per-round ratios and its spread (min-max over rounds).
"""

import argparse
import statistics
import time

import torch

from gradengines import models, tasks, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy

COPIERS = (models.adapters.calling, trainers.core.engine)


def _cases():
    torch.manual_seed(0)
    digits = tasks.build("digits")
    x, y = digits.train.take(slice(0, 64))
    yield "mlp depth 4 width 64, digits 64 x 64", "backprop", models.build(
        "mlp", in_features=64, out_features=10, depth=4, width=64, activation="tanh"), x, y, cross_entropy_loss
    images, labels = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 10))
    yield "Flatten-Linear 3072-32-10, 64 images 3 x 32 x 32", "backprop", mlp, images, labels, cross_entropy_loss
    yield "Flatten-Linear 3072-32-10, 64 images 3 x 32 x 32", "fa", models.layer_stack(mlp), images, labels, \
        cross_entropy_loss
    resnet = models.build("resnet", in_features=3 * 32 * 32, out_features=10, depth=8, width=16,
                          in_shape=(3, 32, 32))
    yield "zoo resnet depth 8 width 16, 64 images 3 x 32 x 32", "backprop", resnet, images, labels, cross_entropy_loss
    yield "zoo resnet depth 8 width 16, 64 images 3 x 32 x 32", "highway", resnet, images, labels, cross_entropy_loss
    tokens = torch.randint(0, 64, (16, 32))
    gpt = models.build("gpt", in_features=32, out_features=64, depth=2, width=32, heads=2)
    yield "zoo gpt 2 layers width 32, 16 x 32 tokens", "backprop", gpt, tokens, torch.roll(tokens, -1, 1), \
        sequence_cross_entropy


def _copies(on: bool) -> None:
    for module in COPIERS:
        module.own_copy = _REAL if on else (lambda value: value)


_REAL = models.adapters.calling.own_copy


def _step(engine, model, x, y, loss_fn) -> float:
    start = time.perf_counter()
    engine.compute_grads(model, x, y, loss_fn)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    trainers.set_threads(args.threads)
    print("| case | engine | batch | with copies (ms) | without (ms) | ratio, median of rounds (min-max) |")
    print("|---|---|---|---|---|---|")
    for case, name, model, x, y, loss_fn in _cases():
        engine = trainers.build_engine(name)
        for _ in range(3):  # warm-up: the self-check, allocator
            _step(engine, model, x, y, loss_fn)
        with_copies, without, ratios = [], [], []
        for _ in range(args.rounds):
            _copies(True)
            a = _step(engine, model, x, y, loss_fn)
            _copies(False)
            b = _step(engine, model, x, y, loss_fn)
            with_copies.append(a)
            without.append(b)
            ratios.append(a / b)
        _copies(True)
        size = x.numel() * x.element_size() + y.numel() * y.element_size()
        print(f"| {case} | {name} | {size / 1024:.0f} KiB | {statistics.median(with_copies) * 1e3:.2f} | "
              f"{statistics.median(without) * 1e3:.2f} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
