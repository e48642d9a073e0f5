"""Training options shared by every engine (one dataclass, one flag per field)."""

import dataclasses
import math
from typing import Literal

from gradengines.trainers.core.distributed import check_device
from gradengines.trainers.core.errors import ConfigError, spell
from gradengines.trainers.core.options import option
from gradengines.trainers.core.precision import precision_of

__all__ = ["TrainConfig", "SHARED_SETTINGS"]

#: The settings record of a run that used no recipe (``trainers.cli.Setup.settings``).
SHARED_SETTINGS = {"mode": "shared", "recipe": {}, "overridden": []}


@dataclasses.dataclass
class TrainConfig:
    """Optimizer, schedule, clipping, batching, evaluation, logging, checkpoints."""

    optimizer: Literal["sgd", "adam", "adamw"] = option("adam", "torch.optim optimizer")
    lr: float = option(1e-3, "learning rate (peak rate with a schedule)")
    momentum: float = option(0.9, "SGD momentum")
    nesterov: bool = option(False, "SGD Nesterov momentum")
    weight_decay: float = option(0.0, "weight decay (decoupled for adamw)")
    schedule: Literal["constant", "step", "cosine"] = option(
        "constant", "learning-rate schedule: constant, step (x gamma every step_size steps), or linear warmup + "
                    "cosine to 0"
    )
    warmup_steps: int = option(0, "linear warmup steps (cosine schedule)")
    step_size: int = option(1000, "steps between decays (step schedule)")
    gamma: float = option(0.1, "decay factor (step schedule)")
    clip_grad_norm: float | None = option(None, "clip the global gradient norm to this value (none: off)")
    batch_size: int = option(64, "training batch size")
    eval_batch_size: int = option(1024, "evaluation batch size")
    eval_every: int | None = option(None, "evaluate on the validation split every N steps "
                                          "(none: every epoch; a stream without a length: ten times a run)")
    eval_batches: int | None = option(
        None, "evaluate on at most N validation batches of eval_batch_size at periodic evaluations, the same "
              "rows each time (none: the whole split; the final validation and the test always use the whole split)"
    )
    log_every: int = option(10, "log training scalars every N steps")
    log_axis: Literal["step", "samples"] = option(
        "step", "TensorBoard's step axis: optimizer steps, or training samples seen (compare.py's default, so "
                "trainers with different batch sizes overlay); metrics.jsonl records both")
    grad_agreement_every: int = option(
        0, "log gradient agreement with exact backprop every N steps (0: off; costs a backprop pass)")
    checkpoint_every: int | None = option(None, "write a checkpoint every N steps (none: at evaluations only)")
    checkpoint_seconds: float | None = option(
        60.0, "also write a checkpoint when this many seconds passed since the last one, so that an interrupt loses "
              "at most about that much training (none: off)")
    seed: int = option(0, "one seed for Python, NumPy, torch and data order")
    device: str = option("cpu", "torch device (cpu, cuda, cuda:1, ...)")
    dtype: Literal["float32", "float64"] = option("float32", "parameter and data dtype (--precision 32 or 64)")
    precision: Literal["64", "32", "bf16-mixed", "16-mixed"] | None = option(
        None, "64 or 32: float64 or float32 throughout (--dtype); bf16-mixed, 16-mixed: float32 parameters, the "
              "forward and the engine under torch.autocast in bfloat16 or float16 (16-mixed with a loss scaler); "
              "not given: --dtype's")
    compile: str | None = option(
        None, "torch.compile the model's forward with this backend (inductor: torch's compiler; aot_eager: traced, "
              "no code generated), checked on the first batch to give the engine's eager gradients (none: eager)")
    progress: bool = option(True, "show progress: a bar on a terminal, else a line on stderr every progress_seconds")
    progress_seconds: float = option(10.0, "seconds between progress lines (off a terminal) and metrics.jsonl flushes")

    def __post_init__(self):
        def bad(name, rule):
            return ConfigError(f"{spell(name)} must be {rule}, got {getattr(self, name)}")

        for f in dataclasses.fields(self):  # NaN and Inf first: no comparison below would catch NaN
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise bad(f.name, "a finite number")
        for name in ("batch_size", "eval_batch_size", "log_every", "step_size"):
            if getattr(self, name) < 1:
                raise bad(name, ">= 1")
        for name in ("eval_every", "eval_batches", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise bad(name, ">= 1 or none")
        for name in ("lr", "weight_decay", "warmup_steps", "grad_agreement_every"):
            if getattr(self, name) < 0:
                raise bad(name, ">= 0")
        if not 0 <= self.momentum < 1:
            raise bad("momentum", "in [0, 1)")
        if not 0 <= self.seed < 2**32:
            raise bad("seed", "in [0, 2**32) (NumPy's seeds are 32-bit)")
        if self.progress_seconds <= 0:
            raise bad("progress_seconds", "> 0")
        if self.checkpoint_seconds is not None and self.checkpoint_seconds <= 0:
            raise bad("checkpoint_seconds", "> 0 or none")
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise bad("clip_grad_norm", "> 0")
        if not 0 < self.gamma <= 1:
            raise bad("gamma", "in (0, 1]")
        if self.nesterov and self.optimizer == "sgd" and self.momentum == 0:  # torch refuses it too
            raise ConfigError(f"{spell('nesterov')} is Nesterov momentum: it needs {spell('momentum')} > 0, got 0")
        check_device(self.device)
        if precision_of(self.precision, self.dtype).name == "64":  # a conflict with --dtype is one line
            self.dtype = "float64"

    def inapplicable(self, given) -> list[tuple[str, str, str]]:
        """The options of ``given`` (those a user set explicitly) that this configuration does not read, each as
        ``(option, the option it depends on, the value it needs)``: a flag is never dropped without a word."""
        return [(name, *NEEDS[name]) for name in given
                if name in NEEDS and getattr(self, NEEDS[name][0]) != NEEDS[name][1]]


NEEDS = {"momentum": ("optimizer", "sgd"), "nesterov": ("optimizer", "sgd"), "warmup_steps": ("schedule", "cosine"),
         "step_size": ("schedule", "step"), "gamma": ("schedule", "step")}
"""Options read only under one optimizer or schedule."""
