"""``digits``: scikit-learn's bundled 8x8 handwritten digits (offline, 1797 samples)."""

from __future__ import annotations

import torch

from .base import Split, Task
from .errors import TaskConfigError
from .registry import register_task
from .splits import stratified_indices

__all__ = ["build_digits", "STD_FLOOR"]

#: Floor on the per-feature train std used for standardization (pixels are in [0, 1]).
STD_FLOOR = 1e-2


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
    from sklearn.datasets import load_digits

    if not isinstance(flatten, bool):
        raise TaskConfigError(f"task 'digits': flatten must be True or False, got {flatten!r}")
    for option, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise TaskConfigError(f"task 'digits': {option} must be a number in [0, 1), got {value!r}")
    if val_fraction + test_fraction >= 0.9:
        raise TaskConfigError(
            f"task 'digits': val_fraction + test_fraction must be < 0.9, got {val_fraction + test_fraction:g}"
        )

    data = load_digits()
    x = torch.as_tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.as_tensor(data.target, dtype=torch.int64)
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
