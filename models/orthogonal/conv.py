r"""Orthogonal convolutions and the other linear maps of the orthogonal CNNs.

Every module here is a linear map ``A`` (plus an optional bias ``b``) between
tensors of fixed shape, with

* ``forward(x) = A x + b``: ``(B, *in_shape) -> (B, *out_shape)``;
* ``adjoint(v) = A^T v`` (no bias): ``(B, *out_shape) -> (B, *in_shape)``, so that
  :math:`\langle A x, v\rangle = \langle x, A^\top v\rangle` up to rounding;
* ``is_orthogonal``: True when ``A A^T = I`` holds by construction (row-orthonormal
  operator, exact up to float rounding for every parameter value).

:class:`OrthogonalConv2d`: Cayley transform in the Fourier domain (Trockman &
Kolter, ICLR 2021), with circular padding. The unconstrained kernel
``weight`` of shape ``(C_out, C_in, k, k)`` (``C_out <= C_in``) is transformed
at every call, per spatial frequency :math:`\omega` of the ``(H, W)`` grid
(``rfft2``: ``H x (W//2 + 1)`` frequencies), into a ``C_out x C_in`` matrix with
orthonormal rows:

.. math::
    \hat K(\omega) = [U\ V] \ (U: C_{out}\times C_{out}),\qquad
    A = U - U^H + V V^H,\qquad
    Q(\omega) = (I + A)^{-1}\,[\,I - A,\ -2V\,].

Then :math:`Q Q^H = (I+A)^{-1}(I + 2P - S^2 + SP - PS + P^2)(I+A)^{-H} = I` with
:math:`S = U - U^H`, :math:`P = V V^H` (for ``C_out = C_in`` this is the plain
Cayley map :math:`(I+S)^{-1}(I-S)`, unitary). The kernel has real entries, so
:math:`Q(-\omega) = \overline{Q(\omega)}` and the operator
``irfft2(Q(w) rfft2(x)(w))`` is a real map with orthonormal rows; its adjoint
is ``irfft2(Q(w)^H rfft2(v)(w))``. The kernel's spectrum is computed with
explicit DFT matrices, so any kernel size works, also larger than the image
(it then wraps around, as a circular convolution does). A zero kernel gives
``Q = [I 0]``: the identity on the first ``C_out`` channels.

:class:`SpaceToDepth` (``pixel_unshuffle``) is a permutation of the entries,
so orthogonal with adjoint = inverse (``pixel_shuffle``); it lets a stack shrink
the spatial size without breaking orthogonality or widening.
:class:`FlattenLinear` is an ``nn.Linear`` (submodule ``linear``, so
``models.orthogonal.make_orthogonal`` and ``route_weight_grad`` apply) on the
flattened input. :class:`OrthoConvBlock` composes ``SpaceToDepth`` steps and an
``OrthogonalConv2d``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from gradengines.models.errors import ModelConfigError, positive_int
from gradengines.models.orthogonal import (
    DEFAULT_BJORCK_ITERS,
    PARAMETRIZED_METHODS,
    make_orthogonal,
    orthogonal_method,
    polar,
    trainable_weight,
)

__all__ = [
    "OrthogonalConv2d",
    "cached_symbols",
    "SpaceToDepth",
    "FlattenLinear",
    "OrthoConvBlock",
    "space_to_depth_shape",
]

_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_SYMBOLS: list[dict[int, Tensor]] = []  # the open cached_symbols() scopes' caches, innermost last


@contextlib.contextmanager
def cached_symbols():
    """Within: each :class:`OrthogonalConv2d` computes its symbol Q once (at its first call, with the graph to
    ``weight`` if grad is enabled then) and reuses it, as ``torch.nn.utils.parametrize.cached()`` does for
    parametrizations: a step that applies a layer several times (a forward-only engine's two passes and its
    local product) pays the Cayley solve once. ``weight`` must not change inside."""
    _SYMBOLS.append({})
    try:
        yield
    finally:
        _SYMBOLS.pop()


def _shape(name: str, value) -> tuple[int, ...]:
    try:
        shape = tuple(value)
    except TypeError:
        raise ModelConfigError(f"{name} must be a tuple of positive integers, got {value!r}") from None
    if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise ModelConfigError(f"{name} must be a tuple of positive integers, got {value!r}")
    return shape


def space_to_depth_shape(shape: Sequence[int], factor: int = 2) -> tuple[int, int, int]:
    """(C, H, W) -> (C * factor^2, H / factor, W / factor); ModelConfigError if H or W is not divisible."""
    c, h, w = shape
    if h % factor or w % factor:
        raise ModelConfigError(
            f"space-to-depth by {factor} needs H and W divisible by {factor}, got shape {tuple(shape)}"
        )
    return (c * factor * factor, h // factor, w // factor)


def _check_input(module: nn.Module, x: Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(x.shape[1:]) != shape:
        raise ValueError(
            f"{type(module).__name__}.{what} expects (B, {', '.join(map(str, shape))}), got {tuple(x.shape)}"
        )


# --------------------------------------------------------------------------- #
# Orthogonal convolution (Cayley transform in the Fourier domain)
# --------------------------------------------------------------------------- #
class OrthogonalConv2d(nn.Module):
    r"""Circular 2-D convolution made orthogonal by a Fourier-domain Cayley transform.

    ``(B, C_in, H, W) -> (B, C_out, H, W)`` with ``C_out <= C_in``; the linear part
    has orthonormal rows (an orthogonal operator when ``C_out == C_in``) for every
    value of the trainable kernel ``weight`` ``(C_out, C_in, k, k)``. See the module
    docstring for the construction. ``bias``: one per output channel (zeros at init).

    ``init_scale``: the kernel is drawn uniform in ``±init_scale / sqrt(C_in k^2)``
    (``nn.Conv2d``'s scale at 1); 0 gives the identity-like ``Q = [I 0]``.
    ``Q`` is recomputed from the current ``weight`` at every call, except inside
    :func:`cached_symbols` (once per scope).
    """

    is_orthogonal = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        spatial: Sequence[int],
        *,
        bias: bool = True,
        init_scale: float = 1.0,
    ):
        super().__init__()
        in_channels = positive_int("in_channels", in_channels)
        out_channels = positive_int("out_channels", out_channels)
        kernel_size = positive_int("kernel_size", kernel_size)
        spatial = _shape("spatial", spatial)
        if len(spatial) != 2:
            raise ModelConfigError(f"spatial must be (H, W), got {spatial!r}")
        if out_channels > in_channels:
            raise ModelConfigError(
                f"orthogonal conv needs out_channels <= in_channels (rows orthonormal, no widening), "
                f"got {in_channels} -> {out_channels}"
            )
        if isinstance(init_scale, bool) or not isinstance(init_scale, (int, float)) or init_scale < 0:
            raise ModelConfigError(f"init_scale must be a number >= 0, got {init_scale!r}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.spatial = spatial
        self.init_scale = float(init_scale)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = self.init_scale / math.sqrt(self.in_channels * self.kernel_size**2)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.zero_()

    @property
    def in_shape(self) -> tuple[int, int, int]:
        return (self.in_channels, *self.spatial)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return (self.out_channels, *self.spatial)

    @property
    def in_features(self) -> int:
        return math.prod(self.in_shape)

    @property
    def out_features(self) -> int:
        return math.prod(self.out_shape)

    def _dft_matrices(self, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
        """E_h (H, k) and E_w (W//2+1, k): exp(+2 pi i u (a - p) / N), p = k // 2 (centered kernel)."""
        H, W = self.spatial
        k = self.kernel_size
        offsets = torch.arange(k, dtype=torch.float64, device=device) - k // 2
        mats = []
        for n, freqs in ((H, torch.arange(H, dtype=torch.float64, device=device)),
                         (W, torch.arange(W // 2 + 1, dtype=torch.float64, device=device))):
            phase = (2 * math.pi / n) * torch.outer(freqs, offsets)  # (n_freq, k)
            mats.append(torch.polar(torch.ones_like(phase), phase).to(dtype))
        return mats[0], mats[1]

    def symbol(self) -> Tensor:
        r"""Q(ω): ``(H, W//2+1, C_out, C_in)`` complex, rows orthonormal at every frequency (inside
        :func:`cached_symbols`: computed once)."""
        if not _SYMBOLS:
            return self._symbol()
        cache = _SYMBOLS[-1]
        if id(self) not in cache:
            cache[id(self)] = self._symbol()
        return cache[id(self)]

    def _symbol(self) -> Tensor:
        w = self.weight
        if w.dtype not in _COMPLEX:
            raise TypeError(f"OrthogonalConv2d supports float32 and float64, got {w.dtype}")
        cdtype = _COMPLEX[w.dtype]
        E_h, E_w = self._dft_matrices(cdtype, w.device)
        # K^(u, v) = sum_{a,b} K[:, :, a, b] e^{2 pi i (u (a-p)/H + v (b-p)/W)}
        khat = torch.einsum("oiab,ua,vb->uvoi", w.to(cdtype), E_h, E_w)  # (H, W', C_out, C_in)
        co = self.out_channels
        U, V = khat[..., :co], khat[..., co:]
        A = U - U.mH + V @ V.mH  # square channels: V has no column, V V^H = 0
        eye = torch.eye(co, dtype=cdtype, device=w.device)
        rhs = torch.cat([eye - A, -2 * V], dim=-1)
        return torch.linalg.solve(eye + A, rhs)  # (H, W', C_out, C_in)

    def _spectral(self, x: Tensor, Q: Tensor, adjoint: bool) -> Tensor:
        H, W = self.spatial
        xhat = torch.fft.rfft2(x)  # (B, C, H, W')
        eq = "uvio,biuv->bouv" if adjoint else "uvoi,biuv->bouv"
        yhat = torch.einsum(eq, Q.conj() if adjoint else Q, xhat)
        return torch.fft.irfft2(yhat, s=(H, W))

    def forward(self, x: Tensor) -> Tensor:
        _check_input(self, x, self.in_shape, "forward")
        y = self._spectral(x, self.symbol(), adjoint=False)
        if self.bias is not None:
            y = y + self.bias[:, None, None]
        return y

    def adjoint(self, v: Tensor) -> Tensor:
        """A^T v, no bias: (B, C_out, H, W) -> (B, C_in, H, W)."""
        _check_input(self, v, self.out_shape, "adjoint")
        return self._spectral(v, self.symbol(), adjoint=True)

    @torch.no_grad()
    def orthogonality_error(self) -> float:
        """max over frequencies of ||Q Q^H - I||_2, computed in the parameters' precision."""
        Q = self.symbol()
        gram = Q @ Q.mH
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        return torch.linalg.matrix_norm(gram - eye, 2).max().item()

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"spatial={self.spatial}, bias={self.bias is not None}")


# --------------------------------------------------------------------------- #
# Permutation and dense layers
# --------------------------------------------------------------------------- #
class SpaceToDepth(nn.Module):
    """``pixel_unshuffle(x, factor)``: (B, C, H, W) -> (B, C f^2, H/f, W/f), a permutation.

    Orthogonal (square, A A^T = I); ``adjoint`` = inverse = ``pixel_shuffle``. No bias.
    ``in_shape`` is optional (only used for the shape attributes and checks).
    """

    is_orthogonal = True

    def __init__(self, factor: int = 2, in_shape: Sequence[int] | None = None):
        super().__init__()
        self.factor = positive_int("factor", factor)
        self._in_shape = None
        if in_shape is not None:
            in_shape = _shape("in_shape", in_shape)
            if len(in_shape) != 3:
                raise ModelConfigError(f"SpaceToDepth in_shape must be (C, H, W), got {in_shape!r}")
            space_to_depth_shape(in_shape, self.factor)
            self._in_shape = in_shape

    @property
    def in_shape(self):
        return self._in_shape

    @property
    def out_shape(self):
        return None if self._in_shape is None else space_to_depth_shape(self._in_shape, self.factor)

    def forward(self, x: Tensor) -> Tensor:
        if self._in_shape is not None:
            _check_input(self, x, self._in_shape, "forward")
        return F.pixel_unshuffle(x, self.factor)

    def adjoint(self, v: Tensor) -> Tensor:
        """A^T v = A^{-1} v = pixel_shuffle(v)."""
        if self._in_shape is not None:
            _check_input(self, v, self.out_shape, "adjoint")
        return F.pixel_shuffle(v, self.factor)

    def extra_repr(self) -> str:
        return f"factor={self.factor}" + ("" if self._in_shape is None else f", in_shape={self._in_shape}")


class FlattenLinear(nn.Module):
    """``linear(x.flatten(1))``: (B, *in_shape) -> (B, out_features).

    The weight is the ``nn.Linear`` submodule ``linear`` (so ``make_orthogonal``,
    ``route_weight_grad`` and ``orthogonal_method`` apply to ``layer.linear``);
    ``orthogonal`` in (None, "expm", "cayley", "bjorck", "polar") is passed to
    ``make_orthogonal`` (rows orthonormal when out_features <= prod(in_shape)).
    ``adjoint(v) = (v @ W).reshape(B, *in_shape)`` (no bias).
    """

    def __init__(
        self,
        in_shape: Sequence[int] | int,
        out_features: int,
        bias: bool = True,
        orthogonal: str | None = None,
        orthogonal_iters: int = DEFAULT_BJORCK_ITERS,
    ):
        super().__init__()
        self.in_shape = _shape("in_shape", (in_shape,) if isinstance(in_shape, int) else in_shape)
        out_features = positive_int("out_features", out_features)
        self.linear = nn.Linear(math.prod(self.in_shape), out_features, bias=bias)
        make_orthogonal(self.linear, orthogonal, iters=orthogonal_iters)

    @property
    def out_shape(self) -> tuple[int]:
        return (self.linear.out_features,)

    def _apply(self, fn, recurse=True):
        # A dtype change (model.double()) keeps the old precision's orthogonality
        # error (~1e-7 after float32): project the weight again in the new dtype.
        before = trainable_weight(self.linear).dtype
        out = super()._apply(fn, recurse)
        if trainable_weight(self.linear).dtype != before:
            self.reorthogonalize_()
        return out

    @torch.no_grad()
    def reorthogonalize_(self) -> None:
        """Set an orthogonal weight to its polar factor, in its current dtype (no-op if free).

        geotorch layers: base <- polar(W), trainable tensor <- 0 (same Parameter object);
        projected layers: ``weight.copy_(polar(W))``.
        """
        method = orthogonal_method(self.linear)
        weight = self.linear.weight
        if method is None or weight.dtype not in (torch.float32, torch.float64):
            return
        if method in PARAMETRIZED_METHODS:
            self.linear.weight = polar(weight)
        else:
            weight.copy_(polar(weight))

    @property
    def in_features(self) -> int:
        return self.linear.in_features

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[1:]) not in (self.in_shape, (self.linear.in_features,)):
            _check_input(self, x, self.in_shape, "forward")
        return self.linear(x.flatten(1))

    def adjoint(self, v: Tensor) -> Tensor:
        """W^T v, reshaped: (B, out_features) -> (B, *in_shape)."""
        return (v @ self.linear.weight).reshape(v.shape[0], *self.in_shape)

    def extra_repr(self) -> str:
        return f"in_shape={self.in_shape}"


class OrthoConvBlock(nn.Module):
    r"""``downsample`` SpaceToDepth steps (factor 2 each), then an :class:`OrthogonalConv2d`.

    ``(B, C, H, W) -> (B, out_channels, H / 2^d, W / 2^d)`` with
    ``out_channels <= C * 4^d`` (never widens). ``forward(x) = conv(S(x))`` (bias of
    the conv), ``adjoint(v) = S^T(conv^T(v))``: a composition of row-orthonormal maps,
    so row-orthonormal.
    """

    is_orthogonal = True

    def __init__(
        self,
        in_shape: Sequence[int],
        out_channels: int,
        kernel_size: int = 3,
        *,
        downsample: int = 1,
        bias: bool = True,
        init_scale: float = 1.0,
    ):
        super().__init__()
        in_shape = _shape("in_shape", in_shape)
        if len(in_shape) != 3:
            raise ModelConfigError(f"in_shape must be (C, H, W), got {in_shape!r}")
        if isinstance(downsample, bool) or not isinstance(downsample, int) or downsample < 0:
            raise ModelConfigError(f"downsample must be an integer >= 0, got {downsample!r}")
        self.in_shape = in_shape
        steps, shape = [], in_shape
        for _ in range(downsample):
            steps.append(SpaceToDepth(2, shape))
            shape = space_to_depth_shape(shape)
        self.downsample = nn.ModuleList(steps)
        self.conv = OrthogonalConv2d(shape[0], out_channels, kernel_size, shape[1:], bias=bias,
                                     init_scale=init_scale)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return self.conv.out_shape

    @property
    def in_features(self) -> int:
        return math.prod(self.in_shape)

    @property
    def out_features(self) -> int:
        return self.conv.out_features

    def forward(self, x: Tensor) -> Tensor:
        for step in self.downsample:
            x = step(x)
        return self.conv(x)

    def adjoint(self, v: Tensor) -> Tensor:
        """A^T v (no bias): (B, *out_shape) -> (B, *in_shape)."""
        v = self.conv.adjoint(v)
        for step in reversed(self.downsample):
            v = step.adjoint(v)
        return v

    def orthogonality_error(self) -> float:
        return self.conv.orthogonality_error()
