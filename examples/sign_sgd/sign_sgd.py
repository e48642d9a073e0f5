# sign_sgd.py: your rule, in your folder
import dataclasses

import torch

from gradengines import blocks


class SignSGD(blocks.GradientEngine):
    """sign-SGD (Bernstein et al., ICML 2018): g = scale * sign(dL/dtheta), from one backward pass."""

    @dataclasses.dataclass
    class Options:
        scale: float = blocks.option(1.0, "multiplies the sign")      # the flag --signsgd-scale

    recipe = {"optimizer": ("sgd", "Bernstein et al. 2018: SGD on the signs"),
              "lr": (1e-3, "a first guess: compare.py --tune searches around it")}

    def compute_grads(self, model, inputs, targets, loss_fn):
        params = [p for _, p in blocks.trainable_parameters(model)]
        outputs, loss = blocks.forward_loss(model, inputs, targets, loss_fn)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        blocks.write_grads(params, [None if g is None else self.options.scale * g.sign() for g in grads])
        return blocks.StepOutput(loss=loss.detach(), outputs=outputs.detach())
