"""scripts/benchmarks/reference.py on a tiny row (two trainers, seconds): a run killed midway and resumed gives the
table the uninterrupted run gives, an engine that refuses the model gets its one-line reason, and the page is made
from the runs alone (another process, nothing but the folder)."""

import importlib.util
import json
from pathlib import Path

import pytest

from gradengines.trainers.run import trainer as trainer_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def reference(monkeypatch):
    """The script with one tiny row, its step timing fixed (fa's step 1.5x backprop's: two timings of the
    same code would differ by the machine's noise, and the budgets with them)."""
    def fixed(setups, reference, **_):
        ratios = {"backprop": 1.0, "fa": 1.5}
        return {"reference": reference, "rounds": 5, "warmup": 1, "machine": "fixed", "threads": {"count": 1,
                                                                                                  "reason": "test"},
                "trainers": {t: {"step_ms": 2.0 * ratios[t], "ratio": ratios[t], "ratio_min": ratios[t],
                                 "ratio_max": ratios[t], "ratio_low": ratios[t], "ratio_high": ratios[t],
                                 "ms_min": 0.0, "ms_max": 1e9, "batch_size": s.config.batch_size, "peak_mb": 1.0}
                             for t, s in setups.items()}}

    monkeypatch.setattr("gradengines.trainers.experiments.compare.time_steps", fixed)
    spec = importlib.util.spec_from_file_location("reference_script", ROOT / "scripts" / "benchmarks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROWS", {"tiny": (
        "a 2 x 8 tanh MLP on a teacher task, 4 steps",
        ["--model", "mlp", "--depth", "2", "--width", "8", "--task", "teacher", "--task-option", "n_train=64",
         "--task-option", "n_val=32", "--task-option", "n_test=40", "--task-option", "in_features=6",
         "--steps", "4", "--eval-every", "2", "--grad-agreement-every", "2", "--trainers", "backprop,fa"],
        ["--width", "64"])})
    monkeypatch.setattr(module, "COMMON", ["--tune", "--tune-grid", "lr=0.01,0.03", "--budget", "time", "--seeds",
                                           "0,1", "--timing-rounds", "5", "--progress", "false"])
    return module


def table(out: Path, module) -> list[str]:
    """The row's table as the page shows it (its figure drawn into the folder's own figures/)."""
    from gradengines.trainers.experiments.reference_page import results_page

    page = results_page(out, ["tiny"], module.ROWS, out / "figures")
    return [line for line in page.splitlines() if line.startswith("| ")]


@pytest.mark.renders_figures
def test_a_killed_row_resumes_to_the_uninterrupted_table_and_refusals_are_said(reference, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    assert reference.main(["run", "--out", str(straight)]) == 0
    rows = table(straight, reference)
    assert rows[1].startswith("| backprop |") and rows[2].startswith("| fa |") and "| reference |" in rows[1]
    assert "| dsf | — | refuses the model: trainer 'dsf' needs a model with recurrent layers" in "\n".join(rows)
    info = json.loads((straight / "tiny" / "reference.json").read_text())
    assert info["command"].startswith("compare.py --model mlp") and "tbptt" in info["refused"]
    assert (straight / "figures" / "results-tiny.png").read_bytes()[:4] == b"\x89PNG"

    killed = tmp_path / "killed"
    real, calls = trainer_module.Trainer.train_step, []

    def interrupted(self, x, y):
        calls.append(1)
        if len(calls) == 11:  # midway: in the second trainer's tuning or its seeds
            raise KeyboardInterrupt
        return real(self, x, y)

    monkeypatch.setattr(trainer_module.Trainer, "train_step", interrupted)
    assert reference.main(["run", "--out", str(killed)]) == 130
    assert not (killed / "tiny" / "reference.json").exists()
    monkeypatch.setattr(trainer_module.Trainer, "train_step", real)
    assert reference.main(["run", "--out", str(killed)]) == 0
    assert table(killed, reference) == rows


def test_the_gpu_command_is_the_same_row_larger(reference, tmp_path, capsys):
    assert reference.main(["run", "--out", str(tmp_path), "--device", "cuda", "--size", "gpu", "--dry-run"]) == 0
    said = capsys.readouterr().err
    assert "reference: row 1 of 1: tiny (0 after it)" in said and "--width 64" in said and "--device cuda" in said
    assert not (tmp_path / "tiny").exists()
    assert reference.main(["run", "--rows", "nope"]) == 2 and "error: --rows: no row nope" in capsys.readouterr().err


def test_seeds_auto_adds_seeds_while_a_word_is_undecided(tmp_path, monkeypatch):
    """--seeds auto: 3 seeds, then one more for every trainer while one is undecided at equal samples, here until
    the bound (a verdict stubbed to stay undecided), or not at all where every word is decided."""
    from gradengines.trainers.cli import compare as compare_cli

    asked = []

    def always(out_dir, names, reference):
        asked.append(sorted(p.name for p in (out_dir / "fa").iterdir()))
        return ["fa"]

    monkeypatch.setattr(compare_cli, "undecided_runs", always)
    monkeypatch.setattr(compare_cli, "SEEDS_AUTO", (3, 5))
    flags = ["--model", "mlp", "--depth", "2", "--width", "8", "--task", "teacher", "--task-option", "n_train=64",
             "--task-option", "n_val=32", "--task-option", "n_test=32", "--steps", "2", "--trainers", "backprop,fa",
             "--seeds", "auto", "--timing-rounds", "5", "--progress", "false", "--logdir", str(tmp_path)]
    assert compare_cli.compare_main([*flags, "--experiment", "undecided"]) == 0
    assert asked == [["seed0", "seed1", "seed2"], ["seed0", "seed1", "seed2", "seed3"]]
    assert sorted(p.name for p in (tmp_path / "undecided" / "backprop").iterdir()) == [f"seed{i}" for i in range(5)]
    monkeypatch.setattr(compare_cli, "undecided_runs", lambda *_: [])
    assert compare_cli.compare_main([*flags, "--experiment", "decided"]) == 0
    assert sorted(p.name for p in (tmp_path / "decided" / "fa").iterdir()) == ["seed0", "seed1", "seed2"]


@pytest.mark.parametrize("task_name", ["teacher", "ptb-word"])
def test_each_test_example_s_share_adds_up_to_the_test_metric(tmp_path, task_name):
    """result.json's test_outcomes: per test example, its correct targets (accuracy) or summed token loss
    (perplexity), and its counted targets; summed, they are the split's test metric."""
    import math

    from helpers import write_tiny_ptb

    from gradengines import models, tasks, trainers

    if task_name == "ptb-word":
        write_tiny_ptb(tmp_path, lines=(60, 12, 12), words_per_line=8)
        task = tasks.build("ptb-word", data_dir=tmp_path, seq_len=8)
        torch_model = models.build("rnn_lm", in_features=8, out_features=task.num_outputs, hidden=8)
    else:
        task = tasks.build("teacher", n_train=64, n_val=16, n_test=24, in_features=6)
        torch_model = models.build("mlp", in_features=task.in_features, out_features=task.num_outputs)
    trainer = trainers.Trainer(torch_model, trainers.build_engine("backprop"), task, logdir=tmp_path, progress=False,
                               batch_size=8)
    report = trainer.fit(steps=3)
    record = json.loads((trainer.run_dir / "result.json").read_text())
    values, counts = record["test_outcomes"]["values"], record["test_outcomes"]["counts"]
    assert len(values) == len(counts) == len(task.test)
    share = sum(values) / sum(counts)
    if task.metric_name == "perplexity":
        assert math.exp(share) == pytest.approx(report["test"]["perplexity"], rel=1e-5)
    else:
        assert share == pytest.approx(report["test"]["accuracy"], abs=1e-12)


def test_no_reference_row_runs_a_placeholder_setting():
    """Issue 62, item 4: every value a reference row takes from a recipe names a paper, the authors' code or a
    measurement; the one value recipes leave to tuning (a learning rate no paper gives for the model) is tuned by
    every row (its grid over lr), so no row trains at a "tune it" value. Read from the rows' own flags (no data)."""
    from gradengines.trainers.core.registry import available
    from gradengines.trainers.experiments.recipes import recipe_for
    from gradengines.trainers.experiments.tuning import parse_grid, trainer_grid

    spec = importlib.util.spec_from_file_location("reference_rows", ROOT / "scripts" / "benchmarks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    placeholders = ("tune it", "not published for these models")
    assert "--tune" in module.COMMON
    untuned = [(t, k) for t in available() for r in [recipe_for(t, "mlp")] if r for k, s in r.sources().items()
               if any(p in s for p in placeholders)]
    assert not untuned  # the default comparison's model: measured everywhere
    for row, (_, flags, _) in module.ROWS.items():
        model = flags[flags.index("--model") + 1]
        grids = [flags[i + 1] for i, f in enumerate(flags) if f == "--tune-grid"]
        for trainer in available():
            recipe = recipe_for(trainer, model)
            if recipe is None:
                continue
            tuned = set(trainer_grid(parse_grid(grids, [trainer]), trainer, 1e-3))
            assert "lr" in tuned
            for key, source in recipe.sources().items():
                assert key in tuned or not any(p in source for p in placeholders), (row, trainer, key, source)
    fgrad = recipe_for("fgrad", "rnn_lm").sources()
    assert any(p in fgrad["lr"] for p in placeholders) and not any(p in fgrad["optimizer"] for p in placeholders)


def test_an_engine_refusing_on_its_first_step_is_left_out_with_its_reason(reference, tmp_path, monkeypatch):
    """An engine that accepts the model's structure but refuses on its first step (forward-mode AD through a fused
    LSTM kernel, for fgrad) stopped the whole row; now it is left out before the row runs, with its one line, and
    the others are compared."""
    import gradengines
    from gradengines.models.errors import ModelConfigError
    from gradengines.trainers.engines.backprop import Backprop

    class Refuser(Backprop):
        name = "refuser"

        def compute_grads(self, model, inputs, targets, loss_fn):
            raise ModelConfigError("trainer 'refuser' needs an operation this model does not have")

    gradengines.register_engine(Refuser)
    monkeypatch.setattr("gradengines.trainers.cli.args.trainers_for",
                        lambda model, task: (["backprop", "refuser", "fa"], {"dsf": "trainer 'dsf' needs more"}))
    what, flags, gpu = reference.ROWS["tiny"]
    monkeypatch.setitem(reference.ROWS, "tiny", (what, flags[:flags.index("--trainers")], gpu))
    out = tmp_path / "runs"
    assert reference.main(["run", "--out", str(out)]) == 0
    info = json.loads((out / "tiny" / "reference.json").read_text())
    assert info["command"].endswith("--trainers backprop,fa")
    assert info["refused"]["refuser"] == "trainer 'refuser' needs an operation this model does not have"
    rows = table(out, reference)
    assert "| refuser | — | refuses the model: trainer 'refuser' needs an operation this model does not have |" \
        in "\n".join(rows)
    assert sorted(p.name for p in (out / "tiny").iterdir() if (p / "seed0").is_dir()) == ["backprop", "fa"]
