#!/usr/bin/env python
"""Gather the result.json files of many runs into one Markdown table.

    python scripts/table.py runs/foton-digits                 # test metric of the best-val model
    python scripts/table.py runs/foton-digits --value best_val --columns backprop,foton
    python scripts/table.py runs/highway-digits --plot k.png     # also a figure: metric per run

Rows are experiment folders, columns run names, cells mean ± std over seeds (count).
"""

from _entry import run

if __name__ == "__main__":
    run("table")
