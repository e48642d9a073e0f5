"""Atomic checkpoints: write a temporary file in the same directory, then rename.

A crash while writing leaves the previous checkpoint intact; a reader never
sees half a file.
"""

import os
import tempfile
from pathlib import Path

import torch

__all__ = ["save_atomic", "load_checkpoint", "write_text_atomic", "write_atomic"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, write) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync, then rename it to ``path``.

    The file gets the permissions of any new file (``0o666`` less the umask), not
    ``mkstemp``'s private ``0o600``. The temporary name never contains "tfevents", so
    TensorBoard never reads a half-written events file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name.replace('tfevents', 'events')}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_atomic(state: dict, path: str | os.PathLike) -> Path:
    """``torch.save(state)`` to ``path`` atomically."""
    return write_atomic(path, lambda f: torch.save(state, f))


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return write_atomic(path, lambda f: f.write(text.encode()))


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load a checkpoint written by ``save_atomic`` (RNG states need full unpickling)."""
    return torch.load(path, map_location=map_location, weights_only=False)
