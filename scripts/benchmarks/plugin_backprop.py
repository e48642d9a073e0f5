"""Exact backprop written outside the package, on ``gradengines.blocks`` alone: the rule of the built-in ``backprop``
named by reference, for BENCHMARKS.md's plugin-overhead row (the step time of an engine from outside, against the
same rule built in, in one timing round):

    .venv/bin/python scripts/bench.py --suite engines \
        --trainers "backprop;scripts/benchmarks/plugin_backprop.py:PluginBackprop"
"""

import torch

from gradengines import blocks


class PluginBackprop(blocks.GradientEngine):
    """g = dL/dtheta by one backward pass: ``trainers/engines/backprop.py``, from outside."""

    def compute_grads(self, model, inputs, targets, loss_fn):
        params = [p for _, p in blocks.trainable_parameters(model)]
        outputs, loss = blocks.forward_loss(model, inputs, targets, loss_fn)
        blocks.write_grads(params, torch.autograd.grad(loss, params, allow_unused=True))
        return blocks.StepOutput(loss=loss.detach(), outputs=outputs.detach())
