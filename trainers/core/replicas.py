"""Models wrapped for data parallelism: the engines' gradients averaged over the replicas exactly once.

``DistributedDataParallel`` all-reduces the gradients that ``loss.backward()`` accumulates after a forward through
it (its autograd hooks). An engine writes ``.grad`` itself, so those hooks never run: each rank would keep its own
shard's gradient (PyTorch issues #47562, #63740). ``GradientEngine.compute_grads`` therefore trains the wrapped
module (``unwrap``) and then replaces each gradient by its plain mean over the wrapper's process group
(``average_over_replicas``), as DDP does: whoever wrapped the model (the user, the Hugging Face Trainer, Lightning),
the gradients are averaged once. Where the wrapper broadcasts rank 0's buffers at each forward
(``broadcast_buffers``, its default), they are broadcast before the engine runs. ``nn.DataParallel`` (one process,
replicas per GPU) is unwrapped: the engine runs the module on its device. Sharded models (FSDP, ``fully_shard``,
tensor parallelism: parameters that are DTensors) are refused in one line: a rank's parameters are not the model's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradengines.trainers.core.errors import IncompatibleModelError

__all__ = ["unwrap", "average_over_replicas", "sync_buffers"]


def _sharded(model: nn.Module) -> str | None:
    """How ``model`` is sharded, or None."""
    if not dist.is_available():
        return None
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return "wrapped in FullyShardedDataParallel"
    if any(isinstance(p, DTensor) for p in model.parameters()):
        return "sharded (its parameters are DTensors: fully_shard or tensor parallelism)"
    return None


def unwrap(model: nn.Module) -> tuple[nn.Module, DistributedDataParallel | None]:
    """``(the module an engine trains, the DDP wrapper whose replicas it averages over, or None)``; a sharded model
    raises ``IncompatibleModelError`` (one line)."""
    replicas = None
    while isinstance(model, (DistributedDataParallel, nn.DataParallel)):
        if isinstance(model, DistributedDataParallel):
            replicas = model
        model = model.module
    sharded = _sharded(model)
    if sharded is not None:
        raise IncompatibleModelError(
            f"{type(model).__name__} is {sharded}: the gradient engines train whole replicas (a model as it is, or "
            f"wrapped in DistributedDataParallel), not shards; sharded training is not supported yet")
    return model, replicas


def _group_size(replicas: DistributedDataParallel) -> int:
    return dist.get_world_size(replicas.process_group)


def sync_buffers(replicas: DistributedDataParallel) -> None:
    """Rank 0's buffers (BatchNorm statistics) on every replica, where the wrapper broadcasts them at each forward."""
    if not replicas.broadcast_buffers or _group_size(replicas) == 1:
        return
    group = replicas.process_group
    for buffer in replicas.module.buffers():
        dist.broadcast(buffer, src=dist.get_global_rank(group, 0), group=group)


def average_over_replicas(replicas: DistributedDataParallel, params: list[nn.Parameter]) -> None:
    """Every ``p.grad`` replaced by its mean over the replicas of ``replicas``'s process group (DDP's average), in
    one all-reduce of the concatenated gradients per dtype and device."""
    size = _group_size(replicas)
    if size == 1:
        return
    groups: dict[tuple, list[nn.Parameter]] = {}
    for p in params:
        if p.grad is None:  # the engine contract; a mismatch across ranks would hang the all-reduce
            raise RuntimeError("the engine left .grad unset for a trainable parameter")
        groups.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for bucket in groups.values():
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        dist.all_reduce(flat, group=replicas.process_group)
        flat.div_(size)
        for p, g in zip(bucket, flat.split([p.numel() for p in bucket]), strict=True):
            p.grad.copy_(g.view_as(p.grad))
