"""A command as a process: every user error one line on stderr and exit code 2, a failure during training
one line and 1, Ctrl-C 130, SIGTERM 143 (the run stops as on Ctrl-C, its checkpoint kept)."""

import signal
import sys

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
    except USER_ERRORS as err:
        code, message = 2, str(err)
    except (NonFiniteLossError, DistributedError, RunWriteError, RunOutOfMemory, ModelRunError) as err:
        code, message = 1, str(err)
    except OSError as err:
        code, message = 2, f"{err.filename}: {err.strerror}" if err.filename and err.strerror else str(err)
    except KeyboardInterrupt as err:
        terminated = isinstance(err, (Terminated, RunTerminated))
        code = TERMINATED if terminated else INTERRUPTED
        message = str(err) or ("terminated (SIGTERM)" if terminated else "interrupted")
    except (MemoryError, RuntimeError) as err:  # a failed allocation before training: the sizes asked for
        if not out_of_memory(err):
            raise
        code, message = 2, f"{out_of_memory(err)}; lower the sizes asked for (batch, model, --task-option)"
    here = DataParallel()
    prefix = f"[rank {here.rank}/{here.world_size}] " if here.active and not message.startswith("rank ") else ""
    # one write of the whole line: the ranks of a torchrun job print at the same moment, and a print's separate
    # write of its newline let two ranks' lines run together
    sys.stderr.write(f"error: {prefix}{message}\n")
    sys.stderr.flush()
    return code


def _terminate(signum, frame):
    raise Terminated()


def _on_sigterm(handler):
    """Install ``handler`` for SIGTERM (main thread only; elsewhere nothing) and return the previous one."""
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None

