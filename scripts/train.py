#!/usr/bin/env python
"""Train one zoo model on one task with one gradient engine.

    python scripts/train.py --trainer backprop --model mlp --task digits --epochs 20
    python scripts/train.py --help      # lists trainers, models and tasks
"""

from trainers.cli import train_main
from trainers.distributed import exit_process

if __name__ == "__main__":
    exit_process(train_main())
