"""Named errors of the task package."""

__all__ = ["DataError", "TaskConfigError"]


class DataError(Exception):
    """A data file is missing, corrupt or cannot be downloaded.

    The message is one line naming the file and where to put it.
    """


class TaskConfigError(ValueError):
    """A task name or task option is invalid (one-line message)."""
