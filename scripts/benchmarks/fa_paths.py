"""FA and DFA on a layer stack: the stack pass against the layer path (every weight layer's backward swapped),
compute_grads alone, on the zoo's convnet and mlp (depth 4, width 256), digits batch 64, one thread; all
five engines interleaved for 200 rounds; medians of the times and of the per-round ratios to backprop
(BENCHMARKS.md "Models from transformers and timm").

    python scripts/benchmarks/fa_paths.py
"""

import statistics
import time

import torch

from gradengines import models, tasks, trainers

LAYERS = {"path": "layers"}
ENGINES = {"backprop": {}, "fa": {}, "fa:path=layers": LAYERS, "dfa": {}, "dfa:path=layers": LAYERS}


def main(rounds: int = 200, warmup: int = 5) -> None:
    torch.set_num_threads(1)
    task = tasks.build("digits")
    x, y = task.train.inputs[:64], task.train.targets[:64]
    for name, sizes in (("convnet", {}), ("mlp", {"depth": 4, "width": 256})):
        torch.manual_seed(0)
        model = models.build(name, in_features=64, out_features=10, **sizes)
        engines = {k: trainers.build_engine(k.split(":")[0], **options) for k, options in ENGINES.items()}
        times: dict[str, list[float]] = {k: [] for k in engines}
        for engine in engines.values():
            for _ in range(warmup):
                engine.compute_grads(model, x, y, task.loss_fn)
        for _ in range(rounds):
            for key, engine in engines.items():
                start = time.perf_counter()
                engine.compute_grads(model, x, y, task.loss_fn)
                times[key].append(time.perf_counter() - start)
        for key, values in times.items():
            ratio = statistics.median(a / b for a, b in zip(values, times["backprop"], strict=True))
            print(f"{name:8s} {key:16s} {1000 * statistics.median(values):7.3f} ms  ratio to backprop {ratio:.3f}")


if __name__ == "__main__":
    main()
