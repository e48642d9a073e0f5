"""What every gradient engine's own tests add to the contract (optax ``_common_test`` style): its loss falls on a
toy task, and its gradient agreement with backprop is measured with the same masks. The contract itself (every
grad written and overwritten, nothing else changed, same seed same grads, resume exact, metrics, refusals) is
``gradengines.testing.check_engine``, run on every engine by tests/test_engine_checks.py.

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
