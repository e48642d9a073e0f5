"""Gradient engines, the Trainer loop, gradient agreement and logging.

    engine = trainers.build_engine("backprop")
    out = engine.compute_grads(model, inputs, targets, task.loss_fn)   # fills p.grad
    report = trainers.gradient_agreement(model, engine, inputs, targets, task.loss_fn)
    trainers.Trainer(model, engine, task, logdir="runs").fit(epochs=10)
"""

from trainers import engines  # noqa: F401  (registers the engines)
from trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from trainers.core.errors import (
    USER_ERRORS,
    ConfigError,
    DataError,
    IncompatibleModelError,
    ModelConfigError,
    NonFiniteLossError,
    TaskConfigError,
)
from trainers.core.registry import available, build_engine, engine_class, register_engine
from trainers.core.threads import set_threads
from trainers.run.agreement import compare_grads, gradient_agreement
from trainers.run.config import TrainConfig
from trainers.run.trainer import Trainer

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
    "gradient_agreement",
    "register_engine",
    "set_threads",
    "trainable_parameters",
    "write_grads",
]
