"""The Trainer: determinism, exact resume, NaN guard, schedules, agreement logging."""

import json
import math
import pickle

import pytest
import torch
from helpers import Crash, CrashingBackprop

from gradengines import models, tasks, trainers
from gradengines.trainers.engines.backprop import Backprop
from gradengines.trainers.run.checkpoint import load_checkpoint, save_atomic
from gradengines.trainers.run.logger import read_metrics
from gradengines.trainers.run.optim import StepDecay, WarmupCosine


@pytest.fixture(scope="module")
def task():
    return tasks.build("teacher", in_features=16, num_classes=4, n_train=256, n_val=64, n_test=64, hidden=16)


def make_trainer(task, tmp_path=None, engine=None, seed=0, **overrides):
    torch.manual_seed(seed)
    model = models.build("mlp", in_features=16, out_features=4, depth=3, width=16, dropout=0.1,
                         orthogonal=overrides.pop("orthogonal", None))
    options = dict(batch_size=32, log_every=2, progress=False, seed=seed, optimizer="sgd", lr=0.05,
                   schedule="cosine", warmup_steps=3, clip_grad_norm=5.0)
    options.update(overrides)
    return trainers.Trainer(model, engine or Backprop(), task, logdir=tmp_path, **options)


def without_timing(records):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "memory/"))} for r in records]


def test_same_seed_same_metrics_and_weights(task):
    a, b = make_trainer(task), make_trainer(task)
    a.fit(steps=24)
    b.fit(steps=24)
    assert without_timing(a.history) == without_timing(b.history)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    c = make_trainer(task, seed=1)
    c.fit(steps=24)
    assert without_timing(c.history) != without_timing(a.history)


def test_training_improves_validation_accuracy(task):
    trainer = make_trainer(task, lr=0.1, schedule="constant")
    before = trainer.evaluate("val")["accuracy"]
    report = trainer.fit(epochs=8)
    assert report["best_val"]["accuracy"] > before + 0.2
    assert set(report) >= {"best_val", "test", "final_val", "best_step"}




@pytest.mark.parametrize("orthogonal", [None, "bjorck", "expm", "retraction"])
def test_resume_equals_uninterrupted(task, tmp_path, orthogonal):
    steps = 22
    plain = {"momentum": 0.0} if orthogonal == "retraction" else {}  # the retraction takes plain SGD steps
    whole = make_trainer(task, tmp_path / "whole", orthogonal=orthogonal, checkpoint_every=5,
                         grad_agreement_every=4, eval_every=7, **plain)
    whole.fit(steps=steps)

    crashed = make_trainer(task, tmp_path / "resumed", engine=CrashingBackprop(crash_at=17), orthogonal=orthogonal,
                           checkpoint_every=5, grad_agreement_every=4, eval_every=7, **plain)
    with pytest.raises(Crash):
        crashed.fit(steps=steps)
    # the crash came after records that the last checkpoint does not cover
    checkpoint_step = load_checkpoint(crashed.run_dir / "checkpoint.pt")["step"]
    assert 0 < checkpoint_step < max(r["step"] for r in read_metrics(crashed.run_dir))
    # a new process: fresh objects, same flags, --resume; its weights and RNG must not matter
    resumed = make_trainer(task, tmp_path / "resumed", seed=0, orthogonal=orthogonal, checkpoint_every=5,
                           grad_agreement_every=4, eval_every=7, **plain)
    with torch.no_grad():
        for p in resumed.model.parameters():
            p.add_(0.1)
    torch.manual_seed(123)
    report = resumed.fit(steps=steps, resume=True)

    assert without_timing(read_metrics(resumed.run_dir)) == without_timing(read_metrics(whole.run_dir))
    for pa, pb in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    recorded = json.loads((whole.run_dir / "result.json").read_text())
    assert report == {k: recorded[k] for k in report}
    assert recorded["run"] == "backprop" and recorded["model"]["model"] == "MLP"


def test_existing_run_needs_resume_or_overwrite(task, tmp_path):
    make_trainer(task, tmp_path).fit(steps=4)
    advice = (r"fit\(resume=True\) continues it, another Trainer\(\.\.\., run_name=\.\.\.\) or "
              r"Trainer\(\.\.\., experiment=\.\.\.\) starts a new run beside it, Trainer\(\.\.\., overwrite=True\) "
              r"replaces it")
    with pytest.raises(trainers.ConfigError, match=advice):
        make_trainer(task, tmp_path).fit(steps=4)  # advice in Python terms
    trainer = make_trainer(task, tmp_path, overwrite=True)
    trainer.fit(steps=4)
    assert max(r["step"] for r in read_metrics(trainer.run_dir)) == 4


class NaNAfter(Backprop):
    def __init__(self, at):
        super().__init__()
        self.calls, self.at = 0, at

    def compute_grads(self, model, inputs, targets, loss_fn):
        self.calls += 1
        out = super().compute_grads(model, inputs, targets, loss_fn)
        if self.calls > self.at:
            out.loss = torch.tensor(math.nan)
            for p in model.parameters():
                p.grad.fill_(math.nan)
        return out


NaNAfter.name = "backprop"


def test_nan_guard_stops_and_keeps_last_good_checkpoint(task, tmp_path):
    trainer = make_trainer(task, tmp_path, engine=NaNAfter(at=7), checkpoint_every=3, eval_every=100)
    with pytest.raises(trainers.NonFiniteLossError, match="nan at step 7.*checkpoint"):
        trainer.fit(steps=20)
    state = load_checkpoint(trainer.run_dir / "checkpoint.pt")
    assert state["step"] == 6
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    # the NaN update never reached the weights
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_atomic_save_keeps_previous_file_on_failure(tmp_path):
    path = tmp_path / "ck.pt"
    save_atomic({"step": 1}, path)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        save_atomic({"step": 2, "bad": lambda: None}, path)  # lambdas cannot be pickled
    assert load_checkpoint(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def test_atomic_writes_get_the_permissions_of_a_new_file_and_a_name_tensorboard_skips(tmp_path):
    import os
    import stat

    from gradengines.trainers.run.checkpoint import write_atomic, write_text_atomic

    seen = []
    previous = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "result.json", "{}")
        save_atomic({"step": 1}, tmp_path / "checkpoint.pt")
        write_atomic(tmp_path / "events.out.tfevents.x", lambda f: seen.extend(os.listdir(tmp_path)))
    finally:
        os.umask(previous)
    for name in ("result.json", "checkpoint.pt", "events.out.tfevents.x"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640  # 0o666 less the umask, not 0o600
    temporary = [name for name in seen if name.endswith(".tmp")]
    assert len(temporary) == 1 and "tfevents" not in temporary[0]


def test_agreement_logging_does_not_change_the_trajectory(task):
    plain = make_trainer(task)
    plain.fit(steps=12)
    logged = make_trainer(task, grad_agreement_every=3)
    logged.fit(steps=12)
    for pa, pb in zip(plain.model.parameters(), logged.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    cos = [r["grad/cosine_global"] for r in logged.history if "grad/cosine_global" in r]
    assert len(cos) == 4 and all(c == pytest.approx(1.0, abs=1e-5) for c in cos)


@pytest.mark.parametrize("method", ["bjorck", "expm"])
def test_orthogonal_layers_stay_orthogonal_in_training(task, method):
    trainer = make_trainer(task, orthogonal=method, optimizer="adam", lr=1e-2, schedule="constant")
    trainer.fit(steps=30)
    errors = [r["engine/orthogonality_error"] for r in trainer.history if "engine/orthogonality_error" in r]
    assert errors and max(errors) < 1e-5


def test_schedules():
    cos = WarmupCosine(warmup=4, total=14)
    assert [cos(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cos(9) == pytest.approx(0.5)
    assert cos(14) == pytest.approx(0.0, abs=1e-12)
    step = StepDecay(step_size=10, gamma=0.5)
    assert (step(9), step(10), step(25)) == (1.0, 0.5, 0.25)


def test_weight_decay_and_optimizers_are_torch_optim(task):
    for name, cls in (("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)):
        trainer = make_trainer(task, optimizer=name, weight_decay=0.01)
        assert type(trainer.optimizer) is cls
        assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.01


@pytest.mark.parametrize("bad", [dict(lr=-0.1), dict(batch_size=0), dict(optimizer="lbfgs"),
                                 dict(clip_grad_norm=0.0), dict(not_an_option=1), dict(lr="fast")])
def test_bad_training_options_raise_config_error(task, bad):
    with pytest.raises(trainers.ConfigError):
        make_trainer(task, **bad)


def test_shape_mismatch_between_task_and_model(task):
    model = models.build("mlp", in_features=10, out_features=4)
    with pytest.raises(trainers.ConfigError, match="does not accept the inputs"):
        trainers.Trainer(model, Backprop(), task)
    model = models.build("mlp", in_features=16, out_features=7)
    with pytest.raises(trainers.ConfigError, match="4 classes"):
        trainers.Trainer(model, Backprop(), task)
