"""A user's own model by reference (``--model file.py:Class``, ``module:factory``): trained,
compared, checkpointed and resumed like a zoo model; every bad reference is one line."""

import json
import textwrap

import pytest

import models
from trainers.cli import compare_main, train_main

USER_MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        """A user's MLP written with nn.Sequential."""

        def __init__(self, in_features, out_features, hidden=32):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, out_features))

        def forward(self, x):
            return self.net(x)


    class Fixed(nn.Module):
        """Takes no sizes: the task's are not passed."""

        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(64, 10)

        def forward(self, x):
            return self.linear(x)


    def broken(**kwargs):
        raise RuntimeError("boom")


    def not_a_module(in_features, out_features):
        return 3
''')

QUIET = ["--progress", "false", "--experiment", "e"]


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_models.py"
    path.write_text(USER_MODELS)
    return path


def result(logdir, run="backprop"):
    return json.loads((logdir / "e" / run / "seed0" / "result.json").read_text())


def test_a_model_from_a_file_trains_resumes_and_is_recorded(user_file, tmp_path, capsys):
    logdir = tmp_path / "runs"
    flags = ["--model", f"{user_file}:Net", "--model-option", "hidden=16", "--logdir", str(logdir), *QUIET]
    assert train_main([*flags, "--steps", "20", "--checkpoint-every", "10"]) == 0
    record = result(logdir)
    assert record["model"] == {"model": "Net", "name": f"{user_file}:Net", "hidden": 16, "in_features": 64,
                               "out_features": 10}
    assert record["test"]["accuracy"] > 0.1
    (logdir / "e" / "backprop" / "seed0" / "result.json").unlink()
    assert train_main([*flags, "--steps", "30", "--resume"]) == 0  # the same model: resumes
    assert result(logdir)["steps"] == 30
    capsys.readouterr()
    other = [a if a != "hidden=16" else "hidden=8" for a in flags]
    assert train_main([*other, "--steps", "40", "--resume"]) == 2  # another build of it: refused
    assert "its checkpoint is of another model (hidden 16 there, 8 here" in capsys.readouterr().err


def test_a_factory_from_an_installed_module_and_a_model_without_size_options(user_file, tmp_path):
    assert train_main(["--model", "torch.nn:Linear", "--steps", "5", "--logdir", str(tmp_path / "a"), *QUIET]) == 0
    assert result(tmp_path / "a")["model"]["in_features"] == 64
    assert train_main(["--model", f"{user_file}:Fixed", "--steps", "5", "--logdir", str(tmp_path / "b"), *QUIET]) == 0
    assert "in_features" not in result(tmp_path / "b")["model"]
    assert isinstance(models.build(f"{user_file}:Net", in_features=3, out_features=2), models.registry.nn.Module)


BAD_REFERENCES = {
    "no such file": ("{dir}/nope.py:Net", [], "model file {dir}/nope.py does not exist"),
    "no such name": ("{file}:Nope", [], "'{file}' has no model class or factory 'Nope'; its nn.Module classes: "
                                        "Fixed, Net"),
    "no such module": ("nosuchmodule:Net", [], "model module 'nosuchmodule' cannot be imported: ModuleNotFoundError"),
    "unknown option": ("{file}:Net", ["--model-option", "depth_=3"], "model '{file}:Net' has no option depth_; "
                                                                     "accepted: in_features, out_features, hidden"),
    "constructor fails": ("{file}:broken", [], "could not be built with"),
    "not a module": ("{file}:not_a_module", [], "returned a int, not a torch.nn.Module"),
    "option given twice": ("{file}:Net", ["--depth", "2", "--model-option", "depth=3"],
                           "--model-option depth repeats --depth; give it once"),
    "not a reference": (":Net", [], "a model reference is FILE.py:NAME or MODULE:NAME"),
}


@pytest.mark.parametrize("case", list(BAD_REFERENCES))
def test_a_bad_reference_is_one_line_exit_2_and_writes_nothing(case, user_file, tmp_path, capsys):
    reference, flags, expected = BAD_REFERENCES[case]
    fill = {"dir": tmp_path, "file": user_file}
    code = train_main(["--model", reference.format(**fill), *flags, "--steps", "1", "--logdir", str(tmp_path / "runs"),
                       *QUIET])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert expected.format(**fill) in err[0]
    assert not (tmp_path / "runs").exists()


def test_a_syntax_error_in_the_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    assert train_main(["--model", f"{bad}:Net", "--steps", "1", "--logdir", str(tmp_path / "runs"), *QUIET]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"model file {bad} failed to import: SyntaxError" in err[0]


def test_compare_runs_the_trainers_a_user_model_supports(user_file, tmp_path, capsys):
    """A plain nn.Module satisfies no engine's structure: the comparison runs backprop on it, with its
    summary and figure, and a named trainer that needs a structure is refused in one line."""
    logdir = tmp_path / "runs"
    assert compare_main(["--model", f"{user_file}:Net", "--steps", "5", "--seeds", "0", "--logdir", str(logdir),
                         "--progress", "false"]) == 0
    experiment = logdir / "compare-digits"
    assert sorted(p.name for p in experiment.iterdir() if p.is_dir()) == ["backprop"]
    assert (experiment / "summary.md").exists() and (experiment / "comparison.png").exists()
    capsys.readouterr()
    assert compare_main(["--model", f"{user_file}:Net", "--trainers", "foton", "--steps", "5", "--seeds", "0",
                         "--logdir", str(tmp_path / "other"), "--progress", "false"]) == 2
    assert "trainer 'foton' needs" in capsys.readouterr().err


def test_the_installed_package_runs_its_console_commands_from_another_directory(user_file, tmp_path):
    """`pip install .` into a fresh virtual environment (reusing this one's torch and other dependencies
    through a .pth file, so nothing is downloaded) gives `gradengines train|compare|bench|table`, which
    run from an unrelated directory on a user's model file, importing the installed copy."""
    import shutil
    import subprocess
    import sys
    import sysconfig
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    source = tmp_path / "source"  # pip builds in the tree it is given: a copy keeps the checkout clean
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "bench_out", "build", "docs",
                                                                "*.egg-info", "__pycache__", ".*_cache", "tests"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "reuse_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", str(source)], check=True, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(user_file, work / "user_models.py")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}

    def gradengines(*args):
        return subprocess.run([venv / "bin" / "gradengines", *args], cwd=work, env=env, capture_output=True, text=True)

    where = subprocess.run([python, "-c", "import trainers; print(trainers.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True).stdout
    assert where.startswith(str(venv))
    quiet = ["--progress", "false", "--logdir", "runs"]
    done = gradengines("train", "--model", "user_models.py:Net", "--model-option", "hidden=8", "--steps", "5", *quiet)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 5
    done = gradengines("compare", "--model", "user_models.py:Net", "--steps", "3", "--seeds", "0", *quiet)
    assert done.returncode == 0, done.stderr
    table = gradengines("table", "runs")
    assert table.returncode == 0 and table.stdout.startswith("| experiment | backprop |")
    bench = gradengines("bench", "--suite", "scan", "--lengths", "8", "--steps", "20", "--out", "b")
    assert bench.returncode == 0 and (work / "b" / "bench.json").exists(), bench.stderr
    refused = gradengines()
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "error: give a command; gradengines {train,compare,bench,table} [--help | OPTIONS]"]
    usage = gradengines("train", "--epoch", "1")
    assert usage.returncode == 2 and usage.stderr.splitlines() == [
        "error: unrecognized arguments: --epoch 1 (see gradengines train --help)"]
