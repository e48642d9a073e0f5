"""Uncertainty over seeds: mean, sample standard deviation, a 95% confidence interval, and a paired
t-test of a trainer against the reference trainer over the seeds both ran (issue 21).

Student's t distribution and the binomial are SciPy's (``scipy.stats``, installed with scikit-learn).

    t-test on the paired differences d_i = x_i - ref_i (same seed i), n = number of pairs:
    t = mean(d) / (sd(d) / sqrt(n)),  df = n - 1,  p = 2 P(T_df > |t|)
    95% CI of the mean difference: mean(d) +- t_{0.975, df} sd(d) / sqrt(n)

Several comparisons in one summary are one family: Holm's step-down method (Holm 1979) adjusts their
p-values so that the chance of any false "ahead" or "behind" among them stays at most 1 - CONFIDENCE:

    p_(1) <= ... <= p_(m) sorted,  adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple


def _scipy_stats():
    """scipy.stats, imported on first use: its import costs about 0.45 s, which every command that never
    summarises (train.py, bench.py, each process of the test suite) would pay."""
    from scipy import stats

    return stats


__all__ = ["Summary", "Paired", "Bootstrap", "summarize", "paired_test", "paired_interval", "hierarchical_bootstrap",
           "holm", "median_interval", "CONFIDENCE"]

CONFIDENCE = 0.95


class Summary(NamedTuple):
    """Mean, sample standard deviation and the 95% confidence interval of the mean over n seeds
    (``low``/``high`` None for n = 1: no spread to estimate)."""

    n: int
    mean: float
    std: float | None
    low: float | None
    high: float | None

    def text(self, digits: int = 4) -> str:
        if self.std is None:
            return f"{self.mean:.{digits}f} (n=1)"
        return (f"{self.mean:.{digits}f} ± {self.std:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] "
                f"(n={self.n})")


def summarize(values: list[float]) -> Summary:
    """:class:`Summary` of ``values`` (one per seed); the interval is mean +- t_{0.975, n-1} sd / sqrt(n)."""
    if not values:
        raise ValueError("summarize: no values")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Summary(1, mean, None, None, None)
    std = statistics.stdev(values)
    half = float(_scipy_stats().t.ppf(0.5 + CONFIDENCE / 2, len(values) - 1)) * std / math.sqrt(len(values))
    return Summary(len(values), mean, std, mean - half, mean + half)


class Paired(NamedTuple):
    """A paired t-test of x against a reference over the same seeds: the mean difference x - ref with its
    95% interval, t, df and the two-sided p-value (None where n < 2 or every difference is the same)."""

    n: int
    difference: float
    low: float | None
    high: float | None
    t: float | None
    p: float | None


def paired_test(x: dict[int, float], reference: dict[int, float]) -> Paired | None:
    """Paired t-test over the seeds both ``x`` and ``reference`` (seed -> value) have; None if they share none."""
    seeds = sorted(set(x) & set(reference))
    if not seeds:
        return None
    d = [x[s] - reference[s] for s in seeds]
    mean = statistics.fmean(d)
    if len(d) < 2:
        return Paired(1, mean, None, None, None, None)
    sd = statistics.stdev(d)
    if sd <= 1e-12 * max(1.0, max(abs(v) for v in d)):  # the same difference on every seed (up to rounding)
        return Paired(len(d), mean, mean, mean, None, None)
    df = len(d) - 1
    se = sd / math.sqrt(len(d))
    t = mean / se
    t_dist = _scipy_stats().t
    half = float(t_dist.ppf(0.5 + CONFIDENCE / 2, df)) * se
    return Paired(len(d), mean, mean - half, mean + half, t, float(2.0 * t_dist.sf(abs(t), df)))


def paired_interval(paired: Paired, confidence: float) -> tuple[float, float]:
    """The ``confidence`` interval of a paired test's mean difference (the 90% one of an equivalence test: two
    one-sided tests at 5%, Schuirmann 1987); an interval of zero width where every seed differs alike."""
    if paired.t is None or paired.low is None or paired.high is None:
        return paired.difference, paired.difference
    t_dist = _scipy_stats().t
    df = paired.n - 1
    half = (paired.high - paired.low) / 2 * float(t_dist.ppf(0.5 + confidence / 2, df)
                                                   / t_dist.ppf(0.5 + CONFIDENCE / 2, df))
    return paired.difference - half, paired.difference + half


class Bootstrap(NamedTuple):
    """A trainer against the reference from every seed and every example: the observed difference of the metric
    (mean over seeds), its 95% and 90% percentile intervals, the bootstrap's two-sided p-value (at least
    1 / draws), the seeds and the examples per seed."""

    difference: float
    low: float
    high: float
    low90: float
    high90: float
    p: float
    seeds: int
    examples: int


def hierarchical_bootstrap(other: list[tuple], reference: list[tuple], draws: int = 2000,
                           seed: int = 0) -> Bootstrap:
    """Two-level bootstrap of a paired difference (Davison & Hinkley 1997, Sec. 3.8): ``other`` and
    ``reference`` hold, per seed (the same seeds in the same order), ``(values, counts)`` of the same examples
    (``tasks.base.per_example``); a seed's metric is sum(values) / sum(counts) (accuracy, or the mean token loss
    whose exp is the perplexity). Each draw resamples the seeds, then within each the examples, the same examples
    for both trainers (paired): the training's randomness and the test sample's, both. The p-value is twice the
    smaller tail of the draws beyond 0."""
    import numpy as np

    if len(other) != len(reference) or not other:
        raise ValueError("hierarchical_bootstrap: the same seeds on both sides, at least one")
    rng = np.random.default_rng(seed)
    per_seed, observed = [], []
    for (ov, oc), (rv, rc) in zip(other, reference, strict=True):
        ov, oc, rv, rc = (np.asarray(a, dtype=np.float64) for a in (ov, oc, rv, rc))
        if not len(ov) == len(rv) == len(oc) == len(rc) or not len(ov):
            raise ValueError("hierarchical_bootstrap: each seed's outcomes must cover the same examples")
        observed.append(ov.sum() / oc.sum() - rv.sum() / rc.sum())
        rows = rng.integers(0, len(ov), size=(draws, len(ov)))
        per_seed.append(ov[rows].sum(1) / oc[rows].sum(1) - rv[rows].sum(1) / rc[rows].sum(1))
    seeds = rng.integers(0, len(other), size=(draws, len(other)))
    boot = np.take_along_axis(np.stack(per_seed, 1), seeds, 1).mean(1)
    low, high, low90, high90 = (float(q) for q in np.quantile(boot, [0.025, 0.975, 0.05, 0.95]))
    tail = min(float((boot <= 0).mean()), float((boot >= 0).mean()))
    return Bootstrap(float(np.mean(observed)), low, high, low90, high90, max(min(1.0, 2 * tail), 1 / draws),
                     len(other), len(other[0][0]))


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values of one family, in the given order (module docstring): a comparison's difference
    is established at level a exactly when its adjusted p is below a."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [0.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free interval of the median of ``values``: the order statistics x_(j) and x_(n+1-j) with j
    the largest rank such that P(Binomial(n, 1/2) <= j - 1) <= (1 - confidence) / 2 (n = 30: x_(10), x_(21));
    with too few values for that (n < 6 at 95%), their min and max."""
    ordered, n = sorted(values), len(values)
    if not ordered:
        raise ValueError("median_interval: no values")
    j = 0  # the largest rank with P(B <= j - 1) <= (1 - confidence) / 2
    binom = _scipy_stats().binom
    while binom.cdf(j, n, 0.5) <= (1 - confidence) / 2:
        j += 1
    if j == 0:
        return ordered[0], ordered[-1]
    return ordered[j - 1], ordered[n - j]
