"""A run directory: one writer at a time, its files, checkpoint rotation, resume checks.

Layout of ``<logdir>/<experiment>/<run>/seed<k>/``::

    .lock                  flock-ed by the process writing the run; holds its pid
    checkpoint.pt          the newest checkpoint
    checkpoint.prev.pt     the one before it: used (with a note) when the newest is damaged
    metrics.jsonl          one JSON record per logged step
    events.out.tfevents.*  TensorBoard scalars and the run's HParams session
    result.json            the final report, once the run has finished
    failed.json            why it stopped instead (a non-finite loss), written under the lock

The lock is held for the whole of ``Trainer.fit`` (an ``flock``, so the kernel
releases it when the process dies, even by ``kill -9``); a second writer is
refused in one line naming the holder's pid. Every file is written atomically
(``trainers.run.checkpoint.write_atomic``) with one mode (``0o666`` less the umask);
temporary files left by a killed writer are removed when the next one takes
the lock. A directory where one of the run's files goes is refused before the
run starts (a rename cannot replace it, so nothing could be written there), and
a disk that refuses the directory or its lock (full, read-only) is one line
naming the path.

Resuming checks the checkpoint against the run being resumed (``check_resume``):
the trainer, its options, the task and the model must be the same, and so must
the options that define the trajectory from its start (``FIXED``); the options
in ``CHANGEABLE`` (learning rate, momentum, ...) may change at the resume step
only when the user says so, and each change is recorded. The rest (logging,
evaluation batch size, device) follow the current run.
"""

import errno
import fcntl
import json
import os
import time
from pathlib import Path

from gradengines.trainers.core.errors import ConfigError, DamagedCheckpointError, RunBusyError, on_command_line, spell
from gradengines.trainers.run.checkpoint import (
    TEMP_SUFFIX,
    load_checkpoint,
    save_atomic,
    state_problem,
    write_text_atomic,
)
from gradengines.trainers.run.notes import note  # re-exported: callers have said note from here since before notes.py
from gradengines.trainers.run.records import read_record

__all__ = ["RunDirectory", "run_path", "check_folder_name", "holds_any_run", "nothing_to_resume", "check_resume",
           "FIXED", "CHANGEABLE", "note"]

CHECKPOINT, PREVIOUS, LOCK = "checkpoint.pt", "checkpoint.prev.pt", ".lock"
RESULT, METRICS, FAILED = "result.json", "metrics.jsonl", "failed.json"
NAME_MAX = 255  # bytes in one folder name on Linux's and macOS's file systems
RUN_FILES = (CHECKPOINT, PREVIOUS, METRICS, RESULT, FAILED)

FIXED = ("optimizer", "seed", "dtype", "precision", "schedule")
"""Training options a resumed run keeps: another value would be another run."""

CHANGEABLE = ("lr", "momentum", "nesterov", "weight_decay", "clip_grad_norm", "warmup_steps", "step_size", "gamma",
              "eval_every", "eval_batches")
"""Training options a resume may change from its step on, when asked explicitly (recorded)."""


def _remove_empty(folders) -> None:
    """Remove ``folders`` (deepest first) where they are empty: what a refused start had made."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def holds_any_run(folder: Path) -> bool:
    """Whether a run left its records anywhere below ``folder`` (an experiment: its runs and tuning trials)."""
    return folder.is_dir() and any(RunDirectory(found.parent).holds_run()
                                   for name in (METRICS, CHECKPOINT) for found in folder.rglob(name))


def nothing_to_resume(experiment: Path, run: str | None = None) -> str:
    """The refusal of a resume where no run is (in ``experiment``, or its ``run`` folder, e.g. ``fa/seed0``): the
    experiments of the same command beside it that hold one, what differs in their names (the flags that name
    an experiment), and the ways on."""
    ours = experiment.name.split("-")
    similar = []
    for there in sorted(p for p in experiment.parent.iterdir() if p.is_dir() and p != experiment) \
            if experiment.parent.is_dir() else []:
        theirs = there.name.split("-")
        if theirs[0] != ours[0] or not (RunDirectory(there / run).holds_run() if run else holds_any_run(there)):
            continue
        only_there, only_here = [t for t in theirs if t not in ours], [t for t in ours if t not in theirs]
        similar.append((len(only_there) + len(only_here),
                        f"{there.name} ({', '.join(only_there) or '-'} there, {', '.join(only_here) or '-'} here)"))
    found = f"; the same {'run' if run else 'command'} with other flags: " \
            f"{'; '.join(text for _, text in sorted(similar)[:3])}" if similar else ""
    return (f"{experiment / run if run else experiment} holds no run to resume{found}; give the flags of the run to "
            f"continue, leave out {spell('resume')} to start this one, or use {spell('resume_auto')} (resume where a "
            f"run is, start where none is: job schedulers)")


def check_folder_name(what: str, name: str) -> None:
    """``experiment`` or ``run_name`` ``what``: a relative path inside the log directory, not empty, without '.' or
    '..' parts, each part within the file system's length."""
    if not name:
        raise ConfigError(f"{spell(what)} is empty; give a folder name, or leave it out for the default")
    parts = Path(name).parts  # "." and "a/." lose their "." here: a name must keep a part of its own
    if not parts or Path(name).is_absolute() or any(p in ("..", ".") for p in name.split("/")) \
            or "\0" in name:
        raise ConfigError(f"{spell(what)} must be a relative path inside the log directory without '.' or "
                          f"'..' parts, got {name!r}")
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in parts)
    if longest > NAME_MAX:
        raise ConfigError(f"{spell(what)} has a folder name of {longest} bytes, over the file system's "
                          f"{NAME_MAX}; choose a shorter {spell(what)}")


def run_path(logdir, experiment: str, run_name: str, seed: int) -> Path:
    """``<logdir>/<experiment>/<run_name>/seed<seed>``; names are relative paths that stay inside ``logdir``."""
    for what, name in (("experiment", experiment), ("run_name", run_name)):
        check_folder_name(what, name)
    for what, name in (("logdir", str(logdir)), ("experiment", experiment), ("run_name", run_name)):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # TensorBoard writes names as UTF-8 and would fail mid-run
            raise ConfigError(f"{spell(what)} must be UTF-8 text, got {name!r}") from None
    return Path(logdir) / experiment / run_name / f"seed{seed}"


class RunDirectory:
    """The files of one run and the lock of its single writer (module docstring)."""

    def __init__(self, path):
        self.path = Path(path)
        self.checkpoint, self.previous = self.path / CHECKPOINT, self.path / PREVIOUS
        self._lock_fd = None
        self._made: list[Path] = []  # the folders acquire() made, deepest first
        self._newest_damaged = False  # load() fell back: the next save replaces the newest, keeps the previous

    # ------------------------------------------------------------------ lock
    def acquire(self) -> None:
        """Create the directory and take its lock; ``RunBusyError`` if another process holds it, an ``OSError``
        naming the path and what to do if the disk refuses (full, read-only, not writable): then the lock and the
        folders this call made are removed again, so that a refusal leaves nothing behind."""
        made = [p for p in (self.path, *self.path.parents) if not p.exists()]  # deepest first
        self._made = made
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            _remove_empty(made)
            raise _cannot_write(err, self.path) from None
        lock = self.path / LOCK
        fresh = not lock.exists()

        def undo() -> None:  # what this call made, nothing else
            if fresh:
                lock.unlink(missing_ok=True)
            _remove_empty(made)

        try:  # O_NOFOLLOW: a link planted at .lock is refused, never followed and truncated
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as err:
            if err.errno != errno.ELOOP:
                undo()
                raise _cannot_write(err, lock) from None
            raise ConfigError(f"{lock} is a symbolic link (to {os.readlink(lock)}); a run's "
                              f"lock must be a plain file, and nothing outside the run is written: remove the "
                              f"link") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunBusyError(f"{self.path} is being written by another process (pid {holder}); wait for it to "
                               f"finish, or choose another {spell('run_name')}") from None
        except OSError as err:  # a file system without locks
            os.close(fd)
            undo()
            raise _cannot_write(err, lock) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())  # a full disk fails here first, and names no file
            for tmp in self.path.glob(f".*{TEMP_SUFFIX}"):  # left by a writer that was killed mid-write
                tmp.unlink(missing_ok=True)
        except OSError as err:
            os.close(fd)  # and with it the lock: a later try in this process is not refused as busy
            undo()
            raise _cannot_write(err, lock) from None
        self._lock_fd = fd

    def discard(self) -> None:
        """After ``release``: remove what a run refused on its first batch wrote (its log files and lock, and the
        folders ``acquire`` made), where ``acquire`` made the run's folder itself and no checkpoint is in it."""
        made = self._made
        if self.path not in made or self.checkpoint.exists() or self.previous.exists():
            return
        for path in self.path.iterdir():
            if path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
        _remove_empty(made)

    def release(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)  # no pid of a finished writer left behind
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # ----------------------------------------------------------------- files
    def holds_run(self) -> bool:
        """Whether an earlier run left its records here (an empty metrics.jsonl, left by a run that failed before
        logging anything, is not one: a plain rerun may start)."""
        metrics = self.path / METRICS
        return any((self.path / name).exists() for name in (CHECKPOINT, PREVIOUS)) or (
            metrics.exists() and (not metrics.is_file() or metrics.stat().st_size > 0))

    def clear(self) -> None:
        """Remove an earlier run's files (a fresh start): checkpoints, metrics, results, event files."""
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for events in self.path.glob("events.out.tfevents.*"):
            events.unlink()

    def result(self) -> dict | None:
        """The finished run's ``result.json`` (None if it has not finished, or the file is damaged: noted)."""
        return read_record(self.path / RESULT) if (self.path / RESULT).exists() else None

    def open(self, *, resume: bool | str, overwrite: bool, total: int, identity: dict, config: dict, shapes: dict,
             allow_changes=()):
        """Take the lock and decide how the run of ``total`` steps starts (``check_resume`` has the arguments):
        ``("fresh", None)`` (earlier files cleared), ``("resume", (checkpoint, changes))``, or ``("done", report)``
        for a finished run resumed with no more steps. Raises why it may not start."""
        nothing = resume is True and not self.holds_run()
        if nothing and not self.path.exists():  # before the lock: a refusal makes no folder
            raise ConfigError(nothing_to_resume(self.path.parent.parent, f"{self.path.parent.name}/{self.path.name}"))
        fresh_lock = not (self.path / LOCK).exists()
        self.acquire()  # a planted lock link is refused first
        if nothing:
            self.release()
            if fresh_lock:
                (self.path / LOCK).unlink(missing_ok=True)
            raise ConfigError(nothing_to_resume(self.path.parent.parent, f"{self.path.parent.name}/{self.path.name}"))
        for name in RUN_FILES:  # a file is replaced by a rename, which cannot replace a directory
            if (self.path / name).is_dir() and not (self.path / name).is_symlink():
                raise ConfigError(f"{self.path / name} is a directory, not a file: the run cannot write its {name} "
                                  f"there; move or remove that directory, then run again")
        if resume:
            state = self.load()
            if state is not None:
                changes = check_resume(self.path, state, identity, config, allow_changes, shapes)
                finished = self.result()
                if finished is not None and state["step"] >= total:
                    note(f"{self.path} finished at step {finished['steps']}; nothing to do (its results are unchanged)")
                    return "done", {k: finished[k] for k in ("steps", "best_step", "best_val", "final_val", "test")}
                return "resume", (state, changes)
            if self.holds_run():
                note(f"{self.path} has no checkpoint yet (the run stopped before its first one); starting it afresh")
            else:
                note(f"{self.path} holds no run yet; {spell('resume_auto')} starts it")
        elif self.holds_run() and not overwrite:
            raise ConfigError(f"{self.path} already holds a run; {spell('resume')} continues it, another "
                              f"{spell('run_name')} or {spell('experiment')} starts a new run beside it, "
                              f"{spell('overwrite')} replaces it")
        self.clear()
        return "fresh", None

    def record_failure(self, failure: dict) -> Path:
        """``failed.json``: why the run stopped (``{"run", "trainer", "seed", "step", "error"}``)."""
        return write_text_atomic(self.path / FAILED, json.dumps(failure) + "\n")

    def save(self, state: dict) -> Path:
        """Write ``state`` as the newest checkpoint; the one it replaces becomes the previous
        (unless it was damaged: then the previous stays)."""
        path = save_atomic(state, self.checkpoint, previous=None if self._newest_damaged else self.previous)
        self._newest_damaged = False
        return path

    @property
    def newest(self) -> Path:
        """The file that holds the newest good checkpoint: ``checkpoint.prev.pt`` after ``load`` fell back from a
        damaged ``checkpoint.pt``, until ``save`` replaces that; ``checkpoint.pt`` otherwise."""
        return self.previous if self._newest_damaged else self.checkpoint

    def load(self) -> dict | None:
        """The newest readable checkpoint (None if there is none).

        A damaged newest checkpoint is reported in one line and the previous one used;
        an unsafe one (``UnsafeCheckpointError``) is refused outright, never skipped.
        """
        problems = []
        for path in (self.checkpoint, self.previous):
            try:
                state = load_checkpoint(path)
                problem = state_problem(state)
                if problem:
                    raise DamagedCheckpointError(f"checkpoint {path} is damaged ({problem})")
            except FileNotFoundError:
                continue
            except DamagedCheckpointError as err:
                problems.append(str(err))
                continue
            if problems:
                note(f"{problems[0]}; resuming from the previous checkpoint {path.name} (step {state['step']})")
                self._newest_damaged = True
            return state
        if problems:
            raise DamagedCheckpointError(f"no readable checkpoint in {self.path}: {'; '.join(problems)}; "
                                         f"{spell('overwrite')} starts the run afresh")
        return None


def _cannot_write(err: OSError, path: Path) -> OSError:
    """``err``, raised before the run started, as one line: the path (a failed ``write()`` names none), why, and
    what to do. Its errno and type stay (a ``PermissionError`` stays one)."""
    full = err.errno in (errno.ENOSPC, errno.EDQUOT)
    advice = f"{'free space on that disk, or ' if full else ''}choose another {spell('logdir')}"
    return OSError(err.errno, f"{err.strerror or err}; {advice}", err.filename or str(path))


def _holder(fd: int, wait_s: float = 1.0) -> str:
    """The pid in a lock file held by another process. The holder writes it just after taking
    the lock, so an empty file, or the pid of a writer that has died since, is read again."""
    deadline = time.monotonic() + wait_s
    while True:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit() and _alive(int(text)) or time.monotonic() > deadline:
            return text or "unknown"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _differences(saved: dict, current: dict) -> list[str]:
    keys = sorted(set(saved) | set(current), key=str)
    return [f"{k} {saved.get(k)!r} there, {current.get(k)!r} here" for k in keys if saved.get(k) != current.get(k)]


def check_resume(path, state: dict, identity: dict, config: dict, allow_changes=(), shapes=None) -> list[dict]:
    """Refuse (``ConfigError``, one line) a checkpoint written by another run; return the changes to apply.

    ``identity``: ``{"trainer", "engine": options, "task": its name and sizes, "model": how it was built}``;
    ``config``: this run's training options; ``shapes``: name -> shape of this run's model
    state (a model built otherwise, or a Python model without a recorded build, shows here).
    Returns ``[{"step", "option", "from", "to"}]``
    for each option of ``CHANGEABLE`` in ``allow_changes`` whose value differs.
    """
    step = state["step"]
    saved = state.get("identity")
    if saved is None:  # written before identities were recorded: the trainer name is all there is
        saved = {**identity, "trainer": state.get("engine_name")}
    # the split's fingerprint is compared after the rest of the task (a checkpoint recorded before splits were
    # fingerprinted has none: nothing to compare)
    saved_task = saved.get("task")
    saved_split = saved_task.get("split") if isinstance(saved_task, dict) else None
    split = identity["task"].get("split")
    if isinstance(saved_task, dict):
        saved = {**saved, "task": {k: v for k, v in saved_task.items() if k != "split"}}
    identity = {**identity, "task": {k: v for k, v in identity["task"].items() if k != "split"}}
    for key, what in (("trainer", "trainer"), ("task", "task"), ("engine", "trainer options"), ("model", "model")):
        if saved[key] != identity[key]:
            diff = (", ".join(_differences(saved[key], identity[key])[:3])
                    if isinstance(saved[key], dict) and isinstance(identity[key], dict)
                    else f"{saved[key]!r} there, {identity[key]!r} here")
            raise ConfigError(f"cannot resume {path}: its checkpoint is of another {what} ({diff}); start a new "
                              f"run with another {spell('run_name')}, or {spell('overwrite')}")
    if saved_split is not None and saved_split != split:
        raise ConfigError(f"cannot resume {path}: its checkpoint was trained on another split of the data (another "
                          f"{spell('split_seed')} or other data files); resume with the run's own, or start a new "
                          f"run with another {spell('run_name')}, or {spell('overwrite')}")
    if shapes is not None:
        saved_shapes = {k: tuple(v.shape) for k, v in state["model"].items()}
        for k in sorted(set(saved_shapes) | set(shapes)):
            if saved_shapes.get(k) != shapes.get(k):
                raise ConfigError(f"cannot resume {path}: its checkpoint is of another model ({k}: shape "
                                  f"{saved_shapes.get(k)} there, {shapes.get(k)} here); start a new run with another "
                                  f"{spell('run_name')}, or {spell('overwrite')}")
    old = state["config"]
    for name in FIXED:
        if old.get(name) != config[name]:
            raise ConfigError(f"cannot resume {path} with {spell(name)} {config[name]}: it was trained with "
                              f"{old.get(name)}, and a resumed run keeps its {', '.join(FIXED)}; start a new run "
                              f"with another {spell('run_name')}, or {spell('overwrite')}")
    changes = []
    for name in CHANGEABLE:
        if name in old and old[name] != config[name]:
            if name not in allow_changes:
                how = (f"give {spell(name)} explicitly with --resume" if on_command_line()
                       else f"pass fit(resume=True, allow_changes=[{name!r}])")
                raise ConfigError(f"cannot resume {path}: {spell(name)} is {config[name]} here but {old[name]} in "
                                  f"its checkpoint (step {step}); repeat the run's value, or {how} to change it "
                                  f"from step {step} (recorded in result.json)")
            changes.append({"step": step, "option": name, "from": old[name], "to": config[name]})
    return changes

