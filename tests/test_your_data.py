"""The user's own data (issue 48): map-style Datasets and DataLoaders (``tasks.from_datasets``), dict batches,
memory-mapped token files (the ``tokens`` task), ``--task FILE.py:factory``, and their bad inputs."""

import json
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import Crash, CrashingBackprop, one_line_error
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from gradengines import models, tasks, trainers
from gradengines.tasks.base import Split
from gradengines.tasks.errors import TaskConfigError
from gradengines.tasks.tokens import RandomStarts
from gradengines.trainers.cli import train_main
from gradengines.trainers.engines.backprop import Backprop
from gradengines.trainers.run.checkpoint import load_checkpoint
from gradengines.trainers.run.logger import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TOKEN_FILE = runpy.run_path(str(ROOT / "scripts" / "token_file.py"))  # its main(argv), in this process


def features(n=96, d=8, classes=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    return x, (x[:, :classes].argmax(1)).long()


class Pairs(Dataset):
    """A map-style dataset as users write one: items (numpy features, int label)."""

    def __init__(self, x, y):
        self.x, self.y = x.numpy(), y.tolist()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Sentences(Dataset):
    """Dict items of varying length (token ids, a label), padded by ``pad`` into input_ids + attention_mask."""

    def __init__(self, n, seed, vocab=20, classes=2):
        gen = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            ids = torch.randint(1, vocab, (int(torch.randint(2, 7, (1,), generator=gen)),), generator=gen)
            self.items.append({"input_ids": ids, "labels": int(ids[0] % classes)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def pad(items, filler=0, length=6):
    ids = torch.full((len(items), length), filler, dtype=torch.long)
    mask = torch.zeros(len(items), length, dtype=torch.long)
    for row, item in enumerate(items):
        ids[row, :len(item["input_ids"])] = item["input_ids"]
        mask[row, :len(item["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask}, torch.tensor([item["labels"] for item in items])


class MaskedMean(nn.Module):
    """Embeds token ids and averages the unmasked positions: reads both named inputs."""

    def __init__(self, vocab=20, width=8, classes=2):
        super().__init__()
        self.embed, self.hidden = nn.Embedding(vocab, width), nn.Linear(width, width)
        self.out = nn.Linear(width, classes)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask[..., None].to(self.embed.weight.dtype)
        h = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        return self.out(torch.tanh(self.hidden(h)))


def without_timing(records):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in records]


def three(x, y, cut=(64, 80)):
    return (x[:cut[0]], y[:cut[0]]), (x[cut[0]:cut[1]], y[cut[0]:cut[1]]), (x[cut[1]:], y[cut[1]:])


# --------------------------------------------------------------------------------------------- map-style data
def test_a_dataset_trains_exactly_as_the_same_tensors_do_under_every_mlp_engine():
    """The data path changes nothing: a Dataset of numpy items, a DataLoader over it and the tensors themselves
    give the same metrics and weights for every trainer of the orthogonal MLP (same seed)."""
    x, y = features()
    parts = three(x, y)
    as_tensors = tasks.Task("data", *(Split(a, b) for a, b in parts), input_shape=(8,), num_outputs=3)
    as_datasets = tasks.from_datasets(*(Pairs(a, b) for a, b in parts))
    as_loaders = tasks.from_datasets(*(DataLoader(Pairs(a, b), batch_size=5) for a, b in parts))
    assert (as_datasets.input_shape, as_datasets.num_outputs) == ((8,), 3)  # read from the items and labels
    assert as_datasets.fingerprint == as_loaders.fingerprint != tasks.from_datasets(
        *(Pairs(a, b) for a, b in three(x.flip(0), y.flip(0)))).fingerprint
    assert_same_runs_under_every_mlp_engine([as_tensors, as_datasets, as_loaders], steps=5)


MLP_ENGINES = ("backprop", "fa", "dfa", "usf", "brsf", "frsf", "pepita", "foton")


def assert_same_runs_under_every_mlp_engine(tasks_, steps):
    """Each engine of the orthogonal MLP, from the same seed, on each task: the same records, report and weights."""
    for engine in MLP_ENGINES:
        runs = []
        for task in tasks_:
            torch.manual_seed(0)
            model = models.build("mlp", in_features=8, out_features=3, depth=2, width=8, activation="tanh",
                                 orthogonal="bjorck")
            trainer = trainers.Trainer(model, trainers.build_engine(engine), task, batch_size=16, log_every=1,
                                       eval_every=2, progress=False, lr=0.05)
            report = trainer.fit(steps=steps)
            runs.append((without_timing(trainer.history), report, [p.detach().clone() for p in model.parameters()]))
        for other in runs[1:]:
            assert other[0] == runs[0][0] and other[1] == runs[0][1], engine
            assert all(torch.equal(a, b) for a, b in zip(runs[0][2], other[2], strict=True)), engine




def resumes_exactly(tmp_path, task, build_model, batch_size=8, steps=12):
    """A run killed after step 10 and resumed from its step-9 checkpoint by a fresh Trainer (weights perturbed,
    global RNG reseeded) writes the uninterrupted run's metrics and ends with its weights."""
    options = dict(batch_size=batch_size, log_every=1, eval_every=4, eval_batches=1, eval_batch_size=4,
                   checkpoint_every=3, progress=False, lr=0.05)

    def make(where, engine):
        torch.manual_seed(0)
        return trainers.Trainer(build_model(), engine, task, logdir=tmp_path / where, **options)

    whole = make("whole", Backprop())
    whole.fit(steps=steps)
    with pytest.raises(Crash):
        make("resumed", CrashingBackprop(crash_at=10)).fit(steps=steps)
    killed = tmp_path / "resumed" / "default" / "backprop" / "seed0"
    assert 0 < load_checkpoint(killed / "checkpoint.pt")["step"] < max(r["step"] for r in read_metrics(killed))
    resumed = make("resumed", Backprop())
    with torch.no_grad():
        for p in resumed.model.parameters():
            p.add_(0.1)
    torch.manual_seed(123)
    resumed.fit(steps=steps, resume=True)
    assert without_timing(read_metrics(resumed.run_dir)) == without_timing(read_metrics(whole.run_dir))
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_dataset_run_resumes_exactly(tmp_path):
    x, y = features()
    task = tasks.from_datasets(*(Pairs(a, b) for a, b in three(x, y)))
    resumes_exactly(tmp_path, task, lambda: nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)))


def test_a_dict_batch_dataset_trains_resumes_and_masks_its_padding(tmp_path):
    """Named inputs reach the model by keyword; the padding, masked by attention_mask, does not reach the loss
    or the gradient (float64), while the same padding unmasked does (the contrast)."""
    task = tasks.from_datasets(Sentences(48, 0), Sentences(12, 1), Sentences(12, 2), collate=pad)
    assert task.input_shape == (6,) and task.num_outputs == 2
    resumes_exactly(tmp_path, task, MaskedMean)
    torch.manual_seed(0)
    model = MaskedMean().double()
    items = [Sentences(8, 3)[i] for i in range(8)]

    def loss_and_grads(inputs, targets):
        model.zero_grad()
        out = trainers.build_engine("backprop").compute_grads(model, inputs, targets, task.loss_fn)
        return out.loss, [p.grad.clone() for p in model.parameters()]

    (inputs, targets), (refilled, _) = pad(items), pad(items, filler=7)
    assert not torch.equal(inputs["input_ids"], refilled["input_ids"])
    loss, grads = loss_and_grads(inputs, targets)
    loss_refilled, grads_refilled = loss_and_grads(refilled, targets)
    assert loss == loss_refilled and all(torch.equal(a, b) for a, b in zip(grads, grads_refilled, strict=True))
    unmasked = {**refilled, "attention_mask": torch.ones_like(refilled["attention_mask"])}
    assert not torch.allclose(loss_and_grads(unmasked, targets)[0], loss)


# ------------------------------------------------------------------------------------------------------ streams
class Shuffled(IterableDataset):
    """A stream without a length that reshuffles itself by epoch (``set_epoch``), as users' streams do; counts
    the items it yields."""

    def __init__(self, x, y):
        self.x, self.y, self.epoch, self.yielded = x, y, 0, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def order(self, epoch):
        return torch.randperm(len(self.y), generator=torch.Generator().manual_seed(epoch))

    def __iter__(self):
        for i in self.order(self.epoch).tolist():
            self.yielded += 1
            yield self.x[i], self.y[i]


class StatefulShuffled(Shuffled):
    """The same stream with a position of its own (``state_dict``/``load_state_dict``, torchdata's protocol):
    a loaded state applies to the next iteration."""

    def __init__(self, x, y):
        super().__init__(x, y)
        self.offset = self._next = 0

    def state_dict(self):
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state):
        self._next = state["offset"]

    def __iter__(self):
        self.offset, self._next = self._next, 0
        for i in self.order(self.epoch)[self.offset:].tolist():
            self.offset += 1
            self.yielded += 1
            yield self.x[i], self.y[i]


def streamed(kind, x, y):
    """Training items (x, y) as a stream of ``kind``: plain, stateful, or a Hugging Face IterableDataset."""
    if kind == "hf":
        datasets = pytest.importorskip("datasets")
        return datasets.Dataset.from_dict({"x": x.tolist(), "label": y.tolist()}).to_iterable_dataset(num_shards=2)
    return {"plain": Shuffled, "stateful": StatefulShuffled}[kind](x, y)


def pairs_of(items):
    """The collate of a Hugging Face stream's dict items {x, label}."""
    return torch.tensor([item["x"] for item in items]), torch.tensor([item["label"] for item in items])


def stream_task(kind, n=20):
    x, y = features(n=n + 32)
    (a, b), (c, d), (e, f) = three(x, y, cut=(n, n + 16))
    train = streamed(kind, a, b)  # a Hugging Face stream through a DataLoader: its collate_fn, for it alone
    return tasks.from_datasets(DataLoader(train, collate_fn=pairs_of) if kind == "hf" else train, Pairs(c, d),
                               Pairs(e, f), num_outputs=3)


def test_a_stream_is_read_in_its_own_order_pass_after_pass_into_full_batches():
    """Batch s is items s*B..(s+1)*B-1 of the stream's passes laid end to end (each pass reshuffled through
    set_epoch): backprop + plain SGD on the stream equals the same update written by hand on those batches,
    float64; 20 items in batches of 8, so batches straddle passes."""
    x, y = features(n=20)
    stream = Shuffled(x.double(), y)
    task = tasks.from_datasets(stream, Pairs(x, y), Pairs(x, y), num_outputs=3)
    passes = torch.cat([stream.order(epoch) for epoch in range(4)])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    by_hand = [p.detach().clone().requires_grad_() for p in model.parameters()]
    trainer = trainers.Trainer(model, trainers.build_engine("backprop"), task, batch_size=8, optimizer="sgd",
                               momentum=0.0, lr=0.1, dtype="float64", progress=False, log_every=1)
    trainer.fit(steps=7)
    for step in range(7):
        rows = passes[step * 8:(step + 1) * 8]
        h = torch.tanh(x.double()[rows] @ by_hand[0].T + by_hand[1])
        loss = task.loss_fn(h @ by_hand[2].T + by_hand[3], y[rows])
        grads = torch.autograd.grad(loss, by_hand)
        with torch.no_grad():
            for p, g in zip(by_hand, grads, strict=True):
                p -= 0.1 * g
        assert trainer.history[step]["train/loss"] == pytest.approx(loss.item(), rel=1e-12)
    for a, b in zip(model.parameters(), by_hand, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert trainer.history[-1]["samples"] == 56 and trainer.history[-1]["epoch"] is None  # no length: no epochs


def test_streams_train_alike_under_every_mlp_engine_whether_they_keep_a_state_or_not():
    """A plain stream, one with a state of its own and a Hugging Face IterableDataset of the same items in the
    same order give the same metrics and weights for every trainer of the orthogonal MLP."""
    pytest.importorskip("datasets")
    x, y = features(n=20)
    order = torch.cat([Shuffled(x, y).order(0)] * 3)  # Hugging Face's stream does not reshuffle: one order
    plain = tasks.from_datasets(ListStream(x[order], y[order]), Pairs(x, y), Pairs(x, y), num_outputs=3)
    hf = tasks.from_datasets(DataLoader(streamed("hf", x[order], y[order]), collate_fn=pairs_of), Pairs(x, y),
                             Pairs(x, y), num_outputs=3)
    assert_same_runs_under_every_mlp_engine([plain, hf], steps=3)


class ListStream(IterableDataset):
    """Items in one fixed order, every pass."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y.tolist(), strict=True))


@pytest.mark.parametrize("kind", ["plain", "stateful", "hf"])
def test_a_stream_run_resumes_exactly_from_its_position(tmp_path, kind):
    """Killed at step 10 and resumed from step 9 (the position mid-pass of the fourth pass): the uninterrupted
    run's metrics and weights; a stream with a state of its own is put at its position, not read again (the
    resumed fit reads only the items of the steps it trains)."""
    task = stream_task(kind)
    resumes_exactly(tmp_path, task, lambda: nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)))
    if kind != "hf":
        # the head (one pass of 20), the whole run, the killed one (batches of steps 0..10), the resumed steps
        read = 20 + 12 * 8 + 11 * 8 + 3 * 8
        replayed = 9 * 8 % 20  # the items of the fourth pass before the step-9 checkpoint: read again if stateless
        assert task.train.dataset.yielded == read + (0 if kind == "stateful" else replayed), kind


# ------------------------------------------------------------------------------------------------- token files
def write_corpus(folder: Path, words=400, seed=0) -> Path:
    """A PTB-format corpus of made-up sentences (three files)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lexicon = [f"w{i}" for i in range(30)]
    for name, count in (("ptb.train.txt", words), ("ptb.valid.txt", words // 4), ("ptb.test.txt", words // 4)):
        lines = [" ".join(rng.choice(lexicon, size=int(rng.integers(3, 9)))) for _ in range(count // 5)]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def token_files(tmp_path, *extra) -> Path:
    text = write_corpus(tmp_path / "text")
    out = tmp_path / "bin"
    TOKEN_FILE["main"](["--train", str(text / "ptb.train.txt"), "--val", str(text / "ptb.valid.txt"), *extra,
                        "--out", str(out)])
    return out


def test_token_files_hold_ptb_words_windows_and_draw_seeded_training_windows(tmp_path):
    out = token_files(tmp_path, "--test", str(tmp_path / "text" / "ptb.test.txt"))
    meta = json.loads((out / "meta.json").read_text())
    task = tasks.build("tokens", data_dir=str(out), seq_len=5)
    words = tasks.build("ptb-word", data_dir=str(tmp_path / "text"), seq_len=5)
    assert meta["dtype"] == "uint16" and task.num_outputs == words.num_outputs == meta["vocab_size"]
    assert task.vocab == words.vocab
    for split in ("train", "val", "test"):  # the evaluation windows are ptb-word's samples
        for mine, theirs in zip(getattr(task, split).take(slice(0, None)), getattr(words, split).take(slice(0, None)),
                                strict=True):
            assert torch.equal(mine, theirs), split
    ids = torch.from_numpy(np.fromfile(out / "train.bin", dtype="<u2").astype(np.int64))
    epoch = task.train.order(torch.Generator().manual_seed(3))
    assert len(epoch) == len(task.train) == len(words.train)
    starts = torch.cat([epoch[a:a + 7] for a in range(0, len(epoch), 7)])
    assert starts.min() >= 0 and starts.max() <= ids.numel() - 6 and len(set(starts.tolist())) > len(starts) // 2
    inputs, targets = task.train.take(starts[:7])
    for row, start in enumerate(starts[:7].tolist()):  # a window of the file at its start, targets shifted by one
        assert torch.equal(inputs[row], ids[start:start + 5]) and torch.equal(targets[row], ids[start + 1:start + 6])
    again = task.train.order(torch.Generator().manual_seed(3))
    assert torch.equal(again[7:14], epoch[7:14])  # a batch's windows depend on (seed, epoch, batch) alone
    assert not torch.equal(task.train.order(torch.Generator().manual_seed(4))[7:14], epoch[7:14])


def test_without_a_test_file_the_validation_file_is_halved(tmp_path):
    task = tasks.build("tokens", data_dir=str(token_files(tmp_path)), seq_len=4)
    val_ids = np.fromfile(tmp_path / "bin" / "val.bin", dtype="<u2")
    half = len(val_ids) // 2
    assert int(task.val.order()[-1]) + 5 <= half and int(task.test.order()[0]) == half
    assert len(task.val) == half // 5 and len(task.test) == (len(val_ids) - half) // 5


def test_a_token_file_run_resumes_exactly(tmp_path):
    task = tasks.build("tokens", data_dir=str(token_files(tmp_path)), seq_len=6)
    resumes_exactly(tmp_path, task, lambda: models.build("gpt", in_features=6, out_features=task.num_outputs,
                                                         vocab_size=task.num_outputs, depth=1, width=8, heads=2))


def test_random_starts_cover_the_range_and_slice_by_batch():
    starts = RandomStarts(seed=5, count=1000, low=10, high=20)
    drawn = torch.cat([starts[a:a + 100] for a in range(0, 1000, 100)])
    assert set(drawn.tolist()) == set(range(10, 21)) and len(starts[990:2000]) == 10
    with pytest.raises(IndexError):
        starts[0:10:2]


# -------------------------------------------------------------------------------------------- the command line
FACTORY = '''
import torch
from torch.utils.data import IterableDataset, TensorDataset


def blobs(n=120, classes=3, data_dir=None):
    """Three Gaussian blobs in 4 dimensions as train / val / test Datasets."""
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(n) % classes
    x = torch.randn(n, 4, generator=gen) + 3 * torch.nn.functional.one_hot(y, 4).float()
    return {"train": TensorDataset(x[:80], y[:80]), "val": TensorDataset(x[80:100], y[80:100]),
            "test": TensorDataset(x[100:], y[100:])}


class Rows(IterableDataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


def stream(bad_at=None):
    """The blobs, training rows streamed (a label of 7 at row bad_at)."""
    made = blobs()
    if bad_at is not None:
        made["train"].tensors[1][bad_at] = 7
    return {**made, "train": Rows(made["train"]), "num_outputs": 3}


def extra():
    return {**blobs(), "classes": 3}


def broken():
    raise KeyError("no column 'label'")


def not_data():
    return 42
'''


def test_the_command_line_trains_on_a_task_factory_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_data.py").write_text(FACTORY)
    flags = ["--task", "my_data.py:blobs", "--task-option", "n=150", "--model", "mlp", "--trainer", "fa",
             "--eval-every", "2", "--progress", "false"]
    assert train_main([*flags, "--steps", "3"]) == 0
    run = tmp_path / "runs" / "train-mlp-blobs-n=150" / "fa" / "seed0"
    assert json.loads((run / "result.json").read_text())["steps"] == 3
    assert train_main([*flags, "--steps", "6", "--resume"]) == 0
    assert json.loads((run / "result.json").read_text())["steps"] == 6
    capsys.readouterr()


def test_the_command_line_streams_a_factory_s_iterable_dataset_in_steps(tmp_path, monkeypatch, capsys):
    """A factory's IterableDataset trains in steps (its records carry no epoch); asked for epochs, or meeting a
    label outside the outputs mid-run, the command line says so in one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_data.py").write_text(FACTORY)
    flags = ["--model", "mlp", "--trainer", "dfa", "--batch-size", "8", "--progress", "false"]
    assert train_main(["--task", "my_data.py:stream", *flags, "--steps", "12"]) == 0
    result = json.loads((tmp_path / "runs" / "train-mlp-stream" / "dfa" / "seed0" / "result.json").read_text())
    assert result["steps"] == 12 and result["samples"] == 96 and result["epochs"] is None
    capsys.readouterr()
    assert train_main(["--task", "my_data.py:stream", *flags, "--epochs", "2", "--overwrite"]) == 2
    assert "the training data is a stream without a length (no __len__), so it has no epochs: give the run in " \
           "steps (--steps N" in one_line_error(capsys)
    assert train_main(["--task", "my_data.py:stream", "--task-option", "bad_at=70", *flags, "--steps", "10",
                       "--run-name", "bad"]) == 2
    assert "the train split has label 7 at step 8, outside [0, 3)" in one_line_error(capsys)


@pytest.mark.parametrize("flags, expected", [
    (["--task", "nowhere.py:blobs"], "task file nowhere.py does not exist"),
    (["--task", "my_data.py:blob"],
     "my_data.py has no task factory 'blob'; it defines Rows, blobs, broken, extra, not_data, stream"),
    (["--task", "my_data.py:blobs", "--task-option", "size=3"],
     "takes no option 'size'; it takes: n, classes, data_dir"),
    (["--task", "my_data.py:broken"], "task factory broken failed: KeyError: \"no column 'label'\""),
    (["--task", "my_data.py:not_data"], "returned int 42, not a Task or the train, val and test data"),
    (["--task", "my_data.py:extra"], "returned a dict with 'classes': besides train, val and test it may hold "
                                     "num_outputs, name, collate"),
    (["--task", "tokens", "--data-dir", "{tmp}"], "missing train.bin"),
    (["--task", "my_data.py:blobs", "--task-option", "data_dir=x"], "--task-option data_dir= is the flag --data-dir"),
])
def test_bad_task_factories_are_one_line_exit_2_and_write_nothing(tmp_path, monkeypatch, capsys, flags, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_data.py").write_text(FACTORY)
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert train_main([*flags, "--steps", "1", "--progress", "false"]) == 2
    assert expected in one_line_error(capsys)
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------------- bad data
class Strings(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return "a sentence", 1


class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(3), 0


def test_bad_data_is_refused_in_one_line_when_the_task_is_made(tmp_path):
    x, y = features(n=20)
    good = TensorDataset(x, y)
    ragged = [(torch.zeros(3 + i % 2), 0) for i in range(6)]
    cases = [
        ((Strings(), good, good), "is a str, not a tensor, a number or an array"),
        ((ragged, good, good), "differ in shape ((3,), (4,)): give a collate function that pads them"),
        (([{"input_ids": torch.zeros(2)}] * 3, good, good), "no target: name it one of labels"),
        ((good, TensorDataset(x[:0], y[:0]), good), "the val data is empty"),
        ((DataLoader(good, shuffle=True), good, good), "draws its own order (RandomSampler, e.g. shuffle=True)"),
        ((Stream(), good, good), "the training data is a stream, whose labels are not known before training: "
                                 "give num_outputs"),
        ((good, good, TensorDataset(x, y + 5)), "the test split has label 7, outside [0, 3)"),
        ((object(), good, good), "not a Dataset"),
    ]
    for (train, val, test), expected in cases:
        with pytest.raises(TaskConfigError) as err:
            tasks.from_datasets(train, val, test)
        assert expected in str(err.value) and "\n" not in str(err.value), (expected, str(err.value))


def test_bad_token_files_are_refused_in_one_line(tmp_path):
    out = token_files(tmp_path)
    with pytest.raises(TaskConfigError, match="has label \\d+, outside \\[0, 9\\) of the task's 9 outputs"):
        tasks.build("tokens", data_dir=str(out), vocab_size=9)
    (out / "train.bin").write_bytes((out / "train.bin").read_bytes() + b"\x01")
    with pytest.raises(TaskConfigError, match="not a multiple of uint16's 2: another dtype, or a truncated file"):
        tasks.build("tokens", data_dir=str(out))
    (out / "train.bin").write_bytes(np.zeros(3, dtype="<u2").tobytes())
    with pytest.raises(TaskConfigError, match="holds 3 tokens, fewer than one window of seq_len \\+ 1 = 36"):
        tasks.build("tokens", data_dir=str(out))
    (out / "meta.json").unlink()
    with pytest.raises(TaskConfigError, match="no vocabulary size"):
        tasks.build("tokens", data_dir=str(out))


STREAM_FACTORY = """
import torch
from torch.utils.data import IterableDataset, TensorDataset


class Rows(IterableDataset):
    def __iter__(self):
        gen = torch.Generator().manual_seed(0)
        while True:
            x = torch.randn(4, generator=gen)
            yield x, int(x[0] > 0) + int(x[1] > 0)


def streamed():
    x = torch.randn(30, 4)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return {"train": Rows(), "val": TensorDataset(x[:15], y[:15]), "test": TensorDataset(x[15:], y[15:])}
"""


def test_a_streamed_factory_without_num_outputs_is_told_where_to_give_it_and_the_command_line_can(tmp_path,
                                                                                                  capsys):
    """A factory's stream has no known classes: the one line names the factory's dict and --task-option; the
    task option, which the factory does not name, reaches the made task, and the run trains."""
    (tmp_path / "stream_data.py").write_text(STREAM_FACTORY)
    reference = f"{tmp_path / 'stream_data.py'}:streamed"
    with pytest.raises(TaskConfigError, match=r"give num_outputs .*: return it with the data, \{'train': \.\.\., "
                                              r"'val': \.\.\., 'test': \.\.\., 'num_outputs': N\}, or pass "
                                              r"--task-option num_outputs=N"):
        tasks.build(reference)
    assert tasks.build(reference, num_outputs=3).num_outputs == 3
    assert train_main(["--task", reference, "--task-option", "num_outputs=3", "--steps", "3", "--progress", "false",
                       "--logdir", str(tmp_path / "runs")]) == 0


def _per_example(outputs, targets):
    return torch.nn.functional.cross_entropy(outputs, targets, reduction="none")


def _as_float(outputs, targets):
    return float(torch.nn.functional.cross_entropy(outputs, targets))


def _detached(outputs, targets):
    return torch.nn.functional.cross_entropy(outputs.detach(), targets)


@pytest.mark.parametrize("loss_fn, says", [
    (_per_example, "its loss _per_example returned a tensor of shape (2,), not one number: reduce it over the batch"),
    (_as_float, "its loss _as_float returned a float, not a tensor"),
    (_detached, "its loss _detached is detached from the outputs"),
])
def test_a_task_loss_that_is_not_one_differentiable_number_is_one_line_before_anything_is_written(loss_fn, says,
                                                                                                   tmp_path):
    """A loss with reduction='none', a Python float or a detached tensor ended in autograd's own words at step 0,
    the run's folder left behind: refused when the Trainer checks the task against the model."""
    x, y = features(n=40)
    task = tasks.from_datasets(TensorDataset(x[:24], y[:24]), TensorDataset(x[24:32], y[24:32]),
                               TensorDataset(x[32:], y[32:]), loss_fn=loss_fn)
    model = models.build("mlp", in_features=8, out_features=task.num_outputs, depth=2, width=8)
    with pytest.raises(TaskConfigError, match=re.escape(says)):
        trainers.Trainer(model, trainers.build_engine("backprop"), task, logdir=tmp_path / "runs").fit(steps=2)
    assert not (tmp_path / "runs").exists()


class Decoder(Dataset):
    """A user's dataset whose decoding of one row fails (``broken``), or whose __len__ counts rows it has not."""

    def __init__(self, broken=None, extra=0):
        self.x, self.y = features(n=48)
        self.broken, self.extra = broken, extra

    def __len__(self):
        return len(self.x) + self.extra

    def __getitem__(self, i):
        if i == self.broken:
            raise ValueError(f"decoder crashed on row {i}")
        return self.x[i], self.y[i]


@pytest.mark.parametrize("train, says", [
    (Decoder(broken=3), "the train dataset failed on row 3: ValueError: decoder crashed on row 3"),
    (Decoder(extra=5), "the train dataset has no row 48 (IndexError: index 48 is out of bounds"),
])
def test_a_dataset_failing_on_a_row_is_one_line_naming_the_split_and_the_row(train, says):
    x, y = features(n=20)
    with pytest.raises(TaskConfigError, match=re.escape(says)) as err:
        tasks.from_datasets(train, TensorDataset(x[:10], y[:10]), TensorDataset(x[10:], y[10:]))
    assert "\n" not in str(err.value)


class Late(Dataset):
    """Row 40 decodes twice (the labels and the task's fingerprint read it), then fails: once training reads it."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 48

    def __getitem__(self, i):
        if i == 40:
            self.reads += 1
            if self.reads > 2:
                raise ValueError("decoder crashed on row 40")
        return torch.randn(8, generator=torch.Generator().manual_seed(i)), i % 3


def test_a_dataset_failing_midway_through_training_is_one_line_and_says_what_was_kept(tmp_path):
    x, y = features(n=20)
    task = tasks.from_datasets(Late(), TensorDataset(x[:10], y[:10]), TensorDataset(x[10:], y[10:]))
    model = models.build("mlp", in_features=8, out_features=3, depth=2, width=8)
    trainer = trainers.Trainer(model, trainers.build_engine("backprop"), task, logdir=tmp_path, batch_size=8,
                               progress=False, checkpoint_every=1)
    with pytest.raises(TaskConfigError) as err:
        trainer.fit(epochs=3)
    said = str(err.value)
    assert said.startswith("the train dataset failed on row 40: ValueError: decoder crashed on row 40; ")
    assert "the last checkpoint (step " in said or "no checkpoint was written" in said
    assert "\n" not in said


@pytest.mark.parametrize("num_outputs", ["three", 0, 2.5, True])
def test_num_outputs_that_is_not_a_positive_integer_is_one_line(num_outputs):
    """A factory's dict with num_outputs="three" ended in a traceback deep in the label check."""
    x, y = features(n=20)
    with pytest.raises(TaskConfigError, match=re.escape(f"num_outputs must be a positive integer (classes, or the "
                                                        f"vocabulary of token targets), got {num_outputs!r}")):
        tasks.from_datasets(TensorDataset(x, y), TensorDataset(x, y), TensorDataset(x, y), num_outputs=num_outputs)


PRINTED = "DatasetDict({\n    train: Dataset({\n        features: ['x', 'y'],\n        num_rows: 3\n    })\n})"


def test_a_factory_returning_something_that_prints_over_lines_is_refused_in_one_line(tmp_path):
    """A DatasetDict prints itself over several lines: the refusal quotes it on one."""
    (tmp_path / "dd.py").write_text(f"class Printed:\n    def __repr__(self):\n        return {PRINTED!r}\n\n\n"
                                    f"def made():\n    return Printed()\n")
    with pytest.raises(TaskConfigError) as err:
        tasks.build(f"{tmp_path / 'dd.py'}:made")
    said = str(err.value)
    assert "\n" not in said and said.startswith("task factory made returned Printed DatasetDict({ train: Dataset({")


def test_a_token_file_cut_while_a_run_reads_it_is_one_line(tmp_path):
    """train.bin truncated while a run reads it ended in numpy's IndexError (index 292339 is out of bounds): one
    line naming the file, what it holds now and what the run found."""
    out = token_files(tmp_path)
    task = tasks.build("tokens", data_dir=str(out), seq_len=5)
    task.train.take(task.train.order(torch.Generator().manual_seed(0))[0:4])
    train = out / "train.bin"
    found = train.stat().st_size // 2
    with open(train, "r+b") as f:
        f.truncate(200)  # 100 uint16 tokens left
    with pytest.raises(TaskConfigError, match=re.escape(f"token file {train} now holds 100 tokens, where the run "
                                                        f"found {found}: it changed while the run read it")) as err:
        task.train.take(task.train.order(torch.Generator().manual_seed(1))[0:4])
    assert "\n" not in str(err.value)
