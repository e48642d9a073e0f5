#!/usr/bin/env python
"""Step time (median) and peak memory per trainer, as ratios to backprop; JSON + Markdown.

    python scripts/bench.py --suite overhead     # Trainer vs a hand-written loop
    python scripts/bench.py --suite engines --trainers backprop --depths 8,32 --widths 256,1024
"""

from _entry import run

if __name__ == "__main__":
    run("bench")
