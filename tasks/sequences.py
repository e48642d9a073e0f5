"""Synthetic and pixel-sequence tasks for recurrent models (offline, deterministic given ``seed``).

* ``seq-digits``: scikit-learn digits read pixel by pixel, input ``(64, 1)`` float32
  (standardized per pixel with the train statistics, as ``digits``), one label per
  sequence: output ``(10,)``, cross-entropy, accuracy.
* ``copy``: the copy task with a delay. Input ids ``(N, T)`` with
  ``T = 2 * length + delay``: ``length`` random symbols from ``0 .. n_symbols - 1``,
  ``delay - 1`` blanks, one "go" marker, ``length`` blanks (blank id ``n_symbols``,
  marker id ``n_symbols + 1``; ``n_symbols + 2`` input ids). Targets ``(N, T)``: the
  symbols at the last ``length`` positions. Model output ``(T, n_symbols + 1)``;
  loss :func:`~tasks.base.sequence_cross_entropy`, metric accuracy.
  With ``ignore_blanks=True`` (default) the first ``length + delay`` targets are
  :data:`~tasks.base.IGNORE_INDEX`, so the loss and the accuracy count only the asked
  positions (accuracy = fraction of symbols recalled). With ``ignore_blanks=False`` they
  hold the blank id ``n_symbols`` and are counted (the classic setting, where the
  memoryless baseline loss is ``length * log(n_symbols) / T``; the accuracy is then
  plain token accuracy, dominated by blanks).
* ``reverse``: a sequence-to-sequence task for encoder-decoder models (BART, T5, Marian:
  ``models.call_model`` gives the decoder the targets shifted by the model's own shift).
  Input ids ``(N, length)``: random symbols from ``0 .. n_symbols - 1``; targets ``(N,
  length)``: the same symbols in reverse order, one vocabulary for both (``n_symbols``
  ids), so a model whose outputs are its vocabulary is sized by it. Output ``(length,
  n_symbols)``; loss :func:`~tasks.base.sequence_cross_entropy`, metric accuracy.
* ``adding``: the adding problem. Input ``(N, length, 2)`` float32: channel 0 uniform
  values in [0, 1), channel 1 a 0/1 marker with one 1 in each half of the sequence.
  The sum ``s`` of the two marked values (in [0, 2)) is a regression target; to keep
  the single classification :class:`~tasks.base.Task` type it is quantized into
  ``n_bins`` equal-width classes over [0, 2): ``label = floor(s / 2 * n_bins)``.
  Output ``(n_bins,)``, cross-entropy, accuracy (chance ~ 1 / n_bins for the middle
  bins; the label distribution is triangular).
"""

from __future__ import annotations

import torch

from .base import IGNORE_INDEX, Split, Task, sequence_cross_entropy
from .digits import build_digits
from .errors import TaskConfigError
from .registry import check_int, register_task

__all__ = ["build_seq_digits", "build_copy", "build_adding", "copy_layout"]


def _splits(x: torch.Tensor, y: torch.Tensor, n_train: int, n_val: int) -> tuple[Split, Split, Split]:
    cut = (n_train, n_train + n_val)
    return (
        Split(x[: cut[0]].contiguous(), y[: cut[0]].contiguous()),
        Split(x[cut[0] : cut[1]].contiguous(), y[cut[0] : cut[1]].contiguous()),
        Split(x[cut[1] :].contiguous(), y[cut[1] :].contiguous()),
    )


def _sizes(name: str, n_train, n_val, n_test) -> tuple[int, int, int]:
    return (
        check_int(name, "n_train", n_train, minimum=1),
        check_int(name, "n_val", n_val, minimum=1),
        check_int(name, "n_test", n_test, minimum=1),
    )


@register_task("seq-digits")
def build_seq_digits(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
) -> Task:
    """The ``digits`` task (same seeded split and standardization) as 64-step sequences of one pixel."""
    base = build_digits(seed=seed, flatten=True, val_fraction=val_fraction, test_fraction=test_fraction)

    def seq(split: Split) -> Split:
        return Split(split.inputs.reshape(len(split), 64, 1).contiguous(), split.targets)

    return Task(
        name="seq-digits",
        train=seq(base.train),
        val=seq(base.val),
        test=seq(base.test),
        input_shape=(64, 1),
        num_outputs=10,
    )


def copy_layout(n_symbols: int, length: int, delay: int) -> dict[str, int]:
    """Ids and sizes of the copy task: blank, marker, sequence length T, input and output vocabularies."""
    return {
        "blank": n_symbols,
        "marker": n_symbols + 1,
        "T": 2 * length + delay,
        "n_inputs": n_symbols + 2,
        "n_outputs": n_symbols + 1,
    }


@register_task("copy")
def build_copy(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    n_symbols: int = 8,
    length: int = 10,
    delay: int = 50,
    ignore_blanks: bool = True,
    n_train: int = 2000,
    n_val: int = 200,
    n_test: int = 200,
) -> Task:
    """Copy ``length`` symbols after ``delay`` steps (module docstring); data from ``seed`` alone."""
    name = "copy"
    n_symbols = check_int(name, "n_symbols", n_symbols, minimum=1)
    length = check_int(name, "length", length, minimum=1)
    delay = check_int(name, "delay", delay, minimum=1)
    if not isinstance(ignore_blanks, bool):
        raise TaskConfigError(f"task 'copy': ignore_blanks must be True or False, got {ignore_blanks!r}")
    n_train, n_val, n_test = _sizes(name, n_train, n_val, n_test)
    layout = copy_layout(n_symbols, length, delay)
    n, T = n_train + n_val + n_test, layout["T"]

    gen = torch.Generator().manual_seed(seed)
    symbols = torch.randint(0, n_symbols, (n, length), generator=gen, dtype=torch.int64)
    x = torch.full((n, T), layout["blank"], dtype=torch.int64)
    x[:, :length] = symbols
    x[:, length + delay - 1] = layout["marker"]
    y = torch.full((n, T), IGNORE_INDEX if ignore_blanks else layout["blank"], dtype=torch.int64)
    y[:, length + delay :] = symbols

    train, val, test = _splits(x, y, n_train, n_val)
    return Task(
        name=name,
        train=train,
        val=val,
        test=test,
        input_shape=(T,),
        num_outputs=layout["n_outputs"],
        loss_fn=sequence_cross_entropy,
        output_shape=(T, layout["n_outputs"]),
    )


@register_task("reverse")
def build_reverse(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    n_symbols: int = 8,
    length: int = 10,
    n_train: int = 2000,
    n_val: int = 200,
    n_test: int = 200,
) -> Task:
    """Reverse ``length`` symbols (module docstring); data from ``seed`` alone."""
    name = "reverse"
    n_symbols = check_int(name, "n_symbols", n_symbols, minimum=2)
    length = check_int(name, "length", length, minimum=1)
    n_train, n_val, n_test = _sizes(name, n_train, n_val, n_test)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, n_symbols, (n_train + n_val + n_test, length), generator=gen, dtype=torch.int64)
    train, val, test = _splits(x, x.flip(1).contiguous(), n_train, n_val)
    return Task(name=name, train=train, val=val, test=test, input_shape=(length,), num_outputs=n_symbols,
                loss_fn=sequence_cross_entropy, output_shape=(length, n_symbols))


@register_task("adding")
def build_adding(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    length: int = 100,
    n_bins: int = 20,
    n_train: int = 2000,
    n_val: int = 200,
    n_test: int = 200,
) -> Task:
    """Adding problem with the sum quantized into ``n_bins`` classes (module docstring)."""
    name = "adding"
    length = check_int(name, "length", length, minimum=2)
    n_bins = check_int(name, "n_bins", n_bins, minimum=2)
    n_train, n_val, n_test = _sizes(name, n_train, n_val, n_test)
    n, half = n_train + n_val + n_test, length // 2

    gen = torch.Generator().manual_seed(seed)
    values = torch.rand((n, length), generator=gen, dtype=torch.float32)
    first = torch.randint(0, half, (n,), generator=gen)
    second = torch.randint(half, length, (n,), generator=gen)
    markers = torch.zeros((n, length), dtype=torch.float32)
    rows = torch.arange(n)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    x = torch.stack([values, markers], dim=-1)
    total = values[rows, first].double() + values[rows, second].double()
    y = torch.clamp((total / 2.0 * n_bins).floor().to(torch.int64), 0, n_bins - 1)

    train, val, test = _splits(x, y, n_train, n_val)
    return Task(
        name=name,
        train=train,
        val=val,
        test=test,
        input_shape=(length, 2),
        num_outputs=n_bins,
    )
