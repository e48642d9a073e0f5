"""Tasks by name: data sets (offline first), loss and metric.

``build("digits", seed=1)`` returns a :class:`Task` with train/val/test
:class:`Split` s; ``available()`` lists the names.
"""

from .base import Split, Task
from .errors import DataError, TaskConfigError
from .registry import available, build, register_task

# Imported for their side effect: each module registers its task(s).
from . import cifar10, digits, idx, teacher  # noqa: E402,F401  isort: skip

__all__ = ["Task", "Split", "build", "available", "register_task", "DataError", "TaskConfigError"]
