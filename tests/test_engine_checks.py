"""``gradengines.testing``: the engine contract as a check. Every built-in engine passes it through the same
function a researcher calls on their own (one suite, no second copy), and each of seven deliberately broken engines
is caught with its own message, naming the promise and the parameter."""

import dataclasses
import random

import pytest
import torch

import gradengines as ge
from gradengines import blocks
from gradengines.testing import EngineContractError, check_engine, engine_checks, parametrize_engine_checks

BUILT_IN = ge.available()
VARIANTS = [ge.build_engine("foton", mode="lowmem"), ge.build_engine("foton", mode="jvp"),
            ge.build_engine("pepita", variant="icml2022"), ge.build_engine("highway", k=3, tol=0.05, mode="fpi"),
            ge.build_engine("tbptt", k=1), ge.build_engine("dsf", feedback="gate", refresh=1)]


@parametrize_engine_checks(BUILT_IN + VARIANTS)
def test_every_built_in_engine_keeps_the_contract(engine, check):
    check(engine)


@pytest.mark.parametrize("engine, exact_on", [
    ("backprop", ["mlp", "orthogonal_mlp", "residual_mlp", "gru"]),
    (ge.build_engine("highway", k=100), ["residual_mlp", "gru"]),  # k >= L: Highway-BP is backprop
    (ge.build_engine("tbptt", k=10**6), ["gru"]),  # k >= T: BPTT
])
def test_the_exact_settings_of_built_in_engines_are_exact(engine, exact_on):
    (exact,) = [c for c in engine_checks(engine, exact_on=exact_on) if c.__name__ == "exact"]
    exact(engine)


# ---- seven broken engines, each breaking one promise -------------------------------------------------------


def _backprop_grads(model, inputs, targets, loss_fn):
    params = [p for _, p in blocks.trainable_parameters(model)]
    outputs, loss = blocks.forward_loss(model, inputs, targets, loss_fn)
    return params, torch.autograd.grad(loss, params), outputs, loss


class MissingGrad(ge.GradientEngine):
    def compute_grads(self, model, inputs, targets, loss_fn):
        params, grads, outputs, loss = _backprop_grads(model, inputs, targets, loss_fn)
        for p, g in list(zip(params, grads, strict=True))[1:]:  # the first parameter forgotten
            p.grad = g
        return blocks.StepOutput(loss.detach(), outputs.detach())


class Accumulating(ge.GradientEngine):
    def compute_grads(self, model, inputs, targets, loss_fn):
        params, grads, outputs, loss = _backprop_grads(model, inputs, targets, loss_fn)
        for p, g in zip(params, grads, strict=True):
            p.grad = g if p.grad is None else p.grad + g  # what loss.backward() does
        return blocks.StepOutput(loss.detach(), outputs.detach())


class ReplacesParameter(ge.GradientEngine):
    def compute_grads(self, model, inputs, targets, loss_fn):
        params, grads, outputs, loss = _backprop_grads(model, inputs, targets, loss_fn)
        blocks.write_grads(params, grads)
        name, p = blocks.trainable_parameters(model)[-1]
        owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        fresh = torch.nn.Parameter(p.detach().clone())
        fresh.grad = p.grad
        setattr(owner, name.rpartition(".")[2], fresh)  # same values, another object: the optimizer's is stale
        return blocks.StepOutput(loss.detach(), outputs.detach())


class WritesParameter(ge.GradientEngine):
    def compute_grads(self, model, inputs, targets, loss_fn):
        params, grads, outputs, loss = _backprop_grads(model, inputs, targets, loss_fn)
        blocks.write_grads(params, grads)
        with torch.no_grad():
            params[0].sub_(1e-3 * grads[0])  # a step of its own
        return blocks.StepOutput(loss.detach(), outputs.detach())


class UnseededNoise(ge.GradientEngine):
    def compute_grads(self, model, inputs, targets, loss_fn):
        params, grads, outputs, loss = _backprop_grads(model, inputs, targets, loss_fn)
        noise = random.SystemRandom()  # not from any seed
        blocks.write_grads(params, [g + 1e-3 * noise.random() for g in grads])
        return blocks.StepOutput(loss.detach(), outputs.detach())


class ForgetsItsState(ge.GradientEngine):
    """Heavy-ball on the gradient, its velocity left out of ``state_dict``."""

    def __init__(self, **options):
        super().__init__(**options)
        self.velocity = None

    def compute_grads(self, model, inputs, targets, loss_fn):
        params, grads, outputs, loss = _backprop_grads(model, inputs, targets, loss_fn)
        old = self.velocity or [torch.zeros_like(g) for g in grads]
        self.velocity = [0.5 * v + g for v, g in zip(old, grads, strict=True)]
        blocks.write_grads(params, self.velocity)
        return blocks.StepOutput(loss.detach(), outputs.detach())


class SignOfBackprop(ge.GradientEngine):
    """sign-SGD: a fine rule, but not backprop (the claim below is false)."""

    def compute_grads(self, model, inputs, targets, loss_fn):
        params, grads, outputs, loss = _backprop_grads(model, inputs, targets, loss_fn)
        blocks.write_grads(params, [g.sign() for g in grads])
        return blocks.StepOutput(loss.detach(), outputs.detach())


@pytest.mark.parametrize("engine, exact_on, promise, says", [
    (MissingGrad, None, "grads_written", r"parameter 'layers\.0\.weight' has no \.grad"),
    (Accumulating, None, "grads_written", r"parameter 'layers\.0\.weight': \.grad holds what was there before"),
    (ReplacesParameter, None, "nothing_else_changed", r"parameter '.*bias' was replaced by another object"),
    (WritesParameter, None, "nothing_else_changed", r"parameter 'layers\.0\.weight' changed"),
    (UnseededNoise, None, "same_seed_same_grads",
     r"parameter 'layers\.0\.weight': two steps from the same seed .* gave different"),
    (ForgetsItsState, None, "resume_exact",
     r"parameter 'layers\.0\.weight' after 2 \+ 2 steps .* differs from 4 steps straight: state the engine keeps"),
    (SignOfBackprop, ["mlp"], "exact", r"claimed exact, but \d+ of \d+ parameter gradients differ from backprop's"),
])
def test_each_broken_engine_is_caught_naming_the_promise_and_the_parameter(engine, exact_on, promise, says):
    with pytest.raises(EngineContractError, match=rf"^{engine.__name__.lower()} breaks '{promise}' on mlp: {says}"):
        check_engine(engine, models=["mlp"], exact_on=exact_on)


class NonFiniteMetric(SignOfBackprop):
    def metrics(self):
        return {"alignment": float("nan")}


class CrashesOnRecurrent(SignOfBackprop):
    def compute_grads(self, model, inputs, targets, loss_fn):
        if inputs.ndim == 3:
            raise RuntimeError("shape mismatch\ninside the arithmetic")
        return super().compute_grads(model, inputs, targets, loss_fn)


class RefusesOverTwoLines(SignOfBackprop):
    def check(self, model):
        if hasattr(model, "recurrent_layers"):
            raise ge.IncompatibleModelError("needs a stack\nof layers")


@pytest.mark.parametrize("engine, promise, says", [
    (NonFiniteMetric, "metrics_finite", r"on mlp: metrics\(\)\['alignment'\] = nan"),
    (CrashesOnRecurrent, "refusal_one_line", r"on gru: check\(\) accepted the model, then compute_grads raised "
                                             r"RuntimeError: shape mismatch: refuse in check\(\)"),
    (RefusesOverTwoLines, "refusal_one_line", r"on gru: its refusal is not one line"),
])
def test_metrics_and_refusals_are_checked(engine, promise, says):
    (check,) = [c for c in engine_checks(engine, models=["mlp", "gru"]) if c.__name__ == promise]
    with pytest.raises(EngineContractError, match=says):
        check(engine)


def test_a_users_engine_on_their_own_model_and_batch_passes_and_an_instance_keeps_its_options():
    @dataclasses.dataclass
    class Options:
        scale: float = blocks.option(1.0, "the step's size")

    class ScaledSign(SignOfBackprop):
        pass

    ScaledSign.Options = Options
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 3)).double()
    x, y = torch.randn(8, 5, dtype=torch.float64), torch.randint(0, 3, (8,))
    before = [p.detach().clone() for p in net.parameters()]
    check_engine(ScaledSign(scale=2.0), models=[(net, x, y)])
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))  # the user's model was copied


def test_an_engine_refusing_every_model_given_says_so():
    class OnlyConvolutions(SignOfBackprop):
        def check(self, model):
            raise ge.IncompatibleModelError("trainer 'onlyconvolutions' needs a convolution")

    with pytest.raises(EngineContractError, match="it refuses all of them .*needs a convolution.*give models="):
        check_engine(OnlyConvolutions)


def test_a_model_to_check_on_must_be_a_case_a_name_or_a_tuple():
    with pytest.raises(TypeError, match="a model to check on is a Case, a default case's name"):
        check_engine("backprop", models=["resnet"])


@pytest.mark.parametrize("engine", ["backprop", "fa", "dfa", "fgrad", "mezo"])
def test_a_model_with_every_parameter_frozen_is_one_line_through_the_python_api(engine):
    """The Trainer refused it; an engine called alone wrote nothing and said nothing (FA ran silently)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model.requires_grad_(False)
    with pytest.raises(ge.ModelConfigError, match=f"trainer '{engine}': Sequential has no trainable parameter"):
        ge.build_engine(engine).compute_grads(model, torch.randn(6, 4), torch.tensor([0, 1, 2] * 2),
                                              torch.nn.functional.cross_entropy)
