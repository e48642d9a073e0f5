"""Train several engines on the same model, task and seeds; summarize.

Writes the TensorBoard runs ``<logdir>/<experiment>/<trainer>/seed<k>/``,
then ``summary.md`` (a Markdown table, mean +- std over seeds) and
``comparison.png`` beside them.
"""

import json
import statistics
from pathlib import Path

from trainers.checkpoint import write_text_atomic
from trainers.distributed import DataParallel
from trainers.errors import IncompatibleModelError, NonFiniteLossError
from trainers.hparams import write_experiment_config
from trainers.logger import read_metrics
from trainers.plots import plot_comparison
from trainers.recipes import SHARED_SETTINGS
from trainers.registry import engine_class
from trainers.rundir import FAILED
from trainers.trainer import Trainer
from trainers.tuning import trial_name

__all__ = ["run_comparison", "summary_table", "settings_table", "failure_notes", "write_summary", "experiment_failures",
           "experiment_runs", "compatible", "collect_results", "pivot_cells", "pivot_table"]


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def summary_table(results: dict[str, list[dict]], metric: str) -> str:
    """Markdown table: one row per run name over its seeds (best and final validation, test of the
    best validation model, training loss, step time, gradient cosine against backprop).

    ``results[run]`` lists, per seed, ``{"report": result.json, "history": metrics.jsonl records}``.
    """
    lines = [
        f"| run | seeds | best val {metric} | final val {metric} | test {metric} (best val model) "
        "| final train loss | median step ms | mean grad cosine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, seeds in results.items():
        val = [r["report"]["best_val"][metric] for r in seeds]
        final = [r["report"]["final_val"][metric] for r in seeds]
        test = [r["report"]["test"][metric] for r in seeds]
        losses = [[h["train/loss"] for h in r["history"] if "train/loss" in h][-1] for r in seeds]
        step_ms = [h["time/step_ms"] for r in seeds for h in r["history"] if "time/step_ms" in h]
        cos = [h["grad/cosine_global"] for r in seeds for h in r["history"] if "grad/cosine_global" in h]
        lines.append(
            f"| {run} | {len(seeds)} | {_mean_std(val)} | {_mean_std(final)} | {_mean_std(test)} | {_mean_std(losses)} "
            f"| {statistics.median(step_ms):.2f} | {f'{statistics.mean(cos):.4f}' if cos else 'n/a'} |"
        )
    return "\n".join(lines) + "\n"


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


def write_summary(out_dir, experiment: str, task, results: dict[str, list[dict]]) -> str:
    """``summary.md``: results, failures explained in one line each, and the settings of every run."""
    metric = task.metric_name
    classifier = metric == "accuracy" and task.expected_output_shape == (task.num_outputs,)
    chance = 1.0 / task.num_outputs if classifier else None
    table = summary_table(results, metric)
    notes = [f"- {f['run']} seed {f['seed']}: {f['error']} (no result; the table leaves this seed out)"
             for f in experiment_failures(out_dir)] + failure_notes(results, metric, chance)
    text = (f"# {experiment}: task {task.name}\n\n{table}\n"
            + ("Failures:\n" + "\n".join(notes) + "\n\n" if notes else "")
            + f"Settings (each run's first seed):\n\n{settings_table(results)}")
    write_text_atomic(Path(out_dir) / "summary.md", text)
    return table


def experiment_failures(out_dir) -> list[dict]:
    """Every run below one experiment folder that stopped on a non-finite loss: ``{"run", "seed", "error"}``."""
    return [json.loads(path.read_text()) for path in sorted(Path(out_dir).glob(f"*/seed*/{FAILED}"))]


def experiment_runs(out_dir) -> dict[str, list[dict]]:
    """Every finished run below one experiment folder: run name -> per-seed report and history."""
    runs: dict[str, list[dict]] = {}
    for result in sorted(Path(out_dir).glob("*/seed*/result.json")):
        runs.setdefault(result.parent.parent.name, []).append(
            {"report": json.loads(result.read_text()), "history": read_metrics(result.parent)})
    return runs


def run_comparison(build, trainers: list[str], seeds: list[int], *, logdir, experiment: str,
                   epochs=None, steps=None, resume=False, overwrite=True, run_name=None, allow_changes=()) -> dict:
    """Run every (trainer, seed), then write the summary table and figure of the
    whole experiment folder (runs added by earlier calls included).

    A run whose loss turns NaN or Inf is recorded (``failed.json`` in its directory, listed
    in ``summary.md``) and the others go on; the returned ``failures`` lists them.

    ``build(trainer, seed) -> trainers.cli.Setup`` makes a fresh, seeded setup
    (engine, task, model, config, meta, settings); all setups are built and checked before any run
    starts, so a bad trainer/model pair leaves nothing behind. ``resume`` and ``allow_changes``
    are ``Trainer.fit``'s.
    """
    setups = {(t, s): build(t, s) for t in trainers for s in seeds}
    trainer_objs = {key: Trainer(s.model, s.engine, s.task, config=s.config, logdir=logdir, experiment=experiment,
                                 run_name=run_name, overwrite=overwrite, meta=s.meta, settings=s.settings)
                    for key, s in setups.items()}
    failures = [failure for (name, seed), trainer in trainer_objs.items()
                if (failure := _run_or_record(trainer, name, seed, epochs=epochs, steps=steps, resume=resume,
                                                 allow_changes=allow_changes))]
    task = next(iter(setups.values())).task
    metric = task.metric_name
    out_dir = Path(logdir) / experiment
    if not DataParallel().is_main:  # under torchrun, rank 0 writes the summary
        return {"results": {}, "table": "", "dir": out_dir, "failures": failures}
    results = experiment_runs(out_dir)
    table = write_summary(out_dir, experiment, task, results)
    write_experiment_config(out_dir)
    plot_comparison({run: [r["history"] for r in seeds] for run, seeds in results.items()}, metric,
                    out_dir / "comparison.png")
    return {"results": results, "table": table, "dir": out_dir, "failures": failures}


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
    for path in sorted(root.rglob("result.json")):
        record = json.loads(path.read_text())
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
