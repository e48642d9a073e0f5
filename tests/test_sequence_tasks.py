"""Tests of the sequence tasks: ``ptb-char`` / ``ptb-word``, ``seq-digits``, ``copy``, ``adding``.

The PTB loaders read tiny files written here in the PTB format; the real
validation / test files in /work/shared/data/ptb are read only when present.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch
from helpers import write_ptb_text

from gradengines import models, trainers
from gradengines.tasks import (
    IGNORE_INDEX,
    DataError,
    Split,
    Task,
    TaskConfigError,
    accuracy,
    available,
    build,
    sequence_cross_entropy,
)

REAL_PTB = Path("/work/shared/data/ptb")

TRAIN = " the cat sat on the mat \n the dog sat \n a <unk> ran \n"
VALID = " the bird sat \n the cat ran \n"
TEST = " a cat sat on a log \n zebra \n"


def one_line(message: str) -> bool:
    return "\n" not in message and "\r" not in message and message.strip() == message and message != ""


@pytest.fixture
def ptb_dir(tmp_path):
    return write_ptb_text(tmp_path, TRAIN, VALID, TEST)


def decode(task: Task, ids: torch.Tensor) -> list[str]:
    return [task.vocab[i] for i in ids.tolist()]


# ---------------------------------------------------------------- base


def test_sequence_tasks_are_registered():
    assert {"ptb-char", "ptb-word", "seq-digits", "copy", "adding"} <= set(available())


def test_split_accepts_token_ids_and_sequence_targets_but_not_others():
    Split(torch.zeros(3, 5, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="float32 .* or int64"):
        Split(torch.zeros(3, 5, dtype=torch.int32), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\(N,\) or \(N, T\)"):
        Split(torch.zeros(3, 5), torch.zeros(3, 5, 2, dtype=torch.int64))


def test_task_output_shape_and_metric_names():
    split = Split(torch.zeros(4, 6, dtype=torch.int64), torch.zeros(4, 6, dtype=torch.int64))
    task = Task("lm", split, split, split, input_shape=(6,), num_outputs=7, metric_name="perplexity",
                loss_fn=sequence_cross_entropy, output_shape=(6, 7))
    assert task.expected_output_shape == (6, 7)
    assert math.isclose(task.metric(torch.zeros(4, 6, 7), split.targets).item(), 7.0, rel_tol=1e-5)
    assert pickle.loads(pickle.dumps(task)).loss_fn is sequence_cross_entropy
    flat = Split(torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64))
    assert Task("c", flat, flat, flat, input_shape=(3,), num_outputs=5).expected_output_shape == (5,)
    with pytest.raises(ValueError, match="unsupported metric 'bleu'"):
        Task("c", flat, flat, flat, input_shape=(3,), num_outputs=5, metric_name="bleu")
    with pytest.raises(ValueError, match="targets have sample shape"):
        Task("lm", split, split, split, input_shape=(6,), num_outputs=7, output_shape=(5, 7))


def test_sequence_loss_and_token_accuracy():
    targets = torch.tensor([[0, 1, 2], [2, 2, IGNORE_INDEX]])
    logits = torch.nn.functional.one_hot(targets.clamp_min(0), 3).float() * 20
    assert sequence_cross_entropy(logits, targets).item() < 1e-6
    assert torch.isclose(sequence_cross_entropy(torch.zeros(2, 3, 3), targets), torch.log(torch.tensor(3.0)))
    logits[0, 0] = torch.tensor([0.0, 20.0, 0.0])  # one of the 5 counted tokens wrong
    assert math.isclose(accuracy(logits, targets).item(), 4 / 5, rel_tol=1e-6)
    assert accuracy(logits, targets).dim() == 0


# ---------------------------------------------------------------- PTB


def test_ptb_word_vocab_from_train_only_and_unk_mapping(ptb_dir):
    task = build("ptb-word", data_dir=ptb_dir, seq_len=3)
    train_words = set(TRAIN.split()) | {"<eos>"}
    assert set(task.vocab) == train_words
    assert task.vocab[:2] == ("<unk>", "<eos>") and task.num_outputs == len(task.vocab)
    assert "bird" not in task.vocab and "zebra" not in task.vocab
    # val stream: the bird sat <eos> the cat ran <eos> -> windows of 4 tokens
    assert decode(task, task.val.inputs[0]) == ["the", "<unk>", "sat"]
    assert decode(task, task.val.targets[0]) == ["<unk>", "sat", "<eos>"]
    test_tokens = decode(task, torch.cat([task.test.inputs[:, :1], task.test.targets], dim=1).flatten())
    assert test_tokens == ["a", "cat", "sat", "on", "a", "<unk>", "<eos>", "<unk>"]


def test_ptb_word_windows_are_non_overlapping_and_shifted(ptb_dir):
    task = build("ptb-word", data_dir=ptb_dir, seq_len=3)
    stream = TRAIN.replace("\n", " <eos> ").split()  # 14 tokens -> 3 windows of 4, 2 dropped
    windows = torch.cat([task.train.inputs[:, :1], task.train.targets], dim=1)
    assert [decode(task, w) for w in windows] == [stream[0:4], stream[4:8], stream[8:12]]
    assert torch.equal(task.train.inputs[:, 1:], task.train.targets[:, :-1])
    for split in (task.train, task.val, task.test):
        assert split.inputs.dtype == torch.int64 and split.targets.dtype == torch.int64
        assert split.inputs.shape[1:] == (3,) and split.targets.shape == split.inputs.shape
    assert task.input_shape == (3,) and task.expected_output_shape == (3, len(task.vocab))
    assert task.metric_name == "perplexity" and task.loss_fn is sequence_cross_entropy


def test_ptb_word_sentences_are_bos_eos_padded_and_ignored(ptb_dir):
    """The DSF authors' sentence-level PTB: one sample per line, <bos> ... <eos>, cut, padded, pads ignored."""
    task = build("ptb-word", data_dir=ptb_dir, seq_len=5, sentences=True)
    assert task.vocab[:4] == ("<unk>", "<eos>", "<bos>", "<pad>")
    assert len(task.train) == 3 and len(task.val) == 2 and len(task.test) == 2
    pad = task.vocab.index("<pad>")
    # " the cat sat on the mat ": 7 tokens with <bos>/<eos> -> cut to seq_len + 1 = 6
    assert decode(task, task.train.inputs[0]) == ["<bos>", "the", "cat", "sat", "on"]
    assert decode(task, task.train.targets[0]) == ["the", "cat", "sat", "on", "the"]
    # " the dog sat ": <bos> the dog sat <eos> <pad> -> the last target is ignored, the input padded
    assert decode(task, task.train.inputs[1]) == ["<bos>", "the", "dog", "sat", "<eos>"]
    assert decode(task, task.train.targets[1][:4]) == ["the", "dog", "sat", "<eos>"]
    assert task.train.targets[1][4] == IGNORE_INDEX
    # " zebra ": <bos> <unk> <eos> then padding
    assert decode(task, task.test.inputs[1]) == ["<bos>", "<unk>", "<eos>", "<pad>", "<pad>"]
    assert task.test.targets[1].tolist()[2:] == [IGNORE_INDEX] * 3
    assert (task.test.inputs[1][3:] == pad).all()
    # every non-ignored target is the next input token
    for split in (task.train, task.val, task.test):
        counted = split.targets[:, :-1] != IGNORE_INDEX
        assert torch.equal(split.targets[:, :-1][counted], split.inputs[:, 1:][counted])
    # max_tokens counts words + <eos> per line, as the stream does: 7 + 4 tokens for two lines
    assert len(build("ptb-word", data_dir=ptb_dir, seq_len=5, sentences=True, max_tokens=11).train) == 2
    assert len(build("ptb-word", data_dir=ptb_dir, seq_len=5, sentences=True, max_tokens=10).train) == 1


def test_evaluation_means_over_counted_tokens(ptb_dir):
    """Perplexity of padded sentences: every counted token weighs the same, whatever its batch."""
    task = build("ptb-word", data_dir=ptb_dir, seq_len=8, sentences=True)
    torch.manual_seed(0)
    model = models.build("rnn_lm", in_features=8, out_features=task.num_outputs, hidden=8)
    trainer = trainers.Trainer(model, trainers.build_engine("backprop"), task, eval_batch_size=1, progress=False)
    with torch.no_grad():
        whole = sequence_cross_entropy(model(task.train.inputs), task.train.targets).item()
    result = trainer.evaluate("train")
    assert result["loss"] == pytest.approx(whole, rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(whole), rel=1e-6)


def test_ptb_char_tokens_and_shapes(ptb_dir):
    task = build("ptb-char", data_dir=ptb_dir, seq_len=8)
    assert set(task.vocab) == set(TRAIN.replace(" \n ", "\n").strip(" ")) | {"<unk>"}
    assert task.vocab[0] == "<unk>" and "z" not in task.vocab and "\n" in task.vocab
    text = "".join(decode(task, torch.cat([task.train.inputs[0, :1], task.train.targets[0]])))
    assert text == "the cat s"
    assert task.train.inputs.shape == (len("the cat sat on the mat\nthe dog sat\na <unk> ran\n") // 9, 8)
    assert task.expected_output_shape == (8, len(task.vocab)) and task.metric_name == "perplexity"
    # "zebra": z is not in the train text -> <unk>
    test_text = decode(task, task.test.inputs.flatten())
    assert "z" not in test_text and "<unk>" in test_text


def test_ptb_max_tokens_caps_each_split(ptb_dir):
    task = build("ptb-char", data_dir=ptb_dir, seq_len=4, max_tokens=12)
    assert len(task.train) == len(task.val) == len(task.test) == 2


def test_ptb_missing_file_is_one_line_data_error(ptb_dir):
    (ptb_dir / "ptb.test.txt").unlink()
    with pytest.raises(DataError) as info:
        build("ptb-word", data_dir=ptb_dir)
    message = str(info.value)
    assert one_line(message) and "ptb.test.txt" in message and str(ptb_dir) in message


def test_ptb_missing_train_file_suggests_valid_but_never_silently(ptb_dir):
    (ptb_dir / "ptb.train.txt").unlink()
    with pytest.raises(DataError) as info:
        build("ptb-char", data_dir=ptb_dir)
    message = str(info.value)
    assert one_line(message) and "ptb.train.txt" in message and "train_file='ptb.valid.txt'" in message
    task = build("ptb-char", data_dir=ptb_dir, train_file="ptb.valid.txt", seq_len=4)
    assert set(task.vocab) == set("the bird sat\nthe cat ran\n") | {"<unk>"}


@pytest.mark.parametrize("options", [{"seq_len": 0}, {"max_tokens": -1}, {"train_file": "../x.txt"}])
def test_ptb_bad_options_raise_one_line_config_error(ptb_dir, options):
    with pytest.raises(TaskConfigError) as info:
        build("ptb-word", data_dir=ptb_dir, **options)
    assert one_line(str(info.value)) and next(iter(options)) in str(info.value)


def test_ptb_too_short_split_names_seq_len(ptb_dir):
    with pytest.raises(TaskConfigError, match="seq_len"):
        build("ptb-word", data_dir=ptb_dir, seq_len=100)


@pytest.mark.skipif(not REAL_PTB.is_dir(), reason="no PTB files in /work/shared/data/ptb")
@pytest.mark.parametrize("name, seq_len", [("ptb-char", 128), ("ptb-word", 35)])
def test_real_ptb_files_load(name, seq_len):
    task = build(name, data_dir=REAL_PTB, train_file="ptb.valid.txt", max_tokens=20000)
    n = 20000 // (seq_len + 1)
    assert task.train.inputs.shape == task.val.inputs.shape == task.test.inputs.shape == (n, seq_len)
    assert torch.equal(task.train.inputs, task.val.inputs)  # train on the validation text, as asked
    assert "<unk>" in task.vocab and int(task.test.targets.max()) < task.num_outputs
    assert task.expected_output_shape == (seq_len, len(task.vocab))


# ---------------------------------------------------------------- synthetic / pixel sequences


def test_seq_digits_shapes_and_splits():
    task = build("seq-digits")
    flat = build("digits")
    for name in ("train", "val", "test"):
        seq, ref = getattr(task, name), getattr(flat, name)
        assert seq.inputs.shape == (len(ref), 64, 1) and seq.inputs.dtype == torch.float32
        assert torch.equal(seq.inputs.reshape(len(ref), 64), ref.inputs) and torch.equal(seq.targets, ref.targets)
    assert len(task.train) + len(task.val) + len(task.test) == 1797
    assert task.input_shape == (64, 1) and task.expected_output_shape == (10,) and task.metric_name == "accuracy"
    assert abs(task.train.inputs.mean().item()) < 1e-3


def test_copy_is_deterministic_and_asks_for_the_symbols_after_the_delay():
    kwargs = dict(n_symbols=5, length=4, delay=6, n_train=30, n_val=5, n_test=5)
    task, again, other = (build("copy", seed=s, **kwargs) for s in (3, 3, 4))
    assert torch.equal(task.train.inputs, again.train.inputs) and torch.equal(task.test.targets, again.test.targets)
    assert not torch.equal(task.train.inputs, other.train.inputs)
    T = 2 * 4 + 6
    x, y = task.train.inputs, task.train.targets
    assert x.shape == y.shape == (30, T) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, -4:], x[:, :4]) and int(x[:, :4].max()) < 5
    assert (y[:, :-4] == IGNORE_INDEX).all()
    assert (x[:, 4 + 6 - 1] == 6).all() and (x[:, 4:9] == 5).all() and (x[:, -4:] == 5).all()
    assert task.expected_output_shape == (T, 6) and task.loss_fn is sequence_cross_entropy
    perfect = torch.nn.functional.one_hot(y.clamp_min(0), 6).float() * 20
    assert task.metric(perfect, y).item() == 1.0
    classic = build("copy", seed=3, ignore_blanks=False, **kwargs)
    assert (classic.train.targets[:, :-4] == 5).all() and torch.equal(classic.train.inputs, x)


def test_adding_is_deterministic_and_labels_the_marked_sum():
    kwargs = dict(length=12, n_bins=8, n_train=40, n_val=5, n_test=5)
    task, again = build("adding", seed=1, **kwargs), build("adding", seed=1, **kwargs)
    assert torch.equal(task.train.inputs, again.train.inputs) and torch.equal(task.train.targets, again.train.targets)
    assert not torch.equal(task.train.inputs, build("adding", seed=2, **kwargs).train.inputs)
    x, y = task.train.inputs, task.train.targets
    assert x.shape == (40, 12, 2) and x.dtype == torch.float32 and y.shape == (40,)
    markers = x[..., 1]
    assert (markers.sum(dim=1) == 2).all() and (markers[:, :6].sum(dim=1) == 1).all()
    total = (x[..., 0] * markers).sum(dim=1)
    assert torch.equal(y, (total / 2 * 8).floor().long().clamp(0, 7))
    assert task.expected_output_shape == (8,) and task.metric_name == "accuracy"


# ---------------------------------------------------------------- Trainer with token inputs


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, width: int = 16, outputs: int | None = None):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.rnn = torch.nn.GRU(width, width, batch_first=True)
        self.head = torch.nn.Linear(width, outputs or vocab)

    def forward(self, x):
        assert x.dtype == torch.int64
        return self.head(self.rnn(self.embed(x))[0])


def test_trainer_trains_a_token_model_on_ptb_char(ptb_dir):
    task = build("ptb-char", data_dir=ptb_dir, seq_len=6)
    torch.manual_seed(0)
    model = TinyLM(task.num_outputs)
    trainer = trainers.Trainer(model, trainers.build_engine("backprop"), task, progress=False, batch_size=4)
    report = trainer.fit(steps=5)
    assert report["steps"] == 5
    for part in ("best_val", "final_val", "test"):
        assert "perplexity" in report[part] and math.isfinite(report[part]["perplexity"])
        assert math.isclose(report[part]["perplexity"], math.exp(report[part]["loss"]), rel_tol=1e-6)


def test_trainer_refuses_a_wrong_output_shape(ptb_dir):
    task = build("ptb-word", data_dir=ptb_dir, seq_len=3)
    model = TinyLM(task.num_outputs, outputs=task.num_outputs + 1)
    with pytest.raises(trainers.ConfigError) as info:
        trainers.Trainer(model, trainers.build_engine("backprop"), task, progress=False)
    message = str(info.value)
    assert one_line(message) and "ptb-word" in message and str((3, task.num_outputs)) in message
