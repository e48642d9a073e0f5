"""Every named error of the framework, in one place.

``USER_ERRORS`` are mistakes in what the user asked for; the command-line
scripts print their one-line message on stderr and exit with code 2.
"""

from models.errors import ModelConfigError
from tasks.errors import DataError, TaskConfigError

__all__ = [
    "ConfigError",
    "DataError",
    "DistributedError",
    "IncompatibleModelError",
    "ModelConfigError",
    "NonFiniteLossError",
    "TaskConfigError",
    "USER_ERRORS",
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


class DistributedError(RuntimeError):
    """A collective failed: another rank died or hung past the timeout (one line)."""


USER_ERRORS = (ConfigError, IncompatibleModelError, ModelConfigError, DataError, TaskConfigError)
