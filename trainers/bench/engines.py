"""Suites on the orthogonal MLP: ``engines`` (each trainer's whole step against backprop, per depth and
width), ``grads`` (``compute_grads`` alone, and the bare forward-only pass of the authors' code shape as a
floor), ``upkeep`` (the step with Björck projection and with the Cayley retraction against the step with no
upkeep)."""

import functools

import torch
import torch.nn.functional as F

from gradengines import models
from gradengines.models.orthogonal import DEFAULT_BJORCK_ITERS, orthogonality_error, project_
from gradengines.trainers.bench.timing import (
    SuiteProgress,
    backprop_first,
    classification_batch,
    engine_from_spec,
    time_round_robin,
    time_trainers,
    training_step,
)

__all__ = ["bench_engines", "bench_grads", "bench_upkeep", "bare_forward_only"]




def bench_engines(*, trainers, depths, widths, batch_size, steps, warmup, device, activation="tanh",
                  orthogonal="bjorck", orthogonal_iters=DEFAULT_BJORCK_ITERS) -> list[dict]:
    """Step time (compute_grads + SGD step + orthogonality upkeep, round-robin against backprop)
    and peak memory of each trainer on square MLPs."""
    rows = []
    upkeep = f"{orthogonal} <= {orthogonal_iters}" if orthogonal == "bjorck" else str(orthogonal)
    progress = SuiteProgress("engines", len(depths) * len(widths) * len(backprop_first(trainers)))
    for depth in depths:
        for width in widths:
            x, y = classification_batch(batch_size, width, device)
            build = functools.partial(models.build, "mlp", in_features=width, out_features=10, depth=depth,
                                      width=width, activation=activation, orthogonal=orthogonal,
                                      orthogonal_iters=orthogonal_iters)
            for row in time_trainers(trainers, build, x, y, F.cross_entropy, device, steps, warmup,
                                      progress, f"depth {depth} width {width}", after=project_,
                                      optimizer=functools.partial(torch.optim.SGD, lr=1e-3,
                                                                  momentum=0.0 if orthogonal == "retraction" else 0.9),
                                      step_memory=True):
                rows.append({"suite": "engines", "trainer": row.pop("trainer"), "depth": depth, "width": width,
                             "batch_size": batch_size, "orthogonal": upkeep, **row})
    return rows


def bench_grads(*, trainers, depths, widths, batch_size, steps, warmup, device, activation="tanh",
                orthogonal="bjorck", orthogonal_iters=DEFAULT_BJORCK_ITERS, dropout=0.0,
                model_name="mlp") -> list[dict]:
    """The gradient computation alone (``compute_grads``, no optimizer step, no upkeep) of each trainer on
    square MLPs (hidden ``dropout``), round-robin against backprop: what an engine costs before the shared
    parts of a step. ``model_name`` another zoo model (e.g. ``ortho_lenet``): built once with its own sizes on
    8 x 8 inputs (64 features, digits' shape), ``depths`` and ``widths`` unused."""
    rows = []
    bare = model_name == "mlp" and any(name.startswith("foton") for name in trainers)
    shapes = [(d, w) for d in depths for w in widths] if model_name == "mlp" else [(None, 64)]
    progress = SuiteProgress("grads", len(shapes) * (len(backprop_first(trainers)) + bare))
    for depth, width in shapes:
        x, y = classification_batch(batch_size, width, device)
        torch.manual_seed(0)
        if model_name == "mlp":
            model = models.build("mlp", in_features=width, out_features=10, depth=depth, width=width,
                                 activation=activation, orthogonal=orthogonal,
                                 orthogonal_iters=orthogonal_iters, dropout=dropout).to(device)
        else:
            model = models.build(model_name, in_features=width, out_features=10).to(device)
        steps_by = {}
        for name in backprop_first(trainers):
            engine = engine_from_spec(name)
            engine.check(model)
            steps_by[name] = functools.partial(engine.compute_grads, model, x, y, F.cross_entropy)
        if bare:
            steps_by["bare forward-only pass"] = functools.partial(bare_forward_only, model, x, y)
        timed = time_round_robin(steps_by, timed=steps, rounds=steps, warmup=warmup, device=device)
        for name, t in timed.items():
            progress(f"{name} {model_name} depth {depth} width {width}", t["step_ms"])
            rows.append({"suite": "grads", "model": model_name, "trainer": name, "depth": depth, "width": width,
                         "batch_size": batch_size, "dropout": dropout, "grads_ms": t["step_ms"],
                         "ratio_to_backprop": t["ratio_to_baseline"],
                         "ratio_spread": f"{t['ratio_min']:.3g}..{t['ratio_max']:.3g}"})
    return rows


def bench_upkeep(*, trainers, depths, widths, batch_sizes, steps, warmup, device, activation="tanh",
                 orthogonal_iters=DEFAULT_BJORCK_ITERS) -> list[dict]:
    """The orthogonal/plain step ratio of each trainer: SGD step (lr 1e-3, no momentum) with Björck projection
    (at most ``orthogonal_iters`` iterations) and with the Cayley retraction, against the same step on the same MLP
    without upkeep (its hidden layers marked orthogonal, never projected), the three round-robin."""
    rows = []
    progress = SuiteProgress("upkeep", len(depths) * len(widths) * len(batch_sizes) * len(trainers) * 3)
    for depth in depths:
        for width in widths:
            for batch_size in batch_sizes:
                x, y = classification_batch(batch_size, width, device)
                for name in trainers:
                    step_fns, nets = {}, {}
                    for upkeep in ("none", "bjorck", "retraction"):
                        torch.manual_seed(0)
                        model = models.build("mlp", in_features=width, out_features=10, depth=depth, width=width,
                                             activation=activation, orthogonal="bjorck" if upkeep == "none" else upkeep,
                                             orthogonal_iters=orthogonal_iters).to(device)
                        engine = engine_from_spec(name)
                        engine.check(model)
                        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
                        nets[upkeep] = model
                        step_fns[upkeep] = training_step(engine, model, x, y, F.cross_entropy, opt,
                                                          after=project_ if upkeep == "bjorck" else None)
                    timed = time_round_robin(step_fns, timed=steps, rounds=steps, warmup=warmup, device=device)
                    for upkeep, t in timed.items():
                        label = f"Björck <= {orthogonal_iters}" if upkeep == "bjorck" else upkeep
                        progress(f"{name} {label} depth {depth} width {width} batch {batch_size}", t["step_ms"])
                        rows.append({"suite": "upkeep", "trainer": name, "depth": depth, "width": width,
                                     "batch_size": batch_size, "upkeep": label, "step_ms": t["step_ms"],
                                     "ratio_to_plain": t["ratio_to_baseline"],
                                     "ratio_spread": f"{t['ratio_min']:.3g}..{t['ratio_max']:.3g}",
                                     "orthogonality_error": orthogonality_error(nets[upkeep])})
    return rows


def bare_forward_only(model, x, y) -> list[torch.Tensor]:
    """FOTON's gradient signal in the shape the authors' released code computes it (its training step),
    written here as a timing floor: a clean pass keeping h_0 .. h_{L-1} under inference mode, drawing each
    active dropout's mask once (before the activation, as their ConsistentDropout), e = softmax(y) - onehot,
    F^T = W_L ... W_1 rebuilt (their default refreshes it every step), the modulated pass from
    x - e F^T with the same masks, and G_l = (h_l - h~_l)^T h_{l-1} / B, G_L = e^T h_{L-1} / B returned as
    a list, with the biases' mean deltas their code intends (section 4, item 7): no .grad, no
    parametrizations, no checks."""
    with torch.inference_mode():
        layers, act, batch = list(model.layers), model.act, x.shape[0]
        drop = [d.p if d.training and d.p > 0 else 0.0 for d in model.dropouts]
        hs, h, masks = [x], x, []
        for layer, p in zip(layers[:-1], drop, strict=True):
            a = layer(h)
            masks.append(torch.empty_like(a).bernoulli_(1 - p).div_(1 - p) if p else None)
            h = act(a if masks[-1] is None else a * masks[-1])
            hs.append(h)
        e = torch.softmax(layers[-1](h), dim=-1)
        e[torch.arange(batch), y] -= 1
        feedback = layers[-1].weight
        for layer in reversed(layers[:-1]):
            feedback = feedback @ layer.weight
        h = x - e @ feedback
        grads = []
        for i, (layer, mask) in enumerate(zip(layers[:-1], masks, strict=True)):
            a = layer(h)
            h = act(a if mask is None else a * mask)
            delta = hs[i + 1] - h
            grads.append(torch.addmm(h.new_zeros(()), delta.T, hs[i], beta=0, alpha=1 / batch))
            if layer.bias is not None:
                grads.append(delta.mean(0))
        grads.append(torch.addmm(h.new_zeros(()), e.T, hs[-1], beta=0, alpha=1 / batch))
        if layers[-1].bias is not None:
            grads.append(e.mean(0))
    return grads

