"""What another loop needs of the project: the engine it is given (a name with options, or an engine object), and
the module that engine trains: the model itself, or, for an engine that needs a structure the model does not
declare (Highway-BP's residual stack), the one found in it from a batch (``models.residual_stack``)."""

from __future__ import annotations

import torch

from gradengines import models
from gradengines.trainers.core.engine import GradientEngine
from gradengines.trainers.core.errors import ConfigError, IncompatibleModelError
from gradengines.trainers.core.registry import build_engine

__all__ = ["given_engine", "model_for_engine"]


def given_engine(engine: str | GradientEngine, options: dict | None, who: str) -> GradientEngine:
    """``engine`` itself, or the engine of that name built with ``options`` (options with an object: one line)."""
    if isinstance(engine, GradientEngine):
        if options:
            raise ConfigError(f"{who}: engine_options go with an engine's name, not an engine object")
        return engine
    return build_engine(engine, **(options or {}))


def model_for_engine(engine: GradientEngine, module: torch.nn.Module, example: tuple) -> torch.nn.Module:
    """``module``, or the residual stack found in it from ``example`` ((inputs, targets)) where ``engine`` is
    Highway-BP and ``module`` declares none; an engine that cannot train it refuses in one line."""
    try:
        engine.check(module)
        return module
    except IncompatibleModelError as err:
        if engine.name != "highway":
            raise
        try:
            return models.residual_stack(module, example=example)
        except models.ModelConfigError as found:
            raise ConfigError(f"{err}; and no residual stack was found in {type(module).__name__}: {found}") from None
