"""Exact backpropagation (BPTT for recurrent models): the baseline engine.

    g = dL/dtheta,   L = loss_fn(model(x), y)

(or the model's own loss, declared with ``models.declare_call(model, loss="model")``).

One forward with a graph, one ``torch.autograd.grad`` over the trainable
parameters. Works on any ``nn.Module``. Writes ``p.grad`` (overwrite),
zeros for parameters the loss does not reach.
"""

import torch

from gradengines.models.adapters.calling import forward_loss
from gradengines.trainers.core.engine import GradientEngine, StepOutput, write_grads
from gradengines.trainers.core.registry import register_engine

__all__ = ["Backprop"]


@register_engine("backprop")
class Backprop(GradientEngine):
    """Exact gradients by reverse-mode autodiff through the whole model."""

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        params = [p for p in model.parameters() if p.requires_grad]
        outputs, loss = forward_loss(model, inputs, targets, loss_fn)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        write_grads(params, grads)
        return StepOutput(loss=loss.detach(), outputs=outputs.detach())
