"""Data parallelism over ``torch.distributed``: shards, gradient averaging, reductions.

Launch any script with ``torchrun`` and every rank holds a whole replica of
the model. At each step rank r takes its shard of the global batch (rows
r, r + W, r + 2W, ... of it, W = world size), its engine writes ``.grad``
for that shard, and the Trainer averages them, weighted by shard size:

    g = sum_r n_r g_r / sum_r n_r

an all-reduce of ``n_r g_r`` in buckets. Every engine here returns a mean
over the shard's samples of per-sample terms (backprop, highway and dsf of a
mean loss; foton and pepita of their per-sample updates), so this is the
estimate one process would compute on the whole global batch, and every rank
then steps identically. DDP's autograd hooks
are not used: forward-only and iterative engines write ``.grad`` without a
backward pass.

Shards are cut from each global batch of the Trainer's (seed, epoch)
permutation, not by ``torch.utils.data.DistributedSampler``: that sampler pads
the epoch with repeated samples so that every rank gets as many, which would
make N ranks train on other data than one process. Here the global batches
are exactly one process's, and a short last batch is weighted by its shards.

Without a process group (a plain ``python`` run) ``DataParallel()`` is one
rank and every method is the identity, at no cost.
"""

import contextlib
import datetime
import math
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from gradengines.models.orthogonal import project_weights_, projected_weights
from gradengines.trainers.core.errors import ConfigError, DistributedError, spell

__all__ = ["check_device", "DataParallel", "exit_process", "init_distributed", "launched_distributed", "local_device",
           "mean_over_ranks"]

BACKENDS = ("auto", "gloo", "nccl")
BUCKET_BYTES = 25 * 2**20  # as DistributedDataParallel's default bucket


def launched_distributed() -> bool:
    """True under ``torchrun`` (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_device(device: str) -> str:
    """``cuda`` means this rank's GPU (``cuda:LOCAL_RANK``) under a launcher; anything else is kept."""
    if device == "cuda" and launched_distributed():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return device


def init_distributed(backend: str = "auto", timeout_s: float = 300.0, device: str = "cpu") -> "DataParallel":
    """Join the job's process group if a launcher started this process; one rank otherwise.

    ``backend="auto"``: NCCL when the device is a GPU, gloo on the CPU. ``timeout_s``
    bounds every collective: a rank that dies or hangs stops the others with
    ``DistributedError`` instead of a silent wait.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"--dist-backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not 0 < timeout_s < math.inf:
        raise ConfigError(f"--dist-timeout must be a finite number of seconds > 0, got {timeout_s}")
    check_device(device)
    if not launched_distributed() or dist.is_initialized():
        return DataParallel()
    on_gpu = torch.device(device).type == "cuda"
    if backend == "auto":
        backend = "nccl" if on_gpu else "gloo"
    if backend == "nccl" and not (on_gpu and torch.cuda.is_available()):
        raise ConfigError("the nccl backend needs --device cuda and a visible GPU; on the CPU use gloo")
    if on_gpu:
        mine = torch.device(local_device(device))
        if mine.index is not None and mine.index >= torch.cuda.device_count():
            raise ConfigError(f"this rank's GPU {mine} does not exist ({torch.cuda.device_count()} GPU(s)); start "
                              "one process per GPU, or share one with --device cuda:0 --dist-backend gloo")
        torch.cuda.set_device(mine)
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as err:
        raise DistributedError(f"could not join the process group ({backend}): {_first_line(err)}") from None
    return DataParallel()


def exit_process(code: int) -> None:
    """End a script with exit status ``code``; after a torchrun job, without interpreter finalization.

    Gloo's worker threads may still be releasing the tensors of the last
    collective when the interpreter finalizes; doing so then needs the GIL and
    aborts the process (SIGABRT after a successful run; observed here about 1
    run in 30). So a rank that joined a process group closes it (on success),
    flushes its output and leaves with ``os._exit``. Logs, metrics and
    checkpoints are already closed and written by then.
    """
    if not (dist.is_available() and dist.is_initialized()):
        sys.exit(code)
    if code == 0:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def mean_over_ranks(value: torch.Tensor, count: int) -> torch.Tensor:
    """The mean over all ranks of per-rank means ``value``, each over ``count`` samples.

    For engines whose running state is an average over the batch (DSF's gate
    feedback): with it, every rank holds the global batch's statistic.
    """
    return DataParallel().weighted_mean(value, count)


class DataParallel:
    """This process's place in the job (rank, world size) and the collectives the Trainer needs.

    Read from ``torch.distributed`` when a process group exists; a single rank
    otherwise. Collective failures (a dead or hung peer past the timeout)
    raise ``DistributedError`` on the ranks still alive.
    """

    def __init__(self):
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1
        self.active = self.active and self.world_size > 1
        self.backend = dist.get_backend() if self.active else None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes logs, metrics and checkpoints."""
        return self.rank == 0

    def __repr__(self):
        return f"DataParallel(rank={self.rank}, world_size={self.world_size}, backend={self.backend})"

    # ------------------------------------------------------------ data
    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch (or split): rows[rank::world_size]."""
        return rows[self.rank::self.world_size] if self.active else rows

    # ----------------------------------------------------- collectives
    def _collective(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, dist.DistError) as err:
            raise DistributedError(
                f"rank {self.rank} of {self.world_size}: {what} failed, another rank died or hangs "
                f"({_first_line(err)})") from None

    def _all_reduce(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        self._collective(what, dist.all_reduce, tensor)
        return tensor

    def sums(self, values: list[float]) -> list[float]:
        """Element-wise sums over ranks of ``values`` (float64)."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        return self._all_reduce(t, "summing metrics").tolist()

    def weighted_mean(self, value: torch.Tensor, count: int) -> torch.Tensor:
        """sum_r count_r value_r / sum_r count_r (see ``mean_over_ranks``)."""
        if not self.active:
            return value
        flat = torch.cat([value.reshape(-1) * count, value.new_full((1,), count)])
        self._all_reduce(flat, "averaging engine statistics")
        return (flat[:-1] / flat[-1]).reshape(value.shape)

    def average_gradients(self, params: list[nn.Parameter], count: int, loss: float) -> tuple[float, int]:
        """Replace every ``p.grad`` by the sample-weighted mean over ranks (module docstring).

        ``count``: samples of this rank's shard; ``loss``: its mean loss. One
        all-reduce per bucket of ``count * grad``; the shard's loss sum and size
        ride along at the end of the first bucket. Returns the global batch's
        mean loss and sample count.
        """
        if not self.active:
            return loss, count
        missing = [i for i, p in enumerate(params) if p.grad is None]
        if missing:  # the engine contract; a mismatch across ranks would hang the all-reduce
            raise RuntimeError(f"the engine left .grad unset for {len(missing)} trainable parameter(s)")
        buckets = _buckets(params) or [[]]
        flats = [torch.cat([p.grad.reshape(-1) for p in bucket]).mul_(count) if bucket
                 else torch.zeros(0, dtype=torch.float64, device=self._device()) for bucket in buckets]
        flats[0] = torch.cat([flats[0], flats[0].new_tensor([loss * count, count])])
        works = [self._collective("averaging gradients", dist.all_reduce, flat, async_op=True) for flat in flats]
        for work in works:
            self._collective("averaging gradients", work.wait)
        loss_sum, total = flats[0][-2:].tolist()
        for bucket, flat in zip(buckets, flats, strict=True):
            flat = flat[:sum(p.numel() for p in bucket)].div_(total)
            for p, g in zip(bucket, flat.split([p.numel() for p in bucket]), strict=True):
                p.grad.copy_(g.view_as(p.grad))
        return loss_sum / total, int(total)

    def broadcast_object(self, obj, what: str = "sharing rank 0's state"):
        """Rank 0's ``obj`` on every rank (pickled)."""
        if not self.active:
            return obj
        box = [obj if self.is_main else None]
        self._collective(what, dist.broadcast_object_list, box, src=0)
        return box[0]

    @torch.no_grad()
    def project_(self, model: nn.Module) -> list[int]:
        """``models.orthogonal.project_`` split over ranks: rank r projects the projected layers
        r, r + W, ... and sends them to the others, so every replica holds the same orthogonal
        weights and each rank does 1/W of the (batch-independent) projection work. Returns the Björck
        iterations this rank ran per group."""
        entries = projected_weights(model)
        if not self.active:
            return project_weights_(entries)
        iterations = project_weights_(entries[self.rank::self.world_size])
        # one broadcast per owner (and dtype/device), not one per layer
        self._in_buckets("sharing projected weights", [
            ([w for w, _ in entries[owner::self.world_size]],
             lambda flat, owner=owner: dist.broadcast(flat, src=owner, async_op=True))
            for owner in range(self.world_size)])
        return iterations

    @torch.no_grad()
    def broadcast_module(self, module: nn.Module) -> None:
        """Copy rank 0's parameters and buffers into every rank's module, in place."""
        if not self.active:
            return
        self._in_buckets("sharing rank 0's weights", [
            ([*module.parameters(), *module.buffers()], lambda flat: dist.broadcast(flat, src=0, async_op=True))])

    @torch.no_grad()
    def average_running_stats(self, module: nn.Module) -> None:
        """Average BatchNorm running means and variances over ranks (each rank saw its shard)."""
        if not self.active:
            return
        stats = [t for m in module.modules() if isinstance(m, nn.modules.batchnorm._NormBase)
                 and m.track_running_stats for t in (m.running_mean, m.running_var)]
        self._in_buckets("averaging BatchNorm statistics", [(stats, lambda flat: dist.all_reduce(flat, async_op=True))])
        for t in stats:
            t.div_(self.world_size)

    @torch.no_grad()
    def check_in_sync(self, module: nn.Module) -> None:
        """Raise ``DistributedError`` unless every rank holds bit-identical parameters.

        Compares two float64 fingerprints (sum and a position-weighted sum of
        every parameter) across ranks: after identical averaged gradients,
        optimizer steps and orthogonality projections they must agree exactly.
        """
        if not self.active:
            return
        fp = torch.zeros(2, dtype=torch.float64)
        for i, p in enumerate(module.parameters()):
            q = p.detach().double().reshape(-1)
            position = torch.arange(1, q.numel() + 1, device=q.device, dtype=torch.float64)
            fp += torch.stack([q.sum(), (q * position).sum() * (i + 1)]).cpu()
        fp = fp.to(self._device())
        every = [torch.empty_like(fp) for _ in range(self.world_size)]
        self._collective("comparing weights across ranks", dist.all_gather, every, fp)
        if any(not torch.equal(every[0], f) for f in every[1:]):
            raise DistributedError(f"rank {self.rank} of {self.world_size}: the ranks' weights differ; "
                                   "the replicas went out of sync")

    def _in_buckets(self, what: str, jobs) -> None:
        """For each ``(tensors, start)`` of ``jobs``: flatten the tensors in buckets, run the
        collective ``start(flat)`` (async) on each, then copy the results back in place."""
        pending = []
        for tensors, start in jobs:
            for bucket in _buckets(tensors):
                flat = torch.cat([t.reshape(-1) for t in bucket])
                pending.append((bucket, flat, self._collective(what, start, flat)))
        for bucket, flat, work in pending:
            self._collective(what, work.wait)
            for t, new in zip(bucket, flat.split([t.numel() for t in bucket]), strict=True):
                t.copy_(new.view_as(t))

    def barrier(self) -> None:
        if self.active:
            self._collective("waiting for the other ranks", dist.barrier)

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 runs the block first (a download, a cache fill), then the others."""
        if self.active and not self.is_main:
            self.barrier()
        yield
        if self.active and self.is_main:
            self.barrier()

    def _device(self):
        """Where small collective tensors live: the GPU for NCCL, the CPU for gloo."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")


def _buckets(params: list[torch.Tensor], limit: int = BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Consecutive tensors of one device and dtype, about ``limit`` bytes per bucket."""
    buckets, current, size, key = [], [], 0, None
    for p in params:
        nbytes = p.numel() * p.element_size()
        if current and ((p.device, p.dtype) != key or size + nbytes > limit):
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
        key = (p.device, p.dtype)
    if current:
        buckets.append(current)
    return buckets


def check_device(text: str) -> None:
    """Raise ``ConfigError`` unless ``text`` names a device this torch can use."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{spell('device')} {text!r} is not a torch device (cpu, cuda, cuda:N, mps)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU build of torch" if torch.version.cuda is None else "torch finds no CUDA device"
            raise ConfigError(f"{spell('device')} {text}: CUDA is not available ({build})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{spell('device')} {text}: only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{spell('device')} {text}: MPS is not available")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{spell('device')} {text}: only cpu, cuda and mps devices are supported")
