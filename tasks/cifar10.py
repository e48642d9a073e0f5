"""``cifar10`` from the standard "python version" batches.

The batches are looked up in ``<data_dir>/cifar-10-batches-py/``. If they are
missing but ``<data_dir>/cifar-10-python.tar.gz`` is there (or ``download`` is
set, which fetches it), the archive is extracted there first, safely.
"""

from __future__ import annotations

import os
import pickle
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from .base import Split, Task
from .download import ensure_file, resolve_root
from .errors import DataError, TaskConfigError
from .registry import check_int, register_task
from .splits import holdout_indices

__all__ = ["build_cifar10", "load_batch", "extract_archive", "MEAN", "STD", "URL", "MD5", "FOLDER"]

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"

#: Per-channel mean and std of the CIFAR-10 train pixels in [0, 1].
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

# The only globals a CIFAR batch pickle needs (numpy arrays, Python 2 byte strings).
_ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}


class _BatchUnpickler(pickle.Unpickler):
    """Unpickler that refuses anything but numpy arrays and plain containers."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        if module == "numpy.core.multiarray":  # old pickles; numpy 2 moved it
            try:
                import numpy._core.multiarray as multiarray
            except ImportError:  # numpy < 2
                import numpy.core.multiarray as multiarray
            return getattr(multiarray, name)
        return super().find_class(module, name)


def load_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file: ``(images (N, 3, 32, 32) uint8, labels (N,) int64)``; bad files raise ``DataError``."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            batch = _BatchUnpickler(handle, encoding="bytes").load()
    except Exception as exc:  # UnpicklingError, EOFError, OSError, ...
        raise DataError(f"corrupt CIFAR-10 batch {path}: {' '.join(str(exc).split())}; replace the file") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError(f"corrupt CIFAR-10 batch {path}: expected a dict with b'data' and b'labels'; replace the file")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"corrupt CIFAR-10 batch {path}: data {data.dtype}{data.shape}, expected uint8 (N, 3072)")
    if labels.shape != (data.shape[0],) or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise DataError(f"corrupt CIFAR-10 batch {path}: labels must be N={data.shape[0]} values in 0..9")
    return data.reshape(-1, 3, 32, 32), labels


def extract_archive(archive: str | Path, root: str | Path) -> None:
    """Extract the regular files under ``cifar-10-batches-py/`` of ``archive`` into ``root``.

    Members with absolute paths or ``..`` raise ``DataError``; links and devices are refused.
    Each file is written to a temporary name and moved into place.
    """
    archive, root = Path(archive), Path(root)
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.name.startswith(("/", "\\")) or PurePosixPath(member.name).is_absolute() or ".." in parts:
                    raise DataError(f"unsafe path '{member.name}' in {archive}; delete the archive and download it "
                                    "again")
                if member.issym() or member.islnk() or not (member.isfile() or member.isdir()):
                    raise DataError(f"unexpected link or device '{member.name}' in {archive}; delete the archive "
                                    "and download it again")
                if not parts or parts[0] != FOLDER or not member.isfile():
                    continue
                target = root.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
                try:
                    with os.fdopen(fd, "wb") as out:
                        while chunk := source.read(1 << 20):
                            out.write(chunk)
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
    except (tarfile.TarError, EOFError, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise DataError(f"cannot extract {archive}: {reason}; delete it and download it again") from None


def _normalize(images: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0)
    mean = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std)


@register_task("cifar10")
def build_cifar10(data_dir=None, download: bool = False, seed: int = 0, val_size: int = 5000) -> Task:
    """CIFAR-10: val = last ``val_size`` of a seeded permutation of train, test = ``test_batch``.

    Pixels /255 then normalized per channel with :data:`MEAN` / :data:`STD`.
    """
    check_int("cifar10", "val_size", val_size, 0)
    root = resolve_root(data_dir, download)
    folder = root / FOLDER
    names = (*TRAIN_BATCHES, TEST_BATCH)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        if download or (root / ARCHIVE).is_file():
            archive = ensure_file(root, ARCHIVE, URL, MD5, download=download)
            extract_archive(archive, root)
            missing = [name for name in names if not (folder / name).is_file()]
            if missing:
                raise DataError(f"{archive} lacks {FOLDER}/{missing[0]}; delete it and pass --download")
        else:
            raise DataError(
                f"missing {folder / missing[0]}: put the CIFAR-10 python batches in {folder} "
                f"(extract {ARCHIVE} from {URL} into {root}), or pass --download"
            )

    batches = [load_batch(folder / name) for name in TRAIN_BATCHES]
    train_images = np.concatenate([b[0] for b in batches])
    train_labels = np.concatenate([b[1] for b in batches])
    del batches
    test_images, test_labels = load_batch(folder / TEST_BATCH)

    n_train = train_images.shape[0]
    if val_size >= n_train:
        raise TaskConfigError(f"task 'cifar10': val_size must be < {n_train} (the train images), got {val_size}")
    train_idx, val_idx = holdout_indices(n_train, val_size, seed)
    train_idx, val_idx = train_idx.numpy(), val_idx.numpy()

    return Task(
        name="cifar10",
        train=Split(_normalize(train_images[train_idx]), torch.from_numpy(train_labels[train_idx])),
        val=Split(_normalize(train_images[val_idx]), torch.from_numpy(train_labels[val_idx])),
        test=Split(_normalize(test_images), torch.from_numpy(test_labels.copy())),
        input_shape=(3, 32, 32),
        num_outputs=10,
    )
