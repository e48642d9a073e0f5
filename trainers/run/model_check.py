"""The check every model passes before training: it maps the task's inputs to outputs of the task's shape,
in eval and in training mode, called as declared (``models.adapters.calling``); every failure is one line."""

import torch

from gradengines.models.adapters.calling import call_model, forward_loss, model_call, own_loss_difference, passes_state
from gradengines.models.adapters.calling import describe as describe_call
from gradengines.models.errors import ModelConfigError, one_line
from gradengines.tasks.errors import TaskConfigError
from gradengines.trainers.core.errors import ConfigError, held_back, on_command_line
from gradengines.trainers.core.self_check import kept
from gradengines.trainers.run.notes import note

__all__ = ["check_task_model", "to_device"]

OWN_IN_PYTHON = "declare_call(model, loss='own')"


def to_device(x, device, dtype):
    """Move a batch of inputs (a tensor or a dict of tensors) to ``device``; only floating-point inputs take
    ``dtype`` (token ids and masks stay as they are)."""
    if isinstance(x, dict):
        return {key: to_device(value, device, dtype) for key, value in x.items()}
    return x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device=device)


def check_task_model(model, task, device="cpu", dtype=torch.float32) -> None:
    """Raise ``ConfigError`` (one line) if ``model`` cannot map the task's inputs to its outputs, in eval mode
    and in training mode (its buffers, e.g. BatchNorm statistics, put back after), or returns no tensor; or if
    its own loss, where declared (``loss="model"``), is the task's loss against targets shifted once more
    (``check_own_loss``); a note says how far any other own loss is from the task's (none with ``loss="own"``)."""
    x, targets = task.train.take(slice(0, 2))
    x, targets = to_device(x, device, dtype), targets.to(device)
    # its modes and buffers (BatchNorm statistics) put back after; transformers' own warnings ("loss_type=None ...
    # unrecognized") held back: the refusal below says what matters, in one line
    with kept(model), held_back("transformers"):
        for mode in (False, True):
            model.train(mode)
            try:
                with torch.no_grad():
                    y = call_model(model, x, targets).outputs
            except ModelConfigError:  # the call or its return value, said in one line
                raise
            except (RuntimeError, IndexError) as err:  # shape mismatch, or token ids outside an embedding
                raise ConfigError(
                    f"model does not accept the inputs of task '{task.name}' (per-sample shape "
                    f"{tuple(task.input_shape)}, {task.in_features} features)"
                    f"{' in training mode' if mode else ''}: {str(err).strip().splitlines()[0]}{_called(model)}"
                ) from None
            except Exception as err:  # anything a user's forward raises
                raise ConfigError(f"model's forward failed{' in training mode' if mode else ''} on a batch of "
                                  f"task '{task.name}': {one_line(err)}{_called(model)}") from None
        if model_call(model).loss != "task":
            model.eval()
            try:
                with torch.enable_grad():  # the first use compares it with the task's loss
                    _, own = forward_loss(model, x, targets, task.loss_fn)
            except ModelConfigError as err:
                raise ConfigError(str(err)) from None
            _check_trainable(model, own)
            difference = own_loss_difference(model)
            if difference is not None:
                note(f"loss=model: {difference}; backprop, DSF, FT-BPTT and Highway-BP over time train on the "
                     f"model's own loss (an auxiliary term, smoothing or a regulariser is its own to add), the "
                     f"engines that need the output error and every evaluation on the task's; "
                     f"{'--model-call loss=own' if on_command_line() else OWN_IN_PYTHON} "
                     f"declares that it differs and drops this line")
    expected = tuple(task.expected_output_shape)
    if tuple(y.shape[1:]) != expected:
        classes = f" ({task.num_outputs} classes)" if len(expected) == 1 else ""
        raise ConfigError(
            f"model outputs {tuple(y.shape[1:])} per sample but task '{task.name}' expects {expected}{classes}"
        )
    _check_task_loss(task, y, targets)


def _check_task_loss(task, outputs: torch.Tensor, targets: torch.Tensor) -> None:
    """The task's loss of the first batch is one number, a tensor the engines can differentiate: a loss with
    reduction='none' (one per example) or a Python float ended in autograd's own words at step 0, the run's folder
    written; refused here, before it is."""
    name = getattr(task.loss_fn, "__name__", type(task.loss_fn).__name__)
    try:
        loss = task.loss_fn(outputs.detach().requires_grad_(), targets)
    except Exception as err:  # the user's loss on the model's own outputs
        raise TaskConfigError(f"task '{task.name}': its loss {name} fails on the model's outputs "
                              f"{tuple(outputs.shape)} and targets {tuple(targets.shape)}: {one_line(err)}") from None
    if not isinstance(loss, torch.Tensor):
        raise TaskConfigError(f"task '{task.name}': its loss {name} returned a {type(loss).__name__}, not a tensor: "
                              f"compute it with torch from the outputs, so that it has a gradient")
    if loss.numel() != 1:
        raise TaskConfigError(f"task '{task.name}': its loss {name} returned a tensor of shape {tuple(loss.shape)}, "
                              f"not one number: reduce it over the batch (reduction='mean')")
    if not loss.requires_grad:
        raise TaskConfigError(f"task '{task.name}': its loss {name} is detached from the outputs (no gradient "
                              f"reaches the model): compute it from them with torch, without .item() or .detach()")


def _check_trainable(model, own: torch.Tensor) -> None:
    """A model's own loss must have a gradient with respect to some parameter: one detached from the graph or
    constant in the parameters trains nothing (refused here, before the run is written, not at step 0)."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(own, params, allow_unused=True) if own.requires_grad and params else []
    if not any(g is not None and bool(g.ne(0).any()) for g in grads):
        mode = model_call(model).loss
        why = "detached from the graph" if not own.requires_grad else "constant in every parameter"
        raise ConfigError(f"model call: loss={mode}, but the model's own loss has no gradient on the first batch "
                          f"({why}): nothing would train; return a loss computed from the parameters, or use the "
                          f"task's loss (no loss={mode})")


def _called(model) -> str:
    """How the model was called, where that is more than ``model(inputs)`` (said in refusals)."""
    how = describe_call(model)
    if how == "model(inputs)" and not model_call(model).described():
        return ""
    layout = "; a model that reads (T, B) inputs needs --model-call layout=time_first" \
        if passes_state(model) and model_call(model).layout != "time_first" else ""
    return f" (called as {how}{layout})"
