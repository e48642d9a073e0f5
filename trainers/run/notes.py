"""One-line notes on stderr: what a command did instead of what was asked, and why.

The lowest module of the run: it imports nothing of the framework, so every other module
(the run directory, the records' readers, the command line) can say something through it.
"""

import sys

__all__ = ["note", "note_once", "forget_said"]

_SAID: set[str] = set()  # the notes note_once said in this command


def note(message: str) -> None:
    """A one-line note on stderr (what the run did instead of what was asked, and why)."""
    sys.stderr.write(f"note: {message}\n")  # one write: lines of concurrent ranks never run together
    sys.stderr.flush()


def note_once(message: str) -> None:
    """``note(message)`` unless this command said it already (a setup built several times says it once)."""
    if message not in _SAID:
        _SAID.add(message)
        note(message)


def forget_said() -> None:
    """A new command starts: its notes are said again (``trainers.run.records.forget_notes``)."""
    _SAID.clear()
