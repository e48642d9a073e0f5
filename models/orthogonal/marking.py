r"""Marking a layer orthogonal with one of the methods (``make_orthogonal``), reading which method keeps it so
(``orthogonal_method``) and how far it is (``orthogonality_error``); the convention: ``models.orthogonal``."""

from __future__ import annotations

from dataclasses import dataclass

import geotorch
import torch
from geotorch.so import SO, cayley_map
from torch import Tensor, nn
from torch.nn.utils import parametrize

from gradengines.models.errors import ModelConfigError
from gradengines.models.orthogonal.projection import (
    _MARK,
    DEFAULT_BJORCK_ITERS,
    MAX_BJORCK_ITERS,
    Projection,
    _is_wide,
    polar,
)

__all__ = ["METHODS", "PARAMETRIZED_METHODS", "PROJECTED_METHODS", "RETRACTED_METHODS", "Retraction",
           "make_orthogonal", "orthogonal_method", "orthogonality_error"]

METHODS = ("expm", "cayley", "bjorck", "polar", "retraction")
PARAMETRIZED_METHODS = ("expm", "cayley")
PROJECTED_METHODS = ("bjorck", "polar")
RETRACTED_METHODS = ("retraction",)

_TRIVS = {"expm": torch.linalg.matrix_exp, "cayley": cayley_map}


@dataclass(frozen=True)
class Retraction:
    """Marker of a retracted layer: its SGD step is a Cayley retraction (``models.orthogonal.retraction``)."""

    method: str = "retraction"


def _geotorch_triv(module: nn.Module) -> str | None:
    """Name of the trivialization if ``module.weight`` is a geotorch orthogonal map."""
    if not parametrize.is_parametrized(module, "weight"):
        return None
    plist = module.parametrizations.weight
    if len(plist) != 1 or not isinstance(plist[0], SO):  # Stiefel subclasses SO
        return None
    for name, fn in _TRIVS.items():
        if plist[0].triv is fn:
            return name
    return None


def orthogonal_method(module: nn.Module) -> str | None:
    """Method that keeps ``module.weight`` orthogonal (one of METHODS), None if none."""
    mark = getattr(module, _MARK, None)
    if isinstance(mark, (Projection, Retraction)):
        return mark.method
    return _geotorch_triv(module)


def _fork_rng_for(t: Tensor):
    if t.device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    index = t.device.index
    if index is None:
        index = getattr(torch, t.device.type).current_device()
    return torch.random.fork_rng(devices=[index], device_type=t.device.type)


def make_orthogonal(module: nn.Module, method: str | None, *, iters: int = DEFAULT_BJORCK_ITERS) -> nn.Module:
    r"""Make the 2-D ``weight`` of ``module`` orthogonal with ``method``; return ``module``.

    Target (``W`` of shape ``(out, in)``): :math:`W W^\top = I` if out <= in,
    :math:`W^\top W = I` otherwise.

    * ``None``: module returned unchanged.
    * ``"expm"`` / ``"cayley"``: ``geotorch.orthogonal(module, "weight", triv=method)``;
      the trainable tensor becomes ``module.parametrizations.weight.original``
      (see :func:`trainable_weight`). The class of ``module`` changes (torch's
      parametrize); save ``state_dict()``, not pickled modules.
    * ``"bjorck"`` / ``"polar"``: ``module.weight`` stays the Parameter, a
      :class:`Projection` ``(method, iters)`` marker is attached, and
      :func:`project_` must run after every optimizer step.
    * ``"retraction"``: ``module.weight`` stays the Parameter, a :class:`Retraction`
      marker is attached, and the SGD step on it must be a Cayley retraction
      (``models.orthogonal.retraction.CayleyRetraction``; the Trainer does it).

    In every case the weight is first set to :math:`\operatorname{polar}(W_0)`
    of its current value :math:`W_0` (so the starting weight does not depend on
    the method); geotorch's own random sample is discarded and the global RNG
    is left untouched. ``iters`` (>= 1) is the most Björck iterations per
    projection (fewer when the deviation allows, :func:`project_weights_`); it is
    validated for every method but only used by ``"bjorck"``.

    Calling it again with the same method and iters is a no-op; a different
    method on an already orthogonal layer, an unknown method, ``iters < 1`` or a
    weight that is not a 2-D Parameter raise :class:`ModelConfigError`.
    """
    if method is not None and method not in METHODS:
        raise ModelConfigError(
            f"unknown orthogonal method {method!r}; expected one of None, {', '.join(map(repr, METHODS))}"
        )
    if not isinstance(iters, int) or isinstance(iters, bool) or not 1 <= iters <= MAX_BJORCK_ITERS:
        raise ModelConfigError(f"orthogonal iters must be an int from 1 to {MAX_BJORCK_ITERS}, got {iters!r} (from "
                               f"a near-orthogonal weight Björck converges in 3-6; more is only time)")
    if method is None:
        return module

    current = orthogonal_method(module)
    if current is not None:
        mark = getattr(module, _MARK, None)
        if current == method and (not isinstance(mark, Projection) or mark.iters == iters):
            return module
        raise ModelConfigError(
            f"{type(module).__name__} is already orthogonal with method {current!r}; cannot switch to {method!r}"
        )
    if parametrize.is_parametrized(module, "weight"):
        raise ModelConfigError(
            f"{type(module).__name__}.weight already carries another parametrization; "
            f"expected a plain 2-D weight Parameter for method {method!r}"
        )
    weight = getattr(module, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 2:
        got = "none" if weight is None else f"{type(weight).__name__} of shape {tuple(weight.shape)}"
        raise ModelConfigError(
            f"orthogonal method {method!r} needs a 2-D `weight` Parameter on {type(module).__name__}, got {got}"
        )

    with torch.no_grad():  # in float64: a float32 SVD leaves ~1e-5 of error at width 1024, this ~1e-7
        Q = polar(weight.detach().to(torch.float64)).to(weight.dtype)

    if method in PARAMETRIZED_METHODS:
        with _fork_rng_for(weight):
            geotorch.orthogonal(module, "weight", triv=method)
            with torch.no_grad():
                # right_inverse: base <- Q (completed to square), original <- 0
                module.weight = Q
    else:
        with torch.no_grad():
            weight.copy_(Q)
        setattr(module, _MARK, Retraction() if method in RETRACTED_METHODS else Projection(method, iters))
    return module


@torch.no_grad()
def orthogonality_error(obj: Tensor | nn.Module) -> float:
    r"""Distance from orthogonality.

    For a tensor ``W`` of shape ``(..., m, n)``: the spectral norm of the Gram
    matrix on the smaller side minus the identity,

    .. math::  \lVert W W^\top - I_m \rVert_2 \ (m \le n), \qquad
               \lVert W^\top W - I_n \rVert_2 \ (m > n),

    (maximum over leading dimensions), computed in float64 (a diagnostic: the
    exact error of the stored values, not the rounding of the check; costs one
    float64 Gram + symmetric eigenvalue solve per layer).
    For a module: the maximum over all its submodules (itself included) whose
    weight is kept orthogonal by this module's methods; 0.0 if there are none.
    A weight with a NaN or infinite entry gives ``inf`` (so a diverged layer
    cannot hide in the maximum).
    """
    if isinstance(obj, nn.Module):
        err = 0.0
        for module in obj.modules():
            if orthogonal_method(module) is not None:
                err = max(err, orthogonality_error(module.weight))
        return err
    W = obj.detach().to(torch.float64)
    if W.dim() < 2:
        raise ValueError(f"orthogonality_error: need a matrix, got shape {tuple(W.shape)}")
    if not torch.isfinite(W).all():
        return float("inf")
    gram = W @ W.mT if _is_wide(W) else W.mT @ W
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    return torch.linalg.eigvalsh(gram - eye).abs().max().item()
