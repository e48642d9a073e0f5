"""The engine contract as a check any engine can run, the built-ins' and yours alike.

    from gradengines.testing import check_engine
    check_engine(MyRule)                         # raises EngineContractError naming the broken promise

or, one pytest test per promise (scikit-learn's ``parametrize_with_checks``):

    from gradengines.testing import parametrize_engine_checks

    @parametrize_engine_checks([MyRule])
    def test_my_rule(engine, check):
        check(engine)

The promises (``GradientEngine``'s contract), each checked on every model of ``models`` the engine accepts, in
float64 (defaults: a tanh MLP, an orthogonal MLP, a residual MLP and a GRU sequence classifier, all with dropout
where they have it, on one seeded batch of 16 x 12 features, 4 classes):

* ``grads_written``: every trainable parameter's ``.grad`` is written, with its shape and dtype, finite, and
  overwritten (garbage left in ``.grad`` before the step is gone after it); ``compute_grads`` returns the clean
  pass's finite scalar loss and the outputs.
* ``nothing_else_changed``: no parameter replaced or changed, no input tensor changed, no buffer changed that a
  plain training forward leaves alone.
* ``same_seed_same_grads``: the same seed (Python, NumPy, torch) gives the same gradients, bit for bit.
* ``resume_exact``: four steps of SGD with momentum equal two steps, a checkpoint (model, optimizer, the engine's
  ``state_dict`` through ``torch.save``, the random generators) loaded into a fresh model and a fresh engine, and
  two more steps (``prepare`` on the first batch before the generators are put back, as the Trainer does).
* ``metrics_finite``: ``metrics()`` is ``{name: finite number}`` after a step.
* ``refusal_one_line``: a model the engine cannot train is refused by ``check`` (or on its first batch) with one
  line, an ``IncompatibleModelError`` (or ``ModelConfigError``); no other error on a model it accepts.
* ``exact``, with ``exact_on``: on those models the gradients equal backprop's (float64, the first-batch
  self-check's measure and tolerance, ``trainers.core.self_check``).

``engine``: a registered name, a ``GradientEngine`` subclass, a reference ``file.py:Class``, or an instance (its
options are used for every fresh engine a promise needs). ``models``: a list of ``Case`` or of ``(model, inputs,
targets)`` / ``(model, inputs, targets, loss_fn)`` tuples (the model is copied, never trained); ``exact_on``: the
names of default cases or such tuples.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import random
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from gradengines import models as zoo
from gradengines.models.errors import ModelConfigError, one_line
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.core.engine import GradientEngine, trainable_parameters
from gradengines.trainers.core.errors import IncompatibleModelError
from gradengines.trainers.core.options import as_dict
from gradengines.trainers.core.registry import engine_class
from gradengines.trainers.core.self_check import differences, tolerance
from gradengines.trainers.engines.backprop import Backprop

__all__ = ["check_engine", "engine_checks", "parametrize_engine_checks", "EngineContractError", "Case",
           "default_cases", "PROMISES"]

SEED = 1234
GARBAGE = 1e6  # left in .grad before a step: an engine that accumulates keeps it

class EngineContractError(AssertionError):
    """An engine broke a promise of the contract: ``"<engine> breaks '<promise>' on <case>: <what>"``."""


@dataclasses.dataclass
class Case:
    """A model to check an engine on: ``build()`` returns a fresh one (float64), ``inputs`` and ``targets`` a
    batch, ``loss_fn(outputs, targets)`` its mean loss."""

    name: str
    build: Callable[[], nn.Module]
    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: Callable = cross_entropy_loss

    def batch(self, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of ``step``: the inputs rolled by ``step`` rows (another batch each step, the same in every
        run), the caller's copy."""
        return self.inputs.roll(step, 0).clone(), self.targets.roll(step, 0).clone()


def default_cases() -> list[Case]:
    """The models ``check_engine`` tries when given none (module docstring)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 12, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 4, (16,), generator=gen)

    def built(name: str, **options) -> Callable[[], nn.Module]:
        def build():
            torch.manual_seed(0)
            return zoo.build(name, in_features=12, out_features=4, **options).double()

        return build

    return [
        Case("mlp", built("mlp", depth=3, width=10, activation="tanh", dropout=0.1), x, y),
        Case("orthogonal_mlp", built("mlp", depth=3, width=12, activation="tanh", orthogonal="bjorck"), x, y),
        Case("residual_mlp", built("residual_mlp", depth=3, width=10, dropout=0.1), x, y),
        Case("gru", built("rnn_lm", input_dim=1, cell="gru", hidden=8, depth=2), x[..., None], y),
    ]


def _cases(given, defaults: list[Case] | None = None) -> list[Case]:
    if given is None:
        return defaults if defaults is not None else default_cases()
    named = {c.name: c for c in default_cases()}
    out = []
    for i, item in enumerate(given):
        if isinstance(item, Case):
            out.append(item)
        elif isinstance(item, str) and item in named:
            out.append(named[item])
        elif isinstance(item, tuple) and len(item) in (3, 4) and isinstance(item[0], nn.Module):
            model = copy.deepcopy(item[0])
            out.append(Case(f"{type(model).__name__} #{i}", lambda model=model: copy.deepcopy(model), item[1], item[2],
                            *item[3:]))
        else:
            raise TypeError(f"a model to check on is a Case, a default case's name ({', '.join(named)}) or "
                            f"(model, inputs, targets[, loss_fn]), got {item!r:.80}")
    return out


def _factory(engine) -> tuple[str, Callable[[], GradientEngine]]:
    """(the engine's name, a function making a fresh one with the same options)."""
    if isinstance(engine, GradientEngine):
        cls, options = type(engine), as_dict(engine.options)
        return cls.name, lambda: cls(**options)
    cls = engine_class(engine)
    return cls.name, cls


def _seed(seed: int = SEED) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _Checker:
    """One engine against the contract (module docstring): the models it accepts, and each promise."""

    def __init__(self, engine, models=None, exact_on=None):
        self.name, self.make = _factory(engine)
        self.cases, self.refused = [], {}
        for case in _cases(models):
            try:
                self.make().check(case.build())
            except IncompatibleModelError as err:
                self.refused[case.name] = str(err)
                continue
            self.cases.append(case)
        self.exact_on = _cases(exact_on, []) if exact_on is not None else []

    def fail(self, promise: str, case: Case | str, what: str) -> None:
        where = case.name if isinstance(case, Case) else case
        raise EngineContractError(f"{self.name} breaks '{promise}' on {where}: {what}")

    def accepted(self, promise: str) -> list[Case]:
        if not self.cases:
            self.fail(promise, "every model it was given", "it refuses all of them ("
                      + "; ".join(f"{k}: {v}" for k, v in self.refused.items()) + "); give models=[...] it trains")
        return self.cases

    def step(self, promise: str, case: Case, engine: GradientEngine, model: nn.Module, batch_step: int = 0):
        """One ``compute_grads``; an error is the promise's failure (refusals are ``refusal_one_line``'s)."""
        x, y = case.batch(batch_step)
        try:
            return engine.compute_grads(model, x, y, case.loss_fn)
        except Exception as err:  # noqa: BLE001  (whatever it raised is what the user would see)
            self.fail(promise, case, f"compute_grads raised {one_line(err)}")

    def grads(self, case: Case, engine: GradientEngine | None = None, promise: str = "same_seed_same_grads") -> dict:
        _seed()
        model = case.build()
        self.step(promise, case, engine or self.make(), model)
        return {n: None if p.grad is None else p.grad.clone() for n, p in trainable_parameters(model)}

    # ---- the promises ----

    def grads_written(self) -> None:
        for case in self.accepted("grads_written"):
            _seed()
            model, engine = case.build(), self.make()
            out = self.step("grads_written", case, engine, model)
            if not (isinstance(getattr(out, "loss", None), torch.Tensor) and out.loss.ndim == 0
                    and torch.isfinite(out.loss)):
                self.fail("grads_written", case, f"compute_grads must return StepOutput(loss=<finite scalar>, "
                                                 f"outputs=...), got {out!r:.80}")
            if not isinstance(out.outputs, torch.Tensor) or out.outputs.shape[0] != case.inputs.shape[0]:
                self.fail("grads_written", case, "StepOutput.outputs must be the clean pass's outputs, one row per "
                                                 "example")
            first = {}
            for name, p in trainable_parameters(model):
                if p.grad is None:
                    self.fail("grads_written", case, f"parameter '{name}' has no .grad after compute_grads (write "
                                                     f"zeros where the estimate is zero: write_grads)")
                if p.grad.shape != p.shape or p.grad.dtype != p.dtype:
                    self.fail("grads_written", case, f"parameter '{name}': .grad is {tuple(p.grad.shape)} "
                                                     f"{p.grad.dtype}, the parameter {tuple(p.shape)} {p.dtype}")
                if not torch.isfinite(p.grad).all():
                    self.fail("grads_written", case, f"parameter '{name}': .grad is not finite")
                first[name] = p.grad.clone()
            # the same step again, from the same state, over garbage: it must be overwritten
            _seed()
            model, engine = case.build(), self.make()
            for _, p in trainable_parameters(model):
                p.grad = torch.full_like(p, GARBAGE)
            self.step("grads_written", case, engine, model)
            for name, p in trainable_parameters(model):
                if (p.grad - first[name]).abs().max() > GARBAGE / 2:  # the garbage is still in it
                    self.fail("grads_written", case, f"parameter '{name}': .grad holds what was there before "
                                                     f"(accumulated, not overwritten: p.grad = g, write_grads)")

    def nothing_else_changed(self) -> None:
        for case in self.accepted("nothing_else_changed"):
            _seed()
            model, engine = case.build(), self.make()
            reference = copy.deepcopy(model)
            x, y = case.batch()
            kept_x, kept_y = x.clone(), y.clone()
            params = {n: (p, p.detach().clone()) for n, p in model.named_parameters()}
            buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
            _seed()
            with torch.no_grad():
                zoo.call_model(reference.train(), x.clone(), y.clone())
            plain = dict(reference.named_buffers())  # what one training forward does to the buffers
            model.train()
            _seed()
            try:
                engine.compute_grads(model, x, y, case.loss_fn)
            except Exception as err:  # noqa: BLE001
                self.fail("nothing_else_changed", case, f"compute_grads raised {one_line(err)}")
            now = dict(model.named_parameters())
            for name, (p, value) in params.items():
                if now.get(name) is not p:
                    self.fail("nothing_else_changed", case, f"parameter '{name}' was replaced by another object "
                                                            f"(update in place; never assign a new Parameter)")
                if not torch.equal(p.detach(), value):
                    self.fail("nothing_else_changed", case, f"parameter '{name}' changed (an engine writes .grad "
                                                            f"only; the optimizer steps)")
            for name, b in model.named_buffers():
                if name in buffers and torch.equal(plain[name], buffers[name]) and not torch.equal(b, buffers[name]):
                    self.fail("nothing_else_changed", case, f"buffer '{name}' changed, which a training forward "
                                                            f"leaves alone")
            if not (torch.equal(x, kept_x) and torch.equal(y, kept_y)):
                self.fail("nothing_else_changed", case, "the caller's inputs or targets were written")

    def same_seed_same_grads(self) -> None:
        for case in self.accepted("same_seed_same_grads"):
            first, second = self.grads(case), self.grads(case)
            for name in first:
                if not (first[name] is None and second[name] is None) and not (
                        first[name] is not None and second[name] is not None and torch.equal(first[name],
                                                                                              second[name])):
                    self.fail("same_seed_same_grads", case, f"parameter '{name}': two steps from the same seed "
                                                            f"(random, numpy, torch) gave different gradients (draw "
                                                            f"from torch's generator or a seeded one of your own)")

    def _prepared(self, case: Case, model: nn.Module, engine: GradientEngine) -> None:
        """``engine.prepare`` on the first batch, as the Trainer calls it before its first step or after a resume,
        before the random generators are put back."""
        try:
            engine.prepare(model, *case.batch(), case.loss_fn)
        except Exception as err:  # noqa: BLE001
            self.fail("resume_exact", case, f"prepare (check, first_batch_check) raised {one_line(err)}")

    def _train(self, case: Case, steps: int, resume_at: int | None) -> dict[str, torch.Tensor]:
        _seed()
        model, engine = case.build(), self.make()
        self._prepared(case, model, engine)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(steps):
            if step == resume_at:  # a checkpoint written and read as the Trainer's, into fresh objects
                buffer = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "engine": engine.state_dict(), "rng": torch.get_rng_state(),
                            "numpy": np.random.get_state(), "random": random.getstate()}, buffer)
                buffer.seek(0)
                state = torch.load(buffer, weights_only=False)
                model, engine = case.build(), self.make()
                model.load_state_dict(state["model"])
                optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
                optimizer.load_state_dict(state["optimizer"])
                engine.load_state_dict(state["engine"])
                self._prepared(case, model, engine)
                torch.set_rng_state(state["rng"])
                np.random.set_state(state["numpy"])
                random.setstate(state["random"])
            self.step("resume_exact", case, engine, model, step)
            optimizer.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    def resume_exact(self) -> None:
        for case in self.accepted("resume_exact"):
            straight, resumed = self._train(case, 4, None), self._train(case, 4, 2)
            for name, value in straight.items():
                if not torch.allclose(resumed[name], value, rtol=1e-10, atol=1e-12):
                    self.fail("resume_exact", case, f"parameter '{name}' after 2 + 2 steps with a checkpoint between "
                                                    f"differs from 4 steps straight: state the engine keeps between "
                                                    f"steps must be in its state_dict and restored by load_state_dict")

    def metrics_finite(self) -> None:
        for case in self.accepted("metrics_finite"):
            _seed()
            model, engine = case.build(), self.make()
            self.step("metrics_finite", case, engine, model)
            metrics = engine.metrics()
            if not isinstance(metrics, dict):
                self.fail("metrics_finite", case, f"metrics() must return a dict, got {type(metrics).__name__}")
            for key, value in metrics.items():
                number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
                if not isinstance(key, str) or not isinstance(number, (int, float)) or not math.isfinite(number):
                    self.fail("metrics_finite", case, f"metrics()[{key!r}] = {value!r:.60}: each metric is a finite "
                                                      f"number (logged as engine/<name>)")

    def refusal_one_line(self) -> None:
        for name, message in self.refused.items():
            if "\n" in message.strip() or not message.strip():
                self.fail("refusal_one_line", name, f"its refusal is not one line: {message!r:.120}")
        for case in self.cases:
            _seed()
            model, engine = case.build(), self.make()
            x, y = case.batch()
            try:
                engine.compute_grads(model, x, y, case.loss_fn)
            except (IncompatibleModelError, ModelConfigError) as err:
                crash = err.__cause__  # the first batch's one line over an error inside the engine's arithmetic
                if crash is not None and not type(crash).__module__.startswith("gradengines."):
                    self.fail("refusal_one_line", case, f"check() accepted the model, then compute_grads raised "
                                                        f"{one_line(crash)}: refuse in check(), in one "
                                                        f"IncompatibleModelError line")
                if "\n" in str(err).strip():
                    self.fail("refusal_one_line", case, f"its refusal is not one line: {str(err)!r:.120}")
            except Exception as err:  # noqa: BLE001
                self.fail("refusal_one_line", case, f"check() accepted the model, then compute_grads raised "
                                                    f"{one_line(err)}: refuse in check(), in one "
                                                    f"IncompatibleModelError line")

    def exact(self) -> None:
        for case in self.exact_on:
            got, expected = self.grads(case, promise="exact"), self.grads(case, Backprop(), promise="exact")
            names = list(got)
            wrong = differences(names, [got[n] for n in names], [expected[n] for n in names], torch.float64)
            if wrong:
                first = ", ".join(f"'{n}' ({m:.2g})" for n, m in wrong[:3])
                self.fail("exact", case, f"claimed exact, but {len(wrong)} of {len(names)} parameter gradients differ "
                                         f"from backprop's (relative, tolerance {tolerance(torch.float64):g} in "
                                         f"float64): {first}")


PROMISES = ("grads_written", "nothing_else_changed", "same_seed_same_grads", "resume_exact", "metrics_finite",
            "refusal_one_line", "exact")


def engine_checks(engine, models: Sequence | None = None, exact_on: Sequence | None = None) -> list[Callable]:
    """One function per promise (``exact`` only with ``exact_on``), each taking the engine and raising
    ``EngineContractError``; named after the promise."""
    checks = []
    for promise in PROMISES:
        if promise == "exact" and not exact_on:
            continue

        def check(engine=engine, promise=promise):
            getattr(_Checker(engine, models, exact_on), promise)()

        check.__name__ = promise
        checks.append(check)
    return checks


def check_engine(engine, models: Sequence | None = None, exact_on: Sequence | None = None) -> None:
    """Run every promise of the contract on ``engine`` (module docstring); raise ``EngineContractError`` at the
    first broken one, naming the promise, the model and the parameter."""
    checker = _Checker(engine, models, exact_on)
    for promise in PROMISES:
        if promise != "exact" or exact_on:
            getattr(checker, promise)()


def parametrize_engine_checks(engines: Sequence, models: Sequence | None = None, exact_on: Sequence | None = None):
    """``pytest.mark.parametrize("engine, check", ...)``: one test per engine and promise, ids
    ``<engine>-<promise>``; the test body is ``check(engine)``."""
    import pytest  # noqa: PLC0415  (only for the tests that use it)

    params = []
    for engine in engines:
        name = _factory(engine)[0]
        if isinstance(engine, GradientEngine):  # its options that are not the defaults: foton-modelowmem
            defaults = as_dict(type(engine).Options())
            name = "-".join([name, *(f"{k}{v}" for k, v in as_dict(engine.options).items() if defaults[k] != v)])
        params += [pytest.param(engine, check, id=f"{name}-{check.__name__}")
                   for check in engine_checks(engine, models, exact_on)]
    return pytest.mark.parametrize("engine, check", params)
