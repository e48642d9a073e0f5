"""Named errors of the model zoo (one place, as in geotorch's ``exceptions.py``)."""

from gradengines.tasks.errors import one_line

__all__ = ["ModelConfigError", "positive_int", "one_line"]


class ModelConfigError(ValueError):
    """A model name or model option is invalid.

    The message says what was expected and what was given, in one line,
    because the command-line scripts print it as is (exit code 2).
    """


def positive_int(name: str, value) -> int:
    """``value`` if it is an int >= 1 (not a bool), else ``ModelConfigError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
    return value

