r"""Björck and polar projections onto the orthogonal matrices, and keeping projected layers orthogonal after
each optimizer step (``project_``); the convention and the methods: ``models.orthogonal``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["Projection", "bjorck", "polar", "project_", "projected_weights", "project_weights_",
           "gram_deviation_bound", "next_deviation_bound", "BJORCK_TOL", "DEFAULT_BJORCK_ITERS", "MAX_BJORCK_ITERS"]

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


@dataclass(frozen=True)
class Projection:
    """Marker of a projected layer: which projection :func:`project_` applies."""

    method: str  # "bjorck" or "polar"
    iters: int = DEFAULT_BJORCK_ITERS  # at most this many Björck iterations per projection (unused by "polar")



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
def project_weights_(entries: list[tuple[Tensor, Projection]], batched: bool | None = None) -> list[int]:
    """Project the given ``(weight, marker)`` pairs in place (see :func:`project_`), one batched
    call per (method, iters, shape, dtype, device) on an accelerator, one call per weight on the CPU
    (``batched``: True or False decides for every device; the tests run the batched path on the CPU).

    Björck runs as many iterations as each group needs to reach :data:`BJORCK_TOL` of its compute dtype, at most
    ``iters``: every group's Gram matrix (which its next iteration uses anyway) is measured
    (:func:`gram_deviation_bound`; all groups read in one host synchronisation per iteration), a group within the
    tolerance stops, and an iteration that :func:`next_deviation_bound` shows to be the last is not measured after;
    a Gram matrix smaller than ``_MEASURED_SIZE`` is measured once and then runs the iterations the bound predicts.
    Returns the Björck iterations run per group (0 for a polar group)."""
    groups: dict[tuple, list[Tensor]] = {}
    for w, mark in entries:  # on the CPU one by one: its batched matmuls ran 15-20% slower than a loop of them
        one_by_one = id(w) if (w.device.type == "cpu" if batched is None else not batched) else None
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
