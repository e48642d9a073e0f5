"""Train several engines on the same model, task and seeds; summarize.

Writes the TensorBoard runs ``<logdir>/<experiment>/<trainer>/seed<k>/``,
then ``summary.md`` (a Markdown table, mean +- std over seeds) and
``comparison.png`` beside them.
"""

import json
import math
import statistics
import time
from pathlib import Path

from trainers.core.distributed import DataParallel
from trainers.core.errors import ConfigError, DataError, IncompatibleModelError, NonFiniteLossError, spell
from trainers.core.registry import engine_class
from trainers.experiments.budget import BUDGETS, budget_steps, reference_trainer
from trainers.experiments.plots import plot_comparison
from trainers.experiments.recipes import SHARED_SETTINGS
from trainers.experiments.stats import paired_test, summarize
from trainers.experiments.step_timing import ROUNDS, time_steps
from trainers.experiments.tuning import trial_name
from trainers.experiments.verdict import TARGET_FRACTION, default_target, is_exact, time_to_target, verdict_line
from trainers.run.checkpoint import write_text_atomic
from trainers.run.hparams import write_experiment_config
from trainers.run.logger import read_metrics
from trainers.run.records import failure_problem, read_records
from trainers.run.rundir import FAILED, RunDirectory, note, run_path
from trainers.run.trainer import Trainer

__all__ = ["run_comparison", "summary_table", "settings_table", "failure_notes", "write_summary", "experiment_failures",
           "experiment_runs", "compatible", "collect_results", "pivot_cells", "pivot_table"]


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def _last(history: list[dict], key: str):
    return next((r[key] for r in reversed(history) if key in r), None)


def summary_table(results: dict[str, list[dict]], metric: str, reference: str | None = None) -> str:
    """Markdown table: one row per run name over its seeds: length (steps, samples, timed compute time),
    best and final validation, test of the best validation model as mean ± sample std [95% CI] (n seeds),
    its paired difference to ``reference`` over common seeds, training loss, gradient cosine.

    ``results[run]`` lists, per seed, ``{"report": result.json, "history": metrics.jsonl records}``.
    """
    ref = {r["report"]["config"]["seed"]: r["report"]["test"][metric] for r in results.get(reference, [])
           if r["report"]["test"]}
    lines = [
        f"| run | seeds | steps | samples | compute s (timed) | best val {metric} | final val {metric} "
        f"| test {metric} (best val model): mean ± std [95% CI] | test − {reference or 'reference'}: mean [95% CI], "
        "paired t-test | final train loss | mean grad cosine |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, seeds in results.items():
        val = [r["report"]["best_val"][metric] for r in seeds]
        final = [r["report"]["final_val"][metric] for r in seeds]
        tests = {r["report"]["config"]["seed"]: r["report"]["test"][metric] for r in seeds if r["report"]["test"]}
        losses = [_last(r["history"], "train/loss") for r in seeds]
        cos = [h["grad/cosine_global"] for r in seeds for h in r["history"] if "grad/cosine_global" in h]
        steps = sorted({r["report"]["steps"] for r in seeds})
        samples = sorted({r["report"].get("samples") for r in seeds} - {None})
        compute = [r["report"]["timing"]["compute_ms"] / 1e3 for r in seeds if "timing" in r["report"]]
        if run == reference or not ref:
            against = "reference" if run == reference else "-"
        else:
            paired = paired_test(tests, ref)
            against = "-" if paired is None else (
                f"{paired.difference:+.4f} (n=1)" if paired.n < 2 else
                f"{paired.difference:+.4f} (every seed)" if paired.t is None else
                f"{paired.difference:+.4f} [{paired.low:+.4f}, {paired.high:+.4f}], t = {paired.t:.2f}, "
                f"p = {paired.p:.3g} (n={paired.n})")
        lines.append(
            f"| {run} | {len(seeds)} | {'/'.join(map(str, steps))} | {'/'.join(map(str, samples)) or '-'} "
            f"| {f'{statistics.mean(compute):.2f}' if compute else '-'} | {_mean_std(val)} | {_mean_std(final)} "
            f"| {summarize(list(tests.values())).text() if tests else '-'} | {against} "
            f"| {_mean_std([v for v in losses if v is not None])} "
            f"| {f'{statistics.mean(cos):.4f}' if cos else 'n/a'} |"
        )
    return "\n".join(lines) + "\n"


def _best_within(history: list[dict], metric: str, key: str, horizon: float, higher_better: bool) -> float | None:
    """The best validation ``metric`` among the records with ``key`` <= ``horizon`` (None: none)."""
    values = [r[f"eval/{metric}"] for r in history if f"eval/{metric}" in r and key in r and r[key] <= horizon]
    return (max(values) if higher_better else min(values)) if values else None


def verdict_lines(results: dict[str, list[dict]], metric: str, reference: str, key: str, label: str,
                  higher_better: bool) -> list[str]:
    """One verdict per trainer at equal ``key`` (samples or compute_ms): the best validation ``metric``
    each seed reached within the horizon every run reached (the shortest run's ``key``), paired against
    ``reference`` over common seeds (``trainers.experiments.verdict``)."""
    ends = [_last(r["history"], key) for seeds in results.values() for r in seeds]
    if reference not in results or not ends or any(e is None for e in ends):
        return []
    horizon = min(ends)
    unit = f"{horizon:.0f} samples" if key == "samples" else f"{horizon / 1e3:.2f} s of compute"

    def values(run):
        out = {r["report"]["config"]["seed"]: _best_within(r["history"], metric, key, horizon, higher_better)
               for r in results[run]}
        return {seed: v for seed, v in out.items() if v is not None}

    ref = values(reference)
    lines = [f"{label} (best validation {metric} within {unit}, the shortest run's):"]
    for run in results:
        if run != reference:
            exact = is_exact([r["history"] for r in results[run]])
            missing = [name for name, v in ((reference, ref), (run, values(run))) if not v]
            if missing and not exact:  # not a lack of common seeds: no evaluation before the horizon
                lines.append(f"- **{run}**: not compared: no validation of {' or '.join(missing)} within {unit} "
                             f"(evaluate more often, --eval-every)")
                continue
            lines.append(verdict_line(run, reference, paired_test(values(run), ref), f"validation {metric}",
                                      higher_better, exact=exact, where=label.lower()))
    return lines


def time_to_target_table(results: dict[str, list[dict]], metric: str, target: float, higher_better: bool) -> str:
    """Markdown: per run, how many seeds reached ``target`` and the mean samples and compute time they took."""
    lines = [f"| run | seeds reaching {target:.4f} | samples to target (mean) | compute s to target (mean) |",
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
    """Markdown table of the round-robin step timing and peak memory, with each run's own clock; and a note
    per run whose own median step differs from the timed one by more than the timing's spread over rounds
    (max - min of the round medians: the load changed between the timing and the training)."""
    reference = timing["reference"]
    lines = [f"| run | batch | step ms (timed) | ratio to {reference} [min..max over rounds] | peak MB (one step) "
             "| the runs' own clock, median ms |", "|---|---|---|---|---|---|"]
    notes = []
    for run, t in timing["trainers"].items():
        own = [h["time/step_ms"] for r in results.get(run, []) for h in r["history"] if "time/step_ms" in h]
        own_ms = statistics.median(own) if own else None
        lines.append(f"| {run} | {t['batch_size']} | {t['step_ms']:.3f} | {t['ratio']:.3f} "
                     f"[{t['ratio_min']:.3f}..{t['ratio_max']:.3f}] | {t['peak_mb']:.2f} "
                     f"| {f'{own_ms:.3f}' if own_ms is not None else '-'} |")
        if own_ms is not None and abs(own_ms - t["step_ms"]) > t["ms_max"] - t["ms_min"]:
            notes.append(f"- {run}: its runs' own clock read a median step of {own_ms:.3f} ms, {t['step_ms']:.3f} ms "
                         f"timed: they differ by more than the timing's spread over rounds ({t['ms_min']:.3f}.."
                         f"{t['ms_max']:.3f} ms), so the machine's load changed during training; compute times and "
                         f"ratios here use the timing, not the runs' clock.")
    return "\n".join(lines) + "\n", notes


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
            origin = (f"tuned {trial_name(tuned['values'])} ({tuned['budget']} trials on seed {tuned['seed']}, "
                      f"validation split); {origin}")
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
    lines = [f"# {experiment}: task {task.name}, model {_model_text(results)}", ""]
    if comparison:
        timing, lengths = comparison["timing"], comparison["lengths"]
        runs = ", ".join(f"{t} {next(iter(v.values()))} {next(iter(v))}" for t, v in lengths.items())
        lines += [f"- budget: {BUDGET_TEXT[comparison['budget']]} ({runs}); reference: {comparison['reference']}",
                  f"- seeds: {', '.join(map(str, comparison['seeds']))} (n = {len(comparison['seeds'])}); "
                  f"± is the sample standard deviation over seeds, [..] the 95% confidence interval (Student t)",
                  f"- machine: {timing['machine']} (threads: {timing['threads']['reason']})",
                  f"- started {comparison['started']}, {comparison['wall_s']:.0f} s in all; step times: "
                  f"round-robin over {timing['rounds']} rounds on the experiment's own model and batches", ""]
    return "\n".join(lines) + "\n"


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
    table = summary_table(results, metric, reference)
    notes = [f"- {f['run']} seed {f['seed']}: {f['error']} (no result; the table leaves this seed out)"
             for f in experiment_failures(out_dir)] + failure_notes(results, metric, chance)
    verdict = []
    if reference in results:
        verdict = (verdict_lines(results, metric, reference, "samples", "At equal samples", higher_better)
                   + verdict_lines(results, metric, reference, "compute_ms", "At equal compute time", higher_better))
    parts = [_header(experiment, task, results, comparison)]
    if verdict:
        parts.append("## Verdict\n\n" + "\n".join(verdict) + "\n\n")
    parts.append(f"## Results\n\n{table}\n")
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
        parts.append(f"## Step time and memory\n\n{timing_md}\n")
    if notes:
        parts.append("Notes:\n" + "\n".join(notes) + "\n\n")
    parts.append(f"## Settings (each run's first seed)\n\n{settings_table(results)}")
    write_text_atomic(Path(out_dir) / "summary.md", "".join(parts))
    return table


def experiment_failures(out_dir) -> list[dict]:
    """Every run below one experiment folder that stopped on a non-finite loss: ``{"run", "seed", "error"}``
    (a damaged ``failed.json`` is noted and left out)."""
    return [record for _, record in read_records(_run_files(out_dir, FAILED), failure_problem)]


def _run_files(out_dir, name: str) -> list[Path]:
    """``<run name...>/seed<k>/<name>`` below ``out_dir`` (run names may hold a '/'), tuning trials excluded."""
    out_dir = Path(out_dir)
    return sorted(p for p in out_dir.rglob(f"seed*/{name}") if p.parent.parent != out_dir
                  and "tuning" not in p.relative_to(out_dir).parts[:1])


def experiment_runs(out_dir) -> dict[str, list[dict]]:
    """Every finished run below one experiment folder: run name -> per-seed report and history (a damaged
    ``result.json`` or ``metrics.jsonl`` is noted and the run left out)."""
    runs: dict[str, list[dict]] = {}
    for result, record in read_records(_run_files(out_dir, "result.json")):
        try:
            history = read_metrics(result.parent)
        except DataError as err:
            note(f"{err}; {result.parent} left out")
            continue
        runs.setdefault(str(result.parent.parent.relative_to(out_dir)), []).append(
            {"report": record, "history": history})
    return runs


def run_comparison(build, trainers: list[str], seeds: list[int], *, logdir, experiment: str,
                   epochs=None, steps=None, resume=False, overwrite=False, run_name=None, allow_changes=(),
                   budget: str = "samples", reference: str | None = None, target: float | None = None,
                   timing_rounds: int = ROUNDS, clock=time.perf_counter) -> dict:
    """Time every trainer's step, run every (trainer, seed) for its budget, then write the summary,
    ``comparison.json`` and the figure of the whole experiment folder (runs added by earlier calls included).

    Timing (``trainers.experiments.step_timing``): each trainer's step on its first seed's setup, round-robin
    against ``reference`` (backprop if compared, else the first trainer), ``timing_rounds`` rounds
    (``clock``: the timer, tests pass a fake one); a ``resume`` reuses the timing of ``comparison.json``
    when it covers the same trainers, so the budget stays the same.
    ``budget`` (``trainers.experiments.budget``): samples (default; with ``epochs`` every trainer runs them), steps
    or time, relative to the reference's ``epochs`` or ``steps``. ``target``: the validation metric
    of the time-to-target table (default: ``trainers.experiments.verdict.default_target``).

    A run whose loss turns NaN or Inf is recorded (``failed.json`` in its directory, listed
    in ``summary.md``) and the others go on; the returned ``failures`` lists them. A run directory
    that already holds a run is refused before anything trains, unless ``resume`` or ``overwrite``.

    ``build(trainer, seed) -> trainers.cli.Setup`` makes a fresh, seeded setup (``trainer``: a run name, e.g.
    ``highway-k1``, which ``build`` reads)
    (engine, task, model, config, meta, settings); all setups are built and checked before any run
    starts, so a bad trainer/model pair leaves nothing behind. ``resume`` and ``allow_changes``
    are ``Trainer.fit``'s.
    """
    started, wall = time.time(), time.perf_counter()
    if budget not in BUDGETS:
        raise ConfigError(f"budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    ref = reference_trainer(trainers, reference)
    setups = {(t, s): build(t, s) for t in trainers for s in seeds}
    out_dir = Path(logdir) / experiment
    if not (resume or overwrite):  # nothing finished is replaced, and the refusal comes before any training
        for t, s in setups:
            path = run_path(logdir, experiment, run_name or t, s)
            if RunDirectory(path).holds_run():
                raise ConfigError(f"{path} already holds a run; {spell('resume')} continues the comparison, "
                                  f"{spell('overwrite')} replaces its runs, or choose another {spell('experiment')}")
    here = DataParallel()
    # rank 0 decides whether a resume reuses its timing; every rank times (in lockstep), rank 0's numbers count
    previous = here.broadcast_object(_previous_timing(out_dir, trainers, ref) if resume and here.is_main else None,
                                     "sharing rank 0's step timing")
    timing = previous or here.broadcast_object(
        time_steps({t: build(t, seeds[0]) for t in trainers}, ref, rounds=timing_rounds, clock=clock),
        "sharing rank 0's step timing")
    lengths = _run_lengths(budget, ref, {t: setups[(t, seeds[0])] for t in trainers}, epochs, steps, timing)
    trainer_objs = {key: Trainer(s.model, s.engine, s.task, config=s.config, logdir=logdir, experiment=experiment,
                                 run_name=run_name or key[0], overwrite=overwrite, meta=s.meta, settings=s.settings,
                                 timing=timing["trainers"][key[0]])
                    for key, s in setups.items()}
    failures = [failure for (name, seed), trainer in trainer_objs.items()
                if (failure := _run_or_record(trainer, name, seed, resume=resume, allow_changes=allow_changes,
                                                 **lengths[name]))]
    task = next(iter(setups.values())).task
    if not here.is_main:  # under torchrun, rank 0 writes the summary
        return {"results": {}, "table": "", "dir": out_dir, "failures": failures}
    record = {"reference": ref, "budget": budget, "target": target, "seeds": seeds, "lengths": lengths,
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
              "wall_s": time.perf_counter() - wall, "timing": timing}
    write_text_atomic(out_dir / COMPARISON_FILE, json.dumps(record, indent=2) + "\n")
    results = experiment_runs(out_dir)
    table = write_summary(out_dir, experiment, task, results, record)
    write_experiment_config(out_dir)
    plot_comparison({run: [r["history"] for r in seeds] for run, seeds in results.items()}, task.metric_name,
                    out_dir / "comparison.png", title=f"{experiment}: task {task.name}, model {_model_text(results)}")
    return {"results": results, "table": table, "dir": out_dir, "failures": failures, "comparison": record}


def _previous_timing(out_dir: Path, trainers: list[str], reference: str) -> dict | None:
    """The step timing of the experiment's ``comparison.json`` if it covers these trainers and reference (a
    resume keeps its budget), else None."""
    try:
        timing = json.loads((out_dir / COMPARISON_FILE).read_text())["timing"]
        if timing["reference"] == reference and set(trainers) <= set(timing["trainers"]):
            return timing
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none, or a damaged record: time again
    return None


def _run_lengths(budget: str, reference: str, setups: dict, epochs, steps, timing: dict) -> dict[str, dict]:
    """``Trainer.fit`` arguments per trainer for ``budget``: ``{"epochs": E}`` (equal samples by epochs) or
    ``{"steps": n}``."""
    if budget == "samples" and steps is None:
        return {t: {"epochs": epochs} for t in setups}
    batches = {t: s.config.batch_size * DataParallel().world_size for t, s in setups.items()}
    n_train = len(setups[reference].task.train)
    reference_steps = steps if steps is not None else epochs * math.ceil(n_train / batches[reference])
    ratios = {t: timing["trainers"][t]["ratio"] for t in setups}
    return {t: {"steps": n} for t, n in budget_steps(budget, reference, reference_steps, batches, ratios).items()}


def _model_text(results: dict[str, list[dict]]) -> str:
    """The model and its options, from a run's record: ``mlp (depth=4, width=64, ...)``."""
    model = dict(next(iter(results.values()))[0]["report"].get("model") or {}) if results else {}
    class_name = model.pop("model", "?")  # the module's class; "name" is how it was asked for
    name = model.pop("name", class_name)
    options = ", ".join(f"{k}={v}" for k, v in model.items() if v is not None and k not in ("in_features",
                                                                                           "out_features"))
    return f"{name} ({options})" if options else str(name)


COMPARISON_FILE = "comparison.json"  # the last comparison's reference, budget, run lengths and step timing


def _run_or_record(trainer: Trainer, name: str, seed: int, **fit) -> dict | None:
    """``trainer.fit(**fit)``; a non-finite loss (which ``fit`` records in the run's ``failed.json``,
    under its lock) is returned (``{"run", "trainer", "seed", "error"}``), so the other runs can go on."""
    try:
        trainer.fit(**fit)
    except NonFiniteLossError as err:
        return {"run": trainer.run_name, "trainer": name, "seed": seed, "error": str(err)}
    return None


def compatible(trainer: str, model) -> bool:
    """Whether ``trainer`` accepts ``model`` (its ``check`` does not refuse it)."""
    try:
        engine_class(trainer)().check(model)
    except IncompatibleModelError:
        return False
    return True


def collect_results(root) -> list[dict]:
    """Every ``result.json`` below ``root`` but tuning trials', with its experiment path relative to ``root``."""
    root = Path(root)
    rows = []
    for path, record in read_records(sorted(root.rglob("result.json"))):
        if "trial" in (record.get("settings") or {}):
            continue
        run_dir = path.parent  # <root>/<experiment...>/<run>/seed<k>
        record["experiment"] = str(run_dir.parent.parent.relative_to(root)) or "."
        rows.append(record)
    return rows


def pivot_cells(rows: list[dict], *, value: str = "test", columns: list[str] | None = None):
    """(cells, experiments, runs): ``cells[(experiment, run)]`` = the ``value`` split's metric per seed."""
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r[value] is not None:  # no test of a run that never evaluated it
            cells.setdefault((r["experiment"], r["run"]), []).append(r[value][r["metric"]])
    experiments = list(dict.fromkeys(r["experiment"] for r in rows))
    return cells, experiments, columns or list(dict.fromkeys(r["run"] for r in rows))


def pivot_table(rows: list[dict], *, value: str = "test", columns: list[str] | None = None) -> str:
    """Markdown: one row per experiment, one column per run name, cells mean ± std (n seeds)
    of the ``value`` split's metric (``test`` of the best validation model, or ``best_val``)."""
    cells, experiments, runs = pivot_cells(rows, value=value, columns=columns)
    lines = ["| experiment | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    for exp in experiments:
        row = []
        for run in runs:
            values = cells.get((exp, run))
            row.append(f"{_mean_std(values)} ({len(values)})" if values else "")
        lines.append(f"| {exp} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
