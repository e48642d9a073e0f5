"""Run under torchrun with 2 ranks by tests/test_distributed.py: the DataParallel collectives, then the commands
given as a JSON list of argument lists (``["train", ...]``: what ``gradengines train ...`` and scripts/train.py run),
one after the other in the process group joined here.

Exits 0 and prints "ok" on rank 0 when every check holds and every command exited 0; an assertion stops it otherwise.
"""

import copy
import json
import sys

import torch
from torch import nn

from gradengines.trainers.core.distributed import DataParallel, exit_process, init_distributed, mean_over_ranks
from gradengines.trainers.core.errors import DistributedError

here = init_distributed("gloo", timeout_s=30)
assert here.active and here.world_size == 2, here
torch.manual_seed(0)  # one model on both ranks
model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
params = list(model.parameters())

# a shard of rank r is rows r, r + 2, ...; the two shards cover the batch once
rows = torch.arange(7)
assert here.shard(rows).tolist() == list(range(here.rank, 7, 2))

# gradients: the sample-weighted mean, sum_r n_r g_r / sum_r n_r, and the global mean loss
counts, losses = [4, 3], [1.5, 0.25]
grads = [[torch.full_like(p, float(r + 1)) * (i + 1) for i, p in enumerate(params)] for r in range(2)]
for p, g in zip(params, grads[here.rank], strict=True):
    p.grad = g.clone()
loss, total = here.average_gradients(params, counts[here.rank], losses[here.rank])
assert total == 7 and abs(loss - (4 * 1.5 + 3 * 0.25) / 7) < 1e-15, (loss, total)
for i, p in enumerate(params):
    expected = (4 * grads[0][i] + 3 * grads[1][i]) / 7
    torch.testing.assert_close(p.grad, expected, rtol=1e-15, atol=0)

# an engine statistic over the global batch (DSF's gate mean)
value = torch.tensor([1.0, 2.0], dtype=torch.float64) * (here.rank + 1)
torch.testing.assert_close(mean_over_ranks(value, counts[here.rank]),
                           torch.tensor([10 / 7, 20 / 7], dtype=torch.float64))

# sums of metrics; rank 0's object and weights everywhere
assert here.sums([here.rank + 1.0, 2.0]) == [3.0, 4.0]
assert here.broadcast_object({"rank": here.rank}) == {"rank": 0}
if here.rank == 1:
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
here.broadcast_module(model)
torch.manual_seed(0)
reference = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True))

# BatchNorm running statistics: the mean over ranks
bn = model[1]
bn.running_mean.fill_(2.0 * here.rank)
here.average_running_stats(model)
assert torch.equal(bn.running_mean, torch.ones(4, dtype=torch.float64))

# replicas in sync pass; one changed weight on one rank fails on every rank
here.check_in_sync(model)
if here.rank == 1:
    with torch.no_grad():
        params[0][0, 0] += 1e-12
try:
    here.check_in_sync(model)
except DistributedError as err:
    assert "out of sync" in str(err)
else:
    raise AssertionError("check_in_sync missed a weight that differs on one rank")

# the Trainer: each rank trains on its half of the global batch and evaluates its half of a split
from gradengines import tasks, trainers  # noqa: E402

task = tasks.build("teacher", n_train=40, n_val=9, n_test=9, in_features=4, num_classes=3)
net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
trainer = trainers.Trainer(net, trainers.build_engine("backprop"), task, batch_size=4, dtype="float64",
                           progress=False)
assert trainer.global_batch == 8 and trainer.steps_per_epoch() == 5
x, _ = trainer._batch(0)
assert len(x) == 4
mine = {tuple(row.tolist()) for row in x}
theirs = here.broadcast_object(mine) if here.rank == 0 else here.broadcast_object(None)
assert here.is_main or not mine & theirs, "both ranks got the same rows"
with torch.no_grad():  # the whole split on this rank alone, against the sharded, reduced evaluation
    out = net(task.val.inputs.double())
    whole = task.loss_fn(out, task.val.targets).item()
assert abs(trainer.evaluate("val")["loss"] - whole) < 1e-12

# ranks draw different random numbers (dropout masks) once training runs; rank 0 the single-process stream
trainer.fit(steps=2)
draw = torch.rand(4)
assert here.is_main or not torch.equal(draw, here.broadcast_object(None)), "ranks share dropout masks"
if here.is_main:
    here.broadcast_object(draw)

# the orthogonality projection split over ranks: each rank projects half, all end with the same weights
from gradengines import models  # noqa: E402
from gradengines.models.orthogonal import project_  # noqa: E402

torch.manual_seed(1)
ortho = models.build("mlp", in_features=6, out_features=6, depth=5, width=6, orthogonal="bjorck").double()
with torch.no_grad():
    for p in ortho.parameters():
        p.add_(0.01 * torch.randn_like(p))  # the same step on both ranks, off the orthogonal set
reference = copy.deepcopy(ortho)
project_(reference)
here.project_(ortho)
for a, b in zip(ortho.parameters(), reference.parameters(), strict=True):
    torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
here.check_in_sync(ortho)

# Highway-BP's adaptive stop measures ||d|| / ||w|| over the global batch: every rank stops where
# one process on the concatenated batch would, although each shard alone would stop elsewhere
from gradengines.trainers.engines.highway import highway_iterations  # noqa: E402

sizes, decay = [4, 2], [0.05, 0.9]  # rank 0's paths fade at once, rank 1's slowly
torch.manual_seed(2)
e_all = [torch.randn(6, n, 3, dtype=torch.float64) for n in sizes]
carry = torch.full((6, 1, 1), 0.5, dtype=torch.float64)


def back_for(c):
    return lambda w: torch.cat([w[1:], torch.zeros_like(w[:1])]) * c


def stop(e, c, tol=0.1, k=5):
    """The iteration at which ||d^m|| <= tol ||w^m||, from fixed-k runs (no collectives: tol = 0)."""
    ws = [highway_iterations(e, carry, back_for(c), k=m)[0] for m in range(k + 1)]
    return next((m for m in range(1, k + 1) if (ws[m] - ws[m - 1]).norm() <= tol * ws[m].norm()), k)


scale = torch.cat([torch.full((n, 1), n / sum(sizes), dtype=torch.float64) for n in sizes])
c_all = torch.cat([torch.full((n, 1), d, dtype=torch.float64) for n, d in zip(sizes, decay, strict=True)])
together = stop(torch.cat(e_all, dim=1) * scale, c_all)
alone = [stop(e, torch.tensor(d, dtype=torch.float64)) for e, d in zip(e_all, decay, strict=True)]
assert together != alone[0] or together != alone[1], (together, alone)  # the check below can fail
_, used, _ = highway_iterations(e_all[here.rank], carry, back_for(torch.tensor(decay[here.rank], dtype=torch.float64)),
                                k=5, tol=0.1, samples=sizes[here.rank])
assert used == together, (here.rank, used, together, alone)

here.barrier()
assert DataParallel().world_size == 2

# the commands, each as a script runs it (a launched process joins the group once: they share it)
from gradengines.trainers.cli import main  # noqa: E402

for command in json.loads(sys.argv[1]) if len(sys.argv) > 1 else []:
    code = main(command)
    assert code == 0, f"rank {here.rank}: exit code {code} from {' '.join(command)}"
if here.is_main:
    print("ok")
exit_process(0)  # closes the group; no interpreter finalization racing gloo's threads
