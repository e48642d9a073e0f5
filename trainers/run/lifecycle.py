"""What happens around the Trainer's loop: a run is opened (its directory locked, a checkpoint
found and checked), restored or seeded, its logger started; a failure during training becomes one
line that says what was kept; a finished run writes its test record, HParams session and
``result.json``. Functions of a ``trainers.run.trainer.Trainer``; rank 0 writes.
"""

import json
from pathlib import Path

from gradengines.models.errors import one_line
from gradengines.tasks.errors import TaskConfigError
from gradengines.trainers.core.errors import (
    USER_ERRORS,
    ConfigError,
    DistributedError,
    ModelRunError,
    NonFiniteLossError,
    RunInterrupted,
    RunOutOfMemory,
    RunWriteError,
    interruption,
    out_of_memory,
    spell,
)
from gradengines.trainers.core.options import as_dict
from gradengines.trainers.core.rng import seed_everything, set_rng_state
from gradengines.trainers.core.threads import last_choice
from gradengines.trainers.run.checkpoint import write_text_atomic
from gradengines.trainers.run.hparams import session_hparams, session_metrics
from gradengines.trainers.run.logger import RunLogger, read_metrics
from gradengines.trainers.run.optim import restore_optimizer
from gradengines.trainers.run.rundir import note

# errors the framework raises with their own one-line message (never rewritten as a user model's failure)
NAMED_ERRORS = (*USER_ERRORS, NonFiniteLossError, DistributedError, RunWriteError, RunOutOfMemory, OSError)

__all__ = ["open_run", "start", "open_logger", "run_failure", "write_failure", "last_checkpoint", "kept",
           "write_result"]


def open_run(trainer, resume: bool | str, total: int, allow_changes):
    """Rank 0: ``RunDirectory.open``'s verdict, or the error that stops the run before it starts."""
    if trainer.files is None:
        return "fresh", None
    try:
        return trainer.files.open(resume=resume, overwrite=trainer.overwrite, total=total,
                                  identity=trainer.identity(), config=as_dict(trainer.cfg),
                                  allow_changes=allow_changes,
                                  shapes={k: tuple(v.shape) for k, v in trainer.model.state_dict().items()})
    except (*USER_ERRORS, OSError) as err:
        return err


def _restore(trainer, state: dict, changes: list[dict]) -> None:
    """Load a checkpoint that ``check_resume`` accepted; this run's options (``changes``) win."""
    world = state.get("world_size", 1)
    batch = state.get("global_batch", state["config"]["batch_size"] * world)
    if batch != trainer.global_batch:
        ranks = trainer.parallel.world_size
        raise ConfigError(
            f"checkpoint was trained with a global batch of {batch} ({batch // world} per rank x {world} "
            f"rank(s)); this run's is {trainer.global_batch} ({trainer.cfg.batch_size} x {ranks}): "
            f"pass --batch-size {batch // ranks} to continue it"
            + ("" if batch % ranks == 0 else " on a number of ranks that divides it"))
    trainer.model.load_state_dict(state["model"])
    restore_optimizer(trainer.optimizer, trainer.scheduler, state["optimizer"], state["scheduler"])
    if trainer.update.scaler is not None and state.get("scaler"):  # 16-mixed: the loss scale where it was
        trainer.update.scaler.load_state_dict(state["scaler"])
    trainer.engine.load_state_dict(state["engine"])
    set_rng_state(state["rng"])
    trainer.step, trainer.best, trainer.saved_step = state["step"], state["best"], state["step"]
    trainer.changes = list(state.get("changes", [])) + changes
    if trainer.stream is not None:  # the stream's position (a sampler state) where the checkpoint left it
        said = trainer.stream.restore(state["data"])
        if said is not None and trainer.parallel.is_main:
            note(said)


def start(trainer, resumed) -> None:
    """Restore ``resumed`` ((checkpoint, changes)) or seed a fresh run; then one replica on every rank."""
    if resumed is not None:
        _restore(trainer, *resumed)
        for change in resumed[1]:
            note(f"resuming at step {change['step']} with {change['option']} {change['to']} instead of "
                 f"{change['from']} (recorded in result.json)")
    else:
        seed_everything(trainer.cfg.seed)
        if trainer.stream is not None:
            trainer.stream.restart()
    trainer.parallel.broadcast_module(trainer.model)  # one replica, whatever each rank initialised


def open_logger(trainer, resuming: bool, total: int) -> RunLogger | None:
    """Rank 0 of a run with a directory: its logger (a resumed one drops what comes after its step, then says
    where the run continues from: only once its records were read, so a resume refused there claims nothing)."""
    run_dir = trainer.run_dir if trainer.parallel.is_main else None
    if run_dir is None:
        return None
    cfg = trainer.cfg
    try:
        logger = RunLogger(run_dir, resume_step=trainer.step if resuming else None, axis=cfg.log_axis,
                           purge_after=trainer.samples_seen(trainer.step) if cfg.log_axis == "samples" else None)
        if resuming:  # only once its records were read: a damaged one stops here
            for stale in ("result.json", "failed.json"):  # records of the shorter run this one continues
                (run_dir / stale).unlink(missing_ok=True)
    except OSError as err:
        raise RunWriteError(write_failure(trainer, err)) from None
    if resuming:
        note(f"{trainer.run_name} seed {trainer.cfg.seed}: resuming from step {trainer.step} of {total} in {run_dir}")
    return logger


def last_checkpoint(trainer) -> Path | None:
    """The newest checkpoint this run wrote or resumed from (None: there is none)."""
    return trainer.files.newest if trainer.files is not None and trainer.saved_step is not None else None


def kept(trainer) -> str:
    last = last_checkpoint(trainer)
    if last is None:
        return "no checkpoint was written"
    return f"the last checkpoint (step {trainer.saved_step}) is kept at {last}"


def _every_seconds(trainer) -> str:
    seconds = trainer.cfg.checkpoint_seconds
    return "" if seconds is None else f" and every {seconds:g} s"


def write_failure(trainer, err: OSError) -> str:
    """One line: which path failed, why, at which step, and what the run directory keeps."""
    where = err.filename or trainer.run_dir
    return f"cannot write {where}: {err.strerror or err}; training stopped at step {trainer.step}, {kept(trainer)}"


def run_failure(trainer, err: BaseException, logger: RunLogger | None, *, evaluating: bool = False) -> BaseException:
    """The error a failure during training is reported as (``err`` itself where it already says it all):
    disk full, out of memory, Ctrl-C, SIGTERM, a user's model, the data (a streamed item), a non-finite loss
    (recorded in failed.json), a lost rank."""
    if isinstance(err, OSError):
        return RunWriteError(write_failure(trainer, err))
    if out_of_memory(err):
        return RunOutOfMemory(f"{out_of_memory(err)} at step {trainer.step}, {kept(trainer)}; lower "
                              f"{spell('batch_size')} or the model's size")
    if isinstance(err, KeyboardInterrupt) and not isinstance(err, RunInterrupted):
        at = f"at step {trainer.step}" + (", in the end-of-run evaluation" if evaluating else "")
        if last_checkpoint(trainer) is None:  # a resume would start afresh: say so rather than promise more
            return interruption(err, f"{at}, before the run's first checkpoint (written at evaluations"
                                     f"{_every_seconds(trainer)}): nothing to continue, a rerun starts it afresh")
        again = "evaluates it again and writes the results" if evaluating else "continues the run"
        return interruption(err, f"{at}, {kept(trainer)}; {spell('resume')} {again}")
    if isinstance(err, TaskConfigError):  # the data, met mid-run (a stream's item): and what was kept
        return TaskConfigError(f"{err}; {kept(trainer)}")
    if trainer.user_model and isinstance(err, Exception) and not isinstance(err, NAMED_ERRORS):
        return ModelRunError(f"model '{trainer.meta.get('name')}' failed at step {trainer.step}: {one_line(err)}; "
                             f"{kept(trainer)}")
    if isinstance(err, NonFiniteLossError) and logger and trainer.files:  # rank 0, still holding the lock
        trainer.files.record_failure({"run": trainer.run_name, "trainer": trainer.engine.name,
                                      "seed": trainer.cfg.seed, "step": trainer.step, "error": str(err)})
    if isinstance(err, DistributedError) and last_checkpoint(trainer) is not None:
        return DistributedError(f"{err}; the last checkpoint is {last_checkpoint(trainer)}")
    return err


def write_result(trainer, report: dict, logger: RunLogger | None) -> None:
    """Rank 0 of a run with a directory: the test record, the HParams session and ``result.json``."""
    if logger is None or trainer.run_dir is None:
        return
    where = trainer.where(trainer.step)
    if report["test"] is not None:
        logger.log(trainer.step, {f"test/{k}": v for k, v in report["test"].items()}, **where)
    logger.flush()
    cfg = trainer.cfg
    record = {**report, "run": trainer.run_name, "trainer": trainer.engine.name, "task": trainer.task.name,
              "metric": trainer.task.metric_name, "engine": trainer.engine.hparams(), "config": as_dict(cfg),
              "world_size": trainer.parallel.world_size, "global_batch": trainer.global_batch,
              "model": trainer.meta, "settings": trainer.settings, "resume_changes": trainer.changes,
              "samples": where["samples"], "epochs": where["epoch"], "log_axis": cfg.log_axis,
              "threads": last_choice()._asdict()}
    if trainer.timing is not None:
        record["timing"] = {**trainer.timing, "compute_ms": where["compute_ms"]}
    if trainer.test_outcomes is not None:  # each test example's share of the metric: paired verdicts read them
        record["test_outcomes"] = trainer.test_outcomes
    # the HParams session: hparam values and summary numbers (also kept in result.json)
    record["summary"] = session_metrics(report, trainer.task.metric_name, read_metrics(trainer.run_dir),
                                        timed_step_ms=None if trainer.timing is None else trainer.timing["step_ms"])
    logger.log_hparams(where["samples"] if cfg.log_axis == "samples" else trainer.step,
                       session_hparams(record), record["summary"])
    logger.close()
    write_text_atomic(trainer.run_dir / "result.json", json.dumps(record, indent=2, default=str) + "\n")
