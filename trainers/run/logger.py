"""One TensorBoard run per (experiment, trainer, seed), plus ``metrics.jsonl``.

Layout: ``<logdir>/<experiment>/<trainer>/seed<k>/`` holding the event files,
``metrics.jsonl`` (one JSON object per logged step: ``{"step": s, "samples": n,
"epoch": e, tag: value}``, plus ``"compute_ms"`` in a comparison) and the checkpoints.

TensorBoard's step axis is the optimizer step, or with ``axis="samples"`` (a
comparison's default) the training samples seen, so runs with different batch
sizes overlay. With a timed step (``compute_ms`` given), the training loss and the
validation scalars are also written under ``vs_compute_ms/`` at step = the run's
compute time in milliseconds (steps x its timed median step,
``trainers.experiments.step_timing``): the same curves against compute time. Every run uses the
same tag names so TensorBoard overlays engines on one chart; ``add_scalars`` is never used (it makes
sub-runs). A run writes its own HParams session in its directory; the
experiment's HParams configuration is written once per experiment folder
(``trainers.run.hparams.write_experiment_config``).
"""

import json
import math
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from gradengines.trainers.core.errors import DataError
from gradengines.trainers.run.checkpoint import write_text_atomic
from gradengines.trainers.run.hparams import METRIC_PREFIX, session_summaries

__all__ = ["RunLogger", "read_metrics"]


def read_metrics(run_dir) -> list[dict]:
    """The records of ``metrics.jsonl`` in ``run_dir``.

    A torn last line (the process died, or the disk filled, mid-write) is dropped;
    a damaged line before it raises ``DataError``.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    if not path.is_file():
        raise DataError(f"{path} is not a file (a directory or a device); move it away to continue this run")
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise DataError(f"{path} line {number} is damaged (not JSON): {line[:60]!r}") from None
    return records


def _json_value(v: float):
    return v if math.isfinite(v) else str(v)


NOT_CURVES = ("eval/samples",)  # logged beside the evaluations, but a count, not a curve against compute time


class RunLogger:
    """Scalars to TensorBoard and ``metrics.jsonl``; the HParams session at the end.

    ``resume_step``: continue a run whose checkpoint is at that step; records
    logged after it by the interrupted run (and a test record) are dropped from
    ``metrics.jsonl`` and purged from TensorBoard, so the resumed run reads as one.
    ``purge_after``: that step in TensorBoard's axis units (samples seen, with ``axis="samples"``).
    """

    COMPUTE_PREFIX = "vs_compute_ms/"

    def __init__(self, run_dir, *, resume_step: int | None = None, axis: str = "step",
                 purge_after: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.run_dir / "metrics.jsonl"
        if resume_step is None:
            self.jsonl.unlink(missing_ok=True)
        else:
            self._truncate_after(resume_step)
        self.axis = axis
        if resume_step is not None and purge_after is None:
            purge_after = resume_step
        purge = purge_after + 1 if resume_step is not None and purge_after is not None else None
        self.writer = SummaryWriter(log_dir=str(self.run_dir), purge_step=purge)
        self._file = open(self.jsonl, "a")

    def _truncate_after(self, step: int) -> None:
        """Keep the records up to ``step``, less any test record (the test is logged once, at the end)."""
        kept = [r for r in read_metrics(self.run_dir)
                if r["step"] <= step and not any(k.startswith("test/") for k in r)]
        write_text_atomic(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, step: int, scalars: dict[str, float], *, samples: int | None = None, epoch: float | None = None,
            compute_ms: float | None = None) -> None:
        """Write ``scalars`` (tag -> float) of optimizer ``step`` to both sinks, at ``samples`` seen (``epoch``)."""
        x = samples if self.axis == "samples" and samples is not None else step
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, x)
            if compute_ms is not None and (tag == "train/loss" or tag.startswith("eval/")) and tag not in NOT_CURVES:
                self.writer.add_scalar(self.COMPUTE_PREFIX + tag, value, round(compute_ms))
        where = {"step": step, **({} if samples is None else {"samples": samples, "epoch": epoch}),
                 **({} if compute_ms is None else {"compute_ms": compute_ms})}
        self._file.write(json.dumps({**where, **{k: _json_value(v) for k, v in scalars.items()}}) + "\n")

    def flush(self) -> None:
        """Flush both sinks; a failed write (a full disk) raises ``OSError`` naming the file."""
        for sink, path in ((self._file, self.jsonl), (self.writer, self.writer.file_writer.get_logdir())):
            try:
                sink.flush()
            except OSError as err:
                if err.filename is None:
                    raise OSError(err.errno, err.strerror, str(path)) from None
                raise

    def log_hparams(self, step: int, hparams: dict, metrics: dict[str, float]) -> None:
        """This run's HParams session: its ``hparams`` values, a successful end, and ``metrics``
        as scalars ``hparam/<key>`` at ``step``; no experiment configuration (see the module docstring)."""
        for summary in session_summaries(hparams):
            self.writer.file_writer.add_summary(summary)
        for key, value in metrics.items():
            self.writer.add_scalar(METRIC_PREFIX + key, value, step)

    def close(self, quiet: bool = False) -> None:
        """Flush and close both sinks; ``quiet``: ignore write errors (closing after a failure)."""
        try:
            self.flush()
            self._file.close()
            self.writer.close()
        except OSError:
            if not quiet:
                raise
