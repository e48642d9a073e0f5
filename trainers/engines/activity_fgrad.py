"""Activity-perturbed forward gradients (Ren, Kornblith, Liao & Hinton, ICLR 2023, "Scaling forward gradient with
local losses", Section 3, FG-A; here with the model's own global loss, without the paper's local-loss heads).

The outputs z_l of the covered layers (nn.Linear, zero-padded nn.Conv2d, transformers' Conv1D:
``feedback_layers.covered_layers``) are perturbed, not their weights. Embeddings stay weight-perturbed: with them
and GPT-2's tied head activity-perturbed (10,000 logits per token), one direction's error on GPT-2 / PTB words was
3.3x weight perturbation's, against 0.75x without (BENCHMARKS.md). One forward-mode pass per direction adds a
tangent u_l ~ N(0, I) (or Rademacher) at every covered output, drawn per example and position, and a weight tangent
v (as ``fgrad``'s) on the other trainable parameters (norms, embeddings); it returns the loss's tangent, split by
example through the outputs' tangent y' and the task loss's gradient at the outputs (a backward of the loss alone):

    s_b = (dL/dy_b) . y'_b = sum_l (dL/dz_{l,b}) . u_{l,b} + (dL_b/dtheta) . v,    S = sum_b s_b

Each covered layer's error dL/dz_l is estimated by delta_l = s_b u_{l,b} at example b's rows, and its parameters
get the local backward of the layer alone (its own vector-Jacobian product at its stored input: grad W = delta^T x,
grad b = sum delta); every other parameter gets S v. Unbiased (u_l is independent of the other terms of s_b). The
error of one Gaussian direction on layer k (x~ = (x, 1), G_{l,b} = dL/dz_{l,b}, n_k = z_k's size per example):

    E||g_hat_k - g_k||^2 = sum_b ||x~_{k,b}||^2 (n_k S_b + ||G_{k,b}||^2),    S_b = sum_l ||G_{l,b}||^2

against (d + 1) ||g||^2 for weight perturbation over d parameters: for dense layers of fan-in m and a batch of B
examples whose gradients agree, about m B times lower (the paper's variance reduction: units instead of weights,
independent perturbations per example); where the activations outnumber the weights (convolutions) it is not.

Splitting S by example holds when the examples do not interact and the loss is the task's loss of the outputs: the
first batch checks both (a perturbation of example 0's rows reaches no other example's outputs, and sum_b s_b is the
loss's tangent), and otherwise every layer uses S (still unbiased, about B times the error), said once. A layer
whose rows are not per example (GPT-2's position table, (1, T, d) broadcast over the batch) uses S u. A covered
layer whose parameter is read outside every covered forward that owns it (a head tied to an embedding) is
weight-perturbed instead (found on the first batch, said once). Memory: the covered layers' inputs are kept until
the pass ends (their local backward), no other activation; forward mode carries a tangent beside each activation.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
import torch.autograd.forward_ad as fwAD
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from gradengines.models.adapters.calling import forward_loss
from gradengines.models.errors import ModelConfigError, one_line
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.engines.directions import activity_direction, direction_of
from gradengines.trainers.engines.feedback_layers import covered_layers
from gradengines.trainers.engines.fgrad import loss_at

__all__ = ["ActivityForwardGradient"]


@dataclasses.dataclass
class _Plan:
    """What the first batch found: the perturbed layers with their parameters' indices among the trainable
    parameters, the weight-perturbed parameters' indices, whether s is split by example (and why not)."""

    layers: list[tuple[str, nn.Module]]
    layer_params: list[list[int]]
    weights: list[int]
    demoted: list[str]
    per_example: bool = True
    why_not: str = ""
    shared: list[str] = dataclasses.field(default_factory=list)  # rows not per example (a position table): S u


@dataclasses.dataclass
class _Pass:
    """One direction's forward-mode pass: the loss and outputs, the loss's tangent, the outputs' tangent, and per
    perturbed layer and call its input (args, kwargs) and its perturbation u."""

    loss: torch.Tensor
    outputs: torch.Tensor
    loss_tangent: torch.Tensor
    outputs_tangent: torch.Tensor
    calls: list[list[tuple[tuple, dict, torch.Tensor]]]


def _primal(value):
    return fwAD.unpack_dual(value).primal if isinstance(value, torch.Tensor) else value


class _ReadOutside(TorchFunctionMode):
    """Records the covered layers' parameters that an operation receives while none of their owners runs."""

    def __init__(self, owners: dict[int, set[int]], running: list[int]):
        super().__init__()
        self.owners, self.running = owners, running
        self.seen: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for value in (*args, *(kwargs or {}).values()):
            if isinstance(value, nn.Parameter) and id(value) in self.owners \
                    and not self.owners[id(value)] & set(self.running):
                self.seen.add(id(value))
        return func(*args, **(kwargs or {}))


@register_engine("fgrad_act")
class ActivityForwardGradient(GradientEngine):
    """Activity-perturbed forward gradient (module docstring)."""

    @dataclasses.dataclass
    class Options:
        directions: int = option(1, "random directions averaged per step (forward-mode passes)")
        distribution: Literal["gaussian", "rademacher"] = option("gaussian", "the perturbations' distribution")
        seed: int = option(0, "seed of the perturbations (with the step: resumable)")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options.directions < 1:
            raise ConfigError(f"--fgrad-act-directions must be >= 1, got {self.options.directions}")
        if not 0 <= self.options.seed < 2**62:
            raise ConfigError(f"--fgrad-act-seed must be in [0, 2**62), got {self.options.seed}")
        self.steps = 0
        self.plans: dict[int, _Plan] = {}

    # -- the first batch: which layers, whether s splits by example --------------------------------------------
    def first_batch_check(self, model, inputs, targets, loss_fn) -> None:
        """The plan (module docstring): layers read outside their forward are demoted; s splits by example only
        where example 0's perturbation stays in example 0 and the split adds up to the loss's tangent."""
        index = {id(p): i for i, (_, p) in enumerate(trainable_parameters(model))}
        layers = covered_layers(model)
        params = [[index[id(p)] for p in m.parameters() if id(p) in index] for _, m in layers]
        demoted = self._read_outside(model, layers, inputs, targets, loss_fn)
        while True:  # a layer sharing a parameter with a demoted layer is demoted too
            shared = {i for k in demoted for i in params[k]}
            more = {k for k in range(len(layers)) if k not in demoted and shared & set(params[k])}
            if not more:
                break
            demoted |= more
        kept = [k for k in range(len(layers)) if k not in demoted]
        covered = {i for k in kept for i in params[k]}
        plan = _Plan([layers[k] for k in kept], [params[k] for k in kept],
                     [i for i in range(len(index)) if i not in covered], [layers[k][0] for k in sorted(demoted)])
        self.plans[id(model)] = plan
        plan.why_not = self._why_not_per_example(model, plan, inputs, targets, loss_fn)
        plan.per_example = not plan.why_not

    def _read_outside(self, model, layers, inputs, targets, loss_fn) -> set[int]:
        owners: dict[int, set[int]] = {}
        for k, (_, m) in enumerate(layers):
            for p in m.parameters():
                owners.setdefault(id(p), set()).add(k)
        running: list[int] = []

        def leave(module, args, output):
            running.pop()

        handles = []
        for k, (_, m) in enumerate(layers):
            handles.append(m.register_forward_pre_hook(lambda mod, args, k=k: running.append(k)))
            handles.append(m.register_forward_hook(leave))
        mode = _ReadOutside(owners, running)
        try:
            with torch.no_grad(), mode:
                forward_loss(model, inputs, targets, loss_fn)
        finally:
            for handle in handles:
                handle.remove()
        return {k for pid in mode.seen for k in owners[pid]}

    def _why_not_per_example(self, model, plan, inputs, targets, loss_fn) -> str:
        probe = self._pass(model, plan, inputs, targets, loss_fn, 0, 0)
        if probe.outputs.dim() == 0:
            return "the outputs have no batch dimension"
        batch = probe.outputs.shape[0]
        if batch == 1:
            return ""
        plan.shared = [name for (name, _), calls in zip(plan.layers, probe.calls, strict=True)
                       if any(u.shape[0] % batch for _, _, u in calls)]
        scalars = self._example_scalars(probe, targets, loss_fn)
        if scalars is None:
            return "the loss is not the task's loss of the outputs"
        scalars = scalars.detach()  # values only: the probe keeps its graph where the model's parameters require grad
        total = float(probe.loss_tangent.detach())
        if abs(float(scalars.sum()) - total) > 1e-4 * (abs(total) + float(scalars.abs().sum())) + 1e-12:
            return "the loss is not the task's loss of the outputs"
        alone = self._pass(model, plan, inputs, targets, loss_fn, 0, 0, only_first_example=batch)
        if alone.outputs_tangent[1:].abs().max() > 0:
            return "the examples interact (a perturbation of one example's rows reaches the others' outputs)"
        return ""

    def structure(self, model: nn.Module) -> str | None:
        plan = self.plans.get(id(model))
        if plan is None:
            return None
        line = (f"fgrad_act: {len(plan.layers)} layers activity-perturbed, "
                f"{len(plan.weights)} parameters weight-perturbed")
        if plan.demoted:
            line += f"; {', '.join(plan.demoted[:3])}{', ...' if len(plan.demoted) > 3 else ''} weight-perturbed " \
                    f"(a parameter read outside the layer's forward)"
        if plan.per_example and plan.shared:
            line += f"; {', '.join(plan.shared[:3])}{', ...' if len(plan.shared) > 3 else ''} shared by the " \
                    f"batch (the whole-batch scalar)"
        if not plan.per_example:
            line += f"; one scalar for the whole batch, not per example ({plan.why_not}: about B times the error)"
        return line

    # -- one direction ---------------------------------------------------------------------------------------
    def _pass(self, model, plan, inputs, targets, loss_fn, step, index, only_first_example: int = 0) -> _Pass:
        """The forward-mode pass of direction ``index`` of ``step`` (with ``only_first_example`` = B: example 0's
        rows perturbed alone and no weight tangent, the first batch's probe)."""
        o = self.options
        named = trainable_parameters(model)
        names = [name for name, _ in named]
        primals = [p.detach() for _, p in named]
        calls: list[list] = [[] for _ in plan.layers]

        def perturb(k):
            def hook(module, args, kwargs, output):
                primal = _primal(output)
                u = activity_direction(primal, o.distribution, o.seed, step, index, k, len(calls[k]))
                if only_first_example:
                    u[u.shape[0] // only_first_example:] = 0
                calls[k].append((tuple(_primal(a) for a in args), {key: _primal(v) for key, v in kwargs.items()}, u))
                return output + fwAD.make_dual(torch.zeros_like(primal), u)
            return hook

        handles = [m.register_forward_hook(perturb(k), with_kwargs=True) for k, (_, m) in enumerate(plan.layers)]
        try:  # attention in its composite form: the fused kernels have no forward-mode derivative on the CPU
            with fwAD.dual_level(), sdpa_kernel([SDPBackend.MATH]):
                values = list(primals)
                if not only_first_example:
                    for i in plan.weights:
                        values[i] = fwAD.make_dual(primals[i], direction_of(primals[i].shape, primals[i],
                                                                            o.distribution, o.seed, step, index, i))
                loss, outputs = loss_at(model, names, values, inputs, targets, loss_fn)
                loss_p, loss_t = fwAD.unpack_dual(loss)
                out_p, out_t = fwAD.unpack_dual(outputs)
        except NotImplementedError as err:
            raise ModelConfigError(f"trainer 'fgrad_act' needs the forward-mode derivative of every operation of "
                                   f"{type(model).__name__}'s forward, and torch has none for one of them "
                                   f"({one_line(err)}); train it with mezo or backprop") from None
        finally:
            for handle in handles:
                handle.remove()
        return _Pass(loss_p, out_p, torch.zeros_like(loss_p) if loss_t is None else loss_t,
                     torch.zeros_like(out_p) if out_t is None else out_t, calls)

    @staticmethod
    def _example_scalars(one: _Pass, targets, loss_fn) -> torch.Tensor | None:
        """s_b = (dL/dy_b) . y'_b (the task loss's gradient at the outputs: a backward of the loss alone), or None
        where the task's loss cannot be taken of these outputs."""
        try:
            with torch.enable_grad():
                y = one.outputs.detach().requires_grad_()
                (e,) = torch.autograd.grad(loss_fn(y, targets), y)
        except (RuntimeError, TypeError, ValueError, IndexError):
            return None
        return (e * one.outputs_tangent).reshape(e.shape[0], -1).sum(1)

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        plan = self.plans[id(model)]
        named = trainable_parameters(model)
        params = [p for _, p in named]
        total = [torch.zeros_like(p) for p in params]
        n, o = self.options.directions, self.options
        first = None
        for index in range(n):
            one = self._pass(model, plan, inputs, targets, loss_fn, self.steps, index)
            if first is None:
                first = one
            whole = float(one.loss_tangent.detach())
            scalars = self._example_scalars(one, targets, loss_fn) if plan.per_example else None
            for i in plan.weights:
                total[i].add_(direction_of(params[i].shape, params[i], o.distribution, o.seed, self.steps, index, i),
                              alpha=whole / n)
            with torch.enable_grad():
                for k, (_, module) in enumerate(plan.layers):
                    own = [params[i] for i in plan.layer_params[k]]
                    for args, kwargs, u in one.calls[k]:
                        if scalars is None or u.shape[0] % scalars.shape[0]:  # shared by the batch: S u
                            delta = u * whole
                        else:
                            rows = scalars.repeat_interleave(u.shape[0] // scalars.shape[0]).to(u.dtype)
                            delta = u * rows.reshape(-1, *[1] * (u.dim() - 1))
                        grads = torch.autograd.grad(module.forward(*args, **kwargs), own, delta, allow_unused=True)
                        for i, g in zip(plan.layer_params[k], grads, strict=True):
                            if g is not None:
                                total[i].add_(g, alpha=1 / n)
        self.steps += 1
        write_grads(params, total)
        return StepOutput(loss=first.loss.detach(), outputs=first.outputs.detach())

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state.get("steps", 0))
