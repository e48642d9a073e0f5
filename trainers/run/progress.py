"""Training progress: a tqdm bar on a terminal, plain lines everywhere else.

When stderr is not a terminal (a log file, a pipe, CI) a bar shows nothing,
so ``Progress`` prints one line every ``every`` seconds instead:

    [backprop seed 0] step 120/3290 (3.6%)  loss 5.4321  2.41 steps/s  elapsed 0:00:50  left 0:21:54

plus a line per evaluation (periodic ones at most every ``every`` seconds, and the
last one) and a final line. The rate is the mean of this
process once its first step is done (that step's warm-up excluded).

An evaluation speaks while it runs too (``evaluating``): a second bar on a terminal, and elsewhere a line
every ``every`` seconds once it has run that long (a short one says nothing more than its result line):

    [backprop seed 0] eval test (best model, step 100): batch 12/40  elapsed 0:00:31  left 0:01:12
"""

import datetime
import math
import sys
import time
from contextlib import contextmanager

from tqdm.auto import tqdm

__all__ = ["Progress", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """``1314.2`` -> ``"0:21:54"``."""
    return str(datetime.timedelta(seconds=round(seconds)))


class Progress:
    """Report training steps and evaluations of one run (module docstring).

    Args:
        name: prefix of every line, e.g. ``"backprop seed 0"``.
        total: the step the run ends at.
        initial: the step this process starts from (a resumed run's checkpoint).
        every: seconds between plain lines.
        enabled: False prints nothing (``--progress false``, ranks other than 0).
        stream: where to write (default: ``sys.stderr`` now); a terminal gets the bar.
        clock: seconds, monotonic (tests pass a fake one).
        unit: what is counted ("step"; the comparison's timing counts "round"s and has no loss).
    """

    def __init__(self, name: str, total: int, *, initial: int = 0, every: float = 10.0, enabled: bool = True,
                 stream=None, clock=time.monotonic, unit: str = "step"):
        self.name, self.total, self.every, self.clock, self.unit = name, total, every, clock, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.step, self.loss = initial, math.nan
        self._initial = initial
        self._start = self._printed = self._eval_printed = clock()
        self._first = None  # (time, step) after this process's first step
        tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=name, leave=False, file=self.stream) if tty else None

    @property
    def plain(self) -> bool:
        """True when progress goes out as plain lines (enabled, and not a terminal)."""
        return self.enabled and self.bar is None

    def update(self, step: int, loss: float = math.nan) -> None:
        """Step ``step`` is done with training loss ``loss`` (nan: none shown); prints a line when ``every``
        seconds have passed."""
        self.step, self.loss = step, loss
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if not math.isnan(loss):  # nothing measured (the comparison's timing rounds): no placeholder
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if not self.plain:
            return
        now = self.clock()
        if self._first is None:
            self._first = (now, step)
        if now - self._printed >= self.every:
            rate = self._rate(now)
            left = f"  left {format_seconds((self.total - step) / rate)}" if rate else ""
            self._print(self._status(now) + left)
            self._printed = now

    def evaluated(self, split: str, metric: str, value: float, *, samples: int, of: int, batch_size: int,
                  model: str | None = None) -> None:
        """An evaluation of ``samples`` of the ``of`` rows of ``split`` (in batches of ``batch_size``) is done;
        ``model`` says which model, e.g. ``"last model"`` (None: a periodic evaluation, shown when ``every``
        seconds have passed since the last one shown, or at the last step)."""
        if not self.plain:
            return
        now = self.clock()
        if model is None and self.step < self.total and now - self._eval_printed < self.every:
            return
        self._eval_printed = now
        batches = math.ceil(samples / batch_size)
        used = f"all {of}" if samples >= of else f"{batches} batch{'es' if batches > 1 else ''} of {batch_size} of {of}"
        which = f" ({model})" if model else ""
        self._print(f"step {self.step}/{self.total}  eval {split}{which} {metric} {value:.4g} ({used})")

    @contextmanager
    def evaluating(self, split: str, model: str | None = None):
        """While an evaluation of ``split`` runs (``model``: e.g. ``"last model"``), yields its ``on_batch(done,
        batches)`` callback: a bar on a terminal, a line every ``every`` seconds elsewhere (module docstring)."""
        name = f"eval {split}" + (f" ({model})" if model else "")
        start = printed = self.clock()
        bar = None

        def on_batch(done: int, batches: int) -> None:
            nonlocal bar, printed
            if not self.enabled:
                return
            if self.bar is not None:
                if bar is None:
                    bar = tqdm(total=batches, desc=f"{self.name} {name}", leave=False, file=self.stream, unit="batch")
                bar.update(done - bar.n)
                return
            now = self.clock()
            if now - printed >= self.every and done < batches:
                left = (batches - done) * (now - start) / done
                self._print(f"{name}: batch {done}/{batches}  elapsed {format_seconds(now - start)}  "
                            f"left {format_seconds(left)}")
                printed = now

        try:
            yield on_batch
        finally:
            if bar is not None:
                bar.close()

    def close(self) -> None:
        """Close the bar, or print the final line."""
        if self.bar is not None:
            self.bar.close()
        elif self.plain:
            self._print(self._status(self.clock()) + ("  done" if self.step >= self.total else "  stopped"))

    def _rate(self, now: float) -> float | None:
        """Steps per second of this process, after its first step once there is a second."""
        t0, s0 = self._first if self._first and self.step > self._first[1] else (self._start, self._initial)
        return (self.step - s0) / (now - t0) if now > t0 and self.step > s0 else None

    def _status(self, now: float) -> str:
        rate = self._rate(now)
        shown = "?" if rate is None else f"{rate:.3g}" if rate < 100 else f"{rate:.0f}"
        loss = "" if math.isnan(self.loss) else f"  loss {self.loss:.4f}"
        return (f"{self.unit} {self.step}/{self.total} ({100 * self.step / self.total:.1f}%){loss}  "
                f"{shown} {self.unit}s/s  elapsed {format_seconds(now - self._start)}")

    def _print(self, text: str) -> None:
        print(f"[{self.name}] {text}", file=self.stream, flush=True)
