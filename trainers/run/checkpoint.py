"""Atomic files and safe checkpoints.

Every file a run writes goes through ``write_atomic``: a temporary file in the
same directory, fsync, then rename, so a crash (or a full disk) leaves the
previous version intact and a reader never sees half a file. A write that
fails raises the ``OSError`` of the disk (with its errno and the file's name),
also from inside ``torch.save``, whose zip writer reports it as its own
``RuntimeError``.

Checkpoints are loaded with ``torch.load(weights_only=True)``: tensors,
numbers, strings, lists, tuples and dicts only (and plain NumPy arrays, which
older checkpoints used for NumPy's RNG state). A checkpoint that holds
anything else (a pickled object whose loading could run code) is refused
without being executed (``UnsafeCheckpointError``); a truncated or garbled
one raises ``DamagedCheckpointError``.
"""

import contextlib
import importlib
import os
import re
import signal
import stat
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from gradengines.trainers.core.errors import DamagedCheckpointError, UnsafeCheckpointError

__all__ = ["state_problem", "save_atomic", "signals_held", "load_checkpoint", "write_text_atomic", "write_atomic",
           "TEMP_SUFFIX"]

TEMP_SUFFIX = ".tmp"  # temporary files are ".<name>.<random>.tmp" beside their target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, write, *, previous: str | os.PathLike | None = None) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync, then rename it to ``path``.

    ``previous``: keep the file ``path`` held until now under that name (checkpoint
    rotation); it is renamed only once the new file is complete on disk.
    The file gets the permissions of any new file (``0o666`` less the umask), not
    ``mkstemp``'s private ``0o600``. The temporary name never contains "tfevents", so
    TensorBoard never reads a half-written events file. On any error the temporary
    file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name.replace('tfevents', 'events')}.", suffix=TEMP_SUFFIX,
                               dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            recording = _RecordingFile(f)
            try:
                write(recording)
            except Exception:
                if recording.error is not None:
                    raise recording.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        if previous is not None and path.exists():
            _keep_as(path, Path(previous))
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        if err.filename is None:  # a failed write() on a full disk names no file: name the one being written
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class _RecordingFile:
    """The file handed to a writer: keeps the ``OSError`` a write raised, for ``write_atomic`` to re-raise
    when the writer (``torch.save``) turns it into an error of its own."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data):
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name):
        return getattr(self.file, name)


def _keep_as(path: Path, previous: Path) -> None:
    """Make ``previous`` a second name of ``path``'s file (a hard link, renamed into place), so that
    ``path`` exists at every moment; on a file system without hard links, rename ``path`` itself."""
    link = previous.with_name(f".{previous.name}.link{TEMP_SUFFIX}")
    try:
        link.unlink(missing_ok=True)
        os.link(path, link)
        os.replace(link, previous)
    except OSError:
        link.unlink(missing_ok=True)
        os.replace(path, previous)


@contextlib.contextmanager
def signals_held():
    """SIGTERM and Ctrl-C held until the block ends, then delivered again to the handlers in place: torch.save
    interrupted inside its C++ writer failed with its own RuntimeError (exit 1, not 143), the checkpoint half
    written. Outside the main thread (no signal arrives there) nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(held):
            os.kill(os.getpid(), signum)  # the run's own handler now: Terminated, or KeyboardInterrupt


def save_atomic(state: dict, path: str | os.PathLike, *, previous: str | os.PathLike | None = None) -> Path:
    """``torch.save(state)`` to ``path`` atomically (``write_atomic``; ``previous`` keeps the old file), a signal
    that arrives meanwhile delivered after it (``signals_held``)."""
    with signals_held():
        return write_atomic(path, lambda f: torch.save(state, f), previous=previous)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return write_atomic(path, lambda f: f.write(text.encode()))


# NumPy's RNG key as an array, as checkpoints held it before RNG states became tensors: plain
# uint32 arrays (an object array would still need its objects' classes, which stay forbidden)
NUMPY_ARRAY_GLOBALS = [importlib.import_module("numpy._core.multiarray")._reconstruct, np.ndarray, np.dtype,
                       type(np.dtype(np.uint32))]

# how torch's weights-only unpickler refuses a type it does not allow (a name it would import, an object it would
# build or create): what the checkpoint holds is not plain, not that its bytes are damaged
_FORBIDDEN = re.compile(r"unsupported GLOBAL ([\w.]+)|allowlisted via `add_safe_globals`,? but got <class '([\w.]+)'>",
                        re.IGNORECASE)


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load a checkpoint written by ``save_atomic``, with ``weights_only=True``.

    Raises ``UnsafeCheckpointError`` if it holds objects other than tensors and plain
    values, or is a raw pickle rather than torch's zip format (nothing of it is executed),
    ``DamagedCheckpointError`` if it cannot be read, is not a regular file (a directory; a
    FIFO is never opened, so it cannot hang). ``state_problem`` says whether what it holds can
    continue a run.
    """
    kind = os.stat(path).st_mode  # FileNotFoundError: no checkpoint
    if not stat.S_ISREG(kind):
        what = "a directory" if stat.S_ISDIR(kind) else "a FIFO" if stat.S_ISFIFO(kind) else "not a regular file"
        raise DamagedCheckpointError(f"checkpoint {path} is {what}, not a checkpoint file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:1] == b"\x80":  # a pickle protocol 2+ stream: not torch's zip format
        raise UnsafeCheckpointError(f"checkpoint {path} is a raw pickle, not a torch checkpoint; refused without "
                                    f"loading it (loading it could run code)")
    if head != b"PK\x03\x04":
        raise DamagedCheckpointError(f"checkpoint {path} is damaged (not torch's zip format)")
    try:
        with torch.serialization.safe_globals(NUMPY_ARRAY_GLOBALS):
            state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # torch raises RuntimeError, EOFError, KeyError, UnpicklingError, ... on bad bytes
        forbidden = _FORBIDDEN.search(str(err))
        if forbidden:
            name = forbidden.group(1) or forbidden.group(2)
            raise UnsafeCheckpointError(
                f"checkpoint {path} holds a pickled object ({name}), not only tensors and plain values; refused "
                f"without loading it (loading it could run code)") from None
        reason = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
        raise DamagedCheckpointError(f"checkpoint {path} is damaged ({reason})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise DamagedCheckpointError(f"checkpoint {path} is damaged (not a checkpoint of this framework)")
    return state


def state_problem(state) -> str | None:
    """Why a loaded checkpoint cannot continue a Trainer's run (None: it can): a step that is not a non-negative
    integer, no model weights, an optimizer state without parameter groups, no config, random generator
    states that do not apply (tried, then the current ones put back)."""
    from gradengines.trainers.core.rng import rng_state, set_rng_state  # rng imports nothing of the run

    if not isinstance(state, dict) or "step" not in state:
        return "not a checkpoint of this framework"
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step {step!r} is not a non-negative integer"
    model = state.get("model")
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        return "no model weights"
    optimizer = state.get("optimizer")
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("param_groups"), list) \
            or not optimizer["param_groups"] or not isinstance(optimizer.get("state"), dict):
        return "no optimizer state with parameter groups"
    if not isinstance(state.get("config"), dict):
        return "no config"
    if state.get("scheduler") is not None and not isinstance(state["scheduler"], dict):
        return "a scheduler state that is not a dict"
    if not isinstance(state.get("engine"), dict):
        return "no engine state"
    if not isinstance(state.get("rng"), dict):
        return "no random generator states"
    current = rng_state()
    try:
        set_rng_state(state["rng"])
    except Exception as err:  # any malformed piece: a type, a length, a key
        return f"its random generator states do not apply ({type(err).__name__})"
    finally:
        set_rng_state(current)
    return None
