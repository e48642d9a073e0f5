"""The engines inside PyTorch Lightning (issue 49, ``trainers/loops/lightning.py``): an EngineModule with backprop ends
where a plain ``loss.backward()`` LightningModule ends (float64), Highway-BP at k >= 2L too and at k = 0 not; the
engine's scalars are logged; its state rides in Lightning's checkpoints and a ``ckpt_path`` resume is exact."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

lightning = pytest.importorskip("lightning")

from gradengines import models  # noqa: E402
from gradengines.tasks.base import cross_entropy_loss  # noqa: E402
from gradengines.trainers.core.errors import ConfigError  # noqa: E402
from gradengines.trainers.loops.lightning import EngineModule  # noqa: E402

DEPTH = 3


def network(seed=0):
    torch.manual_seed(seed)
    return models.build("residual_mlp", in_features=6, out_features=3, depth=DEPTH, width=8).double()


def loader():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(24, 6, generator=gen, dtype=torch.float64)
    return DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=8)


class Plain(lightning.LightningModule):
    """The stock way: the loss returned, Lightning calls backward."""

    def __init__(self):
        super().__init__()
        self.net = network()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return cross_entropy_loss(self(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]  # per epoch


class WithEngine(EngineModule):
    """The same module, trained by an engine."""

    def __init__(self, engine="backprop", **options):
        super().__init__(engine=engine, engine_options=options)
        self.net = network()

    forward = Plain.forward
    configure_optimizers = Plain.configure_optimizers


def fit(module, steps=7, ckpt_path=None, **trainer_options):
    """``steps`` optimizer steps, 3 batches an epoch (the scheduler steps once an epoch, as configured)."""
    options = dict(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)
    trainer = lightning.Trainer(**{**options, **trainer_options})
    trainer.fit(module, loader(), ckpt_path=ckpt_path)
    return {n: p.detach().clone() for n, p in module.named_parameters()}, trainer


def largest_difference(a, b):
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max()) for n in b)


def test_an_engine_module_ends_where_loss_backward_ends_with_backprop_and_exact_highway():
    """7 optimizer steps of 2 accumulated batches, the gradient norm clipped, SGD with momentum and a scheduler
    stepped each epoch, all Lightning's: backprop and Highway-BP at k = L give loss.backward()'s parameters
    (float64), Highway-BP at k = 0 does not."""
    lightning_own = dict(accumulate_grad_batches=2, gradient_clip_val=0.05)
    plain, _ = fit(Plain(), **lightning_own)
    mine, trainer = fit(WithEngine("backprop"), **lightning_own)
    assert largest_difference(mine, plain) < 1e-12
    assert "train/loss" in trainer.logged_metrics
    exact, _ = fit(WithEngine("highway", k=DEPTH), **lightning_own)
    assert largest_difference(exact, plain) < 1e-10
    truncated, _ = fit(WithEngine("highway", k=0), **lightning_own)
    assert largest_difference(truncated, plain) > 1e-4


def test_the_engine_s_state_rides_in_lightning_s_checkpoints_and_a_resume_is_exact(tmp_path):
    """FA: 5 steps, a checkpoint at 3 (the last batch of the first epoch: Lightning resumes a plain DataLoader
    exactly only at an epoch's end); a fresh module resumed from it (ckpt_path) ends with the uninterrupted
    run's parameters; its alignment angles are logged; a checkpoint without the engine's state is refused."""
    every = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    whole, trainer = fit(WithEngine("fa"), steps=5, enable_checkpointing=True, callbacks=[every])
    assert any(k.startswith("engine/alignment_deg/") for k in trainer.logged_metrics)
    checkpoint, = (p for p in tmp_path.glob("*.ckpt") if "step=3" in p.name)
    resumed, _ = fit(WithEngine("fa"), steps=5, ckpt_path=str(checkpoint))
    assert largest_difference(resumed, whole) < 1e-12
    state = torch.load(checkpoint, weights_only=False)
    del state["engine"]
    torch.save(state, tmp_path / "foreign.ckpt")
    with pytest.raises(ConfigError, match="the checkpoint has no engine state"):
        fit(WithEngine("fa"), steps=5, ckpt_path=str(tmp_path / "foreign.ckpt"))


def test_a_model_no_engine_can_train_is_one_line():
    class Recurrent(EngineModule):
        def __init__(self):
            super().__init__(engine="dsf")
            self.net = nn.Linear(6, 3).double()

        def forward(self, x):
            return self.net(x)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(Exception, match="dsf") as err:
        fit(Recurrent(), steps=1)
    assert "\n" not in str(err.value)


def test_in_bf16_mixed_precision_an_engine_module_ends_where_loss_backward_ends():
    """Lightning's precision="bf16-mixed" runs the training step (and so the engine) under its autocast: backprop
    through the engine gives loss.backward()'s parameters (float32 modules)."""
    plain, engine, full = Plain().float(), WithEngine("backprop").float(), WithEngine("backprop").float()

    def floats():
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(24, 6, generator=gen)
        return DataLoader(TensorDataset(x, x[:, :3].argmax(1)), batch_size=8)
    results = []
    for module, precision in ((plain, "bf16-mixed"), (engine, "bf16-mixed"), (full, "32-true")):
        trainer = lightning.Trainer(max_steps=5, accelerator="cpu", devices=1, logger=False, precision=precision,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module, floats())
        results.append({n: p.detach().clone() for n, p in module.named_parameters()})
    assert largest_difference(results[1], results[0]) < 1e-6
    assert largest_difference(results[2], results[0]) > 1e-4  # the precision was in effect
