"""Issue 23: nothing outside a run directory is written, nothing finished is replaced without --overwrite,
and bad input is refused before anything trains or is written."""

import json
import os

import pytest
from helpers import one_line_error

from gradengines.trainers.cli import compare_main, train_main

QUICK = ["--depth", "2", "--width", "8", "--steps", "2", "--progress", "false"]
TRAINED = "train-mlp-depth=2-width=8-digits"  # train.py's default experiment with QUICK (trainers/cli/names.py)
COMPARED = "compare-depth=2-width=8-digits-backprop"  # compare.py's, with QUICK and --trainers backprop



@pytest.mark.parametrize("resume", [False, True])
def test_a_lock_link_planted_in_a_run_directory_is_refused_and_its_target_kept(tmp_path, capsys, resume):
    outside = tmp_path / "precious.txt"
    outside.write_text("nineteen bytes here")
    run = tmp_path / "runs" / TRAINED / "backprop" / "seed0"
    run.mkdir(parents=True)
    os.symlink(outside, run / ".lock")
    code = train_main([*QUICK, "--logdir", str(tmp_path / "runs"), *(["--resume"] if resume else [])])
    err = one_line_error(capsys)
    assert code == 2 and ".lock is a symbolic link" in err and "remove the link" in err
    assert outside.read_text() == "nineteen bytes here"
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing trained or written


def test_compare_into_an_existing_experiment_refuses_without_overwrite(tmp_path, capsys):
    flags = [*QUICK, "--trainers", "backprop,fa", "--seeds", "0", "--timing-rounds", "5", "--logdir", str(tmp_path)]
    assert compare_main(flags) == 0
    first = (tmp_path / (COMPARED + "+fa") / "backprop" / "seed0" / "result.json").read_text()
    capsys.readouterr()
    assert compare_main([*flags, "--lr", "0.01"]) == 2
    err = one_line_error(capsys)
    assert "already holds a run" in err and "--overwrite" in err and "--resume" in err
    assert (tmp_path / (COMPARED + "+fa") / "backprop" / "seed0" / "result.json").read_text() == first
    assert compare_main([*flags, "--lr", "0.01", "--overwrite"]) == 0  # asked for: replaced
    assert (tmp_path / (COMPARED + "+fa") / "backprop" / "seed0" / "result.json").read_text() != first


@pytest.mark.parametrize("grid, expected", [
    ("lr=1e-3,abc", "value 'abc' is refused"),
    ("batch_size=64,0", "value 0 is refused"),
    ("lr=1e-3,1e400", "value inf is refused"),
    ("lr=0.001,1e-3", "lists a value twice"),
    ("fa.feedback_seed=0,x", "value 'x' is refused"),
])
def test_a_bad_tuning_grid_value_is_refused_before_any_trial(tmp_path, capsys, grid, expected):
    code = compare_main([*QUICK, "--trainers", "backprop,fa", "--seeds", "0", "--tune", "--tune-grid", grid,
                         "--logdir", str(tmp_path / "runs")])
    err = one_line_error(capsys)
    assert code == 2 and expected in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("damage", ["a damaged line", "a directory"])
def test_a_damaged_metrics_file_on_resume_keeps_the_finished_runs_result(tmp_path, capsys, damage):
    flags = [*QUICK[:4], "--progress", "false", "--log-every", "1", "--logdir", str(tmp_path)]
    assert train_main([*flags, "--steps", "3"]) == 0
    run = tmp_path / TRAINED / "backprop" / "seed0"
    result = (run / "result.json").read_text()
    metrics = run / "metrics.jsonl"
    if damage == "a damaged line":
        lines = metrics.read_text().splitlines()
        metrics.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    else:
        metrics.unlink()
        metrics.mkdir()
    capsys.readouterr()
    assert train_main([*flags, "--steps", "5", "--resume"]) == 2
    err = one_line_error(capsys)
    assert "metrics.jsonl" in err
    assert (run / "result.json").read_text() == result


@pytest.mark.parametrize("option", ["n_val=0", "n_test=0"])
def test_an_empty_split_is_refused_before_training(tmp_path, capsys, option):
    code = train_main([*QUICK, "--task", "teacher", "--task-option", option, "--logdir", str(tmp_path / "runs")])
    err = one_line_error(capsys)
    assert code == 2 and "split is empty" in err
    assert not (tmp_path / "runs").exists()


def test_labels_out_of_range_are_refused_when_the_task_is_built():
    import torch

    from gradengines.tasks.base import Split, Task
    from gradengines.tasks.errors import TaskConfigError

    good = Split(torch.zeros(4, 3), torch.tensor([0, 1, 2, 1]))
    Task("ok", good, good, good, input_shape=(3,), num_outputs=3)
    bad = Split(torch.zeros(4, 3), torch.tensor([0, 1, 3, 1]))
    with pytest.raises(TaskConfigError, match="the val split has label 3, outside \\[0, 3\\)"):
        Task("bad", good, bad, good, input_shape=(3,), num_outputs=3)
    negative = Split(torch.zeros(2, 3), torch.tensor([0, -1]))
    with pytest.raises(TaskConfigError, match="label -1"):
        Task("bad", negative, good, good, input_shape=(3,), num_outputs=3)


def test_resume_on_another_split_is_refused(tmp_path, capsys):
    flags = [*QUICK[:4], "--progress", "false", "--logdir", str(tmp_path)]
    assert train_main([*flags, "--steps", "2"]) == 0
    capsys.readouterr()
    assert train_main([*flags, "--steps", "4", "--resume", "--split-seed", "1"]) == 2
    err = one_line_error(capsys)
    assert "another split of the data" in err and "--split-seed" in err
    assert train_main([*flags, "--steps", "4", "--resume"]) == 0  # its own split continues


DAMAGED = {
    "truncated": b'{"run": "x", "trainer": "backprop", "met',
    "empty object": b"{}",
    "a list": b"[1, 2]",
    "not UTF-8": b'{"run": "\xff\xfe"}',
    "test is text": b'{"run": "x", "trainer": "t", "task": "digits", "metric": "accuracy", "steps": 1, '
                    b'"best_val": {"accuracy": 0.5}, "final_val": {"accuracy": 0.5}, "test": "high", '
                    b'"config": {"seed": 0}, "engine": {}, "model": {}}',
}


def test_damaged_records_are_named_and_the_good_runs_reported(tmp_path, capsys):
    """Each kind of damage in its own run folder, beside a good comparison: every file is named once per
    command, the good runs are reported by compare.py, train.py (its HParams configuration) and table.py."""
    from gradengines.trainers.cli import table_main

    planted = {}
    for i, damage in enumerate(DAMAGED):
        folder = tmp_path / COMPARED / f"planted{i}" / "seed0"
        folder.mkdir(parents=True)
        (folder / "result.json").write_bytes(DAMAGED[damage])
        (folder / "failed.json").write_bytes(DAMAGED[damage])
        planted[damage] = folder
    assert compare_main([*QUICK, "--trainers", "backprop", "--seeds", "0", "--timing-rounds", "5",
                         "--logdir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    for damage, folder in planted.items():
        assert err.count(f"{folder / 'result.json'} is damaged") == 1, damage
        assert f"{folder / 'failed.json'} is damaged" in err, damage
    summary = (tmp_path / COMPARED / "summary.md").read_text()
    assert "| backprop | 1 |" in summary and "planted" not in summary
    assert train_main([*QUICK, "--logdir", str(tmp_path), "--experiment", COMPARED, "--run-name", "solo"]) == 0
    assert table_main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert f"| {COMPARED} |" in out and "backprop" in out and "solo" in out
    assert all(f"{folder / 'result.json'} is damaged" in err for folder in planted.values())


@pytest.mark.parametrize("damaged", [1, 2])
def test_a_table_of_only_damaged_records_says_they_were_found(tmp_path, capsys, damaged):
    """table.py where every result.json is damaged: each is named, and the error counts them rather than saying
    there were none (it said "no result.json below"); an empty folder still says there are none."""
    from gradengines.trainers.cli import table_main

    for i in range(damaged):
        folder = tmp_path / "runs" / "e" / f"r{i}" / "seed0"
        folder.mkdir(parents=True)
        (folder / "result.json").write_bytes(DAMAGED["truncated"])
    assert table_main([str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.splitlines()
    files = "1 result.json file" if damaged == 1 else f"{damaged} result.json files"
    assert err[-1] == (f"error: found {files} below {tmp_path / 'runs'}, but none could be read (each is named "
                       f"above); rerun those runs, or point at another folder")
    assert len(err) == damaged + 1 and all(" is damaged (" in line for line in err[:-1]), err  # each named once
    (tmp_path / "empty").mkdir()
    assert table_main([str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == (f"error: no result.json below {tmp_path / 'empty'} (the runs of "
                                       f"scripts/compare.py or scripts/train.py write one each)\n")
    assert table_main([str(tmp_path / "missing")]) == 2  # not there at all: said, with what writes it
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'missing'} does not exist: table.py reads the runs "
                                              f"that scripts/compare.py and scripts/train.py write")


def test_a_run_without_a_test_and_a_nested_run_name_are_reported(tmp_path, capsys):
    from gradengines.trainers.cli import table_main

    assert compare_main([*QUICK, "--trainers", "backprop", "--seeds", "0", "--timing-rounds", "5",
                         "--run-name", "group/bp", "--logdir", str(tmp_path)]) == 0
    summary = (tmp_path / COMPARED / "summary.md").read_text()
    assert "| group/bp | 1 |" in summary  # a run name with a '/' keeps its row
    result = tmp_path / COMPARED / "group" / "bp" / "seed0" / "result.json"
    record = json.loads(result.read_text())
    result.write_text(json.dumps({**record, "test": None}))
    capsys.readouterr()
    assert table_main([str(tmp_path), "--value", "best_val"]) == 0
    assert "group/bp" in capsys.readouterr().out


def _craft(state: dict, damage: str, path) -> None:
    import pickle

    import torch

    if damage == "a text step":
        state["step"] = "two"
    elif damage == "a negative step":
        state["step"] = -5
    elif damage == "garbage rng":
        state["rng"] = {"python": "x", "numpy": (1, 2), "torch": None}
    elif damage == "no config":
        del state["config"]
    elif damage == "an empty optimizer state":
        state["optimizer"] = {}
    if damage == "a directory":
        path.mkdir()
    elif damage == "a FIFO":
        os.mkfifo(path)
    elif damage == "a raw pickle":
        path.write_bytes(pickle.dumps({"step": 1}))
    else:
        torch.save(state, path)


@pytest.mark.parametrize("damage", ["a text step", "a negative step", "garbage rng", "no config",
                                    "an empty optimizer state", "a directory", "a FIFO", "a raw pickle"])
def test_a_damaged_checkpoint_is_one_line_and_nothing_trains(tmp_path, capsys, damage):
    from gradengines.trainers.run.checkpoint import load_checkpoint

    flags = [*QUICK[:4], "--progress", "false", "--logdir", str(tmp_path)]
    assert train_main([*flags, "--steps", "2", "--checkpoint-every", "1"]) == 0
    run = tmp_path / TRAINED / "backprop" / "seed0"
    state = load_checkpoint(run / "checkpoint.pt")
    (run / "checkpoint.pt").unlink()
    (run / "checkpoint.prev.pt").unlink()
    _craft(state, damage, run / "checkpoint.pt")
    before = (run / "result.json").read_text()
    capsys.readouterr()
    assert train_main([*flags, "--steps", "4", "--resume"]) == 2
    err = one_line_error(capsys)
    assert "checkpoint.pt" in err
    if damage == "a directory":  # no checkpoint could be written there either: --overwrite would not help
        assert "is a directory, not a file" in err and "move or remove that directory" in err, err
    else:
        assert ("refused" in err) if damage == "a raw pickle" else ("--overwrite starts the run afresh" in err), err
    assert (run / "result.json").read_text() == before  # nothing trained, nothing replaced


def test_sigterm_is_one_line_keeps_the_checkpoint_and_resume_is_exact(tmp_path):
    """SIGTERM at step 17 of 30 (checkpoints every 5; sent by the process to itself, conftest.train_signalled_at,
    so it lands mid-run on any machine): exit 143, one line, the checkpoint of step 15 kept; the resume ends with
    the metrics of an uninterrupted run."""
    import subprocess
    import sys

    import torch
    from conftest import ROOT, train_signalled_at

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    flags = ["--task", "teacher", "--task-option", "n_train=512", "--width", "32", "--depth", "3", "--batch-size",
             "16", "--steps", "30", "--checkpoint-every", "5", "--eval-every", "10", "--progress", "false",
             "--experiment", "e"]
    script = train_signalled_at(tmp_path, 17, "SIGTERM")
    run = tmp_path / "stopped" / "e" / "backprop" / "seed0"
    proc = subprocess.run([sys.executable, script, *flags, "--logdir", str(tmp_path / "stopped")], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)  # a hang guard
    err = proc.stderr
    assert proc.returncode == 143, err
    assert err.count("\n") == 1 and err.startswith("error: terminated (SIGTERM) at step 17"), err
    assert "the last checkpoint (step 15)" in err and "--resume continues the run" in err, err
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 15
    # the uninterrupted run and the resume in this process (only the stopped run needs its own)
    assert train_main([*flags, "--logdir", str(tmp_path / "whole")]) == 0
    assert train_main([*flags, "--logdir", str(tmp_path / "stopped"), "--resume"]) == 0

    def records(root):
        lines = (root / "e" / "backprop" / "seed0" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "memory/"))}
                for line in lines]

    assert records(tmp_path / "stopped") == records(tmp_path / "whole")


def test_ctrl_c_while_the_framework_loads_is_one_line():
    """A KeyboardInterrupt raised while a script imports trainers (as Ctrl-C during torch's import would)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import builtins, runpy, sys\n"
            "real = builtins.__import__\n"
            "def ctrl_c(name, *args, **kwargs):\n"
            "    if name == 'gradengines.trainers.cli':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = ctrl_c\n"
            f"sys.path.insert(0, {str(root / 'scripts')!r})\n"
            f"runpy.run_path({str(root / 'scripts' / 'train.py')!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 130 and proc.stderr == "error: interrupted while starting\n", proc.stderr


USER_MODELS = {
    "returns no tensor first": ("def forward(self, x):\n        return None, self.linear(x)", 2,
                                "returns a tuple whose first element is NoneType, not a tensor; say which part is "
                                "the output: --model-call output="),
    "raises": ("def forward(self, x):\n        raise ValueError('bad forward')", 2, "ValueError: bad forward"),
    "fails in training mode": ("def forward(self, x):\n        if self.training:\n            raise KeyError('tr')\n"
                               "        return self.linear(x)", 2, "failed in training mode"),
    "fails at step 0": ("def forward(self, x):\n        if torch.is_grad_enabled():\n"
                        "            raise ZeroDivisionError('step zero')\n        return self.linear(x)", 1,
                        "failed at step 0: ZeroDivisionError: step zero"),
    "all frozen": ("def forward(self, x):\n        return self.linear(x)\n\n    def freeze(self):\n        pass", 2,
                   "has no trainable parameter"),
}


@pytest.mark.parametrize("case", list(USER_MODELS))
def test_a_failing_user_model_is_one_line_and_the_run_directory_stays_rerunnable(tmp_path, capsys, case):
    forward, code, expected = USER_MODELS[case]
    frozen = "        self.linear.requires_grad_(False)\n" if case == "all frozen" else ""
    (tmp_path / "mine.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass Mine(nn.Module):\n    def __init__(self):\n"
        f"        super().__init__()\n        self.linear = nn.Linear(64, 10)\n{frozen}\n    {forward}\n")
    flags = ["--model", f"{tmp_path / 'mine.py'}:Mine", "--steps", "2", "--progress", "false",
             "--logdir", str(tmp_path / "runs")]
    assert train_main(flags) == code
    err = one_line_error(capsys)
    assert expected in err, err
    run = tmp_path / "runs" / TRAINED / "backprop" / "seed0"
    if run.exists():  # a failure during training: the same command may run again, no --overwrite needed
        assert train_main(flags) == code
        assert "already holds a run" not in one_line_error(capsys)


def test_a_model_file_that_exits_on_import_is_an_error_not_a_quiet_success(tmp_path, capsys):
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(0)\n")
    assert train_main(["--model", f"{tmp_path / 'quits.py'}:Net", "--steps", "1", "--progress", "false",
                       "--logdir", str(tmp_path / "runs")]) == 2
    assert "it called sys.exit(0)" in one_line_error(capsys)


@pytest.mark.parametrize("flags, expected", [
    (["--run-name", "."], "--run-name must be a relative path"),
    (["--experiment", "."], "--experiment must be a relative path"),
    (["--experiment", "a/."], "--experiment must be a relative path"),
    (["--run-name", "bad\udcff"], "--run-name must be UTF-8 text"),
    (["--orthogonal", "bjorck", "--orthogonal-iters", "1000000000"], "orthogonal iters must be an int from 1 to 100"),
])
def test_names_and_sizes_that_would_fail_later_are_refused_first(tmp_path, capsys, flags, expected):
    assert train_main([*QUICK, *flags, "--logdir", str(tmp_path / "runs")]) == 2
    assert expected in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()


def test_bench_refuses_an_unwritable_out_before_timing(tmp_path, capsys, monkeypatch):
    """A read-only --out (simulated: the suite may run as root, who writes anywhere) fails in one line before
    any timing, not after the benchmark."""
    import errno

    from gradengines.trainers import bench
    from gradengines.trainers.cli import bench_main

    def read_only(dir, **_):
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr("gradengines.trainers.cli.bench.tempfile.NamedTemporaryFile", read_only)
    monkeypatch.setattr(bench, "bench_scan", lambda **_: pytest.fail("timed before checking --out"))
    assert bench_main(["--suite", "scan", "--lengths", "8", "--steps", "20", "--out", str(tmp_path / "o")]) == 2
    assert "Permission denied" in one_line_error(capsys)


def test_a_comparison_prints_no_profiler_lines(tmp_path, capfd):
    assert compare_main([*QUICK, "--trainers", "backprop,fa", "--seeds", "0", "--timing-rounds", "5",
                         "--logdir", str(tmp_path)]) == 0
    err = capfd.readouterr().err
    assert "profiler" not in err and "USDT" not in err and "CPUAllocator" not in err


def test_the_python_api_raises_the_projects_named_errors():
    import torch

    from gradengines import models, tasks, trainers
    from gradengines.models.errors import ModelConfigError
    from gradengines.tasks.base import cross_entropy_loss
    from gradengines.tasks.errors import TaskConfigError
    from gradengines.trainers.core.errors import ConfigError, IncompatibleModelError

    task = tasks.build("teacher", in_features=8, num_classes=3, n_train=32, n_val=16, n_test=16, hidden=8)
    model = models.build("mlp", in_features=8, out_features=3, depth=2, width=8)
    with pytest.raises(ConfigError, match="engine must be a GradientEngine .*got str 'backprop'"):
        trainers.Trainer(model, "backprop", task)
    with pytest.raises(ConfigError, match="task must be a tasks.Task .*got str 'teacher'"):
        trainers.Trainer(model, trainers.build_engine("backprop"), "teacher")
    with pytest.raises(ConfigError, match="model must be a torch.nn.Module, got function"):
        trainers.Trainer(lambda x: x, trainers.build_engine("backprop"), task)
    residual = models.build("residual_mlp", in_features=8, out_features=3, depth=2, width=8)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    for name in ("foton", "pepita"):  # each engine checks a model it has not seen before computing
        with pytest.raises(IncompatibleModelError, match=name):
            trainers.build_engine(name).compute_grads(residual, x, y, cross_entropy_loss)
    with pytest.raises(IncompatibleModelError, match="fa"):  # FA takes any model with a trained weight layer
        trainers.build_engine("fa").compute_grads(torch.nn.Embedding(8, 3), torch.tensor([1, 2]),
                                                  torch.tensor([0, 1]), cross_entropy_loss)
    with pytest.raises(ModelConfigError, match="width must be an integer or a list of integers, got 'abc'"):
        models.build("mlp", in_features=8, out_features=3, width="abc")
    with pytest.raises(ModelConfigError, match="out of memory"):
        models.build("mlp", in_features=64, out_features=10, width=10**12)
    with pytest.raises(TaskConfigError, match="out of memory"):
        tasks.build("teacher", n_train=10**15)

    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.f, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

        def forward(self, x):
            h = self.stem(x)
            return self.head(h + self.f(h))

    mine = Residual()
    models.residual_stack(mine, stem=mine.stem, blocks=[mine.f], head=mine.head, example=torch.randn(4, 8))
    with pytest.raises(ModelConfigError, match="the example does not run through the model"):
        models.residual_stack(mine, stem=mine.stem, blocks=[mine.f], head=mine.head, example=torch.randn(4, 5))


def test_an_error_line_is_written_whole(monkeypatch):
    """Ranks of a torchrun job fail at the same moment: each line must reach stderr in one write, or two
    ranks' lines run together (seen with --lr nan on 2 ranks)."""
    import io

    from gradengines.trainers.cli import run_cli
    from gradengines.trainers.core.errors import ConfigError

    writes = []

    class Recorder(io.StringIO):
        def write(self, text):
            writes.append(text)
            return len(text)

    monkeypatch.setattr("sys.stderr", Recorder())

    def main():
        raise ConfigError("--lr must be finite, got nan")

    assert run_cli(main) == 2
    assert writes == ["error: --lr must be finite, got nan\n"]


def test_an_idx_file_of_no_images_is_refused_when_the_task_is_built(tmp_path):
    import struct

    from gradengines import tasks
    from gradengines.tasks.errors import DataError, TaskConfigError

    folder = tmp_path / "mnist-t10k"
    folder.mkdir()
    (folder / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, 0, 28, 28))
    (folder / "t10k-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, 0))
    with pytest.raises((TaskConfigError, DataError), match="empty|no image|0 images"):
        tasks.build("mnist-t10k", data_dir=str(tmp_path))
