"""The first-batch self-check: an engine that claims an exact setting on a structure it found or was given
proves it on one batch, against torch autograd of the model's own forward, before any training.

A found structure can be wrong in ways a forward check cannot see: a side input whose cotangent is dropped
(an encoder's output read by every decoder block), a weight transform a layer-local function bypasses (weight
standardisation), a second chain left out. Each such fault makes some parameter's gradient wrong, so the
check compares every trainable parameter, after which the engine is exact at its exact setting by
construction, not by luck. Engines call ``refuse_differences`` with the two gradient lists; a difference is
one ``ModelConfigError`` line naming the first parameters that differ, how many, the likely cause and what
to do. ``quiet`` runs both sides alike: eval mode (no dropout draw, no BatchNorm update), buffers and the
random generators put back after, so a run with the check trains exactly as one without it.

The measure of a parameter p, with g its gradient by autograd and G the norm of all of them:
``||got_p - g_p|| / (||g_p|| + 1e-3 G)`` (a parameter whose true gradient is zero, as a key bias under
softmax, is measured against the whole gradient, not against its own rounding). It must stay below
``tolerance(dtype)``: 1e-6 in float64 (exact paths reach 1e-15; the floor admits layers that compute in
float32 whatever the input's dtype, as Qwen2's and Mistral's RMSNorm, which agree to ~1e-8), 1e-3 in
float32, 3e-2 in half precision (bfloat16 or float16, and under autocast in either: the check runs under the run's
autocast, ``--precision``). A dropped cotangent gives 1.0 on the parameters it misses.
"""

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from gradengines.models.adapters.calling import call_model
from gradengines.models.errors import ModelConfigError, one_line
from gradengines.trainers.core.precision import autocast_dtype

__all__ = ["kept", "quiet", "autograd_reference", "fresh_eval", "failures_refused", "tolerance", "loosest",
           "differences", "refuse_differences"]

_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}


def tolerance(dtype: torch.dtype) -> float:
    """The largest measure (module docstring) a parameter may have at an exact setting in ``dtype``, or in the
    half precision autocast computes in where it is on (``trainers.core.precision``)."""
    return _TOLERANCE.get(autocast_dtype() or dtype, 3e-2)


def loosest(params: Sequence[torch.Tensor]) -> torch.dtype:
    """The least precise dtype among ``params``: a model with a float32 layer inside float64 is checked at
    float32's tolerance."""
    return max((p.dtype for p in params), key=lambda dtype: torch.finfo(dtype).eps)


@contextlib.contextmanager
def kept(model: nn.Module) -> Iterator[None]:
    """Each module's mode and every buffer (BatchNorm statistics) put back after whatever runs inside, a buffer
    written only where it changed (one nothing wrote keeps its version counter); eval-mode caches dropped on
    the way out (``fresh_eval``)."""
    modes = {m: m.training for m in model.modules()}
    buffers = [(b, b._version, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        model.train()
        for module, mode in modes.items():
            module.training = mode
        with torch.no_grad():
            for b, version, saved in buffers:
                if b._version != version:
                    b.copy_(saved)


@contextlib.contextmanager
def quiet(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode with its modes, buffers and the random generators (CPU and the model's device) put
    back after (``kept``): a check that runs the model leaves no trace on training."""
    devices = sorted({b.device.index or 0 for b in [*model.parameters(), *model.buffers()]
                      if b.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), kept(model):
        fresh_eval(model)
        yield


def autograd_reference(model: nn.Module, inputs, targets, loss_fn, params: list) -> tuple:
    """(outputs, gradients of ``params``) of the model's own forward and the task's loss, by torch autograd: what
    a check compares with. The graph is kept: a tensor an eval-mode forward caches (timm's attention biases)
    is read again by the engine's pass."""
    outputs = call_model(model, inputs, targets).outputs
    return outputs, torch.autograd.grad(loss_fn(outputs, targets), params, allow_unused=True, retain_graph=True)


def fresh_eval(model: nn.Module) -> None:
    """``model`` in eval mode without what an earlier eval-mode forward cached: timm's attention-bias caches
    (LeViT, EfficientFormer-V2) keep one tensor, with its graph, for every forward in eval mode and drop it on
    ``train()``; each pass of a check builds its own, as a training step would."""
    model.train()
    model.eval()


@contextlib.contextmanager
def failures_refused(engine: str, opt_out: str) -> Iterator[None]:
    """Anything the check's run raises besides a ``ModelConfigError`` (a layer output changed in place, a layer
    that computes in another dtype, a shape the structure did not foresee) as one line: the engine cannot
    run this model as found; no traceback."""
    try:
        yield
    except ModelConfigError:
        raise
    except Exception as err:
        raise ModelConfigError(f"self-check: {engine} fails on this model's first batch ({one_line(err)}): the "
                               f"structure does not run as the model does; train it with backprop, or skip the check "
                               f"with {opt_out} to see where it fails") from None


def differences(names: Sequence[str], got: Sequence[torch.Tensor | None], expected: Sequence[torch.Tensor | None],
                dtype: torch.dtype) -> list[tuple[str, float]]:
    """(name, measure) of every parameter whose measure exceeds ``tolerance(dtype)``, largest first (a missing
    gradient is a zero one)."""
    pairs = [(e if e is not None else g, g, e) for g, e in zip(got, expected, strict=True)]
    total = sum(float(like.detach().double().norm()) ** 2 for like, _, e in pairs if e is not None) ** 0.5
    out = []
    for name, (like, g, e) in zip(names, pairs, strict=True):
        if like is None:
            continue
        g = torch.zeros_like(like) if g is None else g
        e = torch.zeros_like(like) if e is None else e
        if g.shape != e.shape:
            out.append((name, float("inf")))
            continue
        gap = float((g.detach().double() - e.detach().double()).norm())
        measure = gap / (float(e.detach().double().norm()) + 1e-3 * total + 1e-300)
        if measure > tolerance(dtype):
            out.append((name, measure))
    return sorted(out, key=lambda item: -item[1])


def refuse_differences(what: str, names: Sequence[str], got, expected, dtype: torch.dtype,
                       cause: str | Callable[[list[str]], str], opt_out: str) -> None:
    """One ``ModelConfigError`` line if ``got`` is not ``expected`` (``differences``): ``what`` was compared,
    the first parameters that differ and how many, ``cause`` (the likely reason and what to do; or a function of
    the names that differ that says it) and ``opt_out``."""
    wrong = differences(names, got, expected, dtype)
    if not wrong:
        return
    if callable(cause):
        cause = cause([name for name, _ in wrong])
    first = ", ".join(f"{name} ({measure:.2g})" for name, measure in wrong[:3])
    raise ModelConfigError(
        f"self-check: {what} does not equal autograd of the model's own forward on the first batch: "
        f"{len(wrong)} of {len(names)} parameter gradients differ (relative, tolerance {tolerance(dtype):g} in "
        f"{str(dtype).removeprefix('torch.')}), first {first}; {cause} (a model checked once may skip this with "
        f"{opt_out})")
