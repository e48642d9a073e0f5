"""The contract every gradient engine must pass (optax ``_common_test`` style).

An engine's test module subclasses ``EngineContract`` in two lines:

    class TestBackpropContract(EngineContract):
        engine_name = "backprop"

and overrides ``make_models`` if the engine needs particular models.
"""

import pytest
import torch
from helpers import cosine, engine_grads

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.engines.backprop import Backprop


def toy_batch(n=32, d=12, classes=4, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype)
    y = torch.randint(0, classes, (n,), generator=gen)
    return x, y


class EngineContract:
    engine_name: str = ""
    engine_options: dict = {}

    def make_models(self, dtype=torch.float32):
        """Compatible models taking 12 features to 4 classes."""
        torch.manual_seed(0)
        return [
            models.build("mlp", in_features=12, out_features=4, depth=3, width=10, activation="tanh", dropout=0.1),
            models.build("residual_mlp", in_features=12, out_features=4, depth=3, width=10, dropout=0.1),
        ]

    def engine(self):
        return trainers.build_engine(self.engine_name, **self.engine_options)

    def compatible_models(self, dtype=torch.float32):
        engine = self.engine()
        out = []
        for m in self.make_models(dtype):
            try:
                engine.check(m)
            except trainers.IncompatibleModelError:
                continue
            out.append(m.to(dtype))
        assert out, f"no compatible model for {self.engine_name}"
        return out

    def test_fills_every_grad_with_right_shape_and_dtype(self):
        x, y = toy_batch()
        for model in self.compatible_models():
            model.train()
            out = self.engine().compute_grads(model, x, y, cross_entropy_loss)
            assert out.loss.ndim == 0 and torch.isfinite(out.loss)
            assert out.outputs.shape == (32, 4)
            for name, p in trainers.trainable_parameters(model):
                assert p.grad is not None, name
                assert p.grad.shape == p.shape and p.grad.dtype == p.dtype, name
                assert torch.isfinite(p.grad).all(), name

    def test_does_not_change_parameters_or_replace_them(self):
        x, y = toy_batch()
        for model in self.compatible_models():
            before = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
            self.engine().compute_grads(model, x, y, cross_entropy_loss)
            after = dict(model.named_parameters())
            for n, (p, value) in before.items():
                assert after[n] is p, f"{n} was replaced"
                assert torch.equal(p.detach(), value), f"{n} changed"

    def test_overwrites_instead_of_accumulating(self):
        x, y = toy_batch()
        for model in self.compatible_models():
            engine = self.engine()
            torch.manual_seed(1)
            first = engine_grads(model, engine, x, y)
            for _, p in trainers.trainable_parameters(model):
                p.grad.fill_(1e6)  # garbage that must not survive
            torch.manual_seed(1)
            engine.compute_grads(model, x, y, cross_entropy_loss)
            for n, p in trainers.trainable_parameters(model):
                torch.testing.assert_close(p.grad, first[n], msg=n)

    def test_same_seed_same_grads(self):
        x, y = toy_batch()
        grads = []
        for _ in range(2):
            model = self.compatible_models()[0]
            torch.manual_seed(3)
            grads.append(engine_grads(model, self.engine(), x, y))
        assert grads[0].keys() == grads[1].keys()
        for name in grads[0]:
            assert torch.equal(grads[0][name], grads[1][name]), name

    @pytest.mark.parametrize("index", [0, 1])
    def test_loss_falls_on_a_toy_task(self, index):
        x, y = toy_batch(n=64)
        compatible = self.compatible_models()
        if index >= len(compatible):
            pytest.skip("only one compatible model")
        model = compatible[index]
        model.eval()  # no dropout noise: the loss must fall monotonically enough
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        engine = self.engine()
        losses = []
        for _ in range(30):
            out = engine.compute_grads(model, x, y, cross_entropy_loss)
            losses.append(out.loss.item())
            opt.step()
            models.orthogonal.project_(model)
            assert all(torch.isfinite(p).all() for p in model.parameters())
        assert losses[-1] < 0.8 * losses[0], losses

    def test_gradient_agreement_runs_and_leaves_state(self):
        x, y = toy_batch()
        model = self.compatible_models()[0]
        state = {k: v.clone() for k, v in model.state_dict().items()}
        rng = torch.get_rng_state()
        report = trainers.gradient_agreement(model, self.engine(), x, y, cross_entropy_loss)
        assert set(report["per_param"]) == {n for n, _ in trainers.trainable_parameters(model)}
        for k, v in model.state_dict().items():
            assert torch.equal(v, state[k])
        assert torch.equal(torch.get_rng_state(), rng)
        # the cosines it reports are those of the engine's and backprop's grads from the same RNG state (masks)
        grads = []
        for engine in (self.engine(), Backprop()):
            model.load_state_dict(state)
            torch.set_rng_state(rng)
            grads.append({n: g.double() for n, g in engine_grads(model, engine, x, y).items()})
        model.load_state_dict(state)
        assert report["global"] == pytest.approx(cosine(*grads), abs=1e-12)
        for name, stats in report["per_param"].items():
            if grads[0][name].norm() > 0 and grads[1][name].norm() > 0:
                assert stats["cosine"] == pytest.approx(cosine(grads[0][name], grads[1][name]), abs=1e-12), name
        # ... and backprop's agreement with itself is 1, with the same masks
        torch.set_rng_state(rng)
        assert trainers.gradient_agreement(model, Backprop(), x, y, cross_entropy_loss)["global"] == pytest.approx(
            1.0, abs=1e-12)
