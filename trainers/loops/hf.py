"""A gradient engine inside the Hugging Face Trainer: ``EngineTrainer``, a ``transformers.Trainer`` whose training
step computes the gradients with an engine instead of ``loss.backward()``.

    from gradengines.trainers.loops.hf import EngineTrainer
    trainer = EngineTrainer(model=gpt2, args=TrainingArguments(...), train_dataset=..., engine="highway",
                            engine_options={"k": 2})
    trainer.train()

Everything else is the Trainer's own: gradient accumulation, clipping, optimizers and schedules, logging callbacks
(the engine's scalars, ``engine.metrics()``, join each training log as ``engine/<key>``: TensorBoard and the log
history show them), evaluation, and checkpoints (the engine's state, e.g. adaptive feedbacks, is saved as
``engine.pt`` beside the optimizer's and restored by ``resume_from_checkpoint``). Requires ``accelerate``
(``pip install '.[hf-trainer]'``).

The engine differentiates the loss the stock Trainer would: the model's own loss of its logits (its
``loss_function``, with ``num_items_in_batch`` where the model accepts loss arguments) or the Trainer's
``compute_loss_func``, scaled as the stock step scales it (divided by the accumulation steps unless already
normalised; times the processes with ``average_tokens_across_devices``). That it is the same loss is checked on the
first batch against the model's own (eval mode, one forward), and a mismatch refuses in one line. Gradients are
accumulated over micro-batches as ``backward()`` accumulates them. A model an engine needs a structure in
(Highway-BP's residual stack) is searched once, from the first batch (``models.residual_stack``), and the engine's
own first-batch check runs as in the project's Trainer. Under DDP (``accelerate`` wraps the model on several
processes) the engine trains the module and the gradients are averaged over the replicas once
(``trainers.core.replicas``).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers.modeling_outputs import CausalLMOutput

from gradengines.trainers.core.engine import GradientEngine, trainable_parameters
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.replicas import average_over_replicas, sync_buffers, unwrap
from gradengines.trainers.loops.setup import given_engine, model_for_engine

__all__ = ["EngineTrainer", "ENGINE_FILE"]

#: The engine's state in a checkpoint folder, beside ``optimizer.pt``.
ENGINE_FILE = "engine.pt"

#: How close the engine's loss of the logits must be to the model's own loss on the first batch, per dtype.
LOSS_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


class EngineTrainer(transformers.Trainer):
    """``transformers.Trainer`` with the gradients of ``engine`` (a name, with ``engine_options``, or a
    ``GradientEngine``) (module docstring)."""

    def __init__(self, *args: Any, engine: str | GradientEngine = "backprop", engine_options: dict | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.engine = given_engine(engine, engine_options, "EngineTrainer")
        if self.args.label_smoothing_factor:
            raise ConfigError("EngineTrainer: label_smoothing_factor is not supported with an engine yet; give the "
                              "smoothed loss as compute_loss_func")
        self._trained: torch.nn.Module | None = None  # the model the engine trains (the module, or its stack)

    # ------------------------------------------------------------------------------------------- the loss
    def engine_loss(self, module: torch.nn.Module, num_items_in_batch) -> Any:
        """``loss_fn(logits, labels)``: the loss the stock Trainer differentiates, as a function of the logits."""
        if self.compute_loss_func is not None:
            return lambda logits, labels: self.compute_loss_func(CausalLMOutput(logits=logits), labels,
                                                                 num_items_in_batch=num_items_in_batch)
        function = getattr(module, "loss_function", None)
        if function is None:
            raise ConfigError(f"EngineTrainer: {type(module).__name__} has no loss_function to compute its loss from "
                              f"its logits; give the loss as compute_loss_func")
        names = inspect.signature(function).parameters
        fixed: dict[str, Any] = {}
        if "vocab_size" in names:
            fixed["vocab_size"] = module.config.vocab_size
        if "config" in names:
            fixed["config"] = module.config
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            fixed["num_items_in_batch"] = num_items_in_batch
        logits_name = "pooled_logits" if "pooled_logits" in names else "logits"
        return lambda logits, labels: function(**{logits_name: logits, "labels": labels, **fixed})

    def _scale(self, num_items_in_batch) -> float:
        """The factor the stock training step applies to ``compute_loss``'s value before ``backward``."""
        factor = 1.0
        if self.args.average_tokens_across_devices and (self.model_accepts_loss_kwargs or self.compute_loss_func) \
                and num_items_in_batch is not None:
            factor *= self.accelerator.num_processes // self.get_tp_size()
        scaled = self.loss_is_scaled_for_ga
        if scaled is None:
            scaled = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) \
                or self.compute_loss_func is not None
        return factor if scaled else factor / self.current_gradient_accumulation_steps

    def _check_loss(self, module: torch.nn.Module, inputs: dict, labels: torch.Tensor, loss_fn, num_items) -> None:
        """The first batch: the engine's loss of the logits is the model's own loss (one forward, eval mode)."""
        if self.compute_loss_func is not None:
            return
        was_training = module.training
        module.eval()
        extra = {"num_items_in_batch": num_items} if self.model_accepts_loss_kwargs and num_items is not None else {}
        with torch.no_grad():
            outputs = module(**inputs, labels=labels, **extra)
            own, mine = outputs["loss"], loss_fn(outputs["logits"], labels)
        module.train(was_training)
        tolerance = LOSS_TOLERANCE.get(outputs["logits"].dtype, 1e-5)
        if own is None or not torch.isclose(mine, own, rtol=tolerance, atol=tolerance):
            raise ConfigError(f"EngineTrainer: {type(module).__name__}'s own loss is {float(own)!r} on the first batch "
                              f"where its loss_function of its logits gives {float(mine)!r}: the engine would train "
                              f"another loss; give the loss as compute_loss_func")

    # --------------------------------------------------------------------------------------- the step
    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch=None) -> torch.Tensor:
        """The stock step with ``backward()`` replaced by the engine: gradients added to those of the earlier
        micro-batches of this optimizer step, as ``backward()`` adds them."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        if "labels" not in inputs:
            raise ConfigError(f"EngineTrainer: the batch has no 'labels' (keys: {', '.join(inputs)}); the engine "
                              f"needs the targets apart from the model's inputs")
        labels = inputs["labels"]
        named = {k: v for k, v in inputs.items() if k != "labels"}
        module, replicas = unwrap(model)
        loss_fn = self.engine_loss(module, num_items_in_batch)
        if self._trained is None:
            self._check_loss(module, named, labels, loss_fn, num_items_in_batch)
            self._trained = model_for_engine(self.engine, module, (named, labels))
        factor = self._scale(num_items_in_batch)
        params = [p for _, p in trainable_parameters(module)]
        earlier = [p.grad for p in params]
        if replicas is not None:
            sync_buffers(replicas)
        with self.compute_loss_context_manager():
            out = self.engine.compute_grads(self._trained, named, labels, lambda o, y: loss_fn(o, y) * factor)
        if replicas is not None:
            average_over_replicas(replicas, params)
        for p, g in zip(params, earlier, strict=True):
            if g is not None:
                p.grad.add_(g)
        return out.loss.detach()

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The stock log, with the engine's scalars of its last step beside a training loss."""
        if "loss" in logs:
            logs = {**logs, **{f"engine/{k}": float(v) for k, v in self.engine.metrics().items()}}
        super().log(logs, *args, **kwargs)

    # ---------------------------------------------------------------------------------------- checkpoints
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            path = Path(output_dir) / ENGINE_FILE
            partial = path.with_name(path.name + ".partial")
            torch.save(self.engine.state_dict(), partial)
            os.replace(partial, path)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = Path(checkpoint) / ENGINE_FILE
        if not path.is_file():
            raise ConfigError(f"EngineTrainer: checkpoint {checkpoint} has no {ENGINE_FILE} (the engine's state): it "
                              f"was not written by an EngineTrainer")
        self.engine.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
