"""The planted-fault list (trainers/engines/planted_faults.toml, run by scripts/maintenance/planted_faults.py,
CONTRIBUTING "Planted faults") stays current: every fault's edit still applies exactly once, so a code change that
makes one stale fails here, on every push, and not only when someone runs the long script; every engine has its
fault."""

import importlib.util
from pathlib import Path

from gradengines.trainers.core.registry import available

ROOT = Path(__file__).resolve().parents[1]


def planted_faults():
    spec = importlib.util.spec_from_file_location("planted_faults",
                                                  ROOT / "scripts" / "maintenance" / "planted_faults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_fault_still_applies_exactly_once_and_names_existing_tests():
    script = planted_faults()
    faults = script.load_faults()
    script.check_faults(ROOT, faults)  # raises naming each stale fault
    assert len(faults) >= 12


def test_every_engine_but_backprop_has_a_fault_that_makes_it_backprop():
    engines = {f["engine"] for f in planted_faults().load_faults() if f["id"].endswith("-is-backprop")}
    assert set(available()) - {"backprop", "highway"} <= engines  # highway's: highway-ignores-k (every path summed)
    assert any(f["id"] == "highway-ignores-k" for f in planted_faults().load_faults())
