"""Tasks by name: data sets (offline first), loss and metric.

``build("digits", seed=1)`` returns a :class:`Task` with train/val/test
:class:`Split` s; ``available()`` lists the names. Sequence tasks
(``ptb-char``, ``ptb-word``, ``copy``, ``adding``, ``seq-digits``) live in
``tasks.language`` and ``tasks.sequences``. ``from_datasets(train, val, test)`` makes a task of
the user's own map-style Datasets (``tasks.datasets``).
"""

from .base import IGNORE_INDEX, DataSplit, Split, Task, accuracy, sequence_cross_entropy
from .datasets import DatasetSplit, from_datasets
from .errors import DataError, TaskConfigError
from .registry import available, build, register_task

# Imported for their side effect: each module registers its task(s).
from . import cifar10, digits, idx, language, sequences, teacher, tokens  # noqa: E402,F401  isort: skip

__all__ = [
    "Task",
    "Split",
    "DataSplit",
    "DatasetSplit",
    "from_datasets",
    "sequence_cross_entropy",
    "accuracy",
    "IGNORE_INDEX",
    "build",
    "available",
    "register_task",
    "DataError",
    "TaskConfigError",
]
