"""Thread count per process (trainers/core/threads.py): the auto rule, its inputs, precedence, the flag."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gradengines import models, tasks, trainers
from gradengines.trainers.cli import bench_main, train_main
from gradengines.trainers.core import threads
from gradengines.trainers.core.errors import ConfigError


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("cores, busy, ranks, expected", [
    (2, 0.0, 1, 2),    # idle: every core
    (2, 1.0, 1, 1),    # one busy process beside us on 2 cores
    (2, 1.9, 1, 1),    # fully loaded: still one thread
    (2, 0.3, 1, 2),    # background noise rounds away
    (2, 0.7, 1, 2),    # a brief spike is not a busy core
    (2, 0.8, 1, 1),
    (16, 3.2, 1, 13),
    (16, 0.0, 4, 4),   # four torchrun ranks share the machine
    (2, 0.0, 4, 1),    # more ranks than cores: one each
])
def test_auto_rule_takes_the_cores_nobody_else_uses(cores, busy, ranks, expected):
    assert threads.choose_threads(cores, busy, ranks) == expected


def test_a_spike_in_one_probe_does_not_take_a_thread(monkeypatch, restore_threads):
    """auto reads the smaller of its probes: a burst seen by one (a compiler, a cron job) leaves both cores; a
    process busy in both takes one."""
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    for probes, expected in (([1.0, 0.0], 2), ([0.0, 1.0], 2), ([1.0, 0.95], 1)):
        readings = iter(probes)
        monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda window=0.1, r=readings: next(r))
        assert threads.set_threads(None).count == expected, probes


def test_proc_stat_and_cgroup_quota_are_read_as_documented():
    # user nice system idle iowait irq softirq steal guest guest_nice
    busy, total = threads._cpu_times("cpu  100 5 20 800 10 1 2 3 0 0\ncpu0 ...\n")
    assert (busy, total) == (131, 941)
    assert threads._quota_cores("200000 100000\n") == 2.0
    assert threads._quota_cores("max 100000\n") is None
    assert threads.usable_cores() >= 1


def _jiffies(pid: int | str) -> int:
    """CPU time (user + system) of process ``pid`` in jiffies (proc(5): fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_probe_counts_the_cpu_time_of_a_spinning_child(monkeypatch):
    """The probe's reading includes a spinning child's CPU time, read from the child's own /proc/<pid>/stat at the
    probe's two reads: whatever else runs on the machine, busy >= the child's share (to 0.1 core). A window in
    which a loaded machine gave the child under 5 jiffies proves little and is measured again."""
    child = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"],
                             stdout=subprocess.PIPE, text=True)
    seen = []  # (the child's jiffies, the machine's total jiffies) at each of the probe's reads
    real_own = threads._own_jiffies

    def own_jiffies_and_child():
        with open("/proc/stat") as f:
            seen.append((_jiffies(child.pid), threads._cpu_times(f.read())[1]))
        return real_own()
    monkeypatch.setattr(threads, "_own_jiffies", own_jiffies_and_child)
    try:
        assert child.stdout.readline().strip() == "ready"
        for _ in range(5):
            seen.clear()
            busy = threads.busy_cores_elsewhere(window=0.5)
            (child0, total0), (child1, total1) = seen
            if child1 - child0 >= 5:
                break
        else:
            raise AssertionError(f"the spinning child got {child1 - child0} jiffies in 5 windows of 0.5 s")
    finally:
        child.kill()
        child.wait()
    child_cores = (child1 - child0) / (total1 - total0) * (os.cpu_count() or 1)
    assert busy >= child_cores - 0.1, (busy, child_cores)


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5", ""])
def test_bad_thread_counts_are_refused(text):
    with pytest.raises(ConfigError, match="--threads must be a positive number of threads or 'auto'"):
        threads.parse_threads(text)


def test_flag_beats_environment_beats_omp(monkeypatch, restore_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv(threads.THREADS_ENV, "2")
    assert threads.set_threads("1") == (1, "--threads") and torch.get_num_threads() == 1
    assert threads.set_threads(None) == (2, threads.THREADS_ENV) and torch.get_num_threads() == 2
    monkeypatch.delenv(threads.THREADS_ENV)
    assert threads.set_threads("auto") == (3, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda window=0.1: 0.0)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    choice = threads.set_threads(None)
    assert choice.count == 2 and choice.reason.startswith("auto: 2 usable cores") and threads.last_choice() == choice
    monkeypatch.setenv(threads.THREADS_ENV, "many")
    with pytest.raises(ConfigError, match=threads.THREADS_ENV):
        threads.set_threads(None)


def test_commands_take_the_flag_and_bench_records_it(tmp_path, capsys, restore_threads):
    code = train_main(["--threads", "0", "--logdir", str(tmp_path / "runs"), "--steps", "1", "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--threads must be a positive number" in err
    assert not (tmp_path / "runs").exists()
    out = tmp_path / "bench"
    assert bench_main(["--suite", "scan", "--lengths", "8", "--hidden", "4", "--recurrent-batch-size", "2",
                       "--steps", "20", "--threads", "1", "--out", str(out)]) == 0
    record = json.loads((out / "bench.json").read_text())
    assert record["threads"] == {"count": 1, "reason": "--threads"} and torch.get_num_threads() == 1
    assert "Threads: 1 (--threads)" in (out / "bench.md").read_text()
    assert train_main(["--threads", "1", "--logdir", str(tmp_path / "runs"), "--steps", "1", "--progress", "false",
                       "--experiment", "e"]) == 0
    record = json.loads((tmp_path / "runs" / "e" / "backprop" / "seed0" / "result.json").read_text())
    assert record["threads"] == {"count": 1, "reason": "--threads"}  # the run says what it ran with


def test_more_threads_than_cores_are_taken_with_a_note(monkeypatch, capsys, restore_threads):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    assert threads.set_threads("3").count == 3 and torch.get_num_threads() == 3
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: 3 CPU threads asked (--threads) where this process may use 2 cores: threads beyond the "
                   "cores wait for each other (README: On a busy machine); --threads 2 uses them all"]
    threads.set_threads("2")
    assert capsys.readouterr().err == ""


# the Python API's calls that choose threads: a Trainer's fit and an engine's compute_grads
API_CALLS = """
task = tasks.build("teacher", in_features=8, num_classes=3, n_train=64, n_val=16, n_test=16, hidden=8)
model = models.build("mlp", in_features=8, out_features=3, depth=2, width=8)
trainers.Trainer(model, trainers.build_engine("backprop"), task, progress=False, batch_size=16).fit(steps=3)
trainers.build_engine("fa").compute_grads(model, task.train.inputs[:4], task.train.targets[:4], task.loss_fn)
"""
API_RUN = """
import sys, torch
sys.path[:0] = [{root!r}]
from gradengines import models, tasks, trainers
""" + API_CALLS + """
print(torch.get_num_threads())
"""


def api_run_beside_a_busy_core() -> tuple[int, list[str]]:
    """The Python API in a fresh process whose environment fixes no thread count (the suite's does), beside a
    spinning child that has said it spins: (torch's threads after, the stderr lines)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", threads.THREADS_ENV)}
    child = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"  # spinning before the probe starts
        root = str(Path(__file__).resolve().parents[1])
        done = subprocess.run([sys.executable, "-c", API_RUN.format(root=root)], env=environ,
                              capture_output=True, text=True, timeout=300)
    finally:
        child.kill()
        child.wait()
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1]), [line for line in done.stderr.splitlines() if "CPU thread" in line]


def test_the_python_api_chooses_threads_as_the_command_line_and_says_it_once():
    count, said = api_run_beside_a_busy_core()
    cores = threads.usable_cores()
    assert len(said) == 1 and "auto: " in said[0] and "gradengines.set_threads(N)" in said[0]
    assert 1 <= count <= max(1, cores - 1)  # the spinning child's core is left to it (others may be busy too)


@pytest.mark.parametrize("before, env", [(True, {}), (False, {threads.THREADS_ENV: "1"}),
                                         (False, {"OMP_NUM_THREADS": "1"})], ids=["set_threads", "env", "omp"])
def test_a_choice_made_before_the_api_is_kept_without_a_word(before, env, monkeypatch, capsys, restore_threads):
    """As in a process that has chosen nothing yet (the test above runs one): a choice made before the Python API
    (``set_threads``, GRADENGINES_THREADS, OMP_NUM_THREADS) is the API's, and nothing is said; the auto rule would
    have said its line."""
    for name in ("OMP_NUM_THREADS", threads.THREADS_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(threads, "_CHOSEN", [])
    torch.set_num_threads(2)  # torch's own count is not the choice
    if before:
        trainers.set_threads(1)
    exec(API_CALLS, {"models": models, "tasks": tasks, "trainers": trainers})
    assert torch.get_num_threads() == 1
    assert [line for line in capsys.readouterr().err.splitlines() if "CPU thread" in line] == []
