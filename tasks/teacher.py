"""``teacher``: Gaussian inputs labelled by the argmax of a random 2-layer tanh teacher MLP."""

from __future__ import annotations

import math

import torch

from .base import Split, Task
from .errors import TaskConfigError
from .registry import check_int, register_task
from .splits import generator

__all__ = ["build_teacher", "teacher_labels"]


def teacher_labels(x: torch.Tensor, w1, b1, w2, b2) -> torch.Tensor:
    """Class labels ``argmax(tanh(x @ w1 + b1) @ w2 + b2)``."""
    return (torch.tanh(x @ w1 + b1) @ w2 + b2).argmax(dim=1)


@register_task("teacher")
def build_teacher(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    in_features: int = 32,
    num_classes: int = 10,
    n_train: int = 2048,
    n_val: int = 512,
    n_test: int = 512,
    hidden: int = 64,
) -> Task:
    """Synthetic task, deterministic given ``seed``.

    Teacher weights are N(0, 1/fan_in); the output bias centres each class logit over
    the drawn inputs so that classes are roughly balanced. Every class must occur in
    the train split (else ``TaskConfigError``). ``data_dir`` and ``download`` are unused.
    """
    name = "teacher"
    check_int(name, "in_features", in_features, 1)
    check_int(name, "num_classes", num_classes, 2)
    check_int(name, "hidden", hidden, 1)
    check_int(name, "n_train", n_train, num_classes)
    check_int(name, "n_val", n_val, 0)
    check_int(name, "n_test", n_test, 0)

    gen = generator(seed)
    w1 = torch.randn(in_features, hidden, generator=gen) / math.sqrt(in_features)
    b1 = 0.1 * torch.randn(hidden, generator=gen)
    w2 = torch.randn(hidden, num_classes, generator=gen) / math.sqrt(hidden)
    n = n_train + n_val + n_test
    x = torch.randn(n, in_features, generator=gen)
    b2 = -(torch.tanh(x @ w1 + b1) @ w2).mean(dim=0)
    y = teacher_labels(x, w1, b1, w2, b2)

    counts = torch.bincount(y[:n_train], minlength=num_classes)
    if (counts == 0).any():
        missing = torch.nonzero(counts == 0).flatten().tolist()
        raise TaskConfigError(
            f"task 'teacher': classes {missing} never occur in the {n_train} train samples of seed {seed}; "
            f"use more n_train, fewer num_classes or another seed"
        )

    bounds = [0, n_train, n_train + n_val, n]
    splits = [Split(x[a:b].clone(), y[a:b].clone()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return Task(
        name=name,
        train=splits[0],
        val=splits[1],
        test=splits[2],
        input_shape=(in_features,),
        num_outputs=num_classes,
    )
