"""CPU threads per process, chosen to share the machine (issue 22; BENCHMARKS.md "Threads on a busy machine").

PyTorch starts one intra-op thread per core of the machine (``torch.get_num_threads()``
reports that count whatever else is running, and it ignores a container's CPU quota),
and its OpenMP threads wait for each other by spinning. Beside one other busy process
on 2 cores, the default comparison took 3.8x its idle time on this machine (16x on
another): at every parallel region one thread spins, waiting for a partner that waits
for the core the other process holds. Measured on 2 cores (BENCHMARKS.md):

* one thread: idle as fast as two on the default comparison and the test suite (their
  tensors are small; a width-64 MLP step is even faster), 1.05x idle beside a busy
  process; 1.7x slower idle on width-1024 GEMMs;
* two threads with passive waiting (``OMP_WAIT_POLICY=PASSIVE``): 1.3x beside a busy
  process, but every parallel region then wakes a sleeping thread: 1.25x slower idle on
  the default comparison, 4x on a width-64 step. Not used.

So the rule, ``auto`` (the default of ``train``, ``compare`` and ``bench``): as many
threads as there are cores this process may use (its CPU affinity and a cgroup CPU
quota; shared by the ranks of a ``torchrun`` job on this machine) that no other process
keeps busy, measured from ``/proc/stat`` at start (``os.getloadavg`` where there is no
``/proc``); at least one. So that an idle machine gets the same answer every time, the
load is the smaller of two 0.1 s probes (a brief spike lands in one of them; a busy
process is in both) and a core counts as busy from ``BUSY_CORE`` (0.75) of a core on.
A machine idle at start and loaded later keeps its count: say ``--threads 1`` there.
An explicit count wins: ``--threads N``, else ``GRADENGINES_THREADS=N``, else
``OMP_NUM_THREADS=N`` (which torch itself reads).
The test suite runs with one thread per process (``tests/conftest.py``).

The Python API chooses as the command line does (``threads_for_api``): the first
``Trainer``, engine step (``compute_grads``) or ``gradient_agreement`` of a process
applies the same choice, unless the process already chose with
``gradengines.set_threads(N)``, and says once on stderr what it chose when ``auto``
decided. ``GRADENGINES_THREADS`` and ``OMP_NUM_THREADS`` count as the user's choice;
a call of ``torch.set_num_threads`` does not (torch cannot tell it from its own
default): call ``gradengines.set_threads(N)`` instead.
"""

from __future__ import annotations

import os
import sys
import time
from typing import NamedTuple

import torch

from gradengines.trainers.core.errors import ConfigError

__all__ = ["THREADS_ENV", "ThreadChoice", "parse_threads", "thread_limit", "usable_cores", "busy_cores_elsewhere",
           "choose_threads", "auto_choice", "set_threads", "last_choice", "threads_for_api"]

THREADS_ENV = "GRADENGINES_THREADS"
PROBE_SECONDS = 0.1
PROBES = 2
BUSY_CORE = 0.75  # load elsewhere from which a core counts as taken


class ThreadChoice(NamedTuple):
    """The intra-op thread count a process uses and why (recorded by ``bench``)."""

    count: int
    reason: str


_CHOSEN: list[ThreadChoice] = []  # the last choice of set_threads in this process


def parse_threads(text: str | int | None, source: str = "--threads") -> int | None:
    """``"auto"`` or None -> None (the rule above); a positive integer -> itself; else a one-line ``ConfigError``."""
    if text is None or str(text).strip().lower() == "auto":
        return None
    try:
        count = int(str(text).strip())
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"{source} must be a positive number of threads or 'auto', got {text!r}")
    limit, why = thread_limit()
    if count > limit:
        raise ConfigError(f"{source} must be at most {limit} ({why}), got {text}")
    return count


def thread_limit() -> tuple[int, str]:
    """The most threads this process could start, and where that limit comes from: the kernel's
    ``threads-max``, the user's process limit (``ulimit -u``), and torch's C int."""
    limits = [(2**31 - 1, "the largest count torch takes")]
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            limits.append((int(f.read().split()[0]), "the kernel's threads-max, /proc/sys/kernel/threads-max"))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            limits.append((soft, "the processes and threads this user may start, ulimit -u"))
    except (ImportError, OSError, ValueError):
        pass
    return min(limits)


def _quota_cores(cpu_max: str) -> float | None:
    """A cgroup v2 ``cpu.max`` line ("200000 100000" -> 2.0; "max 100000" -> None)."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota = _quota_cores(f.read())
    except (OSError, ValueError):
        quota = None
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return max(1, cores)


def _cpu_times(stat: str) -> tuple[int, int]:
    """(busy, total) jiffies of all cores from the first line of ``/proc/stat``."""
    fields = [int(v) for v in stat.split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


def _own_jiffies() -> int:
    """CPU time of this process (user + system) in jiffies, from ``/proc/self/stat``."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def busy_cores_elsewhere(window: float = PROBE_SECONDS) -> float:
    """How many cores other processes keep busy, measured over ``window`` seconds (Linux: ``/proc/stat``
    minus this process's own time; elsewhere the 1-minute load average)."""
    try:
        with open("/proc/stat") as f:
            busy0, total0 = _cpu_times(f.read())
        own0 = _own_jiffies()
        time.sleep(window)
        with open("/proc/stat") as f:
            busy1, total1 = _cpu_times(f.read())
        own1 = _own_jiffies()
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (OSError, AttributeError):
            return 0.0
    cores = os.cpu_count() or 1  # /proc/stat counts every core of the machine
    if total1 <= total0:
        return 0.0
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / (total1 - total0) * cores


def choose_threads(cores: int, busy_elsewhere: float, ranks_here: int = 1) -> int:
    """The ``auto`` rule: cores no other process keeps busy (a core taken from ``BUSY_CORE`` of its load on),
    shared by the job's ranks on this machine; at least 1."""
    taken = int(busy_elsewhere + 1 - BUSY_CORE)
    return max(1, (cores - taken) // max(1, ranks_here))


def auto_choice() -> ThreadChoice:
    """The ``auto`` rule's count on this machine now (module docstring), with its reason; nothing applied."""
    cores = usable_cores()
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    # the ranks of a torchrun job start together: each would see the others as load, so they share cores
    busy = 0.0 if ranks > 1 or cores == 1 else min(busy_cores_elsewhere() for _ in range(PROBES))
    return ThreadChoice(choose_threads(cores, busy, ranks), f"auto: {cores} usable cores, {busy:.1f} busy elsewhere"
                        + (f", {ranks} ranks on this machine" if ranks > 1 else ""))


def set_threads(requested: str | int | None = None) -> ThreadChoice:
    """Choose this process's intra-op thread count (module docstring), apply it with ``torch.set_num_threads``
    and return it with its reason. ``requested``: the ``--threads`` value (None or "auto": the environment,
    then the rule)."""
    for source, text in (("--threads", requested), (THREADS_ENV, os.environ.get(THREADS_ENV))):
        count = parse_threads(text, source)
        if count is not None:
            choice = ThreadChoice(count, source)
            break
    else:
        omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # OpenMP's own syntax: "4" or "4,2"
        if omp.isdigit() and int(omp) > 0:
            choice = ThreadChoice(int(omp), "OMP_NUM_THREADS")
        else:
            choice = auto_choice()
    cores = usable_cores()
    if choice.count > cores:  # accepted (a user may know better), but never silently
        sys.stderr.write(f"note: {choice.count} CPU threads asked ({choice.reason}) where this process may use "
                         f"{cores} core{'s' if cores > 1 else ''}: threads beyond the cores wait for each other "
                         f"(README: On a busy machine); --threads {cores} uses them all\n")
    torch.set_num_threads(choice.count)
    _CHOSEN[:] = [choice]
    return choice


def threads_for_api() -> None:
    """The first call in a process applies ``set_threads()`` (the environment, then ``auto``) unless the process
    chose already; an ``auto`` choice is said once on stderr (module docstring)."""
    if _CHOSEN:
        return
    choice = set_threads(None)
    if choice.reason.startswith("auto"):
        sys.stderr.write(f"note: {choice.count} CPU thread{'s' if choice.count > 1 else ''} ({choice.reason}); "
                         f"choose with gradengines.set_threads(N) or {THREADS_ENV}=N\n")


def last_choice() -> ThreadChoice:
    """What ``set_threads`` chose in this process, or torch's own default if it was never called."""
    return _CHOSEN[0] if _CHOSEN else ThreadChoice(torch.get_num_threads(), "torch default (one per core)")
