"""Engines by name: ``build_engine(name, **options)`` and ``available()``."""

from collections.abc import Callable
from typing import Any

from gradengines.trainers.core.engine import GradientEngine
from gradengines.trainers.core.errors import ConfigError

__all__ = ["register_engine", "build_engine", "engine_class", "available"]

_ENGINES: dict[str, type[GradientEngine]] = {}


def register_engine(name: str) -> Callable[[type[GradientEngine]], type[GradientEngine]]:
    """Class decorator registering a ``GradientEngine`` subclass under ``name``."""

    def decorate(cls):
        if name in _ENGINES:
            raise ValueError(f"engine '{name}' registered twice")
        cls.name = name
        _ENGINES[name] = cls
        return cls

    return decorate


def available() -> list[str]:
    """Sorted names accepted by ``build_engine``."""
    return sorted(_ENGINES)


def engine_class(name: str) -> type[GradientEngine]:
    """The engine class registered as ``name`` (``ConfigError`` if none)."""
    try:
        return _ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown trainer '{name}'; available: {', '.join(available())}") from None


def build_engine(name: str, **options: Any) -> GradientEngine:
    """Instantiate the engine ``name`` with validated options."""
    return engine_class(name)(**options)
