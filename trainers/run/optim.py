"""Optimizers and learning-rate schedules from a ``TrainConfig``."""

import math

import torch

from gradengines.trainers.run.config import TrainConfig

__all__ = ["build_optimizer", "build_scheduler", "restore_optimizer", "WarmupCosine", "StepDecay"]


def build_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD (momentum, Nesterov), Adam or AdamW with weight decay over ``params``."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               nesterov=cfg.nesterov and cfg.momentum > 0, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


class WarmupCosine:
    """lr factor: t / warmup for t < warmup, then 0.5 (1 + cos(pi (t - warmup) / (total - warmup)))."""

    def __init__(self, warmup: int, total: int):
        self.warmup, self.total = warmup, max(total, warmup + 1)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / (self.total - self.warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))


class StepDecay:
    """lr factor: gamma ** (step // step_size)."""

    def __init__(self, step_size: int, gamma: float):
        self.step_size, self.gamma = step_size, gamma

    def __call__(self, step: int) -> float:
        return self.gamma ** (step // self.step_size)


def build_scheduler(optimizer, cfg: TrainConfig, total_steps: int):
    """A per-step ``LambdaLR`` (step decay, or warmup + cosine); None for a constant rate."""
    if cfg.schedule == "cosine":
        factor = WarmupCosine(cfg.warmup_steps, total_steps)
    elif cfg.schedule == "step":
        factor = StepDecay(cfg.step_size, cfg.gamma)
    else:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def restore_optimizer(optimizer, scheduler, optimizer_state: dict, scheduler_state: dict | None) -> None:
    """Load a checkpoint's optimizer state (moments, step counts) and scheduler position, keeping the
    hyperparameters ``optimizer`` and ``scheduler`` were built with (learning rate, momentum, weight decay,
    schedule), so a resume may change them; with unchanged ones the rates equal the checkpoint's exactly."""
    mine = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(optimizer_state)
    for group, options in zip(optimizer.param_groups, mine, strict=True):
        group.update(options)
    if scheduler is None:
        return
    scheduler.load_state_dict({**scheduler_state, "lr_lambdas": [None] * len(scheduler.lr_lambdas),
                               "base_lrs": list(scheduler.base_lrs)})
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(scheduler.last_epoch)  # LambdaLR's own rule
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
