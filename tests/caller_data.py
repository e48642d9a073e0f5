"""The guard of "never touch the caller's data" (issue 47): what the framework is handed comes back unwritten.

    with untouched(model, inputs, targets):
        engine.compute_grads(model, inputs, targets, loss_fn)

records, before the operation, the version counter and a copy of every tensor the caller owns: the data given
(tensors, or tuples, lists and dicts of them), the model's parameters (their ``.grad`` is the engines' to write)
and its buffers; after it, each must have its version and its values. A buffer that changed passes only where
the model's own forward changes it too (BatchNorm's running statistics in training mode): found by running the
model's own forward (``call_model``) on a copy of the model as it was, only when some buffer changed.

``guard_entry_points(monkeypatch)`` puts the guard around every entry point that runs a user's model in a way
of its own: every engine's ``compute_grads`` and ``prepare`` (the self-check), structure discovery and the
declared-stack check (``residual_stack``), the model-task check (``check_task_model``, on the task's training
split) and ``gradient_agreement``. ``tests/conftest.py`` applies it in every test, so every engine, discovery,
users'-model, transformers and timm test is also a test that the caller's data is left as it was.
"""

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import gradengines.models.adapters.residual  # noqa: F401  (the submodules, read below through their packages)
import gradengines.trainers.run.agreement  # noqa: F401
import gradengines.trainers.run.model_check  # noqa: F401
import gradengines.trainers.run.trainer  # noqa: F401
from gradengines import models, trainers
from gradengines.models.adapters.calling import call_model, own_copy
from gradengines.tasks.base import Split
from gradengines.trainers.core.engine import GradientEngine
from gradengines.trainers.core.registry import available, engine_class

__all__ = ["untouched", "guard_entry_points", "written"]


def _tensors(value: Any, where: str) -> list[tuple[str, torch.Tensor]]:
    """(where, tensor) of every tensor in ``value`` (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [(where, value)]
    if isinstance(value, (tuple, list)):
        return [t for i, v in enumerate(value) for t in _tensors(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _tensors(v, f"{where}[{k!r}]")]
    return []


def _record(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor, int, torch.Tensor]]:
    return [(name, t, t._version, t.detach().clone()) for name, t in named]


def written(recorded: list[tuple[str, torch.Tensor, int, torch.Tensor]]) -> dict[str, str]:
    """name -> how it was written, for each recorded tensor whose version or values changed."""
    out = {}
    for name, t, version, value in recorded:
        same = t.shape == value.shape and (torch.equal(t.detach(), value) or bool(
            ((t.detach() == value) | (t.detach() != t.detach()) & (value != value)).all()))  # NaN where it was NaN
        if t._version != version or not same:
            change = (f"largest change {(t.detach().double() - value.double()).abs().max().item():.3g}"
                      if t.shape == value.shape else f"shape {tuple(value.shape)} -> {tuple(t.shape)}")
            out[name] = f"version {version} -> {t._version}, {change}"
    return out


def _own_forward_updates(model: nn.Module, buffers: list, modes: dict, data: tuple) -> set[str]:
    """The buffers the model's own forward (``call_model``, in the modes ``modes``) changes, from their recorded
    values: its running statistics, which any training step updates. Run on the model itself (a model holding
    tensors with a graph cannot be deep-copied), its buffers and modes as they are now put back after; a buffer
    is written only where its value differs (the others keep their version counters)."""
    named, modules = dict(model.named_buffers()), dict(model.named_modules())
    now = {name: b.detach().clone() for name, b in named.items()}
    now_modes = {name: m.training for name, m in modules.items()}

    def load(values: dict) -> None:
        with torch.no_grad():
            for name, value in values.items():
                if not torch.equal(named[name], value):
                    named[name].copy_(value)

    load({name: value for name, _, _, value in buffers})
    for name, mode in modes.items():
        modules[name].training = mode
    before = _record(list(named.items()))
    inputs, targets = (*data, None)[:2]
    try:
        with torch.random.fork_rng(), torch.no_grad():
            call_model(model, own_copy(inputs), own_copy(targets))
        return set(written(before))
    finally:
        load(now)
        for name, mode in now_modes.items():
            modules[name].training = mode


@contextlib.contextmanager
def untouched(model: nn.Module | None, *data: Any, what: str = "the operation") -> Iterator[None]:
    """Fail (AssertionError naming each tensor) if anything inside writes ``data``, ``model``'s parameters
    (outside ``.grad``) or its buffers besides those the model's own forward updates (module docstring)."""
    given = _record([t for i, value in enumerate(data) for t in _tensors(value, f"data[{i}]")])
    model = model if isinstance(model, nn.Module) else None  # a bad argument the operation refuses itself
    params = _record(list(model.named_parameters()) if model is not None else [])
    buffers = _record(list(model.named_buffers()) if model is not None else [])
    modes = {name: m.training for name, m in model.named_modules()} if model is not None else {}
    yield
    problems = {**{f"caller's {k}": v for k, v in written(given).items()},
                **{f"parameter {k}": v for k, v in written(params).items()}}
    changed = written(buffers)
    if changed and data:
        allowed = _own_forward_updates(model, buffers, modes, data)
        problems.update({f"buffer {k}": v for k, v in changed.items() if k not in allowed})
    elif changed:
        problems.update({f"buffer {k}": v for k, v in changed.items()})
    assert not problems, f"{what} wrote what the caller owns: " + "; ".join(f"{k} ({v})" for k, v in problems.items())


def _guarded(fn, what: str, read):
    """``fn`` under ``untouched``; ``read(*args, **kwargs)`` gives (model, data...) of a call."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        model, *data = read(*args, **kwargs)
        with untouched(model, *data, what=what):
            return fn(*args, **kwargs)
    return wrapper


def _engine_call(self, model, inputs, targets, *rest, **kwargs):
    return model, inputs, targets


def _stack_call(model, **kwargs):
    example = kwargs.get("example")
    return model, *(example if isinstance(example, tuple) else (example,))


def _task_call(model, task, *rest, **kwargs):
    """The tensors of the task's splits held in tensors (a Dataset's or a token file's ``take`` reads anew)."""
    held = [split for split in (task.train, task.val, task.test) if isinstance(split, Split)]
    return model, *(tensor for split in held for tensor in (split.inputs, split.targets))


def _agreement_call(model, engine, inputs, targets, *rest, **kwargs):
    return model, inputs, targets


def guard_entry_points(monkeypatch) -> None:
    """Every entry point that runs a user's model its own way, under ``untouched`` (module docstring)."""
    classes = {engine_class(name) for name in available()} | {GradientEngine}
    for cls in classes:
        for method in ("compute_grads", "prepare"):
            if method in vars(cls):
                monkeypatch.setattr(cls, method, _guarded(vars(cls)[method], f"{cls.__name__}.{method}",
                                                          _engine_call))
    stack = _guarded(models.adapters.residual.residual_stack, "residual_stack", _stack_call)
    monkeypatch.setattr(models.adapters.residual, "residual_stack", stack)
    monkeypatch.setattr(models, "residual_stack", stack)
    check = _guarded(trainers.run.model_check.check_task_model, "check_task_model", _task_call)
    monkeypatch.setattr(trainers.run.model_check, "check_task_model", check)
    monkeypatch.setattr(trainers.run.trainer, "check_task_model", check)
    agreement = _guarded(trainers.run.agreement.gradient_agreement, "gradient_agreement", _agreement_call)
    monkeypatch.setattr(trainers.run.agreement, "gradient_agreement", agreement)
    monkeypatch.setattr(trainers, "gradient_agreement", agreement)
