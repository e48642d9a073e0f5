"""One training step, the part of the Trainer's loop that changes the weights:

    gradients     engine.compute_grads(...)   <- where loss.backward() stands (under the run's autocast; 16-mixed:
                                              of the loss times the scaler's scale)
    average       over ranks (torchrun), then the loss must be finite
    clip          global gradient norm (16-mixed: after unscaling)
    step          optimizer.step() (retracted layers: their SGD step as a Cayley retraction; 16-mixed: the
                  scaler's step, skipped where the gradients overflowed); scheduler.step()
    upkeep        project orthogonal layers back (projection models only)

and the scalars logged about it (loss, learning rate, time, memory, the engine's own metrics,
orthogonality, agreement with exact backprop).
"""

import dataclasses
import math
import resource
import time

import torch
from torch import nn

from gradengines.models.orthogonal import PROJECTED_METHODS, orthogonal_method, orthogonality_error
from gradengines.models.orthogonal.retraction import CayleyRetraction
from gradengines.trainers.core.distributed import DataParallel
from gradengines.trainers.core.engine import GradientEngine
from gradengines.trainers.core.errors import NonFiniteLossError
from gradengines.trainers.core.precision import Precision
from gradengines.trainers.run.agreement import gradient_agreement
from gradengines.trainers.run.rundir import note

__all__ = ["StepResult", "TrainStep", "agreement_scalars", "peak_memory_mb"]


@dataclasses.dataclass
class StepResult:
    loss: float  # mean loss over the global batch
    lr: float  # learning rate the step used
    samples: int  # global batch
    seconds: float


def peak_memory_mb(device: torch.device) -> float:
    """The process's peak memory so far in MiB: resident set on the CPU, allocated memory on a CUDA device."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class TrainStep:
    """The update of one batch (module docstring), with everything it needs."""

    def __init__(self, model: nn.Module, engine: GradientEngine, params: list[nn.Parameter], loss_fn,
                 optimizer: torch.optim.Optimizer, retraction: CayleyRetraction, parallel: DataParallel,
                 clip_grad_norm: float | None, device: torch.device, precision: Precision,
                 scaler: torch.amp.GradScaler | None = None):
        self.model, self.engine, self.params, self.loss_fn = model, engine, params, loss_fn
        self.optimizer, self.retraction, self.parallel = optimizer, retraction, parallel
        self.scheduler = None  # set by fit, which knows the run's length
        self.clip_grad_norm, self.device = clip_grad_norm, device
        self.precision, self.scaler = precision, scaler
        methods = self.methods = {orthogonal_method(m) for m in model.modules()} - {None}
        self.has_orthogonal = bool(methods)
        self.needs_projection = bool(methods & set(PROJECTED_METHODS))
        self.bjorck_iterations = 0  # the most Björck iterations a layer took at the last step
        self._noted: set[str] = set()  # dense-step reasons already noted

    def __call__(self, x, y, step: int, kept: str = "") -> StepResult:
        """The update on batch (x, y) at ``step``; ``kept`` says which checkpoint a failure leaves."""
        t0 = time.perf_counter()
        # the engine stands where loss.backward() would (retracted layers: gradient factors on the side)
        # 16-mixed: the scaler's factor (what it multiplies a loss of 1 by; its first call sets it up)
        scale = float(self.scaler.scale(torch.ones((), device=self.device))) if self.scaler is not None else 1.0
        loss_fn = self.loss_fn if scale == 1.0 else (lambda outputs, targets: self.loss_fn(outputs, targets) * scale)
        with self.retraction.recording(enabled=self.parallel.world_size == 1), self.precision.autocast(self.device):
            out = self.engine.compute_grads(self.model, x, y, loss_fn)
        loss, samples = self.parallel.average_gradients(self.params, len(y), out.loss.item() / scale)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if not math.isfinite(loss):
            raise NonFiniteLossError(f"loss is {loss} at step {step}; training stopped{kept}")
        clip = 1.0  # the factor clipping applied to every .grad
        if self.clip_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
            clip = torch.clamp(self.clip_grad_norm / (norm + 1e-6), max=1.0).item()  # torch's own coefficient
        lr = self.optimizer.param_groups[0]["lr"]
        if self.retraction:
            self.retraction.step(self.optimizer, grad_scale=clip)
            for reason in sorted(self.retraction.dense_reasons - self._noted):
                self._noted.add(reason)
                if self.parallel.is_main:
                    note(f"retracted layers took the exact dense Cayley step, O(n^3) per layer: {reason}")
        elif self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped where the unscaled gradients are not finite
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler:
            self.scheduler.step()
        if self.needs_projection:  # split over ranks under torchrun, same result
            self.bjorck_iterations = max(self.parallel.project_(self.model), default=0)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(loss, lr, samples, time.perf_counter() - t0)

    def scalars(self, result: StepResult) -> dict[str, float]:
        """What is logged of a step: train/, time/, memory/, engine/ (and the orthogonality error)."""
        scalars = {
            "train/loss": result.loss, "train/lr": result.lr,
            "time/step_ms": 1e3 * result.seconds, "time/samples_per_s": result.samples / result.seconds,
            "memory/process_peak_mb": peak_memory_mb(self.device),
            **{f"engine/{k}": v for k, v in self.engine.metrics().items()},
        }
        if self.has_orthogonal:
            scalars["engine/orthogonality_error"] = orthogonality_error(self.model)
        if "bjorck" in self.methods:  # the most Björck iterations a layer took at this step (this rank's layers)
            scalars["engine/bjorck_iterations"] = float(self.bjorck_iterations)
        return scalars


def agreement_scalars(model: nn.Module, engine: GradientEngine, x, y, loss_fn) -> dict[str, float]:
    """grad/ scalars: the engine's gradient against exact backprop on (x, y), global and per parameter."""
    report = gradient_agreement(model, engine, x, y, loss_fn)
    scalars = {"grad/cosine_global": report["global"]}
    for name, stats in report["per_param"].items():
        scalars[f"grad/cosine/{name}"] = stats["cosine"]
        scalars[f"grad/rel_error/{name}"] = stats["rel_error"]
        scalars[f"grad/norm_ratio/{name}"] = stats["norm_ratio"]
    return scalars
