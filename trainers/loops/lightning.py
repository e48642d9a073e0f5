"""A gradient engine inside PyTorch Lightning: ``EngineModule``, a ``LightningModule`` whose gradients come from an
engine instead of ``loss.backward()``.

    class Classifier(EngineModule):
        def __init__(self):
            super().__init__(engine="fa")
            self.net = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))

        def forward(self, x):
            return self.net(x)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    lightning.Trainer(max_steps=100).fit(Classifier(), train_loader)

A batch is ``(inputs, targets)`` (``split_batch`` says otherwise); the loss is ``engine_loss(outputs, targets)``
(cross-entropy unless overridden). The training step runs ``engine.compute_grads`` on the module (or the residual
stack found in it from the first batch, for Highway-BP: ``trainers.loops.setup``) and returns the loss;
Lightning's ``backward`` hook, where ``loss.backward()`` would run, adds the engine's gradients to ``.grad``, scaled
as Lightning scaled the loss (accumulation, a precision plugin's scaler). So everything else is Lightning's own,
under automatic optimization: ``accumulate_grad_batches``, ``gradient_clip_val``, optimizers and schedulers at
their intervals, logging (``train/loss`` and the engine's scalars, ``engine/<key>``), and checkpoints, which carry
the engine's state (``"engine"``) and restore it with ``ckpt_path``. (Manual optimization would leave the
schedulers, clipping and accumulation to this class, and their resume to rebuild: a first version stepped an
epoch's scheduler where Lightning's resume does not.) Under Lightning's DDP the gradients are averaged over the
replicas once (``trainers.core.replicas``: DDP's hooks never run for an engine). Requires ``lightning``
(``pip install '.[lightning]'``).
"""

from __future__ import annotations

from typing import Any

import lightning
import torch
from torch.nn.parallel import DistributedDataParallel

from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.core.engine import GradientEngine, trainable_parameters
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.replicas import average_over_replicas
from gradengines.trainers.loops.setup import given_engine, model_for_engine

__all__ = ["EngineModule"]


class EngineModule(lightning.LightningModule):
    """A ``LightningModule`` trained by ``engine`` (a name, with ``engine_options``, or a ``GradientEngine``)
    (module docstring)."""

    def __init__(self, engine: str | GradientEngine = "backprop", engine_options: dict | None = None):
        super().__init__()
        self.engine = given_engine(engine, engine_options, "EngineModule")
        self._trained: list[torch.nn.Module] = []  # the module the engine trains, once found (not a submodule)
        self._grads: list[torch.Tensor] = []  # the engine's gradients of the step, until backward adds them
        self._loss = torch.zeros(())

    def split_batch(self, batch: Any) -> tuple[Any, torch.Tensor]:
        """``(inputs, targets)`` of a batch."""
        inputs, targets = batch
        return inputs, targets

    def engine_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean loss of a batch's outputs (cross-entropy); override for another."""
        return cross_entropy_loss(outputs, targets)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """The engine's gradients of this batch, kept for ``backward``; returns the batch's loss."""
        inputs, targets = self.split_batch(batch)
        if not self._trained:
            self._trained.append(model_for_engine(self.engine, self, (inputs, targets)))
        params = [p for _, p in trainable_parameters(self)]
        earlier = [p.grad for p in params]
        out = self.engine.compute_grads(self._trained[0], inputs, targets, self.engine_loss)
        wrapper = self.trainer.strategy.model
        if isinstance(wrapper, DistributedDataParallel):
            average_over_replicas(wrapper, params)
        self._grads = [p.grad for p in params]
        for p, g in zip(params, earlier, strict=True):  # .grad as it was until backward
            p.grad = g
        self._loss = out.loss
        self.log("train/loss", out.loss, prog_bar=True)
        for key, value in self.engine.metrics().items():
            self.log(f"engine/{key}", float(value))
        return out.loss.clone().requires_grad_()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Where ``loss.backward()`` would run: the engine's gradients added to ``.grad``, times the factor by which
        Lightning scaled the returned loss (1 / accumulate_grad_batches, a precision plugin's scale)."""
        factor = float(loss.detach() / self._loss) if float(self._loss) != 0 else \
            1.0 / self.trainer.accumulate_grad_batches
        for p, g in zip((p for _, p in trainable_parameters(self)), self._grads, strict=True):
            if p.grad is None:
                p.grad = g * factor
            else:
                p.grad.add_(g, alpha=factor)
        self._grads = []

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["engine"] = self.engine.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "engine" not in checkpoint:
            raise ConfigError("EngineModule: the checkpoint has no engine state: it was not written by an "
                              "EngineModule")
        self.engine.load_state_dict(checkpoint["engine"])
