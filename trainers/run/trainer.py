"""The Trainer: one loop for every gradient engine.

    open the run                 (trainers.run.lifecycle: lock, resume checks, restore or seed, logger)
    for each step:
        agreement                every N steps, compare the engine with exact backprop
        update                   trainers.run.step.TrainStep: engine.compute_grads (where loss.backward()
                                 stands), clip, optimizer and scheduler, orthogonality upkeep
        log / evaluate / checkpoint   (at every evaluation, every checkpoint_every steps, and once
                                 checkpoint_seconds passed since the last: an interrupt loses at most that)
    final evaluations, result    (a failure: one line saying what was kept, lifecycle.run_failure)

Data order is a function of (seed, epoch) alone (a stream's position, ``tasks.stream``, is in the
checkpoint), and every random generator is checkpointed, so a resumed run reproduces the uninterrupted
one exactly.
Model selection uses the validation split (with ``eval_batches``, a fixed
subset of it at the periodic evaluations); at the end the last and the best
validation models are evaluated on the whole validation split, and the test
split once, on the best validation model. Progress goes to stderr
(``trainers.run.progress``): a bar on a terminal, otherwise a line every
``progress_seconds``.

Under ``torchrun`` (a process group exists) the same loop is data parallel
(``trainers.core.distributed``): each rank takes its shard of the global batch
(``batch_size`` x world size), the gradients are averaged over ranks right
after ``compute_grads``, evaluation sums are reduced over ranks, and only
rank 0 writes logs, metrics and checkpoints. A checkpoint records the global
batch, so a run continues with any number of ranks that keeps it.
"""

import copy
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradengines.models.adapters.calling import call_model, model_call
from gradengines.models.adapters.user import is_reference
from gradengines.models.errors import ModelConfigError
from gradengines.models.orthogonal.retraction import CayleyRetraction
from gradengines.tasks.base import IGNORE_INDEX, Task, label_range, per_example
from gradengines.tasks.stream import StreamReader, StreamSplit
from gradengines.trainers.core.compiled import compile_checked
from gradengines.trainers.core.distributed import DataParallel, local_device
from gradengines.trainers.core.engine import GradientEngine, trainable_parameters
from gradengines.trainers.core.errors import ConfigError, RunWriteError, spell
from gradengines.trainers.core.options import as_dict, parse_options
from gradengines.trainers.core.precision import precision_of
from gradengines.trainers.core.replicas import unwrap
from gradengines.trainers.core.rng import rng_state
from gradengines.trainers.core.threads import threads_for_api
from gradengines.trainers.run import lifecycle
from gradengines.trainers.run.config import SHARED_SETTINGS, TrainConfig
from gradengines.trainers.run.model_check import check_task_model, to_device
from gradengines.trainers.run.notes import note, note_once
from gradengines.trainers.run.optim import build_optimizer, build_scheduler
from gradengines.trainers.run.progress import Progress
from gradengines.trainers.run.rundir import RunDirectory, run_path
from gradengines.trainers.run.step import StepResult, TrainStep, agreement_scalars

__all__ = ["Trainer", "check_task_model", "eval_subset", "steps_per_epoch"]

EVAL_SUBSET_SEED = 0  # the bounded evaluations' rows, the same for every trainer and training seed


def steps_per_epoch(task: Task, global_batch: int) -> int:
    """Steps of one epoch of ``task``'s training split (one pass of a stream with a length); a stream without
    one has no epochs (``ConfigError``, one line)."""
    if task.train.size is None:
        raise ConfigError(f"task '{task.name}': the training data is a stream without a length (no __len__), so it "
                          f"has no epochs: give the run in steps (--steps N, fit(steps=N))")
    return math.ceil(task.train.size / global_batch)


def eval_subset(n: int, batches: int | None, batch_size: int) -> torch.Tensor | None:
    """Rows of a bounded evaluation: the first ``batches`` x ``batch_size`` of a fixed permutation of
    ``n`` rows (seeded apart from the training seed); None when that is the whole split."""
    if batches is None or batches * batch_size >= n:
        return None
    return torch.randperm(n, generator=torch.Generator().manual_seed(EVAL_SUBSET_SEED))[:batches * batch_size]


class Trainer:
    """Train ``model`` on ``task`` with gradients from ``engine`` (module docstring).

    Args:
        model: any ``nn.Module`` the engine accepts (``engine.check``).
        engine: a ``GradientEngine`` (``trainers.build_engine``).
        task: a ``tasks.Task`` (splits, loss, metric).
        config: a ``TrainConfig``; keyword ``overrides`` replace its fields.
        logdir: root of the TensorBoard runs; None logs nothing and checkpoints nothing.
        experiment: name of the experiment folder under ``logdir``.
        run_name: folder of this run under the experiment (default: the trainer's name).
        meta: how the model was built (name and options), kept in ``result.json`` and hparams.
        settings: where the settings came from (``trainers.cli.Setup.settings``: recipe values with
            their sources, overridden keys), kept in ``result.json``.
        overwrite: start afresh in a run directory that already holds a run.
        clock: monotonic seconds for progress lines and metrics flushes (tests pass a fake one).
        evaluate_test: False for runs that select settings (tuning trials): the test split is
            never read and the report's ``test`` is None.
        timing: this trainer's step timed round-robin against the comparison's reference
            (``trainers.experiments.step_timing``; ``step_ms``, ``ratio``, spreads, ``peak_mb``): records carry
            ``compute_ms`` = steps x ``step_ms``, the HParams step time is it, ``result.json`` keeps it.
    """

    def __init__(self, model: nn.Module, engine: GradientEngine, task: Task, *, config: TrainConfig | None = None,
                 logdir=None, experiment: str = "default", run_name: str | None = None,
                 overwrite: bool = False, meta: dict | None = None, settings: dict | None = None, clock=time.monotonic,
                 evaluate_test: bool = True, timing: dict | None = None, **overrides):
        for name, value, kind, how in (("model", model, nn.Module, "a torch.nn.Module"),
                                        ("engine", engine, GradientEngine, "a GradientEngine (trainers.build_engine)"),
                                        ("task", task, Task, "a tasks.Task (tasks.build)")):
            if not isinstance(value, kind):
                raise ConfigError(f"Trainer's {name} must be {how}, got {type(value).__name__} {value!r:.60}")
        threads_for_api()  # as the command line does, unless this process chose already (trainers.set_threads)
        # a DDP-wrapped model trains as its module: the Trainer's own data parallelism averages the gradients once
        model = unwrap(model)[0]
        cfg = config or TrainConfig()
        if overrides:
            cfg = parse_options(TrainConfig, {**as_dict(cfg), **overrides})
        self.cfg = cfg
        self.parallel = DataParallel()
        self.device = torch.device(local_device(cfg.device))
        self.precision = precision_of(cfg.precision, cfg.dtype)  # the dtype, and autocast where mixed
        self.dtype = self.precision.dtype
        engine.check(model)
        self.model = model.to(device=self.device, dtype=self.dtype)
        with self.precision.autocast(self.device):
            check_task_model(self.model, task, self.device, self.dtype)
        if cfg.compile:  # compiled in place where the engine's gradients on the first batch are its eager ones
            x0, y0 = task.train.take(slice(0, cfg.batch_size))
            with self.precision.autocast(self.device):
                said_of_compile = compile_checked(self.model, engine, to_device(x0, self.device, self.dtype),
                                                  y0.to(self.device), task.loss_fn, cfg.compile)
            if said_of_compile and self.parallel.is_main:
                note(said_of_compile)
        # the engine's self-check on the first batch (a copy), before anything is written
        first_x, first_y = task.train.take(slice(0, cfg.batch_size))
        with self.precision.autocast(self.device):  # the check at the run's precision (its tolerance follows it)
            engine.prepare(self.model, to_device(first_x, self.device, self.dtype), first_y.to(self.device),
                           task.loss_fn)
        said = engine.structure(self.model)
        if said is not None and self.parallel.is_main:  # once per command (compare's seeds)
            note_once(said)
        self.engine, self.task, self.clock = engine, task, clock
        self.evaluate_test = evaluate_test
        self.timing = timing
        # rows of the periodic validations (None: the whole split)
        self.eval_rows = eval_subset(len(task.val), cfg.eval_batches, cfg.eval_batch_size)
        self.run_name = engine.name if run_name is None else run_name
        self.run_dir = run_path(logdir, experiment, self.run_name, cfg.seed) if logdir is not None else None
        self.files = RunDirectory(self.run_dir) if self.run_dir is not None else None  # lock, checkpoints
        self.meta = {"model": type(model).__name__, **(meta or {})}  # how the model was built, for the record
        declared = model_call(model).described()
        if declared:  # how it is called, where declared (models.declare_call, --model-call)
            self.meta["call"] = ", ".join(f"{k}={v}" for k, v in declared.items())
        # a model the command line imported from the user's code: its failures are reported in one line
        self.user_model = is_reference(str(self.meta.get("name", "")))
        self.settings = settings or dict(SHARED_SETTINGS)
        self.overwrite = overwrite
        self.params = [p for _, p in trainable_parameters(model)]
        if not self.params:
            raise ConfigError(f"{type(model).__name__} has no trainable parameter (none at all, or every one has "
                              f"requires_grad=False): there is nothing to train")
        self.retraction = CayleyRetraction(model)
        self.optimizer = build_optimizer(self.params, cfg)
        try:
            self.retraction.check_optimizer(self.optimizer, spell)
        except ModelConfigError as err:  # a training option, said as one
            raise ConfigError(str(err)) from None
        scaler = self.precision.scaler(self.device)
        if scaler is not None and self.retraction:
            raise ConfigError("--precision 16-mixed scales the loss, which the Cayley retraction of orthogonal layers "
                              "does not unscale: use bf16-mixed (no scaler) or 32")
        self.update = TrainStep(model, engine, self.params, task.loss_fn, self.optimizer, self.retraction,
                                self.parallel, cfg.clip_grad_norm, self.device, self.precision, scaler)
        self.step = 0
        self.saved_step: int | None = None  # step of the last checkpoint written or resumed from
        self.changes: list[dict] = []  # options changed at resumes (``rundir.check_resume``)
        self.finished_before = False  # fit(resume=True) found the run finished: it wrote nothing
        self.best: dict | None = None  # {"step", "val": {...}, "state": state_dict}
        self.test_outcomes: dict | None = None  # the best model's per-example test outcomes {"values", "counts"}
        self._outcomes: list | None = None  # where evaluate adds them while the test split is evaluated
        self.history: list[dict] = []  # every logged record, as in metrics.jsonl
        self.step_times: list[float] = []  # seconds per whole loop iteration
        self._order: tuple[int, Any] | None = None  # (epoch, the training keys of that epoch in order)
        # a stream's place in it (in the checkpoints)
        self.stream = StreamReader(task.train) if isinstance(task.train, StreamSplit) else None
        self.eval_every = 0  # steps between evaluations, set by fit: once an epoch or ten times a stream's run
        last = 0 if self.stream is not None else len(task.train) % self.global_batch  # a stream's batches are full
        if 0 < last < self.parallel.world_size:
            raise ConfigError(
                f"the last batch of each epoch holds {last} sample(s), fewer than the {self.parallel.world_size} "
                f"ranks; choose a --batch-size for which {len(task.train)} training samples leave none or "
                f"at least {self.parallel.world_size} over")

    # ----------------------------------------------------------------- data
    @property
    def global_batch(self) -> int:
        """Samples per step over all ranks: ``batch_size`` x world size."""
        return self.cfg.batch_size * self.parallel.world_size

    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.task, self.global_batch)

    def samples_seen(self, step: int) -> int:
        """Training samples (over all ranks) in the first ``step`` steps: whole epochs, then full batches (a
        stream's batches are all full)."""
        if self.stream is not None:
            return step * self.global_batch
        epoch, index = divmod(step, self.steps_per_epoch())
        return epoch * len(self.task.train) + min(index * self.global_batch, len(self.task.train))

    def where(self, step: int) -> dict:
        """Where a record of ``step`` lies on the other axes: samples seen, epochs (None for a stream without a
        length), and (timed) compute ms."""
        samples, size = self.samples_seen(step), self.task.train.size
        where = {"samples": samples, "epoch": None if size is None else samples / size}
        if self.timing is not None:
            where["compute_ms"] = step * self.timing["step_ms"]
        return where

    def _batch(self, step: int):
        """This rank's shard of the batch of global ``step``: epoch permutation from (seed, epoch) only, or the
        stream's next global batch (its labels checked as they arrive)."""
        if self.stream is not None:
            items = self.stream.next_items(self.global_batch)
            inputs, targets = self.stream.split.collate_items([items[int(i)] for i in
                                                               self.parallel.shard(torch.arange(len(items)))])
            self.task.check_targets("train", label_range(targets), f" at step {step}")
            return to_device(inputs, self.device, self.dtype), targets.to(self.device)
        epoch, index = divmod(step, self.steps_per_epoch())
        if self._order is None or self._order[0] != epoch:
            gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
            self._order = (epoch, self.task.train.order(gen))
        rows = self.parallel.shard(self._order[1][index * self.global_batch:(index + 1) * self.global_batch])
        inputs, targets = self.task.train.take(rows)
        return to_device(inputs, self.device, self.dtype), targets.to(self.device)

    @torch.no_grad()
    def evaluate(self, split: str = "val", rows: torch.Tensor | None = None,
                 on_batch: Callable[[int, int], None] | None = None) -> dict[str, float]:
        """Mean loss and metric over a split (or its ``rows``), in eval mode (no dropout); each rank
        evaluates its shard; ``on_batch(done, batches)`` after each batch (progress). While ``_final_report``
        keeps the test split's per-example outcomes, each batch's ``(values, counts)``
        (``tasks.base.per_example``) is added to them, in the split's order.

        Batches are weighted by their counted targets (tokens other than ``IGNORE_INDEX``), so
        the mean is over every counted token of the split, padded sentences included.
        """
        data = getattr(self.task, split)
        was_training = self.model.training
        self.model.eval()
        total_loss, total_metric, counted = 0.0, 0.0, 0.0
        keys = data.order()  # the split's fixed evaluation keys; ``rows`` are positions among them
        rows = self.parallel.shard(keys if rows is None else keys[rows])
        batches = math.ceil(len(rows) / self.cfg.eval_batch_size)
        for start in range(0, len(rows), self.cfg.eval_batch_size):
            batch = rows[start:start + self.cfg.eval_batch_size]
            x, y = data.take(batch)
            x, y = to_device(x, self.device, self.dtype), y.to(self.device)
            with self.precision.autocast(self.device):
                out = call_model(self.model, x, y).outputs
                n = float((y != IGNORE_INDEX).sum())
                total_loss += self.task.loss_fn(out, y).item() * n
                total_metric += float(self.task.metric(out, y)) * n
                if self._outcomes is not None:
                    self._outcomes.append(per_example(self.task.metric_name, self.task.loss_fn, out.float(), y))
            counted += n
            if on_batch is not None:
                on_batch(start // self.cfg.eval_batch_size + 1, batches)
        self.model.train(was_training)
        total_loss, total_metric, counted = self.parallel.sums([total_loss, total_metric, counted])
        result = {"loss": total_loss / counted}
        if self.task.metric_name == "perplexity":
            result["perplexity"] = math.exp(min(result["loss"], 50.0))
        else:
            result[self.task.metric_name] = total_metric / counted
        return result

    def _better(self, val: dict) -> bool:
        if self.best is None:
            return True
        name = self.task.metric_name
        if name in ("perplexity", "loss"):
            return val[name] < self.best["val"][name]
        return val[name] > self.best["val"][name]

    # ---------------------------------------------------------- checkpoints
    def _checkpoint_state(self) -> dict:
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "scaler": self.update.scaler.state_dict() if self.update.scaler else None,
            "engine": self.engine.state_dict(),
            "rng": rng_state(),
            "best": self.best,
            "config": as_dict(self.cfg),
            "world_size": self.parallel.world_size,
            "global_batch": self.global_batch,
            "engine_name": self.engine.name,
            "task": self.task.name,
            "identity": self.identity(),
            "changes": self.changes,
            "data": self.stream.position() if self.stream is not None else None,
        }

    def identity(self) -> dict:
        """What a resumed run must share with its checkpoint: trainer, its options, model, task (its name,
        shapes and split sizes)."""
        task = self.task
        return {"trainer": self.engine.name, "engine": self.engine.hparams(), "model": self.meta,
                "task": {"name": task.name, "input_shape": list(task.input_shape), "outputs": task.num_outputs,
                         **{split: getattr(task, split).size for split in ("train", "val", "test")},
                         "split": task.fingerprint}}

    def save_checkpoint(self) -> Path | None:
        """Write the run directory's newest checkpoint atomically, keeping the previous one (rank 0 only)."""
        if self.files is None or not self.parallel.is_main:
            return None
        path = self.files.save(self._checkpoint_state())
        self.saved_step, self._checkpointed = self.step, self.clock()
        return path

    # ------------------------------------------------------------- training
    def fit(self, *, epochs: int | None = None, steps: int | None = None, resume: bool | str = False,
            allow_changes=()) -> dict:
        """Train for ``epochs`` or ``steps`` (one of them); returns the final report.

        The run directory is locked for the whole call (one writer per run). ``resume=True``
        continues from the run directory's newest readable checkpoint, reproducing the uninterrupted run (a run
        killed before its first checkpoint starts afresh; a directory with no run is refused, naming the runs of
        other flags beside it); ``resume="auto"`` starts a run where there is none; a finished run is
        returned as it is. The checkpoint must come from the same trainer, options, task
        and model; ``allow_changes`` names the options of ``rundir.CHANGEABLE`` (such as
        ``"lr"``) that may differ from it, applied from the resumed step on and recorded
        in ``result.json``.
        """
        if steps is not None and epochs is None:
            total = steps
        elif epochs is not None and steps is None:
            total = epochs * self.steps_per_epoch()
        else:
            raise ConfigError("give exactly one of epochs or steps")
        if total < 1:
            raise ConfigError(f"the run must have at least one step, got {total}")
        self.eval_every = self.cfg.eval_every or (
            self.steps_per_epoch() if self.task.train.size is not None else max(1, total // 10))
        self.update.scheduler = build_scheduler(self.optimizer, self.cfg, total)
        # rank 0 locks and reads the run directory; every rank gets its verdict (and the checkpoint)
        verdict = self.parallel.broadcast_object(
            lifecycle.open_run(self, resume, total, allow_changes) if self.parallel.is_main else None)
        try:
            if isinstance(verdict, BaseException):
                raise verdict
            how, found = verdict
            if how == "done":
                self.finished_before = True
                return found
            return self._fit(total, resumed=found)
        except ModelConfigError:
            refused_at_start = verdict == ("fresh", None) and self.step == 0
            raise
        finally:
            if self.files is not None:
                self.files.release()
                if locals().get("refused_at_start"):
                    self.files.discard()

    @property
    def scheduler(self):
        return self.update.scheduler

    def _fit(self, total: int, resumed) -> dict:
        """The training loop of ``fit``; ``resumed``: (checkpoint, changes) or None."""
        lifecycle.start(self, resumed)
        logger = lifecycle.open_logger(self, resuming=resumed is not None, total=total)
        # rank 0 reports: a bar on a terminal, a line every progress_seconds otherwise (logs, CI)
        progress = Progress(f"{self.run_name} seed {self.cfg.seed}", total, initial=self.step,
                            every=self.cfg.progress_seconds, enabled=self.cfg.progress and self.parallel.is_main,
                            clock=self.clock)
        self._flushed = self._checkpointed = self.clock()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.model.train()
        evaluating = False
        try:
            while self.step < total:
                self._iteration(total, logger, progress)
            evaluating = True  # the last and the best model on whole splits: a phase of its own, which speaks too
            report = self._final_report(progress)
        except BaseException as err:
            if logger:
                logger.close(quiet=True)
            failure = lifecycle.run_failure(self, err, logger, evaluating=evaluating)
            if failure is err:
                raise
            raise failure from None
        finally:
            progress.close()
        try:
            lifecycle.write_result(self, report, logger)
        except OSError as err:
            if logger:
                logger.close(quiet=True)
            raise RunWriteError(lifecycle.write_failure(self, err)) from None
        return report

    def _iteration(self, total: int, logger, progress: Progress) -> None:
        """One pass of the loop: agreement, update, log, evaluate, checkpoint."""
        cfg, t_iter = self.cfg, time.perf_counter()
        if self.parallel.rank > 0:  # rank 0 keeps the checkpointed stream; others draw their own masks
            torch.manual_seed(hash((cfg.seed, self.parallel.rank, self.step)) % 2**63)
        x, y = self._batch(self.step)
        scalars = {}
        if cfg.grad_agreement_every and self.step % cfg.grad_agreement_every == 0:  # leaves everything as it was
            with self.precision.autocast(self.device):
                scalars.update(agreement_scalars(self.model, self.engine, x, y, self.task.loss_fn))
        result = self.train_step(x, y)
        self.step += 1
        progress.update(self.step, result.loss)
        if self.step % cfg.log_every == 0 or self.step == total:
            scalars.update(self.update.scalars(result))
        # evaluate (on the fixed subset with eval_batches), keep the best validation model
        evaluated = self.step % self.eval_every == 0 or self.step == total
        if evaluated:
            self.parallel.average_running_stats(self.model)
            self.parallel.check_in_sync(self.model)
            val = self._evaluate("val", progress, rows=self.eval_rows)
            used = len(self.task.val) if self.eval_rows is None else len(self.eval_rows)
            scalars.update({**{f"eval/{k}": v for k, v in val.items()}, "eval/samples": used})
            if self._better(val):
                self.best = {"step": self.step, "val": val, "state": copy.deepcopy(self.model.state_dict())}
        if scalars:
            where = self.where(self.step)
            self.history.append({"step": self.step, **where, **scalars})
            if logger:
                logger.log(self.step, scalars, **where)
        # checkpoint (after the logs it covers are flushed); metrics.jsonl also every progress_seconds
        checkpoint = (evaluated or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)
                      or (cfg.checkpoint_seconds and self.clock() - self._checkpointed >= cfg.checkpoint_seconds))
        if logger and (checkpoint or self.clock() - self._flushed >= cfg.progress_seconds):
            logger.flush()
            self._flushed = self.clock()
        if checkpoint:
            self.save_checkpoint()
        self.step_times.append(time.perf_counter() - t_iter)

    def train_step(self, x, y) -> StepResult:
        """The update on one batch (``trainers.run.step.TrainStep``)."""
        last = lifecycle.last_checkpoint(self)
        return self.update(x, y, self.step, f", last good checkpoint kept at {last}" if last is not None else "")

    def _evaluate(self, split: str, progress: Progress, *, rows=None, model: str | None = None,
                  outcomes: list | None = None) -> dict[str, float]:
        """``evaluate``, its progress while it runs and its line."""
        self._outcomes = outcomes
        try:
            with progress.evaluating(split, model) as on_batch:
                result = self.evaluate(split, rows, on_batch)
        finally:
            self._outcomes = None
        metric, n = self.task.metric_name, len(getattr(self.task, split))
        progress.evaluated(split, metric, result[metric], samples=n if rows is None else len(rows), of=n,
                           batch_size=self.cfg.eval_batch_size, model=model)
        return result

    def _final_report(self, progress: Progress) -> dict:
        """Validation of the last model, and validation + test of the best validation model, on whole splits."""
        final_val = self._evaluate("val", progress, model="last model")
        if self.best is None:  # a run resumed at its end from a checkpoint written before any evaluation
            self.best = {"step": self.step, "val": final_val, "state": copy.deepcopy(self.model.state_dict())}
        chosen = self.best
        last_state = copy.deepcopy(self.model.state_dict())
        self.model.load_state_dict(chosen["state"])
        best = f"best model, step {chosen['step']}"
        # selected on a fixed subset (eval_batches): measure the best model on the whole split too
        if self.eval_rows is None:
            best_val = chosen["val"]
        else:  # the last model is the best one when it was selected last: no second pass
            best_val = final_val if chosen["step"] == self.step else self._evaluate("val", progress, model=best)
        outcomes: list = []  # the test split's per-example outcomes of the best model (one process: whole split)
        test = (self._evaluate("test", progress, model=best, outcomes=outcomes if self.parallel.world_size == 1
                               else None) if self.evaluate_test else None)
        self.model.load_state_dict(last_state)
        if outcomes and all(o is not None for o in outcomes):  # result.json keeps them (lifecycle.write_result)
            values, counts = (torch.cat([o[i] for o in outcomes]).tolist() for i in (0, 1))
            self.test_outcomes = {"values": [round(v, 6) for v in values], "counts": counts}
        return {"steps": self.step, "best_step": chosen["step"], "best_val": best_val, "final_val": final_val,
                "test": test}
