"""scripts/benchmarks/gpu_rows.py, the GPU rows of BENCHMARKS.md in one run, works before a GPU is lent: its dry run
(the same bench commands at tiny sizes on the CPU) writes every table it promises."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RESIDUAL = ["backprop"] + [f"highway:k={k},path={path}" for path in ("batched", "reference") for k in (0, 5, 10)]
TABLES = {  # in the order the script runs them (on a GPU each highway table also comes in tf32)
    "highway_gru_fp32_T8": ["backprop", "bptt_loop", "highway:k=0", "highway:k=5", "highway:k=10"],
    "highway_residual_fp32": RESIDUAL,
    "engines_bjorck": ["backprop", "foton"],
    "engines_retraction": ["backprop", "foton"],
    "upkeep": ["backprop"] * 3 + ["foton"] * 3,
    "grads_ortho_lenet": ["backprop", "fa", "dfa", "foton", "pepita"],
    "upkeep_optimizers": None,  # backprop under each optimizer and upkeep (geoopt's where it is installed)
    "grads_foton_b4": ["backprop", "foton", "bare forward-only pass"],
}

def test_dry_run_writes_every_table(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmarks" / "gpu_rows.py"), str(tmp_path),
                           "--dry-run"], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for table, trainers in TABLES.items():
        record = json.loads((tmp_path / table / "bench.json").read_text())
        if trainers is None:
            from gradengines.trainers.bench.upkeep import CANDIDATES, OPTIMIZERS
            pairs = {(row["optimizer"], row["upkeep"]) for row in record["rows"]}
            assert {(o, c) for o in OPTIMIZERS for c in CANDIDATES if c != "geoopt"} <= pairs, table
        else:
            assert [row["trainer"] for row in record["rows"]] == trainers, table
        assert all(row.get("step_ms", row.get("grads_ms")) > 0 for row in record["rows"]), table  # grads: grads_ms
        assert record["threads"]["count"] >= 1 and "--device cpu" in record["command"]
    timed = [line.split()[0] for line in (tmp_path / "times.txt").read_text().splitlines()]
    assert timed == [*TABLES, "precision_compile"]
    rows = (tmp_path / "precision_compile.md").read_text()
    for configuration in ("32", "bf16-mixed", "32, compiled (aot_eager)"):
        assert f"| gpt | backprop | {configuration} | " in rows, rows
