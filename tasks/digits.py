"""``digits``: scikit-learn's bundled 8x8 handwritten digits (offline, 1797 samples).

The rows are read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``: 64 pixel columns in
0..16, then the class) without importing scikit-learn, whose import (with SciPy's) cost about 2 s of every
command's start on the default task; ``load_digits`` reads the same file (the test compares them), and is called
where a scikit-learn keeps it elsewhere.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from .base import Split, Task
from .errors import TaskConfigError
from .registry import register_task
from .splits import stratified_indices

__all__ = ["build_digits", "digits_file", "STD_FLOOR"]

#: Floor on the per-feature train std used for standardization (pixels are in [0, 1]).
STD_FLOOR = 1e-2


def digits_file() -> Path | None:
    """Where the installed scikit-learn keeps the digits, found without importing it (None: not where expected)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise TaskConfigError("task 'digits' reads the digits scikit-learn ships: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


@functools.cache
def _read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 x 64 pixels (0..16) and their classes, read once per process (read-only arrays)."""
    path = digits_file()
    if path is None:
        from sklearn.datasets import load_digits

        pixels, classes = load_digits(return_X_y=True)
    else:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",")
        pixels, classes = table[:, :-1], table[:, -1]
    pixels, classes = np.array(pixels, dtype=np.float64), np.array(classes, dtype=np.int64)
    pixels.flags.writeable = classes.flags.writeable = False
    return pixels, classes


@register_task("digits")
def build_digits(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    flatten: bool = True,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
) -> Task:
    """Digits /16, standardized with the train split's per-feature mean/std.

    Stratified seeded split, by default 70/10/20 train/val/test. ``data_dir`` and
    ``download`` are accepted for uniformity and unused (the data ships with scikit-learn).
    """
    if not isinstance(flatten, bool):
        raise TaskConfigError(f"task 'digits': flatten must be True or False, got {flatten!r}")
    for option, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise TaskConfigError(f"task 'digits': {option} must be a number in [0, 1), got {value!r}")
    if val_fraction + test_fraction >= 0.9:
        raise TaskConfigError(
            f"task 'digits': val_fraction + test_fraction must be < 0.9, got {val_fraction + test_fraction:g}"
        )

    pixels, classes = _read_digits()
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(classes, dtype=torch.int64)
    train_idx, val_idx, test_idx = stratified_indices(y, (val_fraction, test_fraction), seed)

    mean = x[train_idx].mean(dim=0)
    std = x[train_idx].std(dim=0).clamp_min(STD_FLOOR)
    x = (x - mean) / std

    input_shape = (64,) if flatten else (1, 8, 8)

    def split(idx: torch.Tensor) -> Split:
        return Split(x[idx].reshape(len(idx), *input_shape).contiguous(), y[idx].clone())

    return Task(
        name="digits",
        train=split(train_idx),
        val=split(val_idx),
        test=split(test_idx),
        input_shape=input_shape,
        num_outputs=10,
    )
