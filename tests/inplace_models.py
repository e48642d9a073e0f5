"""Models that write in place into the tensor they are given (issue 47), for ``tests/test_caller_data.py`` and
the command line (``--model tests/inplace_models.py:CLASS``); each takes (B, in_features) to ``classes`` logits."""

import torch
from torch import nn


class Residual(nn.Module):
    """h + tanh(fc(h)), with the ``branch`` and ``combine`` of a residual stack's block."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def branch(self, h):
        return torch.tanh(self.fc(h))

    def combine(self, h, z):
        return h + z

    def forward(self, h):
        return self.combine(h, self.branch(h))


class InPlaceStem(nn.Module):
    """Linear layers joined by in-place SiLUs, then residual blocks (timm's NFNet: convolutions joined by in-place
    activations before its blocks). Structure discovery takes the stem's layers for a chain of their own and runs
    the forward with them passing their input through: the first SiLU then writes into the tensor the forward was
    given. The model's own forward writes nothing it is given. (Its parts are not named stem, blocks and head: it is
found, not taken as a declared stack.)"""

    def __init__(self, in_features: int = 64, width: int = 16, depth: int = 4, classes: int = 10):
        super().__init__()
        self.entry = nn.Sequential(nn.Linear(in_features, in_features), nn.SiLU(inplace=True),
                                  nn.Linear(in_features, width), nn.SiLU(inplace=True))
        self.body = nn.ModuleList(Residual(width) for _ in range(depth))
        self.classifier = nn.Linear(width, classes)

    def forward(self, x):
        h = self.entry(x)
        for block in self.body:
            h = block(h)
        return self.classifier(h)


class ScalesItsInput(nn.Module):
    """A residual stack (stem, blocks, head: Highway-BP takes it as it is) whose stem first scales its input in
    place (``x.mul_(2)``): the model's own doing, which a direct ``model(x)`` does to ``x`` as PyTorch does; every
    run of the framework gives it a copy of its own."""

    def __init__(self, in_features: int = 64, width: int = 16, depth: int = 3, classes: int = 10):
        super().__init__()
        self.lift = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(Residual(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def stem(self, x):
        return self.lift(x.mul_(2.0))

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)
