"""Each parametrized weight computed once per step by every forward-only engine, as by backprop (issue 32):
counted on geotorch layers (the parametrization's forward) and on the orthogonal convolutions (their Cayley
symbol); the gradients through the cached weights are checked by each engine's own identities (e.g. FA with the
forward weights as feedback equals backprop on the orthogonal CNNs, tests/test_feedback_alignment.py)."""

import collections

import pytest
import torch
from torch.nn.utils import parametrize

from gradengines import models, trainers
from gradengines.models.orthogonal.conv import OrthogonalConv2d
from gradengines.tasks.base import cross_entropy_loss

ENGINES = ["backprop", "fa", "dfa", "foton", "pepita"]


def _models():
    torch.manual_seed(0)
    return {
        # geotorch's matrix exponential on every dense layer (FOTON's orthogonal MLP)
        "mlp_expm": (models.build("mlp", in_features=12, out_features=12, depth=3, width=12, orthogonal="expm",
                                  orthogonal_output=True).double(), 12),
        # orthogonal convolutions (a Cayley solve per frequency) and geotorch dense layers
        "ortho_lenet": (models.build("ortho_lenet", in_features=64, out_features=3, width=8).double(), 64),
    }


def _count_evaluations(model, monkeypatch) -> collections.Counter:
    """Counts of each weight's computation by name: a parametrization's forward (the cached reads do not call
    it) and an orthogonal convolution's symbol (another module's, e.g. a feedback twin's: "other")."""
    counts: collections.Counter = collections.Counter()
    names = {}
    for name, module in model.named_modules():
        if parametrize.is_parametrized(module, "weight"):
            module.parametrizations.weight.register_forward_hook(
                lambda *_, name=name: counts.update([f"{name}.weight"]))
        elif isinstance(module, OrthogonalConv2d):
            names[id(module)] = f"{name}.symbol"
    real = OrthogonalConv2d._symbol

    def symbol(self):
        counts.update([names.get(id(self), "other")])
        return real(self)
    monkeypatch.setattr(OrthogonalConv2d, "_symbol", symbol)
    return counts


@pytest.mark.parametrize("engine_name", ENGINES)
@pytest.mark.parametrize("model_name", ["mlp_expm", "ortho_lenet"])
def test_each_parametrized_weight_is_computed_once_per_step(engine_name, model_name, monkeypatch):
    model, features = _models()[model_name]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, features, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (6,), generator=gen)
    engine = trainers.build_engine(engine_name)
    engine.compute_grads(model, x, y, cross_entropy_loss)  # a first step draws the feedback (FA's twins)
    counts = _count_evaluations(model, monkeypatch)
    engine.compute_grads(model, x, y, cross_entropy_loss)
    weights = [name for name, module in model.named_modules() if parametrize.is_parametrized(module, "weight")]
    symbols = [name for name, module in model.named_modules() if isinstance(module, OrthogonalConv2d)]
    expected = {**{f"{n}.weight": 1 for n in weights}, **{f"{n}.symbol": 1 for n in symbols}}
    assert weights and (symbols or model_name == "mlp_expm")
    assert dict(counts) == expected

