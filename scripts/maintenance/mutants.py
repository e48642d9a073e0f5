#!/usr/bin/env python
"""Mutation testing: single-point mutants of the engines, orthogonality and the model adapters, each run against
the tests that concern its module; the score per file and the survivors (CONTRIBUTING.md, "Mutation testing").

    .venv/bin/python scripts/maintenance/mutants.py --jobs 2                   # every file's sample (mutants.toml)
    .venv/bin/python scripts/maintenance/mutants.py --jobs 2 --only pepita.py  # the files whose path contains it
    .venv/bin/python scripts/maintenance/mutants.py --list                     # the mutants, nothing run
    .venv/bin/python scripts/maintenance/mutants.py --jobs 2 --out mutants.md  # also write the report

Why a small AST mutator of our own and not mutmut: a mutant here is a planted fault made by a rule, so it runs
through ``scripts/maintenance/planted_faults.py`` (a copy of the working tree, the fault planted, the module's own
test files with ``-x``, a test that fails without any mutant discounted), with the test files chosen per module in
``scripts/maintenance/mutants.toml``; mutmut rewrites every function into a trampoline in a ``mutants/`` tree and
runs its own test selection, which does not know our per-module test lists, our torchrun and subprocess tests (they
import the real tree), or the ``-n auto`` suite's 3-minute budget.

The mutations (one at a time, on a node that lies on one line, never inside a string, an f-string, a docstring or an
annotation): an arithmetic operator swapped (``+``/``-``, ``*``/``/``, ``**`` to ``*``), a comparison turned
(``<``/``<=``, ``>``/``>=``, ``<``/``>``, ``==``/``!=``, ``is``/``is not``, ``in``/``not in``), ``and``/``or``
swapped, a ``not`` dropped, a number changed (n to n + 1, x to 2x, 0.0 to 1.0), ``True``/``False`` swapped, and a
one-line call statement dropped (``pass``). Each file's mutants are sampled, ``--per-file`` of them drawn with
``--seed`` (the same sample every run until the code changes). A mutant is killed when a test fails; one whose copy
does not import or collect is counted apart (not a test's merit); one listed in ``scripts/maintenance/mutants.toml``
as equivalent (same behaviour, with the argument) is not counted. Exit status 0 when every counted file reaches
``--goal``, 1 otherwise, 2 for a bad option or target list.
"""

import argparse
import ast
import hashlib
import random
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import planted_faults  # noqa: E402  (a script beside this one: the copies, the runs, the judging)

ROOT = planted_faults.ROOT
TARGETS = Path(__file__).resolve().with_suffix(".toml")

BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult}
COMPARE = {ast.Lt: [ast.LtE, ast.Gt], ast.LtE: [ast.Lt], ast.Gt: [ast.GtE, ast.Lt], ast.GtE: [ast.Gt],
           ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq], ast.Is: [ast.IsNot], ast.IsNot: [ast.Is], ast.In: [ast.NotIn],
           ast.NotIn: [ast.In]}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.Lt: "<", ast.LtE: "<=",
          ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not", ast.In: "in",
          ast.NotIn: "not in", ast.And: "and", ast.Or: "or"}


@dataclass(frozen=True)
class Mutant:
    file: str  # relative to the repository
    line: int
    kind: str  # e.g. "* -> /"
    old: str  # the whole line (with the lines above it that make it unique in the file)
    new: str

    @property
    def id(self) -> str:
        return f"{Path(self.file).stem}:{self.line}:{self.kind}"

    @property
    def slug(self) -> str:
        """The id as a file name (the planted copy's folder is named by it), unique: two mutants of one line that
        differ only in symbols (``> -> <``, ``> -> >=``) would otherwise share it, and one's result the other's."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.id) + "-" + hashlib.sha1(self.id.encode()).hexdigest()[:8]

    def fault(self, tests: list[str]) -> dict:
        """The mutant as a planted fault (``scripts/maintenance/planted_faults.py``)."""
        return {"id": self.slug, "engine": self.file, "file": self.file, "old": self.old, "new": self.new,
                "description": f"{self.kind} at line {self.line}", "tests": tests}


# ---- making mutants ------------------------------------------------------------------------------------------

def _skipped(tree: ast.AST) -> set[int]:
    """ids of the nodes never mutated: strings and everything inside f-strings, docstrings and annotations."""
    skip: set[int] = set()

    def all_of(node):
        skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            all_of(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                if arg.annotation is not None:
                    all_of(arg.annotation)
            if node.returns is not None:
                all_of(node.returns)
        elif isinstance(node, ast.AnnAssign):
            all_of(node.annotation)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            all_of(node.body[0])
    return skip


def _variants(node: ast.AST) -> list[tuple[str, ast.AST | None]]:
    """(kind, the mutated node, or None for a dropped statement) of one node."""
    out: list[tuple[str, ast.AST | None]] = []
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        new = BINARY[type(node.op)]
        out.append((f"{SYMBOL[type(node.op)]} -> {SYMBOL[new]}", ast.BinOp(node.left, new(), node.right)))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE:
        for new in COMPARE[type(node.ops[0])]:
            out.append((f"{SYMBOL[type(node.ops[0])]} -> {SYMBOL[new]}", ast.Compare(node.left, [new()],
                                                                                      node.comparators)))
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        out.append((f"{SYMBOL[type(node.op)]} -> {SYMBOL[new]}", ast.BoolOp(new(), node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("drop not", node.operand))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        out.append((f"{node.value} -> {not node.value}", ast.Constant(not node.value)))
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        value = node.value + 1 if isinstance(node.value, int) else (node.value * 2 if node.value else 1.0)
        out.append((f"{node.value!r} -> {value!r}", ast.Constant(value)))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        out.append(("drop call", None))
    return out


def _unique_context(lines: list[str], index: int, new_line: str) -> tuple[str, str]:
    """(old, new): the mutated line with as many lines above it as make the old text unique in the file."""
    text = "\n".join(lines)
    start = index
    while True:
        old = "\n".join(lines[start:index + 1])
        if text.count(old) == 1 or start == 0:
            return old, "\n".join([*lines[start:index], new_line])
        start -= 1


def mutants_of(path: Path, relative: str) -> list[Mutant]:
    """Every mutant of one file (module docstring), in source order."""
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    skip = _skipped(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno") or node.lineno != node.end_lineno:
            continue
        line = lines[node.lineno - 1]
        for kind, mutated in _variants(node):
            if mutated is None:
                new_line = line[:node.col_offset] + "pass" + line[node.end_col_offset:]
            else:
                new_line = line[:node.col_offset] + ast.unparse(mutated) + line[node.end_col_offset:]
            if new_line == line:
                continue
            old, new = _unique_context(lines, node.lineno - 1, new_line)
            found.append(Mutant(relative, node.lineno, kind, old, new))
    return sorted(set(found), key=lambda m: (m.line, m.kind, m.new))


def sample(mutants: list[Mutant], per_file: int, seed: int, file: str) -> list[Mutant]:
    """``per_file`` of a file's mutants, drawn with ``seed`` (all of them when there are fewer), in line order."""
    if per_file <= 0 or len(mutants) <= per_file:
        return mutants
    return sorted(random.Random(f"{seed}:{file}").sample(mutants, per_file), key=lambda m: (m.line, m.kind))


# ---- targets and equivalents ---------------------------------------------------------------------------------

def load_targets(path: Path = TARGETS) -> tuple[dict[str, list[str]], list[dict]]:
    """(file -> the test files that concern it, the mutants argued equivalent); a bad list: FaultListError."""
    import tomllib

    data = tomllib.loads(path.read_text())
    targets = {t["file"]: t["tests"] for t in data.get("target", [])}
    equivalent = data.get("equivalent", [])
    problems = [f"target {f}: no such file" for f in targets if not (ROOT / f).is_file()]
    problems += [f"target {f}: no test file {t}" for f, tests in targets.items() for t in tests
                 if not (ROOT / t).is_file()]
    for e in equivalent:
        if set(e) != {"file", "old", "new", "why"} or e["file"] not in targets:
            problems.append(f"equivalent {e}: needs file (a target), old, new and why")
    if problems:
        raise planted_faults.FaultListError(f"{path}:\n  " + "\n  ".join(problems))
    return targets, equivalent


def is_equivalent(mutant: Mutant, equivalent: list[dict]) -> str | None:
    """The argument of a listed equivalent mutant (matched by file and by its mutated line), else None."""
    old_line, new_line = mutant.old.splitlines()[-1].strip(), mutant.new.splitlines()[-1].strip()
    for e in equivalent:
        if e["file"] == mutant.file and e["old"].strip() == old_line and e["new"].strip() == new_line:
            return e["why"]
    return None


# ---- the report ----------------------------------------------------------------------------------------------

def report(results: list, mutants: dict[str, Mutant], seconds: float, goal: float) -> tuple[str, bool]:
    """The Markdown report (score per file, survivors) and whether every file reached ``goal``; ``mutants``: all
    drawn, ``results``: of those run (the others were argued equivalent)."""
    files: dict[str, dict[str, int]] = {}
    survivors, apart = [], []
    by_slug = {r.fault["id"]: r for r in results}
    for m in mutants.values():
        row = files.setdefault(m.file, {"killed": 0, "survived": 0, "equivalent": 0, "not run": 0})
        r = by_slug.get(m.slug)
        if r is None:  # argued equivalent, so not run
            row["equivalent"] += 1
        elif r.status == "caught":
            row["killed"] += 1
        elif r.status == "not caught":
            row["survived"] += 1
            survivors.append(m)
        else:
            row["not run"] += 1
            apart.append((m, r.status, r.detail))
    lines = ["| file | mutants | killed | survived | equivalent | breaks import or collection | score |",
             "|---|---|---|---|---|---|---|"]
    reached = True
    for file, row in sorted(files.items()):
        counted = row["killed"] + row["survived"]
        score = row["killed"] / counted if counted else 1.0
        reached &= score >= goal
        lines.append(f"| `{file}` | {sum(row.values())} | {row['killed']} | {row['survived']} | {row['equivalent']} "
                     f"| {row['not run']} | {100 * score:.0f}% |")
    killed = sum(r["killed"] for r in files.values())
    counted = killed + sum(r["survived"] for r in files.values())
    lines += ["", f"{killed} of {counted} counted mutants killed ({100 * killed / max(counted, 1):.0f}%); "
                  f"{seconds / 60:.0f} min."]
    if survivors:
        lines += ["", "Survivors (not killed, not argued equivalent):", ""]
        lines += [f"- `{m.id}` ({m.file}:{m.line}): `{m.old.splitlines()[-1].strip()}` -> "
                  f"`{m.new.splitlines()[-1].strip()}`" for m in survivors]
    if apart:
        lines += ["", "Not counted (the mutant does not import or collect):", ""]
        lines += [f"- `{m.id}`: {status}{': ' + detail if detail else ''}" for m, status, detail in apart]
    return "\n".join(lines), reached


# ---- main ----------------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=Path, default=TARGETS, help="files, their tests and the equivalents")
    parser.add_argument("--only", help="run the target files whose path contains this text")
    parser.add_argument("--per-file", type=int, default=12, help="mutants drawn per file (0: all; default 12)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    parser.add_argument("--goal", type=float, default=0.95, help="killed share each file must reach (default 0.95)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant's pytest run (default 900)")
    parser.add_argument("--list", action="store_true", help="print the drawn mutants and exit")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.jobs < 1:
            raise planted_faults.FaultListError(f"--jobs must be >= 1, got {args.jobs}")
        targets, equivalent = load_targets(args.targets)
        chosen = {f: t for f, t in targets.items() if args.only is None or args.only in f}
        if not chosen:
            raise planted_faults.FaultListError(f"--only {args.only!r} matches no target of {args.targets}")
    except planted_faults.FaultListError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    drawn = {m.id: m for f in chosen for m in sample(mutants_of(ROOT / f, f), args.per_file, args.seed, f)}
    if args.list:
        for m in drawn.values():
            note = is_equivalent(m, equivalent)
            print(f"{m.id}\t{m.new.splitlines()[-1].strip()}" + (f"\t(equivalent: {note})" if note else ""))
        return 0
    start = time.monotonic()
    to_run = [m for m in drawn.values() if not is_equivalent(m, equivalent)]
    print(f"{len(drawn)} mutants of {len(chosen)} files ({len(drawn) - len(to_run)} argued equivalent), "
          f"{args.jobs} at a time", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="mutants-") as work_dir:
        work = Path(work_dir)
        base = planted_faults.snapshot(work / "base")

        def one(m: Mutant, deselect: list[str]):
            result = planted_faults.run_fault(m.fault(chosen[m.file]), base, work, args.timeout, deselect)
            print(f"  {m.id}: {'killed' if result.status == 'caught' else result.status} ({result.seconds:.0f} s)",
                  file=sys.stderr, flush=True)
            return result

        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda m: one(m, []), to_run))
        catchers = {t for r in results if r.status == "caught" for t in r.caught_by}
        broken = planted_faults.failing_on_clean(base, work, catchers, args.timeout)
        if broken:  # a test that fails without any mutant killed nothing: run those mutants again without it
            print(f"failing without any mutant: {', '.join(sorted(broken))}; rerunning", file=sys.stderr)
            again = [i for i, r in enumerate(results) if set(r.caught_by) & broken]
            by_slug = {m.slug: m for m in to_run}
            for i in again:
                results[i] = one(by_slug[results[i].fault["id"]], sorted(broken))
    text, reached = report(results, drawn, time.monotonic() - start, args.goal)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
