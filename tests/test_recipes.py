"""Recipes (trainers/experiments/recipes.py): every trainer's published settings, applied by compare.py by
default, overridden by flags, recorded per run and shown in summary.md."""

import dataclasses
import json

import pytest

from gradengines.trainers.cli import DEFAULT_COMPARISON, compare_main, train_main
from gradengines.trainers.core.options import parse_options
from gradengines.trainers.core.registry import engine_class
from gradengines.trainers.experiments.recipes import RECIPES, recipe_for
from gradengines.trainers.experiments.summary import failure_notes, settings_table
from gradengines.trainers.run.config import TrainConfig

QUICK = ["--experiment", "compare-digits",
         "--steps", "4", "--eval-every", "2", "--seeds", "0", "--grad-agreement-every", "0", "--progress", "false"]


def result(root, run, seed=0, experiment="compare-digits"):
    return json.loads((root / experiment / run / f"seed{seed}" / "result.json").read_text())


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{r.trainer}-{'-'.join(r.models) or 'any'}")
def test_every_recipe_value_is_a_valid_option_with_a_source(recipe):
    parse_options(TrainConfig, recipe.train_values())
    parse_options(engine_class(recipe.trainer).Options, recipe.engine_values())
    assert recipe.sources() and all(isinstance(s, str) and len(s) > 10 for s in recipe.sources().values())


def test_recipes_pick_the_most_specific_and_published_values():
    assert recipe_for("dsf", "rnn_lm").train_values() == {"optimizer": "adam", "lr": 1e-3, "weight_decay": 1e-4,
                                                          "batch_size": 128}
    assert recipe_for("dsf", "rnn_lm").engine_values() == {"feedback": "linspace"}
    assert recipe_for("backprop", "rnn_lm").train == recipe_for("dsf", "rnn_lm").train  # same as its baseline
    assert recipe_for("backprop", "resnet").train_values()["optimizer"] == "sgd"
    assert recipe_for("backprop", "mlp").train_values()["optimizer"] == "adam"  # the generic one
    assert recipe_for("pepita", "mlp").train_values() == {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9,
                                                          "weight_decay": 0.0, "batch_size": 64}
    assert recipe_for("foton", "mlp").train_values()["lr"] == 0.5
    assert recipe_for("dsf", "mlp") is None  # DSF trains recurrent models only


PLACEHOLDERS = ("tune it", "not published for these models")


def test_the_default_comparison_runs_every_trainer_at_a_published_or_measured_setting():
    """No placeholder in the default comparison (issue 62): every trainer the default model allows takes a recipe
    whose every source is a paper, the authors' code or a measurement (a tuning on validation, with its command),
    never "not published: tune it"."""
    from gradengines.trainers.cli.args import build_from_args, trainers_for
    from gradengines.trainers.cli.compare import compare_parser

    args = compare_parser([]).parse_args([])
    probe = build_from_args(args, "backprop", 0)
    found, _ = trainers_for(probe.model, probe.task)
    assert {"fgrad", "fgrad_act", "mezo", "backprop"} <= set(found)
    for trainer in found:
        recipe = recipe_for(trainer, DEFAULT_COMPARISON["model"])
        assert recipe is not None, trainer
        for key, source in recipe.sources().items():
            assert not any(p in source for p in PLACEHOLDERS), (trainer, key, source)
    assert recipe_for("fgrad", "mlp").train_values()["lr"] == pytest.approx(10 ** -2.5)  # the tuning's value
    assert any(p in recipe_for("fgrad", "convnet").sources()["lr"] for p in PLACEHOLDERS)  # not measured there


def test_the_default_comparison_sets_no_recipe_key():
    """A default entry would look like a user's flag and silently replace every recipe's value."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    recipe_keys = {k for r in RECIPES for k in r.train}
    assert not (set(DEFAULT_COMPARISON) & fields & recipe_keys)


def test_compare_uses_each_recipe_and_flags_override_it(tmp_path):
    root = tmp_path / "r"
    assert compare_main(["--trainers", "backprop,pepita", "--logdir", str(root), *QUICK]) == 0
    pepita, backprop = result(root, "pepita"), result(root, "backprop")
    assert {k: pepita["config"][k] for k in ("optimizer", "lr", "momentum", "batch_size")} == {
        "optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "batch_size": 64}
    assert pepita["engine"]["pepita.variant"] == "iclr2024"
    assert pepita["settings"]["mode"] == "recipe" and "Srinivasan" in pepita["settings"]["recipe"]["lr"]
    assert backprop["config"]["optimizer"] == "adam" and backprop["config"]["lr"] == pytest.approx(10 ** -2.5)
    summary = (root / "compare-digits" / "summary.md").read_text()
    assert "| pepita | sgd | 0.01 | 0.9 | 0 | 64 |" in summary and "Srinivasan" in summary

    flags = ["--lr", "0.05", "--pepita-feedback-scale", "0.1", "--batch-size", "32"]
    assert compare_main(["--trainers", "pepita", "--logdir", str(root), *QUICK, *flags, "--experiment", "o"]) == 0
    over = result(root, "pepita", experiment="o")
    assert (over["config"]["lr"], over["config"]["batch_size"], over["config"]["momentum"]) == (0.05, 32, 0.9)
    assert over["engine"]["pepita.feedback_scale"] == 0.1 and over["engine"]["pepita.variant"] == "iclr2024"
    assert over["settings"]["overridden"] == ["batch_size", "lr", "pepita.feedback_scale"]
    assert "lr" not in over["settings"]["recipe"] and "momentum" in over["settings"]["recipe"]
    assert "flags replaced batch_size, lr, pepita.feedback_scale" in (root / "o" / "summary.md").read_text()


def test_shared_settings_give_every_trainer_the_defaults(tmp_path):
    root = tmp_path / "r"
    assert compare_main(["--trainers", "pepita", "--settings", "shared", "--logdir", str(root), *QUICK]) == 0
    run = result(root, "pepita")
    defaults = TrainConfig()
    assert (run["config"]["optimizer"], run["config"]["lr"], run["config"]["batch_size"]) == (
        defaults.optimizer, defaults.lr, defaults.batch_size)
    assert run["settings"] == {"mode": "shared", "recipe": {}, "overridden": [],
                               "engine": {"source": "built in", "class": "Pepita"}}
    assert "shared defaults" in (root / "compare-digits" / "summary.md").read_text()


def test_train_py_takes_the_recipe_when_asked(tmp_path):
    common = ["--trainer", "foton", "--orthogonal", "bjorck", "--activation", "tanh", "--width", "16",
              "--steps", "2", "--progress", "false", "--logdir", str(tmp_path)]
    assert train_main([*common, "--experiment", "shared"]) == 0
    assert train_main([*common, "--experiment", "recipe", "--settings", "recipe"]) == 0
    shared, recipe = (result(tmp_path, "foton", experiment=e) for e in ("shared", "recipe"))
    assert shared["config"]["optimizer"] == "adam" and shared["settings"]["mode"] == "shared"
    assert (recipe["config"]["optimizer"], recipe["config"]["lr"], recipe["config"]["batch_size"]) == ("sgd", 0.5, 256)


def _runs(best, final, metric="accuracy", step=10):
    return [{"report": {"best_val": {metric: b}, "final_val": {metric: f}, "best_step": step}}
            for b, f in zip(best, final, strict=True)]


def test_failure_notes_explain_collapse_and_chance_and_stay_quiet_otherwise():
    results = {"ok": _runs([0.95, 0.96], [0.94, 0.96]), "collapsed": _runs([0.51, 0.49], [0.24, 0.10]),
               "chance": _runs([0.11, 0.12], [0.10, 0.11])}
    notes = failure_notes(results, "accuracy", chance=0.1)
    assert len(notes) == 2 and all("\n" not in n for n in notes)
    assert notes[0].startswith("- collapsed: validation accuracy peaked at 0.5000") and "ended at 0.1700" in notes[0]
    assert notes[1].startswith("- chance: never above chance level")
    ppl = {"fine": _runs([120.0], [125.0], "perplexity"), "diverged": _runs([150.0], [400.0], "perplexity")}
    assert [n.split(":")[0] for n in failure_notes(ppl, "perplexity")] == ["- diverged"]


def test_settings_table_lists_engine_options_and_sources():
    report = {"config": {**dataclasses.asdict(TrainConfig()), "optimizer": "sgd", "lr": 0.5, "momentum": 0.0},
              "engine": {"trainer": "foton", "foton.temperature": 4.0},
              "settings": {"mode": "recipe", "recipe": {"optimizer": "FOTON code", "lr": "FOTON code"},
                           "overridden": ["foton.temperature"]},
              "best_val": {}, "final_val": {}}
    table = settings_table({"foton-T4": [{"report": report}]})
    row = table.splitlines()[2]
    assert row.startswith("| foton-T4 | sgd | 0.5 | 0 | 0 | 64 | none | temperature=4 |")
    assert "recipe: FOTON code (flags replaced foton.temperature)" in row


def test_a_diverging_trainer_is_recorded_and_the_others_finish(tmp_path, capsys):
    """One trainer's NaN loss does not end the comparison: the others finish, summary.md says
    which run stopped and why, and compare.py exits 1 with one line."""
    from gradengines.trainers.core.registry import register_engine
    from gradengines.trainers.engines.backprop import Backprop

    @register_engine("explodes")
    class Explodes(Backprop):
        def compute_grads(self, model, inputs, targets, loss_fn):
            out = super().compute_grads(model, inputs, targets, loss_fn)
            for p in model.parameters():
                p.grad.mul_(1e38)
            return out

    root = tmp_path / "r"  # "explodes" is forgotten after the test (tests/conftest.py)
    stale = root / "compare-digits" / "explodes" / "seed0"
    stale.mkdir(parents=True)
    (stale / "result.json").write_text("{}")  # an earlier result must not pass for this run's
    code = compare_main(["--trainers", "explodes,backprop", "--logdir", str(root), *QUICK,
                         "--optimizer", "sgd", "--momentum", "0"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "1 run(s) stopped on a non-finite loss (explodes seed 0)" in err
    assert not (stale / "result.json").exists() and json.loads((stale / "failed.json").read_text())["seed"] == 0
    assert result(root, "backprop")["test"]["accuracy"] > 0
    summary = (root / "compare-digits" / "summary.md").read_text()
    assert "- explodes seed 0: loss is" in summary and "| backprop | 1 |" in summary
