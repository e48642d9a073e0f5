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
from typing import Any, Callable

import torch
import torch.nn.functional as F

from gradengines.tasks.errors import TaskConfigError

__all__ = [
    "DataSplit",
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


def per_example(metric_name: str, loss_fn, outputs: torch.Tensor, targets: torch.Tensor):
    """Each example's share of a split's metric, ``(values, counts)`` of shape ``(B,)``: its correct counted
    targets (accuracy) or its summed token cross-entropy (perplexity: ``exp(sum values / sum counts)``), and its
    counted targets; what a paired comparison over examples reads. None where the loss is not the cross-entropy
    of logits whose last dimension is the classes (a perplexity of another loss has no per-example share)."""
    counted = targets != IGNORE_INDEX
    rows = targets.shape[0]
    if metric_name == "accuracy":
        hits = (outputs.argmax(dim=-1) == targets) & counted
        return hits.reshape(rows, -1).sum(1).double(), counted.reshape(rows, -1).sum(1).double()
    if loss_fn not in (cross_entropy_loss, sequence_cross_entropy) or outputs.shape[:-1] != targets.shape:
        return None
    nll = F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]).double(), targets.reshape(-1),
                          ignore_index=IGNORE_INDEX, reduction="none")
    return nll.reshape(rows, -1).sum(1), counted.reshape(rows, -1).sum(1).double()


def label_range(targets: torch.Tensor) -> tuple[int, int] | None:
    """(smallest, largest) counted target (``IGNORE_INDEX`` skipped), None when none is counted."""
    counted = targets[targets != IGNORE_INDEX]
    return (int(counted.min()), int(counted.max())) if counted.numel() else None


def split_fingerprint(train: DataSplit, val: DataSplit, test: DataSplit) -> str:
    """A short hash of which samples are in which split, in which order (each split's ``fingerprint_into``: for
    tensors, the targets of the three splits and the first training inputs): another ``--split-seed`` or other
    data files give another fingerprint."""
    digest = hashlib.sha1()
    for split in (train, val, test):
        split.fingerprint_into(digest, inputs=False)
    train.fingerprint_into(digest, inputs=True)
    return digest.hexdigest()[:16]


class DataSplit:
    """What the Trainer reads of a split, whatever holds the data (tensors, a ``torch.utils.data.Dataset``, a
    memory-mapped token file).

    ``order(generator)`` gives the keys of one training epoch, in a random order drawn from ``generator`` alone
    (so a run is a function of its seed, and a resumed run finds its place from the step); ``order()`` the fixed
    keys of an evaluation. ``len(split)`` is how many keys an epoch has. ``take(keys)`` returns
    ``(inputs, targets)`` of those keys as fresh tensors (never views: code that runs a model in place must not
    reach the data); ``take(slice)`` takes positions of ``order()``. Subclasses give ``__len__``, ``_take`` and
    ``targets``, and override the rest where they know better.
    """

    #: True for a stream read in its own order (``tasks.stream.StreamSplit``), not by keys.
    streamed = False

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def size(self) -> int | None:
        """How many samples the split holds; None for a stream without a length."""
        return len(self)

    def _take(self, keys: torch.Tensor) -> tuple[Any, torch.Tensor]:
        raise NotImplementedError

    def order(self, generator: torch.Generator | None = None) -> Any:
        """Keys of an epoch: a permutation of ``range(len)`` drawn from ``generator``, or in order when None.
        The result is sliced (``order[a:b]``, a tensor of keys)."""
        if generator is None:
            return torch.arange(len(self))
        return torch.randperm(len(self), generator=generator)

    def take(self, keys: slice | torch.Tensor) -> tuple[Any, torch.Tensor]:
        """``(inputs, targets)`` of ``keys`` (a tensor of keys, or a slice of ``order()``), as fresh tensors: code
        that runs a model is never handed a view of a split, so nothing it writes in place reaches the data."""
        return self._take(self.order()[keys] if isinstance(keys, slice) else keys)

    #: Every target of the split, one row per key of ``order()`` (an attribute or a property of the subclass;
    #: a split that cannot hold them overrides ``label_range``, ``counted`` and ``fingerprint_into`` instead).
    targets: torch.Tensor

    def label_range(self) -> tuple[int, int] | None:
        """(smallest, largest) counted target (``IGNORE_INDEX`` skipped), None when none is counted; read by the
        Task's check that every label is one of the model's outputs."""
        return label_range(self.targets)

    def largest_input(self) -> int | None:
        """The largest input token id (the vocabulary a model's embedding needs), None for float features."""
        found = []
        for start in range(0, len(self), 4096):
            inputs = self.take(slice(start, start + 4096))[0]
            ids = [t for t in (inputs.values() if isinstance(inputs, dict) else (inputs,))  # named inputs: the ids
                   if not t.is_floating_point()]
            if not ids:
                return None
            found.append(max(int(t.max()) for t in ids))
        return max(found) if found else None

    def counted(self, keys: torch.Tensor | None = None) -> int:
        """How many targets (tokens other than ``IGNORE_INDEX``, or examples) the keys (all when None) hold."""
        targets = self.targets if keys is None else self.targets[keys]
        return int((targets != IGNORE_INDEX).sum())

    def fingerprint_into(self, digest: Any, inputs: bool) -> None:
        """Feed the split's identity to ``digest`` (``split_fingerprint``): all its targets, or with ``inputs``
        its first 64 inputs."""
        if not inputs:
            digest.update(self.targets.contiguous().numpy().tobytes())
            return
        x = self.take(slice(0, 64))[0]
        for tensor in (x.values() if isinstance(x, dict) else (x,)):
            digest.update(tensor.contiguous().numpy().tobytes())


@dataclass
class Split(DataSplit):
    """One split of a data set, held in tensors.

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

    def _take(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[keys], self.targets[keys]  # indexing by a tensor copies

    def largest_input(self) -> int | None:
        return None if self.inputs.is_floating_point() else int(self.inputs.max())


@dataclass
class Task:
    """A task: three splits, the per-sample input and output shapes, loss and metric.

    ``output_shape`` is the per-sample model output shape (default ``(num_outputs,)``,
    a classifier); sequence tasks give e.g. ``(T, V)``. ``metric_name`` is "accuracy"
    or "perplexity" (``exp`` of the mean loss). ``vocab`` lists the token of each id
    for text tasks (None otherwise).
    """

    name: str
    train: DataSplit
    val: DataSplit
    test: DataSplit
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
            if split.size == 0:
                raise TaskConfigError(
                    f"task '{self.name}': the {split_name} split is empty; training needs samples, model selection "
                    f"a validation split and the report a test split (check the task's split options)")
            self.check_targets(split_name, split.label_range())
            x, targets = split.take(slice(0, 2))
            first = next(iter(x.values())) if isinstance(x, dict) else x  # dict inputs: the first entry's shape
            if tuple(first.shape[1:]) != self.input_shape:
                raise TaskConfigError(
                    f"task '{self.name}': {split_name} inputs have sample shape "
                    f"{tuple(first.shape[1:])}, expected {self.input_shape}"
                )
            # targets (N, T) go with outputs (T, ...): T must agree
            if targets.dim() == 2 and tuple(targets.shape[1:]) != self.expected_output_shape[:1]:
                raise TaskConfigError(
                    f"task '{self.name}': {split_name} targets have sample shape {tuple(targets.shape[1:])}, "
                    f"which does not match the output shape {self.expected_output_shape}"
                )
        self.fingerprint = split_fingerprint(self.train, self.val, self.test)

    def check_targets(self, split_name: str, bounds: tuple[int, int] | None, where: str = "") -> None:
        """Class labels in [0, classes) and token targets in [0, vocabulary), or ``IGNORE_INDEX``; ``bounds`` the
        (smallest, largest) counted target of a split (``label_range``) or of a batch: a label out of range
        would otherwise fail inside torch's loss mid-training."""
        classes = self.expected_output_shape[-1]
        if bounds is not None and (bounds[0] < 0 or bounds[1] >= classes):
            bad = bounds[0] if bounds[0] < 0 else bounds[1]
            raise TaskConfigError(
                f"task '{self.name}': the {split_name} split has label {bad}{where}, outside [0, {classes}) of the "
                f"task's {classes} outputs")

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
