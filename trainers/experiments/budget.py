"""What each trainer of a comparison may spend: equal samples, equal steps or equal compute time (issue 21).

The reference trainer (backprop when compared, else the first) runs ``--epochs E`` or ``--steps S`` at
its own batch size B_ref, i.e. ``n_ref`` steps and ``n_ref x B_ref`` samples. Trainer t (batch B_t,
timed step ``ratio_t`` x the reference's, ``trainers.experiments.step_timing``) then runs

    samples:  the same samples,       steps_t = ceil(n_ref B_ref / B_t)  (with --epochs: E epochs each)
    steps:    the same steps,         steps_t = n_ref
    time:     the same compute time,  steps_t = round(n_ref / ratio_t)   (a cheaper step gets more steps)

``samples`` is the default: what ``compare.py --epochs`` always did (every trainer E epochs).
"""

from __future__ import annotations

import math

from gradengines.trainers.core.errors import ConfigError

__all__ = ["BUDGETS", "reference_trainer", "budget_steps"]

BUDGETS = ("samples", "steps", "time")


def reference_trainer(trainers: list[str], requested: str | None = None) -> str:
    """The trainer the others are measured against: ``requested``, else backprop if compared, else the first."""
    if requested is not None:
        if requested not in trainers:
            raise ConfigError(f"--reference {requested!r} is not among the compared trainers ({', '.join(trainers)})")
        return requested
    return "backprop" if "backprop" in trainers else trainers[0]


def budget_steps(budget: str, reference: str, reference_steps: int, batch_sizes: dict[str, int],
                 ratios: dict[str, float] | None = None) -> dict[str, int]:
    """Steps per trainer for ``budget`` (module docstring); ``ratios``: timed step / the reference's (``time``)."""
    if budget not in BUDGETS:
        raise ConfigError(f"--budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    if reference_steps < 1:
        raise ConfigError(f"the reference trainer's run must have at least one step, got {reference_steps}")
    if budget == "steps":
        return {t: reference_steps for t in batch_sizes}
    if budget == "samples":
        samples = reference_steps * batch_sizes[reference]
        return {t: math.ceil(samples / b) for t, b in batch_sizes.items()}
    if ratios is None:
        raise ConfigError("--budget time needs the trainers' timed step ratios")
    return {t: max(1, round(reference_steps / ratios[t])) for t in batch_sizes}
