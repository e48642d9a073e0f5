"""The forward-only passes call a plain linear stack directly (``F.linear`` and an in-place activation, issue 32,
item 1) and any other stack through its modules: the direct calls must give the module calls' numbers to the
bit, and a layer's hooks or own forward must still run."""

import pytest
import torch
import torch.nn as nn
from helpers import engine_grads

from gradengines import models, trainers
from gradengines.models.orthogonal import make_orthogonal
from gradengines.trainers.engines.forward_only import stack_calls


def _mlp(activation, dropout=0.0, orthogonal="bjorck"):
    torch.manual_seed(0)
    return models.build("mlp", in_features=10, out_features=4, depth=3, width=10, activation=activation,
                        dropout=dropout, orthogonal=orthogonal).double()


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(6, 10, generator=generator, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0, 1])


def _grads(engine, model, x, y, **options):
    torch.manual_seed(2)  # the same dropout masks for both calls
    return engine_grads(model, trainers.build_engine(engine, **options), x, y)


@pytest.mark.parametrize("engine,options", [("foton", {}), ("foton", {"mode": "jvp"}), ("pepita", {})])
@pytest.mark.parametrize("activation,dropout,orthogonal",
                         [("tanh", 0.0, "bjorck"), ("relu", 0.3, "bjorck"), ("identity", 0.0, "bjorck"),
                          ("tanh", 0.0, "expm")])
def test_direct_calls_give_the_module_calls_numbers(engine, options, activation, dropout, orthogonal):
    model = _mlp(activation, dropout, orthogonal)
    x, y = _batch()
    maps, act = stack_calls(model)
    assert not any(isinstance(m, nn.Module) for m in maps) and not isinstance(act, nn.Module)
    direct = _grads(engine, model, x, y, **options)
    calls = []
    model.act.register_forward_hook(lambda *_: calls.append(1))  # a hook: every call through the modules
    maps, act = stack_calls(model)
    assert all(isinstance(m, nn.Module) for m in maps) and act is model.act
    through_modules = _grads(engine, model, x, y, **options)
    assert calls, "the activation's hook never ran"
    for name, g in through_modules.items():
        assert torch.equal(direct[name], g), name


class _CountingLinear(nn.Linear):
    calls = 0

    def forward(self, h):
        type(self).calls += 1
        return super().forward(h)


def test_a_layer_subclass_and_a_layer_hook_keep_their_module_calls():
    model = _mlp("tanh")
    x, y = _batch()
    seen = []
    model.layers[0].register_forward_hook(lambda *_: seen.append(1))
    _grads("foton", model, x, y)
    assert len(seen) == 2  # the clean and the modulated pass

    model = _mlp("tanh")
    counting = _CountingLinear(10, 10).double()
    counting.load_state_dict(model.layers[1].state_dict())
    model.layers[1] = make_orthogonal(counting, "bjorck")
    assert isinstance(stack_calls(model)[0][1], _CountingLinear)
    _grads("foton", model, x, y)
    assert _CountingLinear.calls == 2
