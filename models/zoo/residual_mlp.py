"""Residual MLP: the residual stack of the zoo (pre-activation form).

    h_0 = W_in flatten(x)                       stem
    h_i = r(h_{i-1}, g_i(h_{i-1})) = h_{i-1} + g_i(h_{i-1})     i = 1 .. L
    g_i(h) = W_i2 drop(act(W_i1 act(h) + b_i1)) + b_i2       branch
    y   = W_out act(h_L) + b_out                head

The residual Jacobian is K_i = dr/dh = I (Highway-BP paper, Table 1,
pre-activation row). Residual-stack protocol (``trainers.core.protocols.ResidualStack``):
``stem``, ``blocks`` (each with ``branch(h)`` and ``combine(h, z)``), ``head``.
"""

import math

import torch
import torch.nn as nn

from gradengines.models.errors import ModelConfigError
from gradengines.models.layers.activations import build_activation
from gradengines.models.layers.dropout import ConsistentDropout

__all__ = ["ResidualBlock", "ResidualMLP"]


class ResidualBlock(nn.Module):
    """One block ``h + g(h)`` with a two-layer pre-activation branch."""

    def __init__(self, width: int, hidden: int, activation: str, dropout: float, branch_scale: float):
        super().__init__()
        self.act = build_activation(activation)
        self.fc1 = nn.Linear(width, hidden)
        self.dropout = ConsistentDropout(dropout)
        self.fc2 = nn.Linear(hidden, width)
        with torch.no_grad():
            self.fc2.weight.mul_(branch_scale)

    def branch(self, h):
        """g(h): the expensive part, (B, width) -> (B, width)."""
        return self.fc2(self.dropout(self.act(self.fc1(self.act(h)))))

    @staticmethod
    def combine(h, z):
        """r(h, z) = h + z (residual Jacobian K = I)."""
        return h + z

    def forward(self, h):
        return self.combine(h, self.branch(h))


class ResidualMLP(nn.Module):
    """Stem, ``depth`` residual blocks of constant width, linear head."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        depth: int = 4,
        width: int = 64,
        hidden: int | None = None,
        activation: str = "relu",
        dropout: float = 0.0,
    ):
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features),
                            ("depth", depth), ("width", width)):
            if not isinstance(value, int) or value < 1:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
        hidden = width if hidden is None else hidden
        # Scale the last layer of each branch so the stream's variance stays O(1) in depth.
        branch_scale = 1.0 / math.sqrt(depth)
        self.stem = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(
            ResidualBlock(width, hidden, activation, dropout, branch_scale) for _ in range(depth)
        )
        self.head_act = build_activation(activation)
        self.head_fc = nn.Linear(width, out_features)

    def head(self, h):
        """Output map from the last stream state, (B, width) -> (B, out)."""
        return self.head_fc(self.head_act(h))

    def forward(self, x):
        h = self.stem(x.flatten(1))  # (B, width)
        for block in self.blocks:
            h = block(h)
        return self.head(h)
