"""Dropout whose mask can be frozen so several passes over one batch share it.

Forward-only engines (FOTON, PEPITA) run a clean and a modulated pass over the
same batch and need the same dropout mask in both; gradient agreement needs the
engine's masks again in the reference backprop pass. Outside ``frozen_masks``
this is ordinary inverted dropout: ``y = x * m / (1 - p)``, ``m ~ Bernoulli(1 - p)``.
"""

from contextlib import contextmanager

import torch
import torch.nn as nn

from gradengines.models.errors import ModelConfigError

__all__ = ["ConsistentDropout", "frozen_masks"]


class ConsistentDropout(nn.Module):
    """Inverted dropout with an optional frozen mask (see ``frozen_masks``)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ModelConfigError(f"dropout must be in [0, 1), got {p}")
        self.p = p
        self.frozen = False
        self.mask = None  # (B, ...) scaled mask while frozen, else None

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return x * self.mask_for(x)

    def mask_for(self, x: torch.Tensor) -> torch.Tensor:
        """The scaled mask m / (1 - p) this module applies to ``x`` now: the frozen one (see ``frozen_masks``)
        or a fresh Bernoulli draw from the torch RNG. For an engine that applies one mask to several passes
        (``x * mask``) without a module call each time."""
        if self.frozen and self.mask is not None and self.mask.shape == x.shape:
            return self.mask
        mask = torch.empty_like(x).bernoulli_(1.0 - self.p).div_(1.0 - self.p)
        if self.frozen:
            self.mask = mask
        return mask

    @contextmanager
    def shared_mask(self):
        """Within the block this module draws its mask once and reuses it; dropped on exit.

        Lets an engine run two streams through one layer with one mask, layer
        by layer, without keeping every layer's mask alive at once. Inside
        ``frozen_masks`` the frozen mask is used and kept."""
        if self.frozen:
            yield
            return
        self.frozen, self.mask = True, None
        try:
            yield
        finally:
            self.frozen, self.mask = False, None

    def extra_repr(self):
        return f"p={self.p}"


@contextmanager
def frozen_masks(model: nn.Module):
    """Within the block, each ``ConsistentDropout`` of ``model`` draws its mask
    once (on its first call) and reuses it; masks are dropped on exit."""
    layers = [m for m in model.modules() if isinstance(m, ConsistentDropout)]
    for m in layers:
        m.frozen, m.mask = True, None
    try:
        yield
    finally:
        for m in layers:
            m.frozen, m.mask = False, None
