"""A user's residual network (a ResNet-style MLP, a nanoGPT-style Transformer) as a residual
stack, the structure Highway-BP works on, without rewriting it: found from an example run
(``models.residual_stack(model, example=inputs)``, ``models.adapters.discovery``: transformers'
GPT-2, Llama, BERT, timm's ResNets and ViTs, nanoGPT), or declared by hand:

    stack = models.residual_stack(
        gpt,
        stem=lambda idx: gpt.transformer.drop(gpt.transformer.wte(idx) + gpt.transformer.wpe(positions(idx))),
        blocks=[pair for b in gpt.transformer.h for pair in ((b.ln_1, b.attn), (b.ln_2, b.mlp))],
        head=lambda h: gpt.lm_head(gpt.transformer.ln_f(h)),
        example=idx)                                      # checks the declaration against gpt(idx)
    trainers.build_engine("highway", k=2).compute_grads(stack, idx, targets, loss_fn)

A residual stack is ``h_0 = stem(x)``, ``h_i = combine_i(h_{i-1}, branch_i(h_{i-1}))``,
``y = head(h_L)`` (``trainers.core.protocols.ResidualStack``). Each entry of ``blocks`` is
one residual sublayer ``h + fn(norm(h))``: a module ``fn`` or a pair ``(norm, fn)``
of the user's modules (a nanoGPT Block is two of them: attention and MLP).
``gamma`` is Highway-BP's split of the residual (the paper's App. G):
``branch = fn(norm(h)) + gamma h``, ``combine = (1 - gamma) h + branch``, the same
function for any gamma. ``stem`` and ``head`` are callables on the user's modules.
The view's Parameters are the user's objects (registered once, under ``model``);
its forward is ``head(blocks(stem(x)))``, which must be the model's output: give
an ``example`` input, or ``(inputs, targets)`` for a forward that takes targets
(nanoGPT's returns every position's logits only then), and the declaration is
checked against the output ``models.call_model`` reads (a mismatch is one line);
without one it is checked on the first batch it runs. A sublayer may return a
tuple, a dict or an object with ``logits``: its output is read as a model's is.
"""

import inspect
from collections.abc import Callable, Sequence

import torch
from torch import nn

from gradengines.models.adapters.calling import TARGET_NAMES, call_model, describe, model_call, own_copy, read_output
from gradengines.models.adapters.discovery import ResidualFound, discover
from gradengines.models.errors import ModelConfigError, one_line

__all__ = ["ResidualSublayer", "ResidualView", "residual_stack"]


class ResidualSublayer(nn.Module):
    """``h + fn(norm(h))`` split for Highway-BP: branch = fn(norm(h)) + gamma h, combine = (1 - gamma) h + z."""

    def __init__(self, fn: nn.Module, norm: nn.Module | None = None, gamma: float = 0.0):
        super().__init__()
        self.fn, self.norm, self.gamma = fn, norm if norm is not None else nn.Identity(), gamma

    def branch(self, h):
        z = read_output(self.fn(self.norm(h)))
        return z + self.gamma * h if self.gamma else z

    def combine(self, h, z):
        return (1 - self.gamma) * h + z if self.gamma else h + z

    def forward(self, h):
        return self.combine(h, self.branch(h))


class ResidualView(nn.Module):
    """The residual-stack view of a user's model (module docstring); its forward is head(blocks(stem(x)))."""

    blocks: nn.ModuleList
    _stem: Callable
    _head: Callable
    stem_reads_targets = True  # the first batch checks the declaration against the model's own forward

    def __init__(self, model: nn.Module, stem: Callable, sublayers: list[ResidualSublayer], head: Callable,
                 checked: bool):
        super().__init__()
        self.model = model  # the only registered child: the user's Parameters, under their own names
        self.__dict__["blocks"] = nn.ModuleList(sublayers)  # unregistered: their modules are the model's
        self.__dict__["_stem"], self.__dict__["_head"] = stem, head
        self.__dict__["_checked"] = checked

    def stem(self, x, targets=None):
        if not self._checked:  # declared without an example: checked on the first batch
            _check(self, self.model, x, targets)
            self.__dict__["_checked"] = True
        return self._stem(own_copy(x))  # a declared stem is the user's code: it gets its own copy, as a model

    def head(self, h):
        return self._head(h)

    def forward(self, x, targets=None):
        h = self.stem(x, targets)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _check(view: ResidualView, model: nn.Module, inputs, targets) -> None:
    """The declaration computes the model's output on ``inputs`` (eval mode), or one line says it does not."""
    was_training = model.training
    model.eval()  # no dropout noise in the comparison
    try:
        with torch.no_grad():
            h = view._stem(own_copy(inputs))
            for block in view.blocks:
                h = block(h)
            mine, theirs = view._head(h), call_model(model, inputs, targets).outputs
    except ModelConfigError:
        raise
    except Exception as err:  # an example of the wrong kind or shape
        raise ModelConfigError(f"residual_stack: the example does not run through the model or its declaration "
                               f"({one_line(err)})") from None
    finally:
        model.train(was_training)
    where = "example" if view._checked is None else "first batch"
    if mine.shape != theirs.shape:
        called = describe(model, targets is not None)
        raise ModelConfigError(f"residual_stack: the declared head returns {tuple(mine.shape)} on the {where} but "
                               f"the model's output, {called} read as {_read_as(model)}, is {tuple(theirs.shape)}; "
                               f"{_shape_cause(model, mine, theirs, targets)}")
    if not torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6):
        raise ModelConfigError(f"residual_stack: stem, blocks and head do not compute the model's forward on the "
                               f"{where} (largest difference {(mine - theirs).abs().max().item():.3g}, both "
                               f"{tuple(mine.shape)}); check their order and the norms")


def _read_as(model: nn.Module) -> str:
    output = model_call(model).output
    return "its output (a tensor, a tuple's first element or logits)" if output == "auto" else f"output={output!r}"


def _shape_cause(model: nn.Module, mine: torch.Tensor, theirs: torch.Tensor, targets) -> str:
    """The likely cause of a declared head whose output's shape is not the model's (said in the refusal)."""
    if targets is None and _takes_targets(model) and mine.numel() > theirs.numel():
        return ("the likely cause: a forward that returns other outputs without targets (nanoGPT returns only the "
                "last position's logits): call the stack with (inputs, targets), and declare it with "
                "example=(inputs, targets), so that the model returns every position's outputs")
    return ("the likely cause: a head that ends at another output than the one read from the model (say which the "
            "model's is with --model-call output=INDEX|KEY|ATTRIBUTE, Python: models.declare_call(model, "
            "output=...)), or a stem or head that leaves out or adds a step (a flatten, a pooling, a last position)")


def _takes_targets(model: nn.Module) -> bool:
    """Whether the model's forward has a parameter that receives the targets (``models.adapters.calling``)."""
    try:
        return any(name in TARGET_NAMES for name in inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return False


def residual_stack(model: nn.Module, *, stem: Callable | None = None, blocks: Sequence | None = None,
                   head: Callable | None = None, gamma: float = 0.0,
                   example: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> ResidualView | ResidualFound:
    """``model`` as a residual stack for Highway-BP (module docstring): found from ``example`` when no stem,
    blocks and head are given, else declared; returns the view."""
    if not isinstance(model, nn.Module):
        raise ModelConfigError(f"residual_stack needs a torch.nn.Module, got a {type(model).__name__}")
    if not 0 <= gamma < 1:
        raise ModelConfigError(f"residual_stack: gamma must be in [0, 1), got {gamma}")
    inputs, targets = example if isinstance(example, tuple) else (example, None)
    if isinstance(inputs, torch.Tensor) and (inputs.dim() == 0 or inputs.shape[0] == 0 or inputs.numel() == 0):
        raise ModelConfigError(f"residual_stack: the example is empty (shape {tuple(inputs.shape)}); give a batch of "
                               f"at least one input")
    if stem is None and blocks is None and head is None:
        if inputs is None:
            raise ModelConfigError("residual_stack: give an example input to find the stem, blocks and head from "
                                   "(example=inputs, or (inputs, targets)), or declare them (stem=, blocks=, head=)")
        return discover(model, inputs, targets, gamma=gamma)
    if stem is None or blocks is None or head is None:
        missing = ", ".join(n for n, v in (("stem", stem), ("blocks", blocks), ("head", head)) if v is None)
        raise ModelConfigError(f"residual_stack: declare stem, blocks and head together (missing: {missing}), or "
                               f"none of them to find them from the example")
    sublayers = []
    for i, entry in enumerate(blocks):
        norm, fn = entry if isinstance(entry, tuple) else (None, entry)
        if not isinstance(fn, nn.Module) or (norm is not None and not isinstance(norm, nn.Module)):
            raise ModelConfigError(f"residual_stack: blocks[{i}] must be a module or a (norm, module) pair of the "
                                   f"model's modules, got {type(entry).__name__}")
        sublayers.append(ResidualSublayer(fn, norm, gamma))
    if not sublayers:
        raise ModelConfigError("residual_stack: no blocks")
    view = ResidualView(model, stem, sublayers, head, checked=inputs is not None)
    if inputs is not None:
        view.__dict__["_checked"] = None  # said as "the example" in a refusal
        _check(view, model, inputs, targets)
        view.__dict__["_checked"] = True
    return view
