r"""The Cayley retraction of an SGD step onto the orthogonal set, dense and low-rank (Woodbury), for the
layers marked ``"retraction"`` (``models.orthogonal.make_orthogonal``); ``models.orthogonal.retraction`` applies it as
the optimizer step of a training run. Same convention as ``models.orthogonal``: rows orthonormal when
out <= in, columns otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gradengines.models.orthogonal.projection import bjorck

__all__ = ["cayley_retract", "cayley_retract_lowrank", "dense_drift", "LowRankCayley", "prepare_lowrank_cayley",
           "finish_lowrank_cayley"]


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
