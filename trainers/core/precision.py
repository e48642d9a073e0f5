"""Precision for every engine: ``--precision 64 | 32 | bf16-mixed | 16-mixed`` (Lightning's names).

``64`` and ``32``: parameters, data and arithmetic in float64 / float32 (``--dtype``'s two values, kept as an alias).
``bf16-mixed`` and ``16-mixed``: float32 parameters, gradients and optimizer; the forward passes and the engines'
own arithmetic under ``torch.autocast`` (bfloat16 / float16: matrix products and convolutions in half precision,
reductions and losses in float32, by torch's autocast op lists), so an engine's gradient is what its arithmetic
gives at that precision, as ``loss.backward()`` under autocast gives autograd's. Gradients an engine computes in
half precision are written to ``.grad`` in the parameter's dtype (``trainers.core.engine.write_grads``).
``16-mixed`` multiplies the loss by a dynamic scale (``torch.amp.GradScaler``) so that small gradients survive
float16, unscales before clipping and skips a step whose gradients overflowed (the scaler's state is checkpointed).

Exactness under autocast (tests/test_precision.py): the backprop engine is autograd under the same autocast; the
exact settings of the other engines (Highway-BP at k >= L, FA with B = W) agree with it within the self-check's
half-precision tolerance (``trainers.core.self_check.tolerance``, read from the autocast dtype), and each engine's
first-batch check runs under the run's autocast.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from gradengines.trainers.core.errors import ConfigError

__all__ = ["PRECISIONS", "Precision", "precision_of", "autocast_dtype"]

#: The precisions a run may have, by Lightning's names.
PRECISIONS = ("64", "32", "bf16-mixed", "16-mixed")

_DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Precision:
    """A run's precision (module docstring)."""

    name: str

    @property
    def dtype(self) -> torch.dtype:
        """Parameters' and data's dtype."""
        return torch.float64 if self.name == "64" else torch.float32

    @property
    def half(self) -> torch.dtype | None:
        """The autocast dtype of a mixed precision, None otherwise."""
        return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(self.name)

    def autocast(self, device: torch.device):
        """The context the forward passes and the engine run in."""
        if self.half is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.half)

    def scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        """float16's dynamic loss scale, None for the other precisions."""
        return torch.amp.GradScaler(device.type) if self.name == "16-mixed" else None


def precision_of(precision: str | None, dtype: str) -> Precision:
    """The run's precision from ``--precision`` (None: from ``--dtype``, float32 or float64); one line where the two
    disagree."""
    if precision is None:
        return Precision("64" if dtype == "float64" else "32")
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if dtype == "float64" and precision != "64":
        raise ConfigError(f"--precision {precision} keeps float32 parameters; --dtype float64 asks for float64 "
                          f"ones: give one of the two (--precision 64 is --dtype float64)")
    return Precision(precision)


def autocast_dtype() -> torch.dtype | None:
    """The dtype autocast computes in where it is on (the CPU's or the GPU's), else None."""
    for device in _DEVICES:
        if torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
    return None
