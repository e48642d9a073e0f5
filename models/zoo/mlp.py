"""Multilayer perceptron: the layer stack of the zoo.

    h_0 = flatten(x)
    h_l = act(drop(W_l h_{l-1} + b_l))      l = 1 .. L-1
    y   = W_L h_{L-1} + b_L                  (no activation, no dropout)

Dropout sits before the activation, as in the FOTON paper's code, and is a
``ConsistentDropout`` so two passes over a batch can share masks.
The hidden weights W_1 .. W_{L-1} can be made orthogonal (``models.orthogonal``);
the output layer stays free unless ``orthogonal_output``.

Layer-stack protocol (``trainers.core.protocols.LayerStack``): ``layers`` (the L
linear maps, in order), ``act`` (the activation module), ``dropouts`` (one
per hidden layer, so frozen masks differ between layers) and
``input_features(x) -> h_0`` (here: flatten).
"""

from collections.abc import Sequence

import torch.nn as nn

from gradengines.models.errors import ModelConfigError
from gradengines.models.layers.activations import build_activation
from gradengines.models.layers.dropout import ConsistentDropout
from gradengines.models.orthogonal import DEFAULT_BJORCK_ITERS, make_orthogonal

__all__ = ["MLP", "hidden_widths"]


def hidden_widths(depth: int, width: int | Sequence[int]) -> list[int]:
    """The ``depth - 1`` hidden widths from an int or an explicit list."""
    if not isinstance(depth, int) or depth < 1:
        raise ModelConfigError(f"depth must be an integer >= 1, got {depth!r}")
    if isinstance(width, (str, bytes, bool)):  # a string would be read as a list of its characters
        raise ModelConfigError(f"width must be an integer or a list of integers, got {width!r}")
    widths = [width] * (depth - 1) if isinstance(width, int) else list(width)
    if len(widths) != depth - 1:
        raise ModelConfigError(
            f"width lists the hidden widths: expected {depth - 1} values for depth {depth}, got {len(widths)}"
        )
    if any(not isinstance(w, int) or w < 1 for w in widths):
        raise ModelConfigError(f"widths must be positive integers, got {widths}")
    return widths


class MLP(nn.Module):
    """Fully connected stack of ``depth`` linear layers (see module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        depth: int = 2,
        width: int | Sequence[int] = 64,
        activation: str = "tanh",
        bias: bool = True,
        dropout: float = 0.0,
        orthogonal: str | None = None,
        orthogonal_iters: int = DEFAULT_BJORCK_ITERS,
        orthogonal_output: bool = False,
    ):
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or value < 1:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
        dims = [in_features, *hidden_widths(depth, width), out_features]
        self.layers = nn.ModuleList(
            nn.Linear(d_in, d_out, bias=bias) for d_in, d_out in zip(dims[:-1], dims[1:], strict=True)
        )
        self.act = build_activation(activation)
        self.dropouts = nn.ModuleList(ConsistentDropout(dropout) for _ in self.layers[:-1])
        ortho_layers = self.layers if orthogonal_output else self.layers[:-1]
        for layer in ortho_layers:
            make_orthogonal(layer, orthogonal, iters=orthogonal_iters)

    @property
    def widths(self) -> list[int]:
        """[d_0, d_1, ..., d_L]."""
        return [self.layers[0].in_features] + [layer.out_features for layer in self.layers]

    @staticmethod
    def input_features(x):
        """h_0: the flattened input, (B, ...) -> (B, d_0)."""
        return x.flatten(1)

    def forward(self, x):
        h = self.input_features(x)  # (B, d_0)
        *hidden, last = self.layers  # (unpacked: a ModuleList's slice is a new ModuleList, 1 us a layer)
        for layer, dropout in zip(hidden, self.dropouts, strict=True):
            h = self.act(dropout(layer(h)))  # (B, d_l)
        return last(h)  # (B, d_L)
