"""A comparison's step times and memory, measured so that a busy machine cannot fake them (issue 21).

Each trainer's whole training step (``compute_grads``, clipping, optimizer step, schedule,
orthogonality upkeep: ``Trainer``'s own step) on the experiment's own model, batch shape and
settings (its seed's setup, built afresh), timed round-robin with ``trainers.bench.time_round_robin``:
every round one step of each trainer, the ratio to the reference trainer the median over rounds
of the ratio within a round, with its min..max spread. A burst of load lands on every trainer of
the rounds it covers alike, so the ratio survives it where each run's own clock does not. A
trainer's timed step is then ``ratio x`` the reference's median step; a run's compute time is its
steps x its timed step (``Trainer(timing=...)``). Peak memory: one step, as in ``bench.py``.

On a CPU the ratios depend on the thread count (a batch-256 step gains more from a second thread than a
batch-64 one: FOTON's ratio to backprop on the default comparison was 1.25 at 1 thread and 0.93 at 2, each
interval clear of the other). So the rounds run again at the other end of the machine's range
(``other_threads``: 1 thread when the runs use more, else as many as ``auto`` gives this machine now),
recorded beside the runs' own; a word at equal compute time must hold under both (``summary``).
"""

from __future__ import annotations

import functools
import time

import torch

from gradengines.trainers.bench import machine_description, peak_step_memory_mb, time_round_robin
from gradengines.trainers.core.errors import NonFiniteLossError
from gradengines.trainers.core.threads import auto_choice, last_choice
from gradengines.trainers.experiments.stats import median_interval
from gradengines.trainers.run.progress import Progress
from gradengines.trainers.run.trainer import Trainer

__all__ = ["time_steps", "other_threads", "ROUNDS", "WARMUP"]

ROUNDS = 30
WARMUP = 5


def _timed_step(trainer: Trainer, x, y) -> None:
    """One training step; a loss that is not finite still counts (its time up to the check): a trainer that
    diverges is timed, and recorded as failed by its training run, not by the timing."""
    try:
        trainer.train_step(x, y)
    except NonFiniteLossError:
        pass


def other_threads(device: str) -> int | None:
    """The thread count the timing repeats at (module docstring); None on an accelerator or where it is the
    runs' own."""
    if torch.device(device).type != "cpu":
        return None
    here = torch.get_num_threads()
    other = 1 if here > 1 else auto_choice().count
    return other if other != here else None


def _rounds(steps: dict, rounds: int, warmup: int, device, clock, label: str, progress: bool, every: float) -> dict:
    shown = Progress(label, rounds, every=every, enabled=progress, unit="round")
    try:
        return time_round_robin(steps, timed=rounds, rounds=rounds, warmup=warmup, device=device, clock=clock,
                                on_round=shown.update)
    finally:
        shown.close()


def _ratios(t: dict) -> dict:
    return {"ratio": t["ratio_to_baseline"], "ratio_min": t["ratio_min"], "ratio_max": t["ratio_max"],
            **dict(zip(("ratio_low", "ratio_high"), median_interval(t["ratios"]), strict=True))}


def time_steps(setups: dict, reference: str, *, rounds: int = ROUNDS, warmup: int = WARMUP,
               clock=time.perf_counter, progress: bool = False, every: float = 10.0,
               threads_too: int | None = None) -> dict:
    """Time the training step of each ``setups[trainer]`` (a fresh ``trainers.cli.Setup``) round-robin against
    ``setups[reference]`` (``progress``: lines on stderr as training's, every ``every`` seconds); then again at
    ``threads_too`` threads if given (``other_threads``), the process's own count restored after.
    Returns ``{"reference", "rounds", "warmup", "machine", "threads", "trainers":
    {name: {"step_ms", "ratio", "ratio_min", "ratio_max", "ratio_low", "ratio_high", "ms_min", "ms_max",
    "batch_size", "peak_mb", and with ``threads_too`` "at_other_threads": {"threads", "ratio", "ratio_min",
    "ratio_max", "ratio_low", "ratio_high"}}}}``; ratio_low..ratio_high: the 95% interval of the median ratio
    over rounds where ``step_ms`` = ratio x the reference's median step (the reference's: its median)."""
    names = [reference] + [t for t in setups if t != reference]
    steps, batches, device = {}, {}, None
    for name in names:
        setup = setups[name]
        trainer = Trainer(setup.model, setup.engine, setup.task, config=setup.config, progress=False)
        x, y = trainer._batch(0)
        batches[name] = int(len(y))
        steps[name] = functools.partial(_timed_step, trainer, x, y)
        device = trainer.device
    timed = _rounds(steps, rounds, warmup, device, clock, f"timing {len(names)} trainers' steps round-robin",
                    progress, every)
    again = None
    if threads_too is not None:
        own = torch.get_num_threads()
        torch.set_num_threads(threads_too)
        try:
            again = _rounds(steps, rounds, warmup, device, clock, f"timing them again at {threads_too} thread"
                            f"{'s' if threads_too > 1 else ''} (the equal-compute margin)", progress, every)
        finally:
            torch.set_num_threads(own)
    base_ms = timed[reference]["step_ms"]
    out = {}
    for name in names:
        t = timed[name]
        out[name] = {"step_ms": base_ms * t["ratio_to_baseline"] if name != reference else base_ms,
                     **_ratios(t), "ms_min": t["ms_min"], "ms_max": t["ms_max"], "batch_size": batches[name],
                     "peak_mb": peak_step_memory_mb(steps[name], device)}
        if again is not None:
            out[name]["at_other_threads"] = {"threads": threads_too, **_ratios(again[name])}
    threads = last_choice()
    return {"reference": reference, "rounds": rounds, "warmup": warmup, "machine": machine_description(device),
            "threads": {"count": threads.count, "reason": threads.reason}, "trainers": out}

