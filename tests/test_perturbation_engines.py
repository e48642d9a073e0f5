"""Forward gradients (``fgrad``) and SPSA as in MeZO (``mezo``), issue 50: their estimates against their definitions
computed by hand from autograd, their statistics (unbiased, the 1/sqrt(n) rate), MeZO's limit eps -> 0 and its
parameters unchanged to the bit, exact resume, and the contrast (neither is backprop). Float64 throughout."""

import math

import pytest
import torch
from helpers import Crash, tiny_gpt2_batch
from torch import nn

from gradengines import models, tasks, trainers
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.engines.activity_fgrad import ActivityForwardGradient
from gradengines.trainers.engines.directions import direction
from gradengines.trainers.engines.fgrad import ForwardGradient
from gradengines.trainers.engines.mezo import MeZO
from gradengines.trainers.run.checkpoint import load_checkpoint
from gradengines.trainers.run.logger import read_metrics


def small_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def batch(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(16, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (16,), generator=gen)


def exact(model, x, y):
    loss = cross_entropy_loss(model(x), y)
    return torch.autograd.grad(loss, list(model.parameters()))


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def estimate(engine, model, x, y):
    model.zero_grad()
    engine.compute_grads(model, x, y, cross_entropy_loss)
    return flat([p.grad for p in model.parameters()])


@pytest.mark.parametrize("distribution", ["gaussian", "rademacher"])
def test_one_forward_gradient_is_grad_dot_v_times_v_by_hand(distribution):
    model, (x, y) = small_model(), batch()
    g = flat(exact(model, x, y))
    engine = trainers.build_engine("fgrad", distribution=distribution, seed=7)
    got = estimate(engine, model, x, y)
    v = flat(direction(list(model.parameters()), distribution, 7, 0, 0))
    torch.testing.assert_close(got, (g @ v) * v, rtol=1e-12, atol=1e-14)
    if distribution == "rademacher":
        assert set(v.abs().tolist()) == {1.0}
    assert torch.nn.functional.cosine_similarity(got, g, dim=0) < 0.99  # the contrast: not backprop


def test_the_forward_gradient_is_unbiased_and_its_error_falls_as_one_over_sqrt_n():
    """Mean squared error over 40 seeds, at n = 4 and n = 64 directions: within 3 sigma of its theory
    (d + 1) ||g||^2 / n (Gaussian), so the error falls 4x between them; the mean over seeds and 64 directions is
    within 3 sigma / sqrt(n x seeds) of g."""
    model, (x, y) = small_model(), batch()
    g = flat(exact(model, x, y))
    d = g.numel()
    errors = {}
    for n in (4, 64):
        estimates = torch.stack([estimate(ForwardGradient(directions=n, seed=s), model, x, y) for s in range(40)])
        mse = ((estimates - g) ** 2).sum(1)
        theory = (d + 1) * float(g @ g) / n
        errors[n] = float(mse.mean())
        # the MSE's own spread: its standard error over 40 seeds
        assert abs(errors[n] - theory) < 3 * float(mse.std()) / math.sqrt(40) + 0.05 * theory, (n, errors[n], theory)
        if n == 64:
            sigma = math.sqrt(theory / 40)  # the error of the mean of 40 independent n-direction estimates
            assert float((estimates.mean(0) - g).norm()) < 3 * sigma
    assert 8 < errors[4] / errors[64] < 32  # 16 expected: the 1/sqrt(n) rate in the error's norm


def test_mezo_is_the_finite_difference_it_defines_and_tends_to_the_directional_derivative():
    model, (x, y) = small_model(), batch()
    g = flat(exact(model, x, y))
    before = [p.detach().clone() for p in model.parameters()]
    engine = MeZO(eps=1e-3, seed=3)
    got = estimate(engine, model, x, y)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # to the bit
    z = direction(list(model.parameters()), "gaussian", 3, 0, 0)
    with torch.no_grad():
        def loss_at(sign):
            shifted = small_model()
            for p, q, zi in zip(shifted.parameters(), before, z, strict=True):
                p.copy_(q + sign * 1e-3 * zi)
            return cross_entropy_loss(shifted(x), y)
        by_hand = (loss_at(1.0) - loss_at(-1.0)) / 2e-3
    torch.testing.assert_close(got, by_hand * flat(z), rtol=1e-10, atol=1e-14)
    directional = float(g @ flat(z))
    gaps = [abs(MeZO(eps=eps, seed=3).projection(model, x, y, cross_entropy_loss, 0, 0) - directional)
            for eps in (1e-2, 1e-3, 1e-4)]
    assert 30 < gaps[0] / gaps[1] < 300 and 30 < gaps[1] / gaps[2] < 300  # O(eps^2): 100x per decade of eps
    assert gaps[2] < 1e-5 * abs(directional)
    assert torch.nn.functional.cosine_similarity(got, g, dim=0) < 0.99  # the contrast


class SharedHead(nn.Module):
    """An embedding's weight reused by the head through F.linear (outside the embedding's own forward)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 4)

    def forward(self, ids):
        return nn.functional.linear(self.embed(ids).mean(1), self.embed.weight)


def test_mezo_replaces_every_parameter_where_one_is_used_outside_its_module():
    """A weight read outside its module's forward (the head's F.linear): the first batch finds it, every parameter is
    then replaced for the whole forward (nothing written); the estimate is still the finite difference by hand."""
    torch.manual_seed(0)
    model = SharedHead().double()
    ids, y = torch.randint(0, 7, (8, 3)), torch.randint(0, 7, (8,))
    before, version = model.embed.weight.detach().clone(), model.embed.weight._version
    engine = trainers.build_engine("mezo", seed=2)
    model.zero_grad()
    engine.compute_grads(model, ids, y, cross_entropy_loss)
    assert "embed.weight is used outside its module's forward" in engine.structure(model)
    assert torch.equal(model.embed.weight, before) and model.embed.weight._version == version  # never written
    z = direction([before], "gaussian", 2, 0, 0)[0]
    with torch.no_grad():
        def loss_at(sign):
            shifted = SharedHead().double()
            shifted.embed.weight.copy_(before + sign * 1e-3 * z)
            return cross_entropy_loss(shifted(ids), y)
        by_hand = (loss_at(1.0) - loss_at(-1.0)) / 2e-3
    torch.testing.assert_close(model.embed.weight.grad, by_hand * z, rtol=1e-10, atol=1e-14)


class CrashAt:
    """An engine of ``kind`` that dies after ``crash_at`` calls."""

    def __new__(cls, kind, crash_at, **options):
        class Crashing(kind):
            def compute_grads(self, *args):
                self.calls = getattr(self, "calls", 0) + 1
                if self.calls > crash_at:
                    raise Crash
                return super().compute_grads(*args)
        Crashing.name = kind.name
        return Crashing(**options)


@pytest.mark.parametrize("kind", [ForwardGradient, ActivityForwardGradient, MeZO])
def test_a_killed_run_resumes_with_the_same_directions(tmp_path, kind):
    task = tasks.build("digits")

    def make(where, engine):
        torch.manual_seed(0)
        model = models.build("mlp", in_features=64, out_features=10, depth=1, width=16)
        return trainers.Trainer(model, engine, task, logdir=tmp_path / where, batch_size=32, log_every=1,
                                eval_every=4, eval_batches=1, checkpoint_every=3, progress=False, lr=0.01)

    whole = make("whole", kind(directions=2))
    whole.fit(steps=9)
    with pytest.raises(Crash):
        make("resumed", CrashAt(kind, 7, directions=2)).fit(steps=9)
    run = tmp_path / "resumed" / "default" / kind.name / "seed0"
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 6
    resumed = make("resumed", kind(directions=2))
    torch.manual_seed(99)
    resumed.fit(steps=9, resume=True)
    strip = [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in read_metrics(run)]
    assert strip == [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))}
                     for r in read_metrics(whole.run_dir)]
    assert all(torch.equal(a, b) for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True))


def test_a_forward_gradient_of_transformers_gpt2_is_grad_dot_v_times_v():
    """Attention runs in its composite form under the forward-mode pass (the fused CPU kernel has no forward-mode
    derivative): the estimate is still (grad . v) v of GPT-2's loss (float64)."""
    pytest.importorskip("transformers")
    model, ids, targets = tiny_gpt2_batch()
    g = flat(torch.autograd.grad(tasks.sequence_cross_entropy(model(ids).logits, targets),
                                 list(model.parameters())))
    model.zero_grad()
    trainers.build_engine("fgrad", seed=5).compute_grads(model, ids, targets, tasks.sequence_cross_entropy)
    v = flat(direction(list(model.parameters()), "gaussian", 5, 0, 0))
    torch.testing.assert_close(flat([p.grad for p in model.parameters()]), (g @ v) * v, rtol=1e-9, atol=1e-12)


class FailsInside(nn.Linear):
    """A layer whose own forward raises after its perturbed weight was swapped in."""

    def forward(self, x):
        raise ValueError("the user's forward fails")


def test_a_forward_that_raises_in_a_perturbed_pass_leaves_every_parameter_in_place():
    from gradengines.trainers.engines.mezo import perturbed

    model = nn.Sequential(nn.Linear(5, 6), FailsInside(6, 3))
    params = dict(model.named_parameters())
    with pytest.raises(ValueError, match="the user's forward fails"), torch.no_grad(), \
            perturbed(model, 1e-3, lambda k, p: torch.ones_like(p)):
        model(torch.randn(4, 5))
    assert all(model.get_parameter(name) is p for name, p in params.items())


@pytest.mark.parametrize("name", ["fgrad", "fgrad_act", "mezo"])
def test_a_seed_near_the_top_of_its_range_draws_directions(name):
    """A seed near 2**62 (the flag takes any non-negative integer) once overflowed the generator's 64-bit seed."""
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    trainers.build_engine(name, seed=2**62 - 1).compute_grads(model, x, y, cross_entropy_loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
               for p in model.parameters())
