"""Default run folders (trainers/cli/names.py, issue 42): different experiments never share one, the same command
(or its --resume) always finds its own, and a taken folder is refused before anything trains, --tune's trials
included, with every way on named."""

import pytest
from helpers import one_line_error

from gradengines.trainers.cli import compare_main, train_main
from gradengines.trainers.cli.compare import compare_parser, model_given
from gradengines.trainers.cli.names import MAX_NAME, default_experiment, default_run_name
from gradengines.trainers.cli.train import train_parser


def train_folder(*argv: str) -> str:
    args = train_parser().parse_args(list(argv))
    return f"{default_experiment('train', args, train_parser())}/{default_run_name(args, args.trainer)}"


def compare_folder(*argv: str) -> str:
    from gradengines.trainers.cli.args import trainer_runs

    parser = compare_parser(list(argv))
    args = parser.parse_args(list(argv))
    return default_experiment("compare", args, parser, name_model=model_given(list(argv)),
                              trainers=None if args.trainers is None else list(trainer_runs(args.trainers)))


def test_train_names_the_model_task_and_trainer_with_what_a_resume_cannot_change():
    assert train_folder() == "train-mlp-digits/backprop"
    assert train_folder("--model", "my_models.py:Net", "--model-option", "hidden=128") == \
        "train-Net-hidden=128-digits/backprop"
    assert train_folder("--model", "torch.nn:Linear") == "train-Linear-digits/backprop"
    assert train_folder("--trainer", "highway", "--highway-k", "2", "--model", "resnet", "--depth", "20") == \
        "train-resnet-depth=20-digits/highway-k2"
    assert train_folder("--task", "copy", "--task-option", "length=5", "--task-option", "delay=20") == \
        "train-mlp-copy-delay=20-length=5/backprop"
    assert train_folder("--optimizer", "sgd", "--dtype", "float64") == "train-mlp-digits-sgd-float64/backprop"
    # the order of the flags does not matter: the same experiment
    assert train_folder("--width", "8", "--depth", "2") == train_folder("--depth", "2", "--width", "8") == \
        "train-mlp-depth=2-width=8-digits/backprop"
    # what a resume may change is not in the name, so that the resume finds the run
    assert train_folder("--lr", "0.1", "--batch-size", "32", "--epochs", "3", "--steps", "9") == train_folder()


def test_compare_names_its_default_model_apart_from_an_explicit_one():
    assert compare_folder() == "compare-digits"
    assert compare_folder("--tune") == "compare-digits-tuned"
    assert compare_folder("--depth", "32", "--trainers", "foton", "--optimizer", "adam", "--tune") == \
        "compare-depth=32-digits-adam-foton-tuned"
    assert compare_folder("--depth", "4") == "compare-digits"  # the default comparison's own depth
    # --model mlp drops the default comparison's orthogonal depth-4 MLP: another model, another folder
    assert compare_folder("--model", "mlp") == "compare-mlp-digits"
    assert compare_folder("--trainers", "backprop,highway:k=2") == "compare-digits-backprop+highway-k2"
    assert compare_folder("--settings", "shared") == "compare-digits-shared"


def test_a_long_name_stays_within_the_limit_and_stable():
    options = [w for i in range(40) for w in ("--model-option", f"option_{i}={i * 1000}")]
    name = compare_folder("--model", "transformers:GPT2LMHeadModel", *options)
    assert len(name) == MAX_NAME and name.startswith("compare-GPT2LMHeadModel-option_0=0-")
    assert name == compare_folder("--model", "transformers:GPT2LMHeadModel", *options)
    assert name != compare_folder("--model", "transformers:GPT2LMHeadModel", *options[:-1], "option_39=1")
    assert compare_folder("--task-option", "path=../../etc") == "compare-digits-path=.._.._etc"  # stays inside


QUICK = ["--depth", "2", "--width", "8", "--steps", "2", "--progress", "false", "--seeds", "0", "--timing-rounds", "5"]


def test_train_refuses_its_own_taken_folder_and_names_every_way_on(tmp_path, capsys):
    flags = ["--depth", "2", "--width", "8", "--steps", "2", "--progress", "false", "--logdir", str(tmp_path)]
    assert train_main(flags) == 0
    assert train_main([*flags, "--model", "residual_mlp"]) == 0  # another model: its own folder
    capsys.readouterr()
    assert train_main(flags) == 2
    assert one_line_error(capsys) == (
        f"error: {tmp_path}/train-mlp-depth=2-width=8-digits/backprop/seed0 already holds a run; --resume continues "
        f"it, another --run-name or --experiment starts a new run beside it, --overwrite replaces it\n")
    assert train_main([*flags, "--steps", "3", "--resume"]) == 0


def test_tune_is_refused_before_its_first_trial_when_the_comparison_folder_is_taken(tmp_path, capsys, monkeypatch):
    from gradengines.trainers.cli import compare

    flags = [*QUICK, "--trainers", "backprop", "--tune", "--tune-grid", "lr=1e-3,1e-2", "--logdir", str(tmp_path)]
    assert compare_main(flags) == 0
    capsys.readouterr()

    def no_trial(*args, **kwargs):
        raise AssertionError("a tuning trial ran although the comparison's folder is taken")

    monkeypatch.setattr(compare, "tune_trainer", no_trial)
    assert compare_main(flags) == 2
    assert one_line_error(capsys) == (
        f"error: {tmp_path}/compare-depth=2-width=8-digits-backprop-tuned/backprop/seed0 already holds a run; "
        f"--resume continues the comparison, another --experiment (or --run-name, with one trainer) starts a new one "
        f"beside it, --overwrite replaces its runs\n")


@pytest.mark.parametrize("argv", [["--experiment", "../up"], ["--run-name", "/abs"]])
def test_explicit_names_still_stay_inside_the_logdir(tmp_path, capsys, argv):
    assert train_main(["--steps", "1", "--progress", "false", "--logdir", str(tmp_path / "runs"), *argv]) == 2
    assert "must be a relative path inside the log directory" in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()


TINY = ["--task", "teacher", "--task-option", "n_train=128", "--width", "8", "--batch-size", "32", "--steps", "2",
        "--progress", "false"]


def test_resume_where_no_run_is_is_refused_naming_the_run_of_other_flags_and_auto_starts_it(tmp_path, capsys):
    """``--resume`` after a ``--depth 2`` run, now with ``--depth 3``: the depth=3 folder holds no run; refused in one
    line naming the depth=2 run and what differs, nothing written; ``--resume auto`` starts it (with its note) and
    then resumes it like ``--resume``."""
    logdir = ["--logdir", str(tmp_path)]
    assert train_main([*TINY, *logdir, "--depth", "2"]) == 0
    capsys.readouterr()
    assert train_main([*TINY, *logdir, "--depth", "3", "--resume"]) == 2
    err = one_line_error(capsys)
    here = tmp_path / "train-mlp-depth=3-width=8-teacher-n_train=128" / "backprop" / "seed0"
    assert err.startswith(f"error: {here} holds no run to resume; the same run with other flags: "
                          f"train-mlp-depth=2-width=8-teacher-n_train=128 (depth=2 there, depth=3 here)")
    assert "--resume auto" in err and not here.parent.parent.exists()
    assert train_main([*TINY, *logdir, "--depth", "3", "--resume", "auto"]) == 0
    assert f"{here} holds no run yet; --resume auto starts it" in capsys.readouterr().err
    assert (here / "result.json").exists()
    assert train_main([*TINY, *logdir, "--depth", "3", "--resume"]) == 0  # finished: nothing to do
    assert "nothing to do" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        train_main([*TINY, *logdir, "--resume", "yes"])
    assert refused.value.code == 2 and "--resume: takes no value or 'auto', got 'yes'" in one_line_error(capsys)


def test_a_comparison_resumed_before_it_began_is_refused_and_one_begun_starts_its_missing_runs(tmp_path, capsys):
    flags = [*TINY, "--logdir", str(tmp_path), "--trainers", "backprop", "--seeds", "0", "--timing-rounds", "5",
             "--experiment", "c"]
    assert compare_main([*flags, "--resume"]) == 2
    assert one_line_error(capsys).startswith(f"error: {tmp_path / 'c'} holds no run to resume; ")
    assert compare_main(flags) == 0
    capsys.readouterr()
    assert compare_main([*flags[:-4], "--seeds", "0,1", "--experiment", "c", "--resume"]) == 0  # seed 1 starts
    assert (tmp_path / "c" / "backprop" / "seed1" / "result.json").exists()


@pytest.mark.parametrize("flags, message", [
    (["--run-name", ""], "--run-name is empty; give a folder name, or leave it out for the default"),
    (["--experiment", ""], "--experiment is empty; give a folder name, or leave it out for the default"),
    (["--run-name", "a" * 300], "--run-name has a folder name of 300 bytes, over the file system's 255; choose a "
                                "shorter --run-name"),
    (["--experiment", "x/" + "é" * 200], "--experiment has a folder name of 400 bytes, over the file system's 255"),
    (["--seeds", "0,"], "--seeds has an empty item (a trailing or doubled comma): '0,'"),
    (["--trainers", "backprop,,fa"], "--trainers has an empty item (a trailing or doubled comma)"),
    (["--trainers", "highway:k=2:k=3"], "--trainers highway:k=2:k=3 gives k twice (k=2 and k=3); give it once"),
    (["--target", "1.5"], "--target is a validation accuracy, in (0, 1]; got 1.5"),
])
def test_bad_names_lists_and_targets_are_one_line_before_anything_is_written(tmp_path, capsys, flags, message):
    command = compare_main if any(f in flags for f in ("--seeds", "--trainers", "--target")) else train_main
    assert command([*TINY, "--logdir", str(tmp_path), *flags]) == 2
    assert message in one_line_error(capsys)
    assert not any(tmp_path.iterdir())


def test_compare_help_shows_the_comparisons_own_defaults():
    """Not train.py's (--epochs 10, --grad-agreement-every 0, --log-axis step): what a flagless compare.py runs."""
    text = " ".join(compare_parser(["--help"]).format_help().split())
    for flag, value in (("--epochs EPOCHS", "30"), ("--grad-agreement-every", "10"), ("--log-axis", "samples"),
                        ("--seeds SEEDS", "0,1,2"), ("--depth", "4")):
        after = text[text.index(flag + " ", text.index("options:")):]
        assert f"(default: {value}; the comparison's own)" in after[:after.index(" --", 2)], flag
    assert "(default: 10)" not in text[text.index("--epochs EPOCHS ", text.index("options:")):][:80]


def test_train_help_gives_the_feedback_familys_shared_options_once():
    """Each option the FA family shares is described once; the other rules' flags say which flag it is like."""
    text = " ".join(train_parser().format_help().split())
    assert text.count("swapped backward, given the forward weight as feedback") == 1
    for rule in ("dfa", "fa", "frsf", "usf"):
        assert f"--{rule}-self-check BOOL as --brsf-self-check (default: True)" in text, rule
    assert "gradient engine: " in text and "(default: backprop)" in text
