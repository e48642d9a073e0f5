#!/usr/bin/env python
"""Step time (median) and peak memory per trainer, as ratios to backprop; JSON + Markdown.

    python scripts/bench.py --suite overhead     # Trainer vs a hand-written loop
    python scripts/bench.py --suite engines --trainers backprop --depths 8,32 --widths 256,1024
"""

import sys

from trainers.cli import bench_main

if __name__ == "__main__":
    sys.exit(bench_main())
