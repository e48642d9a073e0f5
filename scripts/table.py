#!/usr/bin/env python
"""Gather the result.json files of many runs into one Markdown table.

    python scripts/table.py runs/foton-digits                 # test metric of the best-val model
    python scripts/table.py runs/foton-digits --value best_val --columns backprop,foton
    python scripts/table.py runs/highway-digits --plot k.png     # also a figure: metric per run

Rows are experiment folders, columns run names, cells mean ± std over seeds (count).
"""

import argparse
import sys

from trainers.cli import OneLineParser
from trainers.compare import collect_results, pivot_cells, pivot_table

if __name__ == "__main__":
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root")
    parser.add_argument("--value", choices=["test", "best_val", "final_val"], default="test")
    parser.add_argument("--columns", default=None, help="comma list of run names, in order")
    parser.add_argument("--plot", default=None, help="also write a PNG: one panel per experiment, metric per run")
    args = parser.parse_args()
    rows = collect_results(args.root)
    if not rows:
        print(f"error: no result.json below {args.root}", file=sys.stderr)
        sys.exit(2)
    columns = args.columns.split(",") if args.columns else None
    print(pivot_table(rows, value=args.value, columns=columns), end="")
    if args.plot:
        from trainers.plots import plot_runs

        cells, experiments, runs = pivot_cells(rows, value=args.value, columns=columns)
        plot_runs(cells, experiments, runs, f"{args.value} {rows[0]['metric']}", args.plot)
        print(f"figure: {args.plot}")
