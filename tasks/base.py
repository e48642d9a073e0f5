"""The data containers every task returns: :class:`Split` and :class:`Task`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["Split", "Task", "cross_entropy_loss", "accuracy"]


def cross_entropy_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``(B, C)`` logits against ``(B,)`` class labels.

    A module-level function (not a lambda) so that a :class:`Task` pickles.
    """
    return F.cross_entropy(outputs, targets, reduction="mean")


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Batch mean accuracy of ``(B, C)`` logits, as a 0-dim float tensor."""
    return (outputs.argmax(dim=-1) == targets).to(torch.float32).mean()


@dataclass
class Split:
    """One split of a data set: ``inputs`` ``(N, *input_shape)`` float32, ``targets`` ``(N,)`` int64."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if self.inputs.dtype != torch.float32:
            raise ValueError(f"Split inputs must be float32, got {self.inputs.dtype}")
        if self.targets.dtype != torch.int64:
            raise ValueError(f"Split targets must be int64, got {self.targets.dtype}")
        if self.targets.dim() != 1 or self.inputs.shape[0] != self.targets.shape[0]:
            raise ValueError(
                f"Split needs inputs (N, ...) and targets (N,), got {tuple(self.inputs.shape)} "
                f"and {tuple(self.targets.shape)}"
            )

    def __len__(self) -> int:
        return int(self.targets.shape[0])


@dataclass
class Task:
    """A classification task: three splits, the per-sample input shape, loss and metric."""

    name: str
    train: Split
    val: Split
    test: Split
    input_shape: tuple[int, ...]
    num_outputs: int
    metric_name: str = "accuracy"
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=cross_entropy_loss)

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(d) for d in self.input_shape)
        if self.metric_name != "accuracy":
            raise ValueError(f"unsupported metric '{self.metric_name}'; only 'accuracy' exists")
        for split_name in ("train", "val", "test"):
            split = getattr(self, split_name)
            if tuple(split.inputs.shape[1:]) != self.input_shape:
                raise ValueError(
                    f"task '{self.name}': {split_name} inputs have sample shape "
                    f"{tuple(split.inputs.shape[1:])}, expected {self.input_shape}"
                )

    def metric(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Batch mean accuracy of ``outputs`` (logits) against ``targets``, a 0-dim tensor."""
        return accuracy(outputs, targets)

    @property
    def in_features(self) -> int:
        """Number of input features per sample (product of ``input_shape``)."""
        return math.prod(self.input_shape)
