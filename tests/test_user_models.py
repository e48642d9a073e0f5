"""A user's own model by reference (``--model file.py:Class``, ``module:factory``): trained,
compared, checkpointed and resumed like a zoo model; every bad reference is one line."""

import json
import textwrap

import pytest
from helpers import cosine, engine_grads, relative

from gradengines import models
from gradengines.trainers.cli import compare_main, train_main

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


    def create_model(model_name, pretrained=False, **kwargs):
        """timm's factory shape: the architecture's options through **kwargs, which it rejects if unknown."""
        return Net(64, **kwargs) if model_name == "net" else Net(64, 10, **kwargs)


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


def test_the_tasks_sizes_are_not_pushed_into_a_factorys_kwargs(user_file, tmp_path):
    assert train_main(["--model", f"{user_file}:create_model", "--model-option", "model_name=net",
                       "--model-option", "out_features=10", "--model-option", "hidden=4", "--steps", "2",
                       "--logdir", str(tmp_path / "a"), *QUIET]) == 0
    record = result(tmp_path / "a")["model"]
    assert {k: record[k] for k in ("model_name", "out_features", "hidden")} == {"model_name": "net",
                                                                                 "out_features": 10, "hidden": 4}
    assert "in_features" not in record and "input_shape" not in record


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


@pytest.mark.renders_figures
def test_compare_runs_the_trainers_a_user_model_supports(user_file, tmp_path, capsys):
    """A plain nn.Module of nn.Linear layers is no layer stack, residual stack or recurrent model: the
    comparison runs backprop and the trainers that need only its weight layers (the FA family, on the layer
    path), with its summary and figure, and a named trainer that needs a structure is refused in one line."""
    logdir = tmp_path / "runs"
    assert compare_main(["--model", f"{user_file}:Net", "--steps", "5", "--seeds", "0", "--timing-rounds", "5",
                         "--logdir", str(logdir),
                         "--progress", "false"]) == 0
    experiment = logdir / "compare-Net-digits"
    family = ["backprop", "brsf", "dfa", "fa", "fgrad", "fgrad_act", "frsf", "mezo", "usf"]
    assert sorted(p.name for p in experiment.iterdir() if p.is_dir()) == family
    assert (experiment / "summary.md").exists() and (experiment / "comparison.png").exists()
    note = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: compared")]
    assert note == ["note: compared backprop, brsf, dfa, fa, fgrad, fgrad_act, frsf, mezo, usf: every trainer this "
                    "model allows; left out: "
                    "dsf, ftbptt, tbptt (need a model with recurrent layers); foton, pepita (need a layer stack h_l = "
                    "act(A_l h_{l-1} + b_l) with adjoint-capable A_l); highway (needs a residual stack) (--trainers "
                    "NAME says the whole reason)"]
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
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "bench_out", "build", "docs",
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

    where = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('gradengines').origin, "
                            "*(u.find_spec(n) for n in ('trainers', 'models', 'tasks')))"],
                           cwd=work, env=env, capture_output=True, text=True).stdout  # found, not imported: no torch
    assert where.startswith(str(venv)) and where.split()[1:] == ["None"] * 3  # one import name, nothing beside it
    (record,) = Path(purelib).glob("gradengines-*.dist-info/RECORD")
    top = {line.split("/")[0] for line in record.read_text().splitlines()
           if ".dist-info" not in line.split(",")[0] and not line.startswith("..")}  # ../../../bin: the command
    assert top == {"gradengines"}, top  # the wheel installs one package
    package = Path(purelib) / "gradengines"
    installed = {str(p.relative_to(package)) for p in package.rglob("*.py")}
    assert {str(p.relative_to(root)) for d in ("trainers", "models", "tasks") for p in (root / d).rglob("*.py")} \
        <= installed  # every module of the folders mapped into it
    quiet = ["--progress", "false", "--logdir", "runs"]
    done = gradengines("train", "--model", "user_models.py:Net", "--model-option", "hidden=8", "--steps", "5", *quiet)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 5
    # two trainers, 5 timing rounds: the command runs installed (every trainer a user's model takes: tested above)
    done = gradengines("compare", "--model", "user_models.py:Net", "--trainers", "backprop,fa", "--timing-rounds", "5",
                       "--steps", "3", "--seeds", "0", *quiet)
    assert done.returncode == 0, done.stderr
    table = gradengines("table", "runs")
    assert table.returncode == 0 and table.stdout.splitlines()[2].startswith("| experiment | backprop |")
    assert table.stdout.startswith("test accuracy: mean ± std over seeds")
    bench = gradengines("bench", "--suite", "scan", "--lengths", "8", "--steps", "20", "--out", "b")
    assert bench.returncode == 0 and (work / "b" / "bench.json").exists(), bench.stderr
    refused = gradengines()
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "error: give a command; gradengines {train,compare,bench,table} [--help | OPTIONS]"]
    usage = gradengines("train", "--epoch", "1")
    assert usage.returncode == 2 and usage.stderr.splitlines() == [
        "error: unrecognized arguments: --epoch 1 (see gradengines train --help)"]


# ------------------------------------------------------------------ nn.Sequential as a layer stack
def sequential(widths=(8, 6, 5, 3), act=None, dropout=0.0):
    import torch
    from torch import nn

    torch.manual_seed(0)
    parts = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        parts.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            if dropout:
                parts.append(nn.Dropout(dropout))
            parts.append(act() if act else nn.Identity())
    return nn.Sequential(*parts).double()


def test_foton_on_a_users_linear_narrowing_orthogonal_sequential_is_backprop():
    import torch

    from gradengines import trainers

    net = sequential()
    stack = models.layer_stack(net, orthogonal="bjorck")
    assert stack.layers == [net[0], net[2], net[4]] and stack.layers[0].weight is net[0].weight
    x = torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(stack(x), net(x), rtol=0, atol=0)  # the forward is the user's
    exact = engine_grads(stack, trainers.build_engine("backprop"), x, y)
    foton = engine_grads(stack, trainers.build_engine("foton"), x, y)
    assert set(exact) == {"sequential.0.weight", "sequential.0.bias", "sequential.2.weight", "sequential.2.bias",
                          "sequential.4.weight", "sequential.4.bias"}
    for name in exact:
        torch.testing.assert_close(foton[name], exact[name], rtol=1e-10, atol=1e-12)


def test_foton_on_a_users_tanh_sequential_is_its_own_rule_and_not_backprop():
    """The contrast to the identity above: with tanh between the layers FOTON computes its rule, written out
    here (e = softmax(y) - onehot, h~_0 = x - F e with F e = A_1^T A_2^T A_3^T e, h~_l = tanh(A_l h~_{l-1} + b_l),
    G_l = (1/B) sum (h_l - h~_l) h_{l-1}^T), exact at the output layer and not backprop below it."""
    import torch
    from torch import nn

    from gradengines import trainers

    net = sequential(act=nn.Tanh)
    stack = models.layer_stack(net, orthogonal="bjorck")
    x = torch.randn(16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(2))
    exact = engine_grads(stack, trainers.build_engine("backprop"), x, y)
    foton = engine_grads(stack, trainers.build_engine("foton"), x, y)
    (W1, b1), (W2, b2), (W3, b3) = ((layer.weight.detach(), layer.bias.detach()) for layer in stack.layers)
    with torch.no_grad():
        h1 = torch.tanh(x @ W1.T + b1)
        h2 = torch.tanh(h1 @ W2.T + b2)
        e = torch.softmax(h2 @ W3.T + b3, 1) - torch.nn.functional.one_hot(y, 3).double()
        x_mod = x - e @ W3 @ W2 @ W1  # the minus sign: the modulated input moves against the error
        d1 = h1 - torch.tanh(x_mod @ W1.T + b1)
        d2 = h2 - torch.tanh((h1 - d1) @ W2.T + b2)
    by_hand = {"sequential.0.weight": d1.T @ x / 16, "sequential.0.bias": d1.mean(0),
               "sequential.2.weight": d2.T @ h1 / 16, "sequential.2.bias": d2.mean(0),
               "sequential.4.weight": e.T @ h2 / 16, "sequential.4.bias": e.mean(0)}
    for name in exact:
        torch.testing.assert_close(foton[name], by_hand[name], rtol=1e-10, atol=1e-12, msg=name)
        if name.startswith("sequential.4."):  # the output layer: backprop's
            torch.testing.assert_close(foton[name], exact[name], rtol=1e-10, atol=1e-12, msg=name)
        else:
            assert (foton[name] - exact[name]).norm() > 1e-1 * exact[name].norm(), name


def test_every_layer_stack_engine_trains_a_users_sequential_through_the_trainer():
    """Tanh Sequential with dropout: the Trainer (projection upkeep included) updates the user's own
    Parameters in place with FOTON, PEPITA, FA and DFA, and keeps the hidden layers orthogonal."""
    import torch
    from torch import nn

    from gradengines import tasks, trainers
    from gradengines.models.orthogonal import orthogonality_error

    task = tasks.build("teacher", n_train=128, in_features=8, num_classes=3)
    for name in ("foton", "pepita", "fa", "dfa"):
        net = sequential(widths=(8, 8, 8, 3), act=nn.Tanh, dropout=0.1).float()
        stack = models.layer_stack(net, orthogonal="bjorck")
        weight, before = net[0].weight, net[0].weight.detach().clone()
        trainers.Trainer(stack, trainers.build_engine(name), task, batch_size=32, progress=False,
                         optimizer="sgd", lr=0.05).fit(steps=4)
        assert net[0].weight is weight and not torch.equal(weight.detach(), before), name
        assert isinstance(net[1], models.ConsistentDropout) and net[1].p == 0.1
        assert orthogonality_error(net[0]) < 1e-4 and orthogonality_error(net[4]) < 1e-4, name


@pytest.mark.parametrize("build, expected", [
    (lambda nn: nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Dropout(0.1), nn.Linear(4, 2)),
     "sequential[2] is a dropout after the activation; put it before (h = act(drop(W h + b)))"),
    (lambda nn: nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)),
     "one activation class throughout, found ReLU, Tanh"),
    (lambda nn: nn.Sequential(nn.Conv1d(1, 1, 3), nn.Tanh(), nn.Linear(4, 2)),
     "sequential[0] is a Conv1d where an nn.Linear or nn.Conv2d is expected"),
    (lambda nn: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Conv2d(2, 2, 3)),
     "the last layer is an nn.Conv2d; end with [Flatten], Linear"),
    (lambda nn: nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="circular"), nn.Tanh(), nn.Flatten(),
                              nn.Linear(2, 2)), "pads with 'circular'"),
    (lambda nn: nn.Linear(4, 2), "layer_stack needs an nn.Sequential, got Linear"),
    # issue 42: accepted before, then FA, DFA and PEPITA ended in torch's shape errors
    (lambda nn: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Linear(72, 2)),
     "sequential[2] is an nn.Linear right after a convolution (and its activation); put an nn.Flatten before it"),
    (lambda nn: nn.Sequential(nn.Flatten(), nn.Linear(4, 4), nn.Tanh(), nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten(),
                              nn.Linear(2, 2)), "sequential[3] is an nn.Conv2d after a Linear layer"),
])
def test_a_sequential_that_is_not_a_layer_stack_is_refused_in_one_line(build, expected):
    from torch import nn

    with pytest.raises(models.ModelConfigError) as err:
        models.layer_stack(build(nn))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_readme_sequential_example_runs():
    """The guide's own-loop example (your-model.md), as written there, on digits batches."""
    import re
    from pathlib import Path

    import torch
    from torch import nn

    from gradengines import tasks, trainers

    page = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "your-model.md").read_text()  # its page
    code = re.search(r"```python\n(net = nn\.Sequential.*?)```", page, re.S).group(1)
    task = tasks.build("digits")
    loader = [(task.train.inputs[i:i + 64], task.train.targets[i:i + 64]) for i in range(0, 256, 64)]
    scope = {"nn": nn, "torch": torch, "models": models, "trainers": trainers, "loader": loader}
    exec(code, scope)  # noqa: S102 - the README's example
    net = scope["net"]
    assert models.orthogonal.orthogonality_error(net[0]) < 1e-4 and net[0].weight.grad is not None
    # its engine's gradient on a batch: backprop's at the output layer, the same way but not backprop's below
    x, y = loader[0]
    loss_fn = torch.nn.functional.cross_entropy
    foton = engine_grads(scope["stack"], scope["engine"], x, y, loss_fn)
    exact = engine_grads(scope["stack"], trainers.build_engine("backprop"), x, y, loss_fn)
    for name in exact:
        if name.startswith("sequential.4."):
            torch.testing.assert_close(foton[name], exact[name], rtol=1e-5, atol=1e-7, msg=name)
        else:  # cosine 0.59-0.67 measured
            assert cosine(foton[name], exact[name]) > 0.3 and relative(foton[name], exact[name]) > 0.1, name


def test_the_user_bench_times_every_engine_on_user_and_zoo_models():
    import torch

    from gradengines.trainers.bench import bench_user

    rows = bench_user(steps=2, warmup=1, device=torch.device("cpu"), hidden=8, length=6, vocab=5, batch_size=4,
                      width=8, depth=3)
    assert [(r["model"].split()[0], r["trainer"]) for r in rows] == [
        ("gru", "backprop"), ("gru", "ftbptt"), ("gru", "dsf"), ("gru", "highway:k=2"),
        ("tanh", "backprop"), ("tanh", "foton"), ("tanh", "pepita"), ("tanh", "fa"), ("tanh", "dfa")]
    assert all(r["user_ms"] > 0 and r["zoo_ms"] > 0 and r["user_over_zoo"] > 0 for r in rows)
    assert all(r["user_ratio_to_backprop"] == 1 for r in rows if r["trainer"] == "backprop")


def test_a_users_model_is_built_once_per_run(tmp_path, capsys):
    """nanoGPT prints its parameter count in its constructor: once per run, not once more for the memory
    estimate."""
    from gradengines.trainers.cli import train_main

    (tmp_path / "talkative.py").write_text(
        "from torch import nn\n\n\nclass Net(nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))\n"
        "        print('number of parameters: 1210')\n")
    assert train_main(["--model", f"{tmp_path / 'talkative.py'}:Net", "--steps", "2", "--progress", "false",
                       "--logdir", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.count("number of parameters") == 1
