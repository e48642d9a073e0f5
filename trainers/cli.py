"""Command-line front ends of ``scripts/train.py``, ``compare.py`` and ``bench.py``.

Flags are generated from the option dataclasses (``TrainConfig``, each
engine's ``Options``). Every user error prints one line on stderr and
exits with code 2, before any run directory or checkpoint is written;
a NaN/Inf loss, or a rank of a ``torchrun`` job that died or hung, exits
with code 1.

``train.py`` and ``compare.py`` run unchanged under ``torchrun``: they join
the process group (``--dist-backend``, ``--dist-timeout``), train data
parallel, and only rank 0 prints and writes.
"""

import argparse
import dataclasses
import json
import math
import signal
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

import models
import tasks
from trainers.core.distributed import BACKENDS, DataParallel, check_device, init_distributed, local_device
from trainers.core.errors import (
    USER_ERRORS,
    ConfigError,
    DataError,
    DistributedError,
    ModelRunError,
    NonFiniteLossError,
    RunOutOfMemory,
    RunTerminated,
    RunWriteError,
    Terminated,
    command_line,
    out_of_memory,
)
from trainers.core.options import add_arguments, options_from_args, parse_key_values, parse_options
from trainers.core.registry import available, build_engine, engine_class
from trainers.core.rng import seed_everything
from trainers.experiments.budget import BUDGETS, reference_trainer
from trainers.experiments.compare import compatible, run_comparison
from trainers.experiments.recipes import recipe_for
from trainers.experiments.tuning import parse_grid, trainer_grid, trial_name, tune_trainer
from trainers.run.config import TrainConfig
from trainers.run.hparams import write_experiment_config
from trainers.run.memory import check_fits
from trainers.run.records import forget_notes
from trainers.run.rundir import note
from trainers.run.threads import THREADS_ENV, set_threads
from trainers.run.trainer import Trainer

__all__ = ["train_main", "compare_main", "bench_main", "table_main", "main", "console", "base_parser",
           "build_from_args", "run_cli", "DEFAULT_COMPARISON", "Setup", "OneLineParser"]

INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
TERMINATED = 143  # ... and by SIGTERM
SEED_RANGE = 2**32  # NumPy's seeds are 32-bit
MAX_SIZE = 2**31 - 1  # no tensor dimension of a trainable model comes near; larger ones overflow torch's sizes

MODEL_FLAGS = {
    # flag dest: (type, help); only flags the user gives reach the model
    "depth": (int, "number of layers (mlp), convolutions (convnet, ortho_convnet), residual blocks (residual_mlp), "
                   "recurrent layers (rnn_lm, rnn_block_lm), Transformer layers (gpt) or 6n + 2 (resnet)"),
    "width": (str, "hidden width, or a comma list of hidden widths (mlp); stream channels (resnet); d_model (gpt)"),
    "hidden": (int, "branch hidden width (residual_mlp) or recurrent state size (rnn_lm, rnn_block_lm)"),
    "cell": (str, "recurrent cell: rnn, gru, lstm, diagonal (rnn_lm, rnn_block_lm)"),
    "vocab_size": (int, "input token vocabulary when it differs from the outputs, e.g. copy "
                        "(rnn_lm, rnn_block_lm, gpt)"),
    "input_dim": (int, "float features per step instead of tokens, e.g. 2 for adding (rnn_lm, rnn_block_lm)"),
    "per_step": (str, "one output per step: true or false (rnn_lm, rnn_block_lm; default: true for tokens)"),
    "tie_weights": (str, "share the head's weight with the embedding: true or false (rnn_lm, rnn_block_lm, gpt)"),
    "heads": (int, "attention heads (gpt)"),
    "split_gamma": (float, "Highway-BP split g = Sublayer(LN h) + gamma h, r = (1 - gamma) h + z (gpt; default 0.2)"),
    "variant": (str, "resnet form: preact (h + g(h)) or post (ReLU(h + g(h)))"),
    "activation": (str, f"hidden activation: {', '.join(models.activations.ACTIVATIONS)}"),
    "dropout": (float, "dropout probability"),
    "bias": (str, "use biases: true or false"),
    "orthogonal": (str, "orthogonal hidden layers: none, expm, cayley (geotorch), bjorck, polar (projection) or "
                        "retraction (Cayley retraction of plain SGD steps)"),
    "orthogonal_iters": (int, "Bjorck iterations per projection"),
    "in_features": (int, "model input features (default: from the task)"),
    "out_features": (int, "model outputs (default: the task's classes)"),
}


POSITIVE_MODEL_FLAGS = ("depth", "hidden", "vocab_size", "input_dim", "heads", "orthogonal_iters", "in_features",
                        "out_features")


class OneLineParser(argparse.ArgumentParser):
    """argparse with no abbreviated flags (``--epoch`` is not ``--epochs``) and usage errors in one line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _model_value(name, text):
    if name == "width":
        try:
            parts = [int(p) for p in text.split(",")]
        except ValueError:
            parts = [0]
        if min(parts) < 1:
            raise ConfigError(f"--width must be a positive integer or a comma list of them, got {text!r}")
        if max(parts) > MAX_SIZE:
            raise ConfigError(f"--width must be <= 2**31 - 1, got {text}")
        return parts[0] if len(parts) == 1 else parts
    if name in POSITIVE_MODEL_FLAGS and not 1 <= text <= MAX_SIZE:
        raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 and <= 2**31 - 1, got {text}")
    if isinstance(text, float) and not math.isfinite(text):
        raise ConfigError(f"--{name.replace('_', '-')} must be a finite number, got {text}")
    if name in ("bias", "per_step", "tie_weights"):
        if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ConfigError(f"--{name.replace('_', '-')} must be true or false, got {text!r}")
        return text.lower() in ("1", "true", "yes", "on")
    if name == "orthogonal" and text.lower() == "none":
        return None
    return text


def base_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """Flags shared by train and compare: task, model, training options, engine options."""
    epilog = (f"trainers: {', '.join(available())}\n"
              f"models:   {', '.join(models.available())}\n"
              f"tasks:    {', '.join(tasks.available())}")
    parser = OneLineParser(prog=prog, description=description, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp",
                        help=f"zoo model: {', '.join(models.available())} (default: mlp); or your own, "
                             "path/to/file.py:ClassName or package.module:factory (with --model-option)")
    parser.add_argument("--model-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the model's constructor, e.g. --model-option hidden=128 (repeatable; "
                             "Python literals, else strings)")
    parser.add_argument("--model-call", dest="call", action="append", default=[], metavar="KEY=VALUE",
                        help="how your model is called and read, where the defaults do not fit (repeatable): "
                             "output=INDEX|KEY|ATTRIBUTE (default: the tensor, a tuple's first element, a dict's "
                             "or object's logits), state=none|no|METHOD (default: model.init_hidden(B) when "
                             "forward requires a second argument), targets=no|KEYWORD (default: a parameter named "
                             "targets or labels), layout=batch_first|time_first, loss=task|model (the model's "
                             "own loss where an engine needs only a loss); models/calling.py")
    parser.add_argument("--task", default="digits", help=f"task: {', '.join(tasks.available())} (default: digits)")
    parser.add_argument("--data-dir", default=None, help="directory of the dataset files (file-based tasks)")
    parser.add_argument("--download", action="store_true", help="download missing dataset files into the cache")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the train/val split (default: 0)")
    parser.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a task-specific option, e.g. --task-option n_train=4096 (repeatable)")
    parser.add_argument("--epochs", type=int, default=10, help="training epochs (default: 10)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (overrides --epochs)")
    parser.add_argument("--logdir", default="runs", help="root of the TensorBoard runs (default: runs)")
    parser.add_argument("--resume", action="store_true", help="continue the run from its last checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run of the same name")
    parser.add_argument("--run-name", default=None,
                        help="run folder under the experiment (default: the trainer's name; one trainer only)")
    add_threads_flag(parser)
    group = parser.add_argument_group("data parallel (under torchrun)")
    group.add_argument("--dist-backend", default="auto", choices=BACKENDS,
                       help="process-group backend (default: auto, nccl on GPUs, gloo on the CPU)")
    group.add_argument("--dist-timeout", type=float, default=300.0,
                       help="seconds any rank waits for the others before the job stops with an error (default: 300)")
    group = parser.add_argument_group("model options")
    for name, (tp, help) in MODEL_FLAGS.items():
        group.add_argument("--" + name.replace("_", "-"), dest="model_" + name, type=tp,
                           default=argparse.SUPPRESS, help=help)
    add_arguments(parser, TrainConfig, title="training options")
    for name in available():
        cls = engine_class(name)
        if dataclasses.fields(cls.Options):
            add_arguments(parser, cls.Options, prefix=f"{name}_", title=f"{name} options")
    return parser


def add_threads_flag(parser) -> None:
    """``--threads N|auto`` (``trainers.run.threads``)."""
    parser.add_argument("--threads", default=None, metavar="N|auto",
                        help=f"CPU threads of this process (default: {THREADS_ENV} if set, else OMP_NUM_THREADS, "
                             "else auto: the cores no other process keeps busy at start, at least 1)")


class Setup(NamedTuple):
    """A fresh, seeded setup of one run, and where each of its settings came from."""

    engine: object
    task: object
    model: object
    config: TrainConfig
    meta: dict
    settings: dict


def _settings_record(mode: str, recipe, given: set[str], tuned: set[str]) -> dict:
    """``{"mode", "recipe": {key: source}, "overridden": [keys]}``: the recipe values used, with their
    sources, and the recipe keys a flag replaced (keys the tuner chose are neither)."""
    sources = recipe.sources() if recipe is not None else {}
    return {"mode": mode, "recipe": {k: s for k, s in sources.items() if k not in given | tuned},
            "overridden": sorted((given - tuned) & set(sources))}


def build_from_args(args, trainer: str, seed: int | None = None, settings: str = "shared",
                    tuned: dict | None = None) -> Setup:
    """A ``Setup`` from parsed flags; raises the named user errors.

    ``settings="recipe"``: the trainer's recipe (``trainers.experiments.recipes``) under the flags the
    user gave; ``"shared"``: the flags over the ``TrainConfig`` and engine defaults.
    ``tuned``: ``{"values": {key: value}, ...}`` of ``trainers.experiments.tuning`` (keys ``lr`` or
    ``<trainer>.<option>``), which replace both; the whole dict is recorded.
    """
    recipe = recipe_for(trainer, args.model) if settings == "recipe" else None
    options_cls = engine_class(trainer).Options
    given_cfg = options_from_args(args, TrainConfig)
    given_engine = options_from_args(args, options_cls, prefix=f"{trainer}_")
    given = set(given_cfg) | {f"{trainer}.{k}" for k in given_engine}
    values = (tuned or {}).get("values", {})
    given_cfg.update({k: v for k, v in values.items() if "." not in k})
    given_engine.update({k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(f"{trainer}.")})
    cfg_options = {**(recipe.train_values() if recipe else {}), **given_cfg}
    if seed is not None:
        cfg_options["seed"] = seed
    cfg = parse_options(TrainConfig, cfg_options)
    engine = build_engine(trainer, **{**(recipe.engine_values() if recipe else {}), **given_engine})
    for other, flags in other_trainer_flags(args, trainer).items():  # unused, but never invalid
        build_engine(other, **flags)
    if args.data_dir is not None and not Path(args.data_dir).is_dir() and not args.download:
        raise DataError(f"data directory {args.data_dir} does not exist")
    with DataParallel().main_first():  # one download per job: rank 0 fills the cache, then the others read it
        task = tasks.build(args.task, data_dir=args.data_dir, download=args.download, seed=args.split_seed,
                           **parse_key_values(args.task_option, "--task-option"))
    model_options = {name[len("model_"):]: _model_value(name[len("model_"):], value)
                     for name, value in vars(args).items()
                     if name.startswith("model_") and name not in ("model_", "model_option")}
    extra = parse_key_values(args.model_option, "--model-option")
    twice = sorted(set(extra) & set(model_options))
    if twice:
        raise ConfigError(f"--model-option {twice[0]} repeats --{twice[0].replace('_', '-')}; give it once")
    model_options.update(extra)
    for key, value in (("in_features", task.in_features), ("out_features", task.num_outputs)):
        if key not in model_options and models.takes_option(args.model, key):  # the task's sizes, if it takes them
            model_options[key] = value
    user = models.user.is_reference(args.model)
    # geotorch's parametrizations cannot initialise on the meta device; the plain layer has their parameter count
    estimate_options = {**model_options, "orthogonal": None} if model_options.get("orthogonal") in ("expm", "cayley") \
        else model_options

    def fits(build) -> None:
        check_fits(build, task.train.inputs[:1], batch_size=min(cfg.batch_size, len(task.train)),
                   optimizer=cfg.optimizer, momentum=cfg.momentum, dtype=getattr(torch, cfg.dtype),
                   device=torch.device(local_device(cfg.device)), depth=model_options.get("depth"))

    if not user:  # a zoo model is estimated on the meta device before anything is allocated
        fits(lambda: models.build(args.model, **estimate_options))
    seed_everything(cfg.seed)  # model initialization depends on the seed only
    call = model_call_options(args.call)
    model = models.build(args.model, **model_options)
    if call:
        models.declare_call(model, **call)
    if user:  # a user's constructor runs once (it may print, count, download): the estimate reads the built model
        fits(lambda: model)
        auto_wrap_recurrent(model)
    record = _settings_record(settings, recipe, given, set(values))
    if tuned:
        record["tuned"] = tuned
    return Setup(engine, task, model, cfg, {"name": args.model, **model_options}, record)


def model_call_options(items: list[str]) -> dict:
    """``--model-call KEY=VALUE`` items as ``models.ModelCall`` fields; an unknown key is one line."""
    call = parse_key_values(items, "--model-call")
    unknown = sorted(set(call) - set(models.calling.CALL_KEYS))
    if unknown:
        raise ConfigError(f"--model-call has no key {unknown[0]!r}; keys: {', '.join(models.calling.CALL_KEYS)}")
    call = {k: v if k == "output" and isinstance(v, int) else str(v) for k, v in call.items()}
    models.ModelCall(**call)  # checked before anything is built
    return call


def other_trainer_flags(args, trainer: str) -> dict[str, dict]:
    """The engine options given on the command line for trainers other than ``trainer``: name -> options."""
    given = {other: options_from_args(args, engine_class(other).Options, prefix=f"{other}_")
             for other in available() if other != trainer}
    return {other: flags for other, flags in given.items() if flags}


def auto_wrap_recurrent(model) -> None:
    """A user's model with nn.GRU / LSTM / RNN modules gets ``models.wrap_recurrent`` (the same forward and
    Parameters), so DSF, FT-BPTT and Highway-BP accept it from the command line; one that cannot be wrapped
    (bidirectional, ...) is left as it is, for the trainers that need no structure."""
    if "recurrent_layers" not in vars(model) and any(type(m) in (nn.GRU, nn.LSTM, nn.RNN) for m in model.modules()):
        try:
            models.wrap_recurrent(model)
        except models.ModelConfigError as err:
            model.recurrent_refusal = str(err)  # what the recurrent trainers' refusal then says


def join_job(args) -> DataParallel:
    """This process's rank under torchrun (a one-rank ``DataParallel`` otherwise)."""
    return init_distributed(args.dist_backend, args.dist_timeout, device=getattr(args, "device", "cpu"))


def check_seed(seed: int, flag: str) -> None:
    """Seeds are 0 <= seed < 2**32 (NumPy's range)."""
    if not 0 <= seed < SEED_RANGE:
        raise ConfigError(f"{flag} must be in [0, 2**32), got {seed}")


def run_cli(main) -> int:
    """Run ``main()`` with errors spelled as flags; one line on stderr for every failure.

    Exit 2: user errors and OS errors before training started (``--logdir`` not
    writable, a file, a full disk); exit 1: a NaN loss, a lost rank, or a write that
    failed during training (``RunWriteError`` says what was kept), memory that ran out during
    training; exit 130: Ctrl-C; exit 143: SIGTERM (turned into ``Terminated`` while ``main`` runs,
    so a run stops as on Ctrl-C: its last checkpoint kept, ``--resume`` exact). Under torchrun every
    rank prints its own error (prefixed with its rank); the scripts end with
    ``trainers.core.distributed.exit_process``, which closes the group.
    """
    forget_notes()
    previous = _on_sigterm(_terminate)
    try:
        return _run_reporting(main)
    finally:
        if previous is not None:
            _on_sigterm(previous)


def _run_reporting(main) -> int:
    """``run_cli``'s body: ``main()``, every failure as one line on stderr and its exit code."""
    try:
        with command_line():
            return main() or 0
    except USER_ERRORS as err:
        code, message = 2, str(err)
    except (NonFiniteLossError, DistributedError, RunWriteError, RunOutOfMemory, ModelRunError) as err:
        code, message = 1, str(err)
    except OSError as err:
        code, message = 2, f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err)
    except KeyboardInterrupt as err:
        terminated = isinstance(err, (Terminated, RunTerminated))
        code = TERMINATED if terminated else INTERRUPTED
        message = str(err) or ("terminated (SIGTERM)" if terminated else "interrupted")
    except (MemoryError, RuntimeError) as err:  # a failed allocation before training: the sizes asked for
        if not out_of_memory(err):
            raise
        code, message = 2, f"{out_of_memory(err)}; lower the sizes asked for (batch, model, --task-option)"
    here = DataParallel()
    prefix = f"[rank {here.rank}/{here.world_size}] " if here.active and not message.startswith("rank ") else ""
    # one write of the whole line: the ranks of a torchrun job print at the same moment, and a print's separate
    # write of its newline let two ranks' lines run together
    sys.stderr.write(f"error: {prefix}{message}\n")
    sys.stderr.flush()
    return code


def _terminate(signum, frame):
    raise Terminated()


def _on_sigterm(handler):
    """Install ``handler`` for SIGTERM (main thread only; elsewhere nothing) and return the previous one."""
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None


def train_main(argv=None, prog: str | None = None) -> int:
    """``scripts/train.py``: train one model with one trainer."""
    parser = base_parser("Train a zoo model (or your own, --model FILE.py:CLASS) on a task with one gradient engine.",
                         prog)
    parser.add_argument("--trainer", default="backprop", help=f"gradient engine: {', '.join(available())}")
    parser.add_argument("--experiment", default="train", help="experiment folder under --logdir (default: train)")
    add_settings_flag(parser, default="shared")
    args = parser.parse_args(argv)

    def main():
        set_threads(args.threads)
        check_run_flags(args)
        here = join_job(args)
        setup = build_from_args(args, args.trainer, settings=args.settings)
        unused = [f"--{(t + '_' + k).replace('_', '-')}" for t, flags in other_trainer_flags(args, args.trainer).items()
                  for k in flags]
        if unused and here.is_main:
            note(f"{', '.join(unused)} {'is an option' if len(unused) == 1 else 'are options'} of another trainer, "
                 f"unused by '{args.trainer}'")
        trainer = Trainer(setup.model, setup.engine, setup.task, config=setup.config, logdir=args.logdir,
                          experiment=args.experiment, run_name=args.run_name, overwrite=args.overwrite,
                          meta=setup.meta, settings=setup.settings)
        report = trainer.fit(epochs=None if args.steps else args.epochs, steps=args.steps, resume=args.resume,
                             allow_changes=list(options_from_args(args, TrainConfig)))
        if here.is_main:
            if not trainer.finished_before:
                write_experiment_config(Path(args.logdir) / args.experiment)
            print(json.dumps({"run": str(trainer.run_dir), **report}, indent=2))

    return run_cli(main)


# The comparison ``scripts/compare.py`` runs with no arguments (under a minute on 2 CPU cores);
# flags replace single entries, and ``--model`` drops the model entries. Optimizer settings
# come from each trainer's recipe (``trainers.experiments.recipes``), so none may appear here.
DEFAULT_COMPARISON = dict(
    task="digits", model="mlp", model_depth=4, model_width="64", model_activation="tanh",
    model_orthogonal="bjorck", epochs=30, seeds="0,1,2", grad_agreement_every=10,
)


def check_run_flags(args) -> None:
    """The flags of the run itself: its length and seeds (before anything is built)."""
    if args.epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {args.epochs}")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1 (the run must have at least one step), got {args.steps}")
    check_seed(args.split_seed, "--split-seed")
    for seed in _int_list(getattr(args, "seeds", None) or "", "--seeds", unique=True):
        check_seed(seed, "--seeds")
    if getattr(args, "tune_seed", None) is not None:
        check_seed(args.tune_seed, "--tune-seed")


def add_settings_flag(parser, default: str) -> None:
    """``--settings recipe|shared`` (``trainers.experiments.recipes``)."""
    parser.add_argument("--settings", choices=("recipe", "shared"), default=default,
                        help="recipe: each trainer's published (or measured) optimizer, learning rate, batch size "
                             "and engine options, see trainers/experiments/recipes.py; shared: the same defaults for "
                             "every "
                             f"trainer. Flags you give override both (default: {default})")


def _int_list(text: str, flag: str, minimum: int | None = None, unique: bool = False) -> list[int]:
    """``"8,32"`` -> [8, 32]; ``flag`` names the option in errors."""
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"{flag} expects a comma list of integers, got {text!r}") from None
    if minimum is not None and any(v < minimum for v in values):
        raise ConfigError(f"{flag} values must be >= {minimum}, got {text!r}")
    if unique and len(set(values)) < len(values):
        raise ConfigError(f"{flag} lists a value twice: {text!r}")
    return values


def _trainer_specs(text: str) -> list[str]:
    return [t.strip() for t in text.split(";") if t.strip()]


def _mlp_trainers() -> list[str]:
    """Every registered trainer that accepts the engines suite's (orthogonal) MLP."""
    mlp = models.build("mlp", in_features=8, out_features=4, depth=2, width=8, orthogonal="bjorck")
    return [name for name in available() if compatible(name, mlp)]


def compare_main(argv=None, prog: str | None = None) -> int:
    """``scripts/compare.py``: several trainers, same model, task and seeds, one logdir."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = base_parser("Train several gradient engines on the same model, task and seeds; "
                         "write TensorBoard runs, summary.md and comparison.png. "
                         "With no arguments, runs the default comparison on digits.", prog)
    parser.add_argument("--trainers", default=None,
                        help="comma list of trainers (default: every trainer compatible with the model)")
    parser.add_argument("--seeds", help="comma list of seeds")
    parser.add_argument("--experiment", help="experiment folder under --logdir (default: compare-<task>)")
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
                            "as TRAINER.OPTION, e.g. --tune-grid foton.temperature=1,4,8; the budget per trainer "
                            "is the product of the dimensions")
    group.add_argument("--tune-seed", type=int, default=None, help="seed of the trials (default: the first seed)")
    model_given = any(a == "--model" or a.startswith("--model=") for a in argv)
    parser.set_defaults(**{k: v for k, v in DEFAULT_COMPARISON.items()
                           if not (model_given and k.startswith("model"))})
    parser.set_defaults(log_axis="samples")  # TensorBoard's step: samples seen, so batch sizes overlay
    args = parser.parse_args(argv)

    def main():
        set_threads(args.threads)
        check_run_flags(args)
        here = join_job(args)
        seeds = _int_list(args.seeds, "--seeds")
        if not seeds:
            raise ConfigError("--seeds lists no seed")
        if args.trainers is None:
            probe = build_from_args(args, "backprop", seeds[0]).model
            names = [t for t in available() if compatible(t, probe)]
        else:
            names = [t.strip() for t in args.trainers.split(",") if t.strip()]
            if not names or len(set(names)) < len(names):
                raise ConfigError(f"--trainers must list each trainer once, got {args.trainers!r}")
        experiment = args.experiment or f"compare-{args.task}"
        if args.run_name is not None and len(names) != 1:
            raise ConfigError("--run-name names the run of a single trainer; give one trainer with --trainers")
        if args.tune_grid and not args.tune:
            raise ConfigError("--tune-grid is a grid for --tune; pass --tune too")
        if args.timing_rounds < 5:
            raise ConfigError(f"--timing-rounds must be >= 5 for a meaningful median, got {args.timing_rounds}")
        if args.target is not None and not math.isfinite(args.target):
            raise ConfigError(f"--target must be a finite number, got {args.target}")
        reference_trainer(names, args.reference)  # an unknown reference fails before any work
        tuned = tune_all(args, names, seeds, experiment, here) if args.tune else {}
        out = run_comparison(lambda t, s: build_from_args(args, t, s, args.settings, tuned.get(t)), names, seeds,
                             logdir=args.logdir, run_name=args.run_name, experiment=experiment,
                             epochs=None if args.steps else args.epochs, steps=args.steps, resume=args.resume,
                             overwrite=args.overwrite, allow_changes=list(options_from_args(args, TrainConfig)),
                             budget=args.budget, reference=args.reference, target=args.target,
                             timing_rounds=args.timing_rounds)
        if here.is_main:
            print(out["table"])
            print(f"runs, summary.md and comparison.png in {out['dir']}")
            print(f"tensorboard --logdir {out['dir']}")
        if out["failures"]:
            names = ", ".join(f"{f['run']} seed {f['seed']}" for f in out["failures"])
            raise NonFiniteLossError(f"{len(out['failures'])} run(s) stopped on a non-finite loss ({names}); "
                                     f"the others finished, see {out['dir'] / 'summary.md'}")

    return run_cli(main)


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
        records[t] = {"values": record["best"], "grid": record["grid"], "budget": record["budget"], "seed": seed}
        if here.is_main:
            print(f"tuned {t}: {trial_name(record['best'])} (best val {record['metric']} "
                  f"{record['best_val'][record['metric']]:.4f}, {record['budget']} trials on seed {seed})")
    return records


def bench_main(argv=None, prog: str | None = None) -> int:
    """``scripts/bench.py``: step time and peak memory, as ratios to backprop, JSON + Markdown."""
    from trainers import bench

    parser = OneLineParser(prog=prog, description="Benchmark step time (median) and peak memory per trainer.")
    parser.add_argument("--suite",
                        choices=["overhead", "engines", "grads", "upkeep", "recurrent", "residual", "scan", "user",
                                 "all"],
                        default="all")
    parser.add_argument("--lengths", default="256,1024,4096", help="comma list of sequence lengths (recurrent, scan)")
    parser.add_argument("--trainers", default=None,
                        help="';'-separated trainer specs, e.g. 'backprop;foton;foton:mode=lowmem' (engines suite; "
                             "default: every trainer that accepts an MLP) or 'backprop;ftbptt;dsf;bptt_loop' "
                             "(recurrent suite; that is its default) or "
                             "'backprop;highway:k=0;highway:k=5;highway:k=10' "
                             "(residual suite; its default: k = 0, 5, 10 on both paths)")
    parser.add_argument("--depths", default="8,32", help="comma list of MLP depths (engines suite)")
    parser.add_argument("--widths", default="256", help="comma list of MLP widths (engines and residual suites)")
    parser.add_argument("--residual-depth", type=int, default=32, help="blocks of the residual suite's residual_mlp")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batch-sizes", default="64,256", help="comma list of batch sizes (upkeep suite)")
    parser.add_argument("--cell", default="gru", help="recurrent cell (recurrent suite)")
    parser.add_argument("--hidden", type=int, default=512, help="recurrent state size (recurrent and scan suites)")
    parser.add_argument("--recurrent-depths", default="1,3", help="comma list of recurrent layers (recurrent suite)")
    parser.add_argument("--recurrent-batch-size", type=int, default=128, help="batch (recurrent and scan suites)")
    parser.add_argument("--vocab", type=int, default=64, help="token vocabulary of the recurrent suite's LM")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA (all trainers alike)")
    parser.add_argument("--orthogonal", default="bjorck", help="orthogonality of the engines-suite MLP (or none)")
    parser.add_argument("--orthogonal-iters", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.0, help="hidden dropout of the MLP (grads suite)")
    parser.add_argument("--steps", type=int, default=30,
                        help="timed steps per trainer, interleaved: each round one step of every trainer, ratios "
                             "are medians over rounds (engines, recurrent, residual); per round for overhead; >= 20")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (overhead suite)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="bench_out", help="folder for bench.json and bench.md")
    add_threads_flag(parser)
    args = parser.parse_args(argv)

    def main():
        set_threads(args.threads)
        if args.steps < 20:
            raise ConfigError(f"--steps must be >= 20 for a meaningful median, got {args.steps}")
        sizes = {flag: _int_list(getattr(args, flag), "--" + flag.replace("_", "-"), minimum=1)
                 for flag in ("depths", "widths", "lengths", "recurrent_depths", "batch_sizes")}
        for flag in ("batch_size", "residual_depth", "hidden", "recurrent_batch_size", "vocab", "rounds",
                     "orthogonal_iters", "warmup"):
            if getattr(args, flag) < (0 if flag == "warmup" else 1):
                raise ConfigError(f"--{flag.replace('_', '-')} must be >= {0 if flag == 'warmup' else 1}, "
                                  f"got {getattr(args, flag)}")
        if not 0.0 <= args.dropout < 1.0:
            raise ConfigError(f"--dropout must be in [0, 1), got {args.dropout}")
        check_device(args.device)
        Path(args.out).mkdir(parents=True, exist_ok=True)  # an unwritable --out fails now, not after the timing
        with tempfile.NamedTemporaryFile(dir=args.out):  # a read-only --out too
            pass
        engine_names = _trainer_specs(args.trainers) if args.trainers else _mlp_trainers()
        recurrent_names = _trainer_specs(args.trainers or "backprop;ftbptt;dsf;bptt_loop")
        residual_names = _trainer_specs(args.trainers or ";".join(
            ["backprop"] + [f"highway:k={k},path={p}" for p in ("batched", "reference") for k in (0, 5, 10)]))
        for name in {*engine_names, *recurrent_names, *residual_names} - {"bptt_loop"}:
            bench.engine_from_spec(name)  # unknown trainers and options fail here, before any timing
        device = torch.device(args.device)
        if args.tf32:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        rows = []
        if args.suite in ("overhead", "all"):
            for in_features, width, depth, batch in ((64, 64, 3, 64), (256, 1024, 4, 256)):
                rows.append(bench.bench_overhead(in_features=in_features, width=width, depth=depth,
                                                 batch_size=batch, n_train=8 * batch, steps=args.steps,
                                                 warmup=args.warmup, rounds=args.rounds, device=device))
        if args.suite in ("engines", "all"):
            rows += bench.bench_engines(trainers=engine_names, depths=sizes["depths"],
                                        widths=sizes["widths"], batch_size=args.batch_size, steps=args.steps,
                                        warmup=args.warmup, device=device,
                                        orthogonal=None if args.orthogonal == "none" else args.orthogonal,
                                        orthogonal_iters=args.orthogonal_iters)
        if args.suite in ("recurrent", "all"):
            rows += bench.bench_recurrent(trainers=recurrent_names, cell=args.cell,
                                          depths=sizes["recurrent_depths"], hidden=args.hidden,
                                          lengths=sizes["lengths"], batch_size=args.recurrent_batch_size,
                                          vocab=args.vocab, steps=args.steps, warmup=args.warmup, device=device)
        if args.suite in ("residual", "all"):
            for width in sizes["widths"]:
                rows += bench.bench_residual(trainers=residual_names, depth=args.residual_depth, width=width,
                                             batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                                             device=device)
        if args.suite in ("grads", "all"):
            rows += bench.bench_grads(trainers=engine_names, depths=sizes["depths"], widths=sizes["widths"],
                                      batch_size=args.batch_size, steps=args.steps, warmup=args.warmup, device=device,
                                      orthogonal=None if args.orthogonal == "none" else args.orthogonal,
                                      orthogonal_iters=args.orthogonal_iters, dropout=args.dropout)
        if args.suite in ("upkeep", "all"):
            rows += bench.bench_upkeep(trainers=_trainer_specs(args.trainers or "backprop;foton"),
                                       depths=sizes["depths"], widths=sizes["widths"],
                                       batch_sizes=sizes["batch_sizes"], steps=args.steps, warmup=args.warmup,
                                       device=device, orthogonal_iters=args.orthogonal_iters)
        if args.suite in ("user", "all"):
            rows += bench.bench_user(steps=args.steps, warmup=args.warmup, device=device)
        if args.suite in ("scan", "all"):
            rows += bench.bench_scan(lengths=sizes["lengths"], batch_size=args.recurrent_batch_size,
                                     width=args.hidden, repeats=max(3, args.steps // 10), device=device)
        command = "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
        print(bench.write_results(rows, args.out, bench.machine_description(device), command.strip()))

    return run_cli(main)


def table_main(argv=None, prog: str | None = None) -> int:
    """``scripts/table.py``: the result.json files below a folder as one Markdown table (and a figure)."""
    from trainers.experiments.compare import collect_results, pivot_cells, pivot_table

    parser = OneLineParser(prog=prog, description="Gather the result.json files of many runs into one Markdown "
                                                  "table: rows are experiment folders, columns run names, cells "
                                                  "mean ± std over seeds (count).")
    parser.add_argument("root")
    parser.add_argument("--value", choices=["test", "best_val", "final_val"], default="test")
    parser.add_argument("--columns", default=None, help="comma list of run names, in order")
    parser.add_argument("--plot", default=None, help="also write a PNG: one panel per experiment, metric per run")
    args = parser.parse_args(argv)

    def main():
        rows = collect_results(args.root)
        if not rows:
            raise DataError(f"no result.json below {args.root}")
        columns = args.columns.split(",") if args.columns else None
        print(pivot_table(rows, value=args.value, columns=columns), end="")
        if args.plot:
            from trainers.experiments.plots import plot_runs

            cells, experiments, runs = pivot_cells(rows, value=args.value, columns=columns)
            plot_runs(cells, experiments, runs, f"{args.value} {rows[0]['metric']}", args.plot)
            print(f"figure: {args.plot}")

    return run_cli(main)


COMMANDS = {"train": train_main, "compare": compare_main, "bench": bench_main, "table": table_main}


def main(argv=None) -> int:
    """``gradengines COMMAND ...``: the scripts as one installed command (``pip install .``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = f"usage: gradengines {{{','.join(COMMANDS)}}} [--help | OPTIONS]"
    if argv and argv[0] in ("-h", "--help"):
        print(usage + "\n\n  train    train one model with one trainer\n  compare  several trainers, same model, task "
              "and seeds\n  bench    step time and memory against backprop\n  table    result.json files as one "
              "Markdown table\n\n'gradengines COMMAND --help' lists the options of each.")
        return 0
    if not argv or argv[0] not in COMMANDS:
        what = f"unknown command '{argv[0]}'" if argv else "give a command"
        print(f"error: {what}; {usage[len('usage: '):]}", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:], prog=f"gradengines {argv[0]}")


def console() -> None:
    """The ``gradengines`` console script: ``main``, then ``exit_process`` (``torchrun`` safe)."""
    from trainers.core.distributed import exit_process

    exit_process(main())
