"""Highway backpropagation: iterative gradient propagation along the residual path.

Fagnou, Caillon, Delattre, Allauzen, "Accelerated Training through Iterative Gradient
Propagation Along the Residual Path", ICLR 2025 (arXiv 2501.17086). Each layer is
h_i = r_i(h_{i-1}, g_i(h_{i-1})): an expensive branch g_i and a cheap element-wise
combine r_i, so d h_i / d h_{i-1} = J_i + K_i with K_i = d r_i / d h diagonal. With
local loss gradients e_i = dL_i/dh_i (Eq. 6, 7, 9; row vectors multiplied on the right):

    w^0   = CumSumProd(e, K):                  w_i^0 = e_i + w_{i+1}^0 K_{i+1}
    d^0   = w^0,  d^{m+1} = CumSumProd(v, K),  v_i = d_{i+1}^m J_{i+1}   (one batched VJP round)
    w^k   = d^0 + ... + d^k                    (d^m: the paths crossing exactly m branches)

CumSumProd is ``models.layers.scan.reverse_scan`` with a_i = K_{i+1} (the shift that fixes the
off-by-one of the paper's Algorithm 1). w_i^k is exact once k >= L - i, so k >= L is exact
backprop; the parameters get dL/dtheta_i = (w_i^k d r_i/d z) dg_i/dtheta_i: k + 1 VJP
rounds in all, k = 0 included. Options beyond the paper: ``tol`` stops when
||d^k|| / ||w^k|| <= tol (k is then the cap; the k used is logged as ``engine/highway_k``);
``mode=fpi`` is the paper's fixed-point-iteration baseline (K = 0, J = the whole layer
Jacobian, i.e. gamma = 1).

Two structures (``trainers.core.protocols``):

* ``ResidualStack`` (residual_mlp, resnet, gpt): depth is the layer index; states s_0 (the
  stem's output) .. s_L (the head's input) of one shape; only the head has a loss.
  ``path=batched`` runs the clean forward without a graph, then recomputes every branch in
  one ``torch.func.vmap`` call per group of blocks with the same class and shapes
  (``stack_module_state`` + ``functional_call``), so each VJP round is one batched call per
  group; ``path=reference`` keeps one graph per block from the forward and loops over
  blocks (the test oracle; also the fallback when dropout is active, whose masks a
  recompute would redraw). ``auto`` picks batched on a GPU and the reference
  path on the CPU, where it measured faster (BENCHMARKS.md: the same cost per
  round, and no recompute; 63 against 86 ms at k = 0 on a 32-block MLP), and
  always the reference path while dropout is active.
* ``recurrent_layers`` (rnn_lm, rnn_block_lm, GRU/LSTM): time is the depth (Sec. 5.2).
  In each layer the fused forward runs without a graph, the cell is recomputed on all B*T
  pairs (x_t, s_{t-1}) at once with s_{t-1} a leaf, and a gradient hook on the states
  replaces the per-step errors e_t (from the layers above, exact) by w^k: each VJP round
  is one batched VJP of the cell, v_t = w_{t+1} (d s_{t+1}/d s_t) - w_{t+1} K_{t+1}, with
  K_t the gate of ``cell_with_gate`` (GRU: the update gate; LSTM: [0; forget gate] on
  [h; c], the paper's Table 1). Layers are handled top down by autograd, so a stacked
  model's layer below receives dL/dx_t of the layer above as its local errors.
  ``path=reference`` evaluates the cell step by step (one graph and one VJP per step).
"""

import copy
import dataclasses
import math
import weakref
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn as nn
from torch.func import functional_call, stack_module_state, vmap

from gradengines.models.adapters.calling import forward_loss
from gradengines.models.adapters.discovery import ResidualFound
from gradengines.models.adapters.residual import ResidualView
from gradengines.models.errors import ModelConfigError
from gradengines.models.layers.dropout import ConsistentDropout
from gradengines.models.layers.recurrent import previous_states
from gradengines.models.layers.scan import METHODS, reverse_scan
from gradengines.trainers.core.distributed import DataParallel
from gradengines.trainers.core.engine import GradientEngine, StepOutput, trainable_parameters, write_grads
from gradengines.trainers.core.errors import ConfigError, IncompatibleModelError
from gradengines.trainers.core.options import option
from gradengines.trainers.core.protocols import RecurrentLayer, is_residual_stack, recurrent_forwards, refusal
from gradengines.trainers.core.registry import register_engine
from gradengines.trainers.core.self_check import (
    autograd_reference,
    failures_refused,
    fresh_eval,
    loosest,
    quiet,
    refuse_differences,
)

__all__ = ["Highway", "highway_iterations"]

_ZOO = "residual_mlp, resnet, gpt (residual stacks); rnn_lm, rnn_block_lm (time as depth)"


def _shift(w: torch.Tensor, dim: int) -> torch.Tensor:
    """w_{j+1} at position j along ``dim``; zero at the last position."""
    n = w.shape[dim]
    return torch.cat([w.narrow(dim, 1, n - 1), torch.zeros_like(w.narrow(dim, 0, 1))], dim=dim)


def highway_iterations(e: torch.Tensor, carry: torch.Tensor, back: Callable[[torch.Tensor], torch.Tensor], *,
                       k: int, tol: float = 0.0, fpi: bool = False, dim: int = 0,
                       method: str = "auto", samples: int = 1) -> tuple[torch.Tensor, int, float]:
    """w^k along ``dim`` (module docstring): (w^k, iterations run, last ||d|| / ||w|| or 0).

    Args:
        e: the local loss gradients e_j at every position j.
        carry: a_j = K_{j+1}, the diagonal that carries w_{j+1} back to j (broadcastable
            to ``e``; its last position is unused).
        back: the linear map w -> v with v_j = w_{j+1} J_{j+1} (zero at the last position):
            one VJP round through every branch at once.
        k: iterations; at most n - 1 run (no path crosses more branches).
        tol: if > 0, stop once ||d^m|| <= tol ||w^m|| (k is the cap).
        fpi: the fixed-point-iteration baseline: K = 0 and J_j + K_j in place of J_j.
        samples: this rank's batch size. Under torchrun the norms of ``tol`` are those of the
            global batch's d and w (rank r's part is n_r / N times its own), so every rank
            stops at the same iteration as one process would.
    """
    if fpi:
        branch_back = back

        def back(w):  # the whole layer Jacobian: J + K
            return branch_back(w) + carry * _shift(w, dim)

        def scan(v):  # K = 0: CumSumProd is the identity
            return v
    else:
        def scan(v):
            return reverse_scan(v, carry, dim=dim, method=method)
    w = delta = scan(e)
    used, rel = 0, 0.0
    for _ in range(min(k, e.shape[dim] - 1)):
        delta = scan(back(delta))
        w = w + delta
        used += 1
        if tol > 0:
            d2, w2 = DataParallel().sums([(samples * float(delta.norm())) ** 2, (samples * float(w.norm())) ** 2])
            rel = math.sqrt(d2 / w2) if w2 > 0 else 0.0 if d2 == 0 else math.inf
            if rel <= tol:
                break
    return w, used, rel


def exact_cotangents(e: torch.Tensor, carry: torch.Tensor, back_one: Callable[[int, torch.Tensor], torch.Tensor]
                     ) -> torch.Tensor:
    """The limit w^k reaches at k >= n, by backprop along the chain: w_n = e_n and, from the top down,
    w_j = e_j + w_{j+1} K_{j+1} + v_j with v_j = ``back_one(j, w_{j+1})`` = w_{j+1} J_{j+1} (one VJP through
    one branch). Highway-BP's iterations sum the same paths by the number of branches they cross; this sums
    them by where they start, in n VJPs in all (one backward) instead of k + 1 rounds of n."""
    w = [e[-1]]
    for j in reversed(range(e.shape[0] - 1)):
        a = carry if carry.numel() == 1 else carry[j]
        w.append(e[j] + a * w[-1] + back_one(j, w[-1]))
    return torch.stack(w[::-1])


def _combine_derivatives(blocks, inputs, outputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Diagonals of d r_i/d h (K_i) and d r_i/d z at each block's input and branch output,
    stacked (n, B, ...), or one element when constant over all blocks (K = I, (1 - gamma) I).
    Exact because every combine is element-wise: output element j reads element j of h and of
    each part of z (z may stack m parts, (m, B, ...): post-LN's [a, b] in h a + b); one small
    autograd call per block."""
    ks, dzs = [], []
    for block, x, z in zip(blocks, inputs, outputs, strict=True):
        x, z = x.detach().requires_grad_(), z.detach().requires_grad_()
        with torch.enable_grad():
            h = block.combine(x, z)
            k, dz = torch.autograd.grad(h, (x, z), torch.ones_like(h))
        ks.append(_compact(k))
        dzs.append(_compact(dz))
    return _stack(ks, inputs[0]), _stack(dzs, outputs[0])


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A constant tensor as one element that broadcasts."""
    first = t.reshape(-1)[:1]
    return first if bool((t == first).all()) else t


def _stack(parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if all(p.numel() == 1 for p in parts) and bool((torch.cat(parts) == parts[0]).all()):
        return parts[0]
    return torch.stack([p.expand_as(like) for p in parts])


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, ConsistentDropout)


def _dropout_active(module: nn.Module) -> bool:
    """A recompute would draw new masks: the batched path cannot reproduce the forward."""
    return module.training and any(isinstance(m, _DROPOUTS) and m.p > 0 for m in module.modules())


class _Branches(nn.Module):
    """Calls ``block.branch`` as its forward, for ``functional_call``."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block.branch(x)


def _groups(blocks) -> list[list[int]]:
    """Indices of blocks with the same class and parameter / buffer shapes, in order of appearance."""
    groups: dict[tuple, list[int]] = {}
    for i, block in enumerate(blocks):
        key = (type(block), tuple((n, t.shape, t.dtype) for n, t in block.named_parameters()),
               tuple((n, t.shape) for n, t in block.named_buffers()))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _segments(blocks) -> list[tuple[list, bool]]:
    """Runs of blocks for Highway-BP, and the boundary blocks between them (``boundary = True``: a block
    whose output shape differs from its input's, e.g. a ResNet's downsampling block, backpropagated
    exactly), in order."""
    out: list[tuple[list, bool]] = []
    for block in blocks:
        if getattr(block, "boundary", False):
            out.append(([block], True))
        elif out and not out[-1][1]:
            out[-1][0].append(block)
        else:
            out.append(([block], False))
    return out


def _through_combine(w: torch.Tensor, dz: torch.Tensor, parts_dim: int) -> torch.Tensor:
    """w dr/dz: ``dz`` with one more dimension than ``w`` (at ``parts_dim``) holds a z of m parts, each gets w."""
    return w.unsqueeze(parts_dim) * dz if dz.dim() == w.dim() + 1 else w * dz


class _Depth:
    def at_branch(self, W):
        """Cotangents at the branch outputs z from those at the block outputs: w dr/dz (a z of m parts,
        (n, m, B, ...), gets w in each)."""
        return _through_combine(W, self.Dz, 1)

    def at_branch_one(self, j: int, w: torch.Tensor) -> torch.Tensor:
        """``at_branch`` for block j alone."""
        return _through_combine(w, self.Dz if self.Dz.numel() == 1 else self.Dz[j], 0)

    def back_one(self, j: int, w: torch.Tensor) -> torch.Tensor:
        """(w dr_j/dz) dg_j/dh: the cotangent at block j's input through its branch alone, from ``w`` at its
        output (``back`` with every other block's cotangent zero)."""
        c = self.at_branch_one(j, w)
        C = torch.zeros((len(self.blocks), *c.shape), dtype=c.dtype, device=c.device)
        C[j] = c
        return self.back(C)[j]


class _ReferenceDepth(_Depth):
    """One graph per block from the forward; one VJP per block per round (the oracle). ``sides``: leaves the
    blocks read besides the state (side inputs), whose cotangents ``parameter_grads`` also returns."""

    def __init__(self, blocks, h0, sides=()):
        self.blocks, self.inputs, self.branches, self.sides = blocks, [], [], list(sides)
        h = h0.detach()
        for block in blocks:
            x = h.requires_grad_()
            z = block.branch(x)
            self.inputs.append(x)
            self.branches.append(z)
            with torch.no_grad():
                h = block.combine(x, z)
        self.top = h
        self.K, self.Dz = _combine_derivatives(blocks, self.inputs, self.branches)

    def back(self, C):
        """Cotangents at every block input from the cotangents C (n, B, ...) at the branch outputs."""
        return torch.stack([torch.autograd.grad(z, x, c, retain_graph=True)[0]
                            for z, x, c in zip(self.branches, self.inputs, C, strict=True)])

    def back_one(self, j: int, w: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad(self.branches[j], self.inputs[j], self.at_branch_one(j, w), retain_graph=True)[0]

    def parameter_grads(self, C) -> dict[int, torch.Tensor]:
        """id(parameter) -> its gradient, summed over the sublayers that read it (a split block's two sublayers
        share its parameters: the second's layer scale of the first, multiplied by the zeros it is given, adds
        a zero, never replaces the first's)."""
        out: dict[int, torch.Tensor] = {}
        for block, z, c in zip(self.blocks, self.branches, C, strict=True):
            wrt = [p for p in block.parameters() if p.requires_grad] + self.sides
            _accumulate(out, zip(map(id, wrt), torch.autograd.grad(z, wrt, c, allow_unused=True), strict=True))
        return out


class _BatchedDepth(_Depth):
    """Clean forward without a graph, then every group of like blocks recomputed in one vmap call."""

    def __init__(self, blocks, h0, bases: dict):
        self.blocks = blocks
        S = h0.new_empty((len(blocks), *h0.shape))  # (n, B, ...) block inputs s_0 .. s_{n-1}
        S[0] = h0.detach()
        with torch.no_grad():
            for i, block in enumerate(blocks):
                h = block(S[i])
                if i + 1 < len(blocks):
                    S[i + 1] = h
        self.top = h
        self.groups = []
        Z = torch.empty_like(S)
        for idx in _groups(blocks):
            members = [blocks[i] for i in idx]
            first = members[0]
            entry = bases.get(id(first))
            if entry is None or entry[0]() is not first:  # a stateless copy; functional_call swaps in the stack
                entry = bases[id(first)] = (weakref.ref(first), _Branches(copy.deepcopy(first).to("meta")))
            base = entry[1]
            params, buffers = stack_module_state(members)  # leaves; buffers are copies (BN stats land there)
            params = {"block." + n: p for n, p in params.items()}
            buffers = {"block." + n: b for n, b in buffers.items()}
            X = S[idx].requires_grad_()
            out = vmap(lambda p, b, x, base=base: functional_call(base, (p, b), (x,)))(params, buffers, X)
            self.groups.append((idx, members, params, X, out))
            Z[idx] = out.detach()
        self.K, self.Dz = _combine_derivatives(blocks, S, Z)

    def back(self, C):
        V = torch.empty_like(C)
        for idx, _, _, X, out in self.groups:
            V[idx] = torch.autograd.grad(out, X, C[idx], retain_graph=True)[0]
        return V

    def parameter_grads(self, C) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        for idx, members, params, _, Z in self.groups:
            names = [n for n, p in params.items() if p.requires_grad]
            grads = torch.autograd.grad(Z, [params[n] for n in names], C[idx], allow_unused=True)
            for name, g in zip(names, grads, strict=True):
                if g is None:
                    continue
                _accumulate(out, ((id(block.get_parameter(name[len("block."):])), g[j])
                                  for j, block in enumerate(members)))
        return out


@register_engine("highway")
class Highway(GradientEngine):
    """Highway-BP with k iterations (module docstring)."""

    @dataclasses.dataclass
    class Options:
        k: int = option(4, "Highway-BP iterations (k >= depth, or >= sequence length, is exact backprop)")
        tol: float = option(0.0, "adaptive: stop once ||delta^k|| / ||w^k|| <= tol (k is then the cap); 0: off")
        mode: Literal["highway", "fpi"] = option(
            "highway", "highway, or fpi: the fixed-point-iteration baseline (K = 0, whole-layer Jacobians)")
        path: Literal["auto", "batched", "reference"] = option(
            "auto", "batched VJPs (vmap over like blocks / all time steps) or one VJP per block or step "
                    "(reference); auto: batched, except residual stacks on the CPU or with dropout")
        scan: Literal[METHODS] = option("auto", "CumSumProd form (auto: sequential on CPU, chunked on GPU)")
        self_check: bool = option(
            True, "on the first batch, a found or declared residual stack proves that its exact setting (k >= L) "
                  "is autograd of the model's own forward, or is refused in one line; false: skip (checked once)")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options.k < 0:
            raise ConfigError(f"--highway-k must be >= 0, got {self.options.k}")
        if not self.options.tol >= 0:
            raise ConfigError(f"--highway-tol must be >= 0, got {self.options.tol}")
        self._bases: dict = {}  # id(first block of a group) -> (weakref to it, its stateless copy)
        self._used: list[int] = []  # iterations run per scan in the last step
        self._rel: list[float] = []

    def check(self, model: nn.Module) -> None:
        if is_residual_stack(model):
            return
        layers = getattr(model, "recurrent_layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and all(isinstance(m, RecurrentLayer) for m in layers):
            return
        raise IncompatibleModelError(
            f"trainer 'highway' needs a residual stack (stem, blocks with branch/combine, head) or recurrent "
            f"layers; {type(model).__name__} is neither{refusal(model)}: find one with "
            f"models.residual_stack(model, example=inputs) (the command line does), or declare it "
            f"(zoo models that qualify: {_ZOO})")

    def first_batch_check(self, model, inputs, targets, loss_fn) -> None:
        """A residual stack found or declared in a user's model (``models.residual_stack``), every segment's
        cotangents exact (``exact_cotangents``: what k >= L computes, through the same stem, blocks, combines
        and head), against autograd of the user's model on this batch (``trainers.core.self_check``). Where a
        found structure fails, the others its model offers are tried in turn (``ResidualFound.others``), the
        first that passes kept and said in ``found``; the refusal, where none does, names every one tried."""
        if not self.options.self_check or not isinstance(model, (ResidualFound, ResidualView)):
            return
        try:
            self._check_structure(model, inputs, targets, loss_fn)
        except ModelConfigError as refused:
            if not isinstance(model, ResidualFound) or model.others is None:
                raise
            first, tried = copy.copy(model), [model.found.partition(" as ")[0]]
            for other in model.others():
                model.adopt(other)
                try:
                    self._check_structure(model, inputs, targets, loss_fn)
                except ModelConfigError:
                    tried.append(other.found.partition(";")[0])
                    continue
                model.found += f"; chosen where {tried[0]}, found first, fails the self-check"
                return
            model.adopt(first)
            raise ModelConfigError(f"{refused} [structures tried: {'; '.join(tried)}]") from None

    def _check_structure(self, model, inputs, targets, loss_fn) -> None:
        """``first_batch_check`` of the structure ``model`` holds now: one line where it is not exact."""
        named = trainable_parameters(model)
        params = [p for _, p in named]
        found = f"the residual stack found ({model.found.partition(' as ')[0]})" if isinstance(model, ResidualFound) \
            else "the declared residual stack"
        with quiet(model), failures_refused(f"Highway-BP on {found}", "--highway-self-check false"):
            expected = autograd_reference(model.model, inputs, targets, loss_fn, params)[1]
            fresh_eval(model)
            by_param = self._depth_step(model, params, inputs, targets, loss_fn, exact=True)[2]
        names = [n.removeprefix("model.") for n, _ in named]
        blocks = {id(p) for block in model.blocks for p in block.parameters()}
        outside = {name for name, p in zip(names, params, strict=True) if id(p) not in blocks}
        refuse_differences(f"Highway-BP at k >= L on {found}",
                           names, [by_param.get(id(p)) for p in params], expected, loosest(params),
                           lambda wrong: _likely_cause(model, any(n in outside for n in wrong)),
                           "--highway-self-check false (Python: self_check=False)")

    def _iterate(self, e, carry, back, dim):
        w, used, rel = highway_iterations(e, carry, back, k=self.options.k, tol=self.options.tol,
                                          fpi=self.options.mode == "fpi", dim=dim, method=self.options.scan,
                                          samples=self._samples)
        self._used.append(used)
        self._rel.append(rel)
        return w

    def compute_grads(self, model, inputs, targets, loss_fn) -> StepOutput:
        self.check(model)
        self._used, self._rel, self._samples = [], [], len(inputs)
        params = [p for _, p in trainable_parameters(model)]
        if is_residual_stack(model):
            outputs, loss, by_param = self._depth_step(model, params, inputs, targets, loss_fn)
            grads = [by_param.get(id(p)) for p in params]
        else:
            with recurrent_forwards(model, self._time_layer):
                outputs, loss = forward_loss(model, inputs, targets, loss_fn)
                grads = torch.autograd.grad(loss, params, allow_unused=True)
        write_grads(params, grads)
        return StepOutput(loss=loss.detach(), outputs=outputs.detach())

    # ---- residual stacks: depth is the index ------------------------------------------------

    def _depth_step(self, model, params, inputs, targets, loss_fn, exact: bool = False):
        """(outputs, loss, id(parameter) -> gradient) of one step on a residual stack; ``exact``: every
        segment's cotangents by ``exact_cotangents`` (the first-batch self-check) instead of k iterations. A found
        stack with a feeder (an encoder whose output its blocks read) runs Highway-BP on the feeder's blocks too:
        the feeder's top state is a leaf of the stack's stem, whose cotangent is the feeder's top error."""
        reads = getattr(model, "stem_reads_targets", False)
        feeder = getattr(model, "feeder", None)
        if feeder is not None:
            f_h0 = feeder.stem(inputs, targets)
            f_sides = feeder.side_inputs()
            f_segments, f_top = self._forward_segments(feeder.blocks, f_h0, False, [leaf for *_, leaf in f_sides])
            f_leaf = f_top.detach().requires_grad_()
            h0 = model.stem(inputs, targets, feeder_top=f_leaf)
        else:
            h0 = model.stem(inputs, targets) if reads else model.stem(inputs)
        sides = model.side_inputs() if hasattr(model, "side_inputs") else []  # (name, original, leaf)
        leaves = [leaf for _, _, leaf in sides]
        batched = not sides and (self.options.path == "batched" or (
            self.options.path == "auto" and h0.device.type != "cpu" and not _dropout_active(model)
            and getattr(model, "vmappable", True)))
        segments, h = self._forward_segments(model.blocks, h0, batched, leaves)
        top = h.detach().requires_grad_()
        outputs = model.head(top)
        loss = loss_fn(outputs, targets)
        *head_grads, e = torch.autograd.grad(loss, params + [top], allow_unused=True)
        grads: dict[int, torch.Tensor] = {}  # id(parameter) -> its gradient, summed over head, stem, blocks
        _accumulate(grads, zip(map(id, params), head_grads, strict=True))
        e = self._backward_segments(segments, e, grads, leaves, exact)
        f_e = self._stem_backward(h0, e, sides, params, grads, [f_leaf] if feeder is not None else [])
        if feeder is not None:  # the feeder's top error, through its blocks, to its own stem and side inputs
            f_e = self._backward_segments(f_segments, f_e[0] if f_e[0] is not None else torch.zeros_like(f_leaf),
                                          grads, [leaf for *_, leaf in f_sides], exact)
            self._stem_backward(f_h0, f_e, f_sides, params, grads)
        return outputs, loss, grads

    def _forward_segments(self, blocks, h, batched: bool, leaves: list) -> tuple[list, torch.Tensor]:
        """The blocks' forward as Highway-BP needs it: per run of like blocks a depth object (batched or
        reference), per boundary block (a shape change) its exact graph; returns them and the top state."""
        segments = []
        for run, boundary in _segments(list(blocks)):
            if boundary:
                x = h.detach().requires_grad_()
                segments.append((run[0], x, run[0](x)))
            else:
                segments.append(_BatchedDepth(run, h, self._bases) if batched else _ReferenceDepth(run, h, leaves))
            h = segments[-1][2] if boundary else segments[-1].top
        return segments, h

    def _backward_segments(self, segments: list, e: torch.Tensor, grads: dict, leaves: list,
                           exact: bool) -> torch.Tensor:
        """From the top error down through every segment (Highway-BP in runs, exact through boundaries); the
        parameters' and side inputs' gradients added to ``grads``; returns the error at the bottom state."""
        for segment in reversed(segments):
            if isinstance(segment, tuple):  # a boundary block (a shape change): exact backprop through it
                block, x, y = segment
                reads = getattr(block, "reads", block.parameters)  # a found stack's in-between: all it reads
                own = [p for p in reads() if p.requires_grad] + leaves
                e, *own_grads = torch.autograd.grad(y, [x, *own], e, allow_unused=True)
                _accumulate(grads, zip(map(id, own), own_grads, strict=True))
            else:
                e = self._segment_backward(segment, e, grads, exact)
        return e

    @staticmethod
    def _stem_backward(h0, e, sides, params, grads: dict, also: list = ()) -> list:
        """The stem's state and each side input, with the cotangents summed over the blocks that read it, back to
        the parameters (added to ``grads``); returns the gradients of ``also`` (a feeder's top leaf)."""
        roots = [(h0, e)] + [(original, grads.pop(id(leaf))) for _, original, leaf in sides if id(leaf) in grads]
        roots = [(r, c) for r, c in roots if r.requires_grad]  # a first block fed the raw input: no stem to train
        if not roots:
            return [None for _ in also]
        *found, = torch.autograd.grad([r for r, _ in roots], [*params, *also], [c for _, c in roots],
                                      allow_unused=True)
        _accumulate(grads, zip(map(id, params), found[:len(params)], strict=True))
        return found[len(params):]

    def _segment_backward(self, stack, e_top: torch.Tensor, grads: dict, exact: bool = False) -> torch.Tensor:
        """Highway-BP over one run of blocks whose states share a shape: w^k at positions s_0 .. s_n from
        the cotangent at s_n; the blocks' parameter gradients added to ``grads``; returns w^k_0."""
        n = len(stack.blocks)
        e = torch.zeros((n + 1, *e_top.shape), dtype=e_top.dtype, device=e_top.device)  # zero but at the top
        e[n] = e_top
        carry = stack.K if stack.K.numel() == 1 else torch.cat([stack.K, torch.zeros_like(stack.K[:1])])  # K_{j+1}

        def back(W):  # v_j = (w_{j+1} dr/dz) dg_{j+1}/dh, v_n = 0
            return torch.cat([stack.back(stack.at_branch(W[1:])), torch.zeros_like(W[:1])])

        W = exact_cotangents(e, carry, stack.back_one) if exact else self._iterate(e, carry, back, dim=0)
        _accumulate(grads, stack.parameter_grads(stack.at_branch(W[1:])).items())
        return W[0]

    # ---- recurrent layers: time is the depth --------------------------------------------------

    def _time_layer(self, index: int, layer: nn.Module):
        def forward(x, h0=None):
            with torch.no_grad():
                states = layer.forward_sequence(x, h0)  # (B, T, n), fused, no graph
            B, T, size = states.shape
            prev = previous_states(states, h0).requires_grad_()  # leaf: s_0 .. s_{T-1}
            if self.options.path == "reference":
                leaves = [prev[:, t].detach().requires_grad_() for t in range(T)]
                steps = [layer.cell_with_gate(x[:, t], p) for t, p in enumerate(leaves)]
                local = torch.stack([s for s, _ in steps], dim=1)
                gate = torch.stack([g for _, g in steps], dim=1).detach()

                def vjp_prev(W):  # one VJP per step
                    return torch.stack([torch.autograd.grad(s, p, W[:, t], retain_graph=True)[0]
                                        for t, ((s, _), p) in enumerate(zip(steps, leaves, strict=True))], dim=1)
            else:
                local, gate = layer.cell_with_gate(x.reshape(B * T, -1), prev.reshape(B * T, size))
                local, gate = local.reshape(B, T, size), gate.detach().reshape(B, T, size)

                def vjp_prev(W):  # one batched VJP of the cell over all B*T pairs
                    return torch.autograd.grad(local, prev, W, retain_graph=True)[0]
            carry = _shift(gate, 1)  # a_t = K_{t+1}

            def back(W):  # v_t = w_{t+1} (J_{t+1} + K_{t+1}) - w_{t+1} K_{t+1}
                return _shift(vjp_prev(W), 1) - carry * _shift(W, 1)

            out = local.view_as(local)  # the hook sits on this alias, so the inner VJPs on `local` skip it
            if out.requires_grad:
                out.register_hook(lambda e: self._iterate(e, carry, back, dim=1))
            return layer.output(out)

        return forward

    def metrics(self):
        if not self._used:
            return {}
        out = {"highway_k": sum(self._used) / len(self._used)}
        if self.options.tol > 0:
            out["highway_delta"] = max(self._rel)
        return out


def _likely_cause(model, outside: bool) -> str:
    """Why a residual stack's gradients may differ from its model's, and what to do (the self-check's words);
    ``outside``: some parameter that differs lies outside the blocks."""
    if isinstance(model, ResidualView):
        return ("the declared stem, blocks and head compute the model's forward but not its gradient: a module or "
                "tensor the blocks read besides the state, or a parameter used inside and outside them; declare "
                "them so that the blocks read only the state, or train with backprop")
    if outside:
        return ("parameters outside the blocks found (the stem, an encoder, a shared table) reach them other than "
                "through the state: a side input Highway-BP does not follow, or a second chain of blocks not found; "
                "declare the stack by hand (models.residual_stack(model, stem=, blocks=, head=)) or train with "
                "backprop")
    return ("the blocks found, split into residual sublayers (branch and combine), do not give their own gradients "
            "(a layer scale, or a combine other than h + z); declare the stack by hand or train with backprop")


def _accumulate(grads: dict, items) -> None:
    """Add each (key, gradient) of ``items`` into ``grads`` (None: nothing; shared weights sum)."""
    for key, g in items:
        if g is not None:
            grads[key] = grads[key] + g if key in grads else g
