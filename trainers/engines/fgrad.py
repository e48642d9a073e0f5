"""Weight-perturbed forward gradients (Baydin, Pearlmutter, Syme & Wood 2022, "Gradients without backpropagation").

    g_hat = (1/n) sum_i (grad L . v_i) v_i,    v_i ~ N(0, I) or Rademacher,    E[g_hat] = grad L

Each ``grad L . v_i`` is one forward-mode pass (``torch.func.jvp`` of the loss with respect to every trainable
parameter, tangent v_i): no backward pass, no stored activations; the tangent is parameter-sized, and forward mode
carries one tangent per activation beside it. Unbiased, with E||g_hat - g||^2 = (d + 1) ||g||^2 / n for Gaussian
directions in d parameters ((d - 1) ||g||^2 / n for Rademacher: ||v||^2 = d), so the estimate's cosine with the
gradient is about sqrt(n / d): small for any real network, the method's known weakness. Directions are drawn
from (``seed``, step, direction) (``trainers.engines.directions``), so a run resumes exactly. Each direction runs
the model's forward once in training mode (dropout draws its masks anew, BatchNorm updates its statistics once per
direction).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from gradengines.models.adapters.calling import forward_loss
from gradengines.models.errors import ModelConfigError, one_line
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.engines.directions import direction

__all__ = ["ForwardGradient", "loss_at", "directional_derivative"]


class _Loss(nn.Module):
    """The model's loss and outputs, a module whose parameters ``torch.func.functional_call`` can replace."""

    def __init__(self, model: nn.Module, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, inputs, targets):
        outputs, loss = forward_loss(self.model, inputs, targets, self.loss_fn)
        return loss, outputs


def loss_at(model: nn.Module, names: list[str], values, inputs, targets, loss_fn):
    """(loss, outputs) of ``model`` with its trainable parameters ``names`` replaced by ``values`` for the call (the
    parameters themselves are not written; an ``nn.GRU``'s flat weights follow)."""
    return torch.func.functional_call(_Loss(model, loss_fn), {f"model.{n}": v for n, v in zip(names, values,
                                                                                                 strict=True)},
                                      (inputs, targets), strict=False)


def directional_derivative(model: nn.Module, inputs, targets, loss_fn, tangents, engine: str = "this engine"):
    """(loss, dL . v, outputs), all detached: one forward-mode pass (``torch.func.jvp``) of the loss with respect
    to every trainable parameter of ``model``, tangent ``tangents`` (one tensor per parameter, in
    ``trainable_parameters`` order); no backward pass, nothing written. A forward with an operation torch has no
    forward-mode derivative for is one ``ModelConfigError`` line naming ``engine``."""
    named = trainable_parameters(model)
    names = [name for name, _ in named]
    primals = tuple(p.detach() for _, p in named)

    def loss_of(*values):  # (loss, outputs as the auxiliary result)
        return loss_at(model, names, values, inputs, targets, loss_fn)

    try:  # attention in its composite form: the fused kernels have no forward-mode derivative on the CPU
        with sdpa_kernel([SDPBackend.MATH]):
            loss, dot, outputs = torch.func.jvp(loss_of, primals, tuple(tangents), has_aux=True)
    except NotImplementedError as err:
        raise ModelConfigError(f"trainer '{engine}' needs the forward-mode derivative of every operation of "
                               f"{type(model).__name__}'s forward, and torch has none for one of them "
                               f"({one_line(err)}); train it with mezo or backprop") from None
    return loss.detach(), dot.detach(), outputs.detach()


@register_engine("fgrad")
class ForwardGradient(GradientEngine):
    """Forward gradient (module docstring)."""

    @dataclasses.dataclass
    class Options:
        directions: int = option(1, "random directions averaged per step (forward-mode passes)")
        distribution: Literal["gaussian", "rademacher"] = option("gaussian", "the directions' distribution")
        seed: int = option(0, "seed of the directions (with the step: resumable)")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options.directions < 1:
            raise ConfigError(f"--fgrad-directions must be >= 1, got {self.options.directions}")
        if not 0 <= self.options.seed < 2**62:
            raise ConfigError(f"--fgrad-seed must be in [0, 2**62), got {self.options.seed}")
        self.steps = 0

    def estimate(self, model: nn.Module, inputs, targets, loss_fn, step: int):
        """(loss, outputs, the averaged estimate per trainable parameter) at ``step``'s directions."""
        primals = tuple(p.detach() for _, p in trainable_parameters(model))
        total = [torch.zeros_like(p) for p in primals]
        n = self.options.directions
        for index in range(n):
            v = direction(primals, self.options.distribution, self.options.seed, step, index)
            loss, dot, outputs = directional_derivative(model, inputs, targets, loss_fn, v, engine="fgrad")
            for t, vi in zip(total, v, strict=True):
                t.add_(vi, alpha=float(dot) / n)
        return loss, outputs, total

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        loss, outputs, total = self.estimate(model, inputs, targets, loss_fn, self.steps)
        self.steps += 1
        write_grads([p for _, p in trainable_parameters(model)], total)
        return StepOutput(loss=loss, outputs=outputs)

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state.get("steps", 0))
