"""Orthogonal CNNs: layer stacks of orthogonal convolutions (``ortho_lenet``, ``ortho_convnet``).

Same equations and protocol as ``models.zoo.mlp`` (``trainers.core.protocols.LayerStack``):

    h_0 = input_features(x)                  (B, features) or (B, C, H, W) -> (B, *in_shape)
    h_l = act(drop(A_l h_{l-1} + b_l))       l = 1 .. L-1
    y   = A_L h_{L-1} + b_L                  (no activation, no dropout)

Every ``A_l`` is a module with ``forward`` (A h + b) and ``adjoint`` (A^T v, no
bias): an ``OrthoConvBlock`` or a ``FlattenLinear`` (an ``nn.Linear`` as ``.linear``). The hidden maps have
orthonormal rows
(A A^T = I) exactly, up to float rounding: the convolutions by construction
(``models.orthogonal.conv.OrthogonalConv2d``, Fourier-domain Cayley transform),
the dense hidden layers through ``models.orthogonal.make_orthogonal`` (default
"expm"; a projected method needs ``project_`` after each step, which the Trainer
does). Spatial size shrinks only by space-to-depth (a permutation), channels
never grow beyond ``4 x`` the input channels of a block, so the total width
C*H*W never increases along the hidden layers. The output layer is free.

* ``ortho_lenet``: two conv blocks (space-to-depth by 2, then an orthogonal
  conv), then ``len(width)`` orthogonal dense hidden layers, then a dense output.
  digits: (1,8,8) -> (4,4,4) -> (16,2,2) -> 32 -> 10.
* ``ortho_convnet``: ``space_to_depth`` lifts, then ``depth`` orthogonal convs at
  constant shape, then a dense output. digits: (1,8,8) -> (4,4,4) x depth -> 10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.nn as nn

from gradengines.models.errors import ModelConfigError, positive_int
from gradengines.models.layers.activations import build_activation
from gradengines.models.layers.dropout import ConsistentDropout
from gradengines.models.orthogonal import DEFAULT_BJORCK_ITERS, METHODS
from gradengines.models.orthogonal.conv import FlattenLinear, OrthoConvBlock, space_to_depth_shape

__all__ = ["OrthoLeNet", "OrthoConvNet", "infer_image_shape"]


def infer_image_shape(in_features: int, in_shape: Sequence[int] | None = None) -> tuple[int, int, int]:
    """(C, H, W) of the input: ``in_shape`` checked against ``in_features``, or a square
    image with 1 channel (64 -> (1, 8, 8), 784 -> (1, 28, 28)) or 3 channels (3072 -> (3, 32, 32))."""
    positive_int("in_features", in_features)
    if in_shape is not None:
        try:
            shape = tuple(in_shape)
        except TypeError:
            shape = None
        if (shape is None or len(shape) != 3
                or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape)):
            raise ModelConfigError(f"in_shape must be (C, H, W) of positive integers, got {in_shape!r}")
        if math.prod(shape) != in_features:
            raise ModelConfigError(
                f"in_shape {shape} has {math.prod(shape)} features but in_features is {in_features}"
            )
        return shape
    for channels in (1, 3):
        if in_features % channels == 0:
            side = math.isqrt(in_features // channels)
            if side * side * channels == in_features:
                return (channels, side, side)
    raise ModelConfigError(
        f"cannot infer a square image from in_features={in_features} (1 or 3 channels); give in_shape=(C, H, W)"
    )


def _check_method(orthogonal) -> None:
    if orthogonal is not None and orthogonal not in METHODS:
        raise ModelConfigError(
            f"unknown orthogonal method {orthogonal!r}; expected one of None, {', '.join(map(repr, METHODS))}"
        )


def _channels_list(channels, n: int) -> list[int | None]:
    if channels is None:
        return [None] * n
    values = [channels] * n if isinstance(channels, int) else list(channels)
    if len(values) != n:
        raise ModelConfigError(f"channels lists the output channels of {n} conv layers, got {len(values)} values")
    for value in values:
        positive_int("channels", value)
    return values


class _OrthoStack(nn.Module):
    """Shared layer-stack behaviour (the MLP's loop on image-shaped hidden states)."""

    in_shape: tuple[int, int, int]

    def _finish(self, layers, activation: str, dropout: float) -> None:
        self.layers = nn.ModuleList(layers)
        self.act = build_activation(activation)
        self.dropouts = nn.ModuleList(ConsistentDropout(dropout) for _ in self.layers[:-1])
        widths = self.widths
        if any(b > a for a, b in zip(widths[:-2], widths[1:-1], strict=True)):  # hidden layers only
            raise ModelConfigError(f"hidden widths must be non-increasing, got {widths[:-1]}")

    @property
    def widths(self) -> list[int]:
        """[d_0, d_1, ..., d_L]: total features (C*H*W) of h_0 .. h_{L-1} and of y."""
        return [math.prod(self.in_shape)] + [layer.out_features for layer in self.layers]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Per-sample shapes of h_0 .. h_{L-1} and of y."""
        return [self.in_shape] + [tuple(getattr(layer, "out_shape", (layer.out_features,))) for layer in self.layers]

    def input_features(self, x):
        """h_0: (B, features) or (B, C, H, W) -> (B, *in_shape)."""
        return x.reshape(x.shape[0], *self.in_shape)

    def forward(self, x):
        h = self.input_features(x)  # (B, C, H, W)
        *hidden, last = self.layers  # (unpacked: a ModuleList's slice is a new ModuleList, 1 us a layer)
        for layer, dropout in zip(hidden, self.dropouts, strict=True):
            h = self.act(dropout(layer(h)))  # (B, *shape_l)
        return last(h)  # (B, d_L)


class OrthoLeNet(_OrthoStack):
    """LeNet-like orthogonal stack: 2 conv blocks, dense hidden layers, dense output.

    Conv block i: space-to-depth by 2, then an orthogonal ``kernel_size`` conv to
    ``channels[i]`` channels (None: 4x the block's input channels, no reduction;
    at most that). ``width``: the widths of the orthogonal dense hidden layers
    (int or list; non-increasing, at most the flattened conv output).
    ``orthogonal``: method of the dense hidden layers (``make_orthogonal``; None
    leaves them free, which gives up the exact orthogonality);
    ``orthogonal_output``: make the output layer orthogonal too. ``init_scale``:
    conv kernel init scale (``OrthogonalConv2d``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        in_shape: Sequence[int] | None = None,
        channels: int | Sequence[int] | None = None,
        kernel_size: int = 3,
        width: int | Sequence[int] = 32,
        activation: str = "tanh",
        dropout: float = 0.0,
        bias: bool = True,
        orthogonal: str | None = "expm",
        orthogonal_iters: int = DEFAULT_BJORCK_ITERS,
        orthogonal_output: bool = False,
        init_scale: float = 1.0,
    ):
        super().__init__()
        positive_int("out_features", out_features)
        _check_method(orthogonal)
        self.in_shape = shape = infer_image_shape(in_features, in_shape)
        layers = []
        for i, out_channels in enumerate(_channels_list(channels, 2)):
            lifted = space_to_depth_shape(shape)
            out_channels = lifted[0] if out_channels is None else out_channels
            if out_channels > lifted[0]:
                raise ModelConfigError(
                    f"conv layer {i + 1}: channels {out_channels} > {lifted[0]} input channels after "
                    f"space-to-depth (C_out > C_in would widen; orthogonality needs non-increasing width)"
                )
            layers.append(OrthoConvBlock(shape, out_channels, kernel_size, downsample=1, bias=bias,
                                         init_scale=init_scale))
            shape = layers[-1].out_shape
        widths = [width] if isinstance(width, int) else list(width)
        if not widths:
            raise ModelConfigError("width must list at least one dense hidden width")
        previous = math.prod(shape)
        for w in widths:
            positive_int("width", w)
            if w > previous:
                raise ModelConfigError(
                    f"dense hidden widths must be non-increasing and at most the flattened conv output "
                    f"{math.prod(shape)}, got {widths}"
                )
            previous = w
        layers.append(FlattenLinear(shape, widths[0], bias=bias, orthogonal=orthogonal,
                                    orthogonal_iters=orthogonal_iters))
        for w_in, w_out in zip(widths[:-1], widths[1:], strict=True):
            layers.append(FlattenLinear(w_in, w_out, bias=bias, orthogonal=orthogonal,
                                        orthogonal_iters=orthogonal_iters))
        layers.append(FlattenLinear(widths[-1], out_features, bias=bias,
                                    orthogonal=orthogonal if orthogonal_output else None,
                                    orthogonal_iters=orthogonal_iters))
        self._finish(layers, activation, dropout)


class OrthoConvNet(_OrthoStack):
    """All-orthogonal conv stack: ``depth`` orthogonal convs at constant shape, dense output.

    The first conv block does ``space_to_depth`` space-to-depth steps (factor 2)
    first, and maps to ``channels`` channels (None: all the lifted channels; at
    most that); the other ``depth - 1`` convs keep the shape. The output layer is
    a free ``FlattenLinear`` (``orthogonal_output``: made orthogonal with
    ``orthogonal``, default "expm").
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        in_shape: Sequence[int] | None = None,
        depth: int = 4,
        channels: int | None = None,
        kernel_size: int = 3,
        space_to_depth: int = 1,
        activation: str = "tanh",
        dropout: float = 0.0,
        bias: bool = True,
        orthogonal: str | None = "expm",
        orthogonal_iters: int = DEFAULT_BJORCK_ITERS,
        orthogonal_output: bool = False,
        init_scale: float = 1.0,
    ):
        super().__init__()
        positive_int("out_features", out_features)
        positive_int("depth", depth)
        _check_method(orthogonal)
        if isinstance(space_to_depth, bool) or not isinstance(space_to_depth, int) or space_to_depth < 0:
            raise ModelConfigError(f"space_to_depth must be an integer >= 0, got {space_to_depth!r}")
        self.in_shape = shape = infer_image_shape(in_features, in_shape)
        lifted = shape
        for _ in range(space_to_depth):
            lifted = space_to_depth_shape(lifted)
        if channels is None:
            channels = lifted[0]
        positive_int("channels", channels)
        if channels > lifted[0]:
            raise ModelConfigError(
                f"channels {channels} > {lifted[0]} input channels after space-to-depth "
                f"(C_out > C_in would widen; orthogonality needs non-increasing width)"
            )
        layers = [OrthoConvBlock(shape, channels, kernel_size, downsample=space_to_depth, bias=bias,
                                 init_scale=init_scale)]
        for _ in range(depth - 1):
            layers.append(OrthoConvBlock(layers[-1].out_shape, channels, kernel_size, downsample=0, bias=bias,
                                         init_scale=init_scale))
        layers.append(FlattenLinear(layers[-1].out_shape, out_features, bias=bias,
                                    orthogonal=orthogonal if orthogonal_output else None,
                                    orthogonal_iters=orthogonal_iters))
        self._finish(layers, activation, dropout)
