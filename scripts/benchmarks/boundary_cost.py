"""What the fault boundary around a user's dataset costs: each row read through ``DatasetSplit._item`` (one try
block, the user's error made one line) against the dataset's own ``__getitem__``, interleaved rounds, medians.

    .venv/bin/python scripts/benchmarks/boundary_cost.py            # a TensorDataset of digits-sized rows
"""

import statistics
import time

import torch
from torch.utils.data import TensorDataset

from gradengines.tasks.datasets import DatasetSplit


def main(rows: int = 20000, rounds: int = 15) -> None:
    data = TensorDataset(torch.randn(rows, 64), torch.randint(0, 10, (rows,)))
    split = DatasetSplit(data, name="train")
    direct, bounded = [], []
    for _ in range(rounds):  # interleaved: a busy machine slows both alike
        start = time.perf_counter()
        for i in range(rows):
            data[i]
        direct.append((time.perf_counter() - start) / rows)
        start = time.perf_counter()
        for i in range(rows):
            split._item(i)
        bounded.append((time.perf_counter() - start) / rows)
    d, b = statistics.median(direct), statistics.median(bounded)
    print(f"| rows | dataset[i] (us/row) | through the boundary (us/row) | ratio |\n|---|---|---|---|\n"
          f"| {rows} x {rounds} rounds | {d * 1e6:.2f} | {b * 1e6:.2f} | {b / d:.3f} |")


if __name__ == "__main__":
    main()
