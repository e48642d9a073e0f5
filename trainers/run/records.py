"""Reading the records runs leave (``result.json``, ``failed.json``) without trusting them (issue 23).

A record may be truncated by a full disk, edited by hand or replaced by something else. Every reader
of many records (summary.md, comparison.png, the HParams configuration, ``table.py``) goes through
:func:`read_records`: a damaged record is named in one note line and left out, and the good ones
are used, instead of one bad file stopping the whole report (after all of a comparison's training).
"""

from __future__ import annotations

import json
from pathlib import Path

from gradengines.trainers.run.notes import forget_said, note

__all__ = ["read_record", "read_records", "result_problem", "failure_problem", "forget_notes"]

_NOTED: set[Path] = set()  # damaged files already noted by this command


def forget_notes() -> None:
    """A new command starts: damaged files and once-said notes are noted again (``trainers.cli.run_cli``)."""
    _NOTED.clear()
    forget_said()


def _is_metrics(value, metric: str) -> bool:
    return isinstance(value, dict) and isinstance(value.get(metric), (int, float))


def result_problem(record) -> str | None:
    """Why ``record`` is not a usable ``result.json`` (None: it is)."""
    if not isinstance(record, dict):
        return f"not a JSON object but a {type(record).__name__}"
    missing = [k for k in ("run", "trainer", "task", "metric", "steps", "best_val", "final_val", "test", "config",
                           "engine", "model") if k not in record]
    if missing:
        return f"no {', '.join(missing)}"
    metric = record["metric"]
    if not isinstance(metric, str) or not isinstance(record["run"], str) or not isinstance(record["trainer"], str):
        return "run, trainer or metric is not a string"
    for split in ("best_val", "final_val"):
        if not _is_metrics(record[split], metric):
            return f"{split} has no number for its metric {metric!r}"
    if record["test"] is not None and not _is_metrics(record["test"], metric):
        return f"test is neither null nor a number for {metric!r}"
    if not isinstance(record["config"], dict) or not isinstance(record["config"].get("seed"), int):
        return "config has no integer seed"
    if not isinstance(record["engine"], dict) or not isinstance(record["model"], dict):
        return "engine or model is not an object"
    if not isinstance(record["steps"], int):
        return "steps is not an integer"
    return None


def failure_problem(record) -> str | None:
    """Why ``record`` is not a usable ``failed.json`` (None: it is)."""
    if not isinstance(record, dict):
        return f"not a JSON object but a {type(record).__name__}"
    if not all(k in record for k in ("run", "seed", "error")):
        return "no run, seed or error"
    return None


def read_record(path, problem=result_problem) -> dict | None:
    """The record at ``path``, or None with one note naming the file and what is wrong with it."""
    path = Path(path)
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
        why = problem(record)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        why = f"unreadable ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'empty'})"
    if why is None:
        return record
    if path.resolve() not in _NOTED:  # one note per file, however many reports read it
        _NOTED.add(path.resolve())
        note(f"{path} is damaged ({why}); left out")
    return None


def read_records(paths, problem=result_problem) -> list[tuple[Path, dict]]:
    """``(path, record)`` of every usable record among ``paths``, in order; damaged ones noted and left out."""
    return [(Path(p), record) for p in paths if (record := read_record(p, problem)) is not None]
