"""Reading a comparison: time to a target, and each trainer against the reference with its uncertainty (issue 21).

* Time to target: the samples and compute time at which a run's validation metric first reaches
  the target (default: ``TARGET_FRACTION`` of the reference's best validation metric, mean over
  its seeds; for perplexity, ``1 / TARGET_FRACTION`` times it), or "not reached".
* Verdict: per trainer, its test metric (of the best validation model) against the reference's over
  the seeds both ran, by a paired t-test (``trainers.experiments.stats``): ahead or behind when the 95% interval
  of the mean difference excludes 0, within noise otherwise; a trainer whose gradient equals the
  reference's (every logged gradient cosine against backprop within ``EXACT_COSINE`` of 1) is
  reported as exact, not as a tie by chance.
"""

from __future__ import annotations

import statistics

from trainers.experiments.stats import Paired

__all__ = ["TARGET_FRACTION", "EXACT_COSINE", "default_target", "time_to_target", "is_exact", "verdict_line"]

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


def verdict_line(trainer: str, reference: str, paired: Paired | None, metric: str, higher_better: bool,
                 exact: bool = False, where: str = "at equal samples") -> str:
    """One Markdown bullet: ``trainer`` against ``reference`` on ``metric`` (test, best validation model)."""
    if exact:
        return (f"- **{trainer}**: exact, its gradient equals {reference}'s (every logged gradient cosine within "
                f"{EXACT_COSINE:g} of 1): the same training up to rounding, not a tie by chance.")
    if paired is None:
        return f"- **{trainer}**: no seed in common with {reference}: not compared."
    sign = "+" if paired.difference >= 0 else "-"
    diff = f"{sign}{abs(paired.difference):.4f}"
    if paired.n < 2:
        return (f"- **{trainer}**: {diff} {metric} against {reference} {where} on one seed: no uncertainty "
                f"estimate (run more seeds).")
    if paired.t is None:  # every seed's difference the same
        interval = f"every seed {diff}"
    else:
        interval = (f"95% CI [{paired.low:+.4f}, {paired.high:+.4f}], paired t-test t = {paired.t:.2f}, "
                    f"p = {paired.p:.3g}")
    better = paired.difference > 0 if higher_better else paired.difference < 0
    if paired.low is not None and (paired.low > 0 or paired.high < 0):
        word = "ahead of" if better else "behind"
        return f"- **{trainer}**: {word} {reference} {where}: {diff} {metric} ({interval}, n = {paired.n} seeds)."
    return (f"- **{trainer}**: within noise of {reference} {where}: {diff} {metric} ({interval}, n = {paired.n} "
            f"seeds; the interval includes 0).")

