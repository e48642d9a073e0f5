"""Step-time and peak-memory benchmarks, reported as ratios against backprop: one module per group of
suites over one timing core (``timing``).

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
  with Björck projection, and with the Cayley retraction (``models.orthogonal.retraction``),
  against the same step with no upkeep, per (depth, width, batch).
* ``upkeep-optimizers``, ``upkeep-error``: keeping orthogonal layers orthogonal under
  momentum SGD, Adam and AdamW (``trainers.bench.upkeep``): each candidate's step
  against the plain step, and the error it keeps over training on digits.
* ``user``: every engine on user-style models (an nn.GRU LM wrapped by
  ``models.wrap_recurrent``, an nn.Sequential MLP by ``models.layer_stack``)
  and on the zoo model of the same sizes: what wrapping costs.

Times are medians over all timed steps after warm-up; each timed
configuration prints one line on stderr (``[bench engines] backprop depth 8
width 256: 23.1 ms median (3/12)``), so a long run shows progress in a log
file. Peak memory: on CUDA,
``max_memory_allocated`` during a call above what was allocated before it;
on the CPU, the peak of live tensor bytes over the call above what was held
before it, from the torch profiler's allocation records (each allocation
and free, in time order).
Reported for the whole step (with optimizer and orthogonality upkeep) and for
``compute_grads`` alone with the old grads freed (``grads_peak_mb``, which
includes the ``grad_bytes_mb`` of the gradients it writes: activations are
the rest, and dominate when the batch is large against the width).
"""

from gradengines.trainers.bench.engines import bare_forward_only, bench_engines, bench_grads, bench_upkeep
from gradengines.trainers.bench.overhead import bench_overhead
from gradengines.trainers.bench.sequences import bench_recurrent, bench_residual, bench_scan
from gradengines.trainers.bench.timing import (
    engine_from_spec,
    machine_description,
    markdown_table,
    peak_step_memory_mb,
    time_round_robin,
    write_results,
)
from gradengines.trainers.bench.upkeep import OPTIMIZERS, bench_upkeep_optimizers, orthogonality_over_steps
from gradengines.trainers.bench.user import bench_user

__all__ = ["bench_overhead", "bench_engines", "bench_grads", "bench_upkeep", "bare_forward_only", "bench_recurrent",
           "bench_residual", "bench_scan", "bench_user", "OPTIMIZERS", "bench_upkeep_optimizers",
           "orthogonality_over_steps", "engine_from_spec", "machine_description", "markdown_table",
           "peak_step_memory_mb", "time_round_robin", "write_results"]
