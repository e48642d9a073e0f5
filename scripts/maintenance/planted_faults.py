#!/usr/bin/env python
"""Planted faults: does some test catch each plausible mistake of ``trainers/engines/planted_faults.toml``?

    .venv/bin/python scripts/maintenance/planted_faults.py                    # every fault, one at a time
    .venv/bin/python scripts/maintenance/planted_faults.py --jobs 2           # two faults at once
    .venv/bin/python scripts/maintenance/planted_faults.py --only foton-sign,dsf-tied-gate-step
    .venv/bin/python scripts/maintenance/planted_faults.py --list             # the faults, nothing run
    .venv/bin/python scripts/maintenance/planted_faults.py --dry-run   # plant each, import it, print trainers.__file__

The working tree as it is now (the files ``git ls-files -co --exclude-standard`` lists: tracked and
untracked-but-not-ignored, uncommitted edits included) is copied once into a temporary folder. For each fault
that copy is copied again, the fault's ``old`` text (which must occur exactly once in its file) replaced by
``new``, the copy's packages imported once (``trainers.__file__`` must lie in the copy: the .venv's editable
install points at the checkout, so the copy goes first on PYTHONPATH and is the working directory), and then

    python -m pytest -x -q -p no:cacheprovider <the fault's test files>

runs in the copy. A fault is caught when a test fails (or errors in its setup); the "FAILED"/"ERROR" lines of
pytest's summary name it. A fault whose copy does not import, or whose test files do not collect, is reported
as such (an ill-made fault, not a catch). Every test that caught a fault is then run once on the unplanted
copy: one that fails there too caught nothing, and its fault runs again with that test deselected.

Output: a Markdown table (fault, description, caught by, time) on stdout, progress on stderr. Exit status 0
when every fault run was caught, 1 otherwise, 2 for a bad fault list or option (a fault whose ``old`` text is
missing or not unique stops everything before any test runs: a stale fault must not silently plant nothing).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ROOT / "trainers" / "engines" / "planted_faults.toml"
FIELDS = {"id": str, "engine": str, "file": str, "old": str, "new": str, "description": str, "tests": list}
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE", "--tb=short"]
IMPORT_CHECK = "import gradengines.trainers.engines as e; print(e.__file__)"


class FaultListError(Exception):
    """The fault list is malformed or stale (exit status 2)."""


@dataclass
class Result:
    fault: dict
    status: str  # caught, not caught, breaks import, breaks collection, pytest error, timed out
    caught_by: list[str] = field(default_factory=list)
    detail: str = ""
    seconds: float = 0.0
    deselected: list[str] = field(default_factory=list)
    log: str = ""


# ---- the fault list --------------------------------------------------------------------------------------

def load_faults(path: Path = FAULTS) -> list[dict]:
    try:
        import tomllib
    except ModuleNotFoundError:
        raise FaultListError("the fault list needs Python 3.11+ (tomllib): run .venv/bin/python") from None
    faults = tomllib.loads(path.read_text()).get("fault", [])
    seen: set[str] = set()
    for i, fault in enumerate(faults):
        name = fault.get("id", f"#{i + 1}")
        for key, kind in FIELDS.items():
            if not isinstance(fault.get(key), kind):
                raise FaultListError(f"fault {name}: '{key}' missing or not a {kind.__name__} in {path}")
        if set(fault) - set(FIELDS):
            raise FaultListError(f"fault {name}: unknown keys {sorted(set(fault) - set(FIELDS))} in {path}")
        if name in seen:
            raise FaultListError(f"fault {name}: the id is used twice in {path}")
        seen.add(name)
        if not fault["old"]:
            raise FaultListError(f"fault {name}: 'old' is empty")
        if fault["old"] == fault["new"]:
            raise FaultListError(f"fault {name}: 'old' and 'new' are the same text")
    return faults


def plant(tree: Path, fault: dict) -> None:
    """Replace the fault's ``old`` text by ``new`` in ``tree``; it must occur exactly once."""
    path = tree / fault["file"]
    if not path.is_file():
        raise FaultListError(f"fault {fault['id']}: {fault['file']} does not exist (stale fault)")
    text = path.read_text()
    count = text.count(fault["old"])
    if count != 1:
        raise FaultListError(f"fault {fault['id']}: its 'old' text occurs {count} times in {fault['file']}, "
                             f"must be exactly once (a stale fault)\n"
                             f"--- old ---\n{fault['old']}")
    path.unlink()  # a new file, never a shared inode
    path.write_text(text.replace(fault["old"], fault["new"]))


def check_faults(tree: Path, faults: list[dict], source: Path = FAULTS) -> None:
    """Every fault's ``old`` text occurs exactly once and its test files exist; all problems at once."""
    problems = []
    for fault in faults:
        path = tree / fault["file"]
        count = path.read_text().count(fault["old"]) if path.is_file() else None
        if count is None:
            problems.append(f"fault {fault['id']}: {fault['file']} does not exist")
        elif count != 1:
            problems.append(f"fault {fault['id']}: its 'old' text occurs {count} times in {fault['file']} "
                            f"(must be exactly once)")
        problems += [f"fault {fault['id']}: test file {t} does not exist" for t in fault["tests"]
                     if not (tree / t).is_file()]
    if problems:
        raise FaultListError(f"stale fault list ({source}; update 'old' where the code changed):\n  "
                             + "\n  ".join(problems))


# ---- copies of the tree ----------------------------------------------------------------------------------

def snapshot(dest: Path) -> Path:
    """Copy the working tree's tracked and untracked-but-not-ignored files (as they are now) to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():  # a tracked file deleted in the tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def environment(tree: Path) -> dict:
    """The environment of a run in ``tree``: the copy first on PYTHONPATH (subprocesses of tests inherit it)."""
    path = os.pathsep.join(filter(None, [str(tree.resolve()), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def imported_from(tree: Path) -> tuple[str | None, str]:
    """(trainers.__file__ as the copy imports it, or None; the error's last line)."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_CHECK], cwd=tree, env=environment(tree),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit status {proc.returncode}"
    return proc.stdout.strip().splitlines()[-1], ""


def inside(path: str, tree: Path) -> bool:
    return Path(path).resolve().is_relative_to(tree.resolve())


# ---- one fault -------------------------------------------------------------------------------------------

def summary_lines(output: str, kind: str) -> list[str]:
    """The node ids of pytest's short summary lines ``FAILED <id> - ...`` or ``ERROR <id> - ...``."""
    return [m.group(1) for m in re.finditer(rf"^{kind} (.+?)(?: - .*)?$", output, re.MULTILINE)]  # ids may hold spaces


def judge(output: str, returncode: int) -> tuple[str, list[str], str]:
    """(status, the tests that caught the fault, a detail) from one pytest run's output."""
    failed = summary_lines(output, "FAILED")
    errors = summary_lines(output, "ERROR")
    in_tests = [e for e in errors if "::" in e]  # an error in a test's setup: the test ran into the fault
    collection = [e for e in errors if "::" not in e]
    if failed or in_tests:
        return "caught", failed + in_tests, ""
    if collection:
        reason = re.search(r"^E\s+(\w+(?:Error|Exception)\b.*)$", output, re.MULTILINE)
        return "breaks collection", collection, reason.group(1) if reason else ""
    if returncode == 0:
        return "not caught", [], ""
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    return "pytest error", [], f"exit status {returncode}: {tail}"


def run_fault(fault: dict, base: Path, work: Path, timeout: float, deselect: list[str]) -> Result:
    start = time.monotonic()
    tree = Path(tempfile.mkdtemp(prefix=f"{fault['id']}-", dir=work))
    try:
        shutil.copytree(base, tree, dirs_exist_ok=True)
        plant(tree, fault)
        where, error = imported_from(tree)
        if where is None:
            return Result(fault, "breaks import", detail=error, seconds=time.monotonic() - start)
        if not inside(where, tree):
            raise RuntimeError(f"fault {fault['id']}: the copy imported trainers from {where}, not from {tree}")
        args = [sys.executable, *PYTEST, *fault["tests"], *(f"--deselect={t}" for t in deselect)]
        try:
            proc = subprocess.run(args, cwd=tree, env=environment(tree), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(fault, "timed out", detail=f"after {timeout:.0f} s", seconds=time.monotonic() - start,
                          deselected=deselect)
        output = proc.stdout + proc.stderr
        status, caught_by, detail = judge(output, proc.returncode)
        return Result(fault, status, caught_by, detail, time.monotonic() - start, deselect, output)
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def failing_on_clean(base: Path, work: Path, tests: set[str], timeout: float) -> set[str]:
    """Of the node ids ``tests``, those that fail (or error) on the unplanted copy."""
    if not tests:
        return set()
    tree = Path(tempfile.mkdtemp(prefix="clean-", dir=work))
    try:
        shutil.copytree(base, tree, dirs_exist_ok=True)
        args = [sys.executable, *[a for a in PYTEST if a != "-x"], *sorted(tests)]
        proc = subprocess.run(args, cwd=tree, env=environment(tree), capture_output=True, text=True, timeout=timeout)
        output = proc.stdout + proc.stderr
        return set(summary_lines(output, "FAILED")) | set(summary_lines(output, "ERROR"))
    finally:
        shutil.rmtree(tree, ignore_errors=True)


# ---- the report ------------------------------------------------------------------------------------------

def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(results: list[Result], seconds: float) -> str:
    rows = ["| fault | description | caught by | time |", "|---|---|---|---|"]
    for r in results:
        if r.status == "caught":
            by = ", ".join(f"`{t}`" for t in r.caught_by)
        else:
            by = f"**{r.status.upper()}**" + (f": {r.detail}" if r.detail else "")
            if r.status == "breaks collection":
                by += " (" + ", ".join(f"`{t}`" for t in r.caught_by) + ")"
        if r.deselected:
            by += " (deselected, failing without the fault: " + ", ".join(f"`{t}`" for t in r.deselected) + ")"
        rows.append(f"| `{r.fault['id']}` | {cell(r.fault['description'])} | {cell(by)} | {r.seconds:.0f} s |")
    caught = sum(r.status == "caught" for r in results)
    rows.append("")
    rows.append(f"{caught} of {len(results)} faults caught; {seconds:.0f} s in all.")
    return "\n".join(rows)


def list_faults(faults: list[dict]) -> str:
    rows = ["| fault | engine | file | description | tests |", "|---|---|---|---|---|"]
    rows += [f"| `{f['id']}` | {f['engine']} | `{f['file']}` | {cell(f['description'])} | "
             f"{', '.join(Path(t).name for t in f['tests'])} |" for f in faults]
    return "\n".join(rows)


# ---- main ------------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=Path, default=FAULTS,
                        help=f"the fault list (default {FAULTS.relative_to(ROOT)})")
    parser.add_argument("--only", help="comma-separated fault ids (default: every fault)")
    parser.add_argument("--list", action="store_true", help="print the faults and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="plant each fault in a copy and import it (prints trainers.__file__); no tests")
    parser.add_argument("--jobs", type=int, default=1, help="faults run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per fault's pytest run (default 1200)")
    parser.add_argument("--out", type=Path, help="also write the Markdown table to this file")
    parser.add_argument("--logs", type=Path, help="write each fault's pytest output to DIR/<id>.log")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        faults = load_faults(args.faults)
        if args.only:
            wanted = [s.strip() for s in args.only.split(",") if s.strip()]
            unknown = sorted(set(wanted) - {f["id"] for f in faults})
            if unknown:
                raise FaultListError(f"--only: no fault {', '.join(unknown)} (--list shows them)")
            faults = [f for f in faults if f["id"] in wanted]
        if args.jobs < 1:
            raise FaultListError(f"--jobs must be >= 1, got {args.jobs}")
        if args.list:
            print(list_faults(faults))
            return 0
        with tempfile.TemporaryDirectory(prefix="planted-faults-") as work_dir:
            work = Path(work_dir)
            base = snapshot(work / "base")
            check_faults(base, faults, args.faults)
            if args.dry_run:
                return dry_run(faults, base, work)
            return run_all(faults, base, work, args)
    except FaultListError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def dry_run(faults: list[dict], base: Path, work: Path) -> int:
    where, error = imported_from(base)
    print(f"unplanted copy: trainers from {where or error}")
    bad = 0
    for fault in faults:
        tree = Path(tempfile.mkdtemp(prefix=f"{fault['id']}-", dir=work))
        shutil.copytree(base, tree, dirs_exist_ok=True)
        plant(tree, fault)
        where, error = imported_from(tree)
        ok = where is not None and inside(where, tree)
        bad += not ok
        print(f"{fault['id']}: {'trainers from ' + where if where else 'BREAKS IMPORT: ' + error}"
              f"{'' if ok or where is None else '  (NOT THE COPY)'}")
        shutil.rmtree(tree, ignore_errors=True)
    return 1 if bad else 0


def run_all(faults: list[dict], base: Path, work: Path, args) -> int:
    start = time.monotonic()
    where, error = imported_from(base)
    if where is None or not inside(where, base):
        print(f"error: the unplanted copy imports trainers from {where or error}, not from the copy", file=sys.stderr)
        return 1
    print(f"{len(faults)} faults, {args.jobs} at a time; copy of the working tree in {base}", file=sys.stderr)

    def one(fault: dict, deselect: list[str]) -> Result:
        result = run_fault(fault, base, work, args.timeout, deselect)
        print(f"  {fault['id']}: {result.status} {', '.join(result.caught_by)} ({result.seconds:.0f} s)",
              file=sys.stderr)
        return result

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda f: one(f, []), faults))
    # a test that fails without any fault caught nothing: run its faults again without it
    broken: set[str] = set()
    for _ in range(3):
        catchers = {t for r in results if r.status == "caught" for t in r.caught_by} - broken
        newly = failing_on_clean(base, work, catchers, args.timeout)
        if not newly:
            break
        broken |= newly
        print(f"failing without any fault: {', '.join(sorted(newly))}; rerunning their faults", file=sys.stderr)
        again = [i for i, r in enumerate(results) if set(r.caught_by) & newly]
        without = sorted(broken)
        with ThreadPoolExecutor(args.jobs) as pool:
            redone = list(pool.map(lambda i, without=without: one(results[i].fault, without), again))
        for i, r in zip(again, redone, strict=True):
            results[i] = r
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
        for r in results:
            (args.logs / f"{r.fault['id']}.log").write_text(r.log or r.detail)
    report = table(results, time.monotonic() - start)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0 if all(r.status == "caught" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
