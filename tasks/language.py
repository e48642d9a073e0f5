"""``ptb-char`` and ``ptb-word``: language modelling on Penn Treebank text files; ``ptb-reverse``: the same
word windows to be written in reverse order (a sequence-to-sequence task on real text for encoder-decoder
models: one vocabulary for inputs and targets, metric accuracy).

Files: ``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt`` (Mikolov's format: one
sentence per line, words separated by spaces, rare words already ``<unk>``) directly in
``data_dir`` (default: ``<cache>/ptb``, see :func:`tasks.download.cache_dir`). Nothing
is downloaded.

Tokens:

* ``ptb-word``: the words of each line followed by an ``<eos>`` token.
* ``ptb-char``: the characters of each line (stripped of the leading / trailing
  spaces of the PTB files) followed by ``'\\n'`` as the end-of-line symbol; the spaces
  between words are kept as ``' '`` characters and ``<unk>`` is spelled out as its five
  characters (no ``_`` word separator is used).

Vocabulary: built from the train file only (the whole file, even when ``max_tokens``
caps the split). Id 0 is ``<unk>`` (for ``ptb-char`` a pseudo-symbol standing for any
character not seen in training), for ``ptb-word`` id 1 is ``<eos>``; the other tokens
follow by decreasing train frequency, ties in code-point order. Val / test tokens
missing from the vocabulary map to ``<unk>``. ``Task.vocab[i]`` is the token of id ``i``.

Samples: each split is one continuous token stream (the classic continuous-stream
perplexity), cut into non-overlapping windows of ``seq_len + 1`` tokens (the remainder
is dropped); inputs are ``window[:-1]``, targets ``window[1:]``, both int64
``(N, seq_len)``. Models output ``(seq_len, V)`` logits per sample; the loss is
:func:`tasks.base.sequence_cross_entropy` and the metric perplexity.

``ptb-word`` with ``sentences=True`` is the DSF authors' sentence-level setup
(arXiv 2503.23104, their PTB data module): every line is one sample
``<bos> w_1 ... w_n <eos>``, cut to ``seq_len + 1`` tokens and padded with ``<pad>``;
inputs are ``tokens[:-1]``, targets ``tokens[1:]`` with the padded positions set to
``IGNORE_INDEX``, so the loss and perplexity count real tokens only. The vocabulary
then starts ``<unk>, <eos>, <bos>, <pad>``. Sentences are independent: these
perplexities are not comparable with continuous-stream ones.

PTB copies that hold only the validation and test files (no ``ptb.train.txt``) can be
used with ``train_file="ptb.valid.txt"``: the train and val splits are then the same
text, which is only good for smoke tests and engine comparisons. This is never done
silently: a missing train file raises ``DataError`` saying so.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import torch

from .base import IGNORE_INDEX, Split, Task, sequence_cross_entropy
from .download import cache_dir
from .errors import DataError, TaskConfigError
from .registry import check_int, register_task

__all__ = ["build_ptb_char", "build_ptb_word", "load_ptb", "tokenize", "build_vocab", "UNK", "EOS", "BOS", "PAD",
           "FILES"]

UNK = "<unk>"
EOS = "<eos>"
BOS = "<bos>"
PAD = "<pad>"

#: File names of the three splits (the train one can be replaced with the ``train_file`` option).
FILES = {"train": "ptb.train.txt", "val": "ptb.valid.txt", "test": "ptb.test.txt"}


def tokenize(text: str, level: str) -> list[str]:
    """The token stream of ``text``: words + ``<eos>`` per line, or characters + ``'\\n'`` per line."""
    tokens: list[str] = []
    for line in text.splitlines():
        if level == "word":
            tokens.extend(line.split())
            tokens.append(EOS)
        else:
            tokens.extend(line.strip())
            tokens.append("\n")
    return tokens


def build_vocab(tokens: list[str], level: str, sentences: bool = False) -> tuple[str, ...]:
    """``<unk>`` (and ``<eos>`` for words; ``<bos>``, ``<pad>`` for sentences) first,
    then the tokens by decreasing count, ties sorted."""
    specials = [UNK, EOS] if level == "word" else [UNK]
    if sentences:
        specials += [BOS, PAD]
    counts = Counter(tok for tok in tokens if tok not in specials)
    return tuple(specials + sorted(counts, key=lambda tok: (-counts[tok], tok)))


def _read(directory: Path, filename: str, name: str) -> str:
    path = directory / filename
    if not path.is_file():
        hint = ""
        others = (directory / FILES["val"]).is_file() and (directory / FILES["test"]).is_file()
        if filename == FILES["train"] and others:
            hint = (
                f"; this directory holds only {FILES['val']} and {FILES['test']}: pass train_file='{FILES['val']}' "
                "to train on the validation text (train and val then coincide)"
            )
        raise DataError(f"task '{name}': missing {filename} in {directory}: put the PTB text file there{hint}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"task '{name}': cannot read {path}: {' '.join(str(exc).split())}; replace the file") from None


def _windows(ids: torch.Tensor, seq_len: int, name: str, split: str) -> Split:
    n = ids.numel() // (seq_len + 1)
    if n == 0:
        raise TaskConfigError(
            f"task '{name}': the {split} split has {ids.numel()} tokens, fewer than seq_len + 1 = {seq_len + 1}; "
            "lower seq_len or raise max_tokens"
        )
    windows = ids[: n * (seq_len + 1)].reshape(n, seq_len + 1)
    return Split(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())


def _sentences(lines: list[list[int]], seq_len: int, bos: int, pad: int) -> Split:
    """One sample per line: ``<bos> ... <eos>`` cut to ``seq_len + 1`` ids, padded (module docstring)."""
    rows = torch.full((len(lines), seq_len + 1), pad, dtype=torch.int64)
    lengths = torch.empty(len(lines), dtype=torch.int64)
    for i, ids in enumerate(lines):
        ids = [bos, *ids][: seq_len + 1]
        rows[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        lengths[i] = len(ids)
    targets = rows[:, 1:].clone()
    targets[torch.arange(seq_len)[None, :] >= (lengths[:, None] - 1)] = IGNORE_INDEX
    return Split(rows[:, :-1].contiguous(), targets)


def load_ptb(
    name: str,
    level: str,
    data_dir,
    seq_len: int,
    train_file: str,
    max_tokens: int | None,
    sentences: bool = False,
) -> Task:
    """Read the three PTB files and build the windowed :class:`Task` (module docstring)."""
    seq_len = check_int(name, "seq_len", seq_len, minimum=1)
    if max_tokens is not None:
        max_tokens = check_int(name, "max_tokens", max_tokens, minimum=2)
    if not isinstance(train_file, str) or not train_file or Path(train_file).name != train_file:
        raise TaskConfigError(f"task '{name}': train_file must be a file name inside data_dir, got {train_file!r}")
    directory = Path(data_dir).expanduser() if data_dir is not None else cache_dir() / "ptb"
    files = {"train": train_file, "val": FILES["val"], "test": FILES["test"]}
    texts = {split: _read(directory, filename, name) for split, filename in files.items()}

    if not isinstance(sentences, bool):
        raise TaskConfigError(f"task '{name}': sentences must be True or False, got {sentences!r}")
    train_tokens = tokenize(texts["train"], level)
    vocab = build_vocab(train_tokens, level, sentences)
    index = {tok: i for i, tok in enumerate(vocab)}
    unk = index[UNK]

    splits = {}
    for split, text in texts.items():
        if sentences:  # one sample per non-empty line, up to max_tokens tokens in all
            lines, total = [], 0
            for line in text.splitlines():
                words = line.split()
                if not words:
                    continue
                total += len(words) + 1
                if max_tokens is not None and total > max_tokens:
                    break
                lines.append([index.get(tok, unk) for tok in words] + [index[EOS]])
            if not lines:
                raise TaskConfigError(f"task '{name}': the {split} split has no sentence within max_tokens")
            splits[split] = _sentences(lines, seq_len, index[BOS], index[PAD])
            continue
        tokens = train_tokens if split == "train" else tokenize(text, level)
        if max_tokens is not None:
            tokens = tokens[:max_tokens]
        ids = torch.tensor([index.get(tok, unk) for tok in tokens], dtype=torch.int64)
        splits[split] = _windows(ids, seq_len, name, split)

    return Task(
        name=name,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        input_shape=(seq_len,),
        num_outputs=len(vocab),
        metric_name="perplexity",
        loss_fn=sequence_cross_entropy,
        output_shape=(seq_len, len(vocab)),
        vocab=vocab,
    )


@register_task("ptb-char")
def build_ptb_char(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    seq_len: int = 128,
    train_file: str = FILES["train"],
    max_tokens: int | None = None,
) -> Task:
    """Character-level PTB (module docstring); ``seed`` and ``download`` are unused (no randomness, no download)."""
    return load_ptb("ptb-char", "char", data_dir, seq_len, train_file, max_tokens)


@register_task("ptb-word")
def build_ptb_word(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    seq_len: int = 35,
    train_file: str = FILES["train"],
    max_tokens: int | None = None,
    sentences: bool = False,
) -> Task:
    """Word-level PTB, a continuous stream or (``sentences=True``) the DSF authors'
    sentence-level samples (module docstring); ``seed`` and ``download`` are unused."""
    return load_ptb("ptb-word", "word", data_dir, seq_len, train_file, max_tokens, sentences)


@register_task("ptb-reverse")
def build_ptb_reverse(
    data_dir=None,
    download: bool = False,
    seed: int = 0,
    seq_len: int = 10,
    train_file: str = FILES["train"],
    max_tokens: int | None = None,
) -> Task:
    """``ptb-word``'s windows of ``seq_len`` words as inputs, the same words in reverse order as targets (module
    docstring): what an encoder-decoder model (BART, T5, Marian) learns to translate; ``seed`` and ``download`` are
    unused."""
    words = load_ptb("ptb-reverse", "word", data_dir, seq_len, train_file, max_tokens)
    splits = {name: Split(getattr(words, name).inputs, getattr(words, name).inputs.flip(1).contiguous())
              for name in ("train", "val", "test")}
    return dataclasses.replace(words, **splits, metric_name="accuracy")
