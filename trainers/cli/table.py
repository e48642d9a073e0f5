"""``table``: a Markdown table (and a figure) of finished runs' results (``scripts/table.py``,
``gradengines table``)."""

from pathlib import Path

from gradengines.trainers.cli.args import OneLineParser
from gradengines.trainers.cli.process import run_cli
from gradengines.trainers.core.errors import DataError
from gradengines.trainers.run.records import read_records

__all__ = ["table_main"]


VALUES = {"test": "test", "best_val": "best validation", "final_val": "final validation"}  # --value: its words


def table_main(argv=None, prog: str | None = None) -> int:
    """``scripts/table.py``: the result.json files below a folder as one Markdown table (and a figure)."""
    from gradengines.trainers.experiments.results import collect_results, pivot_cells
    from gradengines.trainers.experiments.summary import pivot_table

    parser = OneLineParser(prog=prog, description="Gather the result.json files of many runs into one Markdown "
                                                  "table: rows are experiment folders, columns run names, cells "
                                                  "mean ± std over seeds (count).")
    parser.add_argument("root")
    parser.add_argument("--value", choices=list(VALUES), default="test",
                        help="which metric of each run: test (of the best validation model), best_val or final_val")
    parser.add_argument("--columns", default=None, help="comma list of run names, in order")
    parser.add_argument("--plot", default=None, help="also write a PNG: one panel per experiment, metric per run")
    args = parser.parse_args(argv)

    def main():
        rows = collect_results(args.root)
        if not rows:
            raise DataError(_nothing_to_table(args.root))
        columns = args.columns.split(",") if args.columns else None
        metrics = ", ".join(dict.fromkeys(r["metric"] for r in rows))
        print(f"{VALUES[args.value]} {metrics}: mean ± std over seeds (seeds)\n")
        print(pivot_table(rows, value=args.value, columns=columns), end="")
        if args.plot:
            from gradengines.trainers.experiments.plots import plot_runs

            cells, experiments, runs = pivot_cells(rows, value=args.value, columns=columns)
            plot_runs(cells, experiments, runs, f"{args.value} {rows[0]['metric']}", args.plot)
            print(f"figure: {args.plot}")

    return run_cli(main)


def _nothing_to_table(root) -> str:
    """Why no row came from ``root``: no result.json at all, none readable (each was noted), or only tuning trials'."""
    if not Path(root).exists():
        return (f"{root} does not exist: table.py reads the runs that scripts/compare.py and scripts/train.py write "
                f"(under their --logdir, default runs/); run them first, or point at the folder they wrote")
    paths = sorted(Path(root).rglob("result.json"))
    if not paths:
        return f"no result.json below {root} (the runs of scripts/compare.py or scripts/train.py write one each)"
    found = f"found {len(paths)} result.json file{'s' if len(paths) > 1 else ''} below {root}"
    if not read_records(paths):  # read once already: the damaged ones were named then, and are not again
        return f"{found}, but none could be read (each is named above); rerun those runs, or point at another folder"
    return f"{found}, only of tuning trials, which the table leaves out; point at a folder of comparisons or " \
           f"training runs"
