"""Reading runs: an experiment folder's finished runs (``result.json`` with ``metrics.jsonl``) and the runs that
stopped on a non-finite loss (``failed.json``), and every ``result.json`` below a folder (``table``); a damaged
record is noted and left out."""

from pathlib import Path

from gradengines.trainers.core.errors import DataError
from gradengines.trainers.run.logger import read_metrics
from gradengines.trainers.run.records import failure_problem, read_records
from gradengines.trainers.run.rundir import FAILED, note

__all__ = ["experiment_runs", "experiment_failures", "collect_results", "pivot_cells"]


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
