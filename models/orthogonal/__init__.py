r"""Making layers orthogonal and keeping them so.

Three families behind one switch, ``method in (None, "expm", "cayley", "bjorck", "polar", "retraction")``:

* **parametrized** (``"expm"``, ``"cayley"``): geotorch's ``orthogonal`` constraint.
  ``module.weight`` becomes a computed tensor :math:`W = B\,\phi(A)` (first ``k``
  columns, transposed for wide matrices) with :math:`B` a buffer (the base point),
  :math:`A` the skew-symmetric matrix built from the trainable tensor
  ``module.parametrizations.weight.original`` and :math:`\phi` either
  :math:`\exp(A)` or the Cayley map :math:`(I - A/2)^{-1}(I + A/2)`.
  The weight is orthogonal by construction at every step.
* **projected** (``"bjorck"``, ``"polar"``): ``module.weight`` stays the plain
  :class:`~torch.nn.Parameter`; the module carries a frozen :class:`Projection`
  marker and :func:`project_` must be called after each optimizer step to
  restore orthogonality *in place* (``weight.copy_``), so the Parameter object,
  the optimizer's ``param_groups`` and its state (Adam moments, momentum
  buffers) stay attached to it.

Convention for a rectangular weight :math:`W` of shape ``(out, in)``:
"orthogonal" means **rows orthonormal if out <= in** (:math:`W W^\top = I_{out}`)
and **columns orthonormal if out > in** (:math:`W^\top W = I_{in}`), i.e. the
Gram matrix on the *smaller* side is the identity. This is geotorch's convention
too, and every function here uses it.

Initialization when a layer is marked: for **all four methods** the weight is set
to the polar factor :math:`U V^\top` of its current value (the nearest
semi-orthogonal matrix in Frobenius norm), so the same seed gives the same
starting weights whatever the method. geotorch's own registration overwrites the
weight with a Haar-random sample (and consumes the global RNG); here that sample
is discarded and registration runs under a forked RNG, so marking a layer never
changes the global random stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import geotorch
import torch
from geotorch.so import SO, cayley_map
from torch import Tensor, nn
from torch.nn.utils import parametrize

from models.errors import ModelConfigError

__all__ = [
    "METHODS",
    "PARAMETRIZED_METHODS",
    "PROJECTED_METHODS",
    "Projection",
    "Retraction",
    "RETRACTED_METHODS",
    "make_orthogonal",
    "orthogonal_method",
    "bjorck",
    "polar",
    "project_",
    "projected_weights",
    "project_weights_",
    "gram_deviation_bound",
    "next_deviation_bound",
    "BJORCK_TOL",
    "DEFAULT_BJORCK_ITERS",
    "orthogonality_error",
    "has_parametrized_weight",
    "trainable_weight",
    "route_weight_grad",
]

METHODS = ("expm", "cayley", "bjorck", "polar", "retraction")
PARAMETRIZED_METHODS = ("expm", "cayley")
PROJECTED_METHODS = ("bjorck", "polar")
RETRACTED_METHODS = ("retraction",)
MAX_BJORCK_ITERS = 100  # iterations per projection that a setting may ask for
# the default cap of a projection's Björck iterations: from a Gram deviation bound of 0.9 (an Adam step at lr 1e-3
# on a width-1024 layer leaves about 0.6) to float32's BJORCK_TOL takes 7; a small step takes 1 or 2 (issue 32)
DEFAULT_BJORCK_ITERS = 8
_POWER_STEPS, _POWER_VECTORS = 4, 4  # gram_deviation_bound's block power iteration
# Gram matrices this large are measured after every iteration; smaller ones once, then the bound predicts (on 2 CPU
# threads a measurement cost more than the iteration it could save at width 256, less at 1024)
_MEASURED_SIZE = 512
# the Gram deviation a projection stops at: float32 1e-6, a tenth of the 1e-5 training must keep (issue 32), and
# float64 1e-13, both above their dtype's rounding floor at width 1024; fewer Björck iterations when the step left
# less to remove
BJORCK_TOL = {torch.float32: 1e-6, torch.float64: 1e-13}

_MARK = "_orthogonal_projection"  # attribute holding the Projection marker
_TRIVS = {"expm": torch.linalg.matrix_exp, "cayley": cayley_map}


@dataclass(frozen=True)
class Projection:
    """Marker of a projected layer: which projection :func:`project_` applies."""

    method: str  # "bjorck" or "polar"
    iters: int = DEFAULT_BJORCK_ITERS  # at most this many Björck iterations per projection (unused by "polar")


@dataclass(frozen=True)
class Retraction:
    """Marker of a retracted layer: its SGD step is a Cayley retraction (``models.orthogonal.retraction``)."""

    method: str = "retraction"


# --------------------------------------------------------------------------- #
# Pure functions
# --------------------------------------------------------------------------- #
def _is_wide(W: Tensor) -> bool:
    """True if rows are the smaller side (out <= in): the target is W W^T = I."""
    return W.shape[-2] <= W.shape[-1]


def _compute_dtype(W: Tensor) -> torch.dtype:
    # half / bfloat16 are too coarse for the iteration and unsupported by SVD on CPU
    return W.dtype if W.dtype in (torch.float32, torch.float64) else torch.float32


def bjorck(W: Tensor, iters: int) -> Tensor:
    r"""Order-1 Björck (Newton–Schulz) orthonormalization, ``iters`` iterations.

    .. math::  W \leftarrow W\,(\tfrac32 I - \tfrac12 W^\top W)
               \;=\; (\tfrac32 I - \tfrac12 W W^\top)\,W

    The two forms are the same matrix; the one with the smaller Gram matrix is
    used (``W W^T`` of size out x out when out <= in, else ``W^T W``), so one
    iteration costs two matmuls, :math:`O(\min(m,n)^2 \max(m,n))`.

    Each singular value maps as :math:`s \mapsto \tfrac32 s - \tfrac12 s^3`
    (singular vectors unchanged), so the iteration converges to the polar factor
    :math:`U V^\top` **iff every singular value lies in** :math:`(0, \sqrt3)`;
    near 1 it is quadratic (:math:`1+\varepsilon \mapsto 1 - \tfrac32\varepsilon^2
    - \tfrac12\varepsilon^3`; measured in float64 from a relative spectral
    perturbation of 0.1: error 3e-8 after 3 iterations; from 0.2: 4 iterations
    to 5e-11; from 0.4: 5-6 iterations) and small singular values only
    grow by x1.5 per iteration. Outside the interval: :math:`s = \sqrt3` maps
    to 0 (rank lost), :math:`s \in (\sqrt3, \sqrt5)` changes sign (the limit,
    if any, is orthogonal but not the polar factor), :math:`s > \sqrt5` diverges.
    No rescaling (spectral norm, SVD, power iteration) is done: the input is
    assumed near-orthogonal, which
    holds after a small optimizer step from an orthogonal matrix. For an
    arbitrary matrix, divide by an upper bound of its spectral norm first (e.g.
    the Frobenius norm) and use more iterations, or use :func:`polar`.

    Pure: ``W`` is not modified. Batched over leading dimensions. half/bfloat16
    inputs are computed in float32 and cast back.
    """
    if not isinstance(iters, int) or isinstance(iters, bool) or iters < 0:
        raise ValueError(f"bjorck: iters must be an int >= 0, got {iters!r}")
    if W.dim() < 2:
        raise ValueError(f"bjorck: need a matrix (..., m, n), got shape {tuple(W.shape)}")
    out_dtype = W.dtype
    X = W.to(_compute_dtype(W))
    for _ in range(iters):
        X = _bjorck_step(X, _gram(X))
    if iters == 0:
        X = X.clone()
    return X.to(out_dtype)


def _gram(X: Tensor) -> Tensor:
    """The Gram matrix on the smaller side: ``X X^T`` if out <= in, else ``X^T X``."""
    return X @ X.mT if _is_wide(X) else X.mT @ X


def _bjorck_step(X: Tensor, gram: Tensor) -> Tensor:
    """One Björck iteration from ``gram = _gram(X)``: ``(3/2 I - 1/2 gram) X`` (or ``X (...)`` for tall X)."""
    if X.dim() == 2:
        return torch.addmm(X, gram, X, beta=1.5, alpha=-0.5) if _is_wide(X) else torch.addmm(X, X, gram, beta=1.5,
                                                                                                 alpha=-0.5)
    return X * 1.5 - 0.5 * (gram @ X if _is_wide(X) else X @ gram)


def gram_deviation_bound(gram: Tensor) -> Tensor:
    r"""An estimate from above of :math:`\lVert G - I\rVert_2` for a symmetric Gram matrix ``G`` (what
    :func:`orthogonality_error` measures), one per matrix over leading dimensions: 1.5 times a block power
    iteration's estimate (4 products of :math:`G - I` with 4 vectors from a fixed random start; that estimate is
    at most the norm, and measured at 0.85-0.98 of it on dense, sign and low-rank deviations at widths 128 and
    1024). Four passes over G, O(m^2) beside the Gram matrix's O(m^2 n) (rigorous bounds such as the Frobenius
    norm overestimate a dense deviation up to 16x at width 1024: two Björck iterations more); the global RNG is
    not touched."""
    V = _power_start(tuple(gram.shape[:-1]), gram.dtype, gram.device)
    for _ in range(_POWER_STEPS):
        V = torch.nn.functional.normalize(torch.baddbmm(V, gram, V, beta=-1) if gram.dim() == 3 else
                                          torch.addmm(V, gram, V, beta=-1), dim=-2)
    return 1.5 * (gram @ V - V).norm(dim=-2).amax(-1)


_POWER_STARTS: dict[tuple, Tensor] = {}


def _power_start(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """The power iteration's fixed random start ``(*shape, _POWER_VECTORS)``, drawn once per shape from its own
    generator (the global RNG untouched)."""
    key = (shape, dtype, device)
    if key not in _POWER_STARTS:
        start = torch.Generator(device=device).manual_seed(0)
        _POWER_STARTS[key] = torch.randn(*shape, _POWER_VECTORS, generator=start, dtype=dtype, device=device)
    return _POWER_STARTS[key]


def _deviation_bounds(grams: dict[int, Tensor]) -> dict[int, float]:
    """:func:`gram_deviation_bound` of each Gram matrix (a stacked group's: the largest of its layers), the 2-D ones
    of one shape stacked into one call (per call the small products cost less than the operators' overhead on
    the CPU), all read in one host synchronisation."""
    batches: dict[tuple, list[int]] = {}
    for i, g in grams.items():
        batches.setdefault((tuple(g.shape), g.dtype, g.device) if g.dim() == 2 else (i,), []).append(i)
    keys, values = [], []
    for idxs in batches.values():
        if grams[idxs[0]].dim() == 2:
            keys += idxs
            values.append(gram_deviation_bound(torch.stack([grams[i] for i in idxs])).to(torch.float64))
        else:
            keys.append(idxs[0])
            values.append(gram_deviation_bound(grams[idxs[0]]).amax().reshape(1).to(torch.float64))
    if not values:
        return {}
    return dict(zip(keys, torch.cat([v.to(values[0].device) for v in values]).tolist(), strict=True))


def next_deviation_bound(deviation: float) -> float:
    r"""A bound of the Gram deviation after one Björck iteration from a matrix whose deviation is at most
    ``deviation``: the iteration maps each Gram eigenvalue :math:`1 + \delta` to
    :math:`(1+\delta)(1-\delta/2)^2 = 1 - \tfrac34\delta^2 + \tfrac14\delta^3`, so :math:`d` becomes at most
    :math:`\tfrac34 d^2 + \tfrac14 d^3` (monotone in d; the cubic term is a shrunk singular value's, which grows
    only 1.5x per iteration). From 1 on it does not contract: ``inf``."""
    return 0.75 * deviation**2 + 0.25 * deviation**3 if deviation < 1 else math.inf


def polar(W: Tensor) -> Tensor:
    r"""Orthogonal polar factor: with the thin SVD :math:`W = U \Sigma V^\top`,

    .. math::  \operatorname{polar}(W) = U V^\top
               = \arg\min_{Q:\ Q \text{ semi-orthogonal}} \lVert W - Q \rVert_F .

    Exact nearest (semi-)orthogonal matrix in Frobenius norm (unique if W has full
    rank). Cost: one SVD, :math:`O(\min(m,n)^2 \max(m,n))` but with a large
    constant and poor GPU throughput. Pure; batched over leading dimensions.
    """
    if W.dim() < 2:
        raise ValueError(f"polar: need a matrix (..., m, n), got shape {tuple(W.shape)}")
    out_dtype = W.dtype
    U, _, Vh = torch.linalg.svd(W.to(_compute_dtype(W)), full_matrices=False)
    return (U @ Vh).to(out_dtype)


# --------------------------------------------------------------------------- #
# Marking modules
# --------------------------------------------------------------------------- #
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


# --------------------------------------------------------------------------- #
# Keeping projected layers orthogonal
# --------------------------------------------------------------------------- #
@torch.no_grad()
def project_(model: nn.Module) -> list[int]:
    r"""Project every projected layer of ``model`` back onto the orthogonal set, in place.

    For each module with a :class:`Projection` marker:
    ``weight.copy_(bjorck(weight, k))`` (see :func:`bjorck`,
    :math:`W \leftarrow W(\tfrac32 I - \tfrac12 W^\top W)` repeated) with the
    ``k <= iters`` iterations its measured deviation needs (none when it is
    already within :data:`BJORCK_TOL`: any optimizer's step, SGD, momentum,
    Adam or AdamW, pays only what it moved the weight off the manifold), or
    ``weight.copy_(polar(weight))`` (:math:`W \leftarrow U V^\top`).
    Weights of the same method, iters, shape, dtype and device are stacked and
    projected with one batched call on an accelerator; on the CPU each weight
    alone, with its own iteration count. Parameter objects (and so the optimizer's
    param_groups and state) are unchanged. Parametrized (geotorch) layers are
    orthogonal by construction and skipped; a model without projected layers
    is a no-op. Call it after every ``optimizer.step()``. Returns the Björck
    iterations run per group (:func:`project_weights_`).
    """
    return project_weights_(projected_weights(model))


def projected_weights(model: nn.Module) -> list[tuple[Tensor, Projection]]:
    """``(weight, marker)`` of every projected layer of ``model``, in module order, tied weights once."""
    found, seen = [], set()
    for module in model.modules():
        mark = getattr(module, _MARK, None)
        if isinstance(mark, Projection) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            found.append((module.weight, mark))
    return found


@torch.no_grad()
def project_weights_(entries: list[tuple[Tensor, Projection]]) -> list[int]:
    """Project the given ``(weight, marker)`` pairs in place (see :func:`project_`), one batched
    call per (method, iters, shape, dtype, device) on an accelerator, one call per weight on the CPU.

    Björck runs as many iterations as each group needs to reach :data:`BJORCK_TOL` of its compute dtype, at most
    ``iters``: every group's Gram matrix (which its next iteration uses anyway) is measured
    (:func:`gram_deviation_bound`; all groups read in one host synchronisation per iteration), a group within the
    tolerance stops, and an iteration that :func:`next_deviation_bound` shows to be the last is not measured after;
    a Gram matrix smaller than ``_MEASURED_SIZE`` is measured once and then runs the iterations the bound predicts.
    Returns the Björck iterations run per group (0 for a polar group)."""
    groups: dict[tuple, list[Tensor]] = {}
    for w, mark in entries:  # on the CPU one by one: its batched matmuls ran 15-20% slower than a loop of them
        one_by_one = id(w) if w.device.type == "cpu" else None
        groups.setdefault((mark.method, mark.iters, tuple(w.shape), w.dtype, w.device, one_by_one), []).append(w)
    stacks = [(method, iters, weights, weights[0] if len(weights) == 1 else torch.stack(weights))
              for (method, iters, *_), weights in groups.items()]
    done = [0] * len(stacks)
    results = {i: polar(X) for i, (method, _, _, X) in enumerate(stacks) if method == "polar"}
    current = {i: X.to(_compute_dtype(X)) for i, (method, _, _, X) in enumerate(stacks) if method == "bjorck"}
    grams = {i: _gram(Y) for i, Y in current.items()}
    while grams:
        deviations = _deviation_bounds(grams)
        for i, gram in list(grams.items()):
            d, cap = deviations[i], stacks[i][1]
            del grams[i]
            if d <= BJORCK_TOL[gram.dtype] or done[i] == cap:
                continue
            current[i], done[i] = _bjorck_step(current[i], gram), done[i] + 1
            d = next_deviation_bound(d)
            if gram.shape[-1] >= _MEASURED_SIZE:  # measured again: an iteration costs more than a measurement
                if d > BJORCK_TOL[gram.dtype] and done[i] < cap:
                    grams[i] = _gram(current[i])
            else:  # small: the iterations the first measurement predicts, no more host reads
                while d > BJORCK_TOL[gram.dtype] and done[i] < cap:
                    current[i], done[i] = _bjorck_step(current[i], _gram(current[i])), done[i] + 1
                    d = next_deviation_bound(d)
            results[i] = current[i]
    for i, P in results.items():
        weights, X = stacks[i][2], stacks[i][3]
        if len(weights) == 1:
            weights[0].copy_(P.to(X.dtype))
        else:
            for w, p in zip(weights, P.unbind(0), strict=True):
                w.copy_(p.to(X.dtype))
    return done


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


# --------------------------------------------------------------------------- #
# Gradients for engines that compute dLoss/dW themselves
# --------------------------------------------------------------------------- #
def has_parametrized_weight(module: nn.Module) -> bool:
    """``parametrize.is_parametrized(module, "weight")``, with a dict lookup first: a parametrized module holds
    its ``parametrizations`` in ``_modules``, and on a plain module ``is_parametrized`` costs 1.6 us (an
    attribute miss), paid per layer and step by the forward-only engines (issue 32)."""
    return "parametrizations" in module._modules and parametrize.is_parametrized(module, "weight")


def trainable_weight(module: nn.Module) -> nn.Parameter:
    """The Parameter an optimizer updates for ``module``'s weight.

    ``module.parametrizations.weight.original`` for a parametrized weight
    (geotorch "expm"/"cayley"), else ``module.weight``.
    """
    if parametrize.is_parametrized(module, "weight"):
        return module.parametrizations.weight.original
    w = getattr(module, "weight", None)
    if not isinstance(w, nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no `weight` Parameter")
    return w


def route_weight_grad(module: nn.Module, G: Tensor) -> Tensor:
    r"""Write a weight-space gradient :math:`G = \partial L / \partial W` into the
    trainable tensor's ``.grad``, **overwriting** it (no accumulation); return it.

    * plain / projected layers: ``weight.grad = G`` (detached, cast to the
      weight's dtype/device; no copy when they already match, so do not mutate
      ``G`` afterwards).
    * geotorch layers, :math:`W = f(\theta)` with :math:`\theta` =
      ``parametrizations.weight.original``: one local vector–Jacobian product
      through the parametrization only,

      .. math::  \theta.\mathrm{grad} = J_f(\theta)^\top G
                 = \texttt{autograd.grad}(f(\theta), \theta, G),

      which equals :math:`\partial L/\partial\theta` for any loss that depends
      on :math:`\theta` only through :math:`W`. Inside ``parametrize.cached()``
      whose W was first computed with its graph (``trainers.engines.weights_once``),
      the product runs through that graph: W is evaluated once per step, as in
      backprop; otherwise f is evaluated here, once, so this works inside
      ``torch.no_grad()`` too.

    ``G.shape != weight.shape`` raises ValueError.
    """
    theta = trainable_weight(module)
    parametrized = parametrize.is_parametrized(module, "weight")
    with torch.enable_grad():
        W = module.weight  # the cached W inside parametrize.cached(), else f(original) now, with its graph
        if parametrized and W.grad_fn is None:  # cached without a graph: f afresh, bypassing the cache
            W = module.parametrizations.weight()
    if tuple(G.shape) != tuple(W.shape):
        raise ValueError(
            f"route_weight_grad: gradient shape {tuple(G.shape)} != weight shape {tuple(W.shape)} "
            f"of {type(module).__name__}"
        )
    G = G.detach().to(dtype=theta.dtype, device=theta.device)
    if parametrized:  # a cached W's graph lives as long as the cache: another product through it stays possible
        (grad,) = torch.autograd.grad(W, theta, grad_outputs=G, retain_graph=True)
    else:
        grad = G
    theta.grad = grad
    return grad
