"""Command-line behaviour: bad input -> one line + exit 2 and nothing written;
the comparison writes TensorBoard runs with the agreed tags, a table and a PNG."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from gradengines import trainers
from gradengines.trainers.cli import compare_main, table_main, train_main
from gradengines.trainers.core.engine import GradientEngine
from gradengines.trainers.core.protocols import LayerStack, require
from gradengines.trainers.experiments.plots import plot_runs
from gradengines.trainers.experiments.results import collect_results, pivot_cells
from gradengines.trainers.experiments.summary import pivot_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def layer_stack_engine():
    """A registered engine that, like FOTON, accepts only layer stacks."""

    class NeedsLayerStack(GradientEngine):
        def check(self, model):
            require(model, LayerStack, "needs-stack", "a stack of linear layers", "mlp")

        def compute_grads(self, model, inputs, targets, loss_fn):
            raise AssertionError("only checked")

    trainers.register_engine("needs-stack")(NeedsLayerStack)
    return "needs-stack"  # forgotten after the test (tests/conftest.py)


BAD_INPUTS = {
    "unknown trainer": (["--trainer", "nope"], "unknown trainer 'nope'"),
    "unknown model": (["--model", "nope"], "unknown model 'nope'"),
    "unknown task": (["--task", "nope"], "unknown task 'nope'"),
    "negative lr": (["--lr", "-0.5"], "--lr must be >= 0"),
    "missing data dir": (["--task", "mnist", "--data-dir", "/no/such/dir"], "does not exist"),
    "missing data file": (["--task", "mnist", "--data-dir", "{tmp}"], "train-images-idx3-ubyte"),
    "shape mismatch": (["--in-features", "10"], "does not accept the inputs of task 'digits'"),
    "bad activation": (["--activation", "swish"], "unknown activation 'swish'"),
    "bad orthogonal": (["--orthogonal", "qr"], "qr"),
    "unknown task option": (["--task", "teacher", "--task-option", "nope=1"], "'nope'"),
    "malformed task option": (["--task-option", "n_train"], "KEY=VALUE"),
    "negative steps": (["--steps", "-3"], "at least one step"),
    "precision against dtype": (["--precision", "64", "--dtype", "float32"],
                                "--precision 64 is float64 throughout; --dtype float32 asks for float32"),
    "dtype against precision": (["--precision", "32", "--dtype", "float64"], "--precision 32 keeps float32"),
    "an eps no parameter feels": (["--trainer", "mezo", "--mezo-eps", "1e-300"],
                                  "--mezo-eps 1e-300 moves no parameter in float32: eps x z is below"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path, capsys):
    flags, expected = BAD_INPUTS[case]
    data = tmp_path / "data"
    data.mkdir()
    logdir = tmp_path / "runs"
    flags = [f.format(tmp=data) for f in flags]
    code = train_main([*flags, "--logdir", str(logdir), "--epochs", "1", "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err
    assert not logdir.exists()


def test_incompatible_trainer_and_model(layer_stack_engine, tmp_path, capsys):
    code = train_main(["--trainer", layer_stack_engine, "--model", "residual_mlp", "--logdir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "needs a stack of linear layers" in err and "qualify: mlp" in err
    assert not (tmp_path / "r").exists()


def test_compare_refuses_before_any_run(layer_stack_engine, tmp_path, capsys):
    code = compare_main(["--trainers", f"backprop,{layer_stack_engine}", "--model", "residual_mlp",
                         "--logdir", str(tmp_path / "r"), "--epochs", "1", "--progress", "false"])
    assert code == 2
    assert not (tmp_path / "r").exists()


def test_script_exit_code_through_a_real_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--trainer", "nope",
                           "--logdir", str(tmp_path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    expected = ("error: unknown trainer 'nope'; available: " + ", ".join(trainers.available())
                + "; or your own engine, FILE.py:Class or module:Class")
    assert proc.stderr.strip().splitlines() == [expected]
    help_text = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--help"],
                               capture_output=True, text=True, env=env).stdout
    for name in ("backprop", "mlp", "residual_mlp", "digits", "teacher", "mnist"):
        assert name in help_text


def test_nan_loss_exits_1(tmp_path, capsys):
    code = train_main(["--lr", "1e9", "--optimizer", "sgd", "--momentum", "0", "--activation", "relu",
                       "--depth", "3", "--epochs", "3", "--logdir", str(tmp_path), "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 1 and "loss is" in err and "training stopped" in err


@pytest.mark.renders_figures
def test_default_compare_writes_runs_tags_table_and_png(tmp_path, monkeypatch, capsys):
    """``scripts/compare.py`` with no arguments: the embedded comparison on digits (2 epochs instead of its 30 and
    5 timing rounds instead of 30: what it writes does not depend on how long it trains)."""
    from gradengines.trainers.cli import compare

    monkeypatch.setitem(compare.DEFAULT_COMPARISON, "epochs", 2)
    monkeypatch.setitem(compare.DEFAULT_COMPARISON, "timing_rounds", 5)
    monkeypatch.chdir(tmp_path)
    assert compare_main([]) == 0
    exp = tmp_path / "runs" / "compare-digits"
    trainer_names = [p.name for p in exp.iterdir() if p.is_dir()]
    # all that take the MLP
    assert sorted(trainer_names) == ["backprop", "brsf", "dfa", "fa", "fgrad", "fgrad_act", "foton", "frsf", "mezo",
                                     "pepita", "usf"]
    summary = (exp / "summary.md").read_text()
    assert "| backprop | 3 |" in summary and "digits" in summary
    # the alignment table has the four rules with a per-layer feedback, and says why DFA has no row
    aligned = summary[summary.index("## Alignment of the feedback"):].split("\n## ")[0]
    assert "dfa has no row" in aligned and all(f"| {rule} |" in aligned for rule in ("fa", "usf", "brsf", "frsf"))
    assert "| dfa |" not in aligned
    png = (exp / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for seed in (0, 1, 2):
        run = exp / "backprop" / f"seed{seed}"
        # one run per (experiment, trainer, seed): no sub-runs (add_scalars or hparams timestamps)
        assert not [p for p in run.iterdir() if p.is_dir()]
        acc = EventAccumulator(str(run))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        expected = {"train/loss", "eval/loss", "eval/accuracy", "grad/cosine_global", "time/step_ms",
                    "time/samples_per_s", "memory/process_peak_mb", "engine/orthogonality_error",
                    "grad/cosine/layers.0.weight", "grad/rel_error/layers.3.bias", "test/accuracy"}
        assert expected <= tags, expected - tags
        cos = [e.value for e in acc.Scalars("grad/cosine_global")]
        assert cos and all(abs(c - 1) < 1e-5 for c in cos)
        assert max(e.value for e in acc.Scalars("engine/orthogonality_error")) < 1e-5
        start = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
        assert hparams["_trainer"].string_value == "backprop" and hparams["seed"].number_value == seed
        lines = (run / "metrics.jsonl").read_text().splitlines()
        assert lines and all(line.startswith('{"step": ') for line in lines)
    for trainer in ("fa", "dfa"):  # the contrast: their logged agreement is not backprop's 1
        acc = EventAccumulator(str(exp / trainer / "seed0"))
        acc.Reload()
        cos = [e.value for e in acc.Scalars("grad/cosine_global")]
        assert cos and max(cos) < 0.999, (trainer, cos)
    assert "tensorboard --logdir" in capsys.readouterr().out


def test_train_with_task_options_writes_a_complete_run(tmp_path, capsys):
    code = train_main(["--task", "teacher", "--task-option", "n_train=128", "--task-option", "in_features=8",
                       "--steps", "6", "--logdir", str(tmp_path), "--experiment", "e", "--progress", "false",
                       "--checkpoint-every", "3"])
    assert code == 0
    run = tmp_path / "e" / "backprop" / "seed0"
    assert {"checkpoint.pt", "metrics.jsonl", "result.json"} <= {p.name for p in run.iterdir()}
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.renders_figures
def test_run_name_and_results_table(tmp_path, capsys):
    common = ["--task", "teacher", "--task-option", "n_train=128", "--steps", "4", "--logdir", str(tmp_path),
              "--progress", "false", "--seeds", "0,1", "--experiment", "exp/d2"]
    assert compare_main([*common, "--trainers", "backprop"]) == 0
    assert compare_main([*common, "--trainers", "backprop", "--run-name", "bp-plain", "--width", "8"]) == 0
    assert compare_main([*common, "--trainers", "backprop,backprop", "--run-name", "x"]) == 2
    summary = (tmp_path / "exp" / "d2" / "summary.md").read_text()  # covers both calls' runs
    assert "| backprop | 2 |" in summary and "| bp-plain | 2 |" in summary
    rows = collect_results(tmp_path)
    assert {(r["experiment"], r["run"]) for r in rows} == {("exp/d2", "backprop"), ("exp/d2", "bp-plain")}
    assert [r["model"]["width"] for r in rows if r["run"] == "bp-plain"] == [8, 8]
    table = pivot_table(rows, columns=["backprop", "bp-plain"])
    assert table.splitlines()[0] == "| experiment | backprop | bp-plain |"
    assert table.splitlines()[2].startswith("| exp/d2 | ") and table.count("(2)") == 2
    cells, experiments, runs = pivot_cells(rows, columns=["bp-plain", "backprop"])
    assert experiments == ["exp/d2"] and runs == ["bp-plain", "backprop"]
    assert cells[("exp/d2", "backprop")] == [r["test"][r["metric"]] for r in rows if r["run"] == "backprop"]
    plot_runs(cells, experiments, runs, "test accuracy", tmp_path / "k.png")
    assert (tmp_path / "k.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert table_main([str(tmp_path), "--value", "best_val"]) == 0  # the table says which metric it shows
    assert capsys.readouterr().out.startswith("best validation accuracy: mean ± std over seeds (seeds)\n\n| experiment")


def test_a_step_s_peak_memory_on_the_cpu_is_its_largest_live_extra_allocation():
    """``peak_step_memory_mb`` on the CPU: the most bytes a call held at once above what was allocated before it
    (4 MB + 4 MB, one freed, then 2 MB: 8 MB; a tensor allocated before the call is not counted); a backward
    holds every gradient it writes and, at its peak, the activations it still reads (per-op records lost those)."""
    import torch

    from gradengines.models import build
    from gradengines.trainers.bench import peak_step_memory_mb

    cpu, mib = torch.device("cpu"), 2**20
    held = torch.empty(2_000_000)

    def step():
        first, second = torch.empty(mib), torch.empty(mib)
        del first
        return second, torch.empty(mib // 2), held.add_(1.0)

    assert peak_step_memory_mb(step, cpu) == pytest.approx(8.0)
    model = build("mlp", in_features=64, out_features=10, depth=4, width=128, orthogonal="bjorck")
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    gradients = sum(p.numel() * p.element_size() for p in model.parameters()) / mib
    activation = 32 * 128 * 4 / mib  # one hidden layer's output, held while the backward writes the gradients
    peaks = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        peaks.append(peak_step_memory_mb(lambda: torch.nn.functional.cross_entropy(model(x), y).backward(), cpu))
    assert peaks[0] == peaks[1] and gradients + activation <= peaks[0] < 2 * gradients


def test_bench_writes_json_and_markdown_for_each_suite(tmp_path, capsys):
    import json

    from gradengines.trainers.cli import bench_main

    out = tmp_path / "bench"
    assert bench_main(["--suite", "engines", "--trainers", "backprop;foton;foton:mode=lowmem", "--depths", "2",
                       "--widths", "8", "--batch-size", "4", "--steps", "20", "--warmup", "1",
                       "--out", str(out)]) == 0
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [r["trainer"] for r in rows] == ["backprop", "foton", "foton:mode=lowmem"]
    assert rows[0]["ratio_to_backprop"] == 1.0 and all(r["step_ms"] > 0 and r["grads_peak_mb"] > 0 for r in rows)
    assert "| backprop | 2 | 8 |" in (out / "bench.md").read_text()
    assert bench_main(["--suite", "scan", "--lengths", "8", "--steps", "20", "--out", str(out)]) == 0
    forms = [r["form"] for r in json.loads((out / "bench.json").read_text())["rows"]]
    assert forms == ["sequential", "hillis_steele", "chunked", "fft", "authors_dense_loop"]
    assert bench_main(["--suite", "engines", "--trainers", "nope", "--out", str(out)]) == 2
    assert bench_main(["--steps", "5", "--out", str(out)]) == 2


def test_bench_recurrent_suite_times_every_trainer_and_the_loop_baseline(tmp_path):
    import json

    from gradengines.trainers.cli import bench_main

    out = tmp_path / "bench"
    assert bench_main(["--suite", "recurrent", "--recurrent-depths", "1,2", "--lengths", "6", "--hidden", "8",
                       "--recurrent-batch-size", "3", "--vocab", "5", "--steps", "20", "--warmup", "1",
                       "--out", str(out)]) == 0
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [(r["trainer"], r["depth"]) for r in rows] == [
        (t, d) for d in (1, 2) for t in ("backprop", "ftbptt", "dsf", "bptt_loop")]
    assert all(r["step_ms"] > 0 and r["grads_peak_mb"] > 0 for r in rows)
    assert rows[0]["speedup_over_backprop"] == 1.0


def test_bench_residual_suite_times_highway_against_backprop(tmp_path):
    import json

    from gradengines.trainers.cli import bench_main

    out = tmp_path / "bench"
    assert bench_main(["--suite", "residual", "--residual-depth", "3", "--widths", "6", "--batch-size", "4",
                       "--steps", "20", "--warmup", "1", "--out", str(out)]) == 0
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [r["trainer"] for r in rows] == ["backprop"] + [f"highway:k={k},path={p}"
                                                           for p in ("batched", "reference") for k in (0, 5, 10)]
    assert all(r["depth"] == 3 and r["step_ms"] > 0 for r in rows) and rows[0]["ratio_to_backprop"] == 1.0
    assert bench_main(["--suite", "residual", "--trainers", "highway:k=-1", "--out", str(out)]) == 2


def test_gpt_and_resnet_flags_reach_the_model(tmp_path):
    from gradengines.trainers.cli import train_main

    assert train_main(["--model", "resnet", "--variant", "post", "--depth", "8", "--width", "2", "--steps", "1",
                       "--batch-size", "4", "--progress", "false", "--logdir", str(tmp_path / "a")]) == 0
    assert train_main(["--model", "resnet", "--depth", "10", "--steps", "1", "--logdir", str(tmp_path / "b")]) == 2
    assert train_main(["--model", "gpt", "--task", "copy", "--split-gamma", "2", "--steps", "1",
                       "--logdir", str(tmp_path / "c")]) == 2


def test_recurrent_model_flags_reach_the_model(tmp_path, capsys):
    flags = ["--model", "rnn_lm", "--task", "adding", "--task-option", "length=6", "--task-option", "n_train=8",
             "--task-option", "n_val=4", "--task-option", "n_test=4", "--input-dim", "2", "--cell", "lstm",
             "--hidden", "5", "--depth", "2", "--steps", "1", "--batch-size", "4", "--progress", "false",
             "--logdir", str(tmp_path / "r")]
    assert train_main(["--trainer", "dsf", *flags]) == 0
    import json

    model = json.loads(next((tmp_path / "r").rglob("result.json")).read_text())["model"]
    assert (model["name"], model["cell"], model["depth"], model["input_dim"]) == ("rnn_lm", "lstm", 2, 2)
    assert train_main(["--trainer", "dsf", *flags, "--per-step", "maybe", "--overwrite"]) == 2
    assert "--per-step must be true or false" in capsys.readouterr().err


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    """A real process killed with SIGKILL mid-run (at step 23 of 40, by itself: conftest.train_signalled_at, so
    on any machine): its last checkpoint (step 20) loads, and --resume ends with the same metrics as a run that was
    never interrupted."""
    import json

    import torch
    from conftest import train_signalled_at

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    flags = ["--task", "teacher", "--task-option", "n_train=512", "--task-option", "in_features=16",
             "--width", "32", "--depth", "4", "--batch-size", "32", "--steps", "40", "--checkpoint-every", "5",
             "--eval-every", "10", "--progress", "false", "--experiment", "e"]
    run = tmp_path / "killed" / "e" / "backprop" / "seed0"
    killed = subprocess.run([sys.executable, train_signalled_at(tmp_path, 23, "SIGKILL"), *flags, "--logdir",
                             str(tmp_path / "killed")], env=env, capture_output=True, timeout=300)  # a hang guard
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 20  # still a whole file
    # the resume and the uninterrupted run in this process (only the killed run needs its own)
    assert train_main([*flags, "--logdir", str(tmp_path / "killed"), "--resume"]) == 0
    assert train_main([*flags, "--logdir", str(tmp_path / "whole")]) == 0

    def records(root):
        lines = (root / "e" / "backprop" / "seed0" / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "memory/"))}
                for line in lines]

    assert records(tmp_path / "killed") == records(tmp_path / "whole")
    result = lambda root: json.loads((root / "e" / "backprop" / "seed0" / "result.json").read_text())["test"]  # noqa: E731
    assert result(tmp_path / "killed") == result(tmp_path / "whole")


def test_compare_names_its_experiment_after_the_task(tmp_path):
    assert compare_main(["--trainers", "backprop", "--task", "teacher", "--steps", "1", "--seeds", "0",
                         "--logdir", str(tmp_path), "--progress", "false"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["compare-teacher-backprop"]  # trainers/cli/names.py
    assert (tmp_path / "compare-teacher-backprop" / "summary.md").exists()


def test_round_robin_ratios_survive_a_burst_of_load():
    """Three steps costing 1, 2 and 0.5 units on a fake clock; the machine runs 5x slower for a
    stretch. Timed one after another, the burst lands on one step and its ratio to backprop is off
    by about 5x; round-robin, every ratio (the median over rounds) is exact."""
    import torch

    from gradengines.trainers.bench import time_round_robin

    class Machine:
        def __init__(self):
            self.now = 0.0

        def clock(self):
            return self.now

        def work(self, cost):
            slow = 5.0 if 40.0 <= self.now < 400.0 else 1.0  # the burst
            self.now += cost * slow

    costs = {"backprop": 1.0, "slow": 2.0, "fast": 0.5}
    machine = Machine()
    steps = {name: (lambda c=cost: machine.work(c)) for name, cost in costs.items()}
    timed = time_round_robin(steps, timed=40, rounds=20, warmup=1, device=torch.device("cpu"), clock=machine.clock)
    for name, cost in costs.items():
        assert timed[name]["ratio_to_baseline"] == pytest.approx(cost / costs["backprop"], rel=1e-12)
        assert timed[name]["ratio_min"] <= timed[name]["ratio_to_baseline"] <= timed[name]["ratio_max"]
    # the same machine, one step after another: the burst distorts the ratio of the one it hits
    machine.now = 0.0
    sequential = {}
    for name in costs:
        sequential[name] = time_round_robin({name: steps[name]}, timed=40, rounds=1, warmup=1,
                                            device=torch.device("cpu"), clock=machine.clock)[name]["step_ms"]
    assert sequential["slow"] / sequential["backprop"] > 1.5 * costs["slow"] / costs["backprop"]


def test_bench_grads_suite_times_compute_grads_alone(tmp_path):
    import json

    from gradengines.trainers.cli import bench_main

    out = tmp_path / "b"
    assert bench_main(["--suite", "grads", "--trainers", "backprop;foton:mode=jvp;dfa", "--depths", "3",
                       "--widths", "8", "--batch-size", "4", "--steps", "20", "--warmup", "1", "--dropout", "0.1",
                       "--out", str(out)]) == 0
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [r["trainer"] for r in rows] == ["backprop", "foton:mode=jvp", "dfa", "bare forward-only pass"]
    assert all(r["dropout"] == 0.1 for r in rows)
    assert bench_main(["--suite", "grads", "--dropout", "1.0", "--out", str(out)]) == 2
    assert rows[0]["ratio_to_backprop"] == 1.0 and all(r["grads_ms"] > 0 for r in rows)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_bare_forward_only_pass_computes_fotons_gradients(dropout):
    """The grads suite's floor computes what foton's difference rule writes (float64, biases included), with
    dropout the same masks from the same RNG state (one draw per layer in both)."""
    import torch
    import torch.nn.functional as F

    from gradengines import models
    from gradengines.trainers.bench import bare_forward_only

    torch.manual_seed(0)
    model = models.build("mlp", in_features=6, out_features=4, depth=4, width=6, activation="tanh",
                         orthogonal="bjorck", dropout=dropout).double()
    x, y = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 1])
    torch.manual_seed(1)
    trainers.build_engine("foton").compute_grads(model, x, y, F.cross_entropy)
    torch.manual_seed(1)
    bare = bare_forward_only(model, x, y)
    assert len(bare) == len(list(model.parameters()))
    for p, g in zip(model.parameters(), bare, strict=True):
        assert torch.allclose(p.grad, g, atol=1e-12, rtol=0)
    torch.manual_seed(2)
    other = bare_forward_only(model, x, y)
    assert (dropout > 0) == any(not torch.allclose(a, b) for a, b in zip(bare, other, strict=True))


def test_a_python_without_the_project_is_told_which_python_in_one_line():
    """The README's commands use .venv/bin/python; a plain python without the project (here: one without its site
    directory) gets one line naming itself and the environment to use, exit 2, not a traceback."""
    done = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / "train.py"), "--help"], capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and ".venv/bin/python (made by bash scripts/setup.sh)" in done.stderr


def test_a_file_size_limit_of_zero_at_start_is_one_line():
    """With every write refused (ulimit -f 0) the libraries fail while they load (tempfile finds no usable
    directory): one line saying so and what to check, exit 2, not a traceback through the import machinery."""
    import resource

    def no_writes():
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), "--steps", "1"], capture_output=True,
                          text=True, preexec_fn=no_writes, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: cannot start: ") and "file-size limit (ulimit -f)" in done.stderr
