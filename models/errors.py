"""Named errors of the model zoo (one place, as in geotorch's ``exceptions.py``)."""

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


def one_line(err: BaseException) -> str:
    """``"TypeName: first line of its message"`` (``"it called sys.exit(code)"`` for SystemExit): what a
    user's code raised, in a one-line error."""
    if isinstance(err, SystemExit):
        return f"it called sys.exit({err.code!r})"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
