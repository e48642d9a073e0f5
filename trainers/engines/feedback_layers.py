"""FA and DFA on any model: every weight layer's backward uses the fixed feedback, the rest is autograd.

BioTorch's way (each nn.Linear and nn.Conv2d swapped for a layer whose backward uses the
feedback), here without replacing a module or a Parameter: during one gradient computation the
covered layers' forwards are replaced (instance attributes, put back after) by one autograd
function whose forward is the layer's and whose backward is, with delta the error at the
layer's output and x its input:

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

The layer path's self-check (``check_layer_path``, on the first batch, ``trainers.core.self_check``): each
covered layer's function on the input it received in the model's own forward gives the output the layer
gave (a layer that computes its weight or padding in its forward, as timm's StdConv2d and Conv2dSame do, is
refused, named), and FA with every feedback set to its forward weight is autograd of the model's own
forward, on every parameter (FA with B = W is backprop).
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.adapters.calling import call_model
from models.adapters.discovery import replaced_forwards
from models.errors import ModelConfigError
from trainers.core.engine import trainable_parameters
from trainers.core.self_check import differences, failures_refused, quiet, refuse_differences, tolerance

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
                isinstance(module, nn.Conv2d) and module.padding_mode == "zeros" and _padding(module) is not None):
            out.append((name, module))
    return out


def _padding(module: nn.Conv2d) -> tuple[int, int] | None:
    """The convolution's zero padding as numbers (``"same"`` and ``"valid"`` as written out, which the
    gradient functions of ``torch.nn.grad`` need), or None where ``"same"`` pads one side more."""
    if not isinstance(module.padding, str):
        return tuple(module.padding)
    if module.padding == "valid":
        return (0, 0)
    total = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size, strict=True)]
    return None if any(t % 2 for t in total) else (total[0] // 2, total[1] // 2)


class _Dense:
    """y = x W^T + b (nn.Linear), or y = x W + b (Conv1D: ``transposed``)."""

    def __init__(self, module: nn.Module):
        self.transposed = _is_conv1d(module)

    def forward(self, x, weight, bias):
        return F.linear(x, weight.t() if self.transposed else weight, bias)

    def weight_grad(self, x, g, shape):
        gw = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])  # (out, in)
        return gw.t() if self.transposed else gw

    def bias_grad(self, g):
        return g.reshape(-1, g.shape[-1]).sum(0)

    def feedback_input(self, g, B, shape):
        return g @ (B.t() if self.transposed else B)

    def fan_in(self, weight) -> int:
        return weight.shape[0] if self.transposed else weight.shape[1]


class _Conv:
    """A zero-padded nn.Conv2d."""

    def __init__(self, module: nn.Conv2d):
        self.args = (module.stride, _padding(module), module.dilation, module.groups)

    def forward(self, x, weight, bias):
        return F.conv2d(x, weight, bias, *self.args)

    def weight_grad(self, x, g, shape):
        return torch.nn.grad.conv2d_weight(x, shape, g, *self.args)

    def bias_grad(self, g):
        return g.sum((0, 2, 3))

    def feedback_input(self, g, B, shape):  # the transposed convolution with the random kernel
        return torch.nn.grad.conv2d_input(shape, B, g, *self.args)

    def fan_in(self, weight) -> int:
        return weight[0].numel()


def _kind(module: nn.Module) -> _Dense | _Conv:
    return _Conv(module) if isinstance(module, nn.Conv2d) else _Dense(module)


class _LocalBackward(torch.autograd.Function):
    """The layer's forward; a backward whose input gradient is ``feed(delta, x)`` (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, feed):
        ctx.save_for_backward(x)
        ctx.kind, ctx.feed, ctx.weight_shape = kind, feed, weight.shape
        return kind.forward(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gx = ctx.feed(g, x) if ctx.needs_input_grad[0] else None
        gw = ctx.kind.weight_grad(x, g, ctx.weight_shape) if ctx.needs_input_grad[1] else None
        gb = ctx.kind.bias_grad(g) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None


def _uniform(shape, fan_in: int, seed: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash(seed) % 2**63)
    return ((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) / math.sqrt(fan_in)).to(like)


class LocalFeedback:
    """FA (``direct=False``) or DFA (``direct=True``) on any model (module docstring). ``feedback``: layer name ->
    its random tensor (B or D), drawn when first needed; tests may set B = W."""

    def __init__(self, direct: bool, seed: int):
        self.direct, self.seed = direct, seed
        self.feedback: dict[str, torch.Tensor] = {}
        self._e: torch.Tensor | None = None  # DFA: the error at the model's output, this step

    def _tensor(self, index: int, name: str, shape, fan_in: int, like: torch.Tensor) -> torch.Tensor:
        t = self.feedback.get(name)
        if t is None or tuple(t.shape) != tuple(shape):
            t = self.feedback[name] = _uniform(shape, fan_in, (self.seed, index), like)
        elif t.dtype != like.dtype or t.device != like.device:
            t = self.feedback[name] = t.to(like)
        return t

    def _feed(self, index: int, name: str, module: nn.Module, kind) -> Callable:
        if not self.direct:
            def fa(g, x):
                B = self._tensor(index, name, module.weight.shape, kind.fan_in(module.weight), g)
                return kind.feedback_input(g, B, x.shape)
            return fa

        def dfa(g, x):
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
        """The layer's forward through ``_LocalBackward``."""
        kind = _kind(module)
        feed = self._feed(index, name, module, kind)
        return lambda x: _LocalBackward.apply(x, module.weight, module.bias, kind, feed)

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


def _layer_records(model: nn.Module, inputs, targets) -> tuple[torch.Tensor, list]:
    """The model's own outputs, and (name, module, input, output) of every covered layer's calls in it (copies:
    a later in-place operation may change them)."""
    records, handles = [], []
    for name, module in covered_layers(model):
        def keep(module, args, output, name=name):
            if args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor):
                records.append((name, module, args[0].detach().clone(), output.detach().clone()))
        handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            outputs = call_model(model, inputs, targets).outputs
    finally:
        for handle in handles:
            handle.remove()
    return outputs, records


def check_layer_path(model: nn.Module, inputs, targets, loss_fn, engine: str, feedback: LocalFeedback) -> None:
    """The layer path's self-check (module docstring): one ``ModelConfigError`` line if a covered layer's
    function is not its forward, if FA with B = W fails, if its gradients are not autograd's, or if the engine's
    own pass (``feedback``: its random tensors, drawn here as at its first step) fails on the batch."""
    named = trainable_parameters(model)
    params = [p for _, p in named]
    opt_out = f"--{engine}-self-check false (Python: self_check=False)"
    with quiet(model), failures_refused(f"trainer '{engine}'", f"--{engine}-self-check false"):
        _, records = _layer_records(model, inputs, targets)
        for name, module, x, y in records:
            with torch.no_grad():
                mine = _kind(module).forward(x, module.weight, module.bias)
            if mine.shape != y.shape or differences([name], [mine], [y], y.dtype):
                gap = "shapes differ" if mine.shape != y.shape else f"{float((mine - y).abs().max()):.2g}"
                raise ModelConfigError(
                    f"self-check: trainer '{engine}' runs {name} ({type(module).__name__}) as "
                    f"{'a convolution' if isinstance(module, nn.Conv2d) else 'a dense layer'} of its weight, which "
                    f"is not what its forward computes on the first batch (largest difference {gap}, tolerance "
                    f"{tolerance(y.dtype):g}): a weight or padding computed in its forward (weight standardisation, "
                    f"same padding) that the random feedback's layer function bypasses; train this model with "
                    f"backprop ({opt_out} skips the check)")
        outputs = call_model(model, inputs, targets).outputs
        # the graph kept: a tensor an eval-mode forward caches (timm's attention biases) is read again below
        expected = torch.autograd.grad(loss_fn(outputs, targets), params, allow_unused=True, retain_graph=True)
        mirror = LocalFeedback(direct=False, seed=0)  # FA with B = W: backprop
        mirror.feedback = {name: module.weight.detach() for name, module in covered_layers(model)}
        got = mirror.compute(model, inputs, targets, loss_fn, params)[2]
        feedback.compute(model, inputs, targets, loss_fn, params)  # a projection that cannot reach a layer
    refuse_differences(f"trainer '{engine}' with every feedback set to its forward weight (FA with B = W)",
                       [n for n, _ in named], got, expected, params[0].dtype,
                       "a layer whose backward the feedback replaces computes more than its weight and input show, "
                       "or a weight used outside its layer; train this model with backprop", opt_out)
