"""Train several engines on the same model, task and seeds; summarize.

Writes the TensorBoard runs ``<logdir>/<experiment>/<trainer>/seed<k>/``,
then ``summary.md`` (a Markdown table, mean +- std over seeds) and
``comparison.png`` beside them.
"""

import json
import statistics
from pathlib import Path

from trainers.distributed import DataParallel
from trainers.errors import IncompatibleModelError
from trainers.logger import read_metrics
from trainers.plots import plot_comparison
from trainers.registry import engine_class
from trainers.trainer import Trainer

__all__ = ["run_comparison", "summary_table", "experiment_runs", "compatible", "collect_results", "pivot_cells", "pivot_table"]


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def summary_table(results: dict[str, list[dict]], metric: str) -> str:
    """Markdown table: one row per run name over its seeds.

    ``results[run]`` lists, per seed, ``{"report": result.json, "history": metrics.jsonl records}``.
    """
    lines = [
        f"| run | seeds | best val {metric} | test {metric} (best val model) | final train loss | median step ms | mean grad cosine |",
        "|---|---|---|---|---|---|---|",
    ]
    for run, seeds in results.items():
        val = [r["report"]["best_val"][metric] for r in seeds]
        test = [r["report"]["test"][metric] for r in seeds]
        losses = [[h["train/loss"] for h in r["history"] if "train/loss" in h][-1] for r in seeds]
        step_ms = [h["time/step_ms"] for r in seeds for h in r["history"] if "time/step_ms" in h]
        cos = [h["grad/cosine_global"] for r in seeds for h in r["history"] if "grad/cosine_global" in h]
        lines.append(
            f"| {run} | {len(seeds)} | {_mean_std(val)} | {_mean_std(test)} | {_mean_std(losses)} "
            f"| {statistics.median(step_ms):.2f} | {f'{statistics.mean(cos):.4f}' if cos else 'n/a'} |"
        )
    return "\n".join(lines) + "\n"


def experiment_runs(out_dir) -> dict[str, list[dict]]:
    """Every finished run below one experiment folder: run name -> per-seed report and history."""
    runs: dict[str, list[dict]] = {}
    for result in sorted(Path(out_dir).glob("*/seed*/result.json")):
        runs.setdefault(result.parent.parent.name, []).append(
            {"report": json.loads(result.read_text()), "history": read_metrics(result.parent)})
    return runs


def run_comparison(build, trainers: list[str], seeds: list[int], *, logdir, experiment: str,
                   epochs=None, steps=None, resume=False, overwrite=True, run_name=None) -> dict:
    """Run every (trainer, seed), then write the summary table and figure of the
    whole experiment folder (runs added by earlier calls included).

    ``build(trainer, seed) -> (engine, task, model, config, meta)`` makes a
    fresh, seeded setup; all setups are built and checked before any run
    starts, so a bad trainer/model pair leaves nothing behind.
    """
    setups = {(t, s): build(t, s) for t in trainers for s in seeds}
    trainer_objs = {key: Trainer(model, engine, task, config=cfg, logdir=logdir, experiment=experiment,
                                 run_name=run_name, overwrite=overwrite, meta=meta)
                    for key, (engine, task, model, cfg, meta) in setups.items()}
    for trainer in trainer_objs.values():
        trainer.fit(epochs=epochs, steps=steps, resume=resume)
    task = next(iter(setups.values()))[1]
    metric = task.metric_name
    out_dir = Path(logdir) / experiment
    if not DataParallel().is_main:  # under torchrun, rank 0 writes the summary
        return {"results": {}, "table": "", "dir": out_dir}
    results = experiment_runs(out_dir)
    table = summary_table(results, metric)
    (out_dir / "summary.md").write_text(f"# {experiment}: task {task.name}\n\n{table}")
    plot_comparison({run: [r["history"] for r in seeds] for run, seeds in results.items()}, metric,
                    out_dir / "comparison.png")
    return {"results": results, "table": table, "dir": out_dir}


def compatible(trainer: str, model) -> bool:
    """Whether ``trainer`` accepts ``model`` (its ``check`` does not refuse it)."""
    try:
        engine_class(trainer)().check(model)
    except IncompatibleModelError:
        return False
    return True


def collect_results(root) -> list[dict]:
    """Every ``result.json`` below ``root``, with its experiment path relative to ``root``."""
    root = Path(root)
    rows = []
    for path in sorted(root.rglob("result.json")):
        record = json.loads(path.read_text())
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
