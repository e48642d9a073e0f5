"""Models by name: ``build(name, **options)`` and ``available()``."""

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from models.errors import ModelConfigError

__all__ = ["register_model", "build", "available"]

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


def build(name: str, **options: Any) -> nn.Module:
    """Instantiate the zoo model ``name``; unknown names or options raise ``ModelConfigError``."""
    try:
        cls = _MODELS[name]
    except KeyError:
        raise ModelConfigError(f"unknown model '{name}'; available: {', '.join(available())}") from None
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ModelConfigError(
            f"model '{name}' has no option {', '.join(unknown)}; accepted: {', '.join(accepted)}"
        )
    return cls(**options)
