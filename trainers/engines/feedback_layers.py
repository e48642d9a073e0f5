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
lm_head is wte) gets the sum of both uses. Random tensors: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
with the fan-in of the map they replace (FA: the layer's input width or C_in k^2 / groups; DFA:
d_y), each drawn when first needed from a generator seeded by (feedback_seed, the layer's index
among the covered layers), never trained, saved in checkpoints.

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

from models.adapters.calling import call_model
from models.adapters.discovery import replaced_forwards
from models.errors import ModelConfigError
from trainers.core.engine import trainable_parameters
from trainers.core.self_check import (
    autograd_reference,
    differences,
    failures_refused,
    fresh_eval,
    quiet,
    refuse_differences,
)

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
        return F.linear(x, weight.t() if self.transposed else weight, bias)

    def weight_grad(self, x, g, shape):
        gw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])  # (out, in)
        return gw.t() if self.transposed else gw

    def bias_grad(self, g):
        return g.reshape(-1, g.shape[-1]).sum(0)

    def feedback_input(self, g, B, shape):
        return g @ (B.t() if self.transposed else B)

    def fan_in(self, shape) -> int:
        return shape[0] if self.transposed else shape[1]


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


class _LocalBackward(torch.autograd.Function):
    """The layer's call; a backward whose input gradient is ``feed(delta, x, weight)`` (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, feed):
        ctx.save_for_backward(x, weight)
        ctx.kind, ctx.feed = kind, feed
        return kind.forward(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
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


def _uniform(shape, fan_in: int, seed: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash(seed) % 2**63)
    return ((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) / math.sqrt(fan_in)).to(like)


class LocalFeedback:
    """FA (``direct=False``) or DFA (``direct=True``) on any model (module docstring). ``feedback``: layer name ->
    its random tensor (B or D), drawn when first needed; tests may set B = W. ``mirror``: FA with B = the weight
    each call uses (backprop: the self-check's)."""

    def __init__(self, direct: bool, seed: int, mirror: bool = False):
        self.direct, self.seed, self.mirror = direct, seed, mirror
        self.feedback: dict[str, torch.Tensor] = {}
        self.uncovered: set[str] = set()  # covered layers whose forward made no linear or convolution call
        self.written: set[str] = set()  # ... run as the function written out (the self-check found it equal)
        self._e: torch.Tensor | None = None  # DFA: the error at the model's output, this step

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

    def _tensor(self, index: int, name: str, shape, fan_in: int, like: torch.Tensor) -> torch.Tensor:
        t = self.feedback.get(name)
        if t is None or tuple(t.shape) != tuple(shape):
            t = self.feedback[name] = _uniform(shape, fan_in, (self.seed, index), like)
        elif t.dtype != like.dtype or t.device != like.device:
            t = self.feedback[name] = t.to(like)
        return t

    def _feed(self, index: int, name: str, kind) -> Callable:
        if not self.direct:
            def fa(g, x, weight):
                B = weight.detach() if self.mirror else self._tensor(index, name, weight.shape,
                                                                      kind.fan_in(weight.shape), g)
                return kind.feedback_input(g, B, x.shape)
            return fa

        def dfa(g, x, weight):
            e = self._e.to(g.dtype)  # a layer that computes in another dtype than the model's output
            batch = e.shape[0]
            dense = isinstance(kind, _Dense)
            if dense and e.shape[:-1].numel() == x.shape[:-1].numel():  # position by position (also flattened)
                D = self._tensor(index, name, (e.shape[-1], x.shape[-1]), e.shape[-1], g)
                return (e.reshape(-1, e.shape[-1]) @ D).reshape(x.shape).to(x.dtype)
            per_sample = x.shape[0] % batch == 0  # the batch leads (B, ...), or windows of it (B x windows, ...)
            if dense and e.dim() == 2 and per_sample:  # one error for every position
                D = self._tensor(index, name, (e.shape[-1], x.shape[-1]), e.shape[-1], g)
                return (e @ D).unsqueeze(1).expand(batch, x.shape[:-1].numel() // batch, x.shape[-1]) \
                    .reshape(x.shape).to(x.dtype)
            d_y = e[0].numel()
            if per_sample:  # per sample, whatever the layout
                D = self._tensor(index, name, (d_y, x.numel() // batch), d_y, g)
                return (e.reshape(batch, -1) @ D).reshape(x.shape).to(x.dtype)
            if x.shape[0] == 1:  # one input for the whole batch (DeBERTa's relative table): the samples' sum
                D = self._tensor(index, name, (d_y, x.numel()), d_y, g)
                return (e.reshape(batch, -1) @ D).sum(0).reshape(x.shape).to(x.dtype)
            raise ModelConfigError(f"trainer 'dfa' cannot project the output error {tuple(e.shape)} to the input "
                                   f"{tuple(x.shape)} of {name}: its first dimension is neither the batch ({batch}), "
                                   f"a multiple of it, nor 1")
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
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        self._e = None
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
        mirror = LocalFeedback(direct=False, seed=0, mirror=True)  # FA with B = W: backprop
        fresh_eval(model)
        mine, _, got = mirror.compute(model, inputs, targets, loss_fn, params)
        if mirror.uncovered:  # a layer that computes x W^T + b its own way (Falcon's): the function written out
            mirror.written = set(mirror.uncovered)
            fresh_eval(model)
            mine, _, got = mirror.compute(model, inputs, targets, loss_fn, params)
        if mine.shape != outputs.shape or differences(["outputs"], [mine], [outputs], outputs.dtype):
            written = f" (with {', '.join(sorted(mirror.written)[:3])} run as the function of their weight: their " \
                      f"forward makes no linear or convolution call)" if mirror.written else ""
            wrong = differences([n for n, _ in named], got, expected, params[0].dtype)
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
                       [n for n, _ in named], got, expected, params[0].dtype,
                       "a layer whose backward the feedback replaces computes more than its weight and input show, "
                       "or a weight used outside its layer; train this model with backprop", opt_out)
