#!/usr/bin/env python
"""Train one zoo model on one task with one gradient engine.

    python scripts/train.py --trainer backprop --model mlp --task digits --epochs 20
    python scripts/train.py --help      # lists trainers, models and tasks
"""

from _entry import run

if __name__ == "__main__":
    run("train")
