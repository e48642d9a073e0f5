"""What every script does: load the framework and run one command of ``trainers.cli`` (its exit status).

Loading torch takes seconds; a Ctrl-C then ends in one line and exit status 130, as everywhere else,
instead of a traceback through the import machinery."""

import sys


def run(command: str) -> None:
    """Run ``trainers.cli.COMMANDS[command]`` on ``sys.argv[1:]`` and exit with its status."""
    try:
        from gradengines.trainers.cli import COMMANDS
        from gradengines.trainers.core.distributed import exit_process
    except KeyboardInterrupt:
        print("error: interrupted while starting", file=sys.stderr)
        sys.exit(130)
    except OSError as err:  # the libraries write while they load (torch a temporary file): a full disk, a limit
        where = f" ({err.filename})" if err.filename else ""
        print(f"error: cannot start: {err.strerror or err}{where}; every write is refused here: check the free space "
              f"and the file-size limit (ulimit -f)", file=sys.stderr)
        sys.exit(2)
    except ModuleNotFoundError as err:  # a Python without the project (plain `python` beside the .venv)
        print(f"error: {sys.executable} cannot import {err.name} (No module named {err.name!r}): run the scripts with "
              f"the project's environment, .venv/bin/python (made by bash scripts/setup.sh), or pip install . into "
              f"this one", file=sys.stderr)
        sys.exit(2)
    exit_process(COMMANDS[command]())
