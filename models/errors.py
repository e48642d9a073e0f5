"""Named errors of the model zoo (one place, as in geotorch's ``exceptions.py``)."""

__all__ = ["ModelConfigError"]


class ModelConfigError(ValueError):
    """A model name or model option is invalid.

    The message says what was expected and what was given, in one line,
    because the command-line scripts print it as is (exit code 2).
    """
