"""``--compile`` (issue 49, ``trainers/core/compiled.py``): the model compiled in place where the engine's gradients
on the first batch are its eager ones (the zoo's GPT and a transformers GPT-2: backprop and DFA compile and train as
eagerly), refused in one line where they fail, differ or recompile at every call, and said where the engine never
calls the compiled forward. The tests compile with ``aot_eager`` (dynamo's graphs, forward and backward, without
code generation: minutes of inductor compilation on this CPU are a benchmark's, not a test's)."""

import random

import pytest
import torch
from helpers import one_line_error
from torch import nn

from gradengines import models, tasks, trainers
from gradengines.trainers.cli import train_main
from gradengines.trainers.core.errors import ConfigError

BACKEND = "aot_eager"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def copy_task():
    return tasks.build("copy", length=3, delay=2, n_train=48, n_val=16, n_test=16)


def zoo_gpt(task):
    torch.manual_seed(0)
    return models.build("gpt", in_features=task.input_shape[0], out_features=task.num_outputs,
                        vocab_size=max(task.num_outputs, task.train.largest_input() + 1), depth=2, width=16, heads=2)


def trained(model, engine, task, **options):
    trainer = trainers.Trainer(model, trainers.build_engine(engine), task, batch_size=16, progress=False, lr=1e-2,
                               **options)
    report = trainer.fit(steps=3)
    return [p.detach().clone() for p in model.parameters()], report


@pytest.mark.parametrize("engine", ["backprop", "dfa"])
def test_a_compiled_gpt_trains_as_the_eager_one(engine):
    task = copy_task()
    eager, report = trained(zoo_gpt(task), engine, task)
    model = zoo_gpt(task)
    compiled, compiled_report = trained(model, engine, task, compile=BACKEND)
    assert model._compiled_call_impl is not None  # compiled in place: the same module and parameters
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert compiled_report["test"]["loss"] == pytest.approx(report["test"]["loss"], rel=1e-5)


def test_an_engine_that_fails_compiled_is_refused_and_one_that_runs_its_blocks_is_told(capsys):
    """FA's first-batch check on the GPT fails on dynamo's donated buffers: one line, the model left eager.
    Highway-BP runs the declared blocks itself: the run goes on, saying that nothing it runs is compiled."""
    task = copy_task()
    model = zoo_gpt(task)
    with pytest.raises(ConfigError, match="trainer 'fa' under --compile aot_eager fails on the first batch") as err:
        trainers.Trainer(model, trainers.build_engine("fa"), task, compile=BACKEND, progress=False)
    assert "\n" not in str(err.value) and model._compiled_call_impl is None
    capsys.readouterr()
    trained(zoo_gpt(task), "highway", task, compile=BACKEND)
    assert "note: --compile: trainer 'highway' does not call GPT's forward" in capsys.readouterr().err


class CompiledOtherwise(nn.Module):
    """A forward that computes something else when compiled (torch.compiler.is_compiling)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(64, 10)

    def forward(self, x):
        return self.layer(x) * (2.0 if torch.compiler.is_compiling() else 1.0)


class GuardsOnANewFloat(nn.Module):
    """A forward that reads a float changing at every call (dynamo specialises floats: a new graph each time)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(64, 10)

    def forward(self, x):
        self.noise = random.random()
        return self.layer(x) + 0.0 * self.noise


@pytest.mark.parametrize("model, expected", [
    (CompiledOtherwise, "parameter gradients differ from the eager ones on the first batch"),
    (GuardsOnANewFloat, "the model's forward is compiled again at every step"),
])
def test_a_compiled_forward_unlike_the_eager_one_or_recompiled_each_call_is_refused(model, expected):
    with pytest.raises(ConfigError, match=expected) as err:
        trainers.Trainer(model(), trainers.build_engine("backprop"), tasks.build("digits"), compile=BACKEND,
                         progress=False)
    assert "\n" not in str(err.value)


def test_a_transformers_gpt2_compiles_under_backprop_as_eagerly(tmp_path, capsys):
    """From the command line, by name: --compile aot_eager trains GPT-2 to the eager run's test loss."""
    pytest.importorskip("transformers")
    flags = ["--model", "transformers:GPT2LMHeadModel", "--model-option", "n_layer=1", "--model-option", "n_embd=16",
             "--model-option", "n_head=2", "--model-option", "resid_pdrop=0.0", "--model-option", "embd_pdrop=0.0",
             "--model-option", "attn_pdrop=0.0", "--task", "reverse", "--task-option", "length=4",
             "--task-option", "n_train=32", "--task-option", "n_val=8", "--task-option", "n_test=8",
             "--trainer", "backprop", "--steps", "2", "--batch-size", "16", "--progress", "false"]
    assert train_main([*flags, "--logdir", str(tmp_path / "eager")]) == 0
    eager = capsys.readouterr().out
    assert train_main([*flags, "--compile", BACKEND, "--logdir", str(tmp_path / "compiled")]) == 0
    compiled = capsys.readouterr().out
    loss = [float(out.split('"test": {\n    "loss": ')[1].split(",")[0]) for out in (eager, compiled)]
    assert loss[1] == pytest.approx(loss[0], rel=1e-5)
    assert train_main([*flags, "--compile", "no-such-backend", "--logdir", str(tmp_path / "bad")]) == 2
    assert "under --compile no-such-backend fails on the first batch" in one_line_error(capsys)


def test_a_compiled_run_refused_says_one_line_without_the_compilers_warnings(tmp_path):
    """MeZO under --compile aot_eager hits dynamo's recompile limit (its perturbation mode is a new frame per
    call): eight lines of torch._dynamo warnings came before the project's line; now only that line (a real
    process: pytest's own log capture would hide the warnings in this one)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    done = subprocess.run([sys.executable, str(script), "--trainer", "mezo", "--compile", "aot_eager", "--steps", "1",
                           "--progress", "false", "--logdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: trainer 'mezo' under --compile aot_eager: ")
