"""Tuning: a grid search of each trainer's settings on the validation split.

``scripts/compare.py --tune`` runs, for every trainer, one training run (a trial)
per point of a grid: by default the learning rate on a log grid of five points,
the trainer's own learning rate times 10^(-1, -1/2, 0, 1/2, 1); ``--tune-grid
KEY=V1,V2,...`` replaces or adds dimensions (``lr``, any ``TrainConfig`` field, or
an engine option as ``<trainer>.<option>``, e.g. ``foton.temperature=1,4,8``).
The budget is the grid's size per trainer, printed and recorded. Trials train
on one seed and are selected by their best validation metric; they never
evaluate the test split. Each trial is a TensorBoard run in
``<experiment>/tuning/<trainer>/<values>/seed<k>`` (run name ``<trainer>/<values>``);
``tuning.json`` beside them
records every trial and the choice. The seeds of the comparison then train at
each trainer's selected point, and only those runs are evaluated on the test split.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import math
from pathlib import Path

from gradengines.trainers.core.distributed import DataParallel
from gradengines.trainers.core.errors import ConfigError, NonFiniteLossError
from gradengines.trainers.core.options import parse_options
from gradengines.trainers.core.registry import build_engine, engine_class
from gradengines.trainers.run.checkpoint import write_text_atomic
from gradengines.trainers.run.config import TrainConfig
from gradengines.trainers.run.notes import note
from gradengines.trainers.run.trainer import Trainer

__all__ = ["LR_FACTORS", "parse_grid", "trainer_grid", "trial_name", "select", "tune_trainer", "grid_edges",
           "tuning_caveats"]

#: Default grid: the trainer's learning rate times these factors (a log grid, half a decade apart).
LR_FACTORS = (0.1, 10 ** -0.5, 1.0, 10 ** 0.5, 10.0)


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _factor(value) -> float | None:
    """``"x0.316"`` -> 0.316: a learning rate given relative to each trainer's own (its recipe's); None for a
    plain value."""
    if not (isinstance(value, str) and value[:1] in "xX" and len(value) > 1):
        return None
    try:
        factor = float(value[1:])
    except ValueError:
        return None
    return factor if math.isfinite(factor) and factor > 0 else None


def parse_grid(items: list[str], trainers: list[str]) -> dict[str, list]:
    """``["lr=1e-3,1e-2", "foton.temperature=1,4"]`` -> ``{"lr": [...], "foton.temperature": [...]}``.

    Learning rates may be factors of each trainer's own, ``lr=x0.316,x1,x3.16`` (``trainer_grid`` multiplies
    them), so one grid serves trainers whose recipes differ by decades.

    Keys are ``TrainConfig`` fields or ``<trainer>.<option>`` of a trainer of the comparison, and every
    value must be one the option accepts, each once; anything else is a one-line ``ConfigError``, raised
    before any trial runs.
    """
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"seed", "device", "dtype", "progress"}
    grid = {}
    for item in items:
        key, sep, text = item.partition("=")
        values = [_value(v.strip()) for v in text.split(",") if v.strip()]
        if not sep or not values:
            raise ConfigError(f"--tune-grid expects KEY=V1,V2,..., got {item!r}")
        if any(not v.strip() for v in text.split(",")):
            raise ConfigError(f"--tune-grid {key} has an empty item (a trailing or doubled comma): {text!r}")
        if key in grid:
            raise ConfigError(f"--tune-grid {key} is given twice ({','.join(map(str, grid[key]))} and {text}): "
                              f"give its values once, as one list")
        trainer, dot, option = key.partition(".")
        if dot:
            if trainer not in trainers:
                raise ConfigError(f"--tune-grid {key}: '{trainer}' is not one of the trainers compared "
                                  f"({', '.join(trainers)})")
            options = {f.name for f in dataclasses.fields(engine_class(trainer).Options)}
            if option not in options:
                raise ConfigError(f"--tune-grid {key}: trainer '{trainer}' has no option '{option}'; "
                                  f"its options: {', '.join(sorted(options)) or 'none'}")
        elif key not in fields:
            raise ConfigError(f"--tune-grid {key}: not a training option; tunable: {', '.join(sorted(fields))}")
        factors = [_factor(v) for v in values] if key == "lr" else []
        if any(f is not None for f in factors):
            if None in factors:
                raise ConfigError(f"--tune-grid lr={text}: give every value as a factor of the trainer's own "
                                  f"learning rate (x0.316,x1,x3.16: positive numbers after x) or every value as a "
                                  f"learning rate, not both")
            values = [f"x{f:g}" for f in factors]
        for value in values:  # every value checked before any trial trains (a bad one would stop the search late)
            if isinstance(value, str) and _factor(value) is not None:
                continue
            try:
                if dot:
                    build_engine(trainer, **{option: value})
                else:
                    parse_options(TrainConfig, {key: value})
            except ConfigError as err:
                raise ConfigError(f"--tune-grid {key}: value {value!r} is refused: {err}") from None
        if len(set(values)) < len(values):
            raise ConfigError(f"--tune-grid {key} lists a value twice ({text}): two identical trials would share "
                              f"one folder")
        grid[key] = values
    return grid


def trainer_grid(grid: dict[str, list], trainer: str, lr: float) -> dict[str, list]:
    """The dimensions that apply to ``trainer``: the shared keys and its own options; the
    learning-rate log grid around ``lr`` unless ``lr`` is given."""
    own = {k: v for k, v in grid.items() if "." not in k or k.startswith(f"{trainer}.")}
    if "lr" not in own:
        own = {"lr": [float(f"{lr * f:.3g}") for f in LR_FACTORS], **own}
    elif _factor(own["lr"][0]) is not None:
        own = {**own, "lr": [float(f"{lr * _factor(v):.3g}") for v in own["lr"]]}
    return own


def trial_name(values: dict) -> str:
    """A folder name for one grid point: ``lr=0.001,temperature=4``."""
    return ",".join(f"{k.split('.', 1)[-1]}={v:g}" if isinstance(v, float) else f"{k.split('.', 1)[-1]}={v}"
                    for k, v in values.items())


def grid_edges(grid: dict[str, list], best: dict) -> dict[str, str]:
    """The dimensions of three or more numbers whose selected value is the largest ("top") or the smallest
    ("bottom"): the best point may lie beyond the grid there."""
    edges = {}
    for key, values in grid.items():
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(values) >= 3 and len(numbers) == len(values) and best.get(key) in (max(numbers), min(numbers)):
            edges[key] = "top" if best[key] == max(numbers) else "bottom"
    return edges


def tuning_caveats(record: dict) -> str:
    """What a tuning's one-line report adds to its choice: the trials that stopped and why, and a selected value
    on the edge of its grid with the direction to extend it ('' where there is neither)."""
    parts = []
    if record.get("stopped"):
        parts.append(f"{len(record['stopped'])} stopped: " + ", ".join(f"{name} ({why})" for name, why in
                                                                       record["stopped"].items()))
    for key, edge in record.get("edges", {}).items():
        value = record["best" if "best" in record else "values"][key]
        parts.append(f"{key.split('.', 1)[-1]}={value:g} is the {edge} of its grid: the best may lie "
                     f"{'above' if edge == 'top' else 'below'}, extend --tune-grid {key}=... "
                     f"{'upward' if edge == 'top' else 'downward'}")
    return "; ".join(parts)


def select(trials: list[dict], metric: str) -> dict:
    """The trial with the best validation metric (lowest perplexity, highest otherwise); ties: the
    first; diverged trials (``best_val`` None) never."""
    finished = [t for t in trials if t["best_val"] is not None]
    if not finished:
        raise ConfigError(f"every tuning trial of {trials[0]['trainer']} diverged; give a lower --tune-grid lr=...")
    sign = 1 if metric == "perplexity" else -1
    return min(finished, key=lambda t: sign * t["best_val"][metric])


def tune_trainer(build, trainer: str, grid: dict[str, list], seed: int, *, logdir, experiment: str,
                 epochs=None, steps=None, resume=False) -> dict:
    """Train one trial per point of ``grid`` (trainer's dimensions) on ``seed``; select on validation.

    ``build(trainer, seed, overrides) -> trainers.cli.Setup``. Returns (and writes to
    ``<logdir>/<experiment>/tuning/<trainer>/tuning.json``) ``{"grid", "seed", "metric",
    "trials": [{"values", "best_val", "best_step"}], "best": values, "best_val": its metrics}``.
    """
    points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    trials = []
    for values in points:
        setup = build(trainer, seed, values)
        run = Trainer(setup.model, setup.engine, setup.task, config=setup.config, logdir=logdir,
                      experiment=f"{experiment}/tuning", run_name=f"{trainer}/{trial_name(values)}", overwrite=True,
                      meta=setup.meta, settings={**setup.settings, "trial": values}, evaluate_test=False)
        trial = {"trainer": trainer, "values": values, "best_val": None, "best_step": None}
        try:
            report = run.fit(epochs=epochs, steps=steps, resume="auto" if resume else False)  # trials not begun start
            trial.update(best_val=report["best_val"], best_step=report["best_step"])
        except NonFiniteLossError as err:  # a diverged trial is a result, not the end of the search
            trial["diverged"] = str(err)
            if DataParallel().is_main:  # said when it happens, not only in tuning.json
                note(f"tuning {trainer}: trial {trial_name(values)} stopped: {str(err).split(';')[0]}")
        trials.append(trial)
    metric = setup.task.metric_name
    selected = select(trials, metric)
    record = {"trainer": trainer, "grid": grid, "budget": len(points), "seed": seed, "metric": metric,
              "trials": trials, "best": selected["values"], "best_val": selected["best_val"],
              "stopped": {trial_name(t["values"]): t["diverged"].split(";")[0] for t in trials if "diverged" in t},
              "edges": grid_edges(grid, selected["values"])}
    if logdir is not None and DataParallel().is_main:
        write_text_atomic(Path(logdir) / experiment / "tuning" / trainer / "tuning.json",
                          json.dumps(record, indent=2, default=str) + "\n")
    return record
