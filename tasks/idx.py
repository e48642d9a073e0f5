"""``mnist``, ``fashion-mnist`` and ``mnist-t10k`` from the standard IDX files.

Files are looked up in ``<data_dir>/mnist/``, ``<data_dir>/fashion-mnist/`` and
``<data_dir>/mnist-t10k/`` (``data_dir`` defaults to the cache, see
:func:`tasks.download.cache_dir`); each file may be gzipped (``*.gz``, as
downloaded) or uncompressed.

``mnist-t10k`` is MNIST's 10,000 test images alone, split per class into train /
val / test (60 / 20 / 20 %, seeded): a small real-image task for machines that
hold only those two files. Its accuracies are not comparable with MNIST's.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from .base import Split, Task
from .download import ensure_file, resolve_root
from .errors import DataError, TaskConfigError
from .registry import check_int, register_task
from .splits import holdout_indices, stratified_indices

__all__ = ["read_idx", "load_idx_task", "load_t10k_task", "IDX_SETS", "IMAGES_MAGIC", "LABELS_MAGIC"]

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

#: Per data set: sub-directory, download base URL, md5 of each gzipped file, pixel mean/std.
IDX_SETS = {
    "mnist": {
        "base_url": "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "md5": {
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
        "mean": 0.1307,
        "std": 0.3081,
    },
    "fashion-mnist": {
        "base_url": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "md5": {
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
        "mean": 0.2860,
        "std": 0.3530,
    },
}


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """Parse an IDX file (``.gz`` or raw) of unsigned bytes; bad magic or size raises ``DataError``."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                data = handle.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read {path}: {' '.join(str(exc).split())}; replace the file") from None
    if len(data) < 4:
        raise DataError(f"corrupt IDX file {path}: only {len(data)} bytes; replace the file")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise DataError(f"corrupt IDX file {path}: magic 0x{found:08x}, expected 0x{magic:08x}; replace the file")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"corrupt IDX file {path}: truncated header; replace the file")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + math.prod(dims)
    if len(data) != expected:
        raise DataError(
            f"corrupt IDX file {path}: {len(data)} bytes for dims {dims}, expected {expected}; replace the file"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _locate(name: str, directory: Path, base: str, download: bool) -> Path:
    """``directory/base`` or ``directory/base.gz``; the ``.gz`` is downloaded if allowed."""
    for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    spec = IDX_SETS[name]
    gz = f"{base}.gz"
    url = spec["base_url"] + gz
    if not download:
        raise DataError(
            f"missing {directory / gz}: put '{gz}' (or the uncompressed '{base}') in {directory} "
            f"(from {url}), or pass --download"
        )
    return ensure_file(directory, gz, url, spec["md5"][gz], download=True)


def _read_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """28x28 images and their 0..9 labels, checked against each other."""
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{images_path} has {images.shape[0]} images but {labels_path} has {labels.shape[0]} labels; "
            "replace the files"
        )
    if images.shape[1:] != (28, 28):
        raise DataError(f"{images_path} holds {images.shape[1:]} images, expected 28x28")
    if labels.size and labels.max() > 9:
        raise DataError(f"{labels_path} has label {labels.max()}, expected 0..9")
    return images, labels


def _normalize(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    x = torch.from_numpy(images.astype(np.float32))  # a writable float32 copy
    x = x.div_(255.0).sub_(mean).div_(std)
    return x.unsqueeze(1)


def load_idx_task(name: str, data_dir=None, download: bool = False, seed: int = 0, val_size: int = 5000) -> Task:
    """Build ``mnist`` or ``fashion-mnist``: val = last ``val_size`` of a seeded permutation of train, test = t10k."""
    check_int(name, "val_size", val_size, 0)
    spec = IDX_SETS[name]
    directory = resolve_root(data_dir, download) / name
    paths = {key: _locate(name, directory, base, download) for key, base in FILES.items()}

    arrays = {}
    for part in ("train", "test"):
        arrays[part] = _read_pair(paths[f"{part}_images"], paths[f"{part}_labels"])

    n_train = arrays["train"][0].shape[0]
    if val_size >= n_train:
        raise TaskConfigError(f"task '{name}': val_size must be < {n_train} (the train images), got {val_size}")
    train_idx, val_idx = holdout_indices(n_train, val_size, seed)

    def split(images: np.ndarray, labels: np.ndarray, idx: np.ndarray | None = None) -> Split:
        if idx is not None:
            images, labels = images[idx], labels[idx]
        return Split(
            _normalize(images, spec["mean"], spec["std"]),
            torch.from_numpy(labels.astype(np.int64)),
        )

    train_images, train_labels = arrays["train"]
    return Task(
        name=name,
        train=split(train_images, train_labels, train_idx.numpy()),
        val=split(train_images, train_labels, val_idx.numpy()),
        test=split(*arrays["test"]),
        input_shape=(1, 28, 28),
        num_outputs=10,
    )


@register_task("mnist")
def build_mnist(data_dir=None, download: bool = False, seed: int = 0, val_size: int = 5000) -> Task:
    """MNIST from ``<data_dir>/mnist/``; pixels /255 then (x - 0.1307) / 0.3081."""
    return load_idx_task("mnist", data_dir=data_dir, download=download, seed=seed, val_size=val_size)


@register_task("fashion-mnist")
def build_fashion_mnist(data_dir=None, download: bool = False, seed: int = 0, val_size: int = 5000) -> Task:
    """Fashion-MNIST from ``<data_dir>/fashion-mnist/``; pixels /255 then (x - 0.2860) / 0.3530."""
    return load_idx_task("fashion-mnist", data_dir=data_dir, download=download, seed=seed, val_size=val_size)


def load_t10k_task(data_dir=None, download: bool = False, seed: int = 0, val_fraction: float = 0.2,
                   test_fraction: float = 0.2) -> Task:
    """``mnist-t10k`` (module docstring): the t10k files of ``<data_dir>/mnist-t10k/``, split per class."""
    name, spec = "mnist-t10k", IDX_SETS["mnist"]
    for key, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not isinstance(value, (int, float)) or not 0 < value < 1:
            raise TaskConfigError(f"task '{name}': {key} must be in (0, 1), got {value!r}")
    if val_fraction + test_fraction >= 1:
        raise TaskConfigError(f"task '{name}': val_fraction + test_fraction must be < 1")
    directory = resolve_root(data_dir, download) / name
    located = {}
    for key in ("test_images", "test_labels"):
        try:
            located[key] = _locate("mnist", directory, FILES[key], download)
        except DataError as err:
            raise DataError(f"task '{name}': {err}") from None
    images, labels = _read_pair(located["test_images"], located["test_labels"])
    x = _normalize(images, spec["mean"], spec["std"])
    y = torch.from_numpy(labels.astype(np.int64))
    parts = stratified_indices(y, (val_fraction, test_fraction), seed)
    train, val, test = (Split(x[idx], y[idx]) for idx in parts)
    return Task(name=name, train=train, val=val, test=test, input_shape=(1, 28, 28), num_outputs=10)


@register_task("mnist-t10k")
def build_mnist_t10k(data_dir=None, download: bool = False, seed: int = 0, val_fraction: float = 0.2,
                     test_fraction: float = 0.2) -> Task:
    """MNIST's 10,000 t10k images split into train / val / test (module docstring)."""
    return load_t10k_task(data_dir=data_dir, download=download, seed=seed, val_fraction=val_fraction,
                          test_fraction=test_fraction)
