"""A streamed training split: any ``IterableDataset`` (torch's, a Hugging Face ``datasets.IterableDataset``, a
generator over files larger than memory), read in its own order, batch after batch.

    task = tasks.from_datasets(stream, val_set, test_set, num_outputs=10)     # then fit(steps=N) / --steps N

The stream is read pass after pass without a gap: the batch of step ``s`` holds items ``s*B .. (s+1)*B - 1`` of
the passes laid end to end (``B`` the global batch), so every batch is full. Before pass ``p`` begins,
``set_epoch(p)`` is called where the dataset has it (a stream that reshuffles by epoch, as Hugging Face's does).

The position is a sampler state, kept in the checkpoint (``StreamReader.position``): the pass, the items read in
it and, for a dataset with ``state_dict()`` and ``load_state_dict(state)`` (Hugging Face's ``IterableDataset``,
torchdata's stateful objects), that state, which a resumed run loads: the stream continues where it was, without
reading it again. A dataset without them cannot be put at a position: a resumed run reads the pass again from its
start up to the position (the same items; said in one line on resume, with its cost). A stateful dataset's
``state_dict()`` when handed in is where every pass begins (the loaded state of a resume applies to its pass
only: a pass begins by loading that start state).

What is known before training is the stream's head, its first items: the task's checks (shapes, labels), the
fingerprint a resume compares and the engines' first-batch check read it. Every later batch's labels are checked
as it is read (``Task.check_targets``): a label outside the outputs stops the run at that step, in one line.
Without ``__len__`` a stream has no epochs: a run on it is given in steps, evaluated every ``eval_every`` steps
(default: ten times a run), and its records carry no epoch. Under torchrun every rank reads each global batch
and keeps its own rows, so the gradients are those of the global batch. A DataLoader's workers are not used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .base import DataSplit
from .collate import collate_items
from .errors import TaskConfigError, one_line

__all__ = ["StreamSplit", "StreamReader", "HEAD"]

#: Items of a stream read before training (the checks and the fingerprint); more when a first batch needs them.
HEAD = 64


def _length(dataset: Any) -> int | None:
    try:
        return int(len(dataset))
    except (TypeError, NotImplementedError):
        return None


class StreamSplit(DataSplit):
    """The training split of a stream (module docstring); ``collate(items) -> (inputs, targets)`` as for a
    ``DatasetSplit``. ``take`` reads the head; training reads through a ``StreamReader``."""

    streamed = True

    def __init__(self, dataset: Any, collate: Callable[[list[Any]], Any] | None = None, name: str = "train"):
        self.dataset, self.collate, self.name = dataset, collate, name
        self.stateful = callable(getattr(dataset, "state_dict", None)) and \
            callable(getattr(dataset, "load_state_dict", None))
        self._start = dataset.state_dict() if self.stateful else None  # where every pass begins
        self.length = _length(dataset)
        self._head: list[Any] = []
        self._whole = False  # the head is the whole first pass
        if not self.head(HEAD):
            raise TaskConfigError(f"the {name} data is a stream that yields no item")
        self.targets = self.collate_items(self._head)[1]  # the head's: labels checked, fingerprinted

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError(f"the {self.name} data is a stream without a length")
        return self.length

    @property
    def size(self) -> int | None:
        return self.length

    def begin(self, pass_index: int, state: Any = None):
        """An iterator at the start of pass ``pass_index``, or at ``state`` (a stateful dataset's) within it."""
        try:
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(pass_index)
            if self.stateful:
                self.dataset.load_state_dict(self._start if state is None else state)
            return iter(self.dataset)
        except TaskConfigError:
            raise
        except Exception as err:  # the user's dataset
            raise TaskConfigError(f"the {self.name} stream could not begin pass {pass_index}: {one_line(err)}") \
                from None

    def next_item(self, items, read: int, pass_index: int) -> Any:
        """The next item of ``items`` (raises ``StopIteration`` at the end of the pass); the dataset's own errors
        in one line, naming the item."""
        try:
            return next(items)
        except (StopIteration, TaskConfigError):
            raise
        except Exception as err:
            raise TaskConfigError(f"the {self.name} stream failed at item {read} of pass {pass_index}: "
                                  f"{one_line(err)}") from None

    def head(self, n: int) -> list[Any]:
        """The first ``n`` items of the first pass (fewer if it is shorter), read once and kept."""
        if len(self._head) < n and not self._whole:
            items, self._head = self.begin(0), []
            while len(self._head) < n:
                try:
                    self._head.append(self.next_item(items, len(self._head), 0))
                except StopIteration:
                    self._whole = True
                    break
        return self._head[:n]

    def collate_items(self, items: list[Any]) -> tuple[Any, torch.Tensor]:
        return collate_items(items, self.collate, self.name)

    def order(self, generator: torch.Generator | None = None) -> torch.Tensor:
        if generator is not None:
            raise TypeError("a stream is read in its own order (StreamReader), not in one drawn by the Trainer")
        return torch.arange(len(self._head))

    def take(self, keys: slice | torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Items of the head: ``take(slice(0, n))`` the first ``n`` of the stream."""
        if isinstance(keys, slice):
            if keys.stop is not None:
                self.head(keys.stop)
            keys = self.order()[keys]
        return self._take(keys)

    def _take(self, keys: torch.Tensor) -> tuple[Any, torch.Tensor]:
        return self.collate_items([self._head[int(k)] for k in keys])

    def largest_input(self) -> int | None:
        """The largest input token id of the head (later items are checked by the model's embedding)."""
        inputs = self.take(slice(0, len(self._head)))[0]
        ids = [t for t in (inputs.values() if isinstance(inputs, dict) else (inputs,)) if not t.is_floating_point()]
        return max(int(t.max()) for t in ids) if ids else None


class StreamReader:
    """One run's place in a stream: ``next_items(n)`` continues it, ``position()`` is what a checkpoint keeps,
    ``restore(position)`` puts a fresh reader there (module docstring)."""

    def __init__(self, split: StreamSplit):
        self.split = split
        self.restart()

    def restart(self) -> None:
        """Back to the first item of the first pass."""
        self.passes, self.read, self._items = 0, 0, None

    def position(self) -> dict:
        return {"pass": self.passes, "read": self.read,
                "state": self.split.dataset.state_dict() if self.split.stateful else None}

    def restore(self, position: dict) -> str | None:
        """Continue from ``position`` (a checkpoint's); returns what a resume of a stateless stream costs, to say."""
        self.passes, self.read = int(position["pass"]), int(position["read"])
        if self.split.stateful:
            self._items = self.split.begin(self.passes, position["state"])
            return None
        self._items = self.split.begin(self.passes)
        for done in range(self.read):
            try:
                self.split.next_item(self._items, done, self.passes)
            except StopIteration:
                raise TaskConfigError(
                    f"the {self.split.name} stream ends at item {done} of pass {self.passes}, before the "
                    f"checkpoint's position ({self.read}): it is not the stream the run was trained on") from None
        return (f"the {self.split.name} stream has no state_dict/load_state_dict: its {self.read} item(s) of pass "
                f"{self.passes} before the checkpoint were read again to continue from there")

    def next_items(self, n: int) -> list[Any]:
        """The next ``n`` items, continuing into the next pass at the end of one."""
        items: list[Any] = []
        while len(items) < n:
            if self._items is None:
                self._items = self.split.begin(self.passes)
            try:
                items.append(self.split.next_item(self._items, self.read, self.passes))
            except StopIteration:
                if self.read == 0:
                    raise TaskConfigError(f"pass {self.passes} of the {self.split.name} stream yields no item") \
                        from None
                self._items, self.passes, self.read = None, self.passes + 1, 0
                continue
            self.read += 1
        return items
