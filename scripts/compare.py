#!/usr/bin/env python
"""Train several gradient engines on the same model, task and seeds, into one logdir.

    python scripts/compare.py                      # the default comparison on digits
    python scripts/compare.py --trainers backprop --model residual_mlp --seeds 0,1
"""

from _entry import run

if __name__ == "__main__":
    run("compare")
