"""Long work speaks and loses little (issue 31, item 3): a comparison says what it will do and shows its timing
rounds; a checkpoint every ``checkpoint_seconds``; a resume says where it continues; an interrupt in any phase of
a comparison leaves it resumable with the same budget, and re-summarising keeps the first start and adds up time."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import FakeClock, TimedBackprop

from gradengines import models, tasks, trainers
from gradengines.trainers.cli import compare_main
from gradengines.trainers.core.errors import RunInterrupted

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--task", "digits", "--model", "mlp", "--depth", "2", "--width", "8", "--experiment", "exp",
         "--trainers", "backprop,fa", "--seeds", "0", "--steps", "4", "--timing-rounds", "5"]


@pytest.fixture(scope="module")
def task():
    return tasks.build("teacher", in_features=8, num_classes=4, n_train=128, n_val=32, n_test=32, hidden=8)


def one_second_steps(task, logdir, clock, **options):
    torch.manual_seed(0)
    model = models.build("mlp", in_features=8, out_features=4, depth=2, width=8)
    return trainers.Trainer(model, TimedBackprop(clock), task, clock=clock, logdir=logdir, batch_size=32,
                            eval_every=1000, progress=False, **options)


def stop_at(trainer, step):
    """The trainer's step raises KeyboardInterrupt (Ctrl-C) when it reaches ``step``."""
    real = trainer.train_step

    def train_step(x, y):
        if trainer.step == step:
            raise KeyboardInterrupt
        return real(x, y)
    trainer.train_step = train_step


def test_a_checkpoint_every_checkpoint_seconds_and_the_resume_says_where(task, tmp_path, capsys):
    """1 s per step, no evaluation before step 1000: checkpoints at 3, 6 and 9 s; Ctrl-C at step 8 keeps step 6,
    and the resume says it continues from there."""
    trainer = one_second_steps(task, tmp_path, FakeClock(), checkpoint_seconds=3.0)
    stop_at(trainer, 8)
    with pytest.raises(RunInterrupted, match=r"interrupted at step 8, the last checkpoint \(step 6\) is kept"):
        trainer.fit(steps=12)
    assert torch.load(trainer.run_dir / "checkpoint.pt", weights_only=True)["step"] == 6
    assert torch.load(trainer.run_dir / "checkpoint.prev.pt", weights_only=True)["step"] == 3
    capsys.readouterr()
    resumed = one_second_steps(task, tmp_path, FakeClock(), checkpoint_seconds=3.0)
    assert resumed.fit(steps=12, resume=True)["steps"] == 12
    assert (f"note: backprop seed 0: resuming from step 6 of 12 in {resumed.run_dir}"
            in capsys.readouterr().err.splitlines())


def test_without_time_checkpoints_an_early_interrupt_says_a_rerun_starts_afresh(task, tmp_path):
    """checkpoint_seconds none, no evaluation yet: nothing to resume, and the line says so rather than promise
    that --resume continues."""
    trainer = one_second_steps(task, tmp_path, FakeClock(), checkpoint_seconds=None)
    stop_at(trainer, 5)
    with pytest.raises(RunInterrupted) as stopped:
        trainer.fit(steps=12)
    assert str(stopped.value) == ("interrupted at step 5, before the run's first checkpoint (written at evaluations): "
                                  "nothing to continue, a rerun starts it afresh")
    assert not (trainer.run_dir / "checkpoint.pt").exists()


def test_a_comparison_says_its_plan_and_shows_its_timing_rounds(tmp_path, capsys, monkeypatch):
    """The plan, then the timing's rounds at the runs' own thread count and again at the other one (the
    equal-compute margin's; here 2), all before the first run."""
    monkeypatch.setattr("gradengines.trainers.experiments.compare.other_threads", lambda device: 2)
    assert compare_main([*SMALL, "--progress-seconds", "1e-9", "--logdir", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("[compare] exp: 2 trainers (backprop, fa) x seeds 0: timing each trainer's step round-robin "
                      "(5 rounds, then again at 2 threads), then 2 runs, then the summary")
    first_run = next(i for i, line in enumerate(err) if line.startswith("[backprop seed 0]"))
    for label in ("timing 2 trainers' steps round-robin", "timing them again at 2 threads (the equal-compute margin)"):
        rounds = [line for line in err if line.startswith(f"[{label}] round ")]
        assert rounds[0].startswith(f"[{label}] round 0/5 (0.0%)")
        assert rounds[-1].startswith(f"[{label}] round 5/5 (100.0%)")
        assert rounds[-1].endswith("done") and "loss" not in rounds[-1]
        assert err.index(rounds[-1]) < first_run
    timing = json.loads((tmp_path / "exp" / "comparison.json").read_text())["timing"]["trainers"]
    assert timing["fa"]["at_other_threads"]["threads"] == 2
    summary = (tmp_path / "exp" / "summary.md").read_text()
    assert "ratio at 2 threads (the margin's)" in summary
    assert "batches, again at 2 threads for the equal-compute margin" in summary


def test_an_interrupted_comparison_resumes_with_its_timing_and_keeps_its_start(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the first run: comparison.json already holds the timing, so the resume does not time again;
    the finished comparison's header keeps the first start and counts both sessions."""
    flags = [*SMALL, "--budget", "time", "--progress", "false", "--logdir", str(tmp_path)]

    def interrupt(self, **_):
        raise KeyboardInterrupt
    with monkeypatch.context() as patch:
        patch.setattr(trainers.Trainer, "fit", interrupt)
        assert compare_main(flags) == 130
    first = json.loads((tmp_path / "exp" / "comparison.json").read_text())
    assert first["sessions"] == 1 and set(first["timing"]["trainers"]) == {"backprop", "fa"}

    def fail(*args, **kwargs):
        raise AssertionError("a resume must not time again")
    monkeypatch.setattr("gradengines.trainers.experiments.compare.time_steps", fail)
    assert compare_main([*flags, "--resume"]) == 0
    again = json.loads((tmp_path / "exp" / "comparison.json").read_text())
    assert again["timing"] == first["timing"] and again["lengths"] == first["lengths"]
    assert again["started"] == first["started"] and again["sessions"] == 2 and again["wall_s"] > first["wall_s"]
    assert compare_main([*flags, "--resume"]) == 0  # nothing left to run: the summary is written again
    header = (tmp_path / "exp" / "summary.md").read_text().split("## Verdict")[0]
    assert f"- started {first['started']}, " in header and "over 3 sessions (resumed)" in header


def test_sigterm_in_the_timing_phase_leaves_a_comparison_that_resumes(tmp_path):
    """A real SIGTERM while the steps are timed (synchronized on the first round's line, not on time): exit 143,
    one line; the same command, as that line says (here, in this process), then times and runs the whole comparison;
    ``--resume`` is refused there, since nothing had begun."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "scripts" / "compare.py"), *SMALL, "--logdir", str(tmp_path),
               "--progress-seconds", "1e-9"]
    proc = subprocess.Popen([*command[:-4], "--timing-rounds", "100000", *command[-4:]], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if " round 1/" in line:
            break
    proc.send_signal(signal.SIGTERM)
    err = "".join(seen) + proc.stderr.read()
    assert proc.wait(timeout=60) == 143, err
    assert err.splitlines()[-1] == ("error: terminated (SIGTERM) while timing the trainers' steps, before any run: "
                                    "nothing was trained; the same command starts the comparison again"), err
    assert compare_main([*command[2:], "--resume", "--progress", "false"]) == 2
    assert compare_main([*command[2:], "--progress", "false"]) == 0  # only the stopped one needs a process
    assert (tmp_path / "exp" / "summary.md").exists()
