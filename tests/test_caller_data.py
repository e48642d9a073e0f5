"""Never touch the caller's data (issue 47): structure discovery, the engines and the command line leave the
example, the batch and the task's splits as they were given, whatever the model does in place.

Two models of ``tests/inplace_models.py``: ``InPlaceStem`` (timm's NFNet in small: a stem of layers joined by
in-place SiLUs, which discovery runs passing their input through, so the first SiLU wrote into the caller's
tensor) and ``ScalesItsInput`` (a residual stack whose own stem scales its input in place: the model's doing,
which a direct call does to its input, and which every run of the framework does to a copy of its own). Every test
of the suite also runs the engines and discovery under the guard (``tests/caller_data.py``); here are its
contrasts.
"""

from pathlib import Path

import pytest
import torch
from caller_data import untouched
from helpers import autograd_grads, engine_grads, relative
from inplace_models import InPlaceStem, ScalesItsInput
from torch import nn

from gradengines import models, tasks, trainers
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.cli import train_main
from gradengines.trainers.core.registry import available

MODELS = str(Path(__file__).resolve().parent / "inplace_models.py")


def batch(features=64, n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=gen, dtype=torch.float64), torch.randint(0, 10, (n,), generator=gen)


def built(cls):
    torch.manual_seed(0)
    return cls().double()


def callers_copy_not_made(monkeypatch):
    """The fault of issue 47: the model's runs handed the caller's tensors (as discovery's runs were)."""
    monkeypatch.setattr(models.adapters.calling, "own_copy", lambda value: value)


def exact(model, x, y):
    """d loss / d theta of the model's own forward on a fresh copy of ``x`` (what training on x means)."""
    return autograd_grads(model, cross_entropy_loss(models.call_model(model, x.clone(), y).outputs, y))


def test_discovery_on_a_stem_of_in_place_activations_leaves_the_example_and_is_exact():
    model, (x, y) = built(InPlaceStem), batch()
    with untouched(model, x, y):
        stack = models.residual_stack(model, example=(x, y))
    assert stack.found.startswith("4 blocks (Residual in body)")
    with untouched(model, x, y):
        got = engine_grads(stack, trainers.build_engine("highway", k=10), x, y, strip="model.")
    assert relative(got, exact(model, x, y)) < 1e-10


@pytest.mark.unguarded
def test_discovery_fed_the_callers_tensor_is_caught_by_the_guard(monkeypatch):
    """The contrast: the same model and example, the copy not made: the guard names the example, which
    discovery's run with the stem passing its input through changed."""
    callers_copy_not_made(monkeypatch)
    model, (x, y) = built(InPlaceStem), batch()
    with pytest.raises(AssertionError, match=r"residual_stack wrote what the caller owns: caller's data\[0\] "
                                             r"\(version 0 -> [1-9]\d*, largest change [1-9]"):
        with untouched(model, x, y, what="residual_stack"):
            models.residual_stack(model, example=(x, y))


def kept_task(monkeypatch) -> dict:
    """The task the command line builds, and a copy of its splits as built."""
    seen = {}
    build = tasks.build

    def keep(*args, **kwargs):
        task = build(*args, **kwargs)
        seen["task"] = task
        seen["copy"] = {s: (getattr(task, s).inputs.clone(), getattr(task, s).targets.clone())
                        for s in ("train", "val", "test")}
        seen["versions"] = {s: getattr(task, s).inputs._version for s in ("train", "val", "test")}
        return task

    monkeypatch.setattr(tasks, "build", keep)
    return seen


def changed_splits(seen) -> list[str]:
    task = seen["task"]
    return [s for s in ("train", "val", "test")
            if not torch.equal(getattr(task, s).inputs, seen["copy"][s][0])
            or not torch.equal(getattr(task, s).targets, seen["copy"][s][1])
            or getattr(task, s).inputs._version != seen["versions"][s]]


@pytest.mark.parametrize("model", ["InPlaceStem", "ScalesItsInput"])
def test_the_command_line_leaves_the_task_as_built_after_discovery_and_a_step(tmp_path, monkeypatch, capsys, model):
    seen = kept_task(monkeypatch)
    assert train_main(["--trainer", "highway", "--model", f"{MODELS}:{model}", "--task", "digits", "--steps", "1",
                       "--batch-size", "8", "--progress", "false", "--logdir", str(tmp_path)]) == 0
    if model == "InPlaceStem":  # found, not declared
        assert "note: highway: found 4 blocks (Residual in body)" in capsys.readouterr().err
    assert changed_splits(seen) == []


@pytest.mark.unguarded
def test_the_command_line_with_discovery_fed_the_training_split_changes_it(tmp_path, monkeypatch):
    """The contrast: the copies not made (discovery's example a view of the training split, as before): the
    first two training samples change, and nothing says so."""
    callers_copy_not_made(monkeypatch)
    monkeypatch.setattr(trainers.cli.args, "_example", lambda task: (task.train.inputs[:2], task.train.targets[:2]))
    seen = kept_task(monkeypatch)
    assert train_main(["--trainer", "highway", "--model", f"{MODELS}:InPlaceStem", "--task", "digits", "--steps",
                       "1", "--batch-size", "8", "--progress", "false", "--logdir", str(tmp_path)]) == 0
    assert changed_splits(seen) == ["train"]
    assert not torch.equal(seen["task"].train.inputs[:2], seen["copy"]["train"][0][:2])
    assert torch.equal(seen["task"].train.inputs[2:], seen["copy"]["train"][0][2:])


def test_a_model_that_writes_into_its_input_changes_only_a_direct_calls_input():
    """The model's own doing, documented and not refused: ``model(x)`` doubles x (PyTorch's semantics, which the
    guard sees), while every engine that takes the model leaves x as given and, where exact, computes the
    gradient of the model's forward on x: no run of a check or an engine sees the batch another run wrote."""
    model, (x, y) = built(ScalesItsInput), batch()
    expected = exact(model, x, y)
    direct = x.clone()
    with pytest.raises(AssertionError, match=r"model\(x\) wrote what the caller owns: caller's data\[0\]"):
        with untouched(model, direct, what="model(x)"):
            model(direct)
    assert torch.equal(direct, 2 * x)
    ran = []
    for name in available():
        engine = trainers.build_engine(name, **({"k": 10} if name == "highway" else {}))
        try:
            engine.check(model)
        except trainers.IncompatibleModelError:
            continue
        with untouched(model, x, y, what=name):
            got = engine_grads(model, engine, x, y)
        ran.append(name)
        if name in ("backprop", "highway"):
            assert relative(got, expected) < 1e-12, name
    assert {"backprop", "highway"} <= set(ran)
    with untouched(model, x, y):
        stack = models.residual_stack(model, example=(x, y))  # found from its forward as any model's
        assert relative(engine_grads(stack, trainers.build_engine("highway", k=10), x, y, strip="model."),
                        expected) < 1e-12


@pytest.mark.unguarded
def test_an_engine_without_its_own_copy_writes_the_callers_batch(monkeypatch):
    """The contrast of the engines' copy (``compute_grads`` on its own copy of the batch): without it, Highway-BP
    runs the stack's stem on the caller's tensor, which this model's stem scales in place."""
    monkeypatch.setattr(trainers.core.engine, "own_copy", lambda value: value)
    model, (x, y) = built(ScalesItsInput), batch()
    with pytest.raises(AssertionError, match=r"caller's data\[0\] \(version 0 -> 1, largest change"):
        with untouched(model, x, y):
            trainers.build_engine("highway", k=10).compute_grads(model, x, y, cross_entropy_loss)


def test_the_guard_allows_what_the_models_forward_updates_and_nothing_else():
    """BatchNorm's running statistics, updated by a training-mode forward, pass; the same buffers written where
    the model's forward does not write them (eval mode), a parameter written with its own values (its version
    moves) and a target written are each named."""
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    with untouched(model, x, y):
        model(x)
    model.eval()
    with pytest.raises(AssertionError, match=r"buffer 1.running_mean \(version \d+ -> \d+, largest change 1"):
        with untouched(model, x, y):
            model[1].running_mean.add_(1.0)
    with pytest.raises(AssertionError, match=r"parameter 0.weight \(version \d+ -> \d+, largest change 0\)"):
        with untouched(model, x, y), torch.no_grad():
            model[0].weight.copy_(model[0].weight.clone())
    with pytest.raises(AssertionError, match=r"caller's data\[1\]"):
        with untouched(model, x, y):
            y[0] = 2 - y[0]


def test_the_split_fingerprint_is_read_when_the_task_is_made():
    """What a resumed run compares (``identity()["task"]["split"]``) is the hash of the data as built: a later
    write into a split (any code's) does not move it, another split of the same data does."""
    task = tasks.build("digits")
    made = task.fingerprint
    task.train.inputs[:2] += 1.0
    trainer = trainers.Trainer(models.build("mlp", in_features=64, out_features=10, depth=2, width=8),
                               trainers.build_engine("backprop"), task, progress=False)
    assert trainer.identity()["task"]["split"] == made
    assert tasks.build("digits", seed=1).fingerprint != made
    assert tasks.build("digits").fingerprint == made


@pytest.mark.parametrize("rows", [slice(0, 3), slice(2, None, 2), torch.tensor([4, 0, 4])])
def test_a_split_hands_out_copies_of_its_rows(rows):
    """``Split.take``: the rows asked for, in a tensor of their own (writing into it leaves the split); what the
    command line finds a structure from and the Trainer checks the model on are taken this way."""
    task = tasks.build("digits")
    split = task.train
    before = split.inputs.clone(), split.targets.clone()
    x, y = split.take(rows)
    assert torch.equal(x, split.inputs[rows]) and torch.equal(y, split.targets[rows])
    x.add_(1.0)
    y.zero_()
    assert torch.equal(split.inputs, before[0]) and torch.equal(split.targets, before[1])
    example = trainers.cli.args._example(task)
    assert [len(t) for t in example] == [2, 2] and torch.equal(example[0], split.inputs[:2])
    assert example[0].untyped_storage().data_ptr() != split.inputs.untyped_storage().data_ptr()
