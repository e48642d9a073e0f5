"""How close an engine's gradient is to exact backprop, per parameter.

On one batch, with the same weights and the same dropout masks, before any
update: run the engine, then exact backprop, and compare by parameter name

    cosine     = <g, g_bp> / (|g| |g_bp|)      (flattened tensors)
    rel_error  = |g - g_bp| / |g_bp|
    norm_ratio = |g| / |g_bp|

plus one global cosine over all parameters concatenated. Conventions for
zero norms: two zero tensors agree (cosine 1, rel_error 0, norm_ratio 1);
one zero tensor gives cosine 0 and an infinite or zero ratio.

Same masks: the torch RNG is reset to the same state before each pass, so
dropout draws the same masks as long as the engine's first forward pass
draws them in module order, as the model's own forward does
(``models.frozen_masks`` lets an engine reuse them in later passes).

The call leaves the model (parameters, buffers, ``.grad``, train/eval mode),
the engine's state and the RNG exactly as it found them.
"""

import copy

import torch
from torch import nn

from gradengines.trainers.core.engine import GradientEngine, LossFn, trainable_parameters
from gradengines.trainers.core.rng import set_torch_rng_state, torch_rng_state
from gradengines.trainers.core.self_check import kept
from gradengines.trainers.engines.backprop import Backprop

__all__ = ["gradient_agreement", "compare_grads"]


def _stats(g: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    g, ref = g.detach().double().flatten(), ref.detach().double().flatten()
    n, n_ref = g.norm().item(), ref.norm().item()
    if n == 0.0 and n_ref == 0.0:
        return {"cosine": 1.0, "rel_error": 0.0, "norm_ratio": 1.0}
    cosine = (g @ ref).item() / (n * n_ref) if n > 0 and n_ref > 0 else 0.0
    rel = (g - ref).norm().item() / n_ref if n_ref > 0 else float("inf")
    ratio = n / n_ref if n_ref > 0 else float("inf")
    return {"cosine": cosine, "rel_error": rel, "norm_ratio": ratio}


def compare_grads(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict:
    """Per-name and global agreement of two gradient dicts with the same keys."""
    if set(grads) != set(reference):
        raise ValueError(f"gradients name different parameters: {sorted(set(grads) ^ set(reference))}")
    names = list(reference)
    per_param = {name: _stats(grads[name], reference[name]) for name in names}
    flat = torch.cat([grads[n].detach().double().flatten() for n in names])
    flat_ref = torch.cat([reference[n].detach().double().flatten() for n in names])
    return {"global": _stats(flat, flat_ref)["cosine"], "per_param": per_param}


def _grads_of(engine: GradientEngine, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn,
              rng: dict) -> dict[str, torch.Tensor]:
    set_torch_rng_state(rng)
    engine.compute_grads(model, inputs, targets, loss_fn)
    grads = {}
    for name, p in trainable_parameters(model):
        if p.grad is None:
            raise RuntimeError(f"engine '{engine.name}' left no gradient for {name} (the engine contract: fill every "
                               "trainable parameter's .grad)")
        grads[name] = p.grad.detach().clone()
    return grads


def gradient_agreement(model: nn.Module, engine: GradientEngine, inputs: torch.Tensor, targets: torch.Tensor,
                       loss_fn: LossFn) -> dict:
    """Compare ``engine``'s gradient with exact backprop on one batch (module docstring).

    Returns ``{"global": cos, "per_param": {name: {"cosine", "rel_error", "norm_ratio"}}}``.
    """
    saved_grads = {name: p.grad for name, p in model.named_parameters()}
    saved_engine = copy.deepcopy(engine.state_dict())
    rng = torch_rng_state()
    try:
        with kept(model):  # modes and buffers (norm statistics) as they were, for the reference as after it
            with kept(model):
                grads = _grads_of(engine, model, inputs, targets, loss_fn, rng)
            reference = _grads_of(Backprop(), model, inputs, targets, loss_fn, rng)
    finally:
        for name, p in model.named_parameters():
            p.grad = saved_grads[name]
        engine.load_state_dict(saved_engine)
        set_torch_rng_state(rng)
    return compare_grads(grads, reference)
