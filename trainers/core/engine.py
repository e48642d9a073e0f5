"""The gradient-engine contract, stated once.

A gradient engine turns (model, batch, loss) into a gradient estimate:

    out = engine.compute_grads(model, inputs, targets, loss_fn)

* every trainable parameter ``p`` (``p.requires_grad``) has ``p.grad`` set,
  overwritten, never accumulated (a zero tensor where the estimate is zero);
* no parameter value changes, no Parameter object is replaced, no optimizer
  steps: optimizers, schedules, clipping and orthogonality upkeep are the
  Trainer's;
* the caller's inputs and targets are never written: ``compute_grads`` runs on
  its own copy of the batch (``models.adapters.calling.own_copy``), and every
  run of the model through ``call_model`` on a copy of its own;
* ``out.loss`` is the (detached) loss of the clean forward pass on the batch,
  ``out.outputs`` its (detached) outputs;
* a model wrapped in ``DistributedDataParallel`` is trained as its module and its
  gradients are averaged over the replicas once, as DDP's own backward would
  (``trainers.core.replicas``); a sharded model is refused in one line.

``loss_fn(outputs, targets)`` returns the mean loss over the batch. An engine that
runs the model's own forward calls it through ``models.call_model`` (or
``models.adapters.calling.forward_loss``), which passes a fresh state or the targets where
the forward takes them and reads the output out of a tuple, dict or object
(``models/adapters/calling.py``), so users' models need no wrapper.
``engine.check(model)`` raises ``IncompatibleModelError`` with one line saying
what the engine needs and which zoo models qualify. An engine that finds or is
given a structure in a user's model (a residual stack, the layers whose backward
it replaces) proves its exact setting on the first batch
(``engine.first_batch_check``, ``trainers.core.self_check``) and refuses in one
``ModelConfigError`` line where it is not autograd.

An engine is one file: a subclass of ``GradientEngine`` with a nested
``Options`` dataclass (``trainers.core.options.option`` fields) and, optionally, a
``recipe`` (its settings with their sources), named by its ``name`` attribute. It is
built in (``@register_engine("name")``), registered by a program, installed as a
plugin, or named by reference, ``FILE.py:Class`` (``trainers.core.registry``).
"""

import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
import torch.nn as nn

from gradengines.models.adapters.calling import own_copy
from gradengines.models.errors import ModelConfigError, one_line
from gradengines.trainers.core.errors import out_of_memory
from gradengines.trainers.core.options import as_dict, parse_options
from gradengines.trainers.core.replicas import average_over_replicas, sync_buffers, unwrap
from gradengines.trainers.core.threads import threads_for_api

__all__ = ["GradientEngine", "StepOutput", "LossFn", "trainable_parameters", "write_grads"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class StepOutput:
    """What ``compute_grads`` returns besides the grads it writes."""

    loss: torch.Tensor  # () detached mean loss of the clean pass
    outputs: torch.Tensor  # (B, ...) detached model outputs of the clean pass


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` for every parameter that requires grad, in module order."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def write_grads(params: Iterable[nn.Parameter], grads: Iterable[torch.Tensor | None]) -> None:
    """Overwrite ``p.grad`` with ``g`` (zeros where ``g`` is None), in ``p``'s dtype (an engine's arithmetic under
    autocast may give half-precision gradients of float32 parameters, as autograd accumulates them in float32)."""
    for p, g in zip(params, grads, strict=True):
        p.grad = torch.zeros_like(p) if g is None else g.detach().to(p.dtype)


def _checked_first(compute_grads):
    """``compute_grads`` on its own copy of the batch (``own_copy``: whatever the engine's runs of the model
    write in place, the caller's tensors are not written), that first runs ``self.prepare`` on it (once per
    model); on a DDP-wrapped model, on its module, the gradients then averaged over the replicas."""
    @functools.wraps(compute_grads)
    def wrapper(self, model, inputs, targets, loss_fn):
        model, replicas = unwrap(model)
        inputs, targets = own_copy(inputs), own_copy(targets)
        if replicas is not None:
            sync_buffers(replicas)
        self.prepare(model, inputs, targets, loss_fn)
        stepped = self.__dict__.setdefault("_stepped_models", weakref.WeakSet())
        if model in stepped or type(self).__module__.startswith("gradengines."):
            out = compute_grads(self, model, inputs, targets, loss_fn)
        else:  # an engine from outside, its first batch: a failure in its arithmetic is one line, as a self-check's
            try:
                out = compute_grads(self, model, inputs, targets, loss_fn)
            except Exception as err:
                if type(err).__module__.startswith("gradengines.") or out_of_memory(err):
                    raise  # the framework's own errors say it all already; memory is the run's to report
                raise ModelConfigError(f"trainer '{self.name}' fails on this model's first batch ({one_line(err)}): "
                                       f"it cannot train {type(model).__name__} as it is") from err
            stepped.add(model)
        if replicas is not None:
            average_over_replicas(replicas, [p for _, p in trainable_parameters(model)])
        return out
    return wrapper


class GradientEngine:
    """Base class of all engines (see the module docstring for the contract). Every subclass's
    ``compute_grads`` runs ``prepare`` (``check``, ``first_batch_check``) on a model it has not seen before."""

    name: ClassVar[str] = ""
    """The engine's name (flags ``--<name>-<option>``, run folders, logs): its ``name`` attribute (its own, or that of
    the engine it extends), else its class name lower-cased; or the name it is registered under
    (``trainers.core.registry``)."""
    name_given: ClassVar[bool] = False
    """Whether the class set ``name`` itself (a registration under another name is then refused)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name_given = "name" in vars(cls)
        if not cls.name:  # neither it nor an engine it extends is named
            cls.name = cls.__name__.lower()
        if "compute_grads" in vars(cls):
            cls.compute_grads = _checked_first(vars(cls)["compute_grads"])  # type: ignore[method-assign]

    @dataclasses.dataclass
    class Options:
        """No options."""

    def __init__(self, **options: Any):
        self.options = parse_options(self.Options, options, prefix=f"{self.name}_")

    def check(self, model: nn.Module) -> None:
        """Raise ``IncompatibleModelError`` if this engine cannot train ``model``."""

    def first_batch_check(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                          loss_fn: LossFn) -> None:
        """Raise ``ModelConfigError`` (one line) if this engine's exact setting on the structure it found or was
        given in ``model`` does not give autograd's gradients on this batch (``trainers.core.self_check``);
        nothing to check by default."""

    def structure(self, model: nn.Module) -> str | None:
        """One line saying what this engine found or covers in ``model`` after ``prepare`` (the Trainer says it
        once per process), or None where there is nothing to say."""
        return None

    def prepare(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn) -> None:
        """The first time this engine sees ``model``: choose the process's CPU threads as the command line does
        (``trainers.core.threads.threads_for_api``), ``check`` (a model it cannot train is one line, not a failure
        inside its arithmetic) and ``first_batch_check`` on this batch. The Trainer calls it before anything is
        written; ``compute_grads`` calls it on its first batch."""
        model = unwrap(model)[0]
        checked = self.__dict__.setdefault("_checked_models", weakref.WeakSet())
        if model not in checked:
            threads_for_api()
            if not trainable_parameters(model):  # as the Trainer refuses it: an engine alone would write nothing
                raise ModelConfigError(f"trainer '{self.name}': {type(model).__name__} has no trainable parameter "
                                       f"(none at all, or every one has requires_grad=False): there is nothing to "
                                       f"train")
            self.check(model)
            self.first_batch_check(model, inputs, targets, loss_fn)
            checked.add(model)

    def compute_grads(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                      loss_fn: LossFn) -> StepOutput:
        """Fill ``p.grad`` of every trainable parameter; return the clean loss and outputs."""
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """Engine-specific scalars of the last step, logged under ``engine/<key>``."""
        return {}

    def state_dict(self) -> dict:
        """Engine state that must survive a checkpoint (e.g. adaptive feedbacks)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""

    def hparams(self) -> dict:
        """Options as a flat dict, for logs and checkpoints."""
        return {"trainer": self.name, **{f"{self.name}.{k}": v for k, v in as_dict(self.options).items()}}

    def __repr__(self):
        return f"{type(self).__name__}({as_dict(self.options)})"
