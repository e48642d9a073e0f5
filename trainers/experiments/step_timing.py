"""A comparison's step times and memory, measured so that a busy machine cannot fake them (issue 21).

Each trainer's whole training step (``compute_grads``, clipping, optimizer step, schedule,
orthogonality upkeep: ``Trainer``'s own step) on the experiment's own model, batch shape and
settings (its seed's setup, built afresh), timed round-robin with ``trainers.bench.time_round_robin``:
every round one step of each trainer, the ratio to the reference trainer the median over rounds
of the ratio within a round, with its min..max spread. A burst of load lands on every trainer of
the rounds it covers alike, so the ratio survives it where each run's own clock does not. A
trainer's timed step is then ``ratio x`` the reference's median step; a run's compute time is its
steps x its timed step (``Trainer(timing=...)``). Peak memory: one step, as in ``bench.py``.
"""

from __future__ import annotations

import functools
import time

from trainers.bench import machine_description, peak_step_memory_mb, time_round_robin
from trainers.core.errors import NonFiniteLossError
from trainers.core.threads import last_choice
from trainers.experiments.stats import median_interval
from trainers.run.progress import Progress
from trainers.run.trainer import Trainer

__all__ = ["time_steps", "ROUNDS", "WARMUP"]

ROUNDS = 30
WARMUP = 5


def _timed_step(trainer: Trainer, x, y) -> None:
    """One training step; a loss that is not finite still counts (its time up to the check): a trainer that
    diverges is timed, and recorded as failed by its training run, not by the timing."""
    try:
        trainer.train_step(x, y)
    except NonFiniteLossError:
        pass


def time_steps(setups: dict, reference: str, *, rounds: int = ROUNDS, warmup: int = WARMUP,
               clock=time.perf_counter, progress: bool = False, every: float = 10.0) -> dict:
    """Time the training step of each ``setups[trainer]`` (a fresh ``trainers.cli.Setup``) round-robin against
    ``setups[reference]`` (``progress``: lines on stderr as training's, every ``every`` seconds).
    Returns ``{"reference", "rounds", "warmup", "machine", "threads", "trainers":
    {name: {"step_ms", "ratio", "ratio_min", "ratio_max", "ratio_low", "ratio_high", "ms_min", "ms_max",
    "batch_size", "peak_mb"}}}``; ratio_low..ratio_high: the 95% interval of the median ratio over rounds
    where ``step_ms`` = ratio x the reference's median step (the reference's: its median)."""
    names = [reference] + [t for t in setups if t != reference]
    steps, batches, device = {}, {}, None
    for name in names:
        setup = setups[name]
        trainer = Trainer(setup.model, setup.engine, setup.task, config=setup.config, progress=False)
        x, y = trainer._batch(0)
        batches[name] = int(len(y))
        steps[name] = functools.partial(_timed_step, trainer, x, y)
        device = trainer.device
    shown = Progress(f"timing {len(names)} trainers' steps round-robin", rounds, every=every, enabled=progress,
                     unit="round")
    try:
        timed = time_round_robin(steps, timed=rounds, rounds=rounds, warmup=warmup, device=device, clock=clock,
                                 on_round=shown.update)
    finally:
        shown.close()
    base_ms = timed[reference]["step_ms"]
    out = {}
    for name in names:
        t = timed[name]
        out[name] = {"step_ms": base_ms * t["ratio_to_baseline"] if name != reference else base_ms,
                     "ratio": t["ratio_to_baseline"], "ratio_min": t["ratio_min"], "ratio_max": t["ratio_max"],
                     **dict(zip(("ratio_low", "ratio_high"), median_interval(t["ratios"]), strict=True)),
                     "ms_min": t["ms_min"], "ms_max": t["ms_max"], "batch_size": batches[name],
                     "peak_mb": peak_step_memory_mb(steps[name], device)}
    threads = last_choice()
    return {"reference": reference, "rounds": rounds, "warmup": warmup, "machine": machine_description(device),
            "threads": {"count": threads.count, "reason": threads.reason}, "trainers": out}

