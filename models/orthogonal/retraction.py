r"""Orthogonal layers kept exact by the step itself: the Cayley retraction of SGD (issue 15).

A layer marked ``"retraction"`` (``models.orthogonal.make_orthogonal``) is never
projected. Its SGD step ``W - lr G`` is replaced by the Cayley retraction of that
step onto the orthogonal set (``models.orthogonal.cayley.cayley_retract``; to first order in
lr it is SGD followed by a projection, so a learning rate tuned for ``bjorck`` means
the same here). The gradient
of a linear layer is a sum over the batch of outer products, G = P Q^T with
P = output errors / B (out x r) and Q = inputs (in x r), so the retraction is applied
by the Woodbury identity at O(r n p) (``cayley_retract_lowrank``) instead of a
projection's O(n^3); it also reuses the forward's pre-activations W Q.

Where the factors come from, while :meth:`CayleyRetraction.recording` is open:

* engines that differentiate through the modules (backprop, any autograd
  engine): a forward hook on each retracted ``nn.Linear`` keeps its
  input rows and pre-activations and a hook on its output keeps the output
  gradient rows that autograd turns into ``weight.grad``;
* forward-only engines (FOTON, PEPITA, FA/DFA): ``write_layer_grads`` reports its
  (delta, presynaptic, 1/B) through :func:`record_layer_grads`.

Engines still write the dense ``.grad`` (the contract), and it stays the truth:
before a low-rank step each layer checks ``G v = P (Q^T v)`` on a random vector
(cost O(n p), a gradient's 1/r). A layer without factors or whose factors disagree
(an engine that changed the gradient after autograd, gradients averaged over
ranks, a layer that is not ``nn.Linear``) takes the dense Cayley step, O(n^3) but
exact, with one note.

Only plain SGD has a low-rank step: momentum accumulates past steps into a dense
matrix and Adam rescales each entry, so neither step is low-rank (their exact
Cayley retraction costs the O(n^3) of a projection); ``check_optimizer`` refuses them
for retracted layers and points to Björck, polar or geotorch. Weight decay has
exactly no effect on an orthogonal layer's retraction (see ``cayley_retract``).
A clipped gradient scales the factors by the same coefficient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from gradengines.models.errors import ModelConfigError
from gradengines.models.orthogonal.cayley import (
    LowRankCayley,
    cayley_retract,
    dense_drift,
    finish_lowrank_cayley,
    prepare_lowrank_cayley,
)
from gradengines.models.orthogonal.marking import RETRACTED_METHODS, orthogonal_method

__all__ = ["CayleyRetraction", "record_layer_grads", "retracted_modules"]

_RECORDING: list[CayleyRetraction] = []  # the open recording, if any (write_layer_grads reports to it)


def retracted_modules(model: nn.Module) -> list[nn.Module]:
    """Modules of ``model`` whose weight is kept orthogonal by retraction, in module order, tied weights once."""
    found, seen = [], set()
    for module in model.modules():
        if orthogonal_method(module) in RETRACTED_METHODS and id(module.weight) not in seen:
            seen.add(id(module.weight))
            found.append(module)
    return found


def record_layer_grads(linear: nn.Linear, delta: Tensor, presynaptic: Tensor, alpha: float) -> None:
    """Report ``linear.weight.grad = alpha delta^T presynaptic`` (rows (N, out), (N, in)) to an open recording."""
    if _RECORDING:
        _RECORDING[-1].record(linear.weight, delta, presynaptic, alpha)


class _Part:
    """alpha D^T H, one call's share of a weight's gradient: rows D (N, out), H (N, in), with the rows of
    H W^T (the forward's pre-activations) and D W (the backward's input gradient) when a pass computed them."""

    __slots__ = ("D", "H", "alpha", "HWt", "DW")

    def __init__(self, D, H, alpha, HWt=None, DW=None):
        self.D, self.H, self.alpha, self.HWt, self.DW = D, H, alpha, HWt, DW


def _columns(parts: list[_Part], field: str) -> Tensor | None:
    """The parts' rows of ``field`` side by side as columns, (features, r), a view for one part; None if a
    part lacks them."""
    rows = [getattr(part, field) for part in parts]
    if any(x is None for x in rows):
        return None
    return rows[0].mT if len(rows) == 1 else torch.cat([x.mT for x in rows], dim=-1)


class CayleyRetraction:
    """The SGD step of the retracted layers of ``model`` (module docstring).

    Use::

        retraction = CayleyRetraction(model)
        with retraction.recording():
            engine.compute_grads(model, x, y, loss_fn)     # .grad as usual, factors on the side
        retraction.step(optimizer)                         # optimizer for the rest, Cayley for these

    ``step`` counts in ``self.lowrank_steps`` and ``self.dense_steps`` which form each
    layer took, and keeps in ``self.dense_reasons`` why a layer took the dense one.
    """

    def __init__(self, model: nn.Module, *, seed: int = 0):
        self.modules = retracted_modules(model)
        self._ids = {id(m.weight) for m in self.modules}
        self._factors: dict[int, list[_Part]] = {}  # id(weight) -> its gradient's parts
        self._forward: dict[int, list[tuple[Tensor, Tensor]]] = {}  # id(weight) -> no-grad (input, pre-activation)
        self._probe = torch.Generator().manual_seed(seed)  # the consistency check's vectors, not the global RNG
        self.lowrank_steps = 0
        self.dense_steps = 0
        self.dense_reasons: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.modules)

    # ------------------------------------------------------------ factors
    @contextlib.contextmanager
    def recording(self, enabled: bool = True) -> Iterator[CayleyRetraction]:
        """Collect the gradient factors of the retracted layers during the engine's ``compute_grads``
        (``enabled=False``: none, e.g. when the gradients are averaged over ranks afterwards)."""
        self._factors, self._forward = {}, {}
        if not enabled or not self.modules:
            yield self
            return
        hooks = [m.register_forward_hook(self._forward_hook) for m in self.modules if isinstance(m, nn.Linear)]
        _RECORDING.append(self)
        try:
            yield self
        finally:
            _RECORDING.remove(self)
            for hook in hooks:
                hook.remove()

    def record(self, weight: Tensor, delta: Tensor, presynaptic: Tensor, alpha: float) -> None:
        """Add alpha D^T H to ``weight``'s factors (rows D (.., out), H (.., in)); the pre-activations of a
        no-grad forward call on the same ``presynaptic`` tensor come along."""
        if id(weight) not in self._ids:
            return
        rows = delta.shape[:-1].numel()
        seen = self._forward.pop(id(weight), ())  # this layer's no-grad calls, not kept past its gradient
        pre = next((p for x, p in seen if x is presynaptic), None)
        self._factors.setdefault(id(weight), []).append(
            _Part(delta.reshape(rows, -1), presynaptic.reshape(rows, -1), alpha,
                  None if pre is None else pre.reshape(rows, -1)))

    def _forward_hook(self, module: nn.Linear, inputs, output: Tensor) -> None:
        x = inputs[0]
        pre = output.detach() if module.bias is None else output.detach() - module.bias.detach()
        if not (torch.is_grad_enabled() and output.requires_grad and module.weight.requires_grad):
            self._forward.setdefault(id(module.weight), []).append((x, pre))  # write_layer_grads reports
            return
        part = _Part(None, x.detach().reshape(-1, x.shape[-1]), 1.0, pre.reshape(-1, pre.shape[-1]))
        self._factors.setdefault(id(module.weight), []).append(part)

        def keep_output_grad(grad: Tensor) -> None:
            part.D = grad.reshape(-1, grad.shape[-1])

        output.register_hook(keep_output_grad)
        # the input gradient D W that autograd computes anyway: from the node of the product, when its
        # input slot is x itself (2-D input; otherwise the step computes it)
        node, slot = output.grad_fn, None
        if x.requires_grad and node is not None:
            target = x.grad_fn
            for i, (fn, _) in enumerate(node.next_functions):
                if fn is not None and (fn is target or getattr(fn, "variable", None) is x):
                    slot = i
        if slot is not None:
            def keep_input_grad(grad_inputs, _grad_outputs) -> None:
                part.DW = grad_inputs[slot]

            node.register_hook(keep_input_grad)

    def _lowrank_factors(self, weight: Tensor, grad_scale: float):
        """``(P, Q, WQ, WtP, c, mismatch)`` with ``weight.grad`` = c P Q^T when the 0-d tensor ``mismatch`` is
        below 1 (the random-vector check; read by ``step`` with the other layers', one host sync); WQ = W Q,
        WtP = W^T P where a pass computed them. A string: why no factors can be used."""
        parts = self._factors.get(id(weight))
        if not parts:
            return "no gradient factors were recorded (not an nn.Linear, or gradients averaged over ranks)"
        if any(part.D is None for part in parts):
            return "an output gradient never arrived (the layer's output was not differentiated)"
        # G = c P Q^T with c the common scale of the parts (their 1/B, the clipping): c goes into the step's lr
        alphas = {part.alpha for part in parts}
        if len(alphas) == 1:
            c = alphas.pop() * grad_scale
            P, WtP = _columns(parts, "D"), _columns(parts, "DW")  # (out, r), (in, r)
        else:
            c = grad_scale
            P, WtP = torch.cat([part.D.mT * part.alpha for part in parts], dim=-1), None
        Q = _columns(parts, "H")  # (in, r)
        grad = weight.grad
        v = torch.randn(Q.shape[0], generator=self._probe, dtype=torch.float64).to(Q)
        Qv = Q.mT @ v
        exact, factored = grad @ v, (P @ Qv).mul_(c)
        tolerance = torch.finfo(grad.dtype).eps ** 0.5 * (exact.norm() + abs(c) * P.norm() * Qv.norm())
        mismatch = (exact - factored).norm() / tolerance.clamp_min(torch.finfo(grad.dtype).tiny)
        return P, Q, _columns(parts, "HWt"), WtP, c, mismatch.nan_to_num(nan=2.0)

    # --------------------------------------------------------------- step
    def check_optimizer(self, optimizer: torch.optim.Optimizer, spell: Callable[[str], str] = str) -> None:
        """Refuse, in one line (``ModelConfigError``), an optimizer whose step on a retracted weight is not plain
        SGD: momentum and Adam steps are not low-rank (module docstring). ``spell`` names an option as the
        caller's user sets it (``trainers.core.errors.spell``: ``--optimizer`` on the command line)."""
        for group in optimizer.param_groups:
            if any(id(p) in self._ids for p in group["params"]) and (
                    not isinstance(optimizer, torch.optim.SGD) or group.get("momentum", 0) != 0):
                raise ModelConfigError(
                    f"orthogonal=retraction takes plain SGD steps ({spell('optimizer')} sgd, {spell('momentum')} 0; "
                    f"got {type(optimizer).__name__}, momentum {group.get('momentum', '-')}): momentum and Adam "
                    f"steps are not low-rank; use orthogonal=bjorck with them (a projection with as many Björck "
                    f"iterations as the step needs, issue 32), or polar, expm or cayley")

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer, grad_scale: float = 1.0) -> None:
        """``optimizer.step()`` on every other parameter, the Cayley retraction of SGD on the retracted
        weights (at their param group's lr; ``grad_scale``: the clipping coefficient applied to .grad)."""
        self.check_optimizer(optimizer)
        lr_of = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
        weights = [m.weight for m in self.modules if id(m.weight) in lr_of and m.weight.grad is not None]
        grads = [w.grad for w in weights]
        for w in weights:
            w.grad = None  # the optimizer skips them
        try:
            optimizer.step()
        finally:
            for w, g in zip(weights, grads, strict=True):
                w.grad = g
        # each layer's step planned with its checks as 0-d tensors, all read in one host synchronisation:
        # [factors disagree with .grad, fast low-rank path unsafe, drift for a dense step], each >= 1 when true
        plans, checks = [], []
        for w in weights:
            found = self._lowrank_factors(w, grad_scale)
            zero = w.new_zeros((), dtype=torch.float64)
            if isinstance(found, str):
                plans.append((w, found))
                checks.append(torch.stack([zero + 2, zero, dense_drift(w).double()]))
                continue
            P, Q, WQ, WtP, c, mismatch = found
            if 2 * P.shape[-1] >= min(w.shape):  # at a rank that is not low the dense form is cheaper, and exact
                plans.append((w, None))
                checks.append(torch.stack([mismatch.double(), zero, dense_drift(w).double()]))
                continue
            step = prepare_lowrank_cayley(w, P, Q, lr_of[id(w)] * c, WQ=WQ, WtP=WtP)
            plans.append((w, step))
            checks.append(torch.stack([mismatch.double(), step.risk.double(), zero]))
        flags = torch.stack(checks).ge(1).tolist() if checks else []  # the step's only host sync
        lowrank, safe = [], []
        for (w, plan), (mismatched, risky, drifted) in zip(plans, flags, strict=True):
            if isinstance(plan, str) or mismatched:
                self.dense_steps += 1
                self.dense_reasons.add(plan if isinstance(plan, str) else
                                       "the engine's gradient differs from the recorded factors")
                # a low-rank plan's drift for the dense form was not read: read now (this rare fallback only)
                w.copy_(cayley_retract(w, w.grad, lr_of[id(w)],
                                       drifted=None if isinstance(plan, LowRankCayley) else drifted))
            elif plan is None:
                self.lowrank_steps += 1
                w.copy_(cayley_retract(w, w.grad, lr_of[id(w)], drifted=drifted))
            else:
                self.lowrank_steps += 1
                lowrank.append(plan)
                safe.append(not risky)
        finish_lowrank_cayley(lowrank, safe)
        self._factors, self._forward = {}, {}
