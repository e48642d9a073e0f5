"""Progress lines when stderr is not a terminal, and bounded periodic evaluation."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import FakeClock, TimedBackprop

from gradengines import models, tasks, trainers
from gradengines.trainers.cli import train_main
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.options import parse_options
from gradengines.trainers.run.config import TrainConfig
from gradengines.trainers.run.logger import read_metrics
from gradengines.trainers.run.progress import Progress
from gradengines.trainers.run.trainer import eval_subset

ROOT = Path(__file__).resolve().parents[1]
STATUS = re.compile(r"^\[backprop seed 0\] step (\d+)/(\d+) \([\d.]+%\)  loss \d+\.\d{4}  ([\d.]+) steps/s  "
                    r"elapsed \d+:\d\d:\d\d  left \d+:\d\d:\d\d$")
TEACHER = ["--task", "teacher", "--task-option", "in_features=8", "--task-option", "num_classes=4",
           "--task-option", "n_train=64", "--task-option", "n_val=32", "--task-option", "n_test=32",
           "--task-option", "hidden=8", "--depth", "2", "--width", "8", "--batch-size", "16"]


@pytest.fixture(scope="module")
def task():
    return tasks.build("teacher", in_features=8, num_classes=4, n_train=128, n_val=64, n_test=64, hidden=8)


def make_trainer(task, clock=None, seed=0, **overrides):
    clock = clock or FakeClock()
    torch.manual_seed(seed)
    model = models.build("mlp", in_features=8, out_features=4, depth=2, width=8)
    options = dict(batch_size=32, seed=seed, optimizer="sgd", lr=0.1, progress_seconds=10.0)
    return trainers.Trainer(model, TimedBackprop(clock), task, clock=clock, **{**options, **overrides})


def by_hand(model, data, rows=None):
    """Mean cross-entropy and accuracy of ``model`` over ``rows`` of ``data``, in one batch."""
    rows = torch.arange(len(data)) if rows is None else rows
    model.eval()
    with torch.no_grad():
        out = model(data.inputs[rows])
    y = data.targets[rows]
    return {"loss": torch.nn.functional.cross_entropy(out, y).item(),
            "accuracy": (out.argmax(1) == y).double().mean().item()}


def test_a_line_every_progress_seconds_not_every_step(task, capsys):
    """1 s per step, a line every 10 s: steps 10, 20, 30 of 35, then evaluations and a final line."""
    make_trainer(task, eval_every=16).fit(steps=35)
    err = capsys.readouterr().err.splitlines()
    status = [line for line in err if STATUS.match(line)]
    assert [STATUS.match(line).groups() for line in status] == [("10", "35", "1"), ("20", "35", "1"), ("30", "35", "1")]
    assert status[0].startswith("[backprop seed 0] step 10/35 (28.6%)  loss ")
    assert status[0].endswith("  1 steps/s  elapsed 0:00:10  left 0:00:25")
    assert err[0] == status[0]  # nothing before 10 s had passed
    evals = [line for line in err if " eval " in line]
    assert [line.split("  eval ")[0] for line in evals[:3]] == [f"[backprop seed 0] step {s}/35" for s in (16, 32, 35)]
    assert all(line.endswith("(all 64)") for line in evals)
    assert re.match(r"^\[backprop seed 0\] step 35/35 \(100\.0%\)  loss \d+\.\d{4}  1 steps/s  elapsed 0:00:35  done$",
                    err[-1])  # after the end-of-run evaluations: the run is done once they are
    assert "eval val (last model) accuracy" in evals[3] and "eval test (best model, step" in evals[4]
    assert len(err) == len(status) + len(evals) + 1


def test_the_rate_leaves_out_the_first_step():
    clock, out = FakeClock(), io.StringIO()
    progress = Progress("run seed 3", 100, every=3.0, stream=out, clock=clock)
    for step, seconds in enumerate([5.0] + [0.5] * 9, start=1):  # a slow first step, then 2 steps/s
        clock.now += seconds
        progress.update(step, 1.0)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[run seed 3] step 1/100 (1.0%)  loss 1.0000  0.2 steps/s  elapsed 0:00:05  left 0:08:15"
    assert lines[1] == "[run seed 3] step 7/100 (7.0%)  loss 1.0000  2 steps/s  elapsed 0:00:08  left 0:00:46"
    assert lines[2] == "[run seed 3] step 10/100 (10.0%)  loss 1.0000  2 steps/s  elapsed 0:00:10  stopped"
    assert len(lines) == 3


def test_a_terminal_gets_the_bar_and_no_lines():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    clock, out = FakeClock(), Terminal()
    progress = Progress("run seed 0", 20, every=1.0, stream=out, clock=clock)
    for step in range(1, 21):
        clock.now += 5.0
        progress.update(step, 0.5)
    progress.evaluated("val", "accuracy", 0.5, samples=8, of=8, batch_size=8)
    progress.close()
    assert "[run seed 0]" not in out.getvalue() and "/20" in out.getvalue()


def test_progress_false_prints_nothing(task, capsys, tmp_path):
    make_trainer(task, progress=False, progress_seconds=1e-9).fit(steps=6)
    assert capsys.readouterr().err == ""
    assert train_main([*TEACHER, "--steps", "3", "--progress", "false", "--progress-seconds", "1e-9",
                       "--logdir", str(tmp_path / "off")]) == 0
    assert "[backprop seed 0]" not in capsys.readouterr().err
    assert train_main([*TEACHER, "--steps", "3", "--progress-seconds", "1e-9", "--logdir", str(tmp_path / "on")]) == 0
    assert any(STATUS.match(line) for line in capsys.readouterr().err.splitlines())


def test_metrics_reach_the_file_every_progress_seconds(task, tmp_path):
    """metrics.jsonl is flushed every 5 (fake) seconds between evaluations, with or without progress lines."""
    run = tmp_path / "default" / "backprop" / "seed0"
    on_disk = {}

    class Peek(TimedBackprop):
        def compute_grads(self, *args):
            on_disk[self.clock.now] = len(read_metrics(run))
            return super().compute_grads(*args)

    clock = FakeClock()
    torch.manual_seed(0)
    model = models.build("mlp", in_features=8, out_features=4, depth=2, width=8)
    trainers.Trainer(model, Peek(clock), task, clock=clock, logdir=tmp_path, batch_size=32, log_every=1,
                     eval_every=1000, progress=False, progress_seconds=5.0).fit(steps=12)
    assert [on_disk[t] for t in (0, 4, 5, 9, 10, 11)] == [0, 0, 5, 5, 10, 10]


def test_bounded_evaluation_is_a_fixed_subset_and_the_report_uses_whole_splits(task, capsys):
    runs = {}
    for seed in (0, 1):
        trainer = make_trainer(task, seed=seed, eval_batches=2, eval_batch_size=8, eval_every=4, progress_seconds=1e9)
        calls, evaluate = [], trainer.evaluate

        def spy(split="val", rows=None, on_batch=None, calls=calls, evaluate=evaluate):
            calls.append((split, None if rows is None else rows.clone()))
            return evaluate(split, rows, on_batch)

        trainer.evaluate = spy
        report = trainer.fit(steps=12)
        runs[seed] = trainer, report, calls, capsys.readouterr().err
    rows = runs[0][2][0][1]
    assert len(rows) == 16 == len(set(rows.tolist())) and torch.equal(rows, eval_subset(64, 4, 8)[:16])
    for trainer, report, calls, err in runs.values():
        # periodic evaluations at steps 4, 8, 12 on the same 16 rows; the report on whole splits
        last_is_best = trainer.best["step"] == 12  # then the last model's whole-split pass serves both
        assert [split for split, _ in calls] == ["val"] * (4 if last_is_best else 5) + ["test"]
        assert all(torch.equal(r, rows) for _, r in calls[:3]) and all(r is None for _, r in calls[3:])
        evals = [h for h in trainer.history if "eval/loss" in h]
        assert [(h["step"], h["eval/samples"]) for h in evals] == [(4, 16), (8, 16), (12, 16)]
        assert {"loss": evals[-1]["eval/loss"], "accuracy": evals[-1]["eval/accuracy"]} == pytest.approx(
            by_hand(trainer.model, task.val, rows), rel=1e-5)
        # selection on the subset: the first best bounded accuracy
        best = max(evals, key=lambda h: h["eval/accuracy"])
        assert trainer.best["step"] == best["step"] == report["best_step"]
        assert trainer.best["val"] == {"loss": best["eval/loss"], "accuracy": best["eval/accuracy"]}
        assert report["final_val"] == pytest.approx(by_hand(trainer.model, task.val), rel=1e-5)
        chosen = models.build("mlp", in_features=8, out_features=4, depth=2, width=8)
        chosen.load_state_dict(trainer.best["state"])
        assert report["best_val"] == pytest.approx(by_hand(chosen, task.val), rel=1e-5)
        assert report["test"] == pytest.approx(by_hand(chosen, task.test), rel=1e-5)
        assert report["best_val"]["loss"] != trainer.best["val"]["loss"]
        # periodic evaluations at 4 and 8 s fall within the first 10 s: only the last one (step 12) is shown
        assert err.count("(2 batches of 8 of 64)") == 1 and err.count("(all 64)") == (2 if last_is_best else 3)


def test_unbounded_evaluation_is_unchanged(task):
    trainer = make_trainer(task, eval_every=4, progress=False)
    report = trainer.fit(steps=8)
    assert trainer.eval_rows is None and eval_subset(64, 8, 8) is None and eval_subset(64, None, 8) is None
    assert [h["eval/samples"] for h in trainer.history if "eval/loss" in h] == [64, 64]
    assert report["best_val"] == trainer.best["val"]


@pytest.mark.parametrize("option, value, message", [
    ("eval_batches", 0, "eval_batches must be >= 1 or none, got 0"),  # Python spelling
    ("progress_seconds", 0, "progress_seconds must be > 0, got 0.0"),
    ("progress_seconds", float("nan"), "option 'progress_seconds' must be a finite number, got nan"),
])
def test_bad_values_are_one_line_config_errors(option, value, message):
    with pytest.raises(ConfigError) as err:
        parse_options(TrainConfig, {option: value})
    assert str(err.value) == message


@pytest.mark.parametrize("flags, message", [
    (["--eval-batches", "0"], "error: --eval-batches must be >= 1 or none, got 0\n"),
    (["--progress-seconds", "0"], "error: --progress-seconds must be > 0, got 0.0\n"),
])
def test_bad_values_exit_2_from_the_command_line(flags, message, tmp_path, capsys):
    assert train_main([*TEACHER, "--steps", "1", *flags, "--logdir", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == message
    assert not (tmp_path / "runs").exists()


def test_train_script_prints_progress_into_a_pipe(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *TEACHER, "--steps", "6",
                           "--progress", "true", "--progress-seconds", "1e-6", "--eval-batches", "1",
                           "--eval-batch-size", "8", "--logdir", str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert any(STATUS.match(line) for line in lines), proc.stderr
    assert any(line.startswith("[backprop seed 0] step 6/6  eval val accuracy")
               and line.endswith("(1 batch of 8 of 32)") for line in lines), proc.stderr


# ---- issue 42: every phase speaks, every interruption says what it kept ----------------------------------------

class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_long_evaluation_speaks_every_progress_seconds_and_a_short_one_says_only_its_result():
    clock, out = FakeClock(), io.StringIO()
    progress = Progress("run seed 0", 100, initial=100, every=10.0, stream=out, clock=clock)
    for batches in (40, 5):
        with progress.evaluating("test", "best model, step 100") as on_batch:
            for done in range(1, batches + 1):
                clock.now += 1.0  # a batch a second
                on_batch(done, batches)
    assert out.getvalue().splitlines() == [
        f"[run seed 0] eval test (best model, step 100): batch {b}/40  elapsed 0:00:{b}  left 0:00:{40 - b}"
        for b in (10, 20, 30)]


def test_on_a_terminal_an_evaluation_gets_its_own_bar_and_a_timing_round_no_nan_loss():
    clock, out = FakeClock(), Terminal()
    progress = Progress("run seed 0", 20, every=1.0, stream=out, clock=clock, unit="round")
    progress.update(3)  # a timing round: nothing trained, no loss
    with progress.evaluating("val", "last model") as on_batch:
        on_batch(1, 2)
        on_batch(2, 2)
    progress.close()
    assert "run seed 0 eval val (last model):" in out.getvalue() and "/2 [" in out.getvalue()  # its own bar
    assert "nan" not in out.getvalue() and "[run seed 0]" not in out.getvalue()


@pytest.mark.parametrize("signal", [KeyboardInterrupt, trainers.core.errors.Terminated])
def test_an_interrupt_in_the_end_of_run_evaluation_names_the_step_and_checkpoint_and_resume_finishes(
        task, tmp_path, signal, monkeypatch):
    trainer = make_trainer(task, logdir=tmp_path, experiment="e", progress=False)
    real = trainer.evaluate

    def interrupted(split="val", rows=None, on_batch=None):
        if split == "test":
            raise signal()
        return real(split, rows, on_batch)

    monkeypatch.setattr(trainer, "evaluate", interrupted)
    with pytest.raises(trainers.core.errors.RunInterrupted) as stopped:
        trainer.fit(steps=4)
    run = tmp_path / "e" / "backprop" / "seed0"
    what = "terminated (SIGTERM)" if signal is not KeyboardInterrupt else "interrupted"
    assert str(stopped.value) == (f"{what} at step 4, in the end-of-run evaluation, the last checkpoint (step 4) is "
                                  f"kept at {run / 'checkpoint.pt'}; fit(resume=True) evaluates it again and writes "
                                  f"the results")
    assert isinstance(stopped.value, trainers.core.errors.RunTerminated) == (signal is not KeyboardInterrupt)
    assert not (run / "result.json").exists()
    report = make_trainer(task, logdir=tmp_path, experiment="e", progress=False).fit(steps=4, resume=True)
    assert report["steps"] == 4 and report["test"] is not None and (run / "result.json").exists()


def test_an_interrupt_before_training_or_while_a_comparison_writes_its_summary_says_what_was_kept(
        tmp_path, capsys, monkeypatch):
    from gradengines.trainers.cli import compare_main, train
    from gradengines.trainers.experiments import compare

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(train, "build_from_args", interrupt)
        assert train_main([*TEACHER, "--steps", "2", "--logdir", str(tmp_path)]) == 130
    assert capsys.readouterr().err == ("error: interrupted while building the task and the model, before training: "
                                       "nothing was trained or written\n")
    flags = [*TEACHER, "--trainers", "backprop", "--steps", "2", "--seeds", "0", "--timing-rounds", "5",
             "--progress", "false", "--logdir", str(tmp_path), "--experiment", "c"]
    with monkeypatch.context() as patch:
        patch.setattr(compare, "write_summary", interrupt)
        assert compare_main(flags) == 130
    assert capsys.readouterr().err == (f"error: interrupted while writing the summary and the figure, after every "
                                       f"run finished (each kept in {tmp_path / 'c'}); --resume continues the "
                                       f"comparison\n")
    monkeypatch.setattr(compare, "plot_comparison", lambda *args, **kwargs: None)
    assert compare_main([*flags, "--resume"]) == 0 and (tmp_path / "c" / "summary.md").exists()


def test_an_interrupt_between_a_comparisons_runs_counts_the_runs_kept_from_their_files(tmp_path, capsys, monkeypatch):
    """Ctrl-C after two of four runs finished (outside any run's own loop) names those two as kept, counted from their
    result.json, never "no run was trained"; the resume trains the other two only."""
    from gradengines.trainers.cli import compare_main
    from gradengines.trainers.experiments import compare

    real, calls = compare._run_or_record, []

    def interrupt_third(*args, **kwargs):
        calls.append(args[1:3])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    flags = [*TEACHER, "--trainers", "backprop,fa", "--steps", "2", "--seeds", "0,1", "--timing-rounds", "5",
             "--progress", "false", "--logdir", str(tmp_path), "--experiment", "c"]
    monkeypatch.setattr(compare, "_run_or_record", interrupt_third)
    assert compare_main(flags) == 130
    assert capsys.readouterr().err == (f"error: interrupted between the comparison's runs: 2 of 4 runs finished and "
                                       f"kept in {tmp_path / 'c'} (backprop seed 0, backprop seed 1); the step timing "
                                       f"kept in comparison.json; --resume continues the comparison\n")
    monkeypatch.setattr(compare, "_run_or_record", real)
    monkeypatch.setattr(compare, "plot_comparison", lambda *args, **kwargs: None)
    assert compare_main([*flags, "--resume"]) == 0
    assert sorted(p.parent.name + p.name for p in (tmp_path / "c").glob("*/seed*") if (p / "result.json").exists()) \
        == ["backpropseed0", "backpropseed1", "faseed0", "faseed1"]
