"""A command as a process: every user error one line on stderr and exit code 2, a failure during training
one line and 1, Ctrl-C 130, SIGTERM 143 (the run stops as on Ctrl-C, its checkpoint kept). With
``GRADENGINES_DEBUG=1`` in the environment the failure's whole traceback is printed before its line."""

import os
import signal
import sys
import traceback

from gradengines.trainers.core.distributed import DataParallel
from gradengines.trainers.core.errors import (
    USER_ERRORS,
    DistributedError,
    ModelRunError,
    NonFiniteLossError,
    RunOutOfMemory,
    RunTerminated,
    RunWriteError,
    Terminated,
    command_line,
    out_of_memory,
)
from gradengines.trainers.run.records import forget_notes

__all__ = ["run_cli", "INTERRUPTED", "TERMINATED"]


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


TERMINATED = 143  # ... and by SIGTERM


def run_cli(main) -> int:
    """Run ``main()`` with errors spelled as flags; one line on stderr for every failure.

    Exit 2: user errors and OS errors before training started (``--logdir`` not
    writable, a file, a full disk); exit 1: a NaN loss, a lost rank, or a write that
    failed during training (``RunWriteError`` says what was kept), memory that ran out during
    training; exit 130: Ctrl-C; exit 143: SIGTERM (turned into ``Terminated`` while ``main`` runs,
    so a run stops as on Ctrl-C: its last checkpoint kept, ``--resume`` exact). Under torchrun every
    rank prints its own error (prefixed with its rank); the scripts end with
    ``trainers.core.distributed.exit_process``, which closes the group.
    """
    forget_notes()
    previous = _on_sigterm(_terminate)
    try:
        return _run_reporting(main)
    finally:
        if previous is not None:
            _on_sigterm(previous)


def _run_reporting(main) -> int:
    """``run_cli``'s body: ``main()``, every failure as one line on stderr and its exit code."""
    try:
        with command_line():
            return main() or 0
    except BaseException as err:  # noqa: BLE001 - spelled below; what is not a known failure is raised again
        caught = err
        code, message = _spelled(err)
    if os.environ.get("GRADENGINES_DEBUG", "") not in ("", "0"):  # the whole story, for whoever asks for it
        traceback.print_exception(caught, file=sys.stderr)
    here = DataParallel()
    prefix = f"[rank {here.rank}/{here.world_size}] " if here.active and not message.startswith("rank ") else ""
    # one write of the whole line: the ranks of a torchrun job print at the same moment, and a print's separate
    # write of its newline let two ranks' lines run together
    sys.stderr.write(f"error: {prefix}{message}\n")
    sys.stderr.flush()
    return code


def _spelled(err: BaseException) -> tuple[int, str]:
    """(exit code, one line) of a failure the commands know (``run_cli``); anything else is raised again."""
    if isinstance(err, USER_ERRORS):
        return 2, str(err)
    if isinstance(err, (NonFiniteLossError, DistributedError, RunWriteError, RunOutOfMemory, ModelRunError)):
        return 1, str(err)
    if isinstance(err, OSError):
        return 2, f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err)
    if isinstance(err, KeyboardInterrupt):
        terminated = isinstance(err, (Terminated, RunTerminated))
        return (TERMINATED if terminated else INTERRUPTED,
                str(err) or ("terminated (SIGTERM)" if terminated else "interrupted"))
    if isinstance(err, (MemoryError, RuntimeError)) and out_of_memory(err):  # a failed allocation before training
        return 2, f"{out_of_memory(err)}; lower the sizes asked for (batch, model, --task-option)"
    raise err


def _terminate(signum, frame):
    raise Terminated()


def _on_sigterm(handler):
    """Install ``handler`` for SIGTERM (main thread only; elsewhere nothing) and return the previous one."""
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None

