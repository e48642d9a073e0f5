import os
import sys
from pathlib import Path

import pytest

# Tests import the packages from the checkout even when it is not installed,
# and the engine contract suite from this folder.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


class _FoldersAreNotPackages:
    """The folders trainers/, models/ and tasks/ are ``gradengines.trainers``, ... (one import name): with the
    checkout on the path their old top-level names would still import here and nowhere else, so a README snippet
    or a test that used them would pass here and fail for users. Here they fail as they do for users."""

    def find_spec(self, name, path=None, target=None):
        if path is None and name in ("trainers", "models", "tasks"):
            raise ModuleNotFoundError(f"No module named '{name}' (this checkout's {name}/ is gradengines.{name})")
        return None


sys.meta_path.insert(0, _FoldersAreNotPackages())
os.environ.setdefault("MPLBACKEND", "Agg")
# One CPU thread per process, for this process and every command a test starts (trainers/core/threads.py):
# the suite's tensors are small, so one thread is as fast as two idle, and beside another busy process
# it does not spin waiting for a core (BENCHMARKS.md, "Threads on a busy machine"). Set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set (it is on this project's VMs): the suite
# starts about a hundred processes that import the same project modules, and each would compile them again
# (BENCHMARKS.md, "The test suite's time"). The caches land in the checkout's __pycache__ folders (git ignores them).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


#: The suite's slowest tests (``pytest --durations=30``: the ones that start processes, install the package or run
#: every README command), started first: a worker that picked one up last would finish the suite alone on it, with
#: the other cores idle (longest first is the classic remedy). The rest keep their order.
SLOW_FIRST = (
    "test_gpu_rows.py::test_dry_run_writes_every_table",
    "test_user_models.py::test_the_installed_package_runs_its_console_commands_from_another_directory",
    "test_user_recurrent.py::test_the_command_line_wraps_a_users_recurrent_model_for_dsf",
    "test_readme_examples.py::test_readme_commands_run_top_to_bottom_in_one_folder",
    "test_cli.py::test_default_compare_writes_runs_tags_table_and_png",
    "test_failures.py::test_two_processes_started_together_on_one_run_directory",
    "test_failures.py::test_failures_through_a_real_process",
    "test_compile.py::test_an_engine_that_fails_compiled_is_refused_and_one_that_runs_its_blocks_is_told",
    "test_replicas.py::test_ddp_replicas_of_every_engine_and_the_hf_trainer_s_ddp_equal_one_process",
    "test_long_runs.py::test_sigterm_in_the_timing_phase_leaves_a_comparison_that_resumes",
    "test_threads.py::test_the_python_api_chooses_threads_as_the_command_line_and_says_it_once",
    "test_distributed.py::test_collectives_and_every_form_of_training_on_two_ranks_equal_one_process",
)


def pytest_collection_modifyitems(config, items):
    order = {name: rank for rank, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: order.get(item.nodeid.rpartition("/")[2].partition("[")[0], len(order)))


def pytest_xdist_auto_num_workers(config):
    """``pytest -n auto`` (pytest-xdist): one worker per core this process may use by the project's own count
    (CPU affinity capped by a cgroup quota, trainers/core/threads.py), where xdist's own would count the physical
    cores of the whole machine once psutil is installed; PYTEST_XDIST_AUTO_NUM_WORKERS still decides if set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from gradengines.trainers.core.threads import usable_cores

    return usable_cores()

# scripts/train.py in a process that signals itself at the start of the update after ``step`` steps (the Trainer's
# step counter; on rank ``rank`` only, under a launcher): a kill, stop or SIGTERM lands mid-run by construction,
# whatever the machine's speed, where waiting for a checkpoint and signalling from outside races a run that may
# have finished first. Run the script it writes as scripts/train.py (its flags follow).
SIGNALLED_TRAIN = """
import os, runpy, signal, sys
from gradengines.trainers.run import trainer
real = trainer.Trainer.train_step
def train_step(self, x, y):
    if self.step == {step} and os.environ.get("RANK", "0") == "{rank}":
        os.kill(os.getpid(), signal.{signal})
    return real(self, x, y)
trainer.Trainer.train_step = train_step
sys.argv[0] = {train!r}
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def train_signalled_at(folder: Path, step: int, signal_name: str, rank: int = 0) -> str:
    """Write (into ``folder``) a train script whose rank ``rank`` sends itself ``signal_name`` ("SIGKILL",
    "SIGSTOP", "SIGTERM") once ``step`` steps are done; its path."""
    script = folder / f"train_{signal_name.lower()}_at_{step}.py"
    script.write_text(SIGNALLED_TRAIN.format(step=step, rank=rank, signal=signal_name,
                                             train=str(ROOT / "scripts" / "train.py")))
    return str(script)


@pytest.fixture(autouse=True)
def _engines_a_test_registers_are_forgotten(monkeypatch):
    """An engine a test registers (``register_engine``, a ``FILE.py:Class`` on a command line) is gone after it:
    the worker's later tests list the built-ins only (a default comparison trains every engine it lists)."""
    from gradengines.trainers.core import registry

    registry.available()  # installed plugins read once, before the copies
    monkeypatch.setattr(registry, "_ENGINES", dict(registry._ENGINES))
    monkeypatch.setattr(registry, "_ORIGINS", dict(registry._ORIGINS))


@pytest.fixture(autouse=True)
def _comparisons_time_at_their_own_thread_count(monkeypatch):
    """A comparison run in a test times its steps at its own thread count only: the second count (the
    equal-compute margin's, trainers.experiments.step_timing.other_threads) reads the machine's load, which a
    test cannot fix; the tests of that second timing ask for it."""
    monkeypatch.setattr("gradengines.trainers.experiments.compare.other_threads", lambda device: None)


@pytest.fixture(autouse=True)
def _figures_built_not_rendered(request, monkeypatch):
    """A figure a test's command makes is built (every panel, curve, legend and heatmap of its data) but not
    rendered: matplotlib's layout, drawing and PNG encoding were about 60 s of the suite's CPU time in some forty
    comparisons that never look at the picture (BENCHMARKS.md, "The test suite's time"). A test that reads a PNG
    is marked ``renders_figures``; tests/test_plots.py checks the drawn layout itself."""
    if request.node.get_closest_marker("renders_figures") is None:
        import matplotlib.figure

        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *args, **kwargs: None)


@pytest.fixture(autouse=True)
def _callers_data_guarded(request, monkeypatch):
    """In every test, every call of an entry point that runs a user's model its own way (each engine's
    ``compute_grads`` and ``prepare``, ``residual_stack``, ``check_task_model``, ``gradient_agreement``) fails if
    it writes the caller's data, the model's parameters or buffers its own forward does not update
    (``tests/caller_data.py``; a few seconds of the suite's CPU time in all). A test marked ``unguarded`` (a contrast,
    which plants the fault the guard is for) runs without it."""
    from caller_data import guard_entry_points

    if request.node.get_closest_marker("unguarded") is None:
        guard_entry_points(monkeypatch)
