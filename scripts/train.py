#!/usr/bin/env python
"""Train one zoo model on one task with one gradient engine.

    python scripts/train.py --trainer backprop --model mlp --task digits --epochs 20
    python scripts/train.py --help      # lists trainers, models and tasks
"""

import sys

from trainers.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
