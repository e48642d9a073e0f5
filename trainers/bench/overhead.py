"""Suite ``overhead``: the Trainer with the backprop engine against a plain hand-written PyTorch loop
(zero_grad, forward, backward, step, loss.item()) on the same MLP and batches; rounds alternate."""

import copy
import statistics
import time

import torch
import torch.nn.functional as F

from gradengines import models, tasks
from gradengines.trainers.bench.timing import batch_stream, progress_line, sync
from gradengines.trainers.engines.backprop import Backprop
from gradengines.trainers.run.trainer import Trainer

__all__ = ["bench_overhead"]


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
    batches = batch_stream(task.train.inputs, task.train.targets, batch_size)

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
            sync(device)
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
    progress_line("overhead", f"mlp depth {depth} width {width} in {in_features}: trainer {1e3 * t_trainer:.4g} ms, "
                      f"plain loop {1e3 * t_plain:.4g} ms median")
    return {"suite": "overhead", "model": f"mlp depth {depth} width {width} in {in_features}",
            "batch_size": batch_size, "steps_timed": len(trainer_times),
            "trainer_ms": 1e3 * t_trainer, "plain_loop_ms": 1e3 * t_plain, "ratio": t_trainer / t_plain}

