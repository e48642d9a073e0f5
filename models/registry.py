"""Models by name: ``build(name, **options)`` and ``available()``; a name ``FILE.py:NAME`` or
``MODULE:NAME`` builds a user's model instead (``models.adapters.user``)."""

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from gradengines.models.adapters.user import build_reference, is_reference, load_reference, names
from gradengines.models.errors import ModelConfigError

__all__ = ["register_model", "build", "available", "takes_option"]

_MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator registering a zoo model under ``name``."""

    def decorate(cls):
        if name in _MODELS:
            raise ValueError(f"model '{name}' registered twice")
        _MODELS[name] = cls
        return cls

    return decorate


def available() -> list[str]:
    """Sorted names accepted by ``build``."""
    return sorted(_MODELS)


def _zoo_class(name: str) -> Callable[..., nn.Module]:
    try:
        return _MODELS[name]
    except KeyError:
        raise ModelConfigError(f"unknown model '{name}'; available: {', '.join(available())}, or your own as "
                               "FILE.py:CLASS or MODULE:FACTORY") from None


def takes_option(name: str, option: str) -> bool:
    """Whether the model ``name`` (zoo or reference) names the keyword ``option`` (a ``**kwargs`` does not
    count: the task's sizes are never pushed into one)."""
    return names(load_reference(name) if is_reference(name) else _zoo_class(name), option)


def build(name: str, **options: Any) -> nn.Module:
    """Instantiate the zoo model ``name`` (or the user's model a reference names, ``models.adapters.user``);
    unknown names or options raise ``ModelConfigError``."""
    if is_reference(name):
        return build_reference(name, **options)
    cls = _zoo_class(name)
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ModelConfigError(
            f"model '{name}' has no option {', '.join(unknown)}; accepted: {', '.join(accepted)}"
        )
    try:
        return cls(**options)
    except (MemoryError, RuntimeError) as err:
        if not _allocation_failed(err):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else "MemoryError"
        raise ModelConfigError(f"model '{name}' with {options}: out of memory ({first}); ask for a smaller "
                               f"model") from None


def _allocation_failed(err: BaseException) -> bool:
    """Whether ``err`` is a failed allocation (torch's CPU or CUDA allocator, or Python's)."""
    text = str(err).lower()
    return isinstance(err, MemoryError) or "alloc" in text or "out of memory" in text
