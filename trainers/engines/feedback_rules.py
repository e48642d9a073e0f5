"""What the feedback of a covered layer is: the rules of the feedback-alignment family and their scale.

FA replaces the transposed forward weight W^T in backprop's error path by a fixed map B^T of W's shape; the
sign-symmetric rules of Liao, Leibo & Poggio (AAAI 2016, "How important is weight symmetry in
backpropagation?", Sec. 2) keep W's signs and drop its magnitudes; DFA (Nøkland, NeurIPS 2016) projects the
output error straight to each layer with a d_y x d_x map D:

    fa    B = a M               M ~ U(-1, 1), drawn once
    usf   B = r sign(W)         uniform sign-concordant feedback
    brsf  B = a |M_t| o sign(W) batchwise random magnitudes: M_t ~ U(-1, 1) redrawn at every step
    frsf  B = a |M| o sign(W)   fixed random magnitudes: M ~ U(-1, 1) drawn once, kept in checkpoints
    dfa   D = a M               (the projection, ``trainers.engines.feedback_alignment``)

sign(W) is read from the weight the step's forward uses (through parametrizations), so the feedback follows
W's signs as they change. r is the feedback's root mean square and a = sqrt(3) r (U(-1, 1) and |U(-1, 1)| both
have rms 1/sqrt(3)); ``scale`` chooses r per layer:

    fan_in   r = 1 / sqrt(3 fan_in)          a = 1 / sqrt(fan_in): U(+-1/sqrt(fan_in)), FA's usual draw
                                             (Lillicrap et al.; nn.Linear's own initialisation)
    glorot   r = sqrt(2 / (fan_in + fan_out))  BioTorch's scaling factor for sign feedback (Xiao et al. 2018)
    weight   r = rms of the layer's weight when its feedback is first drawn (transformers' GPT-2: 0.02)

fan_in and fan_out are those of the map the feedback replaces: W's (C_in k^2 and C_out k^2 for a
convolution), or D's (d_y and the layer's input width) for DFA.
"""

import dataclasses
import math
from typing import Literal

import torch

__all__ = ["FeedbackRule", "RULES", "Scale", "scale_of", "generator", "uniform"]

Scale = Literal["fan_in", "glorot", "weight"]


def generator(*seed: int) -> torch.Generator:
    """A CPU generator seeded by a tuple of integers (the engine's seed, a layer's index, a step)."""
    return torch.Generator().manual_seed(hash(seed) % 2**63)


def uniform(shape, gen: torch.Generator) -> torch.Tensor:
    """U(-1, 1) of ``shape`` in float64 from ``gen``."""
    return torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1


def scale_of(scale: Scale, fan_in: int, fan_out: int, weight: torch.Tensor | None) -> float:
    """r, the feedback's rms for one layer (module docstring); ``weight``: the layer's, read for ``scale="weight"``."""
    if scale == "fan_in":
        return 1 / math.sqrt(3 * fan_in)
    if scale == "glorot":
        return math.sqrt(2 / (fan_in + fan_out))
    if weight is None:
        raise ValueError("scale 'weight' reads the layer's weight")
    return weight.detach().double().pow(2).mean().sqrt().item()


@dataclasses.dataclass(frozen=True)
class FeedbackRule:
    """One rule of the table in the module docstring: ``signed`` (B's signs are W's), ``random`` (random
    magnitudes, else r everywhere), ``redrawn`` (magnitudes drawn again at every step)."""

    name: str
    signed: bool
    random: bool
    redrawn: bool = False

    def kept(self, shape, r: float, gen: torch.Generator, like: torch.Tensor) -> torch.Tensor:
        """What is drawn once and kept (checkpointed) for a layer: a M (fa), a |M| (frsf), or the scalar r (usf)
        or a (brsf) that multiplies the magnitudes of every step."""
        if not self.random:
            return torch.tensor(r, dtype=like.dtype, device=like.device)
        if self.redrawn:
            return torch.tensor(math.sqrt(3) * r, dtype=like.dtype, device=like.device)
        M = uniform(shape, gen) * (math.sqrt(3) * r)
        return (M.abs() if self.signed else M).to(like)

    def feedback(self, kept: torch.Tensor, weight: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """B for this step from what is ``kept`` and the forward ``weight`` the step uses (module docstring);
        ``gen``: the step's generator, for brsf's magnitudes."""
        if not self.signed:
            return kept
        magnitude = kept * uniform(weight.shape, gen).abs().to(weight) if self.redrawn else kept
        return magnitude * weight.detach().sign()


RULES = {
    "fa": FeedbackRule("fa", signed=False, random=True),
    "usf": FeedbackRule("usf", signed=True, random=False),
    "brsf": FeedbackRule("brsf", signed=True, random=True, redrawn=True),
    "frsf": FeedbackRule("frsf", signed=True, random=True),
}
