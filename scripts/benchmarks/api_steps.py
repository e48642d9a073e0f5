"""The README's Python API example (Trainer, backprop, orthogonal tanh MLP depth 8 width 64, digits, 10
epochs) as one timed process: prints its steps/s and the threads torch used (BENCHMARKS.md "The Python API
on a busy machine"). Runs in a fresh process: the API chooses its threads on its first call.

    python scripts/benchmarks/api_steps.py LOGDIR
"""

import sys
import time

import torch

from gradengines import models, tasks, trainers


def main(logdir: str) -> None:
    task = tasks.build("digits")
    model = models.build("mlp", in_features=task.in_features, out_features=task.num_outputs,
                         depth=8, width=64, activation="tanh", orthogonal="bjorck")
    trainer = trainers.Trainer(model, trainers.build_engine("backprop"), task, logdir=logdir, lr=1e-3,
                               progress=False)
    start = time.perf_counter()
    trainer.fit(epochs=10)
    print(f"{trainer.step / (time.perf_counter() - start):.1f} steps/s, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main(sys.argv[1])
