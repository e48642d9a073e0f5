"""Helpers shared by test files (import as ``from helpers import ...``; tests/ is on pytest's path)."""

from pathlib import Path

import torch

from trainers.engines.backprop import Backprop

WORDS = tuple("the cat sat on a mat ran".split())  # + <unk>, <eos>: a vocabulary of 9 ids


def write_tiny_ptb(directory: Path, lines=(60, 12, 12), words_per_line: int = 6, seed: int = 0) -> Path:
    """A PTB-format word corpus (ptb.train/valid/test.txt) of the 7 ``WORDS`` in ``directory``; returns it."""
    gen = torch.Generator().manual_seed(seed)
    for name, count in zip(("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"), lines, strict=True):
        ids = torch.randint(0, len(WORDS), (count, words_per_line), generator=gen).tolist()
        (directory / name).write_text("".join(" ".join(WORDS[i] for i in line) + "\n" for line in ids))
    return directory


class FakeClock:
    """Seconds that pass only when a test says so (``clock.now += s``)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class TimedBackprop(Backprop):
    """Exact backprop whose every gradient computation takes ``seconds`` of ``clock``."""

    def __init__(self, clock: FakeClock, seconds: float = 1.0):
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def compute_grads(self, *args):
        self.clock.now += self.seconds
        return super().compute_grads(*args)
