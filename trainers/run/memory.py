"""Will this run fit in memory? An estimate made before anything is allocated.

The model is built on PyTorch's ``meta`` device (shapes only, no storage) and
run once on a meta batch to count the activations each sample produces. The
estimate, in bytes of the run's dtype, is

    parameters x (weights + gradients + best-model copy + optimizer state)
    + buffers + activations per sample x samples per batch x 2 (forward + backward)

against the memory available now (``MemAvailable``, or the cgroup limit if
lower; free GPU memory for CUDA devices). It is a lower bound of what a run
needs (engines keep a few more copies), so a refusal is certain and a pass is
no promise; its purpose is a one-line refusal instead of a machine that swaps
for minutes before the kernel kills the process.

A model too deep to build even on ``meta`` in seconds (a transformers config with a million layers) is estimated
at one and two of each layer count and extrapolated linearly (``check_fits_scaled``): every term grows linearly
in the number of identical layers.
"""

from pathlib import Path

import torch

from gradengines.models.adapters.calling import call_model
from gradengines.trainers.core.errors import ConfigError

__all__ = ["MAX_DEPTH", "estimate_bytes", "available_bytes", "check_fits", "check_fits_scaled"]

MAX_DEPTH = 10_000
"""Deepest zoo model accepted: models are built one module per layer (about 5 KB each, even on ``meta``)."""

OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}  # tensors per parameter (SGD: with momentum)


def _meta_model(build):
    """``build()`` on the meta device; None if a layer cannot be built there (then no estimate)."""
    try:
        with torch.device("meta"):
            return build()
    except Exception:  # e.g. geotorch parametrizations that initialise with real numbers
        return None


def estimate_bytes(build, sample: torch.Tensor, *, batch_size: int, optimizer: str, momentum: float,
                   dtype: torch.dtype) -> dict | None:
    """``{"bytes", "parameters", "activations_per_sample"}`` of the model ``build()`` trained on batches
    of ``batch_size`` samples shaped like ``sample`` (one sample with its batch dimension); None
    if the model cannot be built on the meta device."""
    model = _meta_model(build)
    if model is None:
        return None
    parameters = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers())
    produced: list[int] = []
    if any(not t.is_meta for t in (*model.parameters(), *model.buffers())):
        # a model already built for real (a user's, built once): its forward is not run on meta tensors, which
        # could leave meta tensors in its caches (pytorch/examples' TransformerModel keeps its mask)
        return _estimate(parameters, buffers, 0, batch_size, optimizer, momentum, dtype)
    hooks = [m.register_forward_hook(lambda _m, _i, out: produced.append(out.numel() if torch.is_tensor(out) else 0))
             for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            call_model(model, torch.empty(sample.shape, dtype=sample.dtype if not sample.is_floating_point() else dtype,
                                          device="meta"))
        per_sample = sum(produced) // max(1, sample.shape[0])
    except Exception:  # a forward the meta device cannot run: parameters only
        per_sample = 0
    finally:
        for h in hooks:
            h.remove()
    return _estimate(parameters, buffers, per_sample, batch_size, optimizer, momentum, dtype)


def _estimate(parameters: int, buffers: int, per_sample: int, batch_size: int, optimizer: str, momentum: float,
              dtype: torch.dtype) -> dict:
    states = OPTIMIZER_STATES[optimizer] if optimizer != "sgd" or momentum > 0 else 0
    elements = parameters * (3 + states) + buffers + 2 * per_sample * batch_size
    return {"bytes": elements * torch.finfo(dtype).bits // 8, "parameters": parameters,
            "activations_per_sample": per_sample}


def available_bytes(device: torch.device) -> int | None:
    """Memory this process can still take on ``device`` (None where unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    limits = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
        cgroup = Path("/sys/fs/cgroup/memory.max")
        if cgroup.exists() and cgroup.read_text().strip().isdigit():
            limits.append(int(cgroup.read_text()))
    except OSError:
        pass
    return min(limits) if limits else None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_fits(build, sample, *, batch_size: int, optimizer: str, momentum: float, dtype: torch.dtype,
               device: torch.device, depth: int | None = None) -> dict | None:
    """Raise ``ConfigError`` (one line) if the run cannot fit in ``device``'s memory; return the estimate."""
    if depth is not None and depth > MAX_DEPTH:
        raise ConfigError(f"--depth {depth} is above the {MAX_DEPTH} layers this framework builds (one module "
                          f"per layer)")
    estimate = estimate_bytes(build, sample, batch_size=batch_size, optimizer=optimizer, momentum=momentum,
                              dtype=dtype)
    free = available_bytes(device)
    if estimate is None or free is None or estimate["bytes"] <= free:
        return estimate
    raise ConfigError(
        f"this run needs at least {_gib(estimate['bytes'])} ({estimate['parameters']:,} parameters with their "
        f"gradients, optimizer state and best-model copy; activations of {batch_size} samples) but "
        f"{_gib(free)} {'of GPU memory are' if device.type == 'cuda' else 'are'} available; lower --depth, "
        f"--width, --hidden or --batch-size")


def check_fits_scaled(build_at, counts: dict[str, int], sample, *, batch_size: int, optimizer: str,
                      momentum: float, dtype: torch.dtype, device: torch.device) -> dict | None:
    """``check_fits`` for a model with layer counts ``counts`` (option -> value), built by ``build_at(values)``
    with some of them replaced: estimated with every count at 1, then each at 2 alone, and extrapolated
    linearly to ``counts`` (seconds, whatever the depth); the refusal names the counts to lower."""
    def at(values: dict) -> dict | None:
        return estimate_bytes(lambda: build_at(values), sample, batch_size=batch_size, optimizer=optimizer,
                              momentum=momentum, dtype=dtype)

    ones = dict.fromkeys(counts, 1)
    base = at(ones)
    steps = {key: at({**ones, key: 2}) for key in counts}
    if base is None or any(v is None for v in steps.values()):
        return None
    estimate = {what: base[what] + sum((counts[k] - 1) * (steps[k][what] - base[what]) for k in counts)  # type: ignore
                for what in ("bytes", "parameters", "activations_per_sample")}
    free = available_bytes(device)
    if free is None or estimate["bytes"] <= free:
        return estimate
    named = ", ".join(f"{k}={v:,}" for k, v in counts.items())
    raise ConfigError(
        f"this run needs at least {_gib(estimate['bytes'])} ({estimate['parameters']:,} parameters at {named}, "
        f"extrapolated from 1 and 2 layers built on the meta device, with their gradients, optimizer state and "
        f"best-model copy; activations of {batch_size} samples) but {_gib(free)} "
        f"{'of GPU memory are' if device.type == 'cuda' else 'are'} available; lower {', '.join(counts)} or "
        f"--batch-size")

