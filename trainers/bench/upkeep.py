"""Orthogonal layers under momentum SGD, Adam and AdamW: what each way of keeping them orthogonal costs and keeps
(issue 32, item 3).

A dense optimizer step moves a square weight off the manifold by O(lr); the Cayley retraction
(``models.orthogonal.retraction``) needs plain SGD's low-rank step, so with momentum or Adam every candidate pays
O(n^3) per layer and step, and the lever is how many n x n products it needs. The candidates, each with backprop's
gradients on the same MLP (its hidden layers orthogonal) and the same optimizer:

* ``plain``: no upkeep (the layers marked, never projected): the baseline of every ratio;
* ``Björck x3``: three Björck iterations after every step (the project's rule before issue 32);
* ``Björck adaptive``: ``models.orthogonal.project_`` (as many iterations as the measured deviation needs to reach
  ``BJORCK_TOL``, at most ``DEFAULT_BJORCK_ITERS``; the Gram matrix of the check reused by the first iteration);
* ``Björck x3 every 4``: three iterations every fourth step;
* ``expm``, ``cayley``: geotorch's trivializations (orthogonal by construction; the optimizer steps their
  unconstrained tensor);
* ``geoopt``: geoopt's Riemannian SGD (momentum) or Adam on its Stiefel manifold (Cayley retraction, Li, Fuxin and
  Todorovic, ICLR 2020, for the canonical metric): an outside reference, since its optimizers need its
  ``ManifoldParameter`` objects in place of the model's Parameters, which the project never does. No AdamW
  (geoopt's Adam couples its weight decay).
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from gradengines import models, tasks
from gradengines.models.orthogonal import bjorck, orthogonality_error, project_, projected_weights
from gradengines.trainers.bench.timing import SuiteProgress, classification_batch, engine_from_spec, time_round_robin

__all__ = ["OPTIMIZERS", "CANDIDATES", "UpkeepCandidate", "bench_upkeep_optimizers", "orthogonality_over_steps"]

# optimizer name -> (torch class, its settings); geoopt's counterpart below
OPTIMIZERS = {
    "momentum": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 1e-3}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}),
}
CANDIDATES = ("plain", "Björck x3", "Björck adaptive", "Björck x3 every 4", "expm", "cayley", "geoopt")
_GEOTORCH = {"expm": "expm", "cayley": "cayley"}
_BLOCK = 4  # steps per timed call: a median over single steps would hide a projection every fourth step


def _geoopt():
    """geoopt, or None where it is not installed (it is no dependency of the project)."""
    try:
        import geoopt
    except ImportError:
        return None
    return geoopt


@torch.no_grad()
def _fixed_bjorck_(weights: list[torch.Tensor], iters: int) -> None:
    for w in weights:
        w.copy_(bjorck(w, iters))


class UpkeepCandidate:
    """One candidate: the MLP, its optimizer and what runs after each optimizer step (``after()`` returns the Björck
    iterations it ran, or None), with the weights it keeps orthogonal."""

    def __init__(self, candidate: str, optimizer: str, *, depth: int, width: int, in_features: int, device):
        geoopt = _geoopt()
        torch.manual_seed(0)
        method = _GEOTORCH.get(candidate, "bjorck")
        self.model = models.build("mlp", in_features=in_features, out_features=10, depth=depth, width=width,
                                  activation="tanh", orthogonal=method).to(device)
        self.weights = [w for w, _ in projected_weights(self.model)]
        cls, settings = OPTIMIZERS[optimizer]
        self.steps = 0
        if candidate == "geoopt":
            if geoopt is None or optimizer == "adamw":
                raise LookupError("geoopt not installed" if geoopt is None else "geoopt has no decoupled AdamW")
            if any(w.shape[0] < w.shape[1] for w in self.weights):
                raise LookupError("geoopt's Stiefel takes tall or square weights (columns orthonormal)")
            stiefel = geoopt.Stiefel()
            for layer in self.model.modules():
                if getattr(layer, "weight", None) is not None and any(layer.weight is w for w in self.weights):
                    layer.weight = geoopt.ManifoldParameter(layer.weight.detach().clone(), manifold=stiefel)
            self.weights = [p for p in self.model.parameters() if isinstance(p, geoopt.ManifoldParameter)]
            cls = geoopt.optim.RiemannianSGD if optimizer == "momentum" else geoopt.optim.RiemannianAdam
        self.optimizer = cls(self.model.parameters(), **settings)
        self.candidate = candidate

    def step(self, engine, x, y) -> tuple[torch.Tensor, int | None]:
        """One training step on (x, y): the engine's gradients, the optimizer, the upkeep; returns the loss and
        the Björck iterations it ran (None for an upkeep without them)."""
        self.optimizer.zero_grad(set_to_none=True)
        out = engine.compute_grads(self.model, x, y, F.cross_entropy)
        self.optimizer.step()
        return out.loss, self.after()

    def after(self) -> int | None:
        self.steps += 1
        if self.candidate == "Björck adaptive":
            return max(project_(self.model), default=0)
        if self.candidate == "Björck x3" or (self.candidate == "Björck x3 every 4" and self.steps % 4 == 0):
            _fixed_bjorck_(self.weights, 3)
            return 3
        return 0 if self.candidate == "Björck x3 every 4" else None

    def error(self) -> float:
        if self.candidate in _GEOTORCH:
            return orthogonality_error(self.model)
        return max(orthogonality_error(w) for w in self.weights)


def _candidates(optimizer: str, **sizes) -> dict[str, UpkeepCandidate]:
    built = {}
    for candidate in CANDIDATES:
        try:
            built[candidate] = UpkeepCandidate(candidate, optimizer, **sizes)
        except LookupError:
            continue
    return built


def _block(run: UpkeepCandidate, engine, x, y, iterations: list[int]):
    """A block of ``_BLOCK`` training steps of ``run`` on (x, y) ("every 4" pays its projection once in each), the
    Björck iterations of each step appended to ``iterations``."""
    def steps():
        for _ in range(_BLOCK):
            _, k = run.step(engine, x, y)
            if k is not None:
                iterations.append(k)
    return steps


def bench_upkeep_optimizers(*, optimizers, widths, depth, batch_size, steps, warmup, device) -> list[dict]:
    """Each candidate's training step (backprop's gradients, the optimizer, the upkeep) against the plain step, per
    (optimizer, width), round-robin over blocks of 4 steps (``step_ms``: a block's median / 4); with the
    orthogonality error after the timed steps (float32) and the mean Björck iterations per step."""
    rows = []
    progress = SuiteProgress("upkeep-optimizers", len(optimizers) * len(widths) * len(CANDIDATES))
    engine = engine_from_spec("backprop")
    for optimizer in optimizers:
        for width in widths:
            x, y = classification_batch(batch_size, width, device)
            built = _candidates(optimizer, depth=depth, width=width, in_features=width, device=device)
            iterations: dict[str, list[int]] = {name: [] for name in built}
            blocks = {name: _block(run, engine, x, y, iterations[name]) for name, run in built.items()}
            timed = time_round_robin(blocks, timed=steps, rounds=steps, warmup=warmup, device=device)
            for name, t in timed.items():
                progress(f"{optimizer} {name} depth {depth} width {width} batch {batch_size}", t["step_ms"] / _BLOCK)
                rows.append({"suite": "upkeep-optimizers", "trainer": "backprop", "optimizer": optimizer,
                             "upkeep": name, "depth": depth, "width": width, "batch_size": batch_size,
                             "step_ms": t["step_ms"] / _BLOCK,
                             "ratio_to_plain": t["ratio_to_baseline"],
                             "ratio_spread": f"{t['ratio_min']:.3g}..{t['ratio_max']:.3g}",
                             "bjorck_iters_mean": (round(statistics.fmean(iterations[name]), 3)
                                                   if name.startswith("Björck") and iterations[name] else None),
                             "orthogonality_error": built[name].error()})
    return rows


def orthogonality_over_steps(*, optimizers, steps, depth, width, batch_size, seed=0, device="cpu") -> list[dict]:
    """Each candidate trained ``steps`` float32 steps on the digits task's training split (``tasks.build("digits")``,
    64 standardized features, 10 classes; batches drawn with ``seed``): the largest orthogonality error after any
    step, the last one, the mean Björck iterations, and the final training loss (over the last 50 steps)."""
    train = tasks.build("digits").train
    X, Y = train.inputs.to(device), train.targets.to(device)
    engine = engine_from_spec("backprop")
    rows = []
    for optimizer in optimizers:
        for name, run in _candidates(optimizer, depth=depth, width=width, in_features=64, device=device).items():
            gen = torch.Generator().manual_seed(seed)
            worst, iterations, losses = 0.0, [], []
            for _ in range(steps):
                idx = torch.randint(0, len(X), (batch_size,), generator=gen).to(device)
                loss, k = run.step(engine, X[idx], Y[idx])
                if k is not None:
                    iterations.append(k)
                losses.append(float(loss))
                worst = max(worst, run.error())
            rows.append({"suite": "upkeep-error", "trainer": "backprop", "optimizer": optimizer, "upkeep": name,
                         "steps": steps, "depth": depth, "width": width, "batch_size": batch_size, "max_error": worst,
                         "final_error": run.error(),
                         "bjorck_iters_mean": round(statistics.fmean(iterations), 3) if iterations else None,
                         "final_loss": round(statistics.fmean(losses[-50:]), 4)})
    return rows
