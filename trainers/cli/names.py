"""Default run folders: ``<logdir>/<experiment>/<run>/seed<k>``, named by what makes an experiment different.

A command's default experiment name is built from what it was given that a resume may not change, so that two
different experiments never share a folder and the same command (or its ``--resume``) always finds its own:

    <command>[-<model>][-<flag>=<value>...]-<task>[-<option>=<value>...][-<optimizer>][-<schedule>][-<dtype>][-<precision>]
             [-<settings>][-<trainer>+<trainer>...][-tuned]

- ``<model>``: the zoo name, or the class or factory of ``FILE.py:CLASS`` / ``module:factory``; ``compare``
  leaves it out for its default model (``scripts/compare.py`` with no ``--model``: ``compare-digits``).
- the model flags (``--depth 4``: ``depth=4``, in the order of ``--help``) and ``--model-option``s (by key) that
  differ from the command's defaults; the task, then its ``--task-option``s (by key);
- ``--optimizer``, ``--schedule``, ``--dtype``, ``--precision`` and ``--settings`` when given and not the default;
- ``compare`` only: the trainers of ``--trainers`` (``backprop+fa``), and ``-tuned`` with ``--tune``.

The run folder is the trainer's name, with the engine options given on the command line as ``compare`` names
its runs (``--highway-k 2``: ``highway-k2``). Options a resume may change (learning rate, batch size, evaluation,
logging) are not in the name. Characters other than letters, digits and ``._=+,-`` become ``_``; a name longer
than ``MAX_NAME`` (file systems allow 255) keeps its first characters and ends with a hash of the whole.
``--experiment`` and ``--run-name`` replace the defaults.
"""

import hashlib
import re

from gradengines.trainers.cli.args import MODEL_FLAGS
from gradengines.trainers.core.options import parse_key_values
from gradengines.trainers.core.registry import engine_class

__all__ = ["default_experiment", "default_run_name", "MAX_NAME"]

MAX_NAME = 200
"""The longest default name; past it, the first ``MAX_NAME - 9`` characters and an 8-digit hash."""

TRAINING_PARTS = ("optimizer", "schedule", "dtype", "precision")
"""Training options that a resume may not change (``trainers.run.rundir.FIXED`` less the seed, a folder of its
own): given explicitly, they make another experiment."""


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+,-]", "_", text).lstrip(".") or "_"


def _value(value) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _given(args, parser, dest: str) -> bool:
    """Whether ``dest`` holds a value other than the parser's default (a suppressed default: present at all)."""
    return dest in vars(args) and getattr(args, dest) != parser.get_default(dest)


def _shorten(name: str) -> str:
    if len(name) <= MAX_NAME:
        return name
    return f"{name[:MAX_NAME - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def model_name(spec: str) -> str:
    """``mlp`` -> ``mlp``; ``my_models.py:Net`` -> ``Net``; ``transformers:GPT2LMHeadModel`` -> ``GPT2LMHeadModel``
    (and a task factory ``my_data.py:csv_task`` -> ``csv_task``)."""
    return spec.rpartition(":")[2] or spec


def default_experiment(command: str, args, parser, *, name_model: bool = True,
                       trainers: list[str] | None = None) -> str:
    """The experiment folder of ``command`` (``train`` or ``compare``) for these parsed ``args`` (module docstring);
    ``name_model``: False for compare's default model; ``trainers``: the run names of compare's ``--trainers``
    (None: every compatible trainer)."""
    parts = [command]
    if name_model:
        parts.append(model_name(args.model))
    parts += [f"{name}={_value(getattr(args, 'model_' + name))}" for name in MODEL_FLAGS
              if _given(args, parser, "model_" + name)]
    parts += [f"{k}={_value(v)}" for k, v in sorted(parse_key_values(args.model_option, "--model-option").items())]
    parts.append(model_name(args.task))  # a factory FILE.py:NAME by its name, as a model
    parts += [f"{k}={_value(v)}" for k, v in sorted(parse_key_values(args.task_option, "--task-option").items())]
    parts += [str(getattr(args, name)) for name in TRAINING_PARTS if _given(args, parser, name)]
    if _given(args, parser, "settings"):
        parts.append(args.settings)
    if trainers:
        parts.append("+".join(trainers))
    if getattr(args, "tune", False):
        parts.append("tuned")
    return _shorten(_clean("-".join(parts)))


def default_run_name(args, trainer: str) -> str:
    """``train``'s run folder: the trainer, then its engine options given on the command line, as ``compare``
    names ``TRAINER:OPTION=VALUE`` (``highway-k2``)."""
    given = vars(args)
    options = [f"{f}{_value(given[trainer + '_' + f])}" for f in engine_class(trainer).Options.__dataclass_fields__
               if trainer + "_" + f in given]
    return _shorten(_clean("-".join([trainer, *options])))
