"""``tokens``: language modelling on flat files of token ids, read through a memory map, so a corpus larger
than memory trains in constant memory (nanoGPT's layout).

Files in ``data_dir``: ``train.bin``, ``val.bin`` and optionally ``test.bin``, each the token ids of one
continuous stream, little-endian ``uint16`` or ``uint32`` (``dtype``), nothing else (no header); and
``meta.json`` with ``vocab_size`` (and ``dtype``, and ``vocab``, the token of each id, where known), as
``scripts/token_file.py`` writes them. Options override ``meta.json``. Without ``test.bin`` the validation file's
first half is the val split and its second half the test split (model selection never reads the test half).

Samples are windows of ``seq_len + 1`` tokens: inputs ``window[:-1]``, targets ``window[1:]``, int64
``(B, seq_len)``; the loss is :func:`tasks.base.sequence_cross_entropy`, the metric perplexity. A training epoch
is as many windows as the stream holds end to end, each at a random start drawn from a generator seeded by the
run's seed, epoch and position (``RandomStarts``: nothing of size the corpus is held, and a resumed run draws
the same windows); evaluation reads the fixed consecutive windows (stride ``seq_len + 1``, the remainder
dropped), the windows ``ptb-word`` makes of the same ids. Each batch reads only its windows: the memory map is
opened per batch (as nanoGPT does), so the pages read are not kept.

When the task is made, each file is read once in chunks (plain reads, no map) to check its ids against the
vocabulary: a file whose size is not a multiple of its dtype, an id at or above ``vocab_size``, or a stream
shorter than one window is one ``TaskConfigError`` line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .base import DataSplit, Task, sequence_cross_entropy
from .errors import DataError, TaskConfigError
from .registry import check_int, register_task

__all__ = ["TokenWindows", "RandomStarts", "build_tokens", "DTYPES", "META"]

#: Token file dtypes (little-endian).
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
#: The file beside the token files that says their vocabulary size, dtype and (where known) tokens.
META = "meta.json"
_CHUNK = 1 << 20  # ids per plain read of the vocabulary check (2 MiB of uint16: the peak stays flat)


class RandomStarts:
    """The training keys of one epoch of a :class:`TokenWindows`: ``count`` window starts in ``[low, high]``,
    drawn when sliced, from a generator seeded by ``seed`` and the slice's first position (the Trainer slices
    at batch boundaries): a batch's windows depend on (run seed, epoch, batch) alone."""

    def __init__(self, seed: int, count: int, low: int, high: int):
        self.seed, self.count, self.low, self.high = seed, count, low, high

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, rows: slice) -> torch.Tensor:
        start, stop, step = rows.indices(self.count)
        if step != 1:
            raise IndexError("RandomStarts are read a batch at a time (a slice of step 1)")
        gen = torch.Generator().manual_seed((self.seed + start) % (1 << 63))
        return torch.randint(self.low, self.high + 1, (max(stop - start, 0),), generator=gen)


class TokenWindows(DataSplit):
    """Windows of ``seq_len + 1`` tokens of a token file (ids ``[begin, end)`` of it), keyed by their first
    token's position (module docstring)."""

    def __init__(self, path: Path, dtype: str, seq_len: int, begin: int = 0, end: int | None = None):
        self.path, self.dtype, self.seq_len = path, DTYPES[dtype], seq_len
        self.begin = begin
        self.end = _ids_in(path, self.dtype) if end is None else end
        self.windows = (self.end - self.begin) // (seq_len + 1)
        if self.windows == 0:
            raise TaskConfigError(f"token file {path} holds {self.end - self.begin} tokens"
                                  f"{'' if begin == 0 and end is None else ' in its part'}, fewer than one window "
                                  f"of seq_len + 1 = {seq_len + 1}: lower seq_len")
        self._range: tuple[int, int] | None = None

    def __len__(self) -> int:
        return self.windows

    def order(self, generator: torch.Generator | None = None) -> Any:
        if generator is None:
            return self.begin + torch.arange(self.windows) * (self.seq_len + 1)
        seed = int(torch.randint(0, 1 << 62, (1,), generator=generator))
        return RandomStarts(seed, self.windows, self.begin, self.end - self.seq_len - 1)

    def take(self, keys: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(keys, slice):  # positions of the fixed windows, without making all their keys
            keys = self.begin + torch.arange(*keys.indices(self.windows)) * (self.seq_len + 1)
        return self._take(keys)

    def _take(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = np.memmap(self.path, dtype=self.dtype, mode="r")  # opened per batch: its pages are not kept
        rows = keys.numpy()[:, None] + np.arange(self.seq_len + 1)
        if len(ids) < self.end:  # the file was cut (or replaced) while the run read it
            held = len(ids)
            del ids
            raise TaskConfigError(f"token file {self.path} now holds {held} tokens, where the run found {self.end}: "
                                  f"it changed while the run read it; restore it, then --resume")
        windows = torch.from_numpy(ids[rows].astype(np.int64))
        del ids
        return windows[:, :-1].clone(), windows[:, 1:].clone()

    def id_range(self) -> tuple[int, int]:
        """(smallest, largest) id of the part, read once in chunks without a map."""
        if self._range is None:
            low, high = None, None
            with open(self.path, "rb") as file:
                file.seek(self.begin * self.dtype.itemsize)
                left = self.end - self.begin
                while left:
                    chunk = np.fromfile(file, dtype=self.dtype, count=min(left, _CHUNK))
                    if chunk.size == 0:
                        break
                    left -= chunk.size
                    low = int(chunk.min()) if low is None else min(low, int(chunk.min()))
                    high = int(chunk.max()) if high is None else max(high, int(chunk.max()))
            self._range = (low or 0, high or 0)
        return self._range

    def label_range(self) -> tuple[int, int] | None:
        return self.id_range()

    def largest_input(self) -> int | None:
        return self.id_range()[1]

    def counted(self, keys: torch.Tensor | None = None) -> int:
        return (self.windows if keys is None else len(keys)) * self.seq_len

    def fingerprint_into(self, digest: Any, inputs: bool) -> None:
        """The part's size and its first 64 windows (not every target: the file may not fit in memory)."""
        x, y = self.take(slice(0, 64))
        digest.update(x.numpy().tobytes() if inputs else str(len(self)).encode() + y.numpy().tobytes())


def _ids_in(path: Path, dtype: np.dtype) -> int:
    try:
        size = path.stat().st_size
    except OSError as err:
        raise DataError(f"cannot read token file {path}: {err.strerror}") from None
    if size % dtype.itemsize:
        raise TaskConfigError(f"token file {path} has {size} bytes, not a multiple of {dtype.name}'s "
                              f"{dtype.itemsize}: another dtype, or a truncated file")
    return size // dtype.itemsize


def _meta(directory: Path) -> dict:
    path = directory / META
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read {path}: {err}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path} is not a JSON object")
    return meta


@register_task("tokens")
def build_tokens(data_dir=None, download: bool = False, seed: int = 0, seq_len: int = 35,
                 vocab_size: int | None = None, dtype: str | None = None) -> Task:
    """Token files in ``data_dir`` (module docstring); ``seed`` and ``download`` are unused (the training
    windows are drawn from the run's seed)."""
    if data_dir is None:
        raise TaskConfigError("task 'tokens' needs --data-dir, the folder of train.bin and val.bin "
                              "(scripts/token_file.py writes them)")
    directory = Path(data_dir).expanduser()
    seq_len = check_int("tokens", "seq_len", seq_len, minimum=1)
    for name in ("train.bin", "val.bin"):
        if not (directory / name).is_file():
            raise DataError(f"task 'tokens': missing {name} in {directory} (scripts/token_file.py writes it)")
    meta = _meta(directory)
    dtype = dtype if dtype is not None else meta.get("dtype", "uint16")
    if dtype not in DTYPES:
        raise TaskConfigError(f"task 'tokens': dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    vocab_size = vocab_size if vocab_size is not None else meta.get("vocab_size")
    if vocab_size is None:
        raise TaskConfigError(f"task 'tokens': no vocabulary size: give --task-option vocab_size=N or write it in "
                              f"{directory / META}")
    vocab_size = check_int("tokens", "vocab_size", vocab_size, minimum=1)
    train = TokenWindows(directory / "train.bin", dtype, seq_len)
    if (directory / "test.bin").is_file():
        val = TokenWindows(directory / "val.bin", dtype, seq_len)
        test = TokenWindows(directory / "test.bin", dtype, seq_len)
    else:  # the validation file's halves (module docstring)
        half = _ids_in(directory / "val.bin", DTYPES[dtype]) // 2
        val = TokenWindows(directory / "val.bin", dtype, seq_len, 0, half)
        test = TokenWindows(directory / "val.bin", dtype, seq_len, half)
    vocab = meta.get("vocab")
    return Task(name="tokens", train=train, val=val, test=test, input_shape=(seq_len,), num_outputs=vocab_size,
                metric_name="perplexity", loss_fn=sequence_cross_entropy, output_shape=(seq_len, vocab_size),
                vocab=tuple(vocab) if isinstance(vocab, list) and len(vocab) == vocab_size else None)
