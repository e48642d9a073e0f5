"""Zeroth-order SPSA as in MeZO (Malladi et al., NeurIPS 2023, "Fine-Tuning Language Models with Just Forward
Passes", Algorithm 1).

    p_i = (L(theta + eps z_i) - L(theta - eps z_i)) / (2 eps),    g_hat = (1/n) sum_i p_i z_i,    z_i ~ N(0, I)

Two forward passes per direction, no backward pass, no activations kept. As p_i -> grad L . z_i when eps -> 0,
g_hat estimates the gradient (a forward gradient whose directional derivative is a finite difference). The
projected gradient is written to ``.grad`` so every optimizer works (the paper's recipe is plain SGD); a third
forward at theta gives the step's clean loss (the engine contract's).

theta + eps z is never written into the parameters: each module's own parameters are replaced, for the time of its
forward, by perturbed tensors drawn again from the seed (a forward pre-hook and a forward hook), so at most one
module's perturbed copy exists at a time and the parameters are unchanged to the bit (the paper perturbs in place,
which rounding does not undo exactly). A parameter read outside its own module's forward (a head that reuses an
embedding's weight through ``F.linear``; an ``nn.GRU`` run from its flat weights) would be used unperturbed: the
first batch checks that no operation sees an original parameter during a perturbed pass, and for such a model
every parameter is replaced by its perturbed copy for the whole forward (``torch.func.functional_call``: still
nothing written; parameter-sized memory), which the engine says once (``structure``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from gradengines.models.adapters.calling import forward_loss
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import ConfigError, spell
from gradengines.trainers.core.options import option
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.engines.directions import direction_of
from gradengines.trainers.engines.fgrad import loss_at

__all__ = ["MeZO", "perturbed"]


@contextlib.contextmanager
def perturbed(model: nn.Module, scale: float, draw) -> Iterator[None]:
    """Within the block, each module's forward sees its trainable parameters as ``p + scale * draw(k, p)`` (``k``:
    the parameter's index among the model's trainable parameters), computed when the module is called and dropped
    when it returns; the parameters themselves are not written."""
    index = {id(p): k for k, (_, p) in enumerate(trainable_parameters(model))}
    values = {id(p): p.detach() for _, p in trainable_parameters(model)}  # views taken once, before any forward
    handles, owners = [], []
    for module in model.modules():
        own = [(name, p) for name, p in module._parameters.items() if p is not None and id(p) in index]
        if not own:
            continue
        owners.append((module, own))

        def swap_in(mod, args, own=own):
            for name, p in own:
                mod._parameters[name] = values[id(p)] + scale * draw(index[id(p)], values[id(p)])

        def swap_out(mod, args, output, own=own):
            for name, p in own:
                mod._parameters[name] = p

        handles += [module.register_forward_pre_hook(swap_in), module.register_forward_hook(swap_out)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, own in owners:  # a forward that raised midway leaves no perturbed tensor behind
            for name, p in own:
                module._parameters[name] = p


class _Unperturbed(TorchFunctionMode):
    """Records the trainable parameters an operation receives as they are (not perturbed) during a perturbed pass."""

    def __init__(self, params: dict[int, str]):
        super().__init__()
        self.params = params
        self.seen: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for value in (*args, *(kwargs or {}).values()):
            if isinstance(value, nn.Parameter) and id(value) in self.params:
                self.seen.add(self.params[id(value)])
        return func(*args, **(kwargs or {}))


@register_engine("mezo")
class MeZO(GradientEngine):
    """SPSA with seeded in-place-free perturbations (module docstring)."""

    @dataclasses.dataclass
    class Options:
        eps: float = option(1e-3, "perturbation scale (the paper's 1e-3)")
        directions: int = option(1, "random directions averaged per step (two forward passes each)")
        distribution: Literal["gaussian", "rademacher"] = option("gaussian", "the directions' distribution")
        seed: int = option(0, "seed of the directions (with the step: resumable)")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options.directions < 1:
            raise ConfigError(f"--mezo-directions must be >= 1, got {self.options.directions}")
        if not 0 < self.options.eps < float("inf"):
            raise ConfigError(f"--mezo-eps must be a finite number > 0, got {self.options.eps}")
        if not 0 <= self.options.seed < 2**62:
            raise ConfigError(f"--mezo-seed must be in [0, 2**62), got {self.options.seed}")
        self.steps = 0
        self.last_projections: list[float] = []
        self.in_place: dict[int, list[str]] = {}  # id(model) -> the parameters used outside their module

    def _draw(self, step: int, index: int):
        o = self.options
        return lambda k, p: direction_of(p.shape, p, o.distribution, o.seed, step, index, k)

    def first_batch_check(self, model, inputs, targets, loss_fn) -> None:
        """The perturbation moves some parameter in its own dtype (an eps below every parameter's resolution gives
        equal losses and a zero gradient at every step); every trainable parameter is perturbed where it is used
        (module docstring)."""
        draw, eps = self._draw(0, 0), self.options.eps
        with torch.no_grad():
            if not any(bool((p + eps * draw(k, p) != p).any())
                       for k, (_, p) in enumerate(trainable_parameters(model))):
                dtypes = sorted({str(p.dtype).removeprefix("torch.") for _, p in trainable_parameters(model)})
                raise ConfigError(f"{spell('mezo_eps')} {eps:g} moves no parameter in {', '.join(dtypes)}: eps x z is "
                                  f"below every parameter's resolution, so both perturbed losses are equal and the "
                                  f"gradient is zero at every step; use a scale near the paper's 1e-3")
        names = {id(p): name for name, p in trainable_parameters(model)}
        mode = _Unperturbed(names)
        with torch.no_grad(), perturbed(model, self.options.eps, self._draw(0, 0)), mode:
            forward_loss(model, inputs, targets, loss_fn)
        if mode.seen:
            self.in_place[id(model)] = sorted(mode.seen)

    def structure(self, model: nn.Module) -> str | None:
        seen = self.in_place.get(id(model))
        if not seen:
            return None
        return (f"mezo: {', '.join(seen[:3])}{', ...' if len(seen) > 3 else ''} {'is' if len(seen) == 1 else 'are'} "
                f"used outside {'its' if len(seen) == 1 else 'their'} module's forward: every parameter is replaced "
                f"by its perturbed copy for the whole forward (torch.func.functional_call: parameter-sized memory)")

    def projection(self, model, inputs, targets, loss_fn, step: int, index: int) -> float:
        """(L(theta + eps z) - L(theta - eps z)) / (2 eps) for direction ``index`` of ``step``."""
        eps, draw = self.options.eps, self._draw(step, index)
        losses = []
        with torch.no_grad():
            if id(model) in self.in_place:  # every parameter replaced for the whole call (functional_call)
                named = trainable_parameters(model)
                names = [name for name, _ in named]
                for sign in (1.0, -1.0):
                    values = [p.detach() + sign * eps * draw(k, p.detach()) for k, (_, p) in enumerate(named)]
                    losses.append(loss_at(model, names, values, inputs, targets, loss_fn)[0].double())
            else:
                for sign in (1.0, -1.0):
                    with perturbed(model, sign * eps, draw):
                        losses.append(forward_loss(model, inputs, targets, loss_fn)[1].double())
        return float((losses[0] - losses[1]) / (2 * eps))

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        params = [p for _, p in trainable_parameters(model)]
        total = [torch.zeros_like(p) for p in params]
        n = self.options.directions
        self.last_projections = []
        for index in range(n):
            projected = self.projection(model, inputs, targets, loss_fn, self.steps, index)
            self.last_projections.append(projected)
            draw = self._draw(self.steps, index)
            for k, (t, p) in enumerate(zip(total, params, strict=True)):
                t.add_(draw(k, p), alpha=projected / n)
        self.steps += 1
        with torch.no_grad():
            outputs, loss = forward_loss(model, inputs, targets, loss_fn)
        write_grads(params, total)
        return StepOutput(loss=loss.detach(), outputs=outputs.detach())

    def metrics(self) -> dict[str, float]:
        if not self.last_projections:
            return {}
        return {"projected_grad": sum(self.last_projections) / len(self.last_projections)}

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state.get("steps", 0))
