"""``train``: one trainer, one run (``scripts/train.py``, ``gradengines train``)."""

import json
import sys
from pathlib import Path

from gradengines.trainers.cli.args import (
    add_settings_flag,
    base_parser,
    build_from_args,
    check_run_flags,
    join_job,
    other_trainer_flags,
    with_engine_names,
)
from gradengines.trainers.cli.names import default_experiment, default_run_name
from gradengines.trainers.cli.process import run_cli
from gradengines.trainers.core.errors import stage
from gradengines.trainers.core.options import options_from_args
from gradengines.trainers.core.registry import available
from gradengines.trainers.core.threads import set_threads
from gradengines.trainers.run.config import TrainConfig
from gradengines.trainers.run.hparams import write_experiment_config
from gradengines.trainers.run.rundir import note
from gradengines.trainers.run.trainer import Trainer

__all__ = ["train_main", "train_parser"]


def train_parser(prog: str | None = None):
    """The flags of ``train``."""
    parser = base_parser("Train a zoo model (or your own, --model FILE.py:CLASS) on a task with one gradient engine.",
                         prog)
    parser.add_argument("--trainer", default="backprop",
                        help=f"gradient engine: {', '.join(available())} (default: backprop); or your own, "
                             f"path/to/file.py:Class or package.module:Class (a GradientEngine subclass)")
    parser.add_argument("--experiment", default=None,
                        help="experiment folder under --logdir (default: train-<model>-<task> and what else makes "
                             "the experiment different, trainers/cli/names.py)")
    add_settings_flag(parser, default="shared")
    return parser


def train_main(argv=None, prog: str | None = None) -> int:
    """``scripts/train.py``: train one model with one trainer."""
    named: list[list[str]] = []  # --trainer FILE.py:Class registered before the parser lists its flags
    code = run_cli(lambda: named.append(with_engine_names(sys.argv[1:] if argv is None else list(argv),
                                                          {"--trainer": ","})))
    if code:
        return code
    parser = train_parser(prog)
    args = parser.parse_args(named[0])

    def main():
        set_threads(args.threads)
        check_run_flags(args)
        here = join_job(args)
        with stage("while building the task and the model, before training: nothing was trained or written"):
            return train(here)

    def train(here):
        setup = build_from_args(args, args.trainer, settings=args.settings)
        unused = [f"--{(t + '_' + k).replace('_', '-')}" for t, flags in other_trainer_flags(args, args.trainer).items()
                  for k in flags]
        if unused and here.is_main:
            note(f"{', '.join(unused)} {'is an option' if len(unused) == 1 else 'are options'} of another trainer, "
                 f"unused by '{args.trainer}'")
        experiment = args.experiment if args.experiment is not None else default_experiment("train", args, parser)
        run_name = default_run_name(args, args.trainer) if args.run_name is None else args.run_name
        trainer = Trainer(setup.model, setup.engine, setup.task, config=setup.config, logdir=args.logdir,
                          experiment=experiment, run_name=run_name, overwrite=args.overwrite, meta=setup.meta,
                          settings=setup.settings)
        report = trainer.fit(epochs=None if args.steps else args.epochs, steps=args.steps, resume=args.resume,
                             allow_changes=list(options_from_args(args, TrainConfig)))  # says what it kept
        with stage(f"after the run finished: its results are in {trainer.run_dir}"):
            if here.is_main:
                if not trainer.finished_before:
                    write_experiment_config(Path(args.logdir) / experiment)
                print(json.dumps({"run": str(trainer.run_dir), **report}, indent=2))

    return run_cli(main)

