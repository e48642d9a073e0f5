"""FA and DFA on any model: every weight layer's backward uses the fixed feedback, the rest is autograd.

BioTorch's way (each nn.Linear and nn.Conv2d swapped for a layer whose backward uses the
feedback), here without replacing a module or a Parameter: during one gradient computation each
covered layer's own forward runs, and its first ``F.linear`` or ``F.conv2d`` call (taken by a
``TorchFunctionMode`` while that forward runs) goes through one autograd function that computes
the call as given (the weight as the forward made it: standardised, parametrized; the input as it
padded it; in its dtype) and whose backward is, with delta the error at the call's output, x its
input and W its weight (autograd carries grad W on through whatever made W):

    grad W = delta^T x,  grad b = sum delta      (the layer's own, local and exact)
    grad x = delta B      FA: B fixed random, of W's shape (backprop is B = W)
           = e D          DFA: e = dL/dy at the model's output, D fixed random d_y x d_x

Everything between covered layers (activations, norms, attention's products, residual
additions, embeddings) is differentiated exactly by autograd: in a ResNet or a Transformer the
residual path carries the error exactly and each covered layer hands a feedback error to what
lies below it. On a layer stack, h_l = act(A_l h_{l-1} + b_l), this is the stack path of
``feedback_alignment`` exactly: DFA's e D arrives at h_l, the input of layer l + 1, and meets
act'(a_l) there (Nøkland's delta_l = (D_l e) * f'(a_l)).

DFA's projection reads the layers' shapes: where the layer's input has as many positions as the
output (a Transformer's (B, T, d) and an LM's (B, T, V), also flattened to (B T, d) as OPT's MLP
does) D is d_y x d_in, applied at every position; a per-sample output (B, C) against an input of
several positions per sample ((B, T, d), Swin's windows (B x windows, t, d)) is projected to every
position alike; otherwise (convolutions) D is d_y x (the input's size per sample), as on the stack
path; an input shared by the whole batch (DeBERTa's relative-position table, (1, ...)) gets the sum of
the samples' projections. The error is projected in the layer's dtype (a layer that computes in float32 inside a
float64 model). Covered: nn.Linear, zero-padded nn.Conv2d, transformers' Conv1D (y = x W + b with
W (in, out): 8 of GPT-2's 9 projections); ``padding="same"`` where both sides get as much. Parameters
of other modules (embeddings, norms) get
autograd's gradient of the error that reaches them; a weight tied to a covered layer (GPT-2's
lm_head is wte) gets the sum of both uses. B is the engine's rule of the weight the call uses
(``trainers.engines.feedback_rules``: fa, usf, brsf, frsf), at the rms its ``scale`` gives, each
drawn when first needed from a generator seeded by (feedback_seed, the layer's index among the
covered layers), never trained, saved in checkpoints. DFA's D of every layer is a slice of one
random matrix per layout of the error (per position, per sample), so that the error is projected
once per step (``LocalFeedback``).

A covered layer whose forward makes no such call (Falcon's ``x @ W.T + b``) runs as that function
written out on its stored weight, where the self-check finds it equal to the layer's forward.

The layer path's self-check (``check_layer_path``, on the first batch, ``trainers.core.self_check``): the
forward through the layer functions is the model's own, FA with every feedback set to the weight each call
uses (``mirror``) is autograd of the model's own forward on every parameter (FA with B = W is backprop),
and DFA's own pass runs once.
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from gradengines.models.adapters.calling import call_model
from gradengines.models.adapters.discovery import replaced_forwards
from gradengines.models.errors import ModelConfigError
from gradengines.trainers.core.engine import trainable_parameters
from gradengines.trainers.core.self_check import (
    autograd_reference,
    differences,
    failures_refused,
    fresh_eval,
    loosest,
    quiet,
    refuse_differences,
)
from gradengines.trainers.engines.feedback_rules import RULES, Scale, generator, scale_of, uniform

__all__ = ["covered_layers", "LocalFeedback", "check_layer_path"]


def _is_conv1d(module: nn.Module) -> bool:
    """transformers' Conv1D: a dense layer y = x W + b with W stored (in, out)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None


def covered_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every layer whose backward the feedback replaces, in module order."""
    out = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or not weight.requires_grad:
            continue
        if isinstance(module, nn.Linear) or _is_conv1d(module) or (
                isinstance(module, nn.Conv2d) and module.padding_mode == "zeros"
                and _padding(module.padding, module.kernel_size, module.dilation) is not None):
            out.append((name, module))
    return out


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _padding(padding, kernel_size, dilation) -> tuple[int, int] | None:
    """A convolution's zero padding as numbers (``"same"`` and ``"valid"`` written out, as the gradient
    functions of ``torch.nn.grad`` need them), or None where ``"same"`` pads one side more."""
    if not isinstance(padding, str):
        return _pair(padding)
    if padding == "valid":
        return (0, 0)
    total = [d * (k - 1) for d, k in zip(_pair(dilation), _pair(kernel_size), strict=True)]
    return None if any(t % 2 for t in total) else (total[0] // 2, total[1] // 2)


class _Dense:
    """y = x W^T + b (``F.linear``), or y = x W + b (Conv1D: ``transposed``)."""

    def __init__(self, transposed: bool = False):
        self.transposed = transposed

    def forward(self, x, weight, bias):
        # on a (B, T, d) input F.linear with a bias returns a view of its 2-D product, and a view made inside an
        # autograd Function forbids the model's in-place writes into the output (Longformer): the bias added
        # after the product instead, into a tensor of its own
        out = F.linear(x, weight.t() if self.transposed else weight, None if x.dim() > 2 else bias)
        return out.add_(bias) if x.dim() > 2 and bias is not None else out

    def weight_grad(self, x, g, shape):
        gw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])  # (out, in)
        return gw.t() if self.transposed else gw

    def bias_grad(self, g):
        return g.reshape(-1, g.shape[-1]).sum(0)

    def feedback_input(self, g, B, shape):
        return g @ (B.t() if self.transposed else B)

    def fan_in(self, shape) -> int:
        return shape[0] if self.transposed else shape[1]

    def fan_out(self, shape) -> int:
        return shape[1] if self.transposed else shape[0]


class _Conv:
    """``F.conv2d`` with zero padding given as numbers."""

    def __init__(self, stride, padding, dilation, groups):
        self.args = (stride, padding, dilation, groups)

    def forward(self, x, weight, bias):
        return F.conv2d(x, weight, bias, *self.args)

    def weight_grad(self, x, g, shape):
        return torch.nn.grad.conv2d_weight(x, shape, g, *self.args)

    def bias_grad(self, g):
        return g.sum((0, 2, 3))

    def feedback_input(self, g, B, shape):  # the transposed convolution with the random kernel
        return torch.nn.grad.conv2d_input(shape, B, g, *self.args)

    def fan_in(self, shape) -> int:
        return math.prod(shape[1:])

    def fan_out(self, shape) -> int:
        return shape[0] * math.prod(shape[2:])


class _LocalBackward(torch.autograd.Function):
    """The layer's call; a backward whose input gradient is ``feed(delta, x, weight)`` (module docstring).

    Under autocast the call computes in half precision; the backward then computes in that dtype too, as autograd's
    backward of the autocast call does (the gradients returned are cast back to the inputs' dtypes by autograd)."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, feed):
        ctx.save_for_backward(x, weight)
        ctx.kind, ctx.feed = kind, feed
        out = kind.forward(x, weight, bias)
        ctx.computed = out.dtype
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight = (t.to(ctx.computed) for t in ctx.saved_tensors)
        g = g.to(ctx.computed)
        gx = ctx.feed(g, x, weight) if ctx.needs_input_grad[0] else None
        gw = ctx.kind.weight_grad(x, g, weight.shape) if ctx.needs_input_grad[1] else None
        gb = ctx.kind.bias_grad(g) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None


_LINEAR = ("input", "weight", "bias")
_CONV2D = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class _Intercept(TorchFunctionMode):
    """While a covered layer's own forward runs, its first ``F.linear`` or ``F.conv2d`` call runs through
    ``_LocalBackward`` with the arguments the forward gives it: the weight as the forward computes it (weight
    standardisation, a parametrization), the input as it pads it (TF's "same" padding), in its dtype; autograd
    differentiates whatever computed them. ``done``: a call was taken."""

    def __init__(self, feed_for: Callable):
        super().__init__()
        self.feed_for, self.done = feed_for, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.done and (func is F.linear or func is F.conv2d):
            given = {**dict(zip(_LINEAR if func is F.linear else _CONV2D, args, strict=False)), **kwargs}
            kind: _Dense | _Conv | None = _Dense()
            if func is F.conv2d:
                padding = _padding(given.get("padding", 0), given["weight"].shape[2:], given.get("dilation", 1))
                kind = None if padding is None else _Conv(given.get("stride", 1), padding, given.get("dilation", 1),
                                                          given.get("groups", 1))
            if kind is not None:
                self.done = True
                return _LocalBackward.apply(given["input"], given["weight"], given.get("bias"), kind,
                                            self.feed_for(kind))
        return func(*args, **kwargs)


class LocalFeedback:
    """One rule of the FA family (``rule``: fa, usf, brsf, frsf; ``trainers.engines.feedback_rules``) or DFA
    (``rule="dfa"``) on any model (module docstring).

    FA family: ``feedback`` maps a layer's name to what its rule keeps (B itself for fa: tests may set B = W;
    r for usf, a for brsf, a |M| for frsf), drawn when first needed; ``used``: the B each layer's backward used
    at the last step, of the weight's shape. ``mirror``: FA with B = the weight each call uses (backprop: the
    self-check's).

    DFA: one projection per step. One random matrix (``projection``, U(-1, 1), d_y x width) for the output
    error laid out per position (B T, d_y) and one for it per sample (B, d_y ...); each layer reads a slice of
    its columns (``slices``: key, offset, width), scaled by the layer's a; the product of the error with the
    whole matrix is computed once per step, whatever the number of layers (Launay et al. 2020, Sec. 3).
    ``shared``: every slice starts at column 0 (their single matrix); else the slices are disjoint (the same
    numbers as one matrix per layer). A matrix set in ``feedback`` for a layer (tests) is projected on its own."""

    def __init__(self, rule: str, seed: int, scale: Scale = "fan_in", shared: bool = True, mirror: bool = False):
        self.direct, self.seed, self.scale, self.shared, self.mirror = rule == "dfa", seed, scale, shared, mirror
        self.rule = None if self.direct else RULES[rule]
        self.feedback: dict[str, torch.Tensor] = {}
        self.used: dict[str, torch.Tensor] = {}
        self.weights: dict[str, torch.Tensor] = {}  # the weight each layer's call used at the last step
        self.step = 0  # steps taken (brsf's magnitudes are drawn from (seed, layer, step))
        self.projection: dict[str, torch.Tensor] = {}
        self.slices: dict[str, tuple[str, int, int, float]] = {}
        self.uncovered: set[str] = set()  # covered layers whose forward made no linear or convolution call
        self.written: set[str] = set()  # ... run as the function written out (the self-check found it equal)
        self._e: torch.Tensor | None = None  # DFA: the error at the model's output, this step
        self._projected: dict[str, torch.Tensor] = {}  # DFA: the error times the whole projection, this step

    def coverage(self, model: nn.Module) -> str:
        """One line: how many layers' backward the feedback replaces, by class, and which run as their function
        written out (``written``, set by the self-check)."""
        counts: dict[str, int] = {}
        for _, module in covered_layers(model):
            counts[type(module).__name__] = counts.get(type(module).__name__, 0) + 1
        line = (f"the backward of {sum(counts.values())} layers of {type(model).__name__} replaced by the feedback ("
                + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + "); everything else exact")
        if self.written:
            names = sorted(self.written)
            line += (f"; {len(names)} run as x W^T + b written out, their forward making no linear call "
                     f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})")
        return line

    def state(self) -> dict:
        return {"feedback": self.feedback, "used": self.used, "step": self.step, "projection": self.projection,
                "slices": self.slices}

    def load(self, state: dict) -> None:
        if state and all(isinstance(t, torch.Tensor) for t in state.values()):  # before the FA family: the tensors
            state = {"feedback": state}
        self.feedback = dict(state.get("feedback", {}))
        self.used = dict(state.get("used", {}))
        self.step = state.get("step", 0)
        self.projection = dict(state.get("projection", {}))
        self.slices = dict(state.get("slices", {}))

    def _kept(self, index: int, name: str, weight: torch.Tensor, kind, like: torch.Tensor) -> torch.Tensor:
        """What the FA-family rule keeps for layer ``name``: drawn at first use (or when W's shape changed)."""
        t = self.feedback.get(name)
        if t is None or (t.dim() and tuple(t.shape) != tuple(weight.shape)):
            r = scale_of(self.scale, kind.fan_in(weight.shape), kind.fan_out(weight.shape), weight)
            t = self.feedback[name] = self.rule.kept(weight.shape, r, generator(self.seed, index), like)
        elif t.dtype != like.dtype or t.device != like.device:
            t = self.feedback[name] = t.to(like)
        return t

    def matrix(self, name: str) -> torch.Tensor:
        """DFA: layer ``name``'s D (d_y x its width), set or sliced from the projection, as its backward uses it."""
        if name in self.feedback:
            return self.feedback[name]
        key, offset, width, amplitude = self.slices[name]
        return self.projection[key][:, offset:offset + width] * amplitude

    def _project(self, index: int, name: str, key: str, errors: torch.Tensor, width: int,
                 weight: torch.Tensor, kind) -> torch.Tensor:
        """DFA: ``errors`` (rows, d_y) times layer ``name``'s D (module docstring): its slice of the one product
        of the step, the projection drawn or widened when first needed."""
        if name in self.feedback:
            return errors @ self.feedback[name].to(errors)
        base = self.projection.get(key)
        if base is not None and base.shape[0] != errors.shape[1]:  # another output size (a batch of another
            del self.projection[key]  # length seen per sample): drawn again, every slice of it with it
            self.slices = {n: s for n, s in self.slices.items() if s[0] != key}
            base = None
        if name not in self.slices:
            drawn = 0 if base is None else base.shape[1]
            offset = 0 if self.shared else sum(w for k, _, w, _ in self.slices.values() if k == key)
            if offset + width > drawn:  # the projection widened by the columns this layer needs
                fresh = uniform((errors.shape[1], offset + width - drawn), generator(self.seed, index, drawn))
                self.projection[key] = fresh.to(errors) if base is None else torch.cat([base, fresh.to(base)], 1)
            r = scale_of(self.scale, errors.shape[1], width, weight)
            self.slices[name] = (key, offset, width, math.sqrt(3) * r)
        key, offset, width, amplitude = self.slices[name]
        base = self.projection[key]
        if base.dtype != errors.dtype or base.device != errors.device:
            base = self.projection[key] = base.to(errors)
        projected = self._projected.get(key)
        if projected is None or projected.shape[1] < offset + width:
            projected = self._projected[key] = errors @ base
        return projected[:, offset:offset + width] * amplitude

    def _feed(self, index: int, name: str, kind) -> Callable:
        if not self.direct:
            def fa(g, x, weight):
                if self.mirror:
                    B = weight.detach()
                else:
                    kept = self._kept(index, name, weight, kind, g)
                    B = self.rule.feedback(kept, weight, generator(self.seed, index, self.step)
                                           if self.rule.redrawn else None)
                    self.used[name], self.weights[name] = B, weight.detach()
                return kind.feedback_input(g, B, x.shape)
            return fa

        def dfa(g, x, weight):
            e = self._e.to(g.dtype)  # a layer that computes in another dtype than the model's output
            batch = e.shape[0]
            dense = isinstance(kind, _Dense)
            position = "position" if e.dim() > 2 else "sample"
            if dense and e.shape[:-1].numel() == x.shape[:-1].numel():  # position by position (also flattened)
                P = self._project(index, name, position, e.reshape(-1, e.shape[-1]), x.shape[-1], weight, kind)
                return P.reshape(x.shape).to(x.dtype)
            per_sample = x.shape[0] % batch == 0  # the batch leads (B, ...), or windows of it (B x windows, ...)
            if dense and e.dim() == 2 and per_sample:  # one error for every position
                P = self._project(index, name, "sample", e, x.shape[-1], weight, kind)
                return P.unsqueeze(1).expand(batch, x.shape[:-1].numel() // batch, x.shape[-1]) \
                    .reshape(x.shape).to(x.dtype)
            if per_sample:  # per sample, whatever the layout
                P = self._project(index, name, "sample", e.reshape(batch, -1), x.numel() // batch, weight, kind)
                return P.reshape(x.shape).to(x.dtype)
            # one input for the whole batch, led by 1 (DeBERTa's relative table) or by no batch dimension at all
            # (timm's relative-position MLP on its coordinates): the samples' projections summed
            P = self._project(index, name, "sample", e.reshape(batch, -1), x.numel(), weight, kind)
            return P.sum(0).reshape(x.shape).to(x.dtype)
        return dfa

    def _forward(self, index: int, name: str, module: nn.Module) -> Callable:
        """The layer's own forward, its linear or convolution call through ``_LocalBackward`` (``_Intercept``);
        transformers' Conv1D (x W + b by ``addmm``) and the layers ``written`` as that function written out."""
        if _is_conv1d(module) or name in self.written:
            kind = _Dense(transposed=_is_conv1d(module)) if not isinstance(module, nn.Conv2d) else _Conv(
                module.stride, _padding(module.padding, module.kernel_size, module.dilation), module.dilation,
                module.groups)
            feed = self._feed(index, name, kind)
            return lambda x: _LocalBackward.apply(x, module.weight, module.bias, kind, feed)
        forward = type(module).forward

        def run(*args, **kwargs):
            intercept = _Intercept(lambda kind: self._feed(index, name, kind))
            with intercept:
                out = forward(module, *args, **kwargs)
            if not intercept.done:
                self.uncovered.add(name)
            return out
        return run

    def compute(self, model: nn.Module, inputs, targets, loss_fn, params: list[torch.Tensor]):
        """(outputs, loss, gradients of ``params``) with every covered layer's backward swapped."""
        replace = {module: self._forward(index, name, module) for index, (name, module) in
                   enumerate(covered_layers(model))}
        with replaced_forwards(replace):
            outputs = call_model(model, inputs, targets).outputs
        if self.direct and outputs.requires_grad:
            outputs.register_hook(self._keep_error)
        loss = loss_fn(outputs, targets)
        try:
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        finally:
            self._e, self._projected = None, {}
        if not self.mirror:
            self.step += 1
        return outputs, loss, grads

    def _keep_error(self, e: torch.Tensor) -> None:
        self._e = e  # dL/dy: reaches the output before any layer's backward runs


def check_layer_path(model: nn.Module, inputs, targets, loss_fn, engine: str, feedback: LocalFeedback) -> None:
    """The layer path's self-check (module docstring): one ``ModelConfigError`` line if a covered layer's forward
    makes no linear or convolution call, if the forward through the layer functions is not the model's own, if
    FA with B = W is not autograd, or if DFA's own pass (``feedback``: its random tensors, drawn here as at its
    first step) fails on the batch."""
    named = trainable_parameters(model)
    params = [p for _, p in named]
    opt_out = f"--{engine}-self-check false (Python: self_check=False)"
    with quiet(model), failures_refused(f"trainer '{engine}'", f"--{engine}-self-check false"):
        outputs, expected = autograd_reference(model, inputs, targets, loss_fn, params)
        mirror = LocalFeedback("fa", seed=0, mirror=True)  # FA with B = W: backprop
        mine, _, got = mirror.compute(model, inputs, targets, loss_fn, params)
        if mirror.uncovered:  # a layer that computes x W^T + b its own way (Falcon's): the function written out
            mirror.written = set(mirror.uncovered)
            fresh_eval(model)
            mine, _, got = mirror.compute(model, inputs, targets, loss_fn, params)
        if mine.shape != outputs.shape or differences(["outputs"], [mine], [outputs], outputs.dtype):
            written = f" (with {', '.join(sorted(mirror.written)[:3])} run as the function of their weight: their " \
                      f"forward makes no linear or convolution call)" if mirror.written else ""
            wrong = differences([n for n, _ in named], got, expected, loosest(params))
            raise ModelConfigError(
                f"self-check: trainer '{engine}''s forward through the layer functions{written} is not the model's "
                f"own on the first batch ({len(wrong)} of {len(named)} parameter gradients then differ, first "
                f"{', '.join(name for name, _ in wrong[:3]) or 'none'}); train this model with backprop ({opt_out} "
                f"skips the check)")
        feedback.written = set(mirror.written)
        if feedback.direct:  # a projection that cannot reach a layer (FA's feedback has its layer's shape)
            fresh_eval(model)
            feedback.compute(model, inputs, targets, loss_fn, params)
    refuse_differences(f"trainer '{engine}' with every feedback set to its forward weight (FA with B = W)",
                       [n for n, _ in named], got, expected, loosest(params),
                       "a layer whose backward the feedback replaces computes more than its weight and input show, "
                       "or a weight used outside its layer; train this model with backprop", opt_out)
