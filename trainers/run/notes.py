"""One-line notes on stderr: what a command did instead of what was asked, and why.

The lowest module of the run: it imports nothing of the framework, so every other module
(the run directory, the records' readers, the command line) can say something through it.
"""

import sys

__all__ = ["note"]


def note(message: str) -> None:
    """A one-line note on stderr (what the run did instead of what was asked, and why)."""
    sys.stderr.write(f"note: {message}\n")  # one write: lines of concurrent ranks never run together
    sys.stderr.flush()
