import os
import sys
from pathlib import Path

# Tests import the packages from the checkout even when it is not installed,
# and the engine contract suite from this folder.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("MPLBACKEND", "Agg")
# One CPU thread per process, for this process and every command a test starts (trainers/core/threads.py):
# the suite's tensors are small, so one thread is as fast as two idle, and beside another busy process
# it does not spin waiting for a core (BENCHMARKS.md, "Threads on a busy machine"). Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
