"""A user's residual network (a ResNet-style MLP, a nanoGPT-style Transformer) declared as a
residual stack, the structure Highway-BP works on, without rewriting it.

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
checked against the output ``models.call_model`` reads (a mismatch is one line).
"""

from collections.abc import Callable, Sequence

import torch
from torch import nn

from models.adapters.calling import call_model
from models.errors import ModelConfigError, one_line

__all__ = ["ResidualSublayer", "ResidualView", "residual_stack"]


class ResidualSublayer(nn.Module):
    """``h + fn(norm(h))`` split for Highway-BP: branch = fn(norm(h)) + gamma h, combine = (1 - gamma) h + z."""

    def __init__(self, fn: nn.Module, norm: nn.Module | None = None, gamma: float = 0.0):
        super().__init__()
        self.fn, self.norm, self.gamma = fn, norm if norm is not None else nn.Identity(), gamma

    def branch(self, h):
        z = self.fn(self.norm(h))
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

    def __init__(self, model: nn.Module, stem: Callable, sublayers: list[ResidualSublayer], head: Callable):
        super().__init__()
        self.model = model  # the only registered child: the user's Parameters, under their own names
        self.__dict__["blocks"] = nn.ModuleList(sublayers)  # unregistered: their modules are the model's
        self.__dict__["_stem"], self.__dict__["_head"] = stem, head

    def stem(self, x):
        return self._stem(x)

    def head(self, h):
        return self._head(h)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def residual_stack(model: nn.Module, *, stem: Callable, blocks: Sequence, head: Callable, gamma: float = 0.0,
                   example: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None) -> ResidualView:
    """Declare ``model`` as a residual stack for Highway-BP (module docstring); returns the view."""
    sublayers = []
    for i, entry in enumerate(blocks):
        norm, fn = entry if isinstance(entry, tuple) else (None, entry)
        if not isinstance(fn, nn.Module) or (norm is not None and not isinstance(norm, nn.Module)):
            raise ModelConfigError(f"residual_stack: blocks[{i}] must be a module or a (norm, module) pair of the "
                                   f"model's modules, got {type(entry).__name__}")
        sublayers.append(ResidualSublayer(fn, norm, gamma))
    if not sublayers:
        raise ModelConfigError("residual_stack: no blocks")
    if not 0 <= gamma < 1:
        raise ModelConfigError(f"residual_stack: gamma must be in [0, 1), got {gamma}")
    view = ResidualView(model, stem, sublayers, head)
    if example is not None:
        inputs, targets = example if isinstance(example, tuple) else (example, None)
        was_training = model.training
        model.eval()  # no dropout noise in the comparison
        try:
            with torch.no_grad():
                mine, theirs = view(inputs), call_model(model, inputs, targets).outputs
        except ModelConfigError:
            raise
        except Exception as err:  # an example of the wrong kind or shape
            raise ModelConfigError(f"residual_stack: the example does not run through the model or its declaration "
                                   f"({one_line(err)})") from None
        finally:
            model.train(was_training)
        if mine.shape != theirs.shape or not torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6):
            gap = (mine - theirs).abs().max().item() if mine.shape == theirs.shape else "shapes differ"
            raise ModelConfigError(f"residual_stack: stem, blocks and head do not compute the model's forward on "
                                   f"the example (largest difference {gap}); check their order and the norms")
    return view
