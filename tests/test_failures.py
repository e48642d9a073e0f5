"""Every failure is one clean line: bad values, resumes that do not match, damaged or unsafe
checkpoints, full disks, a second writer. Exit 2 before anything started, 1 during training;
nothing written where nothing should be, nothing torn, nothing run from a checkpoint."""

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gradengines import trainers
from gradengines.trainers.cli import base_parser, train_main
from gradengines.trainers.core.errors import ConfigError, DataError, RunBusyError
from gradengines.trainers.run import checkpoint
from gradengines.trainers.run import trainer as trainer_module
from gradengines.trainers.run.config import TrainConfig
from gradengines.trainers.run.logger import read_metrics
from gradengines.trainers.run.rundir import RunDirectory

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TRAIN = [sys.executable, str(ROOT / "scripts" / "train.py")]
TEACHER = ["--task", "teacher", "--task-option", "n_train=256"]
SMALL = ["--depth", "2", "--width", "8", "--batch-size", "32", "--progress", "false", "--experiment", "e"]
TINY = [*TEACHER, *SMALL]


def run(capsys, *flags) -> tuple[int, list[str]]:
    """``train.py`` in this process: (exit code, stderr lines)."""
    try:
        code = train_main([str(f) for f in flags])
    except SystemExit as ex:  # argparse's usage errors exit from the parser
        code = ex.code
    return code, capsys.readouterr().err.splitlines()


def one_error(code, err, expected_code=2) -> str:
    assert code == expected_code, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def run_dir(logdir) -> Path:
    return Path(logdir) / "e" / "backprop" / "seed0"


def snapshot(directory: Path) -> dict:
    """Every file below ``directory`` with its bytes (what a refused command must leave as it was),
    but the lock file, which holds the pid of the last process that took the lock."""
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ------------------------------------------------------------------ bad values at the boundary
BAD_VALUES = {
    ("--lr", "nan"): "error: --lr must be a finite number, got nan",
    ("--lr", "inf"): "error: --lr must be a finite number, got inf",
    ("--lr", "1e400"): "error: --lr must be a finite number, got inf",
    ("--clip-grad-norm", "nan"): "error: --clip-grad-norm must be a finite number",
    ("--pepita-feedback-scale", "nan"): "error: --pepita-feedback-scale must be a finite number",
    ("--width", "abc"): "--width must be a positive integer or a comma list",
    ("--width", "1e9"): "--width must be a positive integer or a comma list",
    ("--width", "16,,8"): "--width must be a positive integer or a comma list",
    ("--seed", "-1"): "--seed must be in [0, 2**32)",
    ("--seed", str(2**32)): "--seed must be in [0, 2**32)",
    ("--split-seed", "-1"): "--split-seed must be in [0, 2**32)",
    ("--device", "tpu9"): "'tpu9' is not a torch device",
    ("--depth", "100000000"): "--depth 100000000 is above the 10000 layers",
    ("--width", "2000000000"): "this run needs at least",
    ("--in-features", str(2**64)): "--in-features must be >= 1 and <= 2**31 - 1",
    ("--momentum", "1.5"): "--momentum must be in [0, 1)",
    ("--epoch", "1"): "unrecognized arguments: --epoch 1 (see",  # no abbreviations
    ("--depth", "abc"): "argument --depth: invalid int value: 'abc' (see",
    ("--run-name", "../../x"): "--run-name must be a relative path inside the log directory",
    ("--experiment", "/tmp/elsewhere"): "--experiment must be a relative path inside the log directory",
    # issue 42: past what the OS can take (it was a 21-line traceback), and flags that cannot apply (dropped silently)
    ("--threads", "100000000000000000000"): "error: --threads must be at most ",
    ("--threads", str(2**31)): "error: --threads must be at most ",
    ("--nesterov", "true"): "error: --nesterov applies only with --optimizer sgd, and this run's optimizer is adam",
    ("--warmup-steps", "10"): "error: --warmup-steps applies only with --schedule cosine",
    ("--gamma", "0.5"): "error: --gamma applies only with --schedule step",
}
if not torch.cuda.is_available():
    BAD_VALUES[("--device", "cuda")] = "--device cuda: CUDA is not available"


@pytest.mark.parametrize("flag, value", list(BAD_VALUES), ids=[" ".join(k) for k in BAD_VALUES])
def test_bad_value_is_one_line_exit_2_and_writes_nothing(flag, value, tmp_path, capsys):
    code, err = run(capsys, *TINY, "--steps", "1", "--logdir", tmp_path / "runs", flag, value)
    assert BAD_VALUES[(flag, value)] in one_error(code, err)
    assert not (tmp_path / "runs").exists()


def test_nesterov_without_momentum_is_refused_from_python_too():
    with pytest.raises(ConfigError, match="nesterov is Nesterov momentum: it needs momentum > 0, got 0"):
        TrainConfig(optimizer="sgd", momentum=0.0, nesterov=True)


def test_a_flag_a_recipe_does_not_read_is_said_once_per_trainer(tmp_path, capsys):
    """compare.py's recipes choose each trainer's optimizer: --momentum applies to those on SGD, and the others
    say once that they do not read it (a flag is never dropped without a word)."""
    from gradengines.trainers.cli import compare_main

    assert compare_main([*TEACHER, "--depth", "2", "--width", "8", "--trainers", "backprop,pepita", "--momentum",
                         "0.5", "--steps", "1", "--seeds", "0", "--timing-rounds", "5", "--progress", "false",
                         "--logdir", str(tmp_path)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "--momentum" in line]
    assert notes == ["note: --momentum is unused by 'backprop': its recipe's optimizer is adam (--momentum applies "
                     "only with --optimizer sgd)"]


class Reached(Exception):
    """Raised in place of training: the command was accepted."""


HOSTILE = ["nan", "inf", "-inf", "1e400", "-1", "0", "1e30", str(2**64), "abc", ""]
ALWAYS_INVALID = {"nan", "inf", "-inf", "1e400", "-1", "abc", ""}
SIZES = {"--depth", "--width", "--hidden", "--vocab-size", "--input-dim", "--in-features", "--out-features"}


def numeric_flags() -> list[str]:
    """Every flag of train.py that takes a number (and --width, a list of numbers)."""
    flags = ["--width"]
    for action in base_parser("")._actions:
        if not action.option_strings or action.type is None or action.choices:
            continue
        try:
            numeric = isinstance(action.type("1"), (int, float)) and not isinstance(action.type("1"), bool)
        except Exception:
            continue
        if numeric:
            flags.append(action.option_strings[0])
    return flags


def test_every_numeric_option_refuses_hostile_values_in_one_line(tmp_path, monkeypatch, capsys):
    """Fuzz: nan, inf, -1, 0, huge, non-numbers for every numeric flag. Each value is either refused
    with exit 2 and one line, or accepted (training would start); never a traceback. The values that
    are invalid for every option, and huge model sizes, must be refused."""
    def reached(self, **_):
        raise Reached
    monkeypatch.setattr(trainer_module.Trainer, "fit", reached)
    flags = numeric_flags()
    assert {"--lr", "--seed", "--depth", "--dist-timeout", "--pepita-feedback-scale", "--highway-k"} <= set(flags)
    logdir = tmp_path / "runs"
    accepted = {}
    for flag in flags:
        for value in HOSTILE:
            try:
                code, err = run(capsys, *TINY, "--steps", "1", "--logdir", logdir, flag, value)
            except Reached:
                accepted.setdefault(flag, []).append(value)
                capsys.readouterr()
                continue
            assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (flag, value, code, err)
            assert not logdir.exists()
    wrongly = {f: [v for v in vs if v in ALWAYS_INVALID or (f in SIZES and v in ("1e30", str(2**64)))]
               for f, vs in accepted.items()}
    assert not {f: v for f, v in wrongly.items() if v}, wrongly


def test_memory_estimate_counts_the_model_without_allocating_it_and_refuses_what_cannot_fit(monkeypatch):
    from gradengines import models
    from gradengines.trainers.run import memory

    def build():
        return models.build("mlp", in_features=64, out_features=10, depth=3, width=[300, 200])
    sample = torch.zeros(1, 64)
    estimate = memory.estimate_bytes(build, sample, batch_size=32, optimizer="adam", momentum=0.9,
                                     dtype=torch.float32)
    parameters = sum(p.numel() for p in build().parameters())
    assert estimate["parameters"] == parameters == 64 * 300 + 300 + 300 * 200 + 200 + 200 * 10 + 10
    # the layers' outputs (and activations) of one sample: 300 + 300 + 200 + 200 + 10 at least
    assert estimate["activations_per_sample"] >= 1010
    assert estimate["bytes"] == 4 * (parameters * (3 + 2) + 2 * 32 * estimate["activations_per_sample"])
    sgd = memory.estimate_bytes(build, sample, batch_size=32, optimizer="sgd", momentum=0.0, dtype=torch.float64)
    assert sgd["bytes"] == 8 * (parameters * 3 + 2 * 32 * sgd["activations_per_sample"])
    monkeypatch.setattr(memory, "available_bytes", lambda device: estimate["bytes"] - 1)
    with pytest.raises(ConfigError, match=f"needs at least 0.0 GiB \\({parameters:,} parameters"):
        memory.check_fits(build, sample, batch_size=32, optimizer="adam", momentum=0.9, dtype=torch.float32,
                          device=torch.device("cpu"))
    monkeypatch.setattr(memory, "available_bytes", lambda device: estimate["bytes"])
    memory.check_fits(build, sample, batch_size=32, optimizer="adam", momentum=0.9, dtype=torch.float32,
                      device=torch.device("cpu"))


REAL_PROCESS = {
    "not finite": (["--lr", "nan"], "error: --lr must be a finite number, got nan"),
    "no such device": (["--device", "tpu9"], "error: --device 'tpu9' is not a torch device (cpu, cuda, cuda:N, mps)"),
    "usage": (["--epoch", "1"], "error: unrecognized arguments: --epoch 1 (see train.py --help)"),
    "resume onto another optimizer": (["--optimizer", "sgd", "--resume"], "error: cannot resume {run} with "
                                      "--optimizer sgd: it was trained with adam, and a resumed run keeps its "
                                      "optimizer, seed, dtype, precision, schedule; start a new run with another "
                                      "--run-name, or --overwrite"),
}


@pytest.mark.parametrize("case", list(REAL_PROCESS))
def test_failures_through_a_real_process(case, tmp_path):
    flags, expected = REAL_PROCESS[case]
    logdir = tmp_path / "runs"
    if "--resume" in flags:  # the run to resume, made in this process: the refusal is the real process's
        assert train_main([*TINY, "--steps", "2", "--logdir", str(logdir)]) == 0
    before = snapshot(tmp_path)
    proc = subprocess.run([*TRAIN, *TINY, "--steps", "2", "--logdir", str(logdir), *flags], capture_output=True,
                          text=True, env=ENV)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [expected.format(run=run_dir(logdir))]
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------ resume checks
@pytest.fixture
def finished(tmp_path, capsys):
    """A finished 8-step run (checkpoint every 2 steps) in ``tmp_path``."""
    code, err = run(capsys, *TINY, "--steps", "8", "--checkpoint-every", "2", "--logdir", tmp_path)
    assert code == 0, err
    return tmp_path


RESUMED_AS_ANOTHER_RUN = {
    "model": (["--width", "16"], "cannot resume {run}: its checkpoint is of another model (width 8 there, 16 here)"),
    "task size": (["--task", "teacher", "--task-option", "n_train=128"], "its checkpoint is of another task (train"),
    "task": (["--task", "digits"], "its checkpoint is of another task (input_shape [32] there, [64] here, "
                                   "name 'teacher' there, 'digits' here"),
    "trainer": (["--trainer", "pepita", "--run-name", "backprop"],
                "its checkpoint is of another trainer ('backprop' there, 'pepita' here)"),
    "optimizer": (["--optimizer", "sgd"], "cannot resume {run} with --optimizer sgd: it was trained with adam, and a "
                                          "resumed run keeps its optimizer, seed, dtype, precision, schedule; start a "
                                          "new run with another --run-name, or --overwrite"),
    "dtype": (["--dtype", "float64"], "with --dtype float64: it was trained with float32"),
}


@pytest.mark.parametrize("case", list(RESUMED_AS_ANOTHER_RUN))
def test_resume_onto_another_run_is_refused_and_changes_nothing(case, finished, capsys):
    flags, expected = RESUMED_AS_ANOTHER_RUN[case]
    before = snapshot(finished)
    base = SMALL if "--task" in flags else TINY
    code, err = run(capsys, *base, "--steps", "12", "--logdir", finished, "--resume", *flags)
    assert expected.format(run=run_dir(finished)) in one_error(code, err)
    assert snapshot(finished) == before  # not even a new events file


def test_a_new_learning_rate_on_resume_needs_the_flag_and_is_applied_and_recorded(tmp_path, capsys):
    logdir = tmp_path / "runs"
    assert run(capsys, *TINY, "--steps", "4", "--lr", "0.01", "--logdir", logdir, "--log-every", "1")[0] == 0
    # resumed without --lr: the default (1e-3) differs from the run's 0.01 -> refused, nothing changes
    (run_dir(logdir) / "result.json").unlink()  # as if it had been killed after its last checkpoint
    before = snapshot(logdir)
    code, err = run(capsys, *TINY, "--steps", "8", "--logdir", logdir, "--resume", "--log-every", "1")
    assert "--lr is 0.001 here but 0.01 in its checkpoint (step 4); repeat the run's value, or give --lr " \
           "explicitly with --resume to change it from step 4" in one_error(code, err)
    assert snapshot(logdir) == before
    # given explicitly: applied from step 4 on, said, recorded
    code, err = run(capsys, *TINY, "--steps", "8", "--lr", "0.5", "--logdir", logdir, "--resume", "--log-every", "1")
    assert code == 0 and err == [
        "note: resuming at step 4 with lr 0.5 instead of 0.01 (recorded in result.json)",
        f"note: backprop seed 0: resuming from step 4 of 8 in {run_dir(logdir)}"]
    lrs = {r["step"]: r["train/lr"] for r in read_metrics(run_dir(logdir)) if "train/lr" in r}
    assert lrs == {1: 0.01, 2: 0.01, 3: 0.01, 4: 0.01, 5: 0.5, 6: 0.5, 7: 0.5, 8: 0.5}
    result = json.loads((run_dir(logdir) / "result.json").read_text())
    assert result["config"]["lr"] == 0.5
    assert result["resume_changes"] == [{"step": 4, "option": "lr", "from": 0.01, "to": 0.5}]


def test_python_api_resume_changes_are_explicit_and_advice_is_in_python_terms(tmp_path):
    task = trainers_task()
    def make(**kw):
        from gradengines import models
        torch.manual_seed(0)
        model = models.build("mlp", in_features=task.in_features, out_features=task.num_outputs, depth=2, width=8)
        return trainers.Trainer(model, trainers.build_engine("backprop"), task, logdir=tmp_path, batch_size=32,
                                progress=False, **kw)
    make(lr=0.01, checkpoint_every=2).fit(steps=4)
    (tmp_path / "default" / "backprop" / "seed0" / "result.json").unlink()
    with pytest.raises(ConfigError, match=r"pass fit\(resume=True, allow_changes=\['lr'\]\) to change it"):
        make(lr=0.1, checkpoint_every=2).fit(steps=6, resume=True)
    resumed = make(lr=0.1, checkpoint_every=2)
    resumed.fit(steps=6, resume=True, allow_changes=["lr"])
    assert resumed.optimizer.param_groups[0]["lr"] == 0.1
    assert resumed.changes == [{"step": 4, "option": "lr", "from": 0.01, "to": 0.1}]


def trainers_task():
    from gradengines import tasks
    return tasks.build("teacher", n_train=256)


def test_a_run_killed_before_its_first_checkpoint_restarts_on_resume(finished, capsys):
    rdir = run_dir(finished)
    for name in ("checkpoint.pt", "checkpoint.prev.pt", "result.json"):
        (rdir / name).unlink()
    code, err = run_cli_ok(capsys, finished, "--steps", "8", "--resume")
    assert err == [f"note: {rdir} has no checkpoint yet (the run stopped before its first one); starting it afresh"]
    assert max(r["step"] for r in read_metrics(rdir)) == 8 and (rdir / "result.json").exists()


def run_cli_ok(capsys, logdir, *flags):
    code, err = run(capsys, *TINY, "--checkpoint-every", "2", "--logdir", logdir, *flags)
    assert code == 0, err
    return code, err


def test_resuming_a_finished_run_does_nothing_and_continuing_it_tests_once(finished, capsys):
    rdir = run_dir(finished)
    before = snapshot(finished)
    _, err = run_cli_ok(capsys, finished, "--steps", "8", "--resume")
    assert err == [f"note: {rdir} finished at step 8; nothing to do (its results are unchanged)"]
    assert snapshot(finished) == before
    run_cli_ok(capsys, finished, "--steps", "12", "--resume")  # a longer run: continues, tested once, at its end
    tests = [r["step"] for r in read_metrics(rdir) if any(k.startswith("test/") for k in r)]
    assert tests == [12] and json.loads((rdir / "result.json").read_text())["steps"] == 12


# ------------------------------------------------------------------- checkpoint files
def test_two_checkpoints_are_kept_and_a_damaged_newest_falls_back_to_the_previous(finished, capsys):
    rdir = run_dir(finished)
    newest, previous = (checkpoint.load_checkpoint(rdir / n)["step"] for n in ("checkpoint.pt", "checkpoint.prev.pt"))
    assert (newest, previous) == (8, 6)
    (rdir / "result.json").unlink()
    # random bytes after a zero byte: one in 256 random files began with pickle's opcode 0x80 and was refused as a
    # raw pickle (rightly) instead of read as damaged, a flaky test
    for damage in (lambda b: b[: len(b) // 2], lambda b: b"\x00" + os.urandom(len(b) - 1), lambda b: b""):
        ckpt = rdir / "checkpoint.pt"
        good = ckpt.read_bytes()
        ckpt.write_bytes(damage(good))
        _, err = run_cli_ok(capsys, finished, "--steps", "8", "--resume")
        assert len(err) == 2 and err[0].startswith(f"note: checkpoint {ckpt} is damaged (") and \
            err[0].endswith("; resuming from the previous checkpoint checkpoint.prev.pt (step 6)"), err
        assert err[1] == f"note: backprop seed 0: resuming from step 6 of 8 in {ckpt.parent}"
        assert checkpoint.load_checkpoint(ckpt)["step"] == 8  # trained again from step 6 to 8, saved
        (rdir / "result.json").unlink()
    # both damaged: one line, exit 2, nothing changed
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (rdir / name).write_bytes(b"garbage")
    before = snapshot(finished)
    code, err = run(capsys, *TINY, "--steps", "8", "--logdir", finished, "--resume")
    assert f"no readable checkpoint in {rdir}" in one_error(code, err) and "--overwrite starts the run afresh" in err[0]
    assert snapshot(finished) == before


def test_a_torn_last_metrics_line_is_dropped_and_a_damaged_one_is_one_line(finished, capsys):
    rdir = run_dir(finished)
    (rdir / "result.json").unlink()
    with open(rdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "train/lo')  # the process died mid-line
    assert max(r["step"] for r in read_metrics(rdir)) == 8
    run_cli_ok(capsys, finished, "--steps", "10", "--resume")
    assert [r["step"] for r in read_metrics(rdir)][-1] == 10
    lines = (rdir / "metrics.jsonl").read_text().splitlines()
    (rdir / "metrics.jsonl").write_text("\n".join([lines[0], "{garbage", *lines[1:]]) + "\n")
    with pytest.raises(DataError, match=r"metrics.jsonl line 2 is damaged"):
        read_metrics(rdir)


def test_stale_temporaries_are_removed_and_every_file_has_one_mode(finished, capsys):
    rdir = run_dir(finished)
    (rdir / "result.json").unlink()
    stale = rdir / ".checkpoint.pt.abc123.tmp"
    stale.write_bytes(b"x" * 1000)  # a writer killed mid-write
    run_cli_ok(capsys, finished, "--steps", "10", "--resume")
    assert not stale.exists()
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in rdir.iterdir() if p.is_file()}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes
    assert {"checkpoint.pt", "checkpoint.prev.pt", "result.json", "metrics.jsonl", ".lock"} <= set(modes)


def test_a_checkpoint_crafted_to_run_code_is_refused_without_running_it(finished, tmp_path):
    """A checkpoint whose unpickling would call os.system: --resume refuses it in one line (a real
    process), the command never runs, and the damaged-file fallback does not skip it."""
    rdir = run_dir(finished)
    (rdir / "result.json").unlink()
    marker = tmp_path / "pwned"
    crafted = checkpoint.load_checkpoint(rdir / "checkpoint.pt")
    crafted["engine"] = Payload(f"touch {marker}")
    torch.save(crafted, rdir / "checkpoint.pt")
    with pytest.raises(trainers.core.errors.UnsafeCheckpointError):
        checkpoint.load_checkpoint(rdir / "checkpoint.pt")
    before = snapshot(finished)
    proc = subprocess.run([*TRAIN, *TINY, "--steps", "8", "--logdir", str(finished), "--resume"],
                          capture_output=True, text=True, env=ENV)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"error: checkpoint {rdir / 'checkpoint.pt'} holds a pickled object "
                                        f"(posix.system), not only tensors and plain values; refused without "
                                        f"loading it (loading it could run code)"]
    assert not marker.exists()
    assert snapshot(finished) == before


@pytest.mark.parametrize("plant", ["a numpy object array", "a raw pickle"])
def test_what_the_safe_loader_refuses_is_unsafe_like_a_raw_pickle_and_never_skipped(finished, capsys, plant):
    """A torch zip checkpoint that weights-only loading refuses for the types it holds (an object array: its
    objects are pickles) is refused as unsafe, exit 2, as a raw pickle is: not called damaged and skipped for
    the previous checkpoint."""
    import pickle

    import numpy

    rdir = run_dir(finished)
    (rdir / "result.json").unlink()
    ckpt = rdir / "checkpoint.pt"
    if plant == "a raw pickle":
        ckpt.write_bytes(pickle.dumps({"step": 1}))
    else:
        torch.save({"x": numpy.array([1, "a"], dtype=object)}, ckpt)
    with pytest.raises(trainers.core.errors.UnsafeCheckpointError):
        checkpoint.load_checkpoint(ckpt)
    before = snapshot(finished)
    code, err = run(capsys, *TINY, "--steps", "10", "--checkpoint-every", "2", "--logdir", finished, "--resume")
    line = one_error(code, err)
    assert line.startswith(f"error: checkpoint {ckpt} ") and "damaged" not in line, line
    assert line.endswith("; refused without loading it (loading it could run code)"), line
    if plant == "a numpy object array":
        assert "holds a pickled object (numpy.dtypes.ObjectDType), not only tensors and plain values" in line
    assert snapshot(finished) == before  # the previous checkpoint was not used: nothing trained


def test_the_newest_good_checkpoint_is_the_previous_after_a_fallback_until_the_next_save(finished, capsys):
    rdir = run_dir(finished)
    (rdir / "checkpoint.pt").write_bytes(b"garbage")
    files = RunDirectory(rdir)
    assert files.load()["step"] == 6 and files.newest == rdir / "checkpoint.prev.pt"
    capsys.readouterr()
    files.save(checkpoint.load_checkpoint(rdir / "checkpoint.prev.pt"))
    assert files.newest == rdir / "checkpoint.pt"


def test_a_checkpoint_that_is_a_directory_is_refused_before_training(finished, capsys):
    """checkpoint.pt made a directory: no checkpoint can be written there (a rename cannot replace a directory),
    so the run is refused in one line, exit 2, before it trains (it fell back to checkpoint.prev.pt, trained,
    then failed saying the last checkpoint was kept at checkpoint.pt, the directory); with --overwrite, and a
    plain rerun, alike. Once it is moved away, the resume continues from the previous checkpoint."""
    rdir = run_dir(finished)
    (rdir / "result.json").unlink()
    (rdir / "checkpoint.pt").unlink()
    (rdir / "checkpoint.pt").mkdir()
    (rdir / "checkpoint.pt" / "kept.txt").write_text("the user's")
    before = snapshot(finished)
    for more in (["--resume"], ["--overwrite"], []):
        code, err = run(capsys, *TINY, "--steps", "10", "--checkpoint-every", "2", "--logdir", finished, *more)
        assert one_error(code, err) == (f"error: {rdir / 'checkpoint.pt'} is a directory, not a file: the run cannot "
                                        f"write its checkpoint.pt there; move or remove that directory, then run "
                                        f"again"), more
        assert snapshot(finished) == before
    (rdir / "checkpoint.pt").rename(tmp := rdir.parent / "moved")
    run_cli_ok(capsys, finished, "--steps", "10", "--resume")
    assert checkpoint.load_checkpoint(rdir / "checkpoint.pt")["step"] == 10 and (tmp / "kept.txt").exists()


class Payload:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


# ------------------------------------------------------------------------ OS failures
def test_a_logdir_that_is_a_file_unwritable_or_read_only_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    code, err = run(capsys, *TINY, "--steps", "1", "--logdir", not_a_dir)
    assert one_error(code, err).startswith(f"error: {not_a_dir}") and "Not a directory" in err[0]
    assert not_a_dir.read_text() == "x"

    for code_ in (errno.EACCES, errno.EROFS):
        def refused(self, *args, code_=code_, **kwargs):
            raise OSError(code_, os.strerror(code_), str(self))
        monkeypatch.setattr(Path, "mkdir", refused)  # (tests may run as root, which chmod does not stop)
        code, err = run(capsys, *TINY, "--steps", "1", "--logdir", tmp_path / "ro")
        assert one_error(code, err) == (f"error: {tmp_path / 'ro' / 'e' / 'backprop' / 'seed0'}: "
                                        f"{os.strerror(code_)}; choose another --logdir")
    assert not (tmp_path / "ro").exists()


def test_a_full_disk_before_the_start_is_one_line_naming_the_path_exit_2(tmp_path, capsys, monkeypatch):
    """ENOSPC where the run directory is made, and where the lock takes its pid (a failed write() names no
    file: the message must); nothing trains, and once there is room the same command runs."""
    full = os.strerror(errno.ENOSPC)
    rdir = run_dir(tmp_path / "runs")

    def no_room(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, full, str(self))
    monkeypatch.setattr(Path, "mkdir", no_room)
    code, err = run(capsys, *TINY, "--steps", "1", "--logdir", tmp_path / "runs")
    assert one_error(code, err) == f"error: {rdir}: {full}; free space on that disk, or choose another --logdir"
    monkeypatch.undo()

    real_write, pid = os.write, f"{os.getpid()}\n".encode()

    def write(fd, data):
        if data == pid:  # the lock's pid: the run directory's first bytes
            raise OSError(errno.ENOSPC, full)
        return real_write(fd, data)
    monkeypatch.setattr(os, "write", write)
    code, err = run(capsys, *TINY, "--steps", "1", "--logdir", tmp_path / "runs")
    monkeypatch.undo()
    assert one_error(code, err) == (f"error: {rdir / '.lock'}: {full}; free space on that disk, or choose another "
                                    f"--logdir")
    assert not (tmp_path / "runs").exists()  # exit 2: nothing written, not even the lock or its folders
    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError) as raised:  # from Python: the disk's errno and the path
        RunDirectory(rdir).acquire()
    monkeypatch.undo()
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(rdir / ".lock"))
    assert run(capsys, *TINY, "--steps", "1", "--logdir", tmp_path / "runs")[0] == 0  # the lock was let go


@pytest.mark.parametrize("where", ["checkpoint", "metrics"])
def test_a_full_disk_during_training_is_one_line_exit_1_and_keeps_the_last_checkpoint(where, tmp_path, capsys,
                                                                                        monkeypatch):
    logdir = tmp_path / "runs"
    calls = {"n": 0}
    if where == "checkpoint":  # the 3rd checkpoint write fails as on a full disk
        real = checkpoint.write_atomic

        def write_atomic(path, write, **kw):
            calls["n"] += 1
            if calls["n"] == 3:
                def full(f):
                    f.write(b"partial")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                return real(path, full, **kw)
            return real(path, write, **kw)
        monkeypatch.setattr(checkpoint, "write_atomic", write_atomic)
    else:  # metrics.jsonl cannot be flushed at step 5
        from gradengines.trainers.run import logger

        real_flush = logger.RunLogger.flush

        def flush(self):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.jsonl))
            real_flush(self)
        monkeypatch.setattr(logger.RunLogger, "flush", flush)
    code, err = run(capsys, *TINY, "--steps", "20", "--checkpoint-every", "2", "--logdir", logdir)
    rdir = run_dir(logdir)
    target = rdir / ("checkpoint.pt" if where == "checkpoint" else "metrics.jsonl")
    kept = 4
    assert one_error(code, err, expected_code=1) == (
        f"error: cannot write {target}: No space left on device; training stopped at step 6, the last checkpoint "
        f"(step {kept}) is kept at {rdir / 'checkpoint.pt'}")
    assert checkpoint.load_checkpoint(rdir / "checkpoint.pt")["step"] == kept  # whole, not torn
    assert not [p for p in rdir.iterdir() if p.name.endswith(".tmp")]
    assert not (rdir / "result.json").exists()
    # the disk has room again: --resume continues from the kept checkpoint
    monkeypatch.undo()
    assert run(capsys, *TINY, "--steps", "20", "--checkpoint-every", "2", "--logdir", logdir, "--resume")[0] == 0


# ------------------------------------------------------------------------ one writer
def test_a_second_writer_is_refused_while_the_lock_is_held(tmp_path, capsys):
    holder = RunDirectory(run_dir(tmp_path))
    holder.acquire()
    try:
        code, err = run(capsys, *TINY, "--steps", "2", "--logdir", tmp_path)
        assert one_error(code, err) == (f"error: {run_dir(tmp_path)} is being written by another process "
                                        f"(pid {os.getpid()}); wait for it to finish, or choose another --run-name")
        with pytest.raises(RunBusyError):
            RunDirectory(run_dir(tmp_path)).acquire()
    finally:
        holder.release()
    assert run(capsys, *TINY, "--steps", "2", "--logdir", tmp_path)[0] == 0


# scripts/train.py whose process, once it holds the run directory's lock, keeps it until the file GO exists (an
# hour at most): started together, the other process is sure to find the lock taken, on any machine
HOLDING_TRAIN = """
import os, pathlib, runpy, sys, time
from gradengines.trainers.run import rundir
go, real = pathlib.Path({go!r}), rundir.RunDirectory.acquire
def acquire(self):
    real(self)
    deadline = time.monotonic() + 3600
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
rundir.RunDirectory.acquire = acquire
sys.argv[0] = {train!r}
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("resume", [False, True])
def test_two_processes_started_together_on_one_run_directory(resume, tmp_path):
    """Two real processes at the same moment (twice with --resume onto a killed run): one trains,
    the other is refused in one line naming the holder's pid; metrics.jsonl has every step once.
    Whichever takes the lock holds it until the other has ended, so the two overlap by construction."""
    logdir, go = tmp_path / "runs", tmp_path / "go"
    flags = [*TINY, "--steps", "20", "--log-every", "1", "--checkpoint-every", "5", "--logdir", str(logdir)]
    if resume:  # a run stopped at step 10 (made in this process: only the two racing need their own)
        assert train_main([*flags[:-2], "--steps", "10", "--logdir", str(logdir)]) == 0
        (run_dir(logdir) / "result.json").unlink()
        flags.append("--resume")
    holding = [sys.executable, "-c", HOLDING_TRAIN.format(go=str(go), train=TRAIN[1])]
    procs = [subprocess.Popen([*holding, *flags], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    guard = time.monotonic() + 300  # a hang guard, not a speed claim
    try:
        while all(p.poll() is None for p in procs):  # the refused one ends while the other holds the lock
            assert time.monotonic() < guard, "hang guard: neither process ended in 300 s"
            time.sleep(0.02)
        go.touch()
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2).splitlines()
    assert len(refused) == 1 and "is being written by another process (pid " in refused[0]
    winner = next(p for p, (code, _) in zip(procs, results, strict=True) if code == 0)
    assert f"(pid {winner.pid})" in refused[0]
    steps = [r["step"] for r in read_metrics(run_dir(logdir)) if "train/loss" in r]
    assert steps == list(range(1, 21))


def fail_at_step(monkeypatch, step: int, error: BaseException) -> None:
    """The Trainer's training step raises ``error`` at ``step`` (and runs normally otherwise)."""
    real = trainer_module.Trainer.train_step

    def failing(self, x, y):
        if self.step == step:
            raise error
        return real(self, x, y)
    monkeypatch.setattr(trainer_module.Trainer, "train_step", failing)


def test_ctrl_c_is_one_line_exit_130_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    fail_at_step(monkeypatch, 5, KeyboardInterrupt())
    code, err = run(capsys, *TINY, "--steps", "8", "--checkpoint-every", "2", "--logdir", tmp_path)
    assert one_error(code, err, expected_code=130) == (
        f"error: interrupted at step 5, the last checkpoint (step 4) is kept at {run_dir(tmp_path) / 'checkpoint.pt'}; "
        f"--resume continues the run")
    monkeypatch.undo()
    assert run(capsys, *TINY, "--steps", "8", "--checkpoint-every", "2", "--logdir", tmp_path, "--resume")[0] == 0


def test_overwrite_removes_the_earlier_runs_files(finished, capsys):
    rdir = run_dir(finished)
    assert len(list(rdir.glob("events.out.tfevents.*"))) == 1
    run_cli_ok(capsys, finished, "--steps", "4", "--overwrite")
    assert len(list(rdir.glob("events.out.tfevents.*"))) == 1  # the old run's events are gone
    assert max(r["step"] for r in read_metrics(rdir)) == 4
    assert checkpoint.load_checkpoint(rdir / "checkpoint.prev.pt")["step"] == 2  # both checkpoints are this run's


def test_a_checkpoint_of_the_earlier_format_still_resumes(finished, capsys):
    """Checkpoints once held NumPy's RNG state as an array: the safe loader accepts plain arrays."""
    import numpy as np

    rdir = run_dir(finished)
    (rdir / "result.json").unlink()
    state = checkpoint.load_checkpoint(rdir / "checkpoint.pt")
    name, key, pos, has_gauss, gauss = state["rng"]["numpy"]
    state["rng"]["numpy"] = (name, key.numpy().astype(np.uint32), pos, has_gauss, gauss)
    torch.save(state, rdir / "checkpoint.pt")
    assert isinstance(checkpoint.load_checkpoint(rdir / "checkpoint.pt")["rng"]["numpy"][1], np.ndarray)
    run_cli_ok(capsys, finished, "--steps", "10", "--resume")


def test_a_full_disk_inside_torch_save_is_the_disk_error_and_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    """torch.save reports a failed write as its own RuntimeError ("unexpected pos"); save_atomic raises the
    disk's OSError, naming the checkpoint, removes its temporary file and keeps the previous files."""
    path, previous = tmp_path / "checkpoint.pt", tmp_path / "checkpoint.prev.pt"
    checkpoint.save_atomic({"step": 1}, path, previous=previous)
    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 512:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(checkpoint.os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode)))
    with pytest.raises(OSError) as err:
        checkpoint.save_atomic({"step": 2, "weights": torch.zeros(10_000)}, path, previous=previous)
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(path))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    assert checkpoint.load_checkpoint(path) == {"step": 1}


def test_a_changed_learning_rate_follows_the_schedule_from_the_resumed_step(tmp_path):
    """Cosine schedule: after a resume with a new peak rate, the rate is the new peak times the schedule's
    factor at the same step (the schedule's position comes from the checkpoint)."""
    from gradengines import models
    from gradengines.trainers.run.optim import WarmupCosine

    task = trainers_task()

    def make(lr):
        torch.manual_seed(0)
        model = models.build("mlp", in_features=task.in_features, out_features=task.num_outputs, depth=2, width=8)
        return trainers.Trainer(model, trainers.build_engine("backprop"), task, logdir=tmp_path, batch_size=32,
                                progress=False, lr=lr, schedule="cosine", warmup_steps=2, checkpoint_every=3,
                                log_every=1)
    make(0.01).fit(steps=6)
    (tmp_path / "default" / "backprop" / "seed0" / "result.json").unlink()
    resumed = make(0.5)
    resumed.fit(steps=10, resume=True, allow_changes=["lr"])
    factor = WarmupCosine(2, 10)
    logged = {r["step"]: r["train/lr"] for r in resumed.history}
    assert logged == pytest.approx({s: 0.5 * factor(s - 1) for s in range(7, 11)}, rel=1e-12)


@pytest.mark.parametrize("main, flags, expected", [
    ("compare", ["--trainers", ""], "--trainers must list each trainer once, got ''"),
    ("compare", ["--trainers", "backprop,backprop"], "--trainers must list each trainer once"),
    ("compare", ["--seeds", "0,0"], "--seeds lists a value twice: '0,0'"),
    ("compare", ["--seeds", "1,x"], "--seeds expects a comma list of integers, got '1,x'"),
    ("bench", ["--depths", "abc"], "--depths expects a comma list of integers, got 'abc'"),
    ("bench", ["--lengths", "-5"], "--lengths values must be >= 1, got '-5'"),
    ("bench", ["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    ("bench", ["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    ("bench", ["--device", "tpu9"], "--device 'tpu9' is not a torch device"),
    ("train", ["--task", "teacher", "--task-option", "n_train=10000000000"], "out of memory ("),
])
def test_compare_and_bench_flags_are_checked_before_any_work(main, flags, expected, tmp_path, capsys):
    from gradengines.trainers.cli import bench_main, compare_main
    entry = {"compare": compare_main, "bench": bench_main, "train": train_main}[main]
    common = {"compare": [*TINY, "--steps", "1", "--logdir", str(tmp_path / "runs")],
              "bench": ["--out", str(tmp_path / "bench")], "train": [*SMALL, "--logdir", str(tmp_path / "runs")]}[main]
    code = entry([*common, *flags])
    err = capsys.readouterr().err.splitlines()
    assert expected in one_error(code, err)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "bench").exists()


def test_memory_running_out_during_training_is_one_line_exit_1(tmp_path, capsys, monkeypatch):
    fail_at_step(monkeypatch, 3, RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                                              "can't allocate memory: you tried to allocate 3221225472 bytes."))
    code, err = run(capsys, *TINY, "--steps", "8", "--checkpoint-every", "2", "--logdir", tmp_path)
    assert one_error(code, err, expected_code=1) == (
        f"error: out of memory (an allocation of 3.0 GiB failed) at step 3, the last checkpoint (step 2) is kept at "
        f"{run_dir(tmp_path) / 'checkpoint.pt'}; lower --batch-size or the model's size")


def test_an_option_of_another_trainer_is_said_to_be_unused(tmp_path, capsys):
    code, err = run(capsys, *TINY, "--steps", "2", "--logdir", tmp_path, "--highway-k", "4", "--fa-feedback-seed", "3")
    assert code == 0
    assert err == ["note: --fa-feedback-seed, --highway-k are options of another trainer, unused by 'backprop'"]


def test_a_nan_loss_is_recorded_in_failed_json_by_the_run_itself(tmp_path, capsys):
    code, err = run(capsys, *TINY, "--steps", "20", "--checkpoint-every", "2", "--lr", "1e9", "--optimizer", "sgd",
                    "--activation", "relu",
                    "--momentum", "0", "--logdir", tmp_path)
    assert code == 1 and "loss is" in one_error(code, err, expected_code=1)
    failure = json.loads((run_dir(tmp_path) / "failed.json").read_text())
    assert failure["trainer"] == "backprop" and failure["seed"] == 0 and failure["error"] == err[0][len("error: "):]
    assert not (run_dir(tmp_path) / "result.json").exists()


def test_a_deep_models_estimate_from_one_and_two_layers_is_its_own_and_refuses_a_million_layers(capsys):
    """The linear extrapolation (``check_fits_scaled``) equals the estimate of the model built at that depth; a
    transformers config with a million layers is refused from it in one line, never built (it took 116 s to fail
    with std::bad_alloc)."""
    from gradengines import models
    from gradengines.trainers.run import memory

    pytest.importorskip("transformers")

    def build_at(values):
        return models.build("residual_mlp", in_features=64, out_features=10, depth=values["depth"], width=32)
    sample = torch.zeros(1, 64)
    settings = dict(batch_size=16, optimizer="adam", momentum=0.9, dtype=torch.float32)
    direct = memory.estimate_bytes(lambda: build_at({"depth": 7}), sample, **settings)
    scaled = memory.check_fits_scaled(build_at, {"depth": 7}, sample, device=torch.device("cpu"), **settings)
    assert scaled == direct and direct is not None and direct["parameters"] > 0
    code, err = run(capsys, "--model", "transformers:BertForSequenceClassification", "--model-option",
                    "num_hidden_layers=1000000", "--model-option", "hidden_size=32", "--model-option",
                    "intermediate_size=64", "--model-option", "num_attention_heads=2", "--task", "teacher",
                    "--steps", "1", "--progress", "false")
    message = one_error(code, err)
    assert "parameters at num_hidden_layers=1,000,000, extrapolated from 1 and 2 layers" in message
    assert message.endswith("lower num_hidden_layers or --batch-size")


def test_a_sigterm_while_a_checkpoint_is_written_is_delivered_once_it_is_whole(tmp_path, monkeypatch):
    """SIGTERM inside torch.save's writer ended in torch's own RuntimeError (exit 1, not 143) 2 times in 6: the
    signal is held while the checkpoint is written, then delivered to the run's handler (Terminated), the
    checkpoint whole."""
    import os
    import signal

    from gradengines.trainers.cli.process import _terminate
    from gradengines.trainers.core.errors import Terminated
    from gradengines.trainers.run import checkpoint

    real = checkpoint.torch.save

    def interrupted(obj, f):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the write
        real(obj, f)

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        monkeypatch.setattr(checkpoint.torch, "save", interrupted)
        with pytest.raises(Terminated):
            checkpoint.save_atomic({"step": 3, "w": torch.ones(4)}, tmp_path / "checkpoint.pt")
    finally:
        signal.signal(signal.SIGTERM, previous)
    state = checkpoint.load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["step"] == 3 and torch.equal(state["w"], torch.ones(4))


def test_the_whole_traceback_is_there_for_whoever_asks_with_gradengines_debug(monkeypatch, capsys):
    """Every failure is one line and its exit code; GRADENGINES_DEBUG=1 adds the whole traceback before that
    line (for a bug report), never instead of it; a failure the commands do not know is raised as it is."""
    from gradengines.trainers.cli.process import run_cli
    from gradengines.trainers.core.errors import ConfigError

    def refused():
        raise ConfigError("--lr must be a finite number, got nan")

    monkeypatch.delenv("GRADENGINES_DEBUG", raising=False)
    assert run_cli(refused) == 2
    assert capsys.readouterr().err == "error: --lr must be a finite number, got nan\n"
    monkeypatch.setenv("GRADENGINES_DEBUG", "1")
    assert run_cli(refused) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "in refused" in err
    assert err.endswith("ConfigError: --lr must be a finite number, got nan\nerror: --lr must be a finite number, "
                        "got nan\n")
    monkeypatch.setenv("GRADENGINES_DEBUG", "0")
    assert run_cli(refused) == 2 and "Traceback" not in capsys.readouterr().err

    def broken():
        return 1 / 0

    with pytest.raises(ZeroDivisionError):
        run_cli(broken)
