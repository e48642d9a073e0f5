"""PEPITA: error-driven input modulation with a fixed random feedback matrix.

Two published rules, one engine (``variant``):

* ``icml2022`` (Dellaferrera & Kreiman, ICML 2022):
      h~_0 = h_0 + F e,  G_l = (1/B) sum (h_l - h~_l) h~_{l-1}^T,  G_L = (1/B) sum e~ h~_{L-1}^T
  with e~ the error of the modulated output (modulated presynaptic activity
  and modulated error, as in the authors' code).
* ``iclr2024`` (Srinivasan et al., ICLR 2024, "modulated" mode):
      h~_0 = h_0 - F e,  G_l = (1/B) sum (h_l - h~_l) h~_{l-1}^T,  G_L = (1/B) sum e h~_{L-1}^T

F (d_0 x d_L) is drawn once, F_ij ~ 0.05 U(-sqrt(6/d_0), sqrt(6/d_0)), from its own
generator (``feedback_seed``), never trained, and saved in checkpoints.
e = softmax(y) - onehot(t) for cross-entropy. Writes ``p.grad``; SGD with
momentum, weight decay and the published step schedule are the Trainer's.
"""

import dataclasses
import math
from typing import Literal

import torch

from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.engines.forward_only import ModulatedForward

__all__ = ["Pepita"]


@register_engine("pepita")
class Pepita(ModulatedForward):
    """PEPITA (module docstring)."""

    modulated_presynaptic = True

    @dataclasses.dataclass
    class Options:
        variant: Literal["icml2022", "iclr2024"] = option(
            "iclr2024", "icml2022: x + F e, modulated error at the output; iclr2024: x - F e, clean error")
        feedback_scale: float = option(0.05, "F_ij ~ scale * U(-sqrt(6/d_0), sqrt(6/d_0))")
        feedback_seed: int = option(0, "seed of the fixed random feedback matrix")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options.feedback_scale <= 0:
            raise ConfigError(f"--pepita-feedback-scale must be > 0, got {self.options.feedback_scale}")
        if not 0 <= self.options.feedback_seed < 2**63:
            raise ConfigError(f"--pepita-feedback-seed must be in [0, 2**63), got {self.options.feedback_seed}")
        icml = self.options.variant == "icml2022"
        self.sign = 1.0 if icml else -1.0
        self.modulated_output_error = icml
        self.F = None  # (d_0, d_L), drawn at the first step

    def feedback(self, model, h0, e):
        d0, dL = h0[0].numel(), e.shape[1]
        if self.F is None or self.F.shape != (d0, dL):
            gen = torch.Generator().manual_seed(self.options.feedback_seed)
            bound = self.options.feedback_scale * math.sqrt(6.0 / d0)
            self.F = (torch.rand(d0, dL, generator=gen, dtype=torch.float64) * 2 - 1) * bound
        self.F = self.F.to(device=e.device, dtype=e.dtype)
        return (e @ self.F.T).reshape(h0.shape)  # (B, d_L) @ (d_L, d_0)

    def state_dict(self):
        return {"F": self.F}

    def load_state_dict(self, state):
        self.F = state["F"]
