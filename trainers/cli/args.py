"""What the commands share: the flag set of train and compare (generated from ``TrainConfig`` and each
engine's ``Options``), a parser whose errors are one line, and the one way a command turns flags into a
run's ``Setup`` (task, model, engine, settings and where each came from)."""

import argparse
import dataclasses
import math
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from gradengines import models, tasks
from gradengines.trainers.core.distributed import BACKENDS, DataParallel, init_distributed, local_device
from gradengines.trainers.core.errors import (
    ConfigError,
    DataError,
    IncompatibleModelError,
)
from gradengines.trainers.core.options import add_arguments, options_from_args, parse_key_values, parse_options
from gradengines.trainers.core.registry import (
    available,
    build_engine,
    engine_class,
    engine_origin,
    resolve_engine,
    split_spec,
)
from gradengines.trainers.core.rng import seed_everything
from gradengines.trainers.core.threads import THREADS_ENV
from gradengines.trainers.experiments.compare import compatible
from gradengines.trainers.experiments.recipes import check_recipe, recipe_for
from gradengines.trainers.run.config import TrainConfig
from gradengines.trainers.run.memory import check_fits, check_fits_scaled
from gradengines.trainers.run.notes import note_once
from gradengines.trainers.run.rundir import check_folder_name

__all__ = ["OneLineParser", "Setup", "base_parser", "with_engine_names", "build_from_args", "add_threads_flag",
           "add_settings_flag", "check_run_flags", "check_seed", "int_list", "trainer_specs", "trainer_runs",
           "mlp_trainers", "join_job",
           "auto_wrap_recurrent", "residual_structure", "trainers_for", "model_call_options", "other_trainer_flags",
           "MODEL_FLAGS", "SEED_RANGE"]


SEED_RANGE = 2**32  # NumPy's seeds are 32-bit
SCALED_FROM = 16  # layer counts above which a library model is estimated from 1 and 2 layers before it is built


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
    "activation": (str, f"hidden activation: {', '.join(models.layers.activations.ACTIVATIONS)}"),
    "dropout": (float, "dropout probability"),
    "bias": (str, "use biases: true or false"),
    "orthogonal": (str, "orthogonal hidden layers: none, expm, cayley (geotorch), bjorck, polar (projection) or "
                        "retraction (Cayley retraction of plain SGD steps)"),
    "orthogonal_iters": (int, "most Bjorck iterations per projection (fewer when the deviation allows)"),
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


def _resume_value(text: str) -> str:
    if text != "auto":
        raise argparse.ArgumentTypeError(f"takes no value or 'auto', got {text!r}")
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
                             "forward requires a second argument), targets=no|KEYWORD[+KEYWORD] (default: a "
                             "parameter named targets, target or y; labels too with loss=model), "
                             "layout=batch_first|time_first, loss=task|model|own (the model's own loss where an "
                             "engine needs only a loss; own: known to differ from the task's, no note of how far); "
                             "models/adapters/calling.py")
    parser.add_argument("--task", default="digits",
                        help=f"task: {', '.join(tasks.available())}, or your own factory FILE.py:NAME or "
                             f"MODULE:NAME returning a tasks.Task or the train, val and test Datasets, called with "
                             f"the --task-options (default: digits)")
    parser.add_argument("--data-dir", default=None, help="directory of the dataset files (file-based tasks)")
    parser.add_argument("--download", action="store_true", help="download missing dataset files into the cache")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the train/val split (default: 0)")
    parser.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a task option, e.g. --task-option n_train=4096 (repeatable; a factory's keyword)")
    parser.add_argument("--epochs", type=int, default=10, help="training epochs (default: 10)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (overrides --epochs)")
    parser.add_argument("--logdir", default="runs", help="root of the TensorBoard runs (default: runs)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, type=_resume_value, metavar="auto",
                        help="continue the run from its last checkpoint (refused where no run is); --resume auto: "
                             "continue it where there is one, start it where there is none (job schedulers)")
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


def with_engine_names(argv: list[str], flags: dict[str, str]) -> list[str]:
    """``argv`` with each engine reference (``FILE.py:Class``, ``module:Class``) in the values of ``flags`` (flag ->
    the separator of its list: ``{"--trainers": ","}``) replaced by its registered name: registered now, before the
    parser is built, so its options are flags (``--<name>-<option>``), its recipe checked, and everything after
    names it as it names the built-ins (``trainers.core.registry``). Options given with it are kept
    (``my_rule.py:SignSGD:clip=1`` -> ``signsgd:clip=1``). Raises ``ConfigError`` (one line)."""
    available()  # installed plugins registered (a broken one is one line here, not a traceback in the parser)

    def named(text: str, separator: str) -> str:
        items = []
        for item in text.split(separator):
            engine, options = split_spec(item.strip())
            if engine and (":" in engine or engine.endswith(".py")):
                engine = resolve_engine(engine)
                check_recipe(engine)
                item = ":".join([engine, *options])
            items.append(item)
        return separator.join(items)

    out, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        flag, equals, value = arg.partition("=")
        if flag in flags and equals:
            arg = f"{flag}={named(value, flags[flag])}"
        elif arg in flags and rest:
            out.append(arg)
            arg = named(rest.pop(0), flags[flag])
        out.append(arg)
    return out


def add_threads_flag(parser) -> None:
    """``--threads N|auto`` (``trainers.core.threads``)."""
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
                    tuned: dict | None = None, engine_options: dict | None = None) -> Setup:
    """A ``Setup`` from parsed flags; raises the named user errors.

    ``engine_options``: options of this trainer given with its name (``--trainers highway:k=1``), over
    its flags (``--highway-k``).
    ``settings="recipe"``: the trainer's recipe (``trainers.experiments.recipes``) under the flags the
    user gave; ``"shared"``: the flags over the ``TrainConfig`` and engine defaults.
    ``tuned``: ``{"values": {key: value}, ...}`` of ``trainers.experiments.tuning`` (keys ``lr`` or
    ``<trainer>.<option>``), which replace both; the whole dict is recorded.
    """
    recipe = recipe_for(trainer, args.model) if settings == "recipe" else None
    options_cls = engine_class(trainer).Options
    given_cfg = options_from_args(args, TrainConfig)
    given_engine = {**options_from_args(args, options_cls, prefix=f"{trainer}_"), **(engine_options or {})}
    given = set(given_cfg) | {f"{trainer}.{k}" for k in given_engine}
    values = (tuned or {}).get("values", {})
    given_cfg.update({k: v for k, v in values.items() if "." not in k})
    given_engine.update({k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(f"{trainer}.")})
    cfg_options = {**(recipe.train_values() if recipe else {}), **given_cfg}
    if seed is not None:
        cfg_options["seed"] = seed
    cfg = parse_options(TrainConfig, cfg_options)
    for name, key, value in cfg.inapplicable(options_from_args(args, TrainConfig)):
        flag, needed = f"--{name.replace('_', '-')}", f"--{key} {value}"
        if key in given_cfg or not recipe:  # the user's own choice, or the defaults: the flag applies to nothing
            raise ConfigError(f"{flag} applies only with {needed}, and this run's {key} is {getattr(cfg, key)}; "
                              f"drop it or set {needed}")
        if DataParallel().is_main:  # once: a comparison builds each trainer's setup several times
            note_once(f"{flag} is unused by '{trainer}': its recipe's {key} is {getattr(cfg, key)} ({flag} applies "
                      f"only with {needed})")
    engine = build_engine(trainer, **{**(recipe.engine_values() if recipe else {}), **given_engine})
    for other, flags in other_trainer_flags(args, trainer).items():  # unused, but never invalid
        build_engine(other, **flags)
    if args.data_dir is not None and not Path(args.data_dir).is_dir() and not args.download:
        raise DataError(f"data directory {args.data_dir} does not exist")
    task_options = parse_key_values(args.task_option, "--task-option")
    for key, flag in (("data_dir", "--data-dir"), ("download", "--download"), ("seed", "--split-seed")):
        if key in task_options:
            raise ConfigError(f"--task-option {key}= is the flag {flag}: give it there")
    with DataParallel().main_first():  # one download per job: rank 0 fills the cache, then the others read it
        task = tasks.build(args.task, data_dir=args.data_dir, download=args.download, seed=args.split_seed,
                           **task_options)
    model_options = {name[len("model_"):]: _model_value(name[len("model_"):], value)
                     for name, value in vars(args).items()
                     if name.startswith("model_") and name not in ("model_", "model_option")}
    extra = parse_key_values(args.model_option, "--model-option")
    twice = sorted(set(extra) & set(model_options))
    if twice:
        raise ConfigError(f"--model-option {twice[0]} repeats --{twice[0].replace('_', '-')}; give it once")
    model_options.update(extra)
    for key, value in task_sizes(task).items():
        if key not in model_options and models.takes_option(args.model, key):  # the task's sizes, if it names them
            model_options[key] = value
    user = models.adapters.user.is_reference(args.model)
    # geotorch's parametrizations cannot initialise on the meta device; the plain layer has their parameter count
    estimate_options = {**model_options, "orthogonal": None} if model_options.get("orthogonal") in ("expm", "cayley") \
        else model_options

    def fits(build) -> None:
        batch_size = min(cfg.batch_size, task.train.size or cfg.batch_size)  # a stream without a length: full
        check_fits(build, task.train.take(slice(0, 1))[0], batch_size=batch_size,
                   optimizer=cfg.optimizer, momentum=cfg.momentum, dtype=getattr(torch, cfg.dtype),
                   device=torch.device(local_device(cfg.device)), depth=model_options.get("depth"))

    if not user:  # a zoo model is estimated on the meta device before anything is allocated
        fits(lambda: models.build(args.model, **estimate_options))
    else:  # a library model with many layers: estimated at 1 and 2 of them before it is built (seconds)
        scaled = getattr(models.adapters.user.load_reference(args.model), "layer_counts", ())
        counts = {k: v for k, v in model_options.items()
                  if k in scaled and isinstance(v, int) and not isinstance(v, bool) and v > SCALED_FROM}
        if counts:
            check_fits_scaled(lambda values: models.build(args.model, **{**model_options, **values}), counts,
                              task.train.take(slice(0, 1))[0],
                              batch_size=min(cfg.batch_size, task.train.size or cfg.batch_size),
                              optimizer=cfg.optimizer, momentum=cfg.momentum, dtype=getattr(torch, cfg.dtype),
                              device=torch.device(local_device(cfg.device)))
    seed_everything(cfg.seed)  # model initialization depends on the seed only
    call = model_call_options(args.call)
    model = models.build(args.model, **model_options)
    if call:
        models.declare_call(model, **call)
    if user:  # a user's constructor runs once (it may print, count, download): the estimate reads the built model
        fits(lambda: model)
        auto_wrap_recurrent(model)
    if trainer == "highway":
        model = residual_structure(model, task)
    record = {**_settings_record(settings, recipe, given, set(values)), "engine": engine_origin(trainer)}
    if tuned:
        record["tuned"] = tuned
    return Setup(engine, task, model, cfg, {"name": args.model, **model_options}, record)


def task_sizes(task) -> dict:
    """What a model constructor may name to be sized to the task: ``in_features``, ``out_features``,
    ``input_shape`` and, for token inputs, ``input_vocab`` (the number of input ids)."""
    sizes = {"in_features": task.in_features, "out_features": task.num_outputs, "input_shape": list(task.input_shape)}
    largest = [split.largest_input() for split in (task.train, task.val, task.test)]
    if all(ids is not None for ids in largest):
        sizes["input_vocab"] = 1 + max(largest)
    return sizes


def model_call_options(items: list[str]) -> dict:
    """``--model-call KEY=VALUE`` items as ``models.ModelCall`` fields; an unknown key is one line."""
    call = parse_key_values(items, "--model-call")
    unknown = sorted(set(call) - set(models.adapters.calling.CALL_KEYS))
    if unknown:
        keys = ", ".join(models.adapters.calling.CALL_KEYS)
        raise ConfigError(f"--model-call has no key {unknown[0]!r}; keys: {keys}")
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


def residual_structure(model, task):
    """A model that is neither a residual stack nor recurrent layers, as the residual stack Highway-BP needs,
    found from two training samples (``models.residual_stack``); says what it found in one line, or why it
    cannot (a ``ConfigError``)."""
    if compatible("highway", model):
        return model
    try:
        stack = models.residual_stack(model, example=_example(task))
    except models.ModelConfigError as err:
        recurrent = getattr(model, "recurrent_refusal", None)  # its nn.GRU/LSTM/RNN could not be wrapped: the reason
        if recurrent:
            raise ConfigError(f"trainer 'highway' needs a residual stack or recurrent layers: "
                              f"{type(model).__name__}'s recurrent modules cannot be its recurrent layers "
                              f"({recurrent}), and no residual stack was found in it") from None
        raise ConfigError(f"trainer 'highway' needs a residual stack or recurrent layers, and none was found in "
                          f"{type(model).__name__}: {err}") from None
    if DataParallel().is_main:  # once per command (compare builds every seed)
        note_once(f"highway: found {stack.found}")
    return stack


def _example(task) -> tuple:
    """Two training samples (copies: the split is never handed to discovery), the run a residual stack is found
    from."""
    return task.train.take(slice(0, 2))


def trainers_for(model, task) -> tuple[list[str], dict[str, str]]:
    """The trainers ``model``'s structure allows, Highway-BP included where a residual stack is found in it;
    and, for each trainer left out, its refusal (one line)."""
    names, refused = [], {}
    for name in available():
        try:
            engine_class(name)().check(model)
        except IncompatibleModelError as err:
            if name != "highway":
                refused[name] = str(err)
                continue
            try:
                models.residual_stack(model, example=_example(task))
            except models.ModelConfigError as found:
                refused[name] = f"{err}; and no residual stack was found in it: {found}"
                continue
        names.append(name)
    return names, refused


def join_job(args) -> DataParallel:
    """This process's rank under torchrun (a one-rank ``DataParallel`` otherwise)."""
    return init_distributed(args.dist_backend, args.dist_timeout, device=getattr(args, "device", "cpu"))


def check_seed(seed: int, flag: str) -> None:
    """Seeds are 0 <= seed < 2**32 (NumPy's range)."""
    if not 0 <= seed < SEED_RANGE:
        raise ConfigError(f"{flag} must be in [0, 2**32), got {seed}")


def check_run_flags(args) -> None:
    """The flags of the run itself: its length and seeds (before anything is built)."""
    if args.epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {args.epochs}")
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1 (the run must have at least one step), got {args.steps}")
    check_seed(args.split_seed, "--split-seed")
    for what in ("experiment", "run_name"):  # the folder names, before anything is built
        if getattr(args, what, None) is not None:
            check_folder_name(what, getattr(args, what))
    training = options_from_args(args, TrainConfig)
    if training.get("precision") == "64" and training.get("dtype") == "float32":  # --precision 64 is float64
        raise ConfigError("--precision 64 is float64 throughout; --dtype float32 asks for float32: give one of the "
                          "two (--precision 32 is --dtype float32)")
    given = getattr(args, "seeds", None) or ""
    for seed in int_list("" if given == "auto" else given, "--seeds", unique=True):
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


def int_list(text: str, flag: str, minimum: int | None = None, unique: bool = False) -> list[int]:
    """``"8,32"`` -> [8, 32]; ``flag`` names the option in errors."""
    if text.strip() and any(not p.strip() for p in text.split(",")):
        raise ConfigError(f"{flag} has an empty item (a trailing or doubled comma): {text!r}")
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"{flag} expects a comma list of integers, got {text!r}") from None
    if minimum is not None and any(v < minimum for v in values):
        raise ConfigError(f"{flag} values must be >= {minimum}, got {text!r}")
    if unique and len(set(values)) < len(values):
        raise ConfigError(f"{flag} lists a value twice: {text!r}")
    return values


def trainer_specs(text: str) -> list[str]:
    return [t.strip() for t in text.split(";") if t.strip()]


def trainer_runs(text: str) -> dict[str, tuple[str, dict]]:
    """``--trainers`` of compare: ``NAME`` or ``NAME:OPTION=VALUE[:OPTION=VALUE]`` (``highway:k=1``), comma
    separated; returns run name -> (trainer, its options), the run named ``highway-k1``."""
    runs: dict[str, tuple[str, dict]] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item and text.strip():
            raise ConfigError(f"--trainers has an empty item (a trailing or doubled comma): {text!r}")
        if not item:
            continue
        trainer, *options = item.split(":")
        values = parse_key_values(options, f"--trainers {item}") if options else {}
        name = "-".join([trainer.strip(), *(f"{k}{v}" for k, v in values.items())])
        if name in runs:
            raise ConfigError(f"--trainers must list each trainer once, got {text!r}")
        runs[name] = (trainer.strip(), values)
    if not runs:
        raise ConfigError(f"--trainers must list each trainer once, got {text!r}")
    return runs


def mlp_trainers() -> list[str]:
    """Every registered trainer that accepts the engines suite's (orthogonal) MLP."""
    mlp = models.build("mlp", in_features=8, out_features=4, depth=2, width=8, orthogonal="bjorck")
    return [name for name in available() if compatible(name, mlp)]
