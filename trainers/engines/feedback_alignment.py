"""The feedback-alignment family (FA, its sign-symmetric rules usf, brsf, frsf) and direct
feedback alignment (DFA): backprop's error path with other matrices in place of the
transposed forward weights.

On a layer stack (``trainers.core.protocols.LayerStack``), ``a_l = A_l h_{l-1} + b_l``,
``h_l = act(drop_l(a_l))``, ``y = A_L h_{L-1} + b_L``, with ``e = dloss/dy`` per
sample (``softmax(y) - onehot`` for cross-entropy):

    delta_L = e
    FA  (Lillicrap et al., Nat. Commun. 2016):  delta_l = (B_{l+1}^T delta_{l+1}) * dh_l/da_l
    DFA (Nøkland, NeurIPS 2016):                delta_l = (D_l^T e) * dh_l/da_l
    G_l = (1/B) sum_batch delta_l h_{l-1}^T,   G_{b_l} = (1/B) sum_batch delta_l

``B_l`` is a fixed random map of the kind and shape of ``A_l`` (backprop is FA
with ``B_l = A_l``), applied as ``A_l``'s adjoint would be:

* ``nn.Linear`` (or a layer wrapping one as ``.linear``): a matrix shaped like
  ``W_l``, ``B^T v = v B``;
* ``nn.Conv2d`` (zero padding): a kernel shaped like the layer's,
  ``B^T v = conv_transpose2d(v, B)`` with the layer's stride, padding, dilation
  and groups (``torch.nn.grad.conv2d_input``), as BioTorch's FA convolution;
* a linear module with an ``adjoint`` and one ``weight`` (the zoo's orthogonal
  convolutions): a fixed copy of the module with a random ``weight``, whose
  adjoint is applied (a random orthogonal convolution).

What B_l is, given the layer's current weight, is the engine's rule
(``trainers.engines.feedback_rules``): ``fa`` a fixed random B; ``usf``, ``brsf``,
``frsf`` the sign-symmetric rules of Liao, Leibo & Poggio (2016), B = (uniform,
batchwise random or fixed random magnitudes) o sign(W_l), the sign read at every
step; the option ``scale`` sets each layer's rms (the fan-in draw, BioTorch's
Glorot factor, or the rms of the layer's own weight). The sign rules refuse the
zoo's orthogonal convolutions (their map is a function of the kernel, whose signs
are not the map's).

``D_l`` is a ``d_L x (features of a_l)`` matrix: the output error projected to
each hidden layer's output shape, convolutional or dense (with one hidden
layer, DFA with ``D_1 = W_2`` is backprop). The ``D_l`` are slices of one random
matrix D (d_L x width), scaled per layer: e D is computed once per step and each
layer reads its columns (``slices=shared``: the first ones, Launay et al. 2020;
``disjoint``: its own, as separate matrices would be). ``dh_l/da_l`` (activation and
dropout mask) is one local autograd call per layer; the weight gradients of a
convolution are one local VJP (``write_layer_grads``); nothing is
differentiated through the network. The random tensors are drawn once, at the
first step, from the engine's own generator (``feedback_seed``; brsf draws its
magnitudes again at every step from (seed, layer, step)), never trained, and
saved in checkpoints. FA and DFA are the usual baselines of forward-learning
papers (the FOTON paper's results table reports both beside PEPITA).

Any other model (a ResNet, a Transformer of transformers or timm, a user's
module) takes the layer path (``trainers.engines.feedback_layers``): every
nn.Linear, zero-padded nn.Conv2d and transformers Conv1D runs its forward
through a function whose backward uses the same feedback, and autograd does
the rest. ``path=auto`` takes the stack path on a layer stack and the layer path
elsewhere. Measured on the zoo's MLP and CNN (BENCHMARKS.md "Models from
transformers and timm"), the layer path is as fast or 5-10% faster and holds less
memory; the stack path stays the default there because a switch would redraw the
feedback of every recorded FA/DFA result (the same distribution, other draws:
tests/test_feedback_layers.py shows the two paths equal with the same feedback).
"""

import copy
import dataclasses
import math
from typing import Literal

import torch
import torch.nn as nn

from gradengines.models.orthogonal.conv import OrthogonalConv2d
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import ConfigError, IncompatibleModelError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.protocols import LayerStack, require
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.engines.feedback_layers import LocalFeedback, check_layer_path, covered_layers
from gradengines.trainers.engines.feedback_rules import RULES, Scale, generator, scale_of, uniform
from gradengines.trainers.engines.forward_only import linear_part, output_error, write_layer_grads
from gradengines.trainers.engines.weights import weights_once

__all__ = ["FeedbackAlignment", "UniformSignFeedback", "BatchRandomSignFeedback", "FixedRandomSignFeedback",
           "DirectFeedbackAlignment"]


_ZOO = "mlp, convnet, ortho_lenet, ortho_convnet"


def _kernel(layer: nn.Module) -> tuple[str, nn.Parameter] | None:
    """The one ``weight`` of a linear module with an adjoint (the zoo's orthogonal convolutions), by name."""
    weights = [(n, p) for n, p in layer.named_parameters() if n.rsplit(".", 1)[-1] == "weight"]
    return weights[0] if hasattr(layer, "adjoint") and len(weights) == 1 else None


def feedback_kind(layer: nn.Module) -> str | None:
    """How FA's random feedback replaces ``layer``'s adjoint: dense, conv, adjoint (module docstring), or None."""
    if linear_part(layer) is not None:
        return "dense"
    if isinstance(layer, nn.Conv2d) and layer.padding_mode == "zeros":
        return "conv"
    return "adjoint" if _kernel(layer) is not None else None


def feedback_shape(layer: nn.Module) -> tuple[tuple[int, ...], int]:
    """(shape, fan-in) of FA's random tensor for ``layer``: W's, the kernel's, the module's weight's; read from
    the module's sizes, never by computing a parametrized weight (geotorch's would cost a matrix exponential)."""
    kind = feedback_kind(layer)
    if kind == "dense":
        linear = linear_part(layer)
        return (linear.out_features, linear.in_features), linear.in_features
    weight = layer.weight if kind == "conv" else _kernel(layer)[1]
    return tuple(weight.shape), weight[0].numel()


def _constant(value: torch.Tensor):
    """A function that returns ``value`` (a fixed twin's symbol)."""
    return lambda: value


def _graph(output: torch.Tensor) -> torch.Tensor | None:
    """A layer output that carries a graph to its parameters, else None (closed-form layers)."""
    return output if output.requires_grad else None


_SCALE_HELP = ("the feedback's rms per layer: fan_in 1/sqrt(3 fan_in) (U(+-1/sqrt(fan_in)), the papers' draw); "
               "glorot sqrt(2/(fan_in+fan_out)) (BioTorch's factor); weight: the rms of the layer's weight when "
               "first drawn (trainers/engines/feedback_rules.py)")


def _weight(layer: nn.Module) -> torch.Tensor:
    """The weight a stack layer's map uses this step (a parametrized one as computed), or the kernel of an adjoint."""
    kind = feedback_kind(layer)
    if kind == "dense":
        return linear_part(layer).weight
    return layer.weight if kind == "conv" else _kernel(layer)[1]


def _fan_out(layer: nn.Module, shape: tuple[int, ...]) -> int:
    return shape[0] if feedback_kind(layer) == "dense" else shape[0] * math.prod(shape[2:])


class _RandomFeedback(GradientEngine):
    """The pass shared by the FA family and DFA; subclasses give the feedback shapes and the projection."""

    rule = "fa"  # trainers.engines.feedback_rules.RULES, or "dfa"

    @dataclasses.dataclass
    class Options:
        feedback_seed: int = option(0, "seed of the fixed random feedback matrices")
        scale: Scale = option("fan_in", _SCALE_HELP)
        path: Literal["auto", "stack", "layers"] = option(
            "auto", "stack: the layer-stack pass (no backward through the network); layers: every weight layer's "
                    "backward swapped, autograd elsewhere (any model); auto: stack on a layer stack")
        self_check: bool = option(
            True, "on the first batch of the layer path, each covered layer's function equals its forward and its "
                  "swapped backward, given the forward weight as feedback, equals autograd's, or the model is refused "
                  "in one line; false: skip (checked once)")

    def __init__(self, **options):
        super().__init__(**options)
        if not 0 <= self.options.feedback_seed < 2**63:
            raise ConfigError(f"--{self.name}-feedback-seed must be in [0, 2**63), got {self.options.feedback_seed}")
        self.feedback: list[torch.Tensor] | None = None  # the stack path's: drawn at the first step
        self.steps = 0  # the stack path's steps (brsf draws its magnitudes from (seed, layer, step))
        self.layers = LocalFeedback(self.rule, self.options.feedback_seed, self.options.scale,
                                    getattr(self.options, "slices", "shared") == "shared")  # the layer path's

    def _stack_path(self, model: nn.Module) -> bool:
        return self.options.path == "stack" or (self.options.path == "auto" and isinstance(model, LayerStack))

    def check(self, model: nn.Module) -> None:
        if not self._stack_path(model):
            if not covered_layers(model):
                raise IncompatibleModelError(
                    f"trainer '{self.name}' replaces the backward of nn.Linear, zero-padded nn.Conv2d or transformers "
                    f"Conv1D layers with random feedback; {type(model).__name__} has none that is trained")
            return
        require(model, LayerStack, self.name, "a layer stack h_l = act(A_l h_{l-1} + b_l) of nn.Linear or nn.Conv2d "
                "layers", _ZOO)
        others = [type(layer).__name__ for layer in model.layers if feedback_kind(layer) is None]
        if others:
            raise IncompatibleModelError(f"trainer '{self.name}' needs nn.Linear or zero-padded nn.Conv2d layers (or "
                                         f"linear maps with an adjoint and one weight): random feedback replaces "
                                         f"their transposes; {type(model).__name__} has {others[0]} (zoo models that "
                                         f"qualify: {_ZOO})")

    def first_batch_check(self, model, inputs, targets, loss_fn) -> None:
        """The layer path's self-check (``trainers.engines.feedback_layers.check_layer_path``); the stack path
        needs none: its layers are the declared stack's."""
        if self.options.self_check and not self._stack_path(model):
            check_layer_path(model, inputs, targets, loss_fn, self.name, self.layers)

    def structure(self, model: nn.Module) -> str | None:
        """The layer path's coverage (``LocalFeedback.coverage``); nothing on the stack path."""
        return None if self._stack_path(model) else f"{self.name}: {self.layers.coverage(model)}"

    def feedback_shapes(self, layers: list[nn.Module], hidden: list[torch.Size],
                        outputs: int) -> list[tuple[tuple[int, ...], int]]:
        """(shape, fan-in) of each random tensor, from the layers, the hidden output shapes and d_L."""
        raise NotImplementedError

    def draw(self, model: nn.Module, e: torch.Tensor, hidden: list[torch.Size]) -> None:
        """The stack path's random tensors, drawn at the first step from one generator (``feedback_seed``)."""
        raise NotImplementedError

    def project(self, hidden: int, delta_above: torch.Tensor, e: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The error reaching hidden layer ``hidden`` (0-based), of ``shape`` (its output's, with the batch),
        before its activation's derivative."""
        raise NotImplementedError

    def _drawn(self, model: nn.Module, e: torch.Tensor, hidden: list[torch.Size]) -> bool:
        """Whether the stack path's tensors exist for these shapes (moved to ``e``'s device and dtype)."""
        self._layers = list(model.layers)
        shapes = self.feedback_shapes(self._layers, hidden, e.shape[1])
        if self.feedback is None or len(self.feedback) != len(shapes) or any(
                f.dim() and tuple(f.shape) != shape for f, (shape, _) in zip(self.feedback, shapes, strict=True)):
            return False  # (a scalar kept, usf's r and brsf's a, fits any shape)
        if any(f.dtype != e.dtype or f.device != e.device for f in self.feedback):
            self.feedback = [f.to(e) for f in self.feedback]
        return True

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        if not self._stack_path(model):
            params = [p for _, p in trainable_parameters(model)]
            outputs, loss, grads = self.layers.compute(model, inputs, targets, loss_fn, params)
            write_grads(params, grads)
            return StepOutput(loss=loss.detach(), outputs=outputs.detach())
        with weights_once(model):  # each parametrized weight once per step, as in backprop
            return self._stack_grads(model, inputs, targets, loss_fn)

    def _stack_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        """The layer-stack pass (module docstring): a forward with local graphs, then the random feedback."""
        layers = list(model.layers)
        batch = inputs.shape[0]
        with torch.no_grad():
            h = model.input_features(inputs)
        # h_0 .. h_{L-1}; a_l and h_l of the hidden layers, with a local graph; each layer's output with its graph
        # to the layer's parameters where they are not a closed form (convolutions: one VJP, no second forward)
        hs, pre, post, outs = [h], [], [], []
        for layer in layers:
            with torch.set_grad_enabled(linear_part(layer) is None):
                outs.append(layer(h))
            if len(outs) == len(layers):
                break
            a = outs[-1].detach().requires_grad_()
            with torch.enable_grad():
                out = model.act(model.dropouts[len(pre)](a))  # masks drawn in layer order, as one backprop forward
            pre.append(a)
            post.append(out)
            h = out.detach()
            hs.append(h)
        y = outs[-1].detach()
        e = output_error(y, targets, loss_fn)  # (B, d_L)
        if not self._drawn(model, e, [a.shape[1:] for a in pre]):
            self.draw(model, e, [a.shape[1:] for a in pre])
        write_layer_grads(layers[-1], hs[-1], e, batch, output=_graph(outs[-1]))
        delta = e
        for i in reversed(range(len(layers) - 1)):
            (delta,) = torch.autograd.grad(post[i], pre[i], self.project(i, delta, e, pre[i].shape))  # * dh_i/da_i
            write_layer_grads(layers[i], hs[i], delta, batch, output=_graph(outs[i]))
        self.steps += 1
        with torch.no_grad():
            loss = loss_fn(y, targets)
        return StepOutput(loss=loss.detach(), outputs=y.detach())


@register_engine("fa")
class FeedbackAlignment(_RandomFeedback):
    """FA (module docstring): delta_l = (B_{l+1}^T delta_{l+1}) * dh_l/da_l, B_l of the kind and shape of A_l;
    what B is given W: ``rule`` (``trainers.engines.feedback_rules``); the sign-symmetric rules below."""

    @dataclasses.dataclass
    class Options(_RandomFeedback.Options):
        scale: Scale = option("weight", _SCALE_HELP + "; default weight: on GPT-2 (N(0, 0.02) weights) the fan-in "
                                                      "draw is 3.6x the weights and FA diverges (BENCHMARKS.md)")

    def __init__(self, **options):
        super().__init__(**options)
        self.used: list[torch.Tensor] = []  # the stack path's B_2 .. B_L of the last step
        self._used_weights: list[torch.Tensor] = []  # ... and the W_2 .. W_L they stood for
        self._twins: dict[int, nn.Module] = {}  # fixed random copies of adjoint modules, made from the feedback

    def check(self, model: nn.Module) -> None:
        super().check(model)
        if RULES[self.rule].signed and self._stack_path(model):
            adjoint = [type(layer).__name__ for layer in model.layers[1:] if feedback_kind(layer) == "adjoint"]
            if adjoint:
                raise IncompatibleModelError(
                    f"trainer '{self.name}' takes the signs of each layer's weight; {adjoint[0]} is a function of "
                    f"its kernel (an orthogonal convolution), whose signs are not the map's: use fa or dfa on "
                    f"{type(model).__name__}")

    def feedback_shapes(self, layers, hidden, outputs):
        return [feedback_shape(layer) for layer in layers[1:]]  # B_2 .. B_L

    def draw(self, model, e, hidden):
        rule, gen = RULES[self.rule], torch.Generator().manual_seed(self.options.feedback_seed)
        self.feedback = []
        for layer, (shape, fan_in) in zip(self._layers[1:], self.feedback_shapes(self._layers, hidden, e.shape[1]),
                                          strict=True):
            r = scale_of(self.options.scale, fan_in, _fan_out(layer, shape), _weight(layer))
            self.feedback.append(rule.kept(shape, r, gen, e))

    def project(self, hidden, delta_above, e, shape):
        layer, rule = self._layers[hidden + 1], RULES[self.rule]
        B = rule.feedback(self.feedback[hidden], _weight(layer),
                          generator(self.options.feedback_seed, hidden, self.steps) if rule.redrawn else None)
        if len(self.used) != len(self.feedback):
            self.used, self._used_weights = [B] * len(self.feedback), [B] * len(self.feedback)
        self.used[hidden], self._used_weights[hidden] = B, _weight(layer).detach()
        kind = feedback_kind(layer)
        if kind == "dense":  # (B, d_{l+1}) @ (d_{l+1}, d_l), as backprop's delta @ W
            return (delta_above.reshape(len(delta_above), -1) @ B).reshape(shape)
        if kind == "conv":  # the transposed convolution with the random kernel
            return torch.nn.grad.conv2d_input(shape, B, delta_above, layer.stride, layer.padding, layer.dilation,
                                              layer.groups)
        return self._twin(hidden, layer, B).adjoint(delta_above)

    def _twin(self, hidden: int, layer: nn.Module, B: torch.Tensor) -> nn.Module:
        twin = self._twins.get(hidden)
        if twin is None or _kernel(twin)[1].data_ptr() != B.data_ptr():
            twin = copy.deepcopy(layer).requires_grad_(False)
            name, _ = _kernel(twin)
            owner = twin.get_submodule(name.rpartition(".")[0])
            owner.weight = nn.Parameter(B, requires_grad=False)  # the twin's own tensor, not the model's
            for conv in twin.modules():  # B never changes: an orthogonal convolution's symbol once, not every step
                if isinstance(conv, OrthogonalConv2d):
                    conv.symbol = _constant(conv.symbol().detach())
            self._twins[hidden] = twin
        return twin

    def matrices(self) -> list[torch.Tensor]:
        """B_2 .. B_L as the stack path's last step applied them."""
        return self.used

    def alignment(self) -> dict[str, float]:
        """Per covered layer, the angle in degrees between the feedback B of the last step and the forward
        weight W it stood for (0: B is a positive multiple of W, 90: orthogonal)."""
        pairs = [(f"layers.{i + 1}", B, W) for i, (B, W) in enumerate(zip(self.used, self._used_weights,
                                                                             strict=True))] if self.used else \
            [(name, B, self.layers.weights[name]) for name, B in self.layers.used.items()]
        return {name: _angle(B, W) for name, B, W in pairs}

    def metrics(self) -> dict[str, float]:
        return {f"alignment_deg/{name}": angle for name, angle in self.alignment().items()}

    def state_dict(self) -> dict:
        return {"feedback": self.used or self.feedback, "kept": self.feedback, "steps": self.steps,
                "layers": self.layers.state()}

    def load_state_dict(self, state: dict) -> None:
        self.feedback = state.get("kept", state["feedback"])
        self.used, self.steps = [], state.get("steps", 0)
        self.layers.load(state.get("layers", {}))


def _angle(B: torch.Tensor, W: torch.Tensor) -> float:
    cos = torch.nn.functional.cosine_similarity(B.detach().double().flatten(), W.detach().double().flatten(), dim=0)
    return math.degrees(math.acos(max(-1.0, min(1.0, cos.item()))))


@register_engine("usf")
class UniformSignFeedback(FeedbackAlignment):
    """FA with B = r sign(W): uniform sign-concordant feedback (Liao, Leibo & Poggio 2016)."""

    rule = "usf"


@register_engine("brsf")
class BatchRandomSignFeedback(FeedbackAlignment):
    """FA with B = a |M_t| o sign(W), M_t redrawn at every step (Liao, Leibo & Poggio 2016)."""

    rule = "brsf"


@register_engine("frsf")
class FixedRandomSignFeedback(FeedbackAlignment):
    """FA with B = a |M| o sign(W), M drawn once (Liao, Leibo & Poggio 2016)."""

    rule = "frsf"


@register_engine("dfa")
class DirectFeedbackAlignment(_RandomFeedback):
    """DFA (module docstring): delta_l = (D_l^T e) * dh_l/da_l, D_l of shape d_L x (features of a_l): slices of one
    random matrix, the output error projected once per step (``trainers.engines.feedback_layers.LocalFeedback``)."""

    rule = "dfa"

    @dataclasses.dataclass
    class Options(_RandomFeedback.Options):
        scale: Scale = option("fan_in", _SCALE_HELP + "; default fan_in (DFA's error is projected, not chained: "
                                                      "no factor compounds; GPT-2: 647 against 667 perplexity)")
        slices: Literal["shared", "disjoint"] = option(
            "shared", "each layer's D: the first columns of one random matrix (shared, Launay et al. 2020), or "
                      "its own columns of it (disjoint: a matrix per layer); one projection per step either way")

    def __init__(self, **options):
        super().__init__(**options)
        self.projection: torch.Tensor | None = None  # the stack path's one matrix, d_L x width
        self.slices: list[tuple[int, int, float]] = []  # (offset, width, amplitude) of D_1 .. D_{L-1}
        self._projected: torch.Tensor | None = None

    def feedback_shapes(self, layers, hidden, outputs):
        return [((outputs, math.prod(shape)), outputs) for shape in hidden]  # D_1 .. D_{L-1}

    def _drawn(self, model, e, hidden):
        self._projected = None
        if self.feedback is not None:  # one matrix per layer, set (tests): projected on its own
            if super()._drawn(model, e, hidden):
                return True
            self.feedback = None
        widths = [math.prod(shape) for shape in hidden]
        if self.projection is None or [w for _, w, _ in self.slices] != widths or self.projection.shape[0] != \
                e.shape[1]:
            return False
        self.projection = self.projection.to(e)
        return True

    def draw(self, model, e, hidden):
        self._layers = list(model.layers)
        widths = [math.prod(shape) for shape in hidden]
        offsets = [0] * len(widths) if self.options.slices == "shared" else [sum(widths[:i]) for i in
                                                                              range(len(widths))]
        gen = torch.Generator().manual_seed(self.options.feedback_seed)
        self.projection = uniform((e.shape[1], max(o + w for o, w in zip(offsets, widths, strict=True))), gen).to(e)
        self.slices = [(o, w, math.sqrt(3) * scale_of(self.options.scale, e.shape[1], w, _weight(layer)))
                       for o, w, layer in zip(offsets, widths, self._layers[1:], strict=True)]

    def matrices(self) -> list[torch.Tensor]:
        """D_1 .. D_{L-1} as the stack path applies them (set, or sliced from the one projection)."""
        if self.feedback is not None:
            return self.feedback
        return [self.projection[:, o:o + w] * a for o, w, a in self.slices]

    def project(self, hidden, delta_above, e, shape):
        if self.feedback is not None:
            return (e @ self.feedback[hidden]).reshape(shape)  # (B, d_L) @ (d_L, features of a_l)
        if self._projected is None:
            self._projected = e @ self.projection  # once per step, for every layer
        offset, width, amplitude = self.slices[hidden]
        return (self._projected[:, offset:offset + width] * amplitude).reshape(shape)

    def state_dict(self) -> dict:
        return {"feedback": self.feedback, "projection": self.projection, "slices": self.slices,
                "layers": self.layers.state()}

    def load_state_dict(self, state: dict) -> None:
        self.feedback = state.get("feedback")
        self.projection, self.slices = state.get("projection"), list(state.get("slices", []))
        self.layers.load(state.get("layers", {}))
