"""Every named error of the framework, in one place, and how advice is spelled.

``USER_ERRORS`` are mistakes in what the user asked for (or files the run
cannot use); the command-line scripts print their one-line message on stderr
and exit with code 2, before anything is written. ``RunWriteError`` (the disk
failed during training), ``NonFiniteLossError`` and ``DistributedError`` exit
with code 1. Messages name options the way the user sets them (``spell``):
``--lr`` and ``--resume`` on the command line, ``lr`` and ``fit(resume=True)``
from Python.
"""

import contextvars
import logging
import re
from collections.abc import Callable
from contextlib import contextmanager

import torch

from gradengines.models.errors import ModelConfigError
from gradengines.tasks.errors import DataError, TaskConfigError

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DamagedCheckpointError",
    "DataError",
    "DistributedError",
    "IncompatibleModelError",
    "ModelConfigError",
    "NonFiniteLossError",
    "ModelRunError",
    "RunBusyError",
    "RunInterrupted",
    "RunTerminated",
    "Terminated",
    "RunOutOfMemory",
    "RunWriteError",
    "TaskConfigError",
    "USER_ERRORS",
    "UnsafeCheckpointError",
    "command_line",
    "on_command_line",
    "out_of_memory",
    "spell",
    "interruption",
    "stage",
    "held_back",
]


class ConfigError(ValueError):
    """An engine name, engine option or training option is invalid (one line)."""


class IncompatibleModelError(Exception):
    """The engine cannot run on this model.

    The message says, in one line, what the engine needs and which zoo
    models qualify.
    """


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or Inf; training stopped, the last good checkpoint is kept."""


class ModelRunError(RuntimeError):
    """A user's model (``--model FILE.py:NAME``) raised during training; says at which step and what was kept."""


class DistributedError(RuntimeError):
    """A collective failed: another rank died or hung past the timeout (one line)."""


class RunBusyError(ConfigError):
    """Another process holds the run directory's lock (one writer per run)."""


class CheckpointError(Exception):
    """A checkpoint cannot be used (one line naming the file)."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint is truncated, garbled or not a checkpoint of this framework."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holds pickled objects besides tensors and plain values; refused unloaded."""


class RunInterrupted(KeyboardInterrupt):
    """Training was interrupted (Ctrl-C, SIGINT); says what was kept (one line)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``trainers.cli.run_cli`` turns it into this, so training stops as on Ctrl-C)."""


class RunTerminated(RunInterrupted):
    """Training was stopped by SIGTERM; says what was kept (one line); exit code 143."""


def interruption(err: KeyboardInterrupt, what: str) -> RunInterrupted:
    """The one line of a Ctrl-C (``RunInterrupted``) or a SIGTERM (``RunTerminated``, from ``Terminated``):
    ``"interrupted " + what`` or ``"terminated (SIGTERM) " + what``; ``what`` names the phase and what was kept."""
    if isinstance(err, Terminated):
        return RunTerminated(f"terminated (SIGTERM) {what}")
    return RunInterrupted(f"interrupted {what}")


@contextmanager
def stage(what: str | Callable[[], str]):
    """Within this block, Ctrl-C or SIGTERM ends the command with one line saying what was kept: ``"interrupted
    " + what`` (``what`` names the phase and what it leaves, e.g. "while building the model, before training:
    nothing was trained"; a function is asked at the interruption, for what is counted then); an interruption that
    already says it (a run's) passes through."""
    try:
        yield
    except RunInterrupted:
        raise
    except KeyboardInterrupt as err:
        raise interruption(err, what if isinstance(what, str) else what()) from None


@contextmanager
def held_back(logger: str):
    """Within this block, the records of the library logger ``logger`` below errors are held back: a check whose
    verdict is one line says it without the library's own warnings before it."""
    library = logging.getLogger(logger)
    level = library.level
    library.setLevel(logging.ERROR)
    try:
        yield
    finally:
        library.setLevel(level)


class RunOutOfMemory(RuntimeError):
    """Memory ran out during training; says at which step and what was kept (one line)."""


class RunWriteError(RuntimeError):
    """Writing the run failed during training (disk full, permissions); says what was kept (one line)."""


USER_ERRORS = (ConfigError, IncompatibleModelError, ModelConfigError, DataError, TaskConfigError, CheckpointError)

_COMMAND_LINE = contextvars.ContextVar("command_line", default=False)

# flags spelled otherwise than their option's name
_FLAG_SPELLING = {"resume_auto": "--resume auto"}

# how the Python API spells the advice the command line gives as flags
_PYTHON_SPELLING = {
    "resume": "fit(resume=True)",
    "resume_auto": "fit(resume='auto')",
    "overwrite": "Trainer(..., overwrite=True)",
    "run_name": "Trainer(..., run_name=...)",
    "experiment": "Trainer(..., experiment=...)",
}


def out_of_memory(err: BaseException) -> str | None:
    """``"out of memory (...)"`` if ``err`` is a failed allocation (CPU or GPU), else None."""
    text = str(err)
    cpu_allocator = isinstance(err, RuntimeError) and "can't allocate memory" in text
    if not (cpu_allocator or isinstance(err, (MemoryError, torch.OutOfMemoryError))):
        return None
    tried = re.search(r"(?:tried to allocate|allocate) (\d+(?:\.\d+)?) ?(bytes|[KMGT]iB)", text)
    if tried is None:
        return "out of memory"
    size = float(tried.group(1)) * {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[tried.group(2)]
    return f"out of memory (an allocation of {size / 2**30:.1f} GiB failed)"


def on_command_line() -> bool:
    """Whether the current error is for a command-line user (inside ``command_line()``)."""
    return _COMMAND_LINE.get()


def spell(name: str) -> str:
    """Option ``name`` as the user sets it: ``--kebab-case`` on the command line, else its Python spelling."""
    if on_command_line():
        return _FLAG_SPELLING.get(name, "--" + name.replace("_", "-"))
    return _PYTHON_SPELLING.get(name, name)


@contextmanager
def command_line():
    """Within this block, errors spell options as flags (``scripts/*.py``)."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)
