"""The timing core every benchmark suite shares: the machine's description, one line of progress per
configuration, round-robin timing against backprop (``time_round_robin``), a training step, peak memory
of one call, and the results as bench.json + bench.md."""

import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gradengines.models.orthogonal.retraction import CayleyRetraction
from gradengines.trainers.core.options import parse_key_values
from gradengines.trainers.core.protocols import recurrent_forwards
from gradengines.trainers.core.registry import build_engine, split_spec
from gradengines.trainers.core.threads import last_choice
from gradengines.trainers.engines.backprop import Backprop

__all__ = ["LoopBPTT", "classification_batch", "machine_description", "progress_line", "SuiteProgress",
           "backprop_first", "sync", "peak_step_memory_mb", "batch_stream", "training_step", "time_round_robin",
           "timing_row", "time_trainers", "engine_from_spec", "markdown_table", "write_results"]


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
        threads = torch.get_num_threads()
        what = f"{model}, {threads} thread{'s' if threads > 1 else ''}"
    return f"{what}; torch {torch.__version__}"


def progress_line(suite: str, text: str) -> None:
    print(f"[bench {suite}] {text}", file=sys.stderr, flush=True)


class SuiteProgress:
    """One progress line on stderr per timed configuration of a suite."""

    def __init__(self, suite: str, total: int):
        self.suite, self.total, self.done = suite, total, 0

    def __call__(self, what: str, ms: float) -> None:
        self.done += 1
        progress_line(self.suite, f"{what}: {ms:.4g} ms median ({self.done}/{self.total})")


def backprop_first(names: list[str]) -> list[str]:
    """The trainer specs in timing order: backprop (the ratios' base) first."""
    return ["backprop"] + [t for t in names if t != "backprop"]


def sync(device):
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
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    # the profiler's allocation records (bytes, > 0 allocated, < 0 freed) in time order, read raw: building its
    # per-op events took 3-4x longer, and their per-op totals lost allocations (an orthogonal MLP's step read
    # 0.1 MB, below the 7 MB of gradients it writes)
    records = sorted(((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                      if e.name() == "[memory]"), key=lambda record: record[0])
    live = peak = 0
    for _, nbytes in records:
        live += nbytes
        peak = max(peak, live)
    return peak / 2**20


def batch_stream(x, y, batch_size, seed=0):
    """Endless batches in a seeded order."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x) - batch_size + 1, batch_size):
            rows = order[start:start + batch_size]
            yield x[rows], y[rows]


def training_step(engine, model, x, y, loss_fn, opt, after=None):
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


def time_round_robin(steps: dict, *, timed: int, rounds: int, warmup: int, device, clock=time.perf_counter,
                     on_round=None) -> dict:
    """Time every ``steps[name]()`` interleaved: ``rounds`` rounds, each timing a block of
    ``timed // rounds`` (at least 1) calls of every step in turn, the order rotated every round,
    after ``warmup`` calls of each. The first name is the baseline. ``on_round(r)``: called after
    round ``r`` (1..rounds; 0 after the warm-up), e.g. to show progress.

    Returns ``{name: {"step_ms": median over all timed calls, "ratio_to_baseline": median over
    rounds of (this block's median / the baseline's block median in the same round), "ratio_min",
    "ratio_max", "ratios" (each round's), "ms_min", "ms_max" (the block medians' range, ms)}}``.
    A burst of load slows every step of the rounds it covers alike, so the
    median ratio survives it; timing one step after another would put it on one of them.
    """
    names = list(steps)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    if on_round:
        on_round(0)
    per_round = max(1, timed // rounds)
    times = {name: [] for name in names}  # per round: the block's call times
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            block = []
            for _ in range(per_round):
                sync(device)
                t0 = clock()
                steps[name]()
                sync(device)
                block.append(clock() - t0)
            times[name].append(block)
        if on_round:
            on_round(r + 1)
    base = [statistics.median(block) for block in times[names[0]]]
    out = {}
    for name in names:
        medians = [statistics.median(block) for block in times[name]]
        ratios = [m / b for m, b in zip(medians, base, strict=True)]
        out[name] = {"step_ms": 1e3 * statistics.median(t for block in times[name] for t in block),
                     "ratio_to_baseline": statistics.median(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios), "ratios": ratios, "ms_min": 1e3 * min(medians),
                     "ms_max": 1e3 * max(medians)}
    return out


def timing_row(timing: dict, peak: float, base_peak: float) -> dict:
    return {"step_ms": timing["step_ms"], "ratio_to_backprop": timing["ratio_to_baseline"],
            "ratio_spread": f"{timing['ratio_min']:.3g}..{timing['ratio_max']:.3g}",
            "speedup_over_backprop": 1 / timing["ratio_to_baseline"], "grads_peak_mb": peak,
            "peak_ratio_to_backprop": peak / base_peak}


def time_trainers(names, build_model, x, y, loss_fn, device, steps, warmup, progress, label,
                   optimizer=None, after=None, step_memory=False) -> list[dict]:
    """Step time (compute_grads + optimizer step + ``after``) of each trainer spec on a fresh
    ``build_model()`` (same seed), round-robin against backprop, one step of each per round
    (``time_round_robin`` with ``steps`` rounds), then the
    peak memory of each one's ``compute_grads`` (and, with ``step_memory``, of its whole step and
    the bytes of its gradients); one ``progress`` line per trainer, ``label`` naming the
    configuration. ``optimizer(params)``: Adam 1e-3 unless given."""
    names = backprop_first(names)
    setups, step_fns = {}, {}
    for name in names:
        torch.manual_seed(0)
        model = build_model().to(device)
        engine = LoopBPTT() if name == "bptt_loop" else engine_from_spec(name)
        engine.check(model)
        opt = (optimizer or functools.partial(torch.optim.Adam, lr=1e-3))(model.parameters())
        setups[name] = (model, engine)
        step_fns[name] = training_step(engine, model, x, y, loss_fn, opt, after=after)
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
    return [{"trainer": name, **timing_row(timings[name], peaks[name], peaks[names[0]]), **extra.get(name, {})}
            for name in names]


def engine_from_spec(spec: str):
    """``"foton:mode=lowmem,temperature=2"`` -> ``build_engine("foton", mode="lowmem", temperature=2.0)``; the
    engine may be a reference, ``my_rule.py:SignSGD:clip=1`` (``trainers.core.registry.split_spec``)."""
    name, rest = split_spec(spec)
    items = [item for part in rest for item in part.split(",") if item]
    return build_engine(name, **parse_key_values(items, f"trainer spec {spec!r}"))


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


class LoopBPTT(Backprop):
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


def classification_batch(batch_size: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed batch of the MLP suites: ``batch_size`` Gaussian inputs of ``width`` features, 10 classes."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(batch_size, width, generator=gen).to(device),
            torch.randint(0, 10, (batch_size,), generator=gen).to(device))
