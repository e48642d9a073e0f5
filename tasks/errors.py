"""Named errors of the task package."""

__all__ = ["DataError", "TaskConfigError", "one_line"]


class DataError(Exception):
    """A data file is missing, corrupt or cannot be downloaded.

    The message is one line naming the file and where to put it.
    """


class TaskConfigError(ValueError):
    """A task name or task option is invalid (one-line message)."""


def one_line(err: BaseException) -> str:
    """``"TypeName: first line of its message"`` (``"it called sys.exit(code)"`` for SystemExit): what a
    user's code raised, in a one-line error (the lowest package: ``models.errors`` re-exports it)."""
    if isinstance(err, SystemExit):
        return f"it called sys.exit({err.code!r})"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
