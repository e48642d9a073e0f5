"""PEPITA, both published rules, against updates written out by hand (float64)."""

import math

import pytest
import torch
from engine_contract import EngineContract

from gradengines import models, tasks, trainers
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.core.engine import trainable_parameters
from gradengines.trainers.engines.pepita import Pepita


class TestPepitaContract(EngineContract):
    engine_name = "pepita"

    def make_models(self, dtype=torch.float32):
        torch.manual_seed(0)
        return [models.build("mlp", in_features=12, out_features=4, depth=2, width=16, activation="relu",
                             dropout=0.1)]


class TestPepitaIcmlContract(TestPepitaContract):
    engine_options = {"variant": "icml2022"}


def by_hand(model, F, x, y, variant):
    """The PEPITA update for a 3-layer ReLU MLP, written out."""
    W = [layer.weight for layer in model.layers]
    b = [layer.bias for layer in model.layers]
    relu = torch.relu

    def forward(h0):
        h1 = relu(h0 @ W[0].T + b[0])
        h2 = relu(h1 @ W[1].T + b[1])
        return h1, h2, h2 @ W[2].T + b[2]

    onehot = torch.nn.functional.one_hot(y, 3).double()
    h1, h2, out = forward(x)
    e = torch.softmax(out, 1) - onehot
    x_mod = x + e @ F.T if variant == "icml2022" else x - e @ F.T
    m1, m2, out_mod = forward(x_mod)
    e_last = torch.softmax(out_mod, 1) - onehot if variant == "icml2022" else e
    B = len(x)
    return {
        "layers.0.weight": (h1 - m1).T @ x_mod / B, "layers.0.bias": (h1 - m1).mean(0),
        "layers.1.weight": (h2 - m2).T @ m1 / B, "layers.1.bias": (h2 - m2).mean(0),
        "layers.2.weight": e_last.T @ m2 / B, "layers.2.bias": e_last.mean(0),
    }


@pytest.mark.parametrize("variant", ["icml2022", "iclr2024"])
def test_matches_the_rule_written_by_hand(variant):
    torch.manual_seed(0)
    model = models.build("mlp", in_features=6, out_features=3, depth=3, width=5, activation="relu").double()
    x = torch.randn(16, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (16,))
    engine = Pepita(variant=variant)
    engine.compute_grads(model, x, y, cross_entropy_loss)
    expected = by_hand(model, engine.F, x, y, variant)
    for name, p in trainable_parameters(model):
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-12, atol=1e-14, msg=name)


def test_feedback_is_fixed_seeded_scaled_and_checkpointed():
    model = models.build("mlp", in_features=6, out_features=3, depth=2, width=5)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    a, b = Pepita(), Pepita(feedback_seed=1)
    a.compute_grads(model, x, y, cross_entropy_loss)
    first = a.F.clone()
    a.compute_grads(model, x, y, cross_entropy_loss)
    assert torch.equal(a.F, first)  # never trained
    assert a.F.abs().max() <= 0.05 * math.sqrt(6 / 6)
    b.compute_grads(model, x, y, cross_entropy_loss)
    assert not torch.equal(a.F, b.F)
    c = Pepita(feedback_seed=1)
    c.load_state_dict(a.state_dict())
    assert torch.equal(c.F, a.F)


def test_pepita_trains_a_shallow_net_on_digits():
    task = tasks.build("digits")
    torch.manual_seed(0)
    model = models.build("mlp", in_features=64, out_features=10, depth=2, width=64, activation="relu")
    trainer = trainers.Trainer(model, Pepita(), task, optimizer="sgd", lr=0.01, momentum=0.9, progress=False)
    report = trainer.fit(epochs=5)
    assert report["best_val"]["accuracy"] > 0.5


@pytest.mark.parametrize("scale", [0.05, 0.2])
def test_the_feedback_fills_scale_times_sqrt_6_over_d0_where_multiplying_and_dividing_differ(scale):
    """d_0 = 24: scale * sqrt(6 / 24) = scale / 2, scale / sqrt(6 / 24) = 2 scale. Every entry within the bound and
    the largest near it (a uniform draw of 24 x 3 entries reaches 0.9 of its bound with probability 1 - 0.9^72)."""
    model = models.build("mlp", in_features=24, out_features=3, depth=2, width=5)
    engine = Pepita(feedback_scale=scale)
    engine.compute_grads(model, torch.randn(4, 24), torch.randint(0, 3, (4,)), cross_entropy_loss)
    bound = scale * math.sqrt(6 / 24)
    assert engine.F.shape == (24, 3)
    assert 0.9 * bound < float(engine.F.abs().max()) <= bound
    assert float(engine.F.max()) > 0.8 * bound and float(engine.F.min()) < -0.8 * bound  # U(-bound, bound): both


def test_a_forward_hook_on_a_layer_is_part_of_the_forward_the_engine_runs():
    """Hooked layers and a hooked activation are run as the model runs them (hooks and all), never by bare
    F.linear and an in-place tanh (issue 41: the test for hooks inverted); the step's outputs are the model's."""
    torch.manual_seed(0)
    model = models.build("mlp", in_features=6, out_features=3, depth=3, width=5).double()
    for module in [*model.layers, model.act]:
        module.register_forward_hook(lambda module, args, out: 0.5 * out)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randint(0, 3, (4,))
    step = Pepita().compute_grads(model, x, y, cross_entropy_loss)
    torch.testing.assert_close(step.outputs, model(x), rtol=1e-12, atol=1e-14)


def test_the_feedback_seed_takes_every_63_bit_seed_and_refuses_past_them():
    Pepita(feedback_seed=2**63 - 1)
    for bad in (2**63, -1):
        with pytest.raises(trainers.ConfigError, match=r"^--pepita-feedback-seed must be in \[0, 2\*\*63\), got "):
            Pepita(feedback_seed=bad)


@pytest.mark.parametrize("scale", [0.0, -0.05])
def test_a_feedback_scale_that_is_not_positive_is_refused_in_one_line(scale):
    with pytest.raises(trainers.ConfigError, match=r"^--pepita-feedback-scale must be > 0, got "):
        Pepita(feedback_scale=scale)
