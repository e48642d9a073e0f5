"""How a model is called, and which part of what it returns is the output.

Every engine, the Trainer, ``gradient_agreement`` and the adapters call a model
through ``call_model(model, inputs, targets)``, so models written as people write
them train without a wrapper class:

* ``forward(x)`` returning a tensor (the zoo): called as is;
* ``forward(input, hidden)`` returning ``(output, hidden)`` (pytorch/examples'
  ``RNNModel``): a fresh state per batch, ``model.init_hidden(batch)`` when the
  model has one, else ``None``; the output is the tuple's first element;
* ``forward(idx, targets=None)`` returning ``(logits, loss)`` (nanoGPT's ``GPT``):
  the targets are passed by keyword (nanoGPT returns only the last position's
  logits without them); the output is the first element. A ``labels`` keyword
  (transformers' models) receives them only when the model's loss is used: the
  model would compute a loss every step that nothing reads;
* a dict (or a Hugging Face output) with ``logits``, an object with ``.logits``;
* a dict of named inputs (``input_ids`` and ``attention_mask``, ``pixel_values``): passed by keyword
  (``model(**inputs)``), the targets as above; a forward that names none of them (a wrapper's
  ``forward(x)``, as ``residual_stack``'s) is given the dict as its one input;
* a transformers encoder-decoder model (``config.is_encoder_decoder``: BART, T5,
  Marian, Pegasus, ...): the inputs go to the encoder and the targets, shifted by
  the model's own ``prepare_decoder_input_ids_from_labels`` (teacher forcing), to
  the decoder as ``decoder_input_ids``; the output at position t predicts target t.

The model is given its own copy of the batch (``own_copy``) at every call: a forward that writes
into its input (an in-place activation after a module an engine passes through, as discovery's
runs do; or the model's own ``x.mul_``) changes that copy only, so the caller's tensors, the
task's splits included, are never written, and every run of a check or an engine sees the batch
as given. A direct ``model(x)`` outside the framework changes ``x`` as PyTorch does.

These common shapes need no configuration; anything else (a dict without
``logits``, a tuple whose first element is not a tensor) is refused in one line
naming what came back and the option that says which part is the output. A
declaration overrides the defaults (``declare_call``; ``--model-call KEY=VALUE``
on the command line)::

    models.declare_call(model, output="logits", state="init_hidden", layout="time_first", loss="model")

``loss="model"``: where an engine needs only a loss (backprop, DSF, FT-BPTT,
Highway-BP over time) it uses the loss the model returns (the tuple's 0-d tensor
after the output, or ``loss`` of a dict or object) instead of the task's loss of
the output; engines that need the output error itself (FOTON, PEPITA, FA, DFA,
Highway-BP on a residual stack) and every evaluation use the task's loss.
On its first use the model's loss is compared with the task's loss of the same
outputs, in value and in its gradient at the outputs (``check_own_loss``): the
double shift is refused in one line, any other difference (an auxiliary term, as
a mixture-of-experts router's; smoothing; a regulariser) is legitimate and kept
for a note (``own_loss_difference``; ``loss="own"`` declares it, no note). The
double shift: a causal LM of transformers shifts ``labels`` itself, and the
task's targets are already the next tokens, so it would train on the token
after next (at initialisation the loss differs by only ~1e-3 relative; its
gradient at the outputs by ~1.4). ``targets="labels+shift_labels"`` passes the targets under both
keywords: transformers' causal-LM loss then scores every position against the
targets as given (passing the inputs as ``labels`` would score T - 1 positions).
``layout="time_first"``: the model takes (T, B, ...) inputs; the call transposes
the task's (B, T, ...) inputs and gives the output back as (B, T, ...) (a
flattened (T*B, V) output, as ``RNNModel`` returns, is unflattened first).
"""

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from gradengines.models.errors import ModelConfigError, one_line

__all__ = ["ModelCall", "CallResult", "declare_call", "call_model", "own_copy", "forward_loss", "check_own_loss",
           "model_call", "describe", "passes_state", "read_output", "own_loss_difference", "CALL_KEYS"]

TARGET_NAMES = ("targets", "target", "y")  # a forward parameter of this name receives the targets
OWN_LOSS_TARGET_NAMES = ("targets", "target", "labels", "y")  # ... and ``labels`` where the model's loss is used
LAYOUTS = ("batch_first", "time_first")
LOSSES = ("task", "model", "own")
CALL_KEYS = ("output", "state", "targets", "layout", "loss")


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """What to pass and what to read (module docstring); ``"auto"`` reads the forward's signature.

    output: ``"auto"``, a tuple index (int) or a dict key / attribute name (str).
    state: ``"auto"``, ``"none"`` (pass ``None``), ``"no"`` (pass nothing), or the name of a method
        called with the batch size for a fresh state (``"init_hidden"``).
    targets: ``"auto"``, ``"no"``, or the keyword that receives the targets; ``"a+b"`` passes them under
        both (``"labels+shift_labels"``: transformers' causal LMs, unshifted).
    layout: ``"batch_first"`` or ``"time_first"``.
    loss: ``"task"``, ``"model"`` (the model's own loss where an engine needs only a loss) or ``"own"`` (the
        same, declared to differ from the task's loss: no note of the difference).
    """

    output: int | str = "auto"
    state: str = "auto"
    targets: str = "auto"
    layout: str = "batch_first"
    loss: str = "task"

    def __post_init__(self):
        if isinstance(self.output, bool) or not isinstance(self.output, (int, str)) or self.output == "":
            raise ModelConfigError(f"model call: output is a tuple index, a key or an attribute name, got "
                                   f"{self.output!r}")
        if not isinstance(self.state, str) or not self.state.isidentifier():
            raise ModelConfigError(f"model call: state is auto, none, no or a name, got {self.state!r}")
        if not isinstance(self.targets, str) or not all(n.isidentifier() for n in self.targets.split("+")):
            raise ModelConfigError(f"model call: targets is auto, no, a keyword or keywords joined by '+', got "
                                   f"{self.targets!r}")
        if self.layout not in LAYOUTS:
            raise ModelConfigError(f"model call: layout is {' or '.join(LAYOUTS)}, got {self.layout!r}")
        if self.loss not in LOSSES:
            raise ModelConfigError(f"model call: loss is {' or '.join(LOSSES)}, got {self.loss!r}")

    def described(self) -> dict:
        """The fields that differ from the defaults (for records and messages)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}


@dataclasses.dataclass
class CallResult:
    outputs: torch.Tensor  # (B, ...) what the task's loss reads
    loss: torch.Tensor | None  # the model's own loss, when it returns one and it is declared to be used


def declare_call(model: nn.Module, call: ModelCall | None = None, **fields: Any) -> nn.Module:
    """Declare how ``model`` is called (a ``ModelCall``, or its fields); returns ``model``. Stored on the
    model (not a Parameter, not in its state_dict), so every engine and the Trainer read it. A model that is not
    an ``nn.Module``, or a field ``ModelCall`` does not have, is refused in one line (``ModelConfigError``)."""
    if not isinstance(model, nn.Module):
        raise ModelConfigError(f"declare_call needs a torch.nn.Module, got a {type(model).__name__}")
    known = [f.name for f in dataclasses.fields(ModelCall)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ModelConfigError(f"declare_call has no field {', '.join(unknown)}; its fields: {', '.join(known)}")
    if call is None:
        call = ModelCall(**fields)
    elif fields:
        call = dataclasses.replace(call, **fields)
    model.__dict__["gradengines_call"] = call
    model.__dict__.pop("_gradengines_plan", None)
    return model


def model_call(model: nn.Module) -> ModelCall:
    """The declared call of ``model`` (the defaults if none was declared)."""
    return model.__dict__.get("gradengines_call") or ModelCall()


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A call with the signature read: what exactly is passed."""

    state: str | None  # None: nothing; "none": None; else the method making a fresh state
    targets: tuple[str, ...]  # the keywords receiving the targets (none: not passed)
    call: ModelCall
    checked: list = dataclasses.field(default_factory=list)  # [True] once the model's own loss was compared


def _signature(model: nn.Module) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(model.forward).parameters.values())[1:]  # after the input
    except (TypeError, ValueError):
        return []


def _plan(model: nn.Module) -> _Plan:
    plan = model.__dict__.get("_gradengines_plan")
    if plan is not None:
        return plan
    call = model_call(model)
    params = _signature(model)
    named = {p.name for p in params} | ({"*"} if any(p.kind is p.VAR_KEYWORD for p in params) else set())
    targets = call.targets
    if targets == "auto":
        names = OWN_LOSS_TARGET_NAMES if call.loss != "task" else TARGET_NAMES
        targets = next((p.name for p in params if p.name in names and p.kind is not p.POSITIONAL_ONLY), "no")
    for name in targets.split("+") if targets != "no" else ():
        if name not in named and "*" not in named:
            raise ModelConfigError(f"model call: {type(model).__name__}.forward has no parameter '{name}' for the "
                                   f"targets (its parameters: {', '.join(p.name for p in params) or 'the input only'})")
    state = call.state
    if state == "auto":
        required = [p for p in params if p.default is p.empty and p.name not in targets.split("+")
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        state = ("init_hidden" if callable(getattr(model, "init_hidden", None)) else "none") if required else "no"
    elif state not in ("none", "no") and not callable(getattr(model, state, None)):
        raise ModelConfigError(f"model call: {type(model).__name__} has no method '{state}' making a fresh state")
    plan = _Plan(None if state == "no" else state, () if targets == "no" else tuple(targets.split("+")), call)
    model.__dict__["_gradengines_plan"] = plan
    return plan


def describe(model: nn.Module, targets: bool = True) -> str:
    """How ``model`` is called, e.g. ``model(inputs, model.init_hidden(B))``, for messages (``targets=False``:
    as called without targets)."""
    plan = _plan(model)
    args = ["inputs"]
    if plan.state == "none":
        args.append("None")
    elif plan.state is not None:
        args.append(f"model.{plan.state}(B)")
    args.extend(f"{name}=targets" for name in plan.targets if targets)
    return f"model({', '.join(args)})"


def passes_state(model: nn.Module) -> bool:
    """Whether ``model`` is called with a state (a recurrent forward, which may read (T, B) inputs)."""
    return _plan(model).state is not None


def _hint(what: str) -> str:
    return (f"say which part is the {what}: --model-call {what}=INDEX|KEY|ATTRIBUTE "
            f"(Python: models.declare_call(model, {what}=...))")


def _pick(value: Any, where: int | str, what: str) -> Any:
    """Element ``where`` of a tuple, key of a mapping or attribute of an object."""
    if isinstance(value, (tuple, list)):
        if not isinstance(where, int) or not -len(value) <= where < len(value):
            raise ModelConfigError(f"model's forward returns a {type(value).__name__} of {len(value)}; {what} "
                                   f"{where!r} is not one of its positions")
        return value[where]
    if isinstance(value, Mapping) and where in value:
        return value[where]
    if isinstance(where, str) and not isinstance(value, Mapping) and hasattr(value, where):
        return getattr(value, where)
    keys = f" with keys {', '.join(map(str, value))}" if isinstance(value, Mapping) else ""
    raise ModelConfigError(f"model's forward returns a {type(value).__name__}{keys}, which has no {what} "
                           f"{where!r}")


def read_output(value: Any) -> torch.Tensor:
    """The common shapes (module docstring), or one line naming what came back."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    if isinstance(value, Mapping):
        if isinstance(value.get("logits"), torch.Tensor):
            return value["logits"]
        tensors = [k for k, v in value.items() if isinstance(v, torch.Tensor)]
        if len(tensors) == 1:
            return value[tensors[0]]
        raise ModelConfigError(f"model's forward returns a {type(value).__name__} with keys "
                               f"{', '.join(map(str, value)) or 'none'} and none is 'logits'; {_hint('output')}")
    if isinstance(getattr(value, "logits", None), torch.Tensor):
        return value.logits
    if isinstance(value, (tuple, list)):
        first = type(value[0]).__name__ if value else "nothing"
        raise ModelConfigError(f"model's forward returns a {type(value).__name__} whose first element is "
                               f"{first}, not a tensor; {_hint('output')}")
    raise ModelConfigError(f"model's forward returns a {type(value).__name__}, not a tensor, a tuple, a dict or an "
                           f"object with .logits; {_hint('output')}")


def _find_loss(value: Any, output: torch.Tensor, mode: str) -> torch.Tensor:
    """The model's own loss: a 0-d tensor of a tuple other than the output, or ``loss`` of a dict or object."""
    if isinstance(value, (tuple, list)):
        found = [v for v in value if isinstance(v, torch.Tensor) and v.dim() == 0 and v is not output]
    elif isinstance(value, Mapping):
        found = [value["loss"]] if isinstance(value.get("loss"), torch.Tensor) else []
    else:
        found = [value.loss] if isinstance(getattr(value, "loss", None), torch.Tensor) else []
    if len(found) != 1 or found[0].dim() != 0:
        raise ModelConfigError(f"model call: loss={mode}, but the forward returns no single scalar loss "
                               f"(a {type(value).__name__}); with targets passed by keyword it should")
    return found[0]


def own_copy(value: Any) -> Any:
    """``value`` with every tensor in it cloned (contiguous; a tensor's graph kept), in the same tuples, lists
    and dicts: what code that runs a model is handed instead of the caller's tensors (module docstring)."""
    if isinstance(value, torch.Tensor):
        return value.clone(memory_format=torch.contiguous_format)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(own_copy(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(own_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: own_copy(v) for k, v in value.items()}
    return value


def call_model(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> CallResult:
    """Call ``model`` as declared (module docstring) on its own copy of a (B, ...) batch (``own_copy``); the
    outputs come back (B, ...)."""
    inputs, targets = own_copy(inputs), own_copy(targets)
    plan = _plan(model)
    call = plan.call
    time_first = call.layout == "time_first"
    if isinstance(inputs, Mapping):  # a dict batch (input_ids and attention_mask, ...): passed by keyword
        if time_first or call.state not in ("auto", "no"):  # a state read from the signature does not apply
            raise ModelConfigError(f"a batch of named inputs ({', '.join(map(str, inputs))}) is passed by keyword, "
                                   f"so the model call cannot also {'transpose it' if time_first else 'pass a state'}"
                                   f"; drop --model-call {'layout' if time_first else 'state'}=")
        kwargs = _target_kwargs(model, plan, targets, False)
        if _takes_names(model, inputs):
            return CallResult(*_result(call, model(**inputs, **kwargs), targets))
        return CallResult(*_result(call, model(inputs, **kwargs), targets))  # a wrapper: the batch as its input
    x = inputs.transpose(0, 1) if time_first else inputs
    args: list[Any] = [x]
    if plan.state == "none":
        args.append(None)
    elif plan.state is not None:
        args.append(getattr(model, plan.state)(inputs.shape[0]))
    value = model(*args, **_target_kwargs(model, plan, targets, time_first))
    outputs, loss = _result(call, value, targets)
    if time_first:
        outputs = _batch_first(outputs, inputs.shape[1], inputs.shape[0])
    return CallResult(outputs, loss)


def _takes_names(model: nn.Module, inputs: Mapping) -> bool:
    """Whether ``model``'s forward takes the named inputs by keyword (a parameter of each name, or ``**kwargs``);
    a forward that names none of them (a wrapper, ``forward(x)``) is given the dict as its one input."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD for p in params) or any(p.name in inputs for p in params)


def _target_kwargs(model: nn.Module, plan: "_Plan", targets: torch.Tensor | None, time_first: bool) -> dict:
    """The keyword arguments that carry the targets (and an encoder-decoder's decoder inputs)."""
    kwargs = {}
    if targets is not None:
        passed = (targets.transpose(0, 1) if time_first and targets.dim() > 1 else targets).contiguous()
        kwargs = dict.fromkeys(plan.targets, passed)  # contiguous: transformers' losses view them
    if _encoder_decoder(model) and "labels" not in kwargs and not _classifies(model, targets):
        kwargs["decoder_input_ids"] = _decoder_inputs(model, targets)
    return kwargs


def _result(call: ModelCall, value: Any, targets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the output, the model's own loss or None) of what the forward returned."""
    if isinstance(value, torch.Tensor) and call.output == "auto":
        outputs = value
    else:
        outputs = read_output(value) if call.output == "auto" else _pick(value, call.output, "output")
        if not isinstance(outputs, torch.Tensor):
            raise ModelConfigError(f"model's output {call.output!r} is a {type(outputs).__name__}, not a tensor")
    loss = _find_loss(value, outputs, call.loss) if call.loss != "task" and targets is not None else None
    return outputs, loss


def _encoder_decoder(model: nn.Module) -> bool:
    """A transformers sequence-to-sequence model (BART, T5, Marian, ...): its decoder reads the targets (an
    encoder-only head of such a family, as WhisperForAudioClassification, takes no decoder inputs)."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return False
    try:
        return "decoder_input_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _classifies(model: nn.Module, targets: torch.Tensor | None) -> bool:
    """A sequence-classification or question-answering head of an encoder-decoder family (BART's, T5's, ...),
    given one label per example (a class, or a start position): it makes its decoder's inputs from its own input
    ids (transformers' shift), so none are passed; its LM head is not."""
    return (type(model).__name__.endswith(("ForSequenceClassification", "ForQuestionAnswering"))
            and targets is not None and targets.dim() == 1 and not targets.is_floating_point())


def _decoder_inputs(model: nn.Module, targets: torch.Tensor | None) -> torch.Tensor:
    """The decoder's inputs made from the targets by the model's own shift (teacher forcing: position t reads
    targets before t, from the decoder's start token), as transformers does when given ``labels``; a config
    without a start token (T5's, built by name) starts from id 0, T5's pad token, as T5 does."""
    if targets is None or targets.dim() != 2 or targets.is_floating_point():
        shape = "none" if targets is None else tuple(targets.shape)
        raise ModelConfigError(f"{type(model).__name__} is an encoder-decoder model: its decoder reads the target "
                               f"tokens (B, T), got {shape}; train it on a sequence-to-sequence task (copy, ...)")
    config = model.config
    start = getattr(config, "decoder_start_token_id", None)
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if prepare is not None and start is not None:
        return prepare(labels=targets)
    shifted = targets.new_full(targets.shape, 0 if start is None else start)
    shifted[:, 1:] = targets[:, :-1]
    return shifted.masked_fill(shifted < 0, getattr(config, "pad_token_id", None) or 0)


def _batch_first(outputs: torch.Tensor, steps: int, batch: int) -> torch.Tensor:
    """(T, B, ...) or a flattened (T*B, ...) output as (B, T, ...)."""
    if outputs.shape[:2] != (steps, batch):
        if outputs.shape[0] != steps * batch:
            raise ModelConfigError(f"model call: layout=time_first, but the output {tuple(outputs.shape)} is "
                                   f"neither (T={steps}, B={batch}, ...) nor (T*B, ...)")
        outputs = outputs.reshape(steps, batch, *outputs.shape[1:])
    return outputs.transpose(0, 1)


def forward_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(outputs, loss)`` of one forward: the model's own loss if declared (``loss="model"`` or ``"own"``), else
    the task's. The model's own loss is checked against the task's on its first use (``check_own_loss``); how far
    it is from it is kept for ``own_loss_difference``."""
    result = call_model(model, inputs, targets)
    if result.loss is None:
        return result.outputs, loss_fn(result.outputs, targets)
    plan = _plan(model)
    if not plan.checked:
        plan.checked.append(check_own_loss(result.loss, result.outputs, targets, loss_fn, model_call(model).loss))
    return result.outputs, result.loss


def own_loss_difference(model: nn.Module) -> str | None:
    """How far the model's own loss was from the task's loss on its first use (``check_own_loss``'s words), or
    None: equal, declared to differ (``loss="own"``), not used or not yet checked."""
    plan = model.__dict__.get("_gradengines_plan")
    if plan is None or not plan.checked or plan.call.loss != "model":
        return None
    return plan.checked[0]


VALUE_RTOL = 1e-5  # float32 rounding of one cross-entropy: ~1e-7 relative; the double shift at initialisation: ~1e-3
GRADIENT_RTOL = 1e-3  # ||d own/d y - d task/d y|| / ||d task/d y||: ~1e-6 in float32; the double shift: ~1.4


def _loss_and_grad(loss_fn, outputs: torch.Tensor, targets: torch.Tensor):
    """``(value, gradient at outputs)`` of ``loss_fn`` in float64 (the gradient None where it has none)."""
    with torch.enable_grad():
        probe = outputs.detach().double().requires_grad_()
        value = loss_fn(probe, targets)
        grad = torch.autograd.grad(value, probe)[0] if value.requires_grad else None
    return float(value.detach()), grad


def _shifted_once_more(loss_fn, outputs: torch.Tensor, targets: torch.Tensor):
    """The task's loss against targets shifted once more (position t scored against target t + 1: a causal LM
    that shifts ``labels`` itself, given targets that are already the next tokens), as ``(value, gradient at the
    full outputs)``; None where the outputs are not (B, T, V) token scores of (B, T) targets."""
    if outputs.dim() != 3 or targets.dim() != 2 or targets.is_floating_point() or outputs.shape[:2] != targets.shape \
            or targets.shape[1] < 2:
        return None
    try:
        return _loss_and_grad(lambda y, t: loss_fn(y[:, :-1], t[:, 1:].contiguous()), outputs, targets)
    except (RuntimeError, IndexError, ValueError):
        return None


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-300))


def check_own_loss(own: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], mode: str = "model") -> str | None:
    """Compare a model's own loss with the task's loss ``loss_fn(outputs, targets)`` of its outputs: refuse (one
    line) what is known to be wrong, return how far anything else is (None: the same).

    The same: in value (relative ``VALUE_RTOL``, or 16 ulp of a coarser dtype) and, where the loss is computed
    from the returned outputs, in its gradient at them (relative ``GRADIENT_RTOL``). Refused: the double shift, a
    loss that is the task's loss against targets shifted once more, in its gradient at the outputs (which an
    auxiliary term that does not read them, as a mixture-of-experts router's, leaves as it is) or, with no
    gradient to compare, in value: at initialisation it is within 1e-3 of the right loss in value, but its
    gradient points at the token after next (relative difference ~sqrt(2)). Anything else differs legitimately
    (an auxiliary loss, label smoothing, a regulariser): the returned words say by how much. A loss that is not
    finite is refused (nothing trains on it). ``mode``: how the loss was declared (``model`` or ``own``), as the
    refusals say it."""
    if not bool(torch.isfinite(own.detach()).all()):
        raise ModelConfigError(f"model call: loss={mode}, but the model's own loss is {float(own.detach())} on the "
                               f"first batch: nothing can train on it; fix its forward, or use the task's loss "
                               f"(no loss={mode})")
    try:
        theirs, task_grad = _loss_and_grad(loss_fn, outputs, targets)
    except (RuntimeError, IndexError, ValueError) as err:  # e.g. a model's own ignore index (nanoGPT: -1)
        raise ModelConfigError(f"model call: loss={mode}, but the task's loss, which it is compared with, cannot be "
                               f"computed on these targets ({one_line(err)})") from None
    mine = float(own.detach())
    tolerance = max(VALUE_RTOL, 16 * torch.finfo(outputs.dtype).eps) if outputs.is_floating_point() else VALUE_RTOL
    own_grad = None
    if own.requires_grad and outputs.requires_grad:
        own_grad = torch.autograd.grad(own, outputs, retain_graph=True, allow_unused=True)[0]
    gap = abs(mine - theirs) / max(abs(theirs), 1e-12)
    grad_gap = _relative(own_grad, task_grad) if own_grad is not None and task_grad is not None else None
    if gap <= tolerance and (grad_gap is None or grad_gap <= max(GRADIENT_RTOL, tolerance)):
        return None
    shifted = _shifted_once_more(loss_fn, outputs, targets)
    if shifted is not None:
        value, grad = shifted
        double = (_relative(own_grad, grad) <= max(GRADIENT_RTOL, tolerance) if own_grad is not None
                  and grad is not None else abs(mine - value) <= tolerance * max(abs(value), 1e-12))
        if double:
            raise ModelConfigError(
                f"model call: loss={mode}, but the model's own loss {mine:.8g} is the task's loss against targets "
                f"shifted once more (the task's loss of its outputs: {theirs:.8g}), on the first batch: a causal LM "
                f"that shifts `labels` itself (transformers' *ForCausalLM) while the task's targets are already the "
                f"next tokens, which trains on the token after next. Pass them unshifted: --model-call "
                f"targets=labels+shift_labels (Python: models.declare_call(model, loss='model', "
                f"targets='labels+shift_labels')), or use the task's loss (no loss=model)")
    apart = f", its gradient at the outputs {grad_gap:.2g} relative apart" if grad_gap is not None else ""
    return (f"the model's own loss is {mine:.6g} where the task's loss of its outputs is {theirs:.6g} on the first "
            f"batch (relative difference {gap:.2g}{apart})")
