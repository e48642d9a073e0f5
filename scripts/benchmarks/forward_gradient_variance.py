"""The error of one forward-gradient direction, weight-perturbed (``fgrad``) against activity-perturbed
(``fgrad_act``), on real batches: the variance reduction of Ren et al. (ICLR 2023) measured.

    .venv/bin/python scripts/benchmarks/forward_gradient_variance.py [--draws 100] [--ptb-dir ../shared/data/ptb]

For each model, one batch and its exact gradient g (autograd); then ``--draws`` estimates of each engine (one
Gaussian direction each, seeds 0, 1, ...), and per engine: the relative error E||g_hat - g||^2 / ||g||^2 (mean over
draws, with its standard error), its theory where it has one in closed form (``fgrad``: d + 1 for d parameters,
Baydin et al.; ``fgrad_act``: the closed form of ``trainers/engines/activity_fgrad.py``, computed for one-row-per-
example layers only), and the mean cosine with g. Models: the default comparison's orthogonal tanh MLP on the digits
(batch 64), the zoo's convnet on the digits (where activations outnumber weights: theory says the gain shrinks), and
transformers' GPT-2 (4 x 64) on PTB words (sequences of 32, batch 16), as in BENCHMARKS.md's GPT-2 rows; fresh
models, float64. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from gradengines import models, tasks, trainers
from gradengines.trainers.engines.activity_fgrad import ActivityForwardGradient


def digits_batch(batch: int = 64):
    task = tasks.build("digits", seed=0)
    x, y = task.train.take(slice(0, batch))
    return x.double(), y, task.loss_fn


def mlp_case():
    torch.manual_seed(0)
    model = models.build("mlp", in_features=64, out_features=10, depth=4, width=64, activation="tanh",
                         orthogonal="bjorck").double()
    return "orthogonal tanh MLP (4 x 64), digits, batch 64", model, *digits_batch()


def convnet_case():
    torch.manual_seed(0)
    return "zoo convnet, digits, batch 64", models.build("convnet", in_features=64, out_features=10).double(), \
        *digits_batch()


def gpt2_case(ptb_dir: Path):
    import transformers

    task = tasks.build("ptb-word", data_dir=str(ptb_dir), seq_len=32)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=64, n_head=2, vocab_size=task.num_outputs, n_positions=32,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    x, y = task.train.take(slice(0, 16))
    return "transformers GPT-2 (4 x 64), PTB words, 16 x 32 tokens", transformers.GPT2LMHeadModel(config).double(), \
        x, y, task.loss_fn


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def estimate(engine, model, x, y, loss_fn) -> torch.Tensor:
    for p in model.parameters():
        p.grad = None
    engine.compute_grads(model, x, y, loss_fn)
    return flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()])


def exact_gradient(model, x, y, loss_fn):
    """g, and the closed form of fgrad_act's error where every activity-perturbed layer sees one row per example
    and no parameter is weight-perturbed (else None)."""
    engine = ActivityForwardGradient()
    estimate(engine, model, x, y, loss_fn)  # the first batch's plan
    plan = engine.plans[id(model)]
    inputs, outputs = [], []
    hooks = [m.register_forward_hook(lambda mod, a, out: (inputs.append(a[0]), outputs.append(out)) and None)
             for _, m in plan.layers]
    logits = model(x)
    logits = getattr(logits, "logits", logits)
    loss = loss_fn(logits, y)
    for hook in hooks:
        hook.remove()
    g = flat(torch.autograd.grad(loss, list(model.parameters()), retain_graph=True, allow_unused=True))
    theory = None
    one_row = all(z.dim() == 2 and z.shape[0] == x.shape[0] for z in outputs) and len(outputs) == len(plan.layers)
    if one_row and not plan.weights and plan.per_example:
        G = torch.autograd.grad(loss, outputs)
        S = sum((Gk ** 2).sum(1) for Gk in G)
        theory = sum(float(((xk.detach().reshape(xk.shape[0], -1) ** 2).sum(1) + 1) @ (Gk.shape[1] * S
                                                                                       + (Gk ** 2).sum(1)))
                     for xk, Gk in zip(inputs, G, strict=True))
    return g, theory


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100, help="directions drawn per engine (seeds 0, 1, ...)")
    parser.add_argument("--ptb-dir", type=Path, default=Path("../shared/data/ptb"))
    args = parser.parse_args(argv)
    cases = [mlp_case, convnet_case]
    if (args.ptb_dir / "ptb.train.txt").exists():
        cases.append(lambda: gpt2_case(args.ptb_dir))
    print("| model | parameters | engine | relative error E‖ĝ−g‖²/‖g‖² (± s.e.) | theory | mean cosine with g | "
          "error / fgrad's |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        name, model, x, y, loss_fn = case()
        g, act_theory = exact_gradient(model, x, y, loss_fn)
        norm2, d = float(g @ g), g.numel()
        errors = {}
        for engine_name in ("fgrad", "fgrad_act"):
            draws = torch.stack([estimate(trainers.build_engine(engine_name, seed=s), model, x, y, loss_fn)
                                 for s in range(args.draws)])
            rel = ((draws - g) ** 2).sum(1) / norm2
            cos = F.cosine_similarity(draws, g.expand_as(draws), dim=1)
            errors[engine_name] = float(rel.mean())
            theory = d + 1 if engine_name == "fgrad" else (None if act_theory is None else act_theory / norm2)
            print(f"| {name} | {d:,} | {engine_name} | {float(rel.mean()):.4g} ± "
                  f"{float(rel.std()) / math.sqrt(args.draws):.2g} | "
                  f"{'-' if theory is None else f'{theory:.4g}'} | {float(cos.mean()):.4f} | "
                  f"{errors[engine_name] / errors['fgrad']:.3g} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
