"""``--compile BACKEND``: the model's forward compiled by ``torch.compile`` (``nn.Module.compile``, in place: the
same module, parameters and state_dict), for every engine that runs on it as it runs eagerly.

Whether an engine does is proved on the first batch, not assumed (``compile_checked``): a fresh copy of the engine
computes the gradients eagerly, then on the compiled model three times, and the run's engine makes its own
first-batch check on it. The run is refused in one line, naming why, where the compiled run fails (FA's first-batch
check on a transformer: dynamo's donated buffers refuse the graph its check keeps), where its gradients differ from
the eager ones beyond the self-check's tolerance, or where the third call still compiles (a step that
recompiles every time: a guard on a value that changes at each call). An engine that never calls the model's
forward (Highway-BP on a declared residual stack, the layer-stack passes of FA, DFA, PEPITA and FOTON on the zoo's
MLP: they run the blocks or layers themselves) gains nothing from it; that is said in one line, and the run goes on.

Dynamo's caches are reset before the check: a graph compiled earlier in the process for another engine (reused by
the guards of the same forward) could otherwise decide the verdict. ``inductor`` is torch's compiler (code
generated: minutes on a CPU for a first compile); ``aot_eager`` traces the same graphs (forward and backward)
without generating code, what the tests use.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from gradengines.models.errors import one_line
from gradengines.trainers.core.engine import GradientEngine, LossFn, trainable_parameters
from gradengines.trainers.core.errors import ConfigError, held_back
from gradengines.trainers.core.options import as_dict
from gradengines.trainers.core.self_check import differences

__all__ = ["compile_checked"]


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _grads(engine: GradientEngine, model: nn.Module, inputs, targets, loss_fn: LossFn) -> list[torch.Tensor]:
    named = trainable_parameters(model)
    for _, p in named:
        p.grad = None
    engine.compute_grads(model, inputs, targets, loss_fn)
    grads = [p.grad.detach().clone() for _, p in named]
    for _, p in named:
        p.grad = None
    return grads


def compile_checked(model: nn.Module, engine: GradientEngine, inputs, targets, loss_fn: LossFn,
                    backend: str) -> str | None:
    """Compile ``model`` in place with ``backend`` where ``engine`` gives its eager gradients on this batch
    (module docstring); returns a line to say where the engine does not use the compiled forward, else None.
    ``ConfigError`` (one line) otherwise, the model left uncompiled."""
    names = [name for name, _ in trainable_parameters(model)]
    rng = torch.random.get_rng_state()
    eager = _grads(_fresh(engine), model, inputs, targets, loss_fn)
    torch.random.set_rng_state(rng)
    why = f"trainer '{engine.name}' under --compile {backend}"
    calls = [0]
    torch._dynamo.reset()  # the verdict must not depend on graphs this process compiled before (another engine's)
    try:
        with _dynamo_quiet():  # the compiler's own warnings (a recompile limit hit, a frame it cannot trace) unsaid:
            model.compile(backend=backend)  # the verdict below says what matters in one line
            compiled_call = model._compiled_call_impl

            def counted(*args, **kwargs):  # does the engine call the compiled forward at all?
                calls[0] += 1
                return compiled_call(*args, **kwargs)

            model._compiled_call_impl = counted
            checked = _fresh(engine)
            compiled = _grads(checked, model, inputs, targets, loss_fn)
            _grads(checked, model, inputs, targets, loss_fn)  # a second call may still compile once (dynamic shapes)
            before = _graphs()
            again = _grads(checked, model, inputs, targets, loss_fn)
            recompiled = _graphs() - before
            engine.prepare(model, inputs, targets, loss_fn)  # the run's engine: its own first-batch check, compiled
    except Exception as err:  # torch's compiler, or the engine on the compiled model
        _uncompile(model)
        raise ConfigError(f"{why} fails on the first batch ({one_line(err)}); train without --compile") from None
    finally:
        torch.random.set_rng_state(rng)
    model._compiled_call_impl = compiled_call
    dtype = next(p.dtype for _, p in trainable_parameters(model))
    wrong = differences(names, compiled, eager, dtype) or differences(names, again, eager, dtype)
    if wrong:
        _uncompile(model)
        raise ConfigError(f"{why}: {len(wrong)} of {len(names)} parameter gradients differ from the eager ones on the "
                          f"first batch (first {', '.join(n for n, _ in wrong[:3])}); train without --compile")
    if recompiled:
        _uncompile(model)
        raise ConfigError(f"{why}: the model's forward is compiled again at every step ({recompiled} new graph(s) at "
                          f"the third call on the first batch): nothing would be saved; train without --compile")
    if calls[0] == 0:
        return (f"--compile: trainer '{engine.name}' does not call {type(model).__name__}'s forward (it runs the "
                f"blocks or layers itself): nothing it runs is compiled")
    return None


@contextlib.contextmanager
def _dynamo_quiet():
    """torch._dynamo's log records and warnings below errors held back while the check runs."""
    with held_back("torch._dynamo"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torch\._dynamo")
        yield


def _fresh(engine: GradientEngine) -> GradientEngine:
    """A new engine of ``engine``'s kind and options: the check leaves the run's engine as it was."""
    return type(engine)(**as_dict(engine.options))


def _uncompile(model: nn.Module) -> None:
    model._compiled_call_impl = None  # nn.Module.compile's one attribute: calls go to the forward again
