"""Data parallel training under torchrun: 2 CPU ranks (gloo, loopback) against one process.

The tests launch real processes: ``torchrun --standalone`` runs the unchanged scripts/train.py
(a killed rank, a refusal, two nodes) and, in one job whose processes start once, the collectives
and every form of training as the scripts run them; the results are compared with a single
process that trains on the same global batch (float64).
"""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, train_signalled_at

from gradengines.trainers.cli import compare_main, train_main
from gradengines.trainers.core.distributed import DataParallel, _buckets

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
       "MASTER_ADDR": "127.0.0.1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TRAIN, COMPARE = str(ROOT / "scripts" / "train.py"), str(ROOT / "scripts" / "compare.py")
QUIET = ["--progress", "false", "--dtype", "float64"]


# hang guard: a job that outlives it fails the test saying so (not a claim about speed: it is minutes)
GUARD_S = 300


def torchrun(*args, check=True):
    """Run a script on 2 ranks; returns the CompletedProcess."""
    try:
        proc = subprocess.run([*TORCHRUN, *map(str, args)], env=ENV, capture_output=True, text=True, timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hang guard: torchrun {' '.join(map(str, args))} still running after {GUARD_S} s") \
            from None
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}")
    return proc


def records(run_dir):
    """metrics.jsonl without the timing and memory scalars (and the compute time, from the step timing)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "memory/", "compute_ms"))}
            for line in lines]


def assert_same_records(a, b, rel=1e-10):
    assert [r.keys() for r in a] == [r.keys() for r in b]
    for ra, rb in zip(a, b, strict=True):
        for key in ra:
            assert ra[key] == (None if rb[key] is None else pytest.approx(rb[key], rel=rel, abs=1e-12)), \
                (ra["step"], key)


def assert_same_weights(ckpt_a, ckpt_b, tol=1e-10):
    a = torch.load(ckpt_a, weights_only=False)["model"]
    b = torch.load(ckpt_b, weights_only=False)["model"]
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=tol, atol=tol, msg=name)


# copy task on a 2-layer GRU: losses at every step, so DSF and Highway-BP use their time paths;
# 51 training rows = 3 batches of 16 and one of 3 (2 rows on rank 0, 1 on rank 1), odd val/test sizes
RECURRENT = ["--model", "rnn_lm", "--cell", "gru", "--hidden", "8", "--depth", "2", "--task", "copy",
             "--vocab-size", "10", "--task-option", "length=3", "--task-option", "delay=4",
             "--task-option", "n_train=51", "--task-option", "n_val=13", "--task-option", "n_test=11",
             "--steps", "5", "--eval-every", "2", "--lr", "0.05", "--seeds", "0", "--grad-agreement-every", "0",
             "--highway-k", "2", "--dsf-feedback", "gate", "--dsf-refresh", "2"]
# FOTON on the orthogonal (Bjorck-projected) MLP of the default comparison, digits
ORTHOGONAL = ["--trainers", "foton", "--steps", "4", "--eval-every", "2", "--lr", "0.01", "--seeds", "0",
              "--grad-agreement-every", "0", "--epochs", "1"]


def test_collectives_and_every_form_of_training_on_two_ranks_equal_one_process(tmp_path, subtests):
    """One torchrun job (its processes pay their start once): the collectives (tests/distributed_worker.py), then
    each form of data-parallel training, every command as its script runs it, each checked against one process
    on the whole batch (float64): the recurrent comparison (Highway-BP and DSF on their time paths), FOTON's,
    the memory-mapped token file and a task factory's stream."""
    runs = two_rank_runs(tmp_path)
    commands = [[*map(str, argv), "--batch-size", str(batch), "--logdir", str(tmp_path / name / "two")]
                for name, (argv, batch) in runs.items()]
    proc = torchrun(ROOT / "tests" / "distributed_worker.py", json.dumps(commands))
    assert proc.stdout.strip().endswith("ok"), proc.stdout[-2000:]
    assert proc.stdout.count("| run | seeds |") == 2  # rank 0 prints each comparison's table, rank 1 nothing
    for name, (argv, batch) in runs.items():
        with subtests.test(name):
            CHECKS[name](tmp_path / name, [*map(str, argv), "--batch-size", str(2 * batch)])


# a task factory whose training data is a stream (an IterableDataset), for --task FILE.py:blobs
DATA_FACTORY = '''
import torch
from torch.utils.data import IterableDataset, TensorDataset


class Rows(IterableDataset):
    """Rows streamed in an order reshuffled by epoch."""

    def __init__(self, x, y):
        self.x, self.y, self.epoch = x, y, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(self.epoch))
        return ((self.x[i], self.y[i]) for i in order.tolist())


def blobs():
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(70) % 3
    x = torch.randn(70, 4, generator=gen) + 3 * torch.nn.functional.one_hot(y, 4).float()
    return {"train": Rows(x[:38], y[:38]), "val": TensorDataset(x[38:55], y[38:55]),
            "test": TensorDataset(x[55:], y[55:]), "num_outputs": 3}
'''


def two_rank_runs(tmp_path) -> dict[str, tuple[list, int]]:
    """The forms of training run on 2 ranks: name -> (the command's arguments, the batch of each rank)."""
    data = tmp_path / "bin"  # the token file: 58 windows of 6, 7 batches of 8 and one of 2
    data.mkdir()
    gen = torch.Generator().manual_seed(0)
    for name, size in (("train", 406), ("val", 90)):
        torch.randint(0, 23, (size,), generator=gen).to(torch.int32).numpy().astype("<u2").tofile(data / f"{name}.bin")
    (data / "meta.json").write_text(json.dumps({"vocab_size": 23, "dtype": "uint16"}))
    (tmp_path / "my_data.py").write_text(DATA_FACTORY)
    return {
        "recurrent": (["compare", *RECURRENT, "--trainers", "backprop,highway,dsf", *QUIET], 8),
        "foton": (["compare", *ORTHOGONAL, *QUIET], 8),
        "token file": (["train", "--task", "tokens", "--data-dir", data, "--task-option", "seq_len=6", "--model",
                        "gpt", "--depth", "1", "--width", "8", "--heads", "2", "--trainer", "highway", "--steps", "5",
                        "--eval-every", "2", *QUIET], 4),
        "stream": (["train", "--task", f"{tmp_path / 'my_data.py'}:blobs", "--model", "mlp", "--depth", "2",
                    "--width", "8", "--trainer", "fa", "--steps", "7", "--eval-every", "3", *QUIET], 4),
    }


def compared_as_one(logdir, argv):
    """compare.py on 2 ranks x batch b == one process x batch 2b (``argv``): weights to 1e-10, metrics to 1e-10,
    one TensorBoard writer, the same test result and best step; engines that differ were each compared."""
    engines = argv[argv.index("--trainers") + 1].split(",")
    assert compare_main([*argv[1:], "--logdir", str(logdir / "one")]) == 0
    experiment, = (p.name for p in (logdir / "one").iterdir() if p.is_dir())  # the same default name on 2 ranks
    for engine in engines:
        two, one = (logdir / side / experiment / engine / "seed0" for side in ("two", "one"))
        assert_same_weights(two / "checkpoint.pt", one / "checkpoint.pt")
        assert_same_records(records(two), records(one))
        writers = {f.name.rsplit(".", 2)[1] for f in two.glob("events.out.tfevents.*")}  # their pids
        assert len(writers) == 1  # one writer: rank 0
        r2, r1 = (json.loads((d / "result.json").read_text()) for d in (two, one))
        assert r2["test"] == pytest.approx(r1["test"], rel=1e-10)
        assert r2["best_step"] == r1["best_step"]
    assert (logdir / "two" / experiment / "summary.md").exists()
    if len(engines) > 1:  # the engines really differ here, so each one's own path was compared
        final = {e: torch.load(logdir / "one" / experiment / e / "seed0" / "checkpoint.pt",
                               weights_only=False)["model"] for e in engines}
        for e in engines[1:]:
            assert max((final[e][k] - final["backprop"][k]).abs().max() for k in final[e]) > 1e-6, e


def trained_as_one(logdir, argv):
    """train.py on 2 ranks x batch b == one process x batch 2b (``argv``): the same weights and records; returns
    the one process's records."""
    assert train_main([*argv[1:], "--logdir", str(logdir / "one")]) == 0
    trainer = argv[argv.index("--trainer") + 1]
    one, = (logdir / "one").glob(f"*/{trainer}/seed0")
    two = logdir / "two" / one.relative_to(logdir / "one")
    assert_same_weights(two / "checkpoint.pt", one / "checkpoint.pt")
    assert_same_records(records(two), records(one))
    return records(one)


def streamed_as_one(logdir, argv):
    """A stream read pass after pass (each rank reads every item and keeps its rows): as one process; a stream's
    batches are all full, with no length and no epochs."""
    last = trained_as_one(logdir, argv)[-1]
    assert (last["samples"], last["epoch"]) == (56, None)


CHECKS = {"recurrent": compared_as_one, "foton": compared_as_one, "token file": trained_as_one,
          "stream": streamed_as_one}


# rank 1 is killed or stopped after STOP_AT of STEPS steps (conftest.train_signalled_at)
STOP_AT, STEPS = 6, 12
SLOW = ["--task", "teacher", "--task-option", "n_train=256", "--task-option", "in_features=16", "--width", "16",
        "--depth", "3", "--steps", str(STEPS), "--checkpoint-every", "1", "--eval-every", "4", "--log-every", "2",
        "--experiment", "e", *QUIET]

def ended(proc: subprocess.Popen, what: str) -> str:
    """``proc``'s stderr once it has exited; fails the test (naming ``what``) if it runs past the hang guard."""
    try:
        return proc.communicate(timeout=GUARD_S)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"hang guard: {what} still running after {GUARD_S} s") from None


def test_killed_rank_stops_the_job_and_its_checkpoint_resumes_on_one_process(tmp_path):
    """SIGKILL rank 1 of 2 mid-run: torchrun stops the job (not rank 0's collective timeout, set to an hour here)
    and exits non-zero naming the signal; the checkpoint loads, and resuming it on one process with the same
    global batch ends with the metrics of an uninterrupted run."""
    run = tmp_path / "killed" / "e" / "backprop" / "seed0"
    script = train_signalled_at(tmp_path, STOP_AT, "SIGKILL", rank=1)
    proc = subprocess.Popen([*TORCHRUN, script, *SLOW, "--batch-size", "16", "--dist-timeout", "3600", "--logdir",
                             str(tmp_path / "killed")], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    err = ended(proc, "torchrun after its rank 1 was killed (rank 0 waits an hour for it by --dist-timeout)")
    assert proc.returncode != 0, err[-2000:]
    assert "Signal 9 (SIGKILL)" in err, err[-2000:]  # torchrun's report names the killed rank's signal
    state = torch.load(run / "checkpoint.pt", weights_only=False)  # a whole file
    # rank 0 saves step STOP_AT's checkpoint unless torchrun stops it first (it had saved the one before)
    assert STOP_AT - 1 <= state["step"] <= STOP_AT and state["world_size"] == 2 and state["global_batch"] == 32

    # the global batch must stay 32: --batch-size 16 on one process is refused in one line
    assert train_main([*SLOW, "--batch-size", "16", "--logdir", str(tmp_path / "killed"), "--resume"]) == 2
    assert train_main([*SLOW, "--batch-size", "32", "--logdir", str(tmp_path / "killed"), "--resume"]) == 0
    assert train_main([*SLOW, "--batch-size", "32", "--logdir", str(tmp_path / "whole")]) == 0
    whole = tmp_path / "whole" / "e" / "backprop" / "seed0"
    assert_same_records(records(run), records(whole))
    assert_same_weights(run / "checkpoint.pt", whole / "checkpoint.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hung_rank_stops_the_others_within_the_timeout(tmp_path):
    """Rank 1 stopped (SIGSTOP, alive but silent) mid-run: rank 0's collective gives up at --dist-timeout with one
    clear line and exit code 1 while rank 1 is still stopped; its last checkpoint loads."""
    env = {**ENV, "WORLD_SIZE": "2", "MASTER_PORT": str(_free_port())}
    script = train_signalled_at(tmp_path, STOP_AT, "SIGSTOP", rank=1)
    cmd = [sys.executable, script, *SLOW, "--batch-size", "16", "--dist-timeout", "3", "--logdir", str(tmp_path)]
    procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        err = ended(procs[0], "rank 0 beside a stopped rank 1 (--dist-timeout 3)")
        # rank 1 never woke: rank 0 ended by its own timeout, not because its peer went away
        with open(f"/proc/{procs[1].pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]  # proc(5): T, stopped by a signal
        assert procs[1].poll() is None and state == "T", state
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].returncode == 1, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "another rank died or hangs" in lines[0] and "checkpoint" in lines[0], err[-2000:]
    assert "Timed out waiting 3000ms" in lines[0], lines[0]  # gloo's words: --dist-timeout 3 is what ended it
    assert torch.load(tmp_path / "e" / "backprop" / "seed0" / "checkpoint.pt", weights_only=False)["step"] == STOP_AT


def test_rank_0_refusal_reaches_every_rank(tmp_path):
    """A run directory that already holds a run: rank 0 refuses, and the job ends at once (no rank
    waits for the timeout); nothing is overwritten."""
    flags = ["--task", "teacher", "--steps", "2", "--batch-size", "8", *QUIET, "--logdir", str(tmp_path)]
    assert train_main(flags) == 0  # the run already there (written by one process: the refusal is the point)
    metrics = next(tmp_path.rglob("metrics.jsonl"))
    before = metrics.read_text()
    proc = torchrun(TRAIN, *flags, "--dist-timeout", "3600", check=False)  # ended, so no rank waited an hour
    assert proc.returncode != 0
    assert "already holds a run; --resume continues it" in proc.stderr
    assert metrics.read_text() == before


def test_one_process_is_one_rank_and_buckets_split_by_size_and_dtype():
    here = DataParallel()
    assert (here.rank, here.world_size, here.is_main, here.active) == (0, 1, True, False)
    rows = torch.arange(5)
    assert here.shard(rows) is rows
    assert here.sums([1.5, 2.0]) == [1.5, 2.0]
    p = [torch.nn.Parameter(torch.zeros(n, dtype=dt)) for n, dt in
         ((10, torch.float32), (10, torch.float32), (300, torch.float32), (4, torch.float64), (4, torch.float32))]
    sizes = [[q.numel() for q in b] for b in _buckets(p, limit=100)]
    assert sizes == [[10, 10], [300], [4], [4]]


def test_two_machines_meet_at_a_rendezvous_endpoint(tmp_path):
    """The README's multi-node command, both 'machines' on loopback: torchrun --nnodes 2 with a c10d
    rendezvous, one process each, trains the weights of one process with the same global batch."""
    endpoint = f"127.0.0.1:{_free_port()}"
    flags = ["--task", "teacher", "--steps", "4", "--eval-every", "2", "--experiment", "e", *QUIET]
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "test", TRAIN, *flags,
            "--batch-size", "8", "--logdir", str(tmp_path / "two")]
    nodes = [subprocess.Popen(node, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for proc in nodes:
        err = ended(proc, "a torchrun node")
        assert proc.returncode == 0, err[-2000:]
    assert train_main([*flags, "--batch-size", "16", "--logdir", str(tmp_path / "one")]) == 0
    two, one = (tmp_path / side / "e" / "backprop" / "seed0" for side in ("two", "one"))
    assert torch.load(two / "checkpoint.pt", weights_only=False)["world_size"] == 2
    assert_same_weights(two / "checkpoint.pt", one / "checkpoint.pt")
    assert_same_records(records(two), records(one))


@pytest.mark.parametrize("flags, message", [
    (["--dist-timeout", "0"], "--dist-timeout must be a finite number of seconds > 0"),
    (["--dist-backend", "nccl"], "the nccl backend needs --device cuda"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "cuda:99"], "CUDA"),
    (["--device", "tpu9"], "is not a torch device"),
])
def test_bad_launch_options_exit_2_in_one_line(monkeypatch, capsys, flags, message):
    """Under a launcher (RANK and WORLD_SIZE set), bad backend, timeout or device flags are refused
    before any process group is joined."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert train_main(["--task", "teacher", "--steps", "1", "--progress", "false", "--logdir", "unused", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not torch.distributed.is_initialized()
