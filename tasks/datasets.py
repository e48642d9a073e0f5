"""A Task from the user's own data: any ``torch.utils.data.Dataset`` (or a ``DataLoader`` over one) for each of
train / val / test; a streaming ``IterableDataset`` for training (``tasks.stream``).

    task = tasks.from_datasets(train_set, val_set, test_set)            # classes read from the labels
    task = tasks.from_datasets(train_set, val_set, test_set, num_outputs=10, collate=my_collate)
    task = tasks.from_datasets(stream, val_set, test_set, num_outputs=10)   # trained in steps

Items are ``(input, target)`` pairs or dicts with a ``labels`` entry (``tasks.collate``), stacked into a batch
(``collate`` is yours where they differ in shape: padding, say); a batch of named inputs reaches the model by
keyword (``model(**inputs)``, ``models.adapters.calling``).

The Trainer never iterates a map-style dataset: it asks for the items of each batch by index
(``DatasetSplit.take``), in an order drawn from the run's seed and epoch. That is what keeps its promises on the
user's data as on its own: the same seed gives the same run, ``--resume`` continues from the step (no replay of
the data), and under torchrun each rank takes its own rows of every global batch. A ``DataLoader`` handed in
gives its dataset and its collate function; one that shuffles (``shuffle=True``, a sampler of its own) is
refused, since an order drawn by the loader cannot be found again on a resume. Its workers are not used.
A streaming training set is read in its own order, its position kept in the checkpoint (``tasks.stream``);
validation and test streams are read once, into memory, when the task is made (they are evaluated again and
again, on fixed items).

When the task is made, every item of a map-style split is read once and its target kept
(``DatasetSplit.targets``): the labels are checked against the outputs before anything is written, and the
fingerprint a resume compares is that of the targets, as for tensors (the same data gives the same fingerprint
in either form). A dataset whose items are slow to make (images decoded from files) pays that pass once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, SequentialSampler

from .base import DataSplit, Task, cross_entropy_loss, sequence_cross_entropy
from .collate import collate_items
from .errors import TaskConfigError, one_line
from .stream import StreamSplit

__all__ = ["DatasetSplit", "from_datasets"]


class DatasetSplit(DataSplit):
    """A split read from a map-style dataset by index (module docstring); ``collate(items) -> (inputs, targets)``
    (default ``stack_items``)."""

    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any] | None = None, name: str = "split"):
        if isinstance(dataset, DataLoader):
            dataset, collate = _from_loader(dataset, collate, name)
        if isinstance(dataset, IterableDataset):
            raise TaskConfigError(f"the {name} data is an IterableDataset (a stream without an index): "
                                  f"tasks.from_datasets streams it (tasks.stream.StreamSplit)")
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
        return collate_items([self._item(int(k)) for k in keys], self.collate, self.name)

    def _item(self, key: int) -> Any:
        """The dataset's row ``key``; what its ``__getitem__`` raises is one line naming the split and the row, as a
        stream's failure is (an OSError stays one: a disk's, said as the run's)."""
        try:
            return self.dataset[key]
        except (TaskConfigError, OSError):
            raise
        except IndexError as err:
            raise TaskConfigError(f"the {self.name} dataset has no row {key} ({one_line(err)}), though its __len__ "
                                  f"says {self._size}: __len__ must count the rows __getitem__ serves") from None
        except Exception as err:  # the user's dataset
            raise TaskConfigError(f"the {self.name} dataset failed on row {key}: {one_line(err)}") from None


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


def _split(data: Any, collate: Callable | None, name: str) -> DataSplit:
    """The split of ``data``: itself (a ``DataSplit``), a stream (training) or a stream read once (val, test),
    or a map-style dataset."""
    if isinstance(data, DataSplit):
        return data
    if isinstance(data, DataLoader):
        data, collate = _from_loader(data, collate, name)
    if not isinstance(data, IterableDataset):
        return DatasetSplit(data, collate, name)
    if name == "train":
        return StreamSplit(data, collate, name)
    try:
        items = list(data)
    except TaskConfigError:
        raise
    except Exception as err:  # the user's stream
        raise TaskConfigError(f"the {name} stream failed while it was read: {one_line(err)}") from None
    return DatasetSplit(items, collate, name)


def from_datasets(train: Any, val: Any, test: Any, *, num_outputs: int | None = None, name: str = "data",
                  collate: Callable[[list[Any]], Any] | None = None, metric: str | None = None,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                  output_shape: Sequence[int] | None = None) -> Task:
    """A :class:`Task` over three datasets (or DataLoaders, or ``Split`` s) (module docstring); the training set
    may be a stream (an ``IterableDataset``: ``num_outputs`` is then needed).

    The sample shapes come from the first items; ``num_outputs`` (classes, or the vocabulary of token targets)
    defaults to one more than the largest training label. Targets ``(N,)`` are classes (cross-entropy,
    accuracy); ``(N, T)`` are per-position targets (the loss over positions; ``metric="perplexity"`` for a
    language model). Every label is checked against ``num_outputs`` in all three splits when the task is made.
    """
    if num_outputs is not None and (isinstance(num_outputs, bool) or not isinstance(num_outputs, int)
                                    or num_outputs < 1):
        raise TaskConfigError(f"task '{name}': num_outputs must be a positive integer (classes, or the vocabulary "
                              f"of token targets), got {num_outputs!r}")
    splits = [_split(data, collate, n) for data, n in zip((train, val, test), ("train", "val", "test"), strict=True)]
    for split, split_name in zip(splits, ("train", "val", "test"), strict=True):
        if split.size == 0:
            raise TaskConfigError(f"task '{name}': the {split_name} data is empty")
    if splits[0].streamed and num_outputs is None:
        raise TaskConfigError(f"task '{name}': the training data is a stream, whose labels are not known before "
                              f"training: give num_outputs (classes, or the vocabulary of token targets)")
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
