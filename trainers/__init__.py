"""Gradient engines, the Trainer loop, gradient agreement and logging.

    engine = trainers.build_engine("backprop")
    out = engine.compute_grads(model, inputs, targets, task.loss_fn)   # fills p.grad
    report = trainers.gradient_agreement(model, engine, inputs, targets, task.loss_fn)
    trainers.Trainer(model, engine, task, logdir="runs").fit(epochs=10)
"""

from gradengines.trainers import engines  # noqa: F401  (registers the engines)
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import (
    USER_ERRORS,
    ConfigError,
    DataError,
    IncompatibleModelError,
    ModelConfigError,
    NonFiniteLossError,
    TaskConfigError,
)
from gradengines.trainers.core.registry import available, build_engine, engine_class, engine_origin, register_engine
from gradengines.trainers.core.threads import set_threads
from gradengines.trainers.run.agreement import compare_grads, gradient_agreement
from gradengines.trainers.run.config import TrainConfig
from gradengines.trainers.run.trainer import Trainer

__all__ = [
    "USER_ERRORS",
    "ConfigError",
    "DataError",
    "GradientEngine",
    "IncompatibleModelError",
    "ModelConfigError",
    "NonFiniteLossError",
    "StepOutput",
    "TaskConfigError",
    "TrainConfig",
    "Trainer",
    "available",
    "build_engine",
    "compare_grads",
    "engine_class",
    "engine_origin",
    "gradient_agreement",
    "register_engine",
    "set_threads",
    "trainable_parameters",
    "write_grads",
]
