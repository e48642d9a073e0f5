"""Backprop: equals loss.backward(); agreement is 1 with itself and < 1 for a wrong engine."""

import pytest
import torch
from engine_contract import EngineContract, toy_batch
from helpers import engine_grads

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.core.engine import GradientEngine, trainable_parameters, write_grads
from gradengines.trainers.engines.backprop import Backprop


class TestBackpropContract(EngineContract):
    engine_name = "backprop"


class ScaledWrongBackprop(GradientEngine):
    """A deliberately wrong engine: exact grads with the first layer's sign flipped."""

    name = "wrong"

    def compute_grads(self, model, inputs, targets, loss_fn):
        out = Backprop().compute_grads(model, inputs, targets, loss_fn)
        first = trainable_parameters(model)[0][1]
        first.grad.neg_()
        return out


def float64_models():
    torch.manual_seed(0)
    return {
        "mlp": models.build("mlp", in_features=12, out_features=4, depth=4, width=9, activation="tanh"),
        "mlp_ortho_expm": models.build("mlp", in_features=12, out_features=4, depth=3, width=8, orthogonal="expm"),
        "residual_mlp": models.build("residual_mlp", in_features=12, out_features=4, depth=5, width=8),
    }


@pytest.mark.parametrize("name", list(float64_models()))
def test_backprop_equals_loss_backward(name):
    model = float64_models()[name].double()
    x, y = toy_batch(dtype=torch.float64)
    got = engine_grads(model, Backprop(), x, y)
    model.zero_grad(set_to_none=True)
    cross_entropy_loss(model(x), y).backward()
    for n, p in trainable_parameters(model):
        torch.testing.assert_close(got[n], p.grad, rtol=1e-12, atol=1e-14, msg=n)


def test_unused_parameters_get_zero_grads():
    model = models.build("mlp", in_features=12, out_features=4, depth=2, width=8)
    model.extra = torch.nn.Linear(3, 3)  # not used by forward
    x, y = toy_batch()
    Backprop().compute_grads(model, x, y, cross_entropy_loss)
    assert torch.count_nonzero(model.extra.weight.grad) == 0


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_agreement_of_backprop_with_itself_is_one(dropout):
    torch.manual_seed(0)
    model = models.build("mlp", in_features=12, out_features=4, depth=4, width=16, dropout=dropout).double()
    x, y = toy_batch(dtype=torch.float64)
    report = trainers.gradient_agreement(model, Backprop(), x, y, cross_entropy_loss)
    # with dropout this holds only because both passes draw the same masks
    assert report["global"] == pytest.approx(1.0, abs=1e-12)
    for name, stats in report["per_param"].items():
        assert stats["cosine"] == pytest.approx(1.0, abs=1e-12), name
        assert stats["rel_error"] < 1e-12, name
        assert stats["norm_ratio"] == pytest.approx(1.0, abs=1e-12), name


def test_different_masks_would_disagree():
    """Control for the test above: two passes with different masks do not agree."""
    torch.manual_seed(0)
    model = models.build("mlp", in_features=12, out_features=4, depth=4, width=16, dropout=0.3).double()
    x, y = toy_batch(dtype=torch.float64)
    grads = []
    for _ in range(2):
        grads.append(engine_grads(model, Backprop(), x, y))
    report = trainers.compare_grads(*grads)
    assert report["global"] < 0.999


def test_wrong_engine_is_detected_by_name():
    torch.manual_seed(0)
    model = models.build("mlp", in_features=12, out_features=4, depth=3, width=8).double()
    x, y = toy_batch(dtype=torch.float64)
    report = trainers.gradient_agreement(model, ScaledWrongBackprop(), x, y, cross_entropy_loss)
    exact = engine_grads(model, Backprop(), x, y)
    first, total = exact["layers.0.weight"].norm() ** 2, sum(g.norm() ** 2 for g in exact.values())
    assert report["global"] == pytest.approx(float(1 - 2 * first / total), abs=1e-12)  # one block's sign flipped
    assert report["global"] < 1.0 - 1e-3
    assert report["per_param"]["layers.0.weight"]["cosine"] == pytest.approx(-1.0, abs=1e-12)
    assert report["per_param"]["layers.0.weight"]["rel_error"] == pytest.approx(2.0, abs=1e-12)
    assert report["per_param"]["layers.1.weight"]["cosine"] == pytest.approx(1.0, abs=1e-12)


def test_agreement_leaves_model_grads_engine_and_rng_unchanged():
    torch.manual_seed(0)
    model = models.build("mlp", in_features=12, out_features=4, depth=3, width=8, dropout=0.2)
    model.eval()
    x, y = toy_batch()
    sentinel = {n: torch.full_like(p, 7.0) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = sentinel[n].clone()
    params_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    trainers.gradient_agreement(model, ScaledWrongBackprop(), x, y, cross_entropy_loss)
    assert not model.training  # mode restored (the engines ran the model in its given mode)
    assert torch.equal(torch.get_rng_state(), rng)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), params_before[n])
        assert torch.equal(p.grad, sentinel[n])


def test_compare_grads_zero_conventions():
    z = torch.zeros(3)
    one = torch.ones(3)
    both = trainers.compare_grads({"a": z}, {"a": z})["per_param"]["a"]
    assert both == {"cosine": 1.0, "rel_error": 0.0, "norm_ratio": 1.0}
    est_zero = trainers.compare_grads({"a": z}, {"a": one})["per_param"]["a"]
    assert est_zero["cosine"] == 0.0 and est_zero["rel_error"] == 1.0 and est_zero["norm_ratio"] == 0.0
    with pytest.raises(ValueError):
        trainers.compare_grads({"a": z}, {"b": z})


def test_write_grads_overwrites_and_zero_fills():
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 5.0)
    write_grads([p], [None])
    assert torch.equal(p.grad, torch.zeros(2))
    write_grads([p], [torch.tensor([1.0, 2.0], requires_grad=True)])
    assert not p.grad.requires_grad and torch.equal(p.grad, torch.tensor([1.0, 2.0]))
