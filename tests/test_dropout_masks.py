"""Forward-only engines draw each dropout mask once per step and reuse it in the modulated pass (issue 22).

The masks must be the ones the model's own forward draws from the step's start (the contract
``trainers.gradient_agreement`` relies on), the RNG must end where one forward pass leaves it, and
only ``lowmem`` (which keeps no per-layer tensor) may draw them twice. float64 throughout.
"""

import pytest
import torch
from helpers import engine_grads
from torch.profiler import ProfilerActivity, profile

from gradengines import models
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.engines.foton import Foton
from gradengines.trainers.engines.pepita import Pepita

DEPTH = 5  # four hidden layers, each with its dropout

ENGINES = {
    "foton": lambda: Foton(),
    "foton jvp": lambda: Foton(mode="jvp"),  # with active dropout: the lockstep forward-mode path
    "foton lowmem": lambda: Foton(mode="lowmem"),
    "pepita iclr2024": lambda: Pepita(),
    "pepita icml2022": lambda: Pepita(variant="icml2022"),
}


def mlp(activation="tanh"):
    torch.manual_seed(0)
    model = models.build("mlp", in_features=12, out_features=4, depth=DEPTH, width=10, activation=activation,
                         dropout=0.3, orthogonal="polar")
    return model.double().train()


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(16, 12, generator=gen, dtype=torch.float64) * 2, torch.randint(0, 4, (16,), generator=gen)


def step_grads(engine, model, x, y, frozen: bool):
    """The engine's gradients from RNG seed 7; ``frozen``: the masks are first drawn by the model's own forward
    from that seed and frozen (``models.frozen_masks``), so every pass of the engine must use exactly those."""
    torch.manual_seed(7)
    with models.frozen_masks(model) if frozen else torch.no_grad():
        if frozen:
            with torch.no_grad():
                model(x)
        return engine_grads(model, engine, x, y)


@pytest.mark.parametrize("name", list(ENGINES))
def test_masks_are_the_forwards_own_and_the_rng_ends_after_one_pass(name):
    model, (x, y) = mlp(), batch()
    got = step_grads(ENGINES[name](), model, x, y, frozen=False)
    after_engine = torch.get_rng_state()
    expected = step_grads(ENGINES[name](), model, x, y, frozen=True)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-12, atol=1e-14, msg=key)
    torch.manual_seed(7)
    with torch.no_grad():
        model(x)
    assert torch.equal(after_engine, torch.get_rng_state())  # as after one forward pass (a backprop step)
    assert any(g.abs().sum() > 0 for g in got.values())


def bernoulli_draws(engine, model, x, y) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.compute_grads(model, x, y, cross_entropy_loss)
    return sum(event.count for event in prof.key_averages() if event.key == "aten::bernoulli_")


@pytest.mark.parametrize("name", list(ENGINES))
def test_each_mask_is_drawn_once_per_step_except_in_lowmem(name):
    model, (x, y) = mlp(), batch()
    per_pass = DEPTH - 1
    assert bernoulli_draws(ENGINES[name](), model, x, y) == (2 * per_pass if name == "foton lowmem" else per_pass)
    model.eval()  # no active dropout: nothing drawn
    assert bernoulli_draws(ENGINES[name](), model, x, y) == 0


def test_kept_masks_equal_the_replayed_ones():
    """difference keeps the masks, lowmem replays the RNG: the same numbers (ReLU, with biases)."""
    model, (x, y) = mlp("relu"), batch()
    kept = step_grads(Foton(), model, x, y, frozen=False)
    replayed = step_grads(Foton(mode="lowmem"), model, x, y, frozen=False)
    for key in kept:
        torch.testing.assert_close(kept[key], replayed[key], rtol=1e-12, atol=1e-14, msg=key)
