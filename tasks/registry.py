"""Tasks by name: ``register_task`` decorates builders, ``build`` calls them with checked options."""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable

from .base import Task
from .errors import TaskConfigError

__all__ = ["register_task", "build", "available", "COMMON_OPTIONS"]

#: Options every builder accepts (``seed`` seeds the split / synthetic data, not training).
COMMON_OPTIONS = ("data_dir", "download", "seed")

_BUILDERS: dict[str, Callable[..., Task]] = {}


def register_task(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Register ``builder(data_dir=None, download=False, seed=0, **task_options) -> Task`` as ``name``."""

    def decorator(builder: Callable[..., Task]) -> Callable[..., Task]:
        if name in _BUILDERS:
            raise TaskConfigError(f"task '{name}' is registered twice")
        params = inspect.signature(builder).parameters
        missing = [opt for opt in COMMON_OPTIONS if opt not in params]
        if missing:
            raise TypeError(f"task builder '{name}' must accept the options {', '.join(missing)}")
        _BUILDERS[name] = builder
        return builder

    return decorator


def available() -> list[str]:
    """Sorted names of the registered tasks."""
    return sorted(_BUILDERS)


def _accepted(builder: Callable[..., Task]) -> list[str]:
    return [
        p.name
        for p in inspect.signature(builder).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _check_common(name: str, options: dict[str, Any]) -> None:
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TaskConfigError(f"task '{name}': seed must be a non-negative integer, got {seed!r}")
    download = options.get("download", False)
    if not isinstance(download, bool):
        raise TaskConfigError(f"task '{name}': download must be True or False, got {download!r}")
    data_dir = options.get("data_dir")
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        raise TaskConfigError(f"task '{name}': data_dir must be a path or None, got {data_dir!r}")


def build(name: str, **options: Any) -> Task:
    """Build the task ``name`` with ``options``; unknown names or options raise ``TaskConfigError``."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise TaskConfigError(f"unknown task '{name}'; available: {', '.join(available())}")
    accepted = _accepted(builder)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TaskConfigError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(repr(k) for k in unknown)} "
            f"for task '{name}'; accepted: {', '.join(accepted)}"
        )
    _check_common(name, options)
    try:
        task = builder(**options)
    except (MemoryError, RuntimeError) as err:
        text = str(err).lower()
        if not (isinstance(err, MemoryError) or "alloc" in text or "out of memory" in text):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else "MemoryError"
        raise TaskConfigError(f"task '{name}' with {options}: out of memory ({first}); ask for fewer "
                              f"samples") from None
    if not isinstance(task, Task):
        raise TypeError(f"task builder '{name}' returned {type(task).__name__}, not Task")
    return task


def check_int(task: str, option: str, value: Any, minimum: int = 0) -> int:
    """Return ``value`` if it is an int >= ``minimum``, else raise a one-line ``TaskConfigError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TaskConfigError(f"task '{task}': {option} must be an integer >= {minimum}, got {value!r}")
    return value
