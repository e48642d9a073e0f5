"""A user's model with ``torch.nn.GRU`` / ``nn.LSTM`` / ``nn.RNN`` modules, trainable by DSF,
FT-BPTT and Highway-BP over time without rewriting it.

    model = MyLanguageModel()                 # uses self.rnn = nn.GRU(E, H, num_layers=2)
    models.wrap_recurrent(model)              # in place; returns model
    trainers.build_engine("dsf").compute_grads(model, x, y, loss_fn)

``wrap_recurrent`` finds every such module (any number of layers, ``batch_first``
true or false, called with or without an initial state) and gives each of its
layers a view from ``models.layers.recurrent`` (``GRU``, ``LSTM``, ``TanhRNN``) whose
single-layer fused module holds the user's own Parameter objects
(``weight_ih_l{k}``, ... as ``weight_ih_l0``, ...): no copy, the optimizer and the
state_dict keys are the user's. The user's module keeps its place and its
forward's contract (``output, h_n`` or ``output, (h_n, c_n)``, the same values);
its forward now runs the layer views one after the other, so an engine that
swaps a view's forward (``trainers.core.protocols.recurrent_forwards``) acts inside
the user's own forward. The views, bottom to top in module order, are the
model's ``recurrent_layers``. Under an engine's swap the LSTM's ``c_n`` is
returned without a gradient (the engine's layer forward yields the h's; a loss
on ``c_n`` would have no path through the engine's feedback anyway).

Refused in one ``ModelConfigError`` line: bidirectional modules, LSTM projections
(``proj_size``), dropout between layers (apply it in your model instead), a ReLU
``nn.RNN``, a model without such a module.
"""

from typing import Any

import torch
from torch import nn

from gradengines.models.errors import ModelConfigError
from gradengines.models.layers.recurrent import GRU, LSTM, TanhRNN

__all__ = ["wrap_recurrent"]

_VIEWS = {nn.GRU: GRU, nn.LSTM: LSTM, nn.RNN: TanhRNN}
_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def _check(name: str, module: nn.RNNBase) -> None:
    problem = ("is bidirectional" if module.bidirectional else
               "has dropout between its layers (set dropout=0 and apply it in your model)"
               if module.dropout and module.num_layers > 1 else  # one layer: torch ignores it (and warns)
               "projects its hidden state (proj_size)" if getattr(module, "proj_size", 0) else
               "uses ReLU (only tanh RNNs have a view)" if isinstance(module, nn.RNN) and module.nonlinearity != "tanh"
               else None)
    if problem:
        raise ModelConfigError(f"wrap_recurrent: {name} ({type(module).__name__}) {problem}")


def _layer_view(module: nn.RNNBase, k: int) -> nn.Module:
    """Layer ``k`` of ``module`` as a ``models.layers.recurrent`` layer on the same Parameter objects."""
    size_in = module.input_size if k == 0 else module.hidden_size
    with torch.device("meta"):  # its own weights are replaced at once: never allocate them
        view = _VIEWS[type(module)](size_in, module.hidden_size, bias=module.bias)
    for name in _NAMES:
        if hasattr(module, f"{name}_l{k}"):
            setattr(view.rnn, f"{name}_l0", getattr(module, f"{name}_l{k}"))  # RNNBase refreshes its flat weights
    return view


def _layered_forward(module: nn.RNNBase, views: list[Any]):
    lstm = isinstance(module, nn.LSTM)

    def forward(input, hx=None):
        x = input if module.batch_first else input.transpose(0, 1)  # (B, T, d)
        if hx is not None and lstm:
            hx = torch.cat(hx, dim=-1)  # (L, B, 2H): each layer's state [h; c]
        finals, cells = [], []
        for k, view in enumerate(views):
            state0 = None if hx is None else hx[k]
            if "forward" in view.__dict__:  # an engine swapped this layer's forward: use it
                layer_input, x = x, view(x, state0)
                if lstm:
                    with torch.no_grad():
                        cells.append(view.forward_sequence(layer_input, state0)[:, -1, view.hidden_size:])
            else:
                states = view.forward_sequence(x, state0)  # (B, T, state_size)
                if lstm:
                    cells.append(states[:, -1, view.hidden_size:])
                x = view.output(states)
            finals.append(x[:, -1])
        output = x if module.batch_first else x.transpose(0, 1)
        h_n = torch.stack(finals)
        return (output, (h_n, torch.stack(cells))) if lstm else (output, h_n)

    return forward


def wrap_recurrent(model: nn.Module) -> nn.Module:
    """Give ``model`` ``recurrent_layers`` over its ``nn.GRU`` / ``nn.LSTM`` / ``nn.RNN`` modules, in place
    (module docstring); returns ``model``. Wrapping twice is a no-op."""
    if "recurrent_layers" in model.__dict__:
        return model
    views = []
    for name, module in model.named_modules():
        if type(module) in _VIEWS:
            _check(name or type(model).__name__, module)
            layer_views = [_layer_view(module, k) for k in range(module.num_layers)]
            module.forward = _layered_forward(module, layer_views)  # instance attribute: the class is untouched
            views += layer_views
    if not views:
        raise ModelConfigError(f"wrap_recurrent: {type(model).__name__} holds no nn.GRU, nn.LSTM or nn.RNN module")
    # a ModuleList the engines can check, kept out of the model's registered modules: the Parameters keep
    # their names, once, and the state_dict its keys
    model.__dict__["recurrent_layers"] = nn.ModuleList(views)
    return model
