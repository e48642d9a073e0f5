"""The data containers every task returns: :class:`Split` and :class:`Task`.

Classification tasks have ``(N,)`` class targets and per-sample outputs of shape
``(num_outputs,)``; sequence tasks have ``(N, T)`` token targets and per-sample
outputs ``output_shape``, e.g. ``(T, V)`` logits. Target positions equal to
:data:`IGNORE_INDEX` are skipped by both :func:`sequence_cross_entropy` and
:func:`accuracy`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from tasks.errors import TaskConfigError

__all__ = [
    "Split",
    "Task",
    "cross_entropy_loss",
    "sequence_cross_entropy",
    "accuracy",
    "IGNORE_INDEX",
    "METRICS",
]

#: Target value of positions that neither the loss nor the accuracy count (PyTorch's default).
IGNORE_INDEX = -100

#: Metric names a :class:`Task` may have.
METRICS = ("accuracy", "perplexity")


def cross_entropy_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``(B, C)`` logits against ``(B,)`` class labels.

    A module-level function (not a lambda) so that a :class:`Task` pickles.
    """
    return F.cross_entropy(outputs, targets, reduction="mean")


def sequence_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of ``(B, T, V)`` logits against ``(B, T)`` token targets.

    The mean runs over every counted token (positions with target ``IGNORE_INDEX`` are
    skipped); a module-level function so that a :class:`Task` pickles.
    """
    if outputs.dim() != 3 or targets.shape != outputs.shape[:2]:
        raise ValueError(
            f"sequence_cross_entropy needs outputs (B, T, V) and targets (B, T), got "
            f"{tuple(outputs.shape)} and {tuple(targets.shape)}"
        )
    return F.cross_entropy(
        outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="mean"
    )


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean accuracy of ``(B, C)`` logits vs ``(B,)`` labels, or ``(B, T, V)`` vs ``(B, T)`` (mean over tokens).

    Positions whose target is ``IGNORE_INDEX`` are not counted; a 0-dim float64 tensor
    (0 when nothing is counted).
    """
    counted = targets != IGNORE_INDEX
    hits = (outputs.argmax(dim=-1) == targets) & counted
    return hits.sum().double() / counted.sum().clamp_min(1).double()


def split_fingerprint(train: Split, val: Split, test: Split) -> str:
    """A short hash of which samples are in which split, in which order (the targets of the three splits and the
    first training inputs): another ``--split-seed`` or other data files give another fingerprint."""
    digest = hashlib.sha1()
    for split in (train, val, test):
        digest.update(split.targets.contiguous().numpy().tobytes())
    digest.update(train.inputs[:64].contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass
class Split:
    """One split of a data set.

    ``inputs`` ``(N, *input_shape)``: float32 features or int64 token ids;
    ``targets`` int64, ``(N,)`` class labels or ``(N, T)`` token targets.
    """

    inputs: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if self.inputs.dtype not in (torch.float32, torch.int64):
            raise ValueError(
                f"Split inputs must be float32 (features) or int64 (token ids), got {self.inputs.dtype}"
            )
        if self.targets.dtype != torch.int64:
            raise ValueError(f"Split targets must be int64, got {self.targets.dtype}")
        if self.inputs.dim() < 1 or self.targets.dim() not in (1, 2) or self.inputs.shape[0] != self.targets.shape[0]:
            raise ValueError(
                f"Split needs inputs (N, ...) and targets (N,) or (N, T), got {tuple(self.inputs.shape)} "
                f"and {tuple(self.targets.shape)}"
            )

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def take(self, rows: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of the samples at ``rows`` (a slice or an index tensor), as copies: code that runs
        a model is never handed a view of a split, so nothing it writes in place reaches the data."""
        if isinstance(rows, slice):
            rows = torch.arange(len(self))[rows]
        return self.inputs[rows], self.targets[rows]  # indexing by a tensor copies


@dataclass
class Task:
    """A task: three splits, the per-sample input and output shapes, loss and metric.

    ``output_shape`` is the per-sample model output shape (default ``(num_outputs,)``,
    a classifier); sequence tasks give e.g. ``(T, V)``. ``metric_name`` is "accuracy"
    or "perplexity" (``exp`` of the mean loss). ``vocab`` lists the token of each id
    for text tasks (None otherwise).
    """

    name: str
    train: Split
    val: Split
    test: Split
    input_shape: tuple[int, ...]
    num_outputs: int
    metric_name: str = "accuracy"
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default=cross_entropy_loss)
    output_shape: tuple[int, ...] | None = None
    vocab: tuple[str, ...] | None = None
    fingerprint: str = field(init=False, repr=False, compare=False)
    """Which samples are in which split, in which order (``split_fingerprint``), read when the task is made:
    before any code runs a model on its data."""

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(d) for d in self.input_shape)
        if self.output_shape is not None:
            self.output_shape = tuple(int(d) for d in self.output_shape)
        if self.vocab is not None:
            self.vocab = tuple(self.vocab)
        if self.metric_name not in METRICS:
            raise ValueError(f"unsupported metric '{self.metric_name}'; available: {', '.join(METRICS)}")
        for split_name in ("train", "val", "test"):
            split = getattr(self, split_name)
            if len(split) == 0:
                raise TaskConfigError(
                    f"task '{self.name}': the {split_name} split is empty; training needs samples, model selection "
                    f"a validation split and the report a test split (check the task's split options)")
            self._check_labels(split_name, split)
            if tuple(split.inputs.shape[1:]) != self.input_shape:
                raise ValueError(
                    f"task '{self.name}': {split_name} inputs have sample shape "
                    f"{tuple(split.inputs.shape[1:])}, expected {self.input_shape}"
                )
            # targets (N, T) go with outputs (T, ...): T must agree
            if split.targets.dim() == 2 and tuple(split.targets.shape[1:]) != self.expected_output_shape[:1]:
                raise ValueError(
                    f"task '{self.name}': {split_name} targets have sample shape {tuple(split.targets.shape[1:])}, "
                    f"which does not match the output shape {self.expected_output_shape}"
                )
        self.fingerprint = split_fingerprint(self.train, self.val, self.test)

    def _check_labels(self, split_name: str, split: Split) -> None:
        """Class labels in [0, classes) and token targets in [0, vocabulary), or ``IGNORE_INDEX``: a label out
        of range would otherwise fail inside torch's loss mid-training."""
        classes = self.expected_output_shape[-1]
        counted = split.targets[split.targets != IGNORE_INDEX]
        if counted.numel() and (int(counted.min()) < 0 or int(counted.max()) >= classes):
            bad = int(counted.min()) if int(counted.min()) < 0 else int(counted.max())
            raise TaskConfigError(
                f"task '{self.name}': the {split_name} split has label {bad}, outside [0, {classes}) of the task's "
                f"{classes} outputs")

    @property
    def expected_output_shape(self) -> tuple[int, ...]:
        """Per-sample model output shape: ``output_shape`` if given, else ``(num_outputs,)``."""
        return self.output_shape if self.output_shape is not None else (int(self.num_outputs),)

    def metric(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Batch metric of ``outputs`` (logits) against ``targets``, a 0-dim tensor.

        Accuracy (mean over samples, or over counted tokens), or perplexity ``exp(loss)``.
        """
        if self.metric_name == "perplexity":
            return torch.exp(self.loss_fn(outputs, targets).detach().clamp_max(50.0))
        return accuracy(outputs, targets)

    @property
    def in_features(self) -> int:
        """Number of input features per sample (product of ``input_shape``)."""
        return math.prod(self.input_shape)
