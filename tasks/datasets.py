"""A Task from the user's own data: any map-style ``torch.utils.data.Dataset`` (or a ``DataLoader`` over one)
for each of train / val / test.

    task = tasks.from_datasets(train_set, val_set, test_set)            # classes read from the labels
    task = tasks.from_datasets(train_set, val_set, test_set, num_outputs=10, collate=my_collate)

An item is ``(input, target)`` (tensors, numbers or numpy arrays; an input may be a dict of them) or a dict
whose ``labels`` (or ``label``, ``target``, ``targets``) entry is the target and whose other entries are the
named inputs, as Hugging Face datasets give them. Items are stacked into a batch (``collate`` is yours where
they differ in shape: padding, say); a batch of named inputs reaches the model by keyword (``model(**inputs)``,
``models.adapters.calling``). Float inputs are float32 (the run's ``--dtype`` applies after), integer inputs
and every target int64.

The Trainer never iterates a loader: it asks for the items of each batch by index (``DatasetSplit.take``),
in an order drawn from the run's seed and epoch. That is what keeps its promises on the user's data as on
its own: the same seed gives the same run, ``--resume`` continues from the step (no replay of the data), and
under torchrun each rank takes its own rows of every global batch. A ``DataLoader`` handed in gives its
dataset and its collate function; one that shuffles (``shuffle=True``, a sampler of its own) is refused, since
an order drawn by the loader cannot be found again on a resume. Its workers are not used.
A streaming ``IterableDataset`` (no index) is refused in one line: it has no position to resume from yet.

When the task is made, every item is read once and its target kept (``DatasetSplit.targets``): the labels are
checked against the outputs before anything is written, and the fingerprint a resume compares is that of the
targets, as for tensors (the same data gives the same fingerprint in either form). A dataset whose items are
slow to make (images decoded from files) pays that pass once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, SequentialSampler

from .base import DataSplit, Task, cross_entropy_loss, sequence_cross_entropy
from .errors import TaskConfigError, one_line

__all__ = ["DatasetSplit", "from_datasets", "TARGET_KEYS"]

#: Keys of a dict item that hold its target (the first present is used).
TARGET_KEYS = ("labels", "label", "targets", "target")


def _tensor(value: Any, where: str) -> torch.Tensor:
    """``value`` (a tensor, number, numpy array or list of numbers) as a tensor: float32 or int64."""
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (int, float, np.ndarray, np.number, list, tuple)) and not isinstance(value, bool):
        try:
            tensor = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError) as err:
            raise TaskConfigError(f"{where} is not numbers ({one_line(err)})") from None
    else:
        raise TaskConfigError(f"{where} is a {type(value).__name__}, not a tensor, a number or an array")
    if tensor.is_floating_point():
        return tensor.to(torch.float32)
    if tensor.is_complex() or tensor.dtype == torch.bool:
        raise TaskConfigError(f"{where} has dtype {tensor.dtype}, not float or integer")
    return tensor.to(torch.int64)


def _split_item(item: Any, where: str) -> tuple[Any, Any]:
    """(input, target) of one item: a pair, or a dict with a target key (module docstring)."""
    if isinstance(item, Mapping):
        key = next((k for k in TARGET_KEYS if k in item), None)
        if key is None:
            raise TaskConfigError(f"{where} is a dict with keys {', '.join(map(str, item))} and no target: name "
                                  f"it one of {', '.join(TARGET_KEYS)}")
        return {k: v for k, v in item.items() if k != key}, item[key]
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    size = f" of {len(item)}" if isinstance(item, (tuple, list)) else ""
    raise TaskConfigError(f"{where} is a {type(item).__name__}{size}, not (input, target) or a dict with a target "
                          f"key ({', '.join(TARGET_KEYS)})")


def _stack(values: list[torch.Tensor], where: str) -> torch.Tensor:
    shapes = {tuple(v.shape) for v in values}
    if len(shapes) > 1:
        raise TaskConfigError(f"{where} differ in shape ({', '.join(map(str, sorted(shapes)[:3]))}"
                              f"{', ...' if len(shapes) > 3 else ''}): give a collate function that pads them "
                              f"(collate=, or the DataLoader's collate_fn)")
    return torch.stack(values)


def stack_items(items: list[Any], where: str = "the data") -> tuple[Any, torch.Tensor]:
    """The default collate: ``(inputs, targets)`` of a list of items, each entry stacked along a new first axis."""
    pairs = [_split_item(item, f"an item of {where}") for item in items]
    inputs = [p[0] for p in pairs]
    targets = _stack([_tensor(p[1], f"a target of {where}") for p in pairs], f"the targets of {where}")
    if isinstance(inputs[0], Mapping):
        keys = list(inputs[0])
        if any(not isinstance(x, Mapping) or list(x) != keys for x in inputs):
            raise TaskConfigError(f"the items of {where} name different inputs: each needs {', '.join(keys)}")
        return {k: _stack([_tensor(x[k], f"input {k!r} of {where}") for x in inputs], f"the inputs {k!r} of {where}")
                for k in keys}, targets
    return _stack([_tensor(x, f"an input of {where}") for x in inputs], f"the inputs of {where}"), targets


class DatasetSplit(DataSplit):
    """A split read from a map-style dataset by index (module docstring); ``collate(items) -> (inputs, targets)``
    (default ``stack_items``)."""

    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any] | None = None, name: str = "split"):
        if isinstance(dataset, DataLoader):
            dataset, collate = _from_loader(dataset, collate, name)
        if isinstance(dataset, IterableDataset):
            raise TaskConfigError(f"the {name} data is an IterableDataset (a stream without an index): a run on it "
                                  f"could not resume from its position; give a map-style Dataset (__getitem__ and "
                                  f"__len__)")
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TaskConfigError(f"the {name} data is a {type(dataset).__name__}, not a Dataset (__getitem__ and "
                                  f"__len__), a DataLoader or a Split")
        self.dataset, self.name = dataset, name
        self.collate = collate
        self._size = len(dataset)
        self._targets: torch.Tensor | None = None

    def __len__(self) -> int:
        return self._size

    @property
    def targets(self) -> torch.Tensor:
        """Every target of the split, read once (the dataset's items pass through once, in chunks, the inputs
        dropped) and kept: the label check, the fingerprint and the counts read it. The same data held as
        tensors (a ``Split``) has the same targets, so the same fingerprint."""
        if self._targets is None:
            self._targets = torch.cat([self._take(torch.arange(start, min(start + 1024, len(self))))[1]
                                       for start in range(0, len(self), 1024)])
        return self._targets

    def _take(self, keys: torch.Tensor) -> tuple[Any, torch.Tensor]:
        items = [self.dataset[int(k)] for k in keys]
        if self.collate is None:
            return stack_items(items, f"the {self.name} data")
        try:
            batch = self.collate(items)
        except TaskConfigError:
            raise
        except Exception as err:  # the user's collate function: its error, in one line
            raise TaskConfigError(f"the {self.name} data's collate function failed: {one_line(err)}") from None
        # a collate may return (inputs, targets) or one dict with a target key, as an item may
        where = f"a collated batch of the {self.name} data"
        inputs, targets = _split_item(batch, where)
        if isinstance(inputs, Mapping):
            return {k: _tensor(v, f"input {k!r} of {where}") for k, v in inputs.items()}, \
                _tensor(targets, f"the target of {where}")
        return _tensor(inputs, f"the input of {where}"), _tensor(targets, f"the target of {where}")


def _from_loader(loader: DataLoader, collate: Callable | None, name: str) -> tuple[Any, Callable | None]:
    """A DataLoader's dataset and collate function; one that draws its own order is refused (module docstring)."""
    if loader.batch_sampler is not None and not isinstance(loader.batch_sampler.sampler, SequentialSampler) \
            and not isinstance(loader.dataset, IterableDataset):
        raise TaskConfigError(
            f"the {name} DataLoader draws its own order ({type(loader.batch_sampler.sampler).__name__}, e.g. "
            f"shuffle=True), which a resumed run cannot find again: pass DataLoader(dataset, shuffle=False) or the "
            f"dataset itself; the Trainer shuffles it from the run's seed")
    if collate is None and loader.collate_fn is not torch.utils.data.default_collate:
        collate = loader.collate_fn
    return loader.dataset, collate


def from_datasets(train: Any, val: Any, test: Any, *, num_outputs: int | None = None, name: str = "data",
                  collate: Callable[[list[Any]], Any] | None = None, metric: str | None = None,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                  output_shape: Sequence[int] | None = None) -> Task:
    """A :class:`Task` over three map-style datasets (or DataLoaders, or ``Split`` s) (module docstring).

    The sample shapes come from the first items; ``num_outputs`` (classes, or the vocabulary of token targets)
    defaults to one more than the largest training label. Targets ``(N,)`` are classes (cross-entropy,
    accuracy); ``(N, T)`` are per-position targets (the loss over positions; ``metric="perplexity"`` for a
    language model). Every label is checked against ``num_outputs`` in all three splits when the task is made.
    """
    splits = [s if isinstance(s, DataSplit) else DatasetSplit(s, collate, n)
              for s, n in zip((train, val, test), ("train", "val", "test"), strict=True)]
    for split, split_name in zip(splits, ("train", "val", "test"), strict=True):
        if len(split) == 0:
            raise TaskConfigError(f"task '{name}': the {split_name} data is empty")
    x, y = splits[0].take(slice(0, 1))
    first = next(iter(x.values())) if isinstance(x, dict) else x
    if num_outputs is None:
        bounds = splits[0].label_range()
        if bounds is None:
            raise TaskConfigError(f"task '{name}': no training label is counted; give num_outputs")
        num_outputs = bounds[1] + 1
    if output_shape is None and y.dim() == 2:
        output_shape = (y.shape[1], num_outputs)
    return Task(name=name, train=splits[0], val=splits[1], test=splits[2], input_shape=tuple(first.shape[1:]),
                num_outputs=num_outputs, metric_name=metric or "accuracy",
                loss_fn=loss_fn or (sequence_cross_entropy if y.dim() == 2 else cross_entropy_loss),
                output_shape=output_shape)
