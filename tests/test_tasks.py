"""Tests of the ``tasks`` package: registry, digits, teacher, IDX / CIFAR loaders, downloads.

Real data are never touched: the loaders read tiny files written here in the
real formats, and downloads use ``file://`` URLs or an unreachable local port.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch

from gradengines import tasks
from gradengines.tasks import DataError, Split, Task, TaskConfigError, available, build
from gradengines.tasks import cifar10 as cifar_mod
from gradengines.tasks import download as dl
from gradengines.tasks import idx as idx_mod

ALL_TASKS = {"digits", "teacher", "mnist", "fashion-mnist", "cifar10"}
IDX_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def one_line(message: str) -> bool:
    return "\n" not in message and "\r" not in message and message.strip() == message and message != ""


# ---------------------------------------------------------------- registry


def test_available_lists_all_tasks_sorted():
    names = available()
    assert ALL_TASKS <= set(names)
    assert names == sorted(names)


def test_unknown_task_names_it_and_lists_available():
    with pytest.raises(TaskConfigError) as info:
        build("imagenet-42")
    message = str(info.value)
    assert "'imagenet-42'" in message and "digits" in message and "cifar10" in message
    assert one_line(message)


def test_unknown_option_names_key_and_accepted_ones():
    with pytest.raises(TaskConfigError) as info:
        build("teacher", widht=3)
    message = str(info.value)
    assert "'widht'" in message and "hidden" in message and "seed" in message
    assert one_line(message)


@pytest.mark.parametrize(
    "name, options",
    [
        ("teacher", {"n_train": -1}),
        ("teacher", {"num_classes": 1}),
        ("teacher", {"hidden": 2.5}),
        ("digits", {"flatten": "no"}),
        ("digits", {"val_fraction": 1.5}),
        ("digits", {"seed": -3}),
        ("digits", {"download": "yes"}),
        ("mnist", {"val_size": -1}),
        ("cifar10", {"val_size": True}),
    ],
)
def test_bad_option_values_raise_one_line_config_error(name, options):
    with pytest.raises(TaskConfigError) as info:
        build(name, **options)
    message = str(info.value)
    assert one_line(message)
    assert next(iter(options)) in message


def test_register_task_requires_common_options_and_unique_names():
    with pytest.raises(TypeError):
        tasks.register_task("no-common-options")(lambda size=3: None)
    with pytest.raises(TaskConfigError):
        tasks.register_task("digits")(lambda data_dir=None, download=False, seed=0: None)
    assert "no-common-options" not in available()


# ---------------------------------------------------------------- base


def test_task_loss_metric_and_pickle():
    x = torch.randn(6, 4)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    split = Split(x, y)
    task = Task("toy", split, split, split, input_shape=(4,), num_outputs=3)
    assert task.in_features == 4 and task.metric_name == "accuracy"
    perfect = torch.nn.functional.one_hot(y, 3).float() * 10
    assert task.metric(perfect, y).dim() == 0
    assert task.metric(perfect, y).item() == 1.0
    assert task.metric(perfect.roll(1, dims=1), y).item() == 0.0
    assert task.loss_fn(perfect, y).item() < 1e-3
    assert torch.isclose(task.loss_fn(torch.zeros(6, 3), y), torch.log(torch.tensor(3.0)))
    again = pickle.loads(pickle.dumps(task))
    assert torch.equal(again.train.inputs, x) and again.loss_fn(perfect, y).item() < 1e-3


def test_split_rejects_wrong_dtypes_and_lengths():
    with pytest.raises(ValueError):
        Split(torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError):
        Split(torch.zeros(3, 2), torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError):
        Split(torch.zeros(3, 2), torch.zeros(4, dtype=torch.int64))


# ---------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits():
    return build("digits")


def _rows(t: torch.Tensor) -> set:
    return {tuple(r) for r in t.reshape(len(t), -1).tolist()}


def test_digits_split_sizes_shapes_and_classes(digits):
    assert len(digits.train) + len(digits.val) + len(digits.test) == 1797
    assert abs(len(digits.train) / 1797 - 0.7) < 0.01
    assert abs(len(digits.val) / 1797 - 0.1) < 0.01
    assert abs(len(digits.test) / 1797 - 0.2) < 0.01
    assert digits.input_shape == (64,) and digits.in_features == 64 and digits.num_outputs == 10
    for split in (digits.train, digits.val, digits.test):
        assert split.inputs.dtype == torch.float32 and split.targets.dtype == torch.int64
        assert split.inputs.shape[1:] == (64,)
    assert set(digits.train.targets.tolist()) == set(range(10))
    assert set(digits.test.targets.tolist()) == set(range(10))


def test_digits_splits_do_not_overlap(digits):
    train, val, test = (_rows(s.inputs) for s in (digits.train, digits.val, digits.test))
    assert len(train) == len(digits.train)  # the 1797 digits are distinct rows
    assert not train & val and not train & test and not val & test


def test_digits_train_standardized(digits):
    x = digits.train.inputs
    assert x.mean(dim=0).abs().max() < 1e-4
    std = x.std(dim=0)
    # std is 1, except below 1 where the train std was under the floor (e.g. constant pixels)
    assert (std <= 1 + 1e-4).all()
    assert ((std - 1).abs() < 1e-4).sum() >= 55
    assert x.isfinite().all() and digits.test.inputs.isfinite().all()


def test_digits_deterministic_per_seed(digits):
    again = build("digits", seed=0)
    assert torch.equal(again.train.inputs, digits.train.inputs)
    assert torch.equal(again.test.targets, digits.test.targets)
    other = build("digits", seed=1)
    assert not torch.equal(other.train.targets, digits.train.targets)
    assert not torch.equal(other.train.inputs.mean(dim=0), digits.train.inputs.mean(dim=0)) or not torch.equal(
        other.test.inputs, digits.test.inputs
    )
    # stratified: the class counts of each split do not depend on the seed
    for a, b in ((other.train, digits.train), (other.val, digits.val), (other.test, digits.test)):
        assert torch.equal(torch.bincount(a.targets, minlength=10), torch.bincount(b.targets, minlength=10))


def test_digits_loss_and_metric(digits):
    y = digits.train.targets
    perfect = torch.nn.functional.one_hot(y, 10).float() * 5
    assert digits.metric(perfect, y).item() == 1.0
    logits = torch.randn(len(y), 10)
    loss = digits.loss_fn(logits, y)
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_digits_are_scikit_learns_rows_read_from_its_file(digits):
    """The task reads sklearn's digits file itself (no sklearn import at start): the same 1797 rows and classes as
    ``load_digits``, in its order, so a split holds the rows sklearn would have given."""
    from sklearn.datasets import load_digits

    from gradengines.tasks.digits import _read_digits

    reference = load_digits()
    pixels, classes = _read_digits()
    assert np.array_equal(pixels, reference.data) and np.array_equal(classes, reference.target)
    every = torch.cat([digits.train.targets, digits.val.targets, digits.test.targets])
    assert torch.equal(torch.bincount(every), torch.as_tensor(np.bincount(reference.target)))


def test_digits_kept_elsewhere_by_scikit_learn_come_from_load_digits(monkeypatch, digits):
    from gradengines.tasks import digits as digits_mod

    monkeypatch.setattr(digits_mod, "digits_file", lambda: None)
    digits_mod._read_digits.cache_clear()
    try:
        again = build("digits")
    finally:
        digits_mod._read_digits.cache_clear()
    assert torch.equal(again.train.inputs, digits.train.inputs) and torch.equal(again.test.targets, digits.test.targets)


def test_digits_without_scikit_learn_is_one_line(monkeypatch):
    from gradengines.tasks import digits as digits_mod

    monkeypatch.setattr(digits_mod.importlib.util, "find_spec", lambda name: None)
    digits_mod._read_digits.cache_clear()
    try:
        with pytest.raises(TaskConfigError, match="pip install scikit-learn") as error:
            build("digits")
    finally:
        digits_mod._read_digits.cache_clear()
    assert one_line(str(error.value))


def test_digits_unflattened_shape():
    task = build("digits", flatten=False)
    assert task.input_shape == (1, 8, 8) and task.in_features == 64
    assert task.train.inputs.shape[1:] == (1, 8, 8)


# ---------------------------------------------------------------- teacher


def test_teacher_shapes_classes_and_determinism():
    task = build("teacher", in_features=12, num_classes=5, n_train=300, n_val=50, n_test=70, hidden=16, seed=3)
    assert task.input_shape == (12,) and task.num_outputs == 5
    assert [len(task.train), len(task.val), len(task.test)] == [300, 50, 70]
    assert task.train.inputs.shape == (300, 12) and task.train.inputs.dtype == torch.float32
    counts = torch.bincount(task.train.targets, minlength=5)
    assert (counts > 0).all() and counts.max() < 300 * 0.6
    again = build("teacher", in_features=12, num_classes=5, n_train=300, n_val=50, n_test=70, hidden=16, seed=3)
    assert torch.equal(again.train.inputs, task.train.inputs) and torch.equal(again.test.targets, task.test.targets)
    other = build("teacher", in_features=12, num_classes=5, n_train=300, n_val=50, n_test=70, hidden=16, seed=4)
    assert not torch.equal(other.train.inputs, task.train.inputs)


def test_teacher_defaults_all_classes_present():
    task = build("teacher")
    assert [len(task.train), len(task.val), len(task.test)] == [2048, 512, 512]
    assert set(task.train.targets.tolist()) == set(range(10))
    assert task.train.targets.max().item() < task.num_outputs


def test_teacher_labels_are_learnable():
    task = build("teacher", seed=0)

    def with_bias(x):
        return torch.cat([x, torch.ones(len(x), 1)], dim=1)

    # least-squares linear classifier on one-hot targets: far above chance (0.1) if labels follow the teacher
    targets = torch.nn.functional.one_hot(task.train.targets, task.num_outputs).float()
    weights = torch.linalg.lstsq(with_bias(task.train.inputs), targets).solution
    acc = task.metric(with_bias(task.test.inputs) @ weights, task.test.targets).item()
    assert acc > 0.45
    shuffled = task.train.targets[torch.randperm(len(task.train), generator=torch.Generator().manual_seed(0))]
    one_hot = torch.nn.functional.one_hot(shuffled, 10).float()
    weights = torch.linalg.lstsq(with_bias(task.train.inputs), one_hot).solution
    assert task.metric(with_bias(task.test.inputs) @ weights, task.test.targets).item() < 0.3


def test_teacher_too_few_train_samples_for_classes():
    with pytest.raises(TaskConfigError):
        build("teacher", num_classes=10, n_train=5)


# ---------------------------------------------------------------- IDX (MNIST, Fashion-MNIST)


def write_idx(path, array: np.ndarray, magic: int, gz: bool) -> None:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if gz:
        with gzip.open(f"{path}.gz", "wb") as f:
            f.write(payload)
    else:
        with open(path, "wb") as f:
            f.write(payload)


def make_idx_set(directory, n_train=30, n_test=10, gz=True, seed=0):
    """Tiny IDX files; image i of a part has pixel [0, 0] = i so it can be traced back."""
    rng = np.random.RandomState(seed)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for part, n in (("train", n_train), ("t10k", n_test)):
        images = rng.randint(0, 256, size=(n, 28, 28)).astype(np.uint8)
        images[:, 0, 0] = np.arange(n)
        labels = rng.randint(0, 10, size=n).astype(np.uint8)
        write_idx(directory / f"{part}-images-idx3-ubyte", images, 0x803, gz)
        write_idx(directory / f"{part}-labels-idx1-ubyte", labels, 0x801, gz)
        out[part] = (images, labels)
    return out


def expected_idx(images: np.ndarray, name: str) -> torch.Tensor:
    spec = idx_mod.IDX_SETS[name]
    return ((torch.from_numpy(images).float() / 255 - spec["mean"]) / spec["std"]).unsqueeze(1)


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_task_round_trip(tmp_path, name, gz):
    raw = make_idx_set(tmp_path / name, gz=gz)
    task = build(name, data_dir=tmp_path, val_size=10, seed=1)
    assert task.input_shape == (1, 28, 28) and task.num_outputs == 10 and task.in_features == 784
    assert [len(task.train), len(task.val), len(task.test)] == [20, 10, 10]
    images, labels = raw["train"]
    seen = []
    for split in (task.train, task.val):
        assert split.inputs.dtype == torch.float32 and split.targets.dtype == torch.int64
        assert split.inputs.shape[1:] == (1, 28, 28)
        spec = idx_mod.IDX_SETS[name]
        index = torch.round((split.inputs[:, 0, 0, 0] * spec["std"] + spec["mean"]) * 255).long()
        seen.append(set(index.tolist()))
        torch.testing.assert_close(split.inputs, expected_idx(images[index.numpy()], name))
        assert torch.equal(split.targets, torch.from_numpy(labels[index.numpy()].astype(np.int64)))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(30))
    test_images, test_labels = raw["t10k"]
    torch.testing.assert_close(task.test.inputs, expected_idx(test_images, name))
    assert torch.equal(task.test.targets, torch.from_numpy(test_labels.astype(np.int64)))


def test_idx_val_split_depends_on_seed_only(tmp_path):
    make_idx_set(tmp_path / "mnist")
    a = build("mnist", data_dir=tmp_path, val_size=10, seed=0)
    b = build("mnist", data_dir=tmp_path, val_size=10, seed=0)
    c = build("mnist", data_dir=tmp_path, val_size=10, seed=5)
    assert torch.equal(a.val.inputs, b.val.inputs)
    assert not torch.equal(a.val.inputs, c.val.inputs)


def test_idx_val_size_must_be_below_train_size(tmp_path):
    make_idx_set(tmp_path / "mnist")
    with pytest.raises(TaskConfigError) as info:
        build("mnist", data_dir=tmp_path, val_size=30)
    assert "val_size" in str(info.value) and one_line(str(info.value))


def test_idx_missing_file_names_it_and_the_directory(tmp_path):
    make_idx_set(tmp_path / "mnist")
    os.remove(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DataError) as info:
        build("mnist", data_dir=tmp_path, val_size=10)
    message = str(info.value)
    assert one_line(message)
    assert "t10k-labels-idx1-ubyte" in message and str(tmp_path / "mnist") in message
    assert "--download" in message


def test_mnist_t10k_splits_the_test_files_per_class_into_three_disjoint_splits(tmp_path):
    raw = make_idx_set(tmp_path / "mnist-t10k", n_train=1, n_test=200)
    (tmp_path / "mnist-t10k" / "train-images-idx3-ubyte.gz").unlink()  # it needs the t10k files only
    (tmp_path / "mnist-t10k" / "train-labels-idx1-ubyte.gz").unlink()
    task = build("mnist-t10k", data_dir=tmp_path, seed=3)
    assert task.input_shape == (1, 28, 28) and task.num_outputs == 10
    images, labels = raw["t10k"]
    seen = []
    for split in (task.train, task.val, task.test):
        index = torch.round((split.inputs[:, 0, 0, 0] * 0.3081 + 0.1307) * 255).long()
        seen.append(set(index.tolist()))
        torch.testing.assert_close(split.inputs, expected_idx(images[index.numpy()], "mnist"))
        assert torch.equal(split.targets, torch.from_numpy(labels[index.numpy()].astype(np.int64)))
    assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    assert seen[0] | seen[1] | seen[2] == set(range(200))
    assert abs(len(task.val) - 40) <= 10 and abs(len(task.test) - 40) <= 10  # 20 % each, rounded per class
    assert torch.equal(build("mnist-t10k", data_dir=tmp_path, seed=3).val.inputs, task.val.inputs)
    assert not torch.equal(build("mnist-t10k", data_dir=tmp_path, seed=4).val.inputs, task.val.inputs)
    for bad in ({"val_fraction": 0}, {"test_fraction": 1.5}, {"val_fraction": 0.5, "test_fraction": 0.5}):
        with pytest.raises(TaskConfigError) as info:
            build("mnist-t10k", data_dir=tmp_path, **bad)
        assert one_line(str(info.value))
    os.remove(tmp_path / "mnist-t10k" / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DataError) as info:
        build("mnist-t10k", data_dir=tmp_path)
    assert one_line(str(info.value)) and "t10k-labels-idx1-ubyte" in str(info.value)


def test_nonexistent_data_dir_raises_data_error(tmp_path):
    for name in ("mnist", "fashion-mnist", "cifar10"):
        with pytest.raises(DataError) as info:
            build(name, data_dir=tmp_path / "nope")
        assert str(tmp_path / "nope") in str(info.value) and one_line(str(info.value))


@pytest.mark.parametrize("gz", [True, False], ids=["gz", "raw"])
def test_idx_bad_magic_names_the_file(tmp_path, gz):
    make_idx_set(tmp_path / "mnist", gz=gz)
    bad = np.zeros((30, 28, 28), np.uint8)
    write_idx(tmp_path / "mnist" / "train-images-idx3-ubyte", bad, 0x801 | 0x0300 | 0x1000, gz)
    with pytest.raises(DataError) as info:
        build("mnist", data_dir=tmp_path, val_size=10)
    assert "train-images-idx3-ubyte" in str(info.value) and "magic" in str(info.value)
    assert one_line(str(info.value))


def test_idx_truncated_and_bad_gzip_raise_data_error(tmp_path):
    make_idx_set(tmp_path / "mnist", gz=False)
    path = tmp_path / "mnist" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataError) as info:
        build("mnist", data_dir=tmp_path, val_size=10)
    assert str(path) in str(info.value)
    path.unlink()
    (tmp_path / "mnist" / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError) as info:
        build("mnist", data_dir=tmp_path, val_size=10)
    assert "train-images-idx3-ubyte.gz" in str(info.value) and one_line(str(info.value))


def test_idx_download_via_file_urls(tmp_path, monkeypatch):
    source = tmp_path / "mirror"
    raw = make_idx_set(source, gz=True)
    md5s = {f"{base}.gz": hashlib.md5((source / f"{base}.gz").read_bytes()).hexdigest() for base in IDX_FILES}
    monkeypatch.setitem(idx_mod.IDX_SETS["mnist"], "base_url", source.as_uri() + "/")
    monkeypatch.setitem(idx_mod.IDX_SETS["mnist"], "md5", md5s)
    cache = tmp_path / "cache"
    task = build("mnist", data_dir=cache, download=True, val_size=10)
    assert sorted(p.name for p in (cache / "mnist").iterdir()) == sorted(md5s)
    assert torch.equal(task.test.targets, torch.from_numpy(raw["t10k"][1].astype(np.int64)))


# ---------------------------------------------------------------- CIFAR-10


def make_cifar(root, per_batch=6, n_test=10, seed=0):
    """Tiny CIFAR-10 python batches; image i has red pixel [0, 0] = i."""
    rng = np.random.RandomState(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    n_train = 5 * per_batch
    data = rng.randint(0, 256, size=(n_train + n_test, 3072)).astype(np.uint8)
    data[:n_train, 0] = np.arange(n_train)
    data[n_train:, 0] = np.arange(n_test)
    labels = rng.randint(0, 10, size=n_train + n_test)
    for i in range(5):
        sl = slice(i * per_batch, (i + 1) * per_batch)
        batch = {b"batch_label": b"training batch", b"data": data[sl], b"labels": labels[sl].tolist()}
        with open(folder / f"data_batch_{i + 1}", "wb") as f:
            pickle.dump(batch, f, protocol=2)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": data[n_train:], b"labels": labels[n_train:].tolist()}, f, protocol=2)
    return data, labels, n_train


def expected_cifar(rows: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(rows).float().reshape(-1, 3, 32, 32) / 255
    mean = torch.tensor(cifar_mod.MEAN).view(1, 3, 1, 1)
    std = torch.tensor(cifar_mod.STD).view(1, 3, 1, 1)
    return (x - mean) / std


def check_cifar_task(task, data, labels, n_train):
    assert task.input_shape == (3, 32, 32) and task.num_outputs == 10 and task.in_features == 3072
    assert [len(task.train), len(task.val), len(task.test)] == [n_train - 10, 10, 10]
    seen = []
    for split in (task.train, task.val):
        assert split.inputs.dtype == torch.float32 and split.targets.dtype == torch.int64
        red = split.inputs[:, 0, 0, 0] * cifar_mod.STD[0] + cifar_mod.MEAN[0]
        index = torch.round(red * 255).long().numpy()
        seen.append(set(index.tolist()))
        torch.testing.assert_close(split.inputs, expected_cifar(data[index]))
        assert torch.equal(split.targets, torch.from_numpy(labels[index].astype(np.int64)))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(n_train))
    torch.testing.assert_close(task.test.inputs, expected_cifar(data[n_train:]))
    assert torch.equal(task.test.targets, torch.from_numpy(labels[n_train:].astype(np.int64)))


def test_cifar10_round_trip(tmp_path):
    data, labels, n_train = make_cifar(tmp_path)
    task = build("cifar10", data_dir=tmp_path, val_size=10)
    check_cifar_task(task, data, labels, n_train)


def test_cifar10_extracts_local_archive_offline(tmp_path):
    staging = tmp_path / "staging"
    data, labels, n_train = make_cifar(staging)
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(staging / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    task = build("cifar10", data_dir=root, val_size=10)
    check_cifar_task(task, data, labels, n_train)
    assert not [p for p in (root / "cifar-10-batches-py").iterdir() if p.name.endswith(".part")]


def test_cifar10_download_via_file_url(tmp_path, monkeypatch):
    staging = tmp_path / "staging"
    data, labels, n_train = make_cifar(staging)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with tarfile.open(mirror / "cifar-10-python.tar.gz", "w:gz") as tar:
        tar.add(staging / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    archive = mirror / "cifar-10-python.tar.gz"
    monkeypatch.setattr(cifar_mod, "URL", archive.as_uri())
    monkeypatch.setattr(cifar_mod, "MD5", hashlib.md5(archive.read_bytes()).hexdigest())
    cache = tmp_path / "cache"
    task = build("cifar10", data_dir=cache, download=True, val_size=10)
    check_cifar_task(task, data, labels, n_train)
    monkeypatch.setattr(cifar_mod, "MD5", "0" * 32)
    with pytest.raises(DataError):
        build("cifar10", data_dir=tmp_path / "cache2", download=True, val_size=10)
    assert not (tmp_path / "cache2" / "cifar-10-python.tar.gz").exists()


@pytest.mark.parametrize("member", ["../evil", "/tmp/evil_abs", "cifar-10-batches-py/../../evil"])
def test_cifar10_archive_with_unsafe_path_is_rejected(tmp_path, member):
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(root / "cifar-10-python.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(DataError) as exc:
        build("cifar10", data_dir=root)
    assert member in str(exc.value) and one_line(str(exc.value))
    assert not (tmp_path / "evil").exists() and not os.path.exists("/tmp/evil_abs")


def test_cifar10_missing_batch_names_file_and_directory(tmp_path):
    make_cifar(tmp_path)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(DataError) as info:
        build("cifar10", data_dir=tmp_path, val_size=10)
    message = str(info.value)
    assert "data_batch_3" in message and str(tmp_path / "cifar-10-batches-py") in message and one_line(message)


def test_cifar10_corrupt_or_malicious_batch(tmp_path):
    make_cifar(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(b"garbage")
    with pytest.raises(DataError) as info:
        build("cifar10", data_dir=tmp_path, val_size=10)
    assert "test_batch" in str(info.value) and one_line(str(info.value))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path.write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError) as info:
        build("cifar10", data_dir=tmp_path, val_size=10)
    assert "not allowed" in str(info.value)


# ---------------------------------------------------------------- download helper


def test_cache_dir_rules(tmp_path, monkeypatch):
    assert dl.cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv("GRADENGINES_DATA", str(tmp_path / "env"))
    assert dl.cache_dir() == tmp_path / "env"
    monkeypatch.delenv("GRADENGINES_DATA")
    assert dl.cache_dir().parts[-2:] == (".cache", "gradengines")


def test_ensure_file_missing_offline(tmp_path):
    with pytest.raises(DataError) as info:
        dl.ensure_file(tmp_path, "thing.bin", "https://example.org/thing.bin", None, download=False)
    message = str(info.value)
    assert str(tmp_path / "thing.bin") in message and "https://example.org/thing.bin" in message
    assert "--download" in message and one_line(message)


def _source(tmp_path, payload=b"payload bytes " * 1000):
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(payload)
    return (src / "blob.bin").as_uri(), hashlib.md5(payload).hexdigest(), payload


def test_ensure_file_downloads_atomically_with_good_md5(tmp_path):
    url, md5, payload = _source(tmp_path)
    dest = tmp_path / "dest" / "sub"
    path = dl.ensure_file(dest, "blob.bin", url, md5, download=True)
    assert path == dest / "blob.bin" and path.read_bytes() == payload
    assert [p.name for p in dest.iterdir()] == ["blob.bin"]
    # present file is returned without downloading again, even with a dead URL
    assert dl.ensure_file(dest, "blob.bin", "http://127.0.0.1:9/x", md5, download=True) == path


def test_ensure_file_md5_mismatch_leaves_nothing(tmp_path):
    url, _, _ = _source(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(DataError) as info:
        dl.ensure_file(dest, "blob.bin", url, "0" * 32, download=True)
    assert "md5" in str(info.value) and one_line(str(info.value))
    assert list(dest.iterdir()) == []


def test_ensure_file_verify_present_file(tmp_path):
    (tmp_path / "blob.bin").write_bytes(b"abc")
    with pytest.raises(DataError) as info:
        dl.ensure_file(tmp_path, "blob.bin", "https://example.org/blob.bin", "0" * 32, download=False, verify=True)
    assert str(tmp_path / "blob.bin") in str(info.value)
    good = hashlib.md5(b"abc").hexdigest()
    assert dl.ensure_file(tmp_path, "blob.bin", "x", good, download=False, verify=True).read_bytes() == b"abc"


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x", "file:///definitely/not/here.bin", "nope://x"])
def test_ensure_file_unreachable_url(tmp_path, url):
    with pytest.raises(DataError) as info:
        dl.ensure_file(tmp_path, "x.bin", url, None, download=True)
    message = str(info.value)
    assert message.startswith(f"could not download {url}") and "by hand" in message and one_line(message)
    assert list(tmp_path.iterdir()) == []
