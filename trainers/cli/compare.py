"""``compare``: several trainers over seeds on one model and task, optionally tuned first, at equal
samples, steps or time (``scripts/compare.py``, ``gradengines compare``)."""

import math
import re
import sys
from pathlib import Path

from gradengines.trainers.cli.args import (
    add_settings_flag,
    base_parser,
    build_from_args,
    check_run_flags,
    int_list,
    join_job,
    trainer_runs,
    trainers_for,
    with_engine_names,
)
from gradengines.trainers.cli.names import default_experiment
from gradengines.trainers.cli.process import run_cli
from gradengines.trainers.core.errors import (
    ConfigError,
    NonFiniteLossError,
    stage,
)
from gradengines.trainers.core.options import options_from_args
from gradengines.trainers.core.threads import set_threads
from gradengines.trainers.experiments.budget import BUDGETS, reference_trainer
from gradengines.trainers.experiments.compare import check_resumable, check_target, refuse_taken, run_comparison
from gradengines.trainers.experiments.results import experiment_runs
from gradengines.trainers.experiments.summary import verdict_lines
from gradengines.trainers.experiments.tuning import parse_grid, trainer_grid, trial_name, tune_trainer, tuning_caveats
from gradengines.trainers.run.config import TrainConfig
from gradengines.trainers.run.rundir import note

__all__ = ["compare_main", "compare_parser", "model_given", "DEFAULT_COMPARISON"]


# The comparison ``scripts/compare.py`` runs with no arguments (under a minute on 2 CPU cores);
# flags replace single entries, and ``--model`` drops the model entries. Optimizer settings
# come from each trainer's recipe (``trainers.experiments.recipes``), so none may appear here.
DEFAULT_COMPARISON = dict(
    task="digits", model="mlp", model_depth=4, model_width="64", model_activation="tanh",
    model_orthogonal="bjorck", epochs=30, seeds="0,1,2", grad_agreement_every=10,
)


def compare_parser(argv: list[str], prog: str | None = None):
    """The flags of ``compare``, with the default comparison's defaults (its model's only without ``--model`` in
    ``argv``)."""
    parser = base_parser("Train several gradient engines on the same model, task and seeds; "
                         "write TensorBoard runs, summary.md and comparison.png. "
                         "With no arguments, runs the default comparison on digits.", prog)
    parser.add_argument("--trainers", default=None,
                        help="comma list of trainers (default: every trainer compatible with the model); a trainer "
                             "may carry its options, NAME:OPTION=VALUE (e.g. highway:k=1,highway:k=4: runs "
                             "highway-k1 and highway-k4); your own engine as FILE.py:Class or module:Class")
    parser.add_argument("--seeds", help="comma list of seeds, or auto: 0, 1, 2, then one more while a trainer's "
                                        "verdict at equal samples is undecided, up to 10")
    parser.add_argument("--experiment", help="experiment folder under --logdir (default: compare-<task> for the "
                                              "default model, compare-<model>-<task>, and what else makes the "
                                              "experiment different, trainers/cli/names.py)")
    add_settings_flag(parser, default="recipe")
    group = parser.add_argument_group("equal compute (trainers/experiments/budget.py, step_timing.py)")
    group.add_argument("--budget", choices=BUDGETS, default="samples",
                       help="what every trainer gets of the reference's run (--epochs or --steps at its batch size): "
                            "samples (default: the same training samples, as --epochs always gave), steps (the same "
                            "optimizer steps) or time (the same compute time by the timed step ratios: a cheaper "
                            "step gets more steps)")
    group.add_argument("--reference", default=None,
                       help="the trainer the others are timed and judged against (default: backprop if compared, "
                            "else the first)")
    group.add_argument("--target", type=float, default=None,
                       help="validation metric of the time-to-target table (default: 0.95 x the reference's best "
                            "accuracy, or its best perplexity / 0.95)")
    group.add_argument("--timing-rounds", type=int, default=30,
                       help="rounds of the round-robin step timing, one step of every trainer each (default: 30)")
    group = parser.add_argument_group("tuning (trainers/experiments/tuning.py)")
    group.add_argument("--tune", action="store_true",
                       help="first search each trainer's settings on the validation split (one seed; default grid: "
                            "its learning rate x 10^(-1, -0.5, 0, 0.5, 1), 5 runs per trainer), then run the seeds at "
                            "each trainer's best point; the test split is evaluated on those runs only")
    group.add_argument("--tune-grid", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a grid dimension (repeatable): lr or another training option, or an engine option "
                            "as TRAINER.OPTION, e.g. --tune-grid foton.temperature=1,4,8; learning rates may be "
                            "factors of each trainer's own: lr=x0.316,x1,x3.16; the budget per trainer is the "
                            "product of the dimensions")
    group.add_argument("--tune-seed", type=int, default=None, help="seed of the trials (default: the first seed)")
    defaults = {k: v for k, v in DEFAULT_COMPARISON.items() if not (model_given(argv) and k.startswith("model"))}
    defaults["log_axis"] = "samples"  # TensorBoard's step: samples seen, so batch sizes overlay
    parser.set_defaults(**defaults)
    for action in parser._actions:  # --help shows the comparison's own defaults, not train.py's
        if action.dest in defaults and action.help:
            said = f"(default: {defaults[action.dest]}; the comparison's own)"
            action.help = re.sub(r"\(default: [^)]*\)", said, action.help) if "(default:" in action.help \
                else f"{action.help} {said}"
    return parser


def model_given(argv: list[str]) -> bool:
    return any(a == "--model" or a.startswith("--model=") for a in argv)


def compare_main(argv=None, prog: str | None = None) -> int:
    """``scripts/compare.py``: several trainers, same model, task and seeds, one logdir."""
    argv = sys.argv[1:] if argv is None else list(argv)
    named: list[list[str]] = []  # engines FILE.py:Class registered before the parser lists their flags
    code = run_cli(lambda: named.append(with_engine_names(argv, {"--trainers": ",", "--reference": ","})))
    if code:
        return code
    argv = named[0]
    parser = compare_parser(argv, prog)
    args = parser.parse_args(argv)

    def main():
        set_threads(args.threads)
        check_run_flags(args)
        here = join_job(args)
        with stage("while preparing the comparison, before its first run: nothing was trained"):
            compare(here)

    def compare(here):
        seeds = list(range(SEEDS_AUTO[0])) if args.seeds == "auto" else int_list(args.seeds, "--seeds")
        if not seeds:
            raise ConfigError("--seeds lists no seed")
        if args.trainers is None:
            probe = build_from_args(args, "backprop", seeds[0])
            check_target(args.target, probe.task.metric_name)  # before the note on the trainers
            found, refused = trainers_for(probe.model, probe.task)
            if refused and here.is_main:
                note(f"compared {', '.join(found)}: every trainer this model allows; left out: "
                     f"{left_out(refused)} (--trainers NAME says the whole reason)")
            runs = {name: (name, {}) for name in found}
        else:
            runs = trainer_runs(args.trainers)
        names = list(runs)
        experiment = args.experiment if args.experiment is not None else default_experiment(
            "compare", args, parser, name_model=model_given(argv), trainers=None if args.trainers is None else names)
        if args.run_name is not None and len(names) != 1:
            raise ConfigError("--run-name names the run of a single trainer; give one trainer with --trainers")
        if args.tune_grid and not args.tune:
            raise ConfigError("--tune-grid is a grid for --tune; pass --tune too")
        if args.timing_rounds < 5:
            raise ConfigError(f"--timing-rounds must be >= 5 for a meaningful median, got {args.timing_rounds}")
        if args.target is not None and not math.isfinite(args.target):
            raise ConfigError(f"--target must be a finite number, got {args.target}")
        reference_trainer(names, args.reference)  # an unknown reference fails before any work
        if args.tune and any(options for _, options in runs.values()):
            raise ConfigError("--tune searches each trainer's settings; list trainers without options with it")
        if args.resume is True:  # before the first trial: a comparison resumed must have begun
            check_resumable(args.logdir, experiment)
        if args.tune and not (args.resume or args.overwrite):  # before the first trial, not after all of them
            refuse_taken(args.logdir, experiment, [n if args.run_name is None else args.run_name for n in names], seeds)
        tuning = Path(args.logdir) / experiment / "tuning"

        def kept_trials() -> str:  # asked at the interruption: the trials run so far stay, --resume reads them
            done = len(list(tuning.glob("*/*/seed*/result.json")))
            return (f"while tuning, between trials: {done} trial{'s' if done != 1 else ''} finished, kept in "
                    f"{tuning}; --resume continues the search from them" if done else
                    "while tuning, before its first trial finished: nothing was trained")

        with stage(kept_trials):
            tuned = tune_all(args, names, seeds, experiment, here) if args.tune else {}

        def comparison(seeds, resume, overwrite):
            return run_comparison(lambda t, s: build_from_args(args, runs[t][0], s, args.settings, tuned.get(t),
                                                               runs[t][1]), names, seeds,
                                  logdir=args.logdir, run_name=args.run_name, experiment=experiment,
                                  epochs=None if args.steps else args.epochs, steps=args.steps, resume=resume,
                                  overwrite=overwrite,
                                  allow_changes=list(options_from_args(args, TrainConfig)), budget=args.budget,
                                  reference=args.reference, target=args.target, timing_rounds=args.timing_rounds)

        out = comparison(seeds, args.resume, args.overwrite)
        while args.seeds == "auto" and len(seeds) < SEEDS_AUTO[1]:
            undecided = undecided_runs(out["dir"], names, reference_trainer(names, args.reference))
            if not undecided:
                break
            seeds.append(max(seeds) + 1)
            if here.is_main:
                note(f"--seeds auto: {', '.join(undecided)} undecided against the reference on "
                     f"{len(seeds) - 1} seeds; adding seed {seeds[-1]} to every trainer (at most {SEEDS_AUTO[1]})")
            out = comparison(seeds, "auto", False)  # the seeds run so far kept
        if here.is_main:
            print(out["table"])
            print(f"runs, summary.md and comparison.png in {out['dir']}")
            print(f"tensorboard --logdir {out['dir']}")
        if out["failures"]:
            names = ", ".join(f"{f['run']} seed {f['seed']}" for f in out["failures"])
            raise NonFiniteLossError(f"{len(out['failures'])} run(s) stopped on a non-finite loss ({names}); "
                                     f"the others finished, see {out['dir'] / 'summary.md'}")

    return run_cli(main)


SEEDS_AUTO = (3, 10)
"""``--seeds auto``: seeds 0, 1, 2, then one more for every trainer while a trainer's word at equal samples is
undecided, up to 10 seeds."""


def undecided_runs(out_dir, names: list[str], reference: str) -> list[str]:
    """The runs whose verdict at equal samples is undecided (``trainers.experiments.verdict``)."""
    results = {run: seeds for run, seeds in experiment_runs(out_dir).items() if run in names}
    if reference not in results:
        return []
    metric = results[reference][0]["report"]["metric"]
    words = verdict_lines(results, metric, reference, metric != "perplexity")[1]
    return [run for run, word in words.items() if word == "undecided"]


def left_out(refused: dict[str, str]) -> str:
    """Trainers grouped by what they need (the refusal's "needs ..." clause): ``dsf, ftbptt (need a model with
    recurrent layers); ...``."""
    needs: dict[str, list[str]] = {}
    for name, why in refused.items():
        found = re.search(r"needs (.*?)(?: \(|;|$)", why)
        needs.setdefault(found.group(1) if found else why, []).append(name)
    return "; ".join(f"{', '.join(names)} (need{'s' if len(names) == 1 else ''} {what})"
                     for what, names in needs.items())


def tune_all(args, names: list[str], seeds: list[int], experiment: str, here) -> dict[str, dict]:
    """``--tune``: each trainer's grid search (``trainers.experiments.tuning``); returns trainer -> its record."""
    grid = parse_grid(args.tune_grid, names)
    seed = seeds[0] if args.tune_seed is None else args.tune_seed
    base = {t: build_from_args(args, t, seed, args.settings) for t in names}  # every setup checked first
    records = {}
    for t in names:
        record = tune_trainer(lambda tr, s, values: build_from_args(args, tr, s, args.settings, {"values": values}),
                              t, trainer_grid(grid, t, base[t].config.lr), seed, logdir=args.logdir,
                              experiment=experiment, epochs=None if args.steps else args.epochs, steps=args.steps,
                              resume=args.resume)
        records[t] = {"values": record["best"], "grid": record["grid"], "budget": record["budget"], "seed": seed,
                      "stopped": record["stopped"], "edges": record["edges"]}
        if here.is_main:
            caveats = tuning_caveats(record)
            print(f"tuned {t}: {trial_name(record['best'])} (best val {record['metric']} "
                  f"{record['best_val'][record['metric']]:.4f}, {record['budget']} trials on seed {seed})"
                  f"{'; ' + caveats if caveats else ''}")
    return records

