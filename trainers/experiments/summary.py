"""``summary.md`` of a comparison: what it ran, one verdict per trainer, the results with their uncertainty,
time to target, step time and memory, failures and settings (issues 21 and 31).

Two readings, each stated where it appears:

* **the verdict** reads validation: per seed, the best validation metric within the horizon every run
  reached (the shortest run's samples or compute time; a record counts up to one step of its own run past
  the horizon, since a budget rounds to whole steps), paired against the reference;
* **the results table** reads test: the test metric of each run's best-validation model over the whole run.

They can disagree (another split, another stopping point); where a trainer's word differs between the two,
the summary says so in a sentence. Each reading is one family of paired t-tests, corrected by Holm's step-down
method (``trainers.experiments.stats.holm``): "ahead" or "behind" only where the Holm-adjusted p is below
1 - ``CONFIDENCE``. At equal compute time a word must also survive the step timing's own uncertainty: the
verdict is recomputed with the trainer's compute time scaled to either end of the 95% interval of its timed
median ratio (``trainers.experiments.stats.median_interval`` over the timing's rounds) and the other runs' to
either end of theirs (they set the horizon), under the runs' own thread count and, on a CPU, the other end of the
machine's thread range (``step_timing``: the ratios move with the thread count); a word that changes there
becomes "undecided", the margin said. Where no difference is established, the words are "equivalent" (within a
stated margin, ``trainers.experiments.verdict.MARGINS``) or "undecided" (with how many seeds would decide it),
never a claim that the difference is small when the interval does not show it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import NamedTuple

from gradengines.trainers.experiments.recipes import SHARED_SETTINGS
from gradengines.trainers.experiments.results import experiment_failures, pivot_cells
from gradengines.trainers.experiments.stats import Paired, holm, paired_test, summarize
from gradengines.trainers.experiments.tuning import trial_name, tuning_caveats
from gradengines.trainers.experiments.verdict import (
    ALPHA,
    TARGET_FRACTION,
    Units,
    bootstrap_line,
    default_target,
    example_family,
    family_p,
    is_exact,
    time_to_target,
    verdict_line,
    verdict_word,
)
from gradengines.trainers.experiments.verdict import margin as margin_of
from gradengines.trainers.run.checkpoint import write_text_atomic
from gradengines.trainers.run.trainer import eval_subset

__all__ = ["write_summary", "summary_table", "alignment_table", "verdict_lines", "time_to_target_table", "timing_table",
           "settings_table", "engine_origins", "example_verdict_lines", "failure_notes", "model_text", "mean_std",
           "disagreement_lines", "pivot_table"]


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def _last(history: list[dict], key: str):
    return next((r[key] for r in reversed(history) if key in r), None)


def _seed(record: dict) -> int:
    return record["report"]["config"]["seed"]


def _test_pairs(results: dict[str, list[dict]], metric: str, reference: str | None) -> dict[str, Paired | None]:
    """The results table's family: each run's test metric paired against ``reference``'s over common seeds."""
    ref = {_seed(r): r["report"]["test"][metric] for r in results.get(reference or "", []) if r["report"]["test"]}
    if not ref:
        return {}
    return {run: paired_test({_seed(r): r["report"]["test"][metric] for r in seeds if r["report"]["test"]}, ref)
            for run, seeds in results.items() if run != reference}


def _adjusted(pairs: dict[str, Paired | None]) -> dict[str, float]:
    """Holm-adjusted p of each pair in one family (pairs with no test, n < 2, left out)."""
    tested = {run: p for run, pair in pairs.items() if (p := family_p(pair)) is not None}
    return dict(zip(tested, holm(list(tested.values())), strict=True))


def summary_table(results: dict[str, list[dict]], metric: str, reference: str | None = None,
                  units: Units | None = None) -> str:
    """Markdown table: one row per run name over its seeds: length (steps, samples, timed compute time),
    best and final validation, test of the best validation model as mean ± sample std [95% CI] (n seeds),
    its paired difference to ``reference`` over common seeds (Holm-adjusted over the table's runs; ``units``:
    the test split's count, to say the difference in examples or tokens), training loss, gradient cosine.

    ``results[run]`` lists, per seed, ``{"report": result.json, "history": metrics.jsonl records}``.
    """
    pairs = _test_pairs(results, metric, reference)
    adjusted = _adjusted(pairs)
    lines = [
        f"| run | seeds | steps | samples | compute s (timed) | best val {metric} | final val {metric} "
        f"| test {metric} (best val model): mean ± std [95% CI] | test − {reference or 'reference'}: mean [95% CI], "
        "paired t-test (Holm-adjusted p) | final train loss | mean grad cosine |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, seeds in results.items():
        val = [r["report"]["best_val"][metric] for r in seeds]
        final = [r["report"]["final_val"][metric] for r in seeds]
        tests = [r["report"]["test"][metric] for r in seeds if r["report"]["test"]]
        losses = [_last(r["history"], "train/loss") for r in seeds]
        cos = [h["grad/cosine_global"] for r in seeds for h in r["history"] if "grad/cosine_global" in h]
        steps = sorted({r["report"]["steps"] for r in seeds})
        samples = sorted({r["report"].get("samples") for r in seeds} - {None})
        compute = [r["report"]["timing"]["compute_ms"] / 1e3 for r in seeds if "timing" in r["report"]]
        paired = pairs.get(run)
        if run == reference or not pairs:
            against = "reference" if run == reference else "-"
        elif paired is None:
            against = "-"
        else:
            count = f" ({units.count_text(paired.difference)})" if units else ""
            against = (
                f"{paired.difference:+.4f}{count} (n=1)" if paired.n < 2 else
                f"{paired.difference:+.4f}{count} (every seed)" if paired.t is None else
                f"{paired.difference:+.4f}{count} [{paired.low:+.4f}, {paired.high:+.4f}], t = {paired.t:.2f}, "
                f"p = {paired.p:.3g} (Holm {adjusted[run]:.3g}; n={paired.n})")
        lines.append(
            f"| {run} | {len(seeds)} | {'/'.join(map(str, steps))} | {'/'.join(map(str, samples)) or '-'} "
            f"| {f'{statistics.mean(compute):.2f}' if compute else '-'} | {mean_std(val)} | {mean_std(final)} "
            f"| {summarize(tests).text() if tests else '-'} | {against} "
            f"| {mean_std([v for v in losses if v is not None])} "
            f"| {f'{statistics.mean(cos):.4f}' if cos else 'n/a'} |"
        )
    return "\n".join(lines) + "\n"


ALIGNMENT = "engine/alignment_deg/"  # the FA family's angle between each layer's feedback and its forward weight
DFA_HAS_NO_ANGLE = ("; dfa has no row: its feedback D maps the output error to every layer at once and stands for no "
                    "one forward weight, so its agreement with backprop is the gradient cosine alone")


def alignment_table(results: dict[str, list[dict]]) -> str:
    """Markdown: per run that logged the FA family's alignment angles, the angle between each covered layer's
    feedback B and its forward weight W (degrees; 90: unrelated, 0: B a positive multiple of W) at the first
    and the last logged step, mean over the layers and seeds, and the layer furthest from W at the end;
    "" when no run logged them. Falling angles mean W aligns to B, the phenomenon FA relies on."""
    lines = []
    for run, seeds in results.items():
        logged = [[h for h in r["history"] if any(k.startswith(ALIGNMENT) for k in h)] for r in seeds]
        logged = [h for h in logged if h]
        if not logged:
            continue
        first = [v for h in logged for k, v in h[0].items() if k.startswith(ALIGNMENT)]
        last = {k[len(ALIGNMENT):]: v for h in logged for k, v in h[-1].items() if k.startswith(ALIGNMENT)}
        worst = max(last, key=last.get)
        lines.append(f"| {run} | {len(last)} | {statistics.mean(first):.1f} | {statistics.mean(last.values()):.1f} "
                     f"| {worst} ({last[worst]:.1f}) |")
    if not lines:
        return ""
    return ("| run | layers | angle B-W, first logged step (mean, deg) | last logged step | largest at the end |\n"
            "|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


class _Horizon(NamedTuple):
    """One verdict's reading: the horizon and, per run, seed -> the best validation metric within it."""

    value: float
    best: dict[str, dict[int, float]]


def _within_horizon(results: dict[str, list[dict]], metric: str, key: str, higher_better: bool,
                    scale: dict[str, float] | None = None) -> _Horizon | None:
    """The horizon every run reached (the shortest run's last ``key``) and each seed's best validation
    ``metric`` among its records at most one of its own steps past it. ``scale``: a factor on a run's ``key``
    (the equal-compute margin: its compute time at another step ratio). None: a run has no ``key``."""
    scale = scale or {}
    ends = {(run, i): _last(r["history"], key) for run, seeds in results.items() for i, r in enumerate(seeds)}
    if not ends or any(e is None for e in ends.values()):
        return None
    horizon = min(end * scale.get(run, 1.0) for (run, _), end in ends.items())
    best: dict[str, dict[int, float]] = {}
    for run, seeds in results.items():
        best[run] = {}
        for i, r in enumerate(seeds):
            last_step = _last(r["history"], "step") or 1
            step_size = ends[(run, i)] * scale.get(run, 1.0) / last_step  # the budget rounds to whole steps
            values = [h[f"eval/{metric}"] for h in r["history"]
                      if f"eval/{metric}" in h and key in h and h[key] * scale.get(run, 1.0) <= horizon + step_size]
            if values:
                best[run][_seed(r)] = max(values) if higher_better else min(values)
    return _Horizon(horizon, best)


class _Test(NamedTuple):
    """One verdict: ``run`` against the reference (its reading ``paired``)."""

    run: str
    paired: Paired | None
    exact: bool
    missing: list[str]  # runs with no validation within the horizon


def _is_backprop(results, run: str) -> bool:
    """Whether ``run`` trained with backprop (the engine every logged gradient cosine is measured against)."""
    return results[run][0]["report"].get("trainer") == "backprop"


def _verdict_tests(results, reference, horizon: _Horizon) -> list[_Test]:
    tests = []
    ref = horizon.best[reference]
    for run in results:
        if run == reference:
            continue
        mine = horizon.best[run]
        # exact: equal to the reference's gradient, which the logged cosines (against backprop) say only of backprop
        exact = _is_backprop(results, reference) and is_exact([r["history"] for r in results[run]])
        missing = [name for name, v in ((reference, ref), (run, mine)) if not v]
        tests.append(_Test(run, None if missing else paired_test(mine, ref), exact, missing))
    return tests


def _bounds(timing: dict) -> tuple[float, float, str] | None:
    """(low, high, what they are) of one timed ratio: the 95% interval of the median over the timing's rounds (a
    timing recorded before it: the rounds' min..max); None: none recorded."""
    if "ratio_low" in timing and "ratio_high" in timing:
        return timing["ratio_low"], timing["ratio_high"], "the 95% interval of the timed median"
    if "ratio_min" in timing and "ratio_max" in timing:
        return timing["ratio_min"], timing["ratio_max"], "the timing's min..max over rounds"
    return None


class _TimingSetting(NamedTuple):
    """The runs' timed step ratios under one thread count: ``label`` ("" for the runs' own), each run's
    (low, high, what they are)."""

    label: str
    bounds: dict[str, tuple[float, float, str]]


def _timing_settings(results: dict[str, list[dict]]) -> tuple[dict[str, float], list[_TimingSetting]]:
    """Each timed run's ratio, and the settings the equal-compute margin moves it through: its own timing and,
    where every run has one (``step_timing``), the timing at the other thread count."""
    timings = {run: seeds[0]["report"].get("timing") for run, seeds in results.items() if seeds}
    timings = {run: t for run, t in timings.items() if t and "ratio" in t and _bounds(t)}
    ratios = {run: t["ratio"] for run, t in timings.items()}
    settings = [_TimingSetting("", {run: _bounds(t) for run, t in timings.items()})]
    other = {run: t.get("at_other_threads") for run, t in timings.items()}
    counts = {o["threads"] for o in other.values() if o}
    if other and len(counts) == 1 and all(o and _bounds(o) for o in other.values()):
        n = counts.pop()
        settings.append(_TimingSetting(f"at {n} thread{'s' if n > 1 else ''}",
                                       {run: _bounds(o) for run, o in other.items()}))
    return ratios, settings


def _margin_note(results, metric, reference, higher_better, family: list[_Test], test: _Test) -> tuple[str, bool]:
    """At equal compute: whether ``test``'s word holds with its step ratio at either end of its interval and the
    other runs' ratios (which move the horizon) at either end of theirs, under each timing setting (the runs' own
    thread count and the other end of the machine's range; ``_timing_settings``), each reading recomputed and the
    family re-corrected; and the sentence that says so."""
    ratios, settings = _timing_settings(results)
    if test.run not in ratios or test.paired is None:
        return "", True
    nominal = verdict_word(test.paired, _adjusted_for(family, test, test.paired), higher_better)
    if nominal not in ("ahead", "behind"):  # no difference established: no margin can make it one
        return "", True
    changes: dict[str, list[str]] = {}
    for setting in settings:
        for mine in (0, 1):
            for theirs in (0, 1):
                scale = {run: setting.bounds[run][theirs] / ratios[run] for run in ratios if run != test.run}
                scale[test.run] = setting.bounds[test.run][mine] / ratios[test.run]
                horizon = _within_horizon(results, metric, "compute_ms", higher_better, scale)
                if horizon is None or not horizon.best[test.run] or not horizon.best[reference]:
                    word = "not compared"
                else:
                    paired = paired_test(horizon.best[test.run], horizon.best[reference])
                    word = verdict_word(paired, _adjusted_for(family, test, paired), higher_better)
                if word != nominal:
                    ratio = f"{setting.bounds[test.run][mine]:.3f}{f' {setting.label}' if setting.label else ''}"
                    changes.setdefault(word, []).append(ratio)
    low, high, what = settings[0].bounds[test.run]
    others = "; ".join(f"{s.bounds[test.run][0]:.3f}..{s.bounds[test.run][1]:.3f} {s.label}" for s in settings[1:])
    ranges = f"{low:.3f}..{high:.3f}{f', {others}' if others else ''} ({what}; the other runs' " \
             "ratios, which set the horizon, at either end of theirs)"
    if not changes:
        return f"holds for step ratios {ranges}", True
    moved = "; ".join(f"{word} at ratio {', '.join(dict.fromkeys(at))}" for word, at in changes.items())
    return (f"{nominal} at the timed ratio {ratios[test.run]:.3f}, but {moved}, within step ratios {ranges}: "
            f"not a difference the timing can carry"), False


def _adjusted_for(family: list[_Test], test: _Test, paired: Paired | None) -> float | None:
    """Holm-adjusted p of ``test`` in ``family`` with its reading replaced by ``paired``."""
    ps = [family_p(paired if t is test else t.paired) for t in family]
    if ps[family.index(test)] is None:
        return None
    tested = [(t, p) for t, p in zip(family, ps, strict=True) if p is not None]
    adjusted = holm([p for _, p in tested])
    return next(a for (t, _), a in zip(tested, adjusted, strict=True) if t is test)


def _horizon_text(key: str, horizon: _Horizon) -> str:
    return f"{horizon.value:.0f} samples" if key == "samples" else f"{horizon.value / 1e3:.2f} s of compute"


def verdict_lines(results: dict[str, list[dict]], metric: str, reference: str, higher_better: bool,
                  units: Units | None = None) -> tuple[list[str], dict[str, str]]:
    """The verdict section's lines, at equal samples and at equal compute time, one family corrected by Holm
    (module docstring), and each trainer's word at equal samples (for the disagreement sentences)."""
    horizons = {key: _within_horizon(results, metric, key, higher_better) for key in ("samples", "compute_ms")}
    horizons = {key: h for key, h in horizons.items() if h is not None}
    if reference not in results or len(results) < 2 or not horizons:  # nothing to compare the reference with
        return [], {}
    tests = {key: _verdict_tests(results, reference, h) for key, h in horizons.items()}
    family = [t for group in tests.values() for t in group]
    m = sum(family_p(t.paired) is not None for t in family)
    lines, words = [], {}
    for key, group in tests.items():
        where = "at equal samples" if key == "samples" else "at equal compute time"
        lines.append(f"{where[0].upper()}{where[1:]} (best validation {metric} within "
                     f"{_horizon_text(key, horizons[key])}, the shortest run's):")
        for test in group:
            if test.missing and not test.exact:  # not a lack of common seeds: no evaluation before the horizon
                lines.append(f"- **{test.run}**: not compared: no validation of {' or '.join(test.missing)} within "
                             f"{_horizon_text(key, horizons[key])} (evaluate more often, --eval-every)")
                continue
            margin, holds = ("", True)
            if key == "compute_ms" and not test.exact:
                margin, holds = _margin_note(results, metric, reference, higher_better, family, test)
            adjusted = _adjusted_for(family, test, test.paired)
            within = margin_of(metric, list(horizons[key].best[reference].values()) or [1.0])
            line = verdict_line(test.run, reference, test.paired, f"validation {metric}", higher_better,
                                exact=test.exact, where=where, adjusted=adjusted, family=m, units=units,
                                holds=holds, margin=margin, within=within)
            lines.append(line)
            if key == "samples":
                words[test.run] = "exact" if test.exact else verdict_word(test.paired, adjusted, higher_better,
                                                                           within)
    return lines, words


def example_verdict_lines(results: dict[str, list[dict]], metric: str, reference: str) -> list[str]:
    """Each run against the reference on the test split of its best-validation model, from every seed and every
    test example (``verdict.example_family``: a hierarchical bootstrap, one Holm family): the three words. Empty
    where no run has per-example outcomes."""
    if metric not in ("accuracy", "perplexity"):
        return []
    family = example_family({run: [r["report"] for r in seeds] for run, seeds in results.items()}, reference)
    if not family:
        return []
    return ["The test split of each run's best-validation model, from every seed and every test example (a "
            "hierarchical bootstrap: seeds, then examples, paired; 2,000 draws; Holm over the family):",
            *(bootstrap_line(run, reference, boot, metric, adjusted, len(family))
              for run, (boot, adjusted) in family.items())]


def disagreement_lines(results, metric, reference, higher_better, verdict_words: dict[str, str],
                       val_units: Units | None, test_units: Units | None) -> list[str]:
    """One sentence per trainer whose word at equal samples (validation) differs from the results table's
    (test of the best-validation model), each reading Holm-corrected in its own family."""
    pairs = _test_pairs(results, metric, reference)
    adjusted = _adjusted(pairs)
    out = []
    for run, word in verdict_words.items():
        paired = pairs.get(run)
        if word in ("exact", "one seed") or paired is None or paired.n < 2:
            continue
        reference_test = [r["report"]["test"][metric] for r in results[reference] if r["report"].get("test")]
        table_word = verdict_word(paired, adjusted.get(run), higher_better, margin_of(metric, reference_test or [1.0]))
        if table_word == word:
            continue
        p = "" if paired.p is None else f", p = {paired.p:.3g}, Holm {adjusted[run]:.3g}"
        out.append(f"- **{run}**: {word} at equal samples on validation, {table_word} on test in the results "
                   f"table ({paired.difference:+.4f}{p})")
    if not out:
        return []
    sizes = f", {val_units.count} vs {test_units.count} {test_units.noun}" if val_units and test_units else ""
    return [f"Where the two readings disagree (they read different splits{sizes}, at different points: the "
            f"horizon, and the best-validation model of the whole run; neither settles the other, more seeds "
            f"would):", *out]


def time_to_target_table(results: dict[str, list[dict]], metric: str, target: float, higher_better: bool) -> str:
    """Markdown: per run, how many seeds reached ``target`` and the mean samples and compute time they took."""
    lines = [f"| run | seeds reaching {target:.4f} | samples to target (mean) | compute s to target (mean, timed) |",
             "|---|---|---|---|"]
    for run, seeds in results.items():
        hits = [hit for r in seeds if (hit := time_to_target(r["history"], metric, target, higher_better))]
        samples = [h["samples"] for h in hits if h["samples"] is not None]
        compute = [h["compute_ms"] / 1e3 for h in hits if h["compute_ms"] is not None]
        lines.append(f"| {run} | {len(hits)} of {len(seeds)}"
                     f"{'' if hits else ' (not reached)'} | {f'{statistics.mean(samples):.0f}' if samples else '-'} "
                     f"| {f'{statistics.mean(compute):.2f}' if compute else '-'} |")
    return "\n".join(lines) + "\n"


def timing_table(results: dict[str, list[dict]], timing: dict) -> tuple[str, list[str]]:
    """Markdown table of the round-robin step timing and one step's tensor memory, with each run's own clock;
    and a note per run whose own median step differs from the timed one by more than the timing's spread over
    rounds (max - min of the round medians: the load changed between the timing and the training)."""
    reference = timing["reference"]
    other = {t["at_other_threads"]["threads"] for t in timing["trainers"].values() if "at_other_threads" in t}
    other_head = "".join(f" ratio at {n} thread{'s' if n > 1 else ''} (the margin's) |" for n in other)
    lines = [f"| run | batch | step ms (timed, round-robin) | ratio to {reference} (95% interval of the median) "
             f"[min..max over rounds] |{other_head}"
             " one step's peak tensor memory, MB | step ms, the runs' own clock (median) |",
             "|---|---|---|---|" + "---|" * len(other) + "---|---|"]
    notes = []
    for run, t in timing["trainers"].items():
        own = [h["time/step_ms"] for r in results.get(run, []) for h in r["history"] if "time/step_ms" in h]
        own_ms = statistics.median(own) if own else None
        interval = f"({t['ratio_low']:.3f}..{t['ratio_high']:.3f}) " if "ratio_low" in t else ""
        again = t.get("at_other_threads")
        other_cell = "".join(f" {again['ratio']:.3f} ({again['ratio_low']:.3f}..{again['ratio_high']:.3f}) |"
                             if again else " - |" for _ in other)
        lines.append(f"| {run} | {t['batch_size']} | {t['step_ms']:.3f} | {t['ratio']:.3f} {interval}"
                     f"[{t['ratio_min']:.3f}..{t['ratio_max']:.3f}] |{other_cell} {t['peak_mb']:.2f} "
                     f"| {f'{own_ms:.3f}' if own_ms is not None else '-'} |")
        if own_ms is not None and abs(own_ms - t["step_ms"]) > t["ms_max"] - t["ms_min"]:
            notes.append(f"- {run}: its runs' own clock read a median step of {own_ms:.3f} ms, {t['step_ms']:.3f} ms "
                         f"timed: they differ by more than the timing's spread over rounds ({t['ms_min']:.3f}.."
                         f"{t['ms_max']:.3f} ms), so the machine's load changed during training; compute times and "
                         f"ratios here use the timing, not the runs' clock.")
    return "\n".join(lines) + "\n", notes


MEMORY_NOTE = ("Memory: the tensors one training step allocates beyond what it starts with, profiled once "
               "(torch's profiler on the CPU, the allocator's peak on CUDA); TensorBoard's "
               "`memory/process_peak_mb` is another quantity, the whole process's peak (resident set on the CPU, "
               "allocated CUDA memory on a GPU).")


def _number(value) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def settings_table(results: dict[str, list[dict]]) -> str:
    """Markdown table of the settings each run used (its first seed's ``result.json``) and their source."""
    lines = ["| run | optimizer | lr | momentum | weight decay | batch | clip | engine options | settings from |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run, seeds in results.items():
        report = seeds[0]["report"]
        cfg, engine = report["config"], report["engine"]
        options = ", ".join(f"{k.split('.', 1)[1]}={_number(v)}" for k, v in engine.items() if k != "trainer")
        settings = report.get("settings") or SHARED_SETTINGS
        if settings["mode"] == "recipe" and settings["recipe"]:
            origin = "recipe: " + "; ".join(dict.fromkeys(settings["recipe"].values()))
        elif settings["mode"] == "recipe":
            origin = "no recipe for this trainer and model: shared defaults"
        else:
            origin = "shared defaults"
        if settings["overridden"]:
            origin += f" (flags replaced {', '.join(settings['overridden'])})"
        if "tuned" in settings:
            tuned = settings["tuned"]
            caveats = tuning_caveats(tuned)
            origin = (f"tuned {trial_name(tuned['values'])} ({tuned['budget']} trials on seed {tuned['seed']}, "
                      f"validation split{'; ' + caveats if caveats else ''}); {origin}")
        momentum = _number(cfg["momentum"]) if cfg["optimizer"] == "sgd" else "-"
        lines.append(f"| {run} | {cfg['optimizer']} | {_number(cfg['lr'])} | {momentum} "
                     f"| {_number(cfg['weight_decay'])} | {cfg['batch_size']} | {_number(cfg['clip_grad_norm'])} "
                     f"| {options or '-'} | {origin} |")
    return "\n".join(lines) + "\n"


def failure_notes(results: dict[str, list[dict]], metric: str, chance: float | None = None) -> list[str]:
    """One line per run that failed: validation at chance level, or a collapse after its best point.

    Collapse: the seed-mean final validation accuracy 0.1 below the best, or perplexity 1.25x
    above it. Chance: best validation accuracy below 1.5x ``chance`` (1 / classes).
    """
    notes = []
    for run, seeds in results.items():
        best = statistics.mean(r["report"]["best_val"][metric] for r in seeds)
        final = statistics.mean(r["report"]["final_val"][metric] for r in seeds)
        steps = [r["report"]["best_step"] for r in seeds]
        higher_better = metric != "perplexity"
        if higher_better and chance is not None and best < 1.5 * chance:
            notes.append(f"- {run}: never above chance level (best validation {metric} {best:.4f}, chance "
                         f"{chance:.4f}); its settings (table below) do not train this model: try --tune.")
        elif (final < best - 0.1) if higher_better else (final > 1.25 * best):
            notes.append(f"- {run}: validation {metric} peaked at {best:.4f} (step {min(steps)}-{max(steps)}) "
                         f"and ended at {final:.4f}: training collapsed after its best point; the test column "
                         f"is the best validation model's.")
    return notes


BUDGET_TEXT = {
    "samples": "equal samples: every trainer sees as many training samples as the reference",
    "steps": "equal steps: every trainer takes as many optimizer steps as the reference",
    "time": "equal compute time: every trainer gets the reference's steps x timed step time (a cheaper step gets "
            "more steps)",
}


def _header(experiment: str, task, results: dict[str, list[dict]], comparison: dict | None) -> str:
    lines = [f"# {experiment}: task {task.name}, model {model_text(results)}", ""]
    if comparison:
        timing, lengths = comparison["timing"], comparison["lengths"]
        runs = ", ".join(f"{t} {next(iter(v.values()))} {next(iter(v))}" for t, v in lengths.items())
        sessions = comparison.get("sessions", 1)
        again = {t["at_other_threads"]["threads"] for t in timing["trainers"].values() if "at_other_threads" in t}
        lines += [f"- budget: {BUDGET_TEXT[comparison['budget']]} ({runs}); reference: {comparison['reference']}",
                  f"- seeds: {', '.join(map(str, comparison['seeds']))} (n = {len(comparison['seeds'])}); "
                  f"± is the sample standard deviation over seeds, [..] the 95% confidence interval (Student t)",
                  f"- machine: {timing['machine']} (threads: {timing['threads']['reason']})",
                  f"- started {comparison['started']}, {comparison['wall_s']:.0f} s in all"
                  f"{f' over {sessions} sessions (resumed)' if sessions > 1 else ''}; step times: "
                  f"round-robin over {timing['rounds']} rounds on the experiment's own model and batches"
                  + "".join(f", again at {n} thread{'s' if n > 1 else ''} for the equal-compute margin" for n in again),
                  ""]
    return "\n".join(lines) + "\n"


def _units(task, split: str, metric: str, rows=None) -> Units | None:
    """The count of targets an accuracy on ``split`` averages over (examples, or tokens for a sequence task)."""
    if metric != "accuracy":
        return None
    data = getattr(task, split)
    keys = data.order() if rows is None else data.order()[rows]
    per_sample = data.take(slice(0, 1))[1].dim() > 1
    return Units(data.counted(keys), "tokens" if per_sample else "examples", split)


def write_summary(out_dir, experiment: str, task, results: dict[str, list[dict]],
                  comparison: dict | None = None) -> str:
    """``summary.md``: a header (task, model, budget, seeds, machine, time), the verdict against the reference
    at equal samples and at equal compute time, the results with their uncertainty, time to target, step time
    and memory, failures explained in one line each, and the settings of every run."""
    metric = task.metric_name
    higher_better = metric != "perplexity"
    classifier = metric == "accuracy" and task.expected_output_shape == (task.num_outputs,)
    chance = 1.0 / task.num_outputs if classifier else None
    reference = comparison["reference"] if comparison else ("backprop" if "backprop" in results else
                                                          next(iter(results), None))
    cfg = next(iter(results.values()))[0]["report"]["config"] if results else {}
    rows = eval_subset(len(task.val), cfg.get("eval_batches"), cfg.get("eval_batch_size", 1))
    val_units, test_units = _units(task, "val", metric, rows), _units(task, "test", metric)
    table = summary_table(results, metric, reference, test_units)
    notes = [f"- {f['run']} seed {f['seed']}: {f['error']} (no result; the table leaves this seed out)"
             for f in experiment_failures(out_dir)] + failure_notes(results, metric, chance)
    verdict, words = verdict_lines(results, metric, reference, higher_better, val_units) if reference else ([], {})
    parts = [_header(experiment, task, results, comparison)]
    if verdict:
        disagree = disagreement_lines(results, metric, reference, higher_better, words, val_units, test_units)
        parts.append(
            "## Verdict\n\nThe verdict reads validation: each seed's best validation "
            f"{metric} within the horizon every run reached, paired against {reference} "
            f"({'; '.join(u.describe() for u in (val_units,) if u) or 'the validation split'}). The results table "
            "below reads test: the best-validation model of each whole run. Each is one family of paired t-tests "
            f"corrected by Holm's method: ahead or behind only where the adjusted p < {ALPHA:g}; equivalent where "
            "the difference's 90% interval lies inside the stated margin; undecided otherwise.\n\n"
            + "\n".join(verdict) + "\n\n"
            + ("\n".join(disagree) + "\n\n" if disagree else ""))
    examples = example_verdict_lines(results, metric, reference) if reference else []
    parts.append(f"## Results\n\n{table}\n" + ("\n" + "\n".join(examples) + "\n\n" if examples else ""))
    aligned = alignment_table(results)
    if aligned:
        parts.append("## Alignment of the feedback with the forward weights\n\nPer covered layer, the angle between "
                     "the feedback B of the logged step and the forward weight W it stands for (TensorBoard: "
                     f"{ALIGNMENT}<layer>; per-layer gradient cosines against backprop: grad/cosine/<parameter>)"
                     f"{DFA_HAS_NO_ANGLE if 'dfa' in results else ''}.\n\n{aligned}\n")
    if reference in results:
        target = (comparison or {}).get("target")
        if target is None:
            target = default_target([r["report"]["best_val"][metric] for r in results[reference]], higher_better)
            how = (f"{TARGET_FRACTION:g} x {reference}'s mean best" if higher_better else
                   f"{reference}'s mean best / {TARGET_FRACTION:g}")
        else:
            how = "--target"
        parts.append(f"## Time to target: validation {metric} {'>=' if higher_better else '<='} {target:.4f} ({how})"
                     f"\n\n{time_to_target_table(results, metric, target, higher_better)}\n")
    if comparison:
        timing_md, clock_notes = timing_table(results, comparison["timing"])
        notes += clock_notes
        parts.append(f"## Step time and memory\n\n{timing_md}\n{MEMORY_NOTE}\n\n")
    if notes:
        parts.append("Notes:\n" + "\n".join(notes) + "\n\n")
    parts.append(f"## Settings (each run's first seed)\n\n{settings_table(results)}")
    parts.append(engine_origins(results))
    write_text_atomic(Path(out_dir) / "summary.md", "".join(parts))
    return table


def engine_origins(results: dict[str, list[dict]]) -> str:
    """Where each engine that is not built in came from (its file and sha256, its module and version, its plugin),
    as its run recorded it (``trainers.core.registry.engine_origin``); empty when every engine is built in."""
    lines = []
    for run, seeds in results.items():
        origin = (seeds[0]["report"].get("settings") or {}).get("engine")
        if not origin or origin["source"] == "built in":
            continue
        where = origin.get("path") or origin.get("module", "")
        if origin["source"] == "plugin":
            where = f"plugin {origin['distribution']} {origin['version']} ({origin['entry_point']})"
        elif origin.get("version"):
            where += f" ({origin['distribution']} {origin['version']})"
        digest = f", sha256 {origin['sha256'][:16]}" if origin.get("sha256") else ""
        lines.append(f"- {run}: {origin['class']} from {where}{digest}")
    return "\n## Engines from outside the framework\n\n" + "\n".join(lines) + "\n" if lines else ""


def model_text(results: dict[str, list[dict]]) -> str:
    """The model and its options, from a run's record: ``mlp (depth=4, width=64, ...)``."""
    model = dict(next(iter(results.values()))[0]["report"].get("model") or {}) if results else {}
    class_name = model.pop("model", "?")  # the module's class; "name" is how it was asked for
    name = model.pop("name", class_name)
    options = ", ".join(f"{k}={v}" for k, v in model.items() if v is not None and k not in ("in_features",
                                                                                           "out_features"))
    return f"{name} ({options})" if options else str(name)


def pivot_table(rows: list[dict], *, value: str = "test", columns: list[str] | None = None) -> str:
    """Markdown: one row per experiment, one column per run name, cells mean ± std (n seeds)
    of the ``value`` split's metric (``test`` of the best validation model, or ``best_val``)."""
    cells, experiments, runs = pivot_cells(rows, value=value, columns=columns)
    lines = ["| experiment | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for exp in experiments:
        row = []
        for run in runs:
            values = cells.get((exp, run))
            row.append(f"{mean_std(values)} ({len(values)})" if values else "")
        lines.append(f"| {exp} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
