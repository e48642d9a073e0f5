import os
import sys
from pathlib import Path

# Tests import the packages from the checkout even when it is not installed,
# and the engine contract suite from this folder.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("MPLBACKEND", "Agg")
