"""Suites on depth made of time or of residual blocks: ``recurrent`` (each trainer's step on ``rnn_lm`` against
BPTT through the fused cell, and ``bptt_loop``, BPTT through the cell stepped in Python), ``residual``
(Highway-BP on a deep ``residual_mlp``), ``scan`` (the reverse scan in every form against the DSF authors'
loop)."""

import functools
import statistics
import time

import torch
import torch.nn.functional as F

from gradengines import models
from gradengines.models.layers.scan import METHODS as SCAN_METHODS
from gradengines.models.layers.scan import reverse_scan
from gradengines.trainers.bench.timing import SuiteProgress, backprop_first, classification_batch, sync, time_trainers

__all__ = ["bench_recurrent", "bench_residual", "bench_scan"]




def bench_recurrent(*, trainers, cell, depths, hidden, lengths, batch_size, vocab, steps, warmup, device,
                    loop_max_length=1024) -> list[dict]:
    """Step time (compute_grads + Adam) and peak memory of each trainer on ``rnn_lm`` with token inputs.

    ``bptt_loop`` in ``trainers`` adds the Python-loop BPTT baseline (only for lengths up to
    ``loop_max_length``: its cost grows with T kernel launches per layer).
    """
    from gradengines.tasks.base import sequence_cross_entropy

    rows = []
    runnable = {T: [t for t in trainers if t != "bptt_loop" or T <= loop_max_length] for T in lengths}
    progress = SuiteProgress("recurrent", len(depths) * sum(len(backprop_first(n)) for n in runnable.values()))
    for depth in depths:
        for T in lengths:
            gen = torch.Generator().manual_seed(0)
            x = torch.randint(0, vocab, (batch_size, T), generator=gen).to(device)
            y = torch.randint(0, vocab, (batch_size, T), generator=gen).to(device)

            build = functools.partial(models.build, "rnn_lm", in_features=T, out_features=vocab, cell=cell,
                                      hidden=hidden, depth=depth)

            for row in time_trainers(runnable[T], build, x, y, sequence_cross_entropy, device, steps, warmup,
                                      progress, f"{cell} depth {depth} T {T}"):
                rows.append({"suite": "recurrent", "trainer": row.pop("trainer"), "cell": cell, "depth": depth,
                             "hidden": hidden, "T": T, "batch_size": batch_size, **row})
    return rows


def bench_residual(*, trainers, depth, width, batch_size, steps, warmup, device) -> list[dict]:
    """Step time (compute_grads + Adam) and peak memory of each trainer on a ``residual_mlp``
    of ``depth`` blocks (width and branch width ``width``, 10 classes), against backprop."""
    x, y = classification_batch(batch_size, width, device)

    def build():
        return models.build("residual_mlp", in_features=width, out_features=10, depth=depth, width=width)

    return [{"suite": "residual", "trainer": row.pop("trainer"), "depth": depth, "width": width,
             "batch_size": batch_size, **row}
            for row in time_trainers(trainers, build, x, y, F.cross_entropy, device, steps, warmup,
                                      SuiteProgress("residual", len(backprop_first(trainers))),
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
    progress = SuiteProgress("scan", len(lengths) * len(forms))
    for T in lengths:
        e = torch.randn(T, batch_size, width, device=device)
        times = {}
        for name, fn in forms.items():
            fn(e)
            samples = []
            for _ in range(repeats):
                sync(device)
                t0 = time.perf_counter()
                fn(e)
                sync(device)
                samples.append(time.perf_counter() - t0)
            times[name] = 1e3 * statistics.median(samples)
            progress(f"{name} T {T}", times[name])
        for name, ms in times.items():
            rows.append({"suite": "scan", "form": name, "T": T, "batch_size": batch_size, "width": width,
                         "ms": ms, "ratio_to_authors_loop": ms / times["authors_dense_loop"]})
    return rows

