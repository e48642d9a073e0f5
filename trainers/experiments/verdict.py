"""Reading a comparison: time to a target, and each trainer against the reference with its uncertainty (issue 21).

* Time to target: the samples and compute time at which a run's validation metric first reaches
  the target (default: ``TARGET_FRACTION`` of the reference's best validation metric, mean over
  its seeds; for perplexity, ``1 / TARGET_FRACTION`` times it), or "not reached".
* Verdict: per trainer, a metric against the reference's over the seeds both ran, by a paired t-test
  (``trainers.experiments.stats``), in one of three words, never another:
  *ahead* or *behind* when its p-value, adjusted by Holm's method over the comparisons of one summary
  (``trainers.experiments.summary``), is below ``ALPHA`` (the difference is established);
  *equivalent* within a stated margin (``margin``: one example per hundred of accuracy, 1% of the reference's
  perplexity) when the 90% interval of the difference lies inside +-margin (two one-sided tests at 5%,
  Schuirmann 1987: the difference is established to be small);
  *undecided* otherwise, with the interval and about how many seeds would decide it at the observed spread.
  A trainer whose gradient equals backprop's (every logged gradient cosine against backprop within
  ``EXACT_COSINE`` of 1) is reported as exact, not as a tie by chance, where the reference is backprop; against
  another reference it is judged as any trainer.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from gradengines.trainers.experiments.stats import (
    CONFIDENCE,
    Bootstrap,
    Paired,
    hierarchical_bootstrap,
    holm,
    paired_interval,
)

__all__ = ["TARGET_FRACTION", "EXACT_COSINE", "ALPHA", "MARGINS", "Units", "default_target", "time_to_target",
           "is_exact", "family_p", "margin", "equivalent", "seeds_to_decide", "verdict_word", "verdict_line",
           "bootstrap_word", "bootstrap_line", "example_family", "example_word", "LOSS_MARGIN"]

ALPHA = round(1 - CONFIDENCE, 10)  # a difference is called ahead or behind below this (Holm-adjusted) p
TARGET_FRACTION = 0.95
EXACT_COSINE = 1e-6
MARGINS = {"accuracy": 0.01, "perplexity": 0.01}
"""The equivalence margin of each metric: an accuracy difference of one example per hundred; for perplexity, 1% of
the reference's (``margin``)."""


def margin(metric: str, reference_values: list[float]) -> float:
    """The equivalence margin of a difference of ``metric`` (``MARGINS``), in the metric's units."""
    name = metric.split()[-1]
    if name == "perplexity":
        return MARGINS["perplexity"] * statistics.fmean(reference_values)
    return MARGINS.get(name, MARGINS["accuracy"])


LOSS_MARGIN = math.log1p(MARGINS["perplexity"])
"""A perplexity compared from every example is compared as its mean token loss: 1% of perplexity is
log(1.01) nats of loss."""


def equivalent(paired: Paired, within: float) -> bool:
    """Whether the 90% interval of the paired difference lies inside (-within, within)."""
    low, high = paired_interval(paired, 1 - 2 * ALPHA)
    return -within < low and high < within


def seeds_to_decide(paired: Paired, within: float | None, family: int = 1) -> int | None:
    """About how many seeds would decide an undecided comparison at the observed spread: the interval's half-width
    shrinks as 1 / sqrt(seeds), until it excludes 0 at the level Holm asks of the first of ``family`` comparisons
    (a difference; normal quantiles, so a rough count) or fits inside +-within (equivalence); None where nothing
    can be estimated (no spread, or a difference of exactly 0 with no margin)."""
    if paired.low is None or paired.high is None or paired.t is None:
        return None
    from statistics import NormalDist

    half = (paired.high - paired.low) / 2
    stricter = NormalDist().inv_cdf(1 - ALPHA / (2 * family)) / NormalDist().inv_cdf(1 - ALPHA / 2)
    gaps = [abs(paired.difference) / stricter] + ([within - abs(paired.difference)] if within else [])
    needed = [paired.n * (half / gap) ** 2 for gap in gaps if gap > 0]
    return max(paired.n + 1, math.ceil(min(needed))) if needed else None


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


def verdict_word(paired: Paired | None, adjusted: float | None, higher_better: bool,
                 within: float | None = None) -> str:
    """ahead or behind (the adjusted p against ``ALPHA``), equivalent (within +-``within``), else undecided; not
    compared, one seed."""
    if paired is None:
        return "not compared"
    if paired.n < 2:
        return "one seed"
    p = family_p(paired) if adjusted is None else adjusted
    if p is not None and p < ALPHA:
        better = paired.difference > 0 if higher_better else paired.difference < 0
        return "ahead" if better else "behind"
    if within is not None and equivalent(paired, within):
        return "equivalent"
    return "undecided"


def verdict_line(trainer: str, reference: str, paired: Paired | None, metric: str, higher_better: bool,
                 exact: bool = False, where: str = "at equal samples", adjusted: float | None = None,
                 family: int = 1, units: Units | None = None, holds: bool = True, margin: str = "",
                 within: float | None = None) -> str:
    """One Markdown bullet: ``trainer`` against ``reference`` on ``metric``. ``adjusted``: the Holm-adjusted p
    in a ``family`` of that many comparisons (None: the raw p); ``units``: the split's count, to say the
    difference in examples or tokens; ``holds`` False: the word does not survive ``margin`` (the step timing's
    spread), so undecided; a ``margin`` that holds is said too; ``within``: the equivalence margin. ``exact``:
    the reference is backprop and the trainer's gradient equals it in every logged check."""
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
    word = verdict_word(paired, adjusted, higher_better, within)
    detail = f"{diff} {metric}{counted} ({interval}, n = {paired.n} seeds"
    if word in ("ahead", "behind") and holds:
        return (f"- **{trainer}**: {'ahead of' if word == 'ahead' else 'behind'} {reference} {where}: {detail}"
                f"{f'; {margin}' if margin else ''}).")
    if word == "equivalent" and holds:
        low, high = paired_interval(paired, 1 - 2 * ALPHA)
        return (f"- **{trainer}**: equivalent to {reference} {where} within ±{within:.4g} {metric} (its 90% "
                f"interval [{low:+.4f}, {high:+.4f}] lies inside: two one-sided tests at {ALPHA:g}): {detail}).")
    if not holds:
        why = margin
    elif paired.low is not None and paired.low <= 0 <= paired.high:
        why = "the interval includes 0" + (f" and reaches beyond ±{within:.4g}" if within is not None else "")
    else:
        why = f"the interval excludes 0, but not after the correction for {family} comparisons (p {p:.3g} >= {ALPHA:g})"
    seeds = seeds_to_decide(paired, within, family) if holds else None  # the timing's spread is not the seeds'
    more = f"; at this spread about {seeds} seeds would decide it" if seeds is not None else ""
    return f"- **{trainer}**: undecided against {reference} {where}: {detail}; {why}{more})."


def bootstrap_word(boot: Bootstrap, adjusted: float, higher_better: bool, within: float) -> str:
    """The three words (module docstring) from a hierarchical bootstrap: ahead or behind where the Holm-adjusted
    bootstrap p is below ``ALPHA``; equivalent where its 90% interval lies inside +-``within``; else undecided."""
    if adjusted < ALPHA:
        better = boot.difference > 0 if higher_better else boot.difference < 0
        return "ahead" if better else "behind"
    if -within < boot.low90 and boot.high90 < within:
        return "equivalent"
    return "undecided"


def bootstrap_line(trainer: str, reference: str, boot: Bootstrap, metric: str, adjusted: float, family: int) -> str:
    """One Markdown bullet: ``trainer`` against ``reference`` on the test split's ``metric`` (accuracy, or
    perplexity read as its mean token loss), from every seed and example (``stats.hierarchical_bootstrap``)."""
    perplexity = metric == "perplexity"
    within = LOSS_MARGIN if perplexity else MARGINS["accuracy"]
    word = example_word(boot, adjusted, metric)
    if perplexity:  # a difference of mean loss d is a perplexity ratio exp(d)
        shown = (f"perplexity x{math.exp(boot.difference):.4f} (95% interval x{math.exp(boot.low):.4f}.."
                 f"x{math.exp(boot.high):.4f})")
        margin_text = "±1% perplexity"
    else:
        shown = f"{boot.difference:+.4f} accuracy (95% interval [{boot.low:+.4f}, {boot.high:+.4f}])"
        margin_text = f"±{within:g} accuracy"
    evidence = (f"{boot.seeds} seeds x {boot.examples} test examples, hierarchical bootstrap p = {boot.p:.3g}, "
                f"Holm-adjusted {adjusted:.3g} over {family}")
    if word in ("ahead", "behind"):
        return f"- **{trainer}**: {'ahead of' if word == 'ahead' else 'behind'} {reference}: {shown}; {evidence}."
    if word == "equivalent":
        return f"- **{trainer}**: equivalent to {reference} within {margin_text} (its 90% interval inside): " \
               f"{shown}; {evidence}."
    return f"- **{trainer}**: undecided against {reference}: {shown}, neither a difference nor within " \
           f"{margin_text}; {evidence}."


def example_family(records: dict[str, list[dict]], reference: str) -> dict[str, tuple[Bootstrap, float]]:
    """Each run against ``reference`` on the test split of its best-validation model, from every seed and every
    test example: run -> (its hierarchical bootstrap, its Holm-adjusted p in the family). ``records``: run -> its
    seeds' ``result.json`` records; a run without per-example outcomes (several processes, a loss with no
    per-example share), or sharing no seed with the reference, is left out."""
    def outcomes(run):
        return {r["config"]["seed"]: r.get("test_outcomes") for r in records[run]}

    if reference not in records:
        return {}
    ref, boots = outcomes(reference), {}
    for run in records:
        mine = outcomes(run)
        seeds = sorted(s for s in set(mine) & set(ref) if mine[s] and ref[s]
                       and len(mine[s]["values"]) == len(ref[s]["values"]))
        if run != reference and seeds:
            boots[run] = hierarchical_bootstrap([(mine[s]["values"], mine[s]["counts"]) for s in seeds],
                                                [(ref[s]["values"], ref[s]["counts"]) for s in seeds])
    return dict(zip(boots, zip(boots.values(), holm([b.p for b in boots.values()]), strict=True), strict=True))


def example_word(boot: Bootstrap, adjusted: float, metric: str) -> str:
    """``bootstrap_word`` at ``metric``'s margin (accuracy's, or the perplexity's read as its mean token loss)."""
    perplexity = metric == "perplexity"
    return bootstrap_word(boot, adjusted, not perplexity, LOSS_MARGIN if perplexity else MARGINS["accuracy"])
