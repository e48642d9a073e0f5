"""Train several engines on the same model, task and seeds; summarize.

Writes the TensorBoard runs ``<logdir>/<experiment>/<trainer>/seed<k>/``,
then ``summary.md`` (a Markdown table, mean +- std over seeds) and
``comparison.png`` beside them.
"""

import json
import sys
import time
from pathlib import Path

from gradengines.trainers.core.distributed import DataParallel
from gradengines.trainers.core.errors import (
    ConfigError,
    IncompatibleModelError,
    NonFiniteLossError,
    spell,
    stage,
)
from gradengines.trainers.core.registry import engine_class
from gradengines.trainers.experiments.budget import BUDGETS, budget_steps, reference_trainer
from gradengines.trainers.experiments.plots import plot_comparison
from gradengines.trainers.experiments.results import experiment_runs
from gradengines.trainers.experiments.step_timing import ROUNDS, other_threads, time_steps
from gradengines.trainers.experiments.summary import model_text, write_summary
from gradengines.trainers.run.checkpoint import write_text_atomic
from gradengines.trainers.run.hparams import write_experiment_config
from gradengines.trainers.run.rundir import RESULT, RunDirectory, holds_any_run, nothing_to_resume, run_path
from gradengines.trainers.run.trainer import Trainer, steps_per_epoch

__all__ = ["run_comparison", "refuse_taken", "compatible", "check_resumable", "check_target"]


def refuse_taken(logdir, experiment: str, runs: list[str], seeds: list[int]) -> None:
    """Refuse (one line naming every way on) a comparison whose run folders already hold a run: called before
    anything trains, also before ``--tune``'s trials."""
    for run in runs:
        for seed in seeds:
            path = run_path(logdir, experiment, run, seed)
            if RunDirectory(path).holds_run():
                raise ConfigError(f"{path} already holds a run; {spell('resume')} continues the comparison, "
                                  f"another {spell('experiment')} (or {spell('run_name')}, with one trainer) starts "
                                  f"a new one beside it, {spell('overwrite')} replaces its runs")


def run_comparison(build, trainers: list[str], seeds: list[int], *, logdir, experiment: str,
                   epochs=None, steps=None, resume=False, overwrite=False, run_name=None, allow_changes=(),
                   budget: str = "samples", reference: str | None = None, target: float | None = None,
                   timing_rounds: int = ROUNDS, clock=time.perf_counter) -> dict:
    """Time every trainer's step, run every (trainer, seed) for its budget, then write the summary,
    ``comparison.json`` and the figure of the whole experiment folder (runs added by earlier calls included).

    Timing (``trainers.experiments.step_timing``): each trainer's step on its first seed's setup, round-robin
    against ``reference`` (backprop if compared, else the first trainer), ``timing_rounds`` rounds, on a CPU
    again at the other end of its thread range (``other_threads``; the equal-compute margin)
    (``clock``: the timer, tests pass a fake one); a ``resume`` reuses the timing of ``comparison.json``
    when it covers the same trainers, so the budget stays the same. With progress on (the setups' config), it
    says first what it will do, then shows the timing's rounds as training shows its steps.
    ``budget`` (``trainers.experiments.budget``): samples (default; with ``epochs`` every trainer runs them), steps
    or time, relative to the reference's ``epochs`` or ``steps``. ``target``: the validation metric
    of the time-to-target table (default: ``trainers.experiments.verdict.default_target``).

    ``comparison.json`` is written once the timing is done and after every run, so that a comparison stopped
    in any phase resumes with the same budget; a resume also keeps its start time and adds up its wall time.
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
    check_target(target, next(iter(setups.values())).task.metric_name)
    out_dir = Path(logdir) / experiment
    if resume is True:
        check_resumable(logdir, experiment)
    if not (resume or overwrite):  # nothing finished is replaced, and the refusal comes before any training
        refuse_taken(logdir, experiment, [t if run_name is None else run_name for t in trainers], seeds)
    here = DataParallel()
    first = setups[(ref, seeds[0])].config
    speak = first.progress and here.is_main
    threads_too = other_threads(first.device)
    if speak:
        again = f", then again at {threads_too} thread{'s' if threads_too > 1 else ''}" if threads_too else ""
        _say(f"[compare] {experiment}: {len(trainers)} trainers ({', '.join(trainers)}) x seeds "
            f"{', '.join(map(str, seeds))}: timing each trainer's step round-robin ({timing_rounds} rounds{again}"
            f"{', or reusing the timing of ' + COMPARISON_FILE if resume else ''}), then {len(setups)} runs, then "
            f"the summary")
    # rank 0 decides whether a resume reuses its record; every rank times (in lockstep), rank 0's numbers count
    previous = here.broadcast_object(_previous_record(out_dir, trainers, ref) if resume and here.is_main else None,
                                     "sharing rank 0's step timing")
    with stage("while timing the trainers' steps, before any run: nothing was trained; the same command starts "
               "the comparison again"):
        timing = previous["timing"] if previous else here.broadcast_object(
            time_steps({t: build(t, seeds[0]) for t in trainers}, ref, rounds=timing_rounds, clock=clock,
                       progress=speak, every=first.progress_seconds, threads_too=threads_too),
            "sharing rank 0's step timing")
    lengths = _run_lengths(budget, ref, {t: setups[(t, seeds[0])] for t in trainers}, epochs, steps, timing)
    # comparison.json from here on, so that an interrupted comparison resumes with the same timing and budget
    record = {"reference": ref, "budget": budget, "target": target, "seeds": seeds, "lengths": lengths,
              "started": previous["started"] if previous else time.strftime("%Y-%m-%d %H:%M:%S %Z",
                                                                             time.localtime(started)),
              "sessions": previous["sessions"] + 1 if previous else 1, "timing": timing}
    earlier_s = previous["wall_s"] if previous else 0.0

    def write_record():
        if here.is_main:
            record["wall_s"] = earlier_s + time.perf_counter() - wall
            write_text_atomic(out_dir / COMPARISON_FILE, json.dumps(record, indent=2) + "\n")

    write_record()
    failures: list[dict] = []
    trainer_objs: dict = {}

    def kept() -> str:  # counted from the files at the interruption: a run may have finished in an earlier session
        done = [f"{name} seed {seed}" for (name, seed), t in trainer_objs.items()
                if t.run_dir is not None and (t.run_dir / RESULT).exists()]
        return (f"{len(done)} of {len(setups)} runs finished and kept in {out_dir}"
                f"{' (' + ', '.join(done) + ')' if 0 < len(done) <= 6 else ''}; the step timing kept in "
                f"{COMPARISON_FILE}; {spell('resume')} continues the comparison")

    with stage(lambda: f"while building the runs, after the step timing: {kept()}"):
        trainer_objs.update({key: Trainer(s.model, s.engine, s.task, config=s.config, logdir=logdir,
                                          experiment=experiment, run_name=key[0] if run_name is None else run_name,
                                          overwrite=overwrite, meta=s.meta, settings=s.settings,
                                          timing=timing["trainers"][key[0]])
                             for key, s in setups.items()})
    with stage(lambda: f"between the comparison's runs: {kept()}"):  # a run's own interruption says its step
        for (name, seed), trainer in trainer_objs.items():
            failure = _run_or_record(trainer, name, seed, resume="auto" if resume else False,
                                     allow_changes=allow_changes, **lengths[name])
            failures += [failure] if failure else []
            write_record()
    task = next(iter(setups.values())).task
    if not here.is_main:  # under torchrun, rank 0 writes the summary
        return {"results": {}, "table": "", "dir": out_dir, "failures": failures}
    with stage(f"while writing the summary and the figure, after every run finished (each kept in {out_dir}); "
               f"{spell('resume')} continues the comparison"):
        results = experiment_runs(out_dir)
        table = write_summary(out_dir, experiment, task, results, record)
        write_experiment_config(out_dir)
        title = f"{experiment}: task {task.name}, model {model_text(results)}"
        plot_comparison({run: [r["history"] for r in seeds] for run, seeds in results.items()}, task.metric_name,
                        out_dir / "comparison.png", title=title)
    return {"results": results, "table": table, "dir": out_dir, "failures": failures, "comparison": record}


def check_target(target: float | None, metric: str) -> None:
    """The time-to-target table's ``target`` is a value the validation ``metric`` can take."""
    if target is not None and not (0 < target <= 1 if metric == "accuracy" else target >= 1):
        raise ConfigError(f"{spell('target')} is a validation {metric}, "
                          f"{'in (0, 1]' if metric == 'accuracy' else 'at least 1'}; got {target}")


def check_resumable(logdir, experiment: str) -> None:
    """A comparison resumed (``resume=True``) must have begun: a run, a tuning trial or its step timing
    (``comparison.json``) in its folder; then each of its runs resumes where it is and starts where it is not."""
    out_dir = Path(logdir) / experiment
    if not ((out_dir / COMPARISON_FILE).is_file() or holds_any_run(out_dir)):
        raise ConfigError(nothing_to_resume(out_dir))


def _say(line: str) -> None:
    """A line of what the comparison does next, on stderr beside the runs' progress lines."""
    print(line, file=sys.stderr, flush=True)


def _previous_record(out_dir: Path, trainers: list[str], reference: str) -> dict | None:
    """The experiment's ``comparison.json`` if its timing covers these trainers and reference (a resume keeps
    its budget, start time and wall time), else None."""
    try:
        record = json.loads((out_dir / COMPARISON_FILE).read_text())
        timing = record["timing"]
        if timing["reference"] == reference and set(trainers) <= set(timing["trainers"]):
            return {"timing": timing, "started": str(record["started"]), "wall_s": float(record["wall_s"]),
                    "sessions": int(record.get("sessions", 1))}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none, or a damaged record: time again
    return None


def _run_lengths(budget: str, reference: str, setups: dict, epochs, steps, timing: dict) -> dict[str, dict]:
    """``Trainer.fit`` arguments per trainer for ``budget``: ``{"epochs": E}`` (equal samples by epochs) or
    ``{"steps": n}``."""
    if budget == "samples" and steps is None:
        return {t: {"epochs": epochs} for t in setups}
    batches = {t: s.config.batch_size * DataParallel().world_size for t, s in setups.items()}
    reference_steps = steps if steps is not None else \
        epochs * steps_per_epoch(setups[reference].task, batches[reference])
    ratios = {t: timing["trainers"][t]["ratio"] for t in setups}
    return {t: {"steps": n} for t, n in budget_steps(budget, reference, reference_steps, batches, ratios).items()}


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
