"""Feedback alignment (FA) and direct feedback alignment (DFA): backprop's error
path with fixed random matrices in place of the transposed forward weights.

On a layer stack (``trainers.protocols.LayerStack``) of ``nn.Linear`` layers,
``a_l = W_l h_{l-1} + b_l``, ``h_l = act(drop_l(a_l))``, ``y = W_L h_{L-1} + b_L``,
with ``e = dloss/dy`` per sample (``softmax(y) - onehot`` for cross-entropy):

    delta_L = e
    FA  (Lillicrap et al., Nat. Commun. 2016):  delta_l = (B_{l+1}^T delta_{l+1}) * dh_l/da_l
    DFA (Nøkland, NeurIPS 2016):                delta_l = (D_l^T e) * dh_l/da_l
    G_l = (1/B) sum_batch delta_l h_{l-1}^T,   G_{b_l} = (1/B) sum_batch delta_l

``B_l`` has the shape of ``W_l`` (backprop is FA with ``B_l = W_l``); ``D_l`` is
``d_L x d_l`` (with one hidden layer, DFA with ``D_1 = W_2`` is backprop).
``dh_l/da_l`` (activation and dropout mask) is one local autograd call per layer;
nothing is differentiated through the network. The matrices are drawn once, at
the first step, from the engine's own generator (``feedback_seed``):
``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with the fan-in of the map they replace
(``W_l``'s input width for FA, ``d_L`` for DFA), never trained, and saved in
checkpoints. These are the usual baselines of forward-learning papers (the FOTON
paper's results table reports both beside PEPITA).
"""

import dataclasses
import math

import torch
import torch.nn as nn

from trainers.engine import GradientEngine, StepOutput
from trainers.engines.forward_only import linear_part, output_error, write_layer_grads
from trainers.errors import ConfigError, IncompatibleModelError
from trainers.options import option
from trainers.protocols import LayerStack, require
from trainers.registry import register_engine

__all__ = ["FeedbackAlignment", "DirectFeedbackAlignment"]


class _RandomFeedback(GradientEngine):
    """The pass shared by FA and DFA; subclasses give the feedback shapes and the projection."""

    @dataclasses.dataclass
    class Options:
        feedback_seed: int = option(0, "seed of the fixed random feedback matrices")

    def __init__(self, **options):
        super().__init__(**options)
        if not 0 <= self.options.feedback_seed < 2**63:
            raise ConfigError(f"--{self.name}-feedback-seed must be in [0, 2**63), got {self.options.feedback_seed}")
        self.feedback: list[torch.Tensor] | None = None  # drawn at the first step

    def check(self, model: nn.Module) -> None:
        require(model, LayerStack, self.name, "a layer stack h_l = act(W_l h_{l-1} + b_l) of nn.Linear layers",
                "mlp")
        others = [type(layer).__name__ for layer in model.layers if linear_part(layer) is None]
        if others:
            raise IncompatibleModelError(f"trainer '{self.name}' needs nn.Linear layers (random feedback matrices "
                                         f"replace their transposes); {type(model).__name__} has {others[0]} "
                                         f"(zoo models that qualify: mlp)")

    def feedback_shapes(self, weights: list[torch.Size]) -> list[tuple[tuple[int, int], int]]:
        """(shape, fan-in) of each feedback matrix, from the shapes of W_1 .. W_L."""
        raise NotImplementedError

    def project(self, hidden: int, delta_above: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """The error reaching hidden layer ``hidden`` (0-based) before its activation's derivative."""
        raise NotImplementedError

    def _draw(self, model: nn.Module, like: torch.Tensor) -> None:
        """The feedback matrices on ``like``'s device and dtype: loaded, or drawn (the first step)."""
        shapes = self.feedback_shapes([linear_part(layer).weight.shape for layer in model.layers])
        if self.feedback is not None and [tuple(f.shape) for f in self.feedback] == [s for s, _ in shapes]:
            self.feedback = [f.to(like) for f in self.feedback]
            return
        gen = torch.Generator().manual_seed(self.options.feedback_seed)
        self.feedback = [((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) / math.sqrt(fan_in)).to(like)
                         for shape, fan_in in shapes]

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        layers = list(model.layers)
        batch = inputs.shape[0]
        with torch.no_grad():
            h = model.input_features(inputs)
        hs, pre, post = [h], [], []  # h_0 .. h_{L-1}; a_l and h_l of the hidden layers, with a local graph
        for layer, dropout in zip(layers[:-1], model.dropouts, strict=True):
            with torch.no_grad():
                a = layer(h).requires_grad_()
            with torch.enable_grad():
                out = model.act(dropout(a))  # masks drawn in layer order, as one backprop forward
            pre.append(a)
            post.append(out)
            h = out.detach()
            hs.append(h)
        with torch.no_grad():
            y = layers[-1](h)
        e = output_error(y, targets, loss_fn)  # (B, d_L)
        self._draw(model, e)
        write_layer_grads(layers[-1], hs[-1], e, batch)
        delta = e
        for i in reversed(range(len(layers) - 1)):
            (delta,) = torch.autograd.grad(post[i], pre[i], self.project(i, delta, e))  # * dh_i/da_i
            write_layer_grads(layers[i], hs[i], delta, batch)
        with torch.no_grad():
            loss = loss_fn(y, targets)
        return StepOutput(loss=loss.detach(), outputs=y.detach())

    def state_dict(self) -> dict:
        return {"feedback": self.feedback}

    def load_state_dict(self, state: dict) -> None:
        self.feedback = state["feedback"]


@register_engine("fa")
class FeedbackAlignment(_RandomFeedback):
    """FA (module docstring): delta_l = (B_{l+1}^T delta_{l+1}) * dh_l/da_l, B_l the shape of W_l."""

    def feedback_shapes(self, weights):
        return [((w[0], w[1]), w[1]) for w in weights[1:]]  # B_2 .. B_L, each the shape of its W

    def project(self, hidden, delta_above, e):
        return delta_above @ self.feedback[hidden]  # (B, d_{l+1}) @ (d_{l+1}, d_l), as backprop's delta @ W


@register_engine("dfa")
class DirectFeedbackAlignment(_RandomFeedback):
    """DFA (module docstring): delta_l = (D_l^T e) * dh_l/da_l, D_l of shape d_L x d_l."""

    def feedback_shapes(self, weights):
        return [((weights[-1][0], w[0]), weights[-1][0]) for w in weights[:-1]]  # D_1 .. D_{L-1}: (d_L, d_l)

    def project(self, hidden, delta_above, e):
        return e @ self.feedback[hidden]  # (B, d_L) @ (d_L, d_l)
