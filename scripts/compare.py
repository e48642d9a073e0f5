#!/usr/bin/env python
"""Train several gradient engines on the same model, task and seeds, into one logdir.

    python scripts/compare.py                      # the default comparison on digits
    python scripts/compare.py --trainers backprop --model residual_mlp --seeds 0,1
"""

from trainers.cli import compare_main
from trainers.distributed import exit_process

if __name__ == "__main__":
    exit_process(compare_main())
