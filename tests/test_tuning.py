"""compare.py --tune (trainers/experiments/tuning.py): a grid on the validation split, the best point per
trainer, the test split read by the final runs only, every trial a run."""

import json
import re

import pytest

from gradengines.trainers.cli import compare_main
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.experiments.tuning import (
    LR_FACTORS,
    grid_edges,
    parse_grid,
    select,
    trainer_grid,
    trial_name,
    tuning_caveats,
)
from gradengines.trainers.run.trainer import Trainer

QUICK = ["--steps", "6", "--eval-every", "2", "--grad-agreement-every", "0", "--progress", "false",
         "--depth", "2", "--width", "16"]


def read(path):
    return json.loads(path.read_text())


def test_grid_parsing_and_the_default_learning_rate_grid():
    grid = parse_grid(["lr=1e-3, 1e-2", "foton.temperature=1,4", "optimizer=sgd,adam"], ["foton", "pepita"])
    assert grid == {"lr": [1e-3, 1e-2], "foton.temperature": [1, 4], "optimizer": ["sgd", "adam"]}
    assert trainer_grid(grid, "pepita", 0.5) == {"lr": [1e-3, 1e-2], "optimizer": ["sgd", "adam"]}
    default = trainer_grid(parse_grid(["foton.temperature=1,4"], ["foton"]), "foton", 0.5)
    assert default["lr"] == pytest.approx([0.5 * f for f in LR_FACTORS], rel=1e-3)
    assert list(default) == ["lr", "foton.temperature"]
    assert trial_name({"lr": 0.001, "foton.temperature": 4}) == "lr=0.001,temperature=4"


def test_a_learning_rate_grid_relative_to_each_trainers_own():
    grid = parse_grid(["lr=x0.316, x1,X3.16"], ["fgrad", "backprop"])
    assert trainer_grid(grid, "fgrad", 1e-4)["lr"] == pytest.approx([3.16e-5, 1e-4, 3.16e-4])
    assert trainer_grid(grid, "backprop", 2e-3)["lr"] == pytest.approx([6.32e-4, 2e-3, 6.32e-3])
    for bad in ("lr=x1,1e-3", "lr=x0,x1", "lr=x-1,x1", "lr=xnan,x1"):
        with pytest.raises(ConfigError, match="--tune-grid lr") as err:
            parse_grid([bad], ["fgrad"])
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("items, expected", [
    (["lr"], "expects KEY=V1,V2"), (["lr="], "expects KEY=V1,V2"), (["nope=1"], "not a training option"),
    (["seed=1,2"], "not a training option"), (["dsf.feedback=tied"], "not one of the trainers compared"),
    (["foton.nope=1"], "has no option 'nope'"),
    (["lr=1e-3,"], r"--tune-grid lr has an empty item \(a trailing or doubled comma\): '1e-3,'"),
    (["lr=1e-3,,1e-2"], "has an empty item"),
    (["lr=1e-3", "lr=1e-2"], r"--tune-grid lr is given twice \(0.001 and 1e-2\): give its values once")])
def test_bad_grids_are_one_line_errors(items, expected):
    with pytest.raises(ConfigError, match=expected) as err:
        parse_grid(items, ["foton", "backprop"])
    assert "\n" not in str(err.value)


def test_selection_takes_the_best_validation_point_and_never_a_diverged_one():
    trials = [{"trainer": "t", "values": {"lr": 1}, "best_val": {"accuracy": 0.5, "perplexity": 9.0}},
              {"trainer": "t", "values": {"lr": 2}, "best_val": None, "diverged": "loss is nan"},
              {"trainer": "t", "values": {"lr": 3}, "best_val": {"accuracy": 0.7, "perplexity": 12.0}}]
    assert select(trials, "accuracy")["values"] == {"lr": 3}
    assert select(trials, "perplexity")["values"] == {"lr": 1}
    with pytest.raises(ConfigError, match="every tuning trial of t diverged"):
        select([trials[1]], "accuracy")


def test_tune_picks_the_best_validation_setting_and_never_reads_test(tmp_path, monkeypatch, capsys):
    evaluated = []  # (run directory, split) of every evaluation
    original = Trainer.evaluate

    def spy(self, split="val", *args, **kwargs):
        evaluated.append((str(self.run_dir), split))
        return original(self, split, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", spy)
    root = tmp_path / "r"
    # SGD at 1e9 diverges, 1e-6 barely moves, 0.3 learns: a grid whose answer is known
    code = compare_main(["--trainers", "backprop,foton", "--seeds", "0,1", "--tune", "--optimizer", "sgd",
                         "--tune-grid", "lr=1e-6,0.3,1e9", "--logdir", str(root), "--orthogonal", "bjorck",
                         *QUICK])
    assert code == 0
    exp = root / "compare-depth=2-width=16-digits-sgd-backprop+foton-tuned"  # names.py; bjorck: the default
    for trainer in ("backprop", "foton"):
        record = read(exp / "tuning" / trainer / "tuning.json")
        assert record["budget"] == 3 and record["seed"] == 0
        trials = {trial_name(t["values"]): t for t in record["trials"]}
        assert "diverged" in trials["lr=1e+09"] and trials["lr=1e+09"]["best_val"] is None
        finished = [t for t in record["trials"] if t["best_val"] is not None]
        best = max(finished, key=lambda t: t["best_val"]["accuracy"])
        assert record["best"] == best["values"] == {"lr": 0.3}
        for name in ("lr=1e-06", "lr=0.3"):  # every trial is a run, with no test record
            trial = read(exp / "tuning" / trainer / name / "seed0" / "result.json")
            assert trial["test"] is None and trial["best_val"] == trials[name]["best_val"]
            assert "test/accuracy" not in (exp / "tuning" / trainer / name / "seed0" / "metrics.jsonl").read_text()
        for seed in (0, 1):  # the seeds run at the selected point, and only they reach the test split
            final = read(exp / trainer / f"seed{seed}" / "result.json")
            assert final["config"]["lr"] == 0.3 and final["test"]["accuracy"] > 0
            assert final["settings"]["tuned"]["values"] == {"lr": 0.3}
    test_reads = {run for run, split in evaluated if split == "test"}
    assert test_reads == {str(exp / t / f"seed{s}") for t in ("backprop", "foton") for s in (0, 1)}
    assert any("tuning" in run for run, split in evaluated if split == "val")
    said = capsys.readouterr()
    assert re.search(r"tuned backprop: lr=0\.3 \(best val accuracy \S+, 3 trials on seed 0\); 1 stopped: lr=1e\+09 "
                     r"\(loss is (nan|inf) at step \d+\)\n", said.out), said.out
    assert re.search(r"note: tuning foton: trial lr=1e\+09 stopped: loss is (nan|inf) at step \d+\n", said.err)
    summary = (exp / "summary.md").read_text()
    assert re.search(r"tuned lr=0\.3 \(3 trials on seed 0, validation split; 1 stopped: lr=1e\+09 \(loss is "
                     r"(nan|inf) at step \d+\)\)", summary)


def test_tune_grid_without_tune_is_refused(tmp_path, capsys):
    assert compare_main(["--trainers", "backprop", "--tune-grid", "lr=1e-3", "--logdir", str(tmp_path), *QUICK]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tune" in err
    assert not list(tmp_path.iterdir())


def test_a_best_point_on_the_edge_of_its_grid_is_said_with_the_way_to_extend_it():
    grid = {"lr": [1e-3, 1e-2, 1e-1], "foton.temperature": [1, 4, 8], "optimizer": ["sgd", "adam", "adamw"],
            "batch_size": [32, 64]}
    best = {"lr": 0.1, "foton.temperature": 1, "optimizer": "adamw", "batch_size": 64}
    assert grid_edges(grid, best) == {"lr": "top", "foton.temperature": "bottom"}  # two points: no middle to leave
    assert grid_edges(grid, {**best, "lr": 1e-2, "foton.temperature": 4}) == {}
    record = {"best": best, "stopped": {"lr=0.1,temperature=8": "loss is nan at step 7"},
              "edges": grid_edges(grid, best)}
    assert tuning_caveats(record) == (
        "1 stopped: lr=0.1,temperature=8 (loss is nan at step 7); lr=0.1 is the top of its grid: the best may lie "
        "above, extend --tune-grid lr=... upward; temperature=1 is the bottom of its grid: the best may lie below, "
        "extend --tune-grid foton.temperature=... downward")
    assert tuning_caveats({"best": {"lr": 1e-2}, "stopped": {}, "edges": {}}) == ""


def test_an_interruption_between_trials_says_the_trials_kept_and_resume_uses_them(tmp_path, monkeypatch, capsys):
    """Ctrl-C after the first trial finished said "before its first run: nothing was trained"; it says how many
    trials are kept and where, and --resume reads them back (the trial is not run again)."""
    from gradengines.trainers.cli import compare as compare_cli

    real, calls = compare_cli.build_from_args, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the base setup, the first trial's, then Ctrl-C before the second trial
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_cli, "build_from_args", interrupted)
    flags = ["--trainers", "backprop", "--tune", "--tune-grid", "lr=0.001,0.01", "--logdir", str(tmp_path), *QUICK]
    assert compare_main(flags) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted while tuning, between trials: 1 trial finished, kept in " in err
    assert "--resume continues the search from them" in err and "nothing was trained" not in err
    monkeypatch.setattr(compare_cli, "build_from_args", real)
    assert compare_main([*flags, "--resume"]) == 0
