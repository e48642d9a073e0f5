"""Reading a comparison: time to a target, and each trainer against the reference with its uncertainty (issue 21).

* Time to target: the samples and compute time at which a run's validation metric first reaches
  the target (default: ``TARGET_FRACTION`` of the reference's best validation metric, mean over
  its seeds; for perplexity, ``1 / TARGET_FRACTION`` times it), or "not reached".
* Verdict: per trainer, a metric against the reference's over the seeds both ran, by a paired t-test
  (``trainers.experiments.stats``): ahead or behind when its p-value, adjusted by Holm's method over the
  comparisons of one summary (``trainers.experiments.summary``), is below ``ALPHA``, within noise otherwise;
  a trainer whose gradient equals the reference's (every logged gradient cosine against backprop within
  ``EXACT_COSINE`` of 1) is reported as exact, not as a tie by chance.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from gradengines.trainers.experiments.stats import CONFIDENCE, Paired

__all__ = ["TARGET_FRACTION", "EXACT_COSINE", "ALPHA", "Units", "default_target", "time_to_target", "is_exact",
           "family_p", "verdict_word", "verdict_line"]

ALPHA = round(1 - CONFIDENCE, 10)  # a difference is called ahead or behind below this (Holm-adjusted) p
TARGET_FRACTION = 0.95
EXACT_COSINE = 1e-6


def default_target(reference_best: list[float], higher_better: bool, fraction: float = TARGET_FRACTION) -> float:
    """``fraction`` of the reference's mean best validation metric (divided by it when lower is better)."""
    best = statistics.fmean(reference_best)
    return best * fraction if higher_better else best / fraction


def time_to_target(history: list[dict], metric: str, target: float, higher_better: bool) -> dict | None:
    """The first validation record of ``history`` at or past ``target``: ``{"step", "samples", "compute_ms"}``
    (compute_ms None when the run was not timed), or None if never reached."""
    for record in history:
        value = record.get(f"eval/{metric}")
        if isinstance(value, (int, float)) and (value >= target if higher_better else value <= target):
            return {"step": record["step"], "samples": record.get("samples"), "compute_ms": record.get("compute_ms")}
    return None


def is_exact(histories: list[list[dict]]) -> bool:
    """Every logged global gradient cosine against backprop (all seeds) within ``EXACT_COSINE`` of 1 (and some)."""
    cosines = [r["grad/cosine_global"] for h in histories for r in h if isinstance(r.get("grad/cosine_global"), float)]
    return bool(cosines) and min(cosines) >= 1 - EXACT_COSINE


class Units(NamedTuple):
    """What an accuracy averages over: ``count`` targets (``noun``: examples, or tokens) of ``split``; a
    difference of accuracy d is d x count of them per seed, the size a reader counts when n is small."""

    count: int
    noun: str
    split: str

    def count_text(self, difference: float) -> str:
        return f"{difference * self.count:+.1f} of {self.count} {SPLIT_NAMES.get(self.split, self.split)} {self.noun}"

    def describe(self) -> str:
        return f"{self.count} {SPLIT_NAMES.get(self.split, self.split)} {self.noun}"


SPLIT_NAMES = {"val": "validation", "test": "test"}


def family_p(paired: Paired | None) -> float | None:
    """The p-value a pairing contributes to its family (None: no test, n < 2); the same difference on every
    seed is certain (p = 0), unless that difference is 0 (p = 1)."""
    if paired is None or paired.n < 2:
        return None
    if paired.p is None:
        return 0.0 if paired.difference != 0 else 1.0
    return paired.p


def verdict_word(paired: Paired | None, adjusted: float | None, higher_better: bool) -> str:
    """ahead, behind or within noise (the adjusted p against ``ALPHA``); not compared, one seed."""
    if paired is None:
        return "not compared"
    if paired.n < 2:
        return "one seed"
    p = family_p(paired) if adjusted is None else adjusted
    if p is None or p >= ALPHA:
        return "within noise"
    better = paired.difference > 0 if higher_better else paired.difference < 0
    return "ahead" if better else "behind"


def verdict_line(trainer: str, reference: str, paired: Paired | None, metric: str, higher_better: bool,
                 exact: bool = False, where: str = "at equal samples", adjusted: float | None = None,
                 family: int = 1, units: Units | None = None, holds: bool = True, margin: str = "") -> str:
    """One Markdown bullet: ``trainer`` against ``reference`` on ``metric``. ``adjusted``: the Holm-adjusted p
    in a ``family`` of that many comparisons (None: the raw p); ``units``: the split's count, to say the
    difference in examples or tokens; ``holds`` False: the word does not survive ``margin`` (the step timing's
    spread), so within noise; a ``margin`` that holds is said too."""
    if exact:
        return (f"- **{trainer}**: exact in every logged check, its gradient equals {reference}'s (every logged "
                f"gradient cosine within {EXACT_COSINE:g} of 1; a measurement at the logged steps, not a proof: an "
                f"engine very close to {reference} passes it too): the same training up to rounding, not a tie by "
                f"chance.")
    if paired is None:
        return f"- **{trainer}**: no seed in common with {reference}: not compared."
    sign = "+" if paired.difference >= 0 else "-"
    diff = f"{sign}{abs(paired.difference):.4f}"
    counted = f", {units.count_text(paired.difference)} per seed" if units else ""
    if paired.n < 2:
        return (f"- **{trainer}**: {diff} {metric}{counted} against {reference} {where} on one seed: no uncertainty "
                f"estimate (run more seeds).")
    if paired.t is None:  # every seed's difference the same
        interval = f"every seed {diff}"
    else:
        interval = (f"95% CI [{paired.low:+.4f}, {paired.high:+.4f}], paired t-test t = {paired.t:.2f}, "
                    f"p = {paired.p:.3g}")
    p = family_p(paired) if adjusted is None else adjusted
    if family > 1 and adjusted is not None:
        interval += f", Holm-adjusted p = {adjusted:.3g} over {family} comparisons"
    word = verdict_word(paired, adjusted, higher_better)
    detail = f"{diff} {metric}{counted} ({interval}, n = {paired.n} seeds"
    if word in ("ahead", "behind") and holds:
        return (f"- **{trainer}**: {'ahead of' if word == 'ahead' else 'behind'} {reference} {where}: {detail}"
                f"{f'; {margin}' if margin else ''}).")
    if not holds:
        why = margin
    elif paired.low is not None and paired.low <= 0 <= paired.high:
        why = "the interval includes 0"
    else:
        why = f"the interval excludes 0, but not after the correction for {family} comparisons (p {p:.3g} >= {ALPHA:g})"
    return f"- **{trainer}**: within noise of {reference} {where}: {detail}; {why})."
