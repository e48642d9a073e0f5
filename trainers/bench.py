"""Step-time and peak-memory benchmarks, reported as ratios against backprop.

Suites, each in one process so ratios compare like with like:

* ``overhead``: the Trainer with the backprop engine against a plain
  hand-written PyTorch loop (zero_grad, forward, backward, step, loss.item())
  on the same MLP, same batches; rounds alternate between the two.
* ``engines``: each trainer's step (compute_grads + optimizer step +
  orthogonality upkeep) on an MLP for each (depth, width), against backprop.

In the ``engines``, ``recurrent`` and ``residual`` suites the trainers of one
configuration are timed round-robin (``time_round_robin``): every round times one
step of every trainer in turn (``--steps`` rounds), and the ratio to backprop is
the median over rounds of the ratio within a round, with its min..max spread
(``ratio_spread``), so a burst of load on the machine lands on all trainers alike
(under a second process burning a core, every ratio stayed within 10% of idle;
BENCHMARKS.md).
* ``recurrent``: each trainer's step (compute_grads + Adam step) on a recurrent
  language model (``rnn_lm``) for each (depth, length), against backprop (BPTT
  through the fused nn.GRU, cuDNN on a GPU), plus ``bptt_loop``: BPTT through
  the same cell stepped in a Python loop over time.
* ``residual``: each trainer's step (compute_grads + Adam step) on a deep
  ``residual_mlp`` (Highway-BP's residual stack), against backprop.
* ``scan``: the reverse scan alone in every form against the DSF authors' loop.
* ``grads``: the gradient computation alone (``compute_grads``) of each trainer
  on the engines suite's MLPs, one model shared, against backprop; with a FOTON
  trainer, also the bare forward-only pass (``bare_forward_only``, the shape of
  the authors' code) as a floor.
* ``upkeep``: what keeping the MLP orthogonal costs each trainer: its SGD step
  with Björck projection, and with the Cayley retraction (``models.retraction``),
  against the same step with no upkeep, per (depth, width, batch).
* ``user``: every engine on user-style models (an nn.GRU LM wrapped by
  ``models.wrap_recurrent``, an nn.Sequential MLP by ``models.layer_stack``)
  and on the zoo model of the same sizes: what wrapping costs.

Times are medians over all timed steps after warm-up; each timed
configuration prints one line on stderr (``[bench engines] backprop depth 8
width 256: 23.1 ms median (3/12)``), so a long run shows progress in a log
file. Peak memory: on CUDA,
``max_memory_allocated`` during a call above what was allocated before it;
on the CPU, the peak of live tensor bytes over the call, from the torch
profiler's per-op allocation records (op granularity, so approximate).
Reported for the whole step (with optimizer and orthogonality upkeep) and for
``compute_grads`` alone with the old grads freed (``grads_peak_mb``, which
includes the ``grad_bytes_mb`` of the gradients it writes: activations are
the rest, and dominate when the batch is large against the width).
"""

import contextlib
import copy
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import models
import tasks
from models.orthogonal import orthogonality_error, project_
from models.retraction import CayleyRetraction
from models.scan import METHODS as SCAN_METHODS
from models.scan import reverse_scan
from trainers.core.options import parse_key_values
from trainers.core.protocols import recurrent_forwards
from trainers.core.registry import build_engine
from trainers.engines.backprop import Backprop
from trainers.run.threads import last_choice
from trainers.run.trainer import Trainer

__all__ = ["machine_description", "bench_overhead", "bench_engines", "markdown_table", "peak_step_memory_mb",
           "write_results", "engine_from_spec", "bench_scan", "bench_recurrent", "bench_residual"]


def machine_description(device: torch.device) -> str:
    """CPU model and thread count, or GPU name; torch version."""
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        model = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        what = f"{model}, {torch.get_num_threads()} threads"
    return f"{what}; torch {torch.__version__}"


def _line(suite: str, text: str) -> None:
    print(f"[bench {suite}] {text}", file=sys.stderr, flush=True)


class _SuiteProgress:
    """One progress line on stderr per timed configuration of a suite."""

    def __init__(self, suite: str, total: int):
        self.suite, self.total, self.done = suite, total, 0

    def __call__(self, what: str, ms: float) -> None:
        self.done += 1
        _line(self.suite, f"{what}: {ms:.4g} ms median ({self.done}/{self.total})")


def _backprop_first(names: list[str]) -> list[str]:
    """The trainer specs in timing order: backprop (the ratios' base) first."""
    return ["backprop"] + [t for t in names if t != "backprop"]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _native_stderr_silenced():
    """File descriptor 2 sent to /dev/null for the block: the torch profiler's C++ side prints its start and stop
    (``USDT: ... profiler_start``) and allocator warnings there, two to three lines per measured step, which are
    not the user's business."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_step_memory_mb(step, device: torch.device) -> float:
    """Peak extra memory of one call of ``step()`` in MiB (see module docstring)."""
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        _sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak / 2**20


def _batches(x, y, batch_size, seed=0):
    """Endless batches in a seeded order."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x) - batch_size + 1, batch_size):
            rows = order[start:start + batch_size]
            yield x[rows], y[rows]


def bench_overhead(*, in_features, width, depth, batch_size, n_train, steps, warmup, rounds, device) -> dict:
    """Trainer + backprop against a hand-written loop on the same MLP and data."""
    task = tasks.build("teacher", in_features=in_features, num_classes=10, n_train=n_train,
                       n_val=256, n_test=256, hidden=64)
    torch.manual_seed(0)
    model = models.build("mlp", in_features=in_features, out_features=10, depth=depth, width=width,
                         activation="relu")
    plain = copy.deepcopy(model).to(device)
    trainer = Trainer(model, Backprop(), task, optimizer="sgd", lr=0.01, momentum=0.9,
                      batch_size=batch_size, progress=False, device=str(device), eval_every=10**9)
    opt = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
    batches = _batches(task.train.inputs, task.train.targets, batch_size)

    def plain_loop(n):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            x, y = next(batches)
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(plain(x), y)
            loss.backward()
            opt.step()
            loss.item()
            _sync(device)
            times.append(time.perf_counter() - t0)
        return times

    trainer.fit(steps=warmup)
    plain_loop(warmup)
    trainer_times, plain_times = [], []
    def trainer_loop(n):
        first = len(trainer.step_times)
        trainer.fit(steps=trainer.step + n)
        return trainer.step_times[first:]

    for r in range(rounds):  # alternate which goes first, against drift
        if r % 2:
            plain_times += plain_loop(steps)
            trainer_times += trainer_loop(steps)
        else:
            trainer_times += trainer_loop(steps)
            plain_times += plain_loop(steps)
    t_trainer, t_plain = statistics.median(trainer_times), statistics.median(plain_times)
    _line("overhead", f"mlp depth {depth} width {width} in {in_features}: trainer {1e3 * t_trainer:.4g} ms, "
                      f"plain loop {1e3 * t_plain:.4g} ms median")
    return {"suite": "overhead", "model": f"mlp depth {depth} width {width} in {in_features}",
            "batch_size": batch_size, "steps_timed": len(trainer_times),
            "trainer_ms": 1e3 * t_trainer, "plain_loop_ms": 1e3 * t_plain, "ratio": t_trainer / t_plain}


def _classification_batch(batch_size: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed batch of the MLP suites: ``batch_size`` Gaussian inputs of ``width`` features, 10 classes."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(batch_size, width, generator=gen).to(device),
            torch.randint(0, 10, (batch_size,), generator=gen).to(device))


def bench_engines(*, trainers, depths, widths, batch_size, steps, warmup, device, activation="tanh",
                  orthogonal="bjorck", orthogonal_iters=3) -> list[dict]:
    """Step time (compute_grads + SGD step + orthogonality upkeep, round-robin against backprop)
    and peak memory of each trainer on square MLPs."""
    rows = []
    upkeep = f"{orthogonal} x{orthogonal_iters}" if orthogonal == "bjorck" else str(orthogonal)
    progress = _SuiteProgress("engines", len(depths) * len(widths) * len(_backprop_first(trainers)))
    for depth in depths:
        for width in widths:
            x, y = _classification_batch(batch_size, width, device)
            build = functools.partial(models.build, "mlp", in_features=width, out_features=10, depth=depth,
                                      width=width, activation=activation, orthogonal=orthogonal,
                                      orthogonal_iters=orthogonal_iters)
            for row in _time_trainers(trainers, build, x, y, F.cross_entropy, device, steps, warmup,
                                      progress, f"depth {depth} width {width}", after=project_,
                                      optimizer=functools.partial(torch.optim.SGD, lr=1e-3,
                                                                  momentum=0.0 if orthogonal == "retraction" else 0.9),
                                      step_memory=True):
                rows.append({"suite": "engines", "trainer": row.pop("trainer"), "depth": depth, "width": width,
                             "batch_size": batch_size, "orthogonal": upkeep, **row})
    return rows


def bench_grads(*, trainers, depths, widths, batch_size, steps, warmup, device, activation="tanh",
                orthogonal="bjorck", orthogonal_iters=3, dropout=0.0) -> list[dict]:
    """The gradient computation alone (``compute_grads``, no optimizer step, no upkeep) of each trainer on
    square MLPs (hidden ``dropout``), round-robin against backprop: what an engine costs before the shared
    parts of a step."""
    rows = []
    bare = any(name.startswith("foton") for name in trainers)
    progress = _SuiteProgress("grads", len(depths) * len(widths) * (len(_backprop_first(trainers)) + bare))
    for depth in depths:
        for width in widths:
            x, y = _classification_batch(batch_size, width, device)
            torch.manual_seed(0)
            model = models.build("mlp", in_features=width, out_features=10, depth=depth, width=width,
                                 activation=activation, orthogonal=orthogonal,
                                 orthogonal_iters=orthogonal_iters, dropout=dropout).to(device)
            steps_by = {}
            for name in _backprop_first(trainers):
                engine = engine_from_spec(name)
                engine.check(model)
                steps_by[name] = functools.partial(engine.compute_grads, model, x, y, F.cross_entropy)
            if bare:
                steps_by["bare forward-only pass"] = functools.partial(bare_forward_only, model, x, y)
            timed = time_round_robin(steps_by, timed=steps, rounds=steps, warmup=warmup, device=device)
            for name, t in timed.items():
                progress(f"{name} depth {depth} width {width}", t["step_ms"])
                rows.append({"suite": "grads", "trainer": name, "depth": depth, "width": width,
                             "batch_size": batch_size, "dropout": dropout, "grads_ms": t["step_ms"],
                             "ratio_to_backprop": t["ratio_to_baseline"],
                             "ratio_spread": f"{t['ratio_min']:.3g}..{t['ratio_max']:.3g}"})
    return rows


def bench_upkeep(*, trainers, depths, widths, batch_sizes, steps, warmup, device, activation="tanh",
                 orthogonal_iters=3) -> list[dict]:
    """The orthogonal/plain step ratio of each trainer: SGD step (lr 1e-3, no momentum) with Björck projection
    (``orthogonal_iters`` iterations) and with the Cayley retraction, against the same step on the same MLP
    without upkeep (its hidden layers marked orthogonal, never projected), the three round-robin."""
    rows = []
    progress = _SuiteProgress("upkeep", len(depths) * len(widths) * len(batch_sizes) * len(trainers) * 3)
    for depth in depths:
        for width in widths:
            for batch_size in batch_sizes:
                x, y = _classification_batch(batch_size, width, device)
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
                        step_fns[upkeep] = _training_step(engine, model, x, y, F.cross_entropy, opt,
                                                          after=project_ if upkeep == "bjorck" else None)
                    timed = time_round_robin(step_fns, timed=steps, rounds=steps, warmup=warmup, device=device)
                    for upkeep, t in timed.items():
                        label = f"Björck x{orthogonal_iters}" if upkeep == "bjorck" else upkeep
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
        layers, act, batch = model.layers, model.act, x.shape[0]
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


class _LoopBPTT(Backprop):
    """BPTT through each recurrent layer's cell stepped in a Python loop over time (a baseline)."""

    name = "bptt_loop"

    @staticmethod
    def _looped(index, layer):
        def forward(x, h0=None):
            h = x.new_zeros(x.shape[0], layer.state_size) if h0 is None else h0
            states = []
            for t in range(x.shape[1]):  # the point of this baseline: one cell call per step
                h = layer.cell(x[:, t], h)
                states.append(h)
            return layer.output(torch.stack(states, dim=1))
        return forward

    def compute_grads(self, model, inputs, targets, loss_fn):
        with recurrent_forwards(model, self._looped):
            return super().compute_grads(model, inputs, targets, loss_fn)


def _training_step(engine, model, x, y, loss_fn, opt, after=None):
    """The timed step: the engine's gradients, the optimizer step, then ``after(model)`` (e.g. a projection).
    Retracted layers take their step as the Trainer does (``CayleyRetraction``)."""
    retraction = CayleyRetraction(model)

    def step():
        with retraction.recording():
            engine.compute_grads(model, x, y, loss_fn)
        if retraction:
            retraction.step(opt)
        else:
            opt.step()
        if after is not None:
            after(model)
    return step


def time_round_robin(steps: dict, *, timed: int, rounds: int, warmup: int, device, clock=time.perf_counter) -> dict:
    """Time every ``steps[name]()`` interleaved: ``rounds`` rounds, each timing a block of
    ``timed // rounds`` (at least 1) calls of every step in turn, the order rotated every round,
    after ``warmup`` calls of each. The first name is the baseline.

    Returns ``{name: {"step_ms": median over all timed calls, "ratio_to_baseline": median over
    rounds of (this block's median / the baseline's block median in the same round), "ratio_min",
    "ratio_max", "ms_min", "ms_max" (the block medians' range, ms)}}``.
    A burst of load slows every step of the rounds it covers alike, so the
    median ratio survives it; timing one step after another would put it on one of them.
    """
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    per_round = max(1, timed // rounds)
    times = {name: [] for name in names}  # per round: the block's call times
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            block = []
            for _ in range(per_round):
                _sync(device)
                t0 = clock()
                steps[name]()
                _sync(device)
                block.append(clock() - t0)
            times[name].append(block)
    base = [statistics.median(block) for block in times[names[0]]]
    out = {}
    for name in names:
        medians = [statistics.median(block) for block in times[name]]
        ratios = [m / b for m, b in zip(medians, base, strict=True)]
        out[name] = {"step_ms": 1e3 * statistics.median(t for block in times[name] for t in block),
                     "ratio_to_baseline": statistics.median(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios), "ms_min": 1e3 * min(medians), "ms_max": 1e3 * max(medians)}
    return out


def _timing_row(timing: dict, peak: float, base_peak: float) -> dict:
    return {"step_ms": timing["step_ms"], "ratio_to_backprop": timing["ratio_to_baseline"],
            "ratio_spread": f"{timing['ratio_min']:.3g}..{timing['ratio_max']:.3g}",
            "speedup_over_backprop": 1 / timing["ratio_to_baseline"], "grads_peak_mb": peak,
            "peak_ratio_to_backprop": peak / base_peak}


def _time_trainers(names, build_model, x, y, loss_fn, device, steps, warmup, progress, label,
                   optimizer=None, after=None, step_memory=False) -> list[dict]:
    """Step time (compute_grads + optimizer step + ``after``) of each trainer spec on a fresh
    ``build_model()`` (same seed), round-robin against backprop, one step of each per round
    (``time_round_robin`` with ``steps`` rounds), then the
    peak memory of each one's ``compute_grads`` (and, with ``step_memory``, of its whole step and
    the bytes of its gradients); one ``progress`` line per trainer, ``label`` naming the
    configuration. ``optimizer(params)``: Adam 1e-3 unless given."""
    names = _backprop_first(names)
    setups, step_fns = {}, {}
    for name in names:
        torch.manual_seed(0)
        model = build_model().to(device)
        engine = _LoopBPTT() if name == "bptt_loop" else engine_from_spec(name)
        engine.check(model)
        opt = (optimizer or functools.partial(torch.optim.Adam, lr=1e-3))(model.parameters())
        setups[name] = (model, engine)
        step_fns[name] = _training_step(engine, model, x, y, loss_fn, opt, after=after)
    timings = time_round_robin(step_fns, timed=steps, rounds=steps, warmup=warmup, device=device)
    peaks, extra = {}, {}
    for name, (model, engine) in setups.items():
        progress(f"{name} {label}", timings[name]["step_ms"])
        if step_memory:
            extra[name] = {"step_peak_mb": peak_step_memory_mb(step_fns[name], device),
                           "grad_bytes_mb": sum(p.numel() * p.element_size() for p in model.parameters()
                                                if p.requires_grad) / 2**20}
        # the gradient computation alone, grads freed first: activations + new grads + temporaries
        model.zero_grad(set_to_none=True)
        peaks[name] = peak_step_memory_mb(functools.partial(engine.compute_grads, model, x, y, loss_fn), device)
    return [{"trainer": name, **_timing_row(timings[name], peaks[name], peaks[names[0]]), **extra.get(name, {})}
            for name in names]


def bench_recurrent(*, trainers, cell, depths, hidden, lengths, batch_size, vocab, steps, warmup, device,
                    loop_max_length=1024) -> list[dict]:
    """Step time (compute_grads + Adam) and peak memory of each trainer on ``rnn_lm`` with token inputs.

    ``bptt_loop`` in ``trainers`` adds the Python-loop BPTT baseline (only for lengths up to
    ``loop_max_length``: its cost grows with T kernel launches per layer).
    """
    from tasks.base import sequence_cross_entropy

    rows = []
    runnable = {T: [t for t in trainers if t != "bptt_loop" or T <= loop_max_length] for T in lengths}
    progress = _SuiteProgress("recurrent", len(depths) * sum(len(_backprop_first(n)) for n in runnable.values()))
    for depth in depths:
        for T in lengths:
            gen = torch.Generator().manual_seed(0)
            x = torch.randint(0, vocab, (batch_size, T), generator=gen).to(device)
            y = torch.randint(0, vocab, (batch_size, T), generator=gen).to(device)

            build = functools.partial(models.build, "rnn_lm", in_features=T, out_features=vocab, cell=cell,
                                      hidden=hidden, depth=depth)

            for row in _time_trainers(runnable[T], build, x, y, sequence_cross_entropy, device, steps, warmup,
                                      progress, f"{cell} depth {depth} T {T}"):
                rows.append({"suite": "recurrent", "trainer": row.pop("trainer"), "cell": cell, "depth": depth,
                             "hidden": hidden, "T": T, "batch_size": batch_size, **row})
    return rows


def bench_residual(*, trainers, depth, width, batch_size, steps, warmup, device) -> list[dict]:
    """Step time (compute_grads + Adam) and peak memory of each trainer on a ``residual_mlp``
    of ``depth`` blocks (width and branch width ``width``, 10 classes), against backprop."""
    x, y = _classification_batch(batch_size, width, device)

    def build():
        return models.build("residual_mlp", in_features=width, out_features=10, depth=depth, width=width)

    return [{"suite": "residual", "trainer": row.pop("trainer"), "depth": depth, "width": width,
             "batch_size": batch_size, **row}
            for row in _time_trainers(trainers, build, x, y, F.cross_entropy, device, steps, warmup,
                                      _SuiteProgress("residual", len(_backprop_first(trainers))),
                                      f"depth {depth} width {width}")]


def bench_scan(*, lengths, batch_size, width, repeats, device) -> list[dict]:
    """The reverse scan g_t = e_t + a * g_{t+1} (DSF's A = diag(linspace(0, 1, d)))
    in every form, against the DSF authors' loop with a dense (B, d) x (d, d) product per step."""
    rows = []
    a = torch.linspace(0, 1, width, device=device).reshape(1, 1, width)
    dense = torch.diag(a.flatten())

    def authors_loop(e):
        g, out = torch.zeros_like(e[0]), torch.empty_like(e)
        for t in range(e.shape[0] - 1, -1, -1):
            g = e[t] + g @ dense
            out[t] = g
        return out

    forms = {m: (lambda e, m=m: reverse_scan(e, a, method=m)) for m in SCAN_METHODS if m != "auto"}
    forms["authors_dense_loop"] = authors_loop
    progress = _SuiteProgress("scan", len(lengths) * len(forms))
    for T in lengths:
        e = torch.randn(T, batch_size, width, device=device)
        times = {}
        for name, fn in forms.items():
            fn(e)
            samples = []
            for _ in range(repeats):
                _sync(device)
                t0 = time.perf_counter()
                fn(e)
                _sync(device)
                samples.append(time.perf_counter() - t0)
            times[name] = 1e3 * statistics.median(samples)
            progress(f"{name} T {T}", times[name])
        for name, ms in times.items():
            rows.append({"suite": "scan", "form": name, "T": T, "batch_size": batch_size, "width": width,
                         "ms": ms, "ratio_to_authors_loop": ms / times["authors_dense_loop"]})
    return rows


class _UserGRULanguageModel(nn.Module):
    """A language model written the way users write it: nn.Embedding, a 2-layer nn.GRU with
    batch_first=False, nn.Linear; the zoo's ``rnn_lm`` with the same sizes is its equivalent."""

    def __init__(self, vocab: int, hidden: int, depth: int):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, hidden), nn.Linear(hidden, vocab)
        self.rnn = nn.GRU(hidden, hidden, num_layers=depth)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens).transpose(0, 1))
        return self.head(out.transpose(0, 1))


def bench_user(*, steps, warmup, device, hidden=256, length=256, vocab=64, batch_size=64, width=256,
               depth=8) -> list[dict]:
    """Every engine on a user-style model (``models.wrap_recurrent`` on an nn.GRU LM; ``models.layer_stack``
    on an orthogonal nn.Sequential tanh MLP) and on the zoo model with the same sizes (``rnn_lm``, ``mlp``),
    all steps of one configuration timed round-robin; ratios to backprop on the same model, and user / zoo."""
    from tasks.base import sequence_cross_entropy

    rows = []
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch_size, length), generator=gen).to(device)
    targets = torch.randint(0, vocab, (batch_size, length), generator=gen).to(device)
    x = torch.randn(batch_size, width, generator=gen).to(device)
    y = torch.randint(0, 10, (batch_size,), generator=gen).to(device)

    def gru_user():
        return models.wrap_recurrent(_UserGRULanguageModel(vocab, hidden, 2))

    def gru_zoo():
        return models.build("rnn_lm", in_features=length, out_features=vocab, cell="gru", hidden=hidden, depth=2)

    def mlp_user():
        parts = []
        for _ in range(depth - 1):
            parts += [nn.Linear(width, width), nn.Tanh()]
        return models.layer_stack(nn.Sequential(*parts, nn.Linear(width, 10)), orthogonal="bjorck")

    def mlp_zoo():
        return models.build("mlp", in_features=width, out_features=10, depth=depth, width=width, activation="tanh",
                            orthogonal="bjorck")

    configs = [("gru lm 2 x 256, T 256", {"user (nn.GRU, wrap_recurrent)": gru_user, "zoo (rnn_lm)": gru_zoo},
                ["backprop", "ftbptt", "dsf", "highway:k=2"], tokens, targets, sequence_cross_entropy, None),
               (f"tanh mlp {depth} x {width}, Bjorck", {"user (nn.Sequential, layer_stack)": mlp_user,
                                                        "zoo (mlp)": mlp_zoo},
                ["backprop", "foton", "pepita", "fa", "dfa"], x, y, F.cross_entropy, project_)]
    progress = _SuiteProgress("user", sum(len(b) * len(t) for _, b, t, *_ in configs))
    for label, builds, names, inputs, labels, loss_fn, after in configs:
        steps_by = {}
        for kind, build in builds.items():
            for name in names:
                torch.manual_seed(0)
                model = build().to(device)
                engine = engine_from_spec(name)
                engine.check(model)
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
                steps_by[(kind, name)] = _training_step(engine, model, inputs, labels, loss_fn, opt, after=after)
        timed = time_round_robin(dict(steps_by), timed=steps, rounds=steps, warmup=warmup, device=device)
        for (kind, name), t in timed.items():
            progress(f"{name} on {kind}", t["step_ms"])
        for name in names:
            user, zoo = (timed[(kind, name)] for kind in builds)
            user_base, zoo_base = (timed[(kind, "backprop")] for kind in builds)
            rows.append({"suite": "user", "model": label, "trainer": name, "user_ms": user["step_ms"],
                         "zoo_ms": zoo["step_ms"],
                         "user_ratio_to_backprop": user["ratio_to_baseline"] / user_base["ratio_to_baseline"],
                         "zoo_ratio_to_backprop": zoo["ratio_to_baseline"] / zoo_base["ratio_to_baseline"],
                         "user_over_zoo": user["ratio_to_baseline"] / zoo["ratio_to_baseline"]})
    return rows


def engine_from_spec(spec: str):
    """``"foton:mode=lowmem,temperature=2"`` -> ``build_engine("foton", mode="lowmem", temperature=2.0)``."""
    name, _, rest = spec.partition(":")
    return build_engine(name, **parse_key_values(filter(None, rest.split(",")), f"trainer spec {spec!r}"))


def markdown_table(rows: list[dict]) -> str:
    """Rows of one suite as a Markdown table (floats to 3 significant digits)."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if k != "suite"]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(rows: list[dict], out_dir, machine: str, command: str) -> str:
    """``bench.json`` and ``bench.md`` in ``out_dir``; returns the Markdown."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = last_choice()
    (out_dir / "bench.json").write_text(json.dumps({"machine": machine, "command": command,
                                                    "threads": {"count": threads.count, "reason": threads.reason},
                                                    "rows": rows}, indent=2))
    text = f"Machine: {machine}\n\nThreads: {threads.count} ({threads.reason})\n\nCommand: `{command}`\n\n"
    for suite in dict.fromkeys(r["suite"] for r in rows):
        text += f"### {suite}\n\n" + markdown_table([r for r in rows if r["suite"] == suite]) + "\n"
    (out_dir / "bench.md").write_text(text)
    return text
