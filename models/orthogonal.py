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

from dataclasses import dataclass
from typing import NamedTuple

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
    "cayley_retract",
    "cayley_retract_lowrank",
    "dense_drift",
    "LowRankCayley",
    "prepare_lowrank_cayley",
    "finish_lowrank_cayley",
    "orthogonality_error",
    "trainable_weight",
    "route_weight_grad",
]

METHODS = ("expm", "cayley", "bjorck", "polar", "retraction")
PARAMETRIZED_METHODS = ("expm", "cayley")
PROJECTED_METHODS = ("bjorck", "polar")
RETRACTED_METHODS = ("retraction",)
MAX_BJORCK_ITERS = 100  # iterations per projection that a setting may ask for

_MARK = "_orthogonal_projection"  # attribute holding the Projection marker
_TRIVS = {"expm": torch.linalg.matrix_exp, "cayley": cayley_map}


@dataclass(frozen=True)
class Projection:
    """Marker of a projected layer: which projection :func:`project_` applies."""

    method: str  # "bjorck" or "polar"
    iters: int = 3  # Björck iterations per projection (unused by "polar")


@dataclass(frozen=True)
class Retraction:
    """Marker of a retracted layer: its SGD step is a Cayley retraction (``models.retraction``)."""

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
    wide = _is_wide(X)
    two_d = X.dim() == 2
    for _ in range(iters):
        if wide:
            gram = X @ X.mT  # (m, m)
            X = torch.addmm(X, gram, X, beta=1.5, alpha=-0.5) if two_d else X * 1.5 - 0.5 * (gram @ X)
        else:
            gram = X.mT @ X  # (n, n)
            X = torch.addmm(X, X, gram, beta=1.5, alpha=-0.5) if two_d else X * 1.5 - 0.5 * (X @ gram)
    if iters == 0:
        X = X.clone()
    return X.to(out_dtype)


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


def make_orthogonal(module: nn.Module, method: str | None, *, iters: int = 3) -> nn.Module:
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
      (``models.retraction.CayleyRetraction``; the Trainer does it).

    In every case the weight is first set to :math:`\operatorname{polar}(W_0)`
    of its current value :math:`W_0` (so the starting weight does not depend on
    the method); geotorch's own random sample is discarded and the global RNG
    is left untouched. ``iters`` (>= 1) is the Björck iteration count per
    projection; it is validated for every method but only used by ``"bjorck"``.

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
def project_(model: nn.Module) -> None:
    r"""Project every projected layer of ``model`` back onto the orthogonal set, in place.

    For each module with a :class:`Projection` marker:
    ``weight.copy_(bjorck(weight, iters))`` (see :func:`bjorck`,
    :math:`W \leftarrow W(\tfrac32 I - \tfrac12 W^\top W)` repeated) or
    ``weight.copy_(polar(weight))`` (:math:`W \leftarrow U V^\top`).
    Weights of the same method, iters, shape, dtype and device are stacked and
    projected with one batched call. Parameter objects (and so the optimizer's
    param_groups and state) are unchanged. Parametrized (geotorch) layers are
    orthogonal by construction and skipped; a model without projected layers
    is a no-op. Call it after every ``optimizer.step()``.
    """
    project_weights_(projected_weights(model))


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
def project_weights_(entries: list[tuple[Tensor, Projection]]) -> None:
    """Project the given ``(weight, marker)`` pairs in place (see :func:`project_`), one batched
    call per (method, iters, shape, dtype, device)."""
    groups: dict[tuple, list[Tensor]] = {}
    for w, mark in entries:
        groups.setdefault((mark.method, mark.iters, tuple(w.shape), w.dtype, w.device), []).append(w)
    for (method, iters, _, _, _), weights in groups.items():
        X = weights[0] if len(weights) == 1 else torch.stack(weights)
        P = bjorck(X, iters) if method == "bjorck" else polar(X)
        if len(weights) == 1:
            weights[0].copy_(P)
        else:
            for w, p in zip(weights, P.unbind(0), strict=True):
                w.copy_(p)


# --------------------------------------------------------------------------- #
# The Cayley retraction of an SGD step (retracted layers)
# --------------------------------------------------------------------------- #
def _stiefel_frame(W: Tensor) -> tuple[Tensor, bool]:
    """``(X, transposed)``: X = W (out >= in) or W^T (out < in), so that X^T X = I with X tall or square."""
    return (W.mT, True) if W.shape[-2] < W.shape[-1] else (W, False)


def cayley_retract(W: Tensor, G: Tensor, lr: float, *, drifted: bool | None = None) -> Tensor:
    r"""The Cayley retraction of the SGD step ``W - lr G`` onto the orthogonal set (dense form).

    With :math:`X` = ``W`` (out >= in) or ``W^T`` (out < in), so that :math:`X^\top X = I`,
    :math:`G_X` the gradient in the same frame and :math:`\hat G = (I - \tfrac12 X X^\top) G_X`
    (Wen & Yin 2013, eq. 7 with the Euclidean metric, their section 3.1):

    .. math::  A = \hat G X^\top - X \hat G^\top, \qquad
               Y = (I + \tfrac{lr}{2} A)^{-1} (I - \tfrac{lr}{2} A)\, X
                 = X - lr\,(I + \tfrac{lr}{2} A)^{-1} A X .

    A is skew-symmetric, so the Cayley factor is orthogonal and :math:`Y^\top Y = I`
    up to rounding; :math:`\dot Y(0) = -A X = -[(I - X X^\top) G_X + X \operatorname{skew}(X^\top G_X)]`,
    the gradient projected on the tangent space: to first order in lr the step is SGD followed
    by a projection onto the orthogonal set (``bjorck``, ``polar``), so one learning rate means
    the same for both. (For a square W, :math:`\hat G = G/2`: the canonical-metric step at lr/2.)
    A weight decay term :math:`\lambda X` adds :math:`\tfrac{\lambda}{2}(X X^\top - X X^\top) = 0`
    to A: it has no effect on an orthogonal layer.
    The step keeps :math:`X^\top X` as it was; a drift from orthogonality above 64 eps (rms
    eigenvalue of :math:`X^\top X - I`; a float32 model moved to float64, say) is removed by one
    Björck iteration after it (``drifted``: that decision, when the caller read :func:`dense_drift` already;
    None: read here). Cost :math:`O(n^3)` (n = max(out, in)). Pure; returns the new weight.
    """
    X, transposed = _stiefel_frame(W)
    GX = G.mT if transposed else G
    GX = GX - 0.5 * (X @ (X.mT @ GX))  # the Euclidean metric's G^
    half = lr / 2
    A = GX @ X.mT
    A = A - A.mT  # G X^T - X G^T, (n, n)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    # Y = X - lr (I + lr/2 A)^{-1} A X: solving for the small increment (not for Y) keeps the
    # rounding relative to the step, so float32 weights do not drift away from orthogonality
    # (solve_ex without its error check: no host sync on a GPU; I + lr/2 A is invertible, A being skew)
    Y = X - torch.linalg.solve_ex(eye + half * A, A @ X).result.mul_(lr)
    Y = Y.mT if transposed else Y
    # the step keeps X^T X as it was; a drift above 64 eps (rms eigenvalue of X^T X - I) is removed
    return bjorck(Y, 1) if (bool(dense_drift(W) > 1) if drifted is None else drifted) else Y


def dense_drift(W: Tensor) -> Tensor:
    """The rms eigenvalue of X^T X - I over 64 eps, a 0-d tensor: above 1, :func:`cayley_retract` ends with one
    Björck iteration (``drifted``). O(n p^2)."""
    X, _ = _stiefel_frame(W)
    gram = X.mT @ X
    gram.diagonal().sub_(1)
    return gram.norm() / (_drift_tolerance(W) * gram.shape[-1] ** 0.5)


def _drift_tolerance(W: Tensor) -> float:
    """The drift from orthogonality (X^T X - I) a retraction step removes by one Björck iteration: 64 eps."""
    return 64 * torch.finfo(W.dtype).eps


def _drift_along(K: Tensor, QX: Tensor, columns: int = 16) -> Tensor:
    r"""A lower bound of :math:`\lVert X^\top X - I \rVert_2` from K = X Q_X on up to ``columns`` of the
    batch's vectors q: :math:`\lVert K_s^\top K_s - Q_s^\top Q_s \rVert_F / \lVert Q_s \rVert_F^2`,
    O(columns^2 n), the directions in which the drift would enter a step. A 0-d tensor (no host sync)."""
    k, q = K[..., :columns], QX[..., :columns]
    scale = q.square().sum()
    return (k.mT @ k - q.mT @ q).norm() / scale.clamp_min(torch.finfo(scale.dtype).tiny)


class LowRankCayley(NamedTuple):
    r"""One layer's low-rank Cayley step up to its :math:`2r \times 2r` solve (:func:`prepare_lowrank_cayley`).

    Frame ``X`` (a view of ``W``), :math:`P_X` (with the metric's correction), :math:`Q_X`, :math:`K = X Q_X`,
    :math:`L = X^\top P_X`, the step's ``lr`` (halved for a square X), the blocks ``S``, ``C``, ``D`` of
    :math:`V^\top U` (times lr/2), and ``risk``: a 0-d tensor below 1 when the fast path is exact, i.e. the
    drift seen along the batch is under 64 eps and :math:`\lVert S \rVert_F < 1/2` (Schur complement)."""

    W: Tensor
    X: Tensor
    PX: Tensor
    QX: Tensor
    K: Tensor
    L: Tensor
    lr: float
    S: Tensor
    C: Tensor
    D: Tensor
    risk: Tensor


def prepare_lowrank_cayley(W: Tensor, P: Tensor, Q: Tensor, lr: float, *,
                           WQ: Tensor | None = None, WtP: Tensor | None = None) -> LowRankCayley:
    """The quantities of :func:`cayley_retract_lowrank` before its solve; no host synchronisation."""
    X, transposed = _stiefel_frame(W)
    if WQ is None:
        WQ = W @ Q  # (out, r)
    if WtP is None:
        WtP = W.mT @ P  # (in, r)
    # frame quantities: P_X, Q_X, K = X Q_X, L = X^T P_X
    PX, QX, K, L = (Q, P, WtP, WQ) if transposed else (P, Q, WQ, WtP)
    # the Euclidean metric: P_X <- P_X - X L / 2, so L <- L / 2 (X^T X = I); a square X has X L = P_X,
    # which halves A: the same as halving lr
    if X.shape[-2] == X.shape[-1]:
        lr = lr / 2
    else:
        PX, L = PX - 0.5 * (X @ L), 0.5 * L
    half = lr / 2
    S = (K.mT @ PX).mul_(half)  # a S, (r, r); V^T U = [[S, K^T K], [-P_X^T P_X, -S^T]], a = lr / 2
    C = (K.mT @ K).mul_(half)  # a K^T K
    D = (PX.mT @ PX).mul_(-half)  # -a P_X^T P_X
    risk = torch.maximum(_drift_along(K, QX) / _drift_tolerance(W), 2 * torch.linalg.matrix_norm(S))
    return LowRankCayley(W, X, PX, QX, K, L, lr, S, C, D, risk)


def _schur_blocks(S: Tensor, C: Tensor, D: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""``(A11_inv, T, schur_inv)`` for the system :math:`\begin{bmatrix} I + S & C \\ D & I - S^\top
    \end{bmatrix} \begin{bmatrix} Z_1 \\ Z_2 \end{bmatrix} = \begin{bmatrix} R_1 \\ R_2 \end{bmatrix}` (r x r
    blocks, batched over leading dimensions): :math:`A_{11}^{-1} = (I + S)^{-1}`, :math:`T = D A_{11}^{-1}`
    and the inverse of the Schur complement :math:`I - S^\top - T C`, so that (:func:`_schur_apply`)
    :math:`Z_2 = \mathrm{schur}^{-1} (R_2 - T R_1)`, :math:`Z_1 = A_{11}^{-1} (R_1 - C Z_2)`. Two r x r
    inverses and products instead of a (2r x 2r) solve with many right-hand sides (3x slower on a CPU).
    Exact while :math:`\lVert S \rVert_F < 1/2` (the inverse of I + S then has norm < 2); the Schur
    complement is then invertible because the whole matrix is (it is :math:`I + \tfrac{lr}{2} V^\top U`,
    invertible as :math:`I + \tfrac{lr}{2} A` is, A being skew)."""
    eye = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
    A11_inv = _inverse(eye + S)
    T = D @ A11_inv
    return A11_inv, T, _inverse(eye - S.mT - T @ C)


def _inverse(M: Tensor) -> Tensor:
    """``inv_ex`` without its error check (no host sync), batched on a GPU. On the CPU one matrix at a time:
    torch 2.13's batched CPU inverse with 2 threads failed intermittently in the upkeep benchmark (MKL:
    "Parameter 6 was incorrect on entry to SLASWP", then a RuntimeError) on finite, well-conditioned
    input that it inverted one by one; the loop costs the same there (5.7 ms against 5.9 ms for 7 x 256^2)."""
    if M.dim() > 2 and M.device.type == "cpu":
        return torch.stack([torch.linalg.inv_ex(m).inverse for m in M])
    return torch.linalg.inv_ex(M).inverse


def _schur_apply(blocks: tuple[Tensor, Tensor, Tensor], C: Tensor, R1: Tensor, L_T: Tensor) -> tuple[Tensor, Tensor]:
    """``(Z1, Z2)`` of one layer from its :func:`_schur_blocks`, with R2 = -L^T (2-D: fused GEMMs)."""
    A11_inv, T, schur_inv = blocks
    Z2 = schur_inv @ torch.addmm(L_T, T, R1, beta=-1, alpha=-1)  # R2 - T R1
    return A11_inv @ torch.addmm(R1, C, Z2, alpha=-1), Z2


def _pivoted_solve(S: Tensor, C: Tensor, D: Tensor, R1: Tensor, R2: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_schur_blocks`' system for any S (a very large step): the whole matrix inverted with pivoting."""
    r = S.shape[-1]
    eye = torch.eye(r, dtype=S.dtype, device=S.device)
    M_inv = torch.linalg.inv(torch.cat([torch.cat([eye + S, C], 1), torch.cat([D, eye - S.mT], 1)], 0))
    Z = torch.addmm(M_inv[:, :r] @ R1, M_inv[:, r:], R2)
    return Z[:r], Z[r:]


def finish_lowrank_cayley(steps: list[LowRankCayley], safe: list[bool]) -> None:
    r"""Apply prepared low-rank Cayley steps in place, :math:`X \leftarrow X - lr\,(P_X Z_1 + K Z_2)`.

    ``safe[i]``: step i's ``risk`` was below 1 (read by the caller in one synchronisation for all layers).
    Safe steps of the same r, dtype and device invert their small blocks in one batched call
    (:func:`_schur_blocks`) and take :math:`K^\top X = Q_X^\top` (true while X is orthogonal); their
    (r, p) products and the update stay per layer (GEMMs of the layer's own shapes: a batched form needs
    stacked copies of them and ran 10% slower on a CPU). The others, one by one, compute
    :math:`K^\top X`, solve with pivoting when S is large, and end with one Björck iteration when drifted.
    """
    groups: dict[tuple, list[LowRankCayley]] = {}
    for step, ok in zip(steps, safe, strict=True):
        if ok:
            groups.setdefault((step.S.shape, step.S.dtype, step.S.device), []).append(step)
            continue
        drifted = bool(_drift_along(step.K, step.QX) > _drift_tolerance(step.W))
        KtX = (step.X.mT @ step.K).mT if drifted else step.QX.mT
        if torch.linalg.matrix_norm(step.S) < 0.5:
            Z1, Z2 = _schur_apply(_schur_blocks(step.S, step.C, step.D), step.C, KtX, step.L.mT)
        else:
            Z1, Z2 = _pivoted_solve(step.S, step.C, step.D, KtX, step.L.mT.neg())
        step.X.addmm_(step.PX, Z1, alpha=-step.lr).addmm_(step.K, Z2, alpha=-step.lr)
        if drifted:
            step.W.copy_(bjorck(step.W, 1))
    for group in groups.values():
        blocks = _schur_blocks(*(torch.stack([getattr(g, name) for g in group]) for name in "SCD"))
        for i, step in enumerate(group):  # X is W or a view of it: updated in place, no weight-sized copy
            Z1, Z2 = _schur_apply(tuple(b[i] for b in blocks), step.C, step.QX.mT, step.L.mT)
            step.X.addmm_(step.PX, Z1, alpha=-step.lr).addmm_(step.K, Z2, alpha=-step.lr)


def cayley_retract_lowrank(W: Tensor, P: Tensor, Q: Tensor, lr: float, *,
                           WQ: Tensor | None = None, WtP: Tensor | None = None, inplace: bool = False) -> Tensor:
    r""":func:`cayley_retract` for a gradient given as factors :math:`G = P Q^\top`, by the Woodbury identity.

    ``P``: (out, r), ``Q``: (in, r); for a linear layer r is the batch (P the output
    errors scaled by 1/B, Q the inputs), so the skew matrix :math:`A` has rank <= 2r.
    In the frame :math:`X` (see :func:`cayley_retract`) with :math:`\hat G = P_X Q_X^\top`
    (:math:`P_X` already carries the metric's :math:`-\tfrac12 X X^\top`: a halved lr for a
    square X, one more (n, p, r) product otherwise) and :math:`K = X Q_X`,
    :math:`A = U V^\top` with :math:`U = [P_X, K]`, :math:`V = [K, -P_X]`, and

    .. math::  Y = X - lr\, U \,(I_{2r} + \tfrac{lr}{2} V^\top U)^{-1}\, V^\top X,
               \qquad V^\top X = [\,Q_X^\top;\ -(X^\top P_X)^\top\,],

    using :math:`K^\top X = Q_X^\top X^\top X = Q_X^\top`, which holds while X is orthogonal. Its
    drift is measured along the batch's vectors each step (:func:`_drift_along`); above 64 eps
    (float32: 7.6e-6) that step computes :math:`K^\top X` and ends with one Björck iteration,
    so a drift cannot grow through the steps. Cost :math:`2 r n p` for the
    update plus :math:`O(r^2 (n + p) + r^3)` for the small system (n x p = the frame's
    shape), against :math:`O(n^3)` densely. The products a step computes anyway can be
    passed in: ``WQ`` = W Q (the forward's pre-activations, (out, r)) and ``WtP`` = W^T P
    ((in, r), the backward's input gradient); missing ones are computed. When
    2r >= min(out, in) the dense form is cheaper and is used. Returns the new weight; pure unless
    ``inplace``, which writes it into ``W`` (no weight-sized copy).
    """
    if 2 * P.shape[-1] >= min(W.shape[-2], W.shape[-1]):
        Y = cayley_retract(W, P @ Q.mT, lr)
        return W.copy_(Y) if inplace else Y
    target = W if inplace else W.clone()
    step = prepare_lowrank_cayley(target, P, Q, lr, WQ=WQ, WtP=WtP)
    finish_lowrank_cayley([step], [bool(step.risk < 1)])
    return target


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
      on :math:`\theta` only through :math:`W`. The parametrization is evaluated
      afresh (bypassing a ``parametrize.cached()`` cache), so this works inside
      ``torch.no_grad()`` too.

    ``G.shape != weight.shape`` raises ValueError.
    """
    theta = trainable_weight(module)
    W_shape = tuple(module.weight.shape)
    if tuple(G.shape) != W_shape:
        raise ValueError(
            f"route_weight_grad: gradient shape {tuple(G.shape)} != weight shape {W_shape} "
            f"of {type(module).__name__}"
        )
    G = G.detach().to(dtype=theta.dtype, device=theta.device)
    if parametrize.is_parametrized(module, "weight"):
        with torch.enable_grad():
            W = module.parametrizations.weight()  # f(original), no cache
            (grad,) = torch.autograd.grad(W, theta, grad_outputs=G)
    else:
        grad = G
    theta.grad = grad
    return grad
