"""The structures engines other than backprop need from a model.

Models know nothing of engines: they satisfy these small structural
protocols by having the named attributes. Engines check them with
``require`` and refuse other models with one ``IncompatibleModelError`` line.

* ``LayerStack`` (FOTON, PEPITA): ``h_0 = input_features(x)``,
  ``h_l = act(drop_l(A_l h_{l-1} + b_l))``, ``y = A_L h_{L-1} + b_L`` where each
  ``A_l`` is a linear map that can apply its adjoint: an ``nn.Linear``
  (adjoint ``v W``) or a module with an ``adjoint(v)`` method (orthogonal
  convolutions). Zoo: ``mlp``, orthogonal CNNs.
* ``ResidualStack`` (Highway-BP): ``h_0 = stem(x)``,
  ``h_i = combine_i(h_{i-1}, branch_i(h_{i-1}))``, ``y = head(h_L)``; every
  state has one shape and ``combine`` is element-wise, so the residual
  Jacobian ``K_i = d combine / d h`` is diagonal (identity, scalar, a ReLU
  mask). Blocks of one class and shapes are batched with ``torch.func.vmap``.
  Zoo: ``residual_mlp``, ``resnet``, ``gpt``.
* ``RecurrentLayer`` (DSF, FT-BPTT, Highway-BP over time): a one-step cell
  ``h_t = cell(x_t, h_{t-1})`` and a fast whole-sequence forward sharing its
  weights. Zoo: the layers of ``models.layers.recurrent``; models expose them, bottom
  to top, as the ``nn.ModuleList`` ``recurrent_layers`` (``rnn_lm``, ``rnn_block_lm``).
"""

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, cast, runtime_checkable

import torch
import torch.nn as nn

from gradengines.trainers.core.errors import IncompatibleModelError, ModelConfigError

__all__ = ["refusal", "LayerStack", "ResidualStack", "RecurrentLayer", "require", "recurrent_forwards",
           "is_residual_stack"]


@runtime_checkable
class LayerStack(Protocol):
    layers: Sequence[nn.Module]  # L linear maps A_1 .. A_L (+ bias), in order
    act: Callable[[torch.Tensor], torch.Tensor]  # hidden activation
    dropouts: Sequence[nn.Module]  # L-1 models.ConsistentDropout, before the activation

    def input_features(self, x: torch.Tensor) -> torch.Tensor:
        """h_0 from the raw input (e.g. flatten)."""


@runtime_checkable
class ResidualStack(Protocol):
    stem: Callable[[torch.Tensor], torch.Tensor]
    blocks: Sequence[nn.Module]  # each with branch(h) -> z and an element-wise combine(h, z) -> h'
    head: Callable[[torch.Tensor], torch.Tensor]


def is_residual_stack(model) -> bool:
    """Whether ``model`` is a residual stack as documented, not only by its attributes' names: callable ``stem`` and
    ``head``, and ``blocks`` a non-empty sequence of modules each with callable ``branch`` and ``combine``, or an
    exact boundary (``boundary`` true: only called) (a model that merely names its attributes ``stem``, ``blocks``,
    ``head`` is found and self-checked instead)."""
    if not isinstance(model, ResidualStack) or not (callable(model.stem) and callable(model.head)):
        return False
    try:
        blocks = list(model.blocks)
    except TypeError:
        return False
    return bool(blocks) and all(callable(b) and getattr(b, "boundary", False) is True
                                or callable(getattr(b, "branch", None)) and callable(getattr(b, "combine", None))
                                for b in blocks)


@runtime_checkable
class RecurrentLayer(Protocol):
    state_size: int  # d (2d for the LSTM's [h; c])

    def cell(self, x_t: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
        """One step, batched over any leading dims: (N, d_in), (N, d) -> (N, d)."""

    def cell_with_gate(self, x_t: torch.Tensor, h_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step and the diagonal of its direct path d s_t / d s_{t-1} (the gate), from one evaluation."""

    def forward_sequence(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
        """All states at once (fused kernel where one exists): (B, T, d_in) -> (B, T, d)."""

    def output(self, states: torch.Tensor) -> torch.Tensor:
        """What the layer above sees of the states (the h half for the LSTM)."""


def recurrent_layers(model: nn.Module, engine: str) -> list[nn.Module]:
    """``model.recurrent_layers`` (bottom to top), each a ``RecurrentLayer``; else one ``IncompatibleModelError``
    line saying what ``engine`` needs (``models.wrap_recurrent`` gives a model with nn.GRU/LSTM/RNN modules
    such layers)."""
    layers = getattr(model, "recurrent_layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise IncompatibleModelError(
            f"trainer '{engine}' needs a model with recurrent layers (an nn.ModuleList 'recurrent_layers'); "
            f"{type(model).__name__} has none{refusal(model)} (zoo models that qualify: rnn_lm, rnn_block_lm; "
            f"yours with nn.GRU/LSTM/RNN: models.wrap_recurrent)")
    for layer in layers:
        if not isinstance(layer, RecurrentLayer):
            raise IncompatibleModelError(
                f"trainer '{engine}' needs recurrent layers with the RecurrentLayer protocol "
                f"(trainers/core/protocols.py); {type(layer).__name__} is not one "
                "(layers that qualify: models.layers.recurrent)")
    return list(layers)


def require(model: nn.Module, protocol: type, engine: str, need: str, zoo: str) -> None:
    """Raise ``IncompatibleModelError`` unless ``model`` satisfies ``protocol``."""
    if not isinstance(model, protocol):
        raise IncompatibleModelError(
            f"trainer '{engine}' needs {need}; {type(model).__name__} is not one{refusal(model)} (zoo models that "
            f"qualify: {zoo})"
        )


def refusal(model: nn.Module) -> str:
    """`` (why)`` when the command line could not wrap the model's nn.GRU/LSTM/RNN modules
    (``trainers.cli.auto_wrap_recurrent`` keeps the reason), else empty: refusals say the real reason."""
    reason = getattr(model, "recurrent_refusal", None)
    return f" ({reason})" if reason else ""


class RecurrentModel(Protocol):
    recurrent_layers: Sequence[nn.Module]  # RecurrentLayer modules, bottom to top


# the layers whose own forward was seen to carry their parameters' gradient
_CARRY: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def _checked(index: int, layer: nn.Module, forward: Callable) -> Callable:
    """``forward``, after checking once per layer that the layer's own ``forward_sequence`` gives states that
    depend on its trainable parameters under autograd. An engine that recomputes the cell (DSF, FT-BPTT, TBPTT,
    Highway-BP over time) would otherwise train parameters the model's forward detaches, where backprop gives
    them zero: a layer whose states carry no gradient is refused in one line naming its parameters (checked on
    the first two steps of one sequence, once per layer)."""
    def run(x, h0=None):
        checked = layer in _CARRY or not torch.is_grad_enabled()  # every step after the first: nothing read
        trained = [] if checked else [name for name, p in layer.named_parameters() if p.requires_grad]
        if trained:
            states = cast(RecurrentLayer, layer).forward_sequence(x[:1, :2], None if h0 is None else h0[:1])
            if not states.requires_grad:
                names = ", ".join(f"recurrent_layers.{index}.{n}" for n in trained[:3])
                raise ModelConfigError(
                    f"recurrent layer {index} ({type(layer).__name__}) returns states detached from its parameters "
                    f"({names}{', ...' if len(trained) > 3 else ''}): autograd gives them no gradient through it, "
                    f"which the engines that recompute its cell cannot reproduce; remove the detach (or "
                    f"torch.no_grad) from its forward_sequence, or freeze them (requires_grad_(False))")
            _CARRY[layer] = True
        return forward(x, h0)

    return run


@contextlib.contextmanager
def recurrent_forwards(model: RecurrentModel,
                       make_forward: Callable[[int, nn.Module], Callable]) -> Iterator[RecurrentModel]:
    """Within the context, layer i of ``model.recurrent_layers`` runs ``make_forward(i, layer)``
    instead of its own forward (an instance attribute, removed on exit, even on error); the
    model's own forward, residuals and head are untouched and no Parameter is replaced."""
    layers = list(model.recurrent_layers)
    try:
        for i, layer in enumerate(layers):
            layer.forward = _checked(i, layer, make_forward(i, layer))
        yield model
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)
