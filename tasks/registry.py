"""Tasks by name: ``register_task`` decorates builders, ``build`` calls them with checked options.

``build`` also takes the user's own factory by reference, ``path/to/file.py:NAME`` or ``package.module:NAME``
(``--task FILE.py:factory`` on the command line), called with the task options it names: ``data_dir``,
``download`` and ``seed`` reach it only if its signature names them (or takes ``**kwargs``). It returns a
``Task``, or the train, val and test data (a tuple of three, or a dict with those keys) made into one by
``tasks.from_datasets``. A missing file or name, an option it does not take, its own error, or anything else
returned is one ``TaskConfigError`` line.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable

from .base import Task
from .datasets import from_datasets
from .errors import TaskConfigError, one_line
from .reference import import_reference, is_reference

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
    """Build the task ``name`` (registered, or a factory by reference: module docstring) with ``options``;
    unknown names or options raise ``TaskConfigError``."""
    if is_reference(name):
        return _build_reference(name, options)
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


def _build_reference(reference: str, options: dict[str, Any]) -> Task:
    module, where, attr = import_reference(reference, "task", TaskConfigError)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        raise TaskConfigError(f"{where} has no task factory '{attr}'"
                              f"{'; it defines ' + ', '.join(defined) if defined else ''}")
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [p.name for p in params.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    common = {k: v for k, v in options.items() if k in COMMON_OPTIONS}
    given = {k: v for k, v in options.items() if k not in COMMON_OPTIONS}
    # num_outputs the factory does not name is the made task's (from_datasets), e.g. a stream's classes
    outputs = {} if "num_outputs" in named or takes_any or "num_outputs" not in given else \
        {"num_outputs": given.pop("num_outputs")}
    unknown = sorted(k for k in given if k not in named and not takes_any)
    if unknown:
        raise TaskConfigError(f"task factory {attr} takes no option {', '.join(repr(k) for k in unknown)}; "
                              f"it takes: {', '.join(named) or 'none'}")
    if common.get("data_dir") is not None and "data_dir" not in named and not takes_any:
        raise TaskConfigError(f"task factory {attr} takes no data_dir (--data-dir): pass its files as one of its "
                              f"options ({', '.join(named) or 'it takes none'})")
    _check_common(attr, common)
    # data_dir when given (not to override the factory's default with None); download and seed where named
    passed = {k: v for k, v in common.items() if (k in named or takes_any and k == "data_dir")
              and not (k == "data_dir" and v is None)}
    passed.update(given)
    try:
        made = factory(**passed)
    except TaskConfigError:
        raise
    except (Exception, SystemExit) as err:  # the user's code: its error in one line, as for a model
        raise TaskConfigError(f"task factory {attr} failed: {one_line(err)}") from None
    if isinstance(made, Task):
        if outputs:
            raise TaskConfigError(f"task factory {attr} returned a Task and takes no num_outputs: the Task says it")
        return made
    if isinstance(made, dict) and set(made) >= {"train", "val", "test"}:
        made = dict(made)
        splits = (made.pop("train"), made.pop("val"), made.pop("test"))
        known = [k for k in inspect.signature(from_datasets).parameters if k not in ("train", "val", "test")]
        unknown = sorted(set(made) - set(known))
        if unknown:
            raise TaskConfigError(f"task factory {attr} returned a dict with {', '.join(map(repr, unknown))}: "
                                  f"besides train, val and test it may hold {', '.join(known)} (tasks.from_datasets)")
        return _made(attr, splits, {**outputs, **made})
    if isinstance(made, (tuple, list)) and len(made) == 3:
        return _made(attr, made, outputs)
    shown = " ".join(repr(made).split())[:40]  # one line: a DatasetDict prints itself over several
    raise TaskConfigError(f"task factory {attr} returned {type(made).__name__} {shown}, not a Task or the "
                          f"train, val and test data (a tuple of three, or a dict with those keys and "
                          f"tasks.from_datasets's options)")


def _made(attr: str, splits, options: dict) -> Task:
    """``from_datasets`` of a factory's data; a stream without ``num_outputs`` says where to give it."""
    try:
        return from_datasets(*splits, **{"name": attr, **options})
    except TaskConfigError as err:
        if "give num_outputs" not in str(err):
            raise
        raise TaskConfigError(f"{err}: return it with the data, {{'train': ..., 'val': ..., 'test': ..., "
                              f"'num_outputs': N}}, or pass --task-option num_outputs=N (Python: "
                              f"tasks.build('{attr}', num_outputs=N))") from None


def check_int(task: str, option: str, value: Any, minimum: int = 0) -> int:
    """Return ``value`` if it is an int >= ``minimum``, else raise a one-line ``TaskConfigError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TaskConfigError(f"task '{task}': {option} must be an integer >= {minimum}, got {value!r}")
    return value
