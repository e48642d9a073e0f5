"""Models wrapped in DistributedDataParallel (issue 49): whoever wrapped the model, an engine's gradients are
averaged over the replicas exactly once (``trainers/core/replicas.py``), and sharded models are refused.

Two gloo processes (torchrun) each hand their half of a batch to ``engine.compute_grads(DDP(model), ...)``, then
train through the Hugging Face Trainer's own DDP; one process computes the same on the whole batch (float64)."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from torch import nn

from gradengines import models, tasks, trainers
from gradengines.trainers.core.replicas import unwrap

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built")

ENGINES = {"backprop": "mlp", "fa": "mlp", "dfa": "mlp", "highway": "residual_mlp"}

SCRIPT = '''
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, sys.argv[2])
from gradengines import models, tasks, trainers
from gradengines.trainers.core.errors import IncompatibleModelError

dist.init_process_group("gloo")
rank, out = dist.get_rank(), sys.argv[1]
grads = {{}}
for engine, zoo in {engines}.items():
    torch.manual_seed(0)
    model = models.build(zoo, in_features=6, out_features=3, depth=2, width=8).double()
    x, y = {batch}
    wrapped = DistributedDataParallel(model)
    trainers.build_engine(engine).compute_grads(wrapped, x[rank::2], y[rank::2], tasks.base.cross_entropy_loss)
    grads[engine] = {{name: p.grad.clone() for name, p in model.named_parameters()}}
torch.save(grads, f"{{out}}/rank{{rank}}.pt")
from torch.distributed.fsdp import fully_shard
sharded = fully_shard(models.build("mlp", in_features=6, out_features=3, depth=2, width=8))
try:
    trainers.build_engine("backprop").compute_grads(sharded, x[:2], y[:2], tasks.base.cross_entropy_loss)
    refusal = "accepted"
except IncompatibleModelError as err:
    refusal = str(err)
if rank == 0:
    open(f"{{out}}/refusal.txt", "w").write(refusal)
if {hf}:  # the Hugging Face Trainer's own DDP, in the same processes (hf_ddp.py)
    sys.path.insert(0, out)
    import hf_ddp
    hf_ddp.main(out)
# Without this a rank that ends first may abort in gloo's teardown ("terminate called without an active
# exception", SIGABRT: PyTorch issue #190489); the HF Trainer leaves the process group to the script.
dist.barrier()
dist.destroy_process_group()
'''


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=gen, dtype=torch.float64), torch.randint(0, 3, (8,), generator=gen)


def one_process_grads(engine, zoo, x, y):
    torch.manual_seed(0)
    model = models.build(zoo, in_features=6, out_features=3, depth=2, width=8).double()
    trainers.build_engine(engine).compute_grads(model, x, y, tasks.base.cross_entropy_loss)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_a_one_process_wrapper_is_its_module_and_the_trainer_trains_the_module():
    """nn.DataParallel (one process) and DDP in a one-rank group are unwrapped to the module: the same gradients
    as the module itself; the Trainer given a wrapped model trains the module's Parameters in place."""
    model = models.build("mlp", in_features=6, out_features=3, depth=2, width=8).double()
    assert unwrap(nn.DataParallel(model)) == (model, None)
    x, y = batch()
    engine = trainers.build_engine("backprop")
    engine.compute_grads(nn.DataParallel(model), x, y, tasks.base.cross_entropy_loss)
    wrapped = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    engine.compute_grads(model, x, y, tasks.base.cross_entropy_loss)
    assert all(torch.equal(wrapped[n], p.grad) for n, p in model.named_parameters())


HF_SCRIPT = '''
import os

import torch
import transformers
from torch.utils.data import SequentialSampler

from gradengines.trainers.loops.hf import EngineTrainer


class InOrder(EngineTrainer):
    """Batches in order (the Trainer shards them by rank): one process's batch of 4 is the two ranks' of 2."""

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)


def train(out, batch, engine):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=17, n_positions=8, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).double()
    ids = torch.randint(0, 17, (24, 8), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row.clone()} for row in ids]
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=batch, max_steps=3,
                                          learning_rate=5e-3, report_to="none", use_cpu=True, seed=0,
                                          save_strategy="no", disable_tqdm=True,
                                          ddp_backend="gloo" if ranks > 1 else None)
    trainer = InOrder(model=model, args=args, train_dataset=data, engine=engine)
    trainer.train()
    wrapped = type(trainer.model_wrapped).__name__
    return {n: p.detach().clone() for n, p in model.named_parameters()}, wrapped


def main(out):
    """On each of the two ranks: both engines, batches of 2; rank 0 saves the final parameters."""
    for engine in ("backprop", "fa"):
        final, wrapped = train(out, 2, engine)
        if torch.distributed.get_rank() == 0:
            torch.save((final, wrapped), f"{out}/{engine}.pt")
'''


def test_ddp_replicas_of_every_engine_and_the_hf_trainer_s_ddp_equal_one_process(tmp_path, monkeypatch, subtests):
    """One torchrun job of two gloo processes (their start paid once), two checks against one process on the whole
    batch (float64):

    - each rank's gradients, after compute_grads on its half of the batch through DDP, equal one process's on the
      whole batch (1e-12) for backprop, FA, DFA and Highway-BP, while a half batch's own gradient is far from it
      (so an engine that left DDP's average out would fail); a fully_shard model is refused in one line;
    - the Hugging Face Trainer wraps the model in DDP: with backprop and FA (whose gradients DDP's hooks never see)
      3 steps of 2 x 2 rows end with one process's parameters on the batches of 4."""
    hf = importlib.util.find_spec("accelerate") is not None
    x, y = batch()
    torch.save((x, y), tmp_path / "batch.pt")
    (tmp_path / "ddp.py").write_text(SCRIPT.format(engines=ENGINES, batch="torch.load(sys.argv[3])", hf=hf))
    (tmp_path / "hf_ddp.py").write_text(HF_SCRIPT)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(tmp_path / "ddp.py"), str(tmp_path), str(ROOT), str(tmp_path / "batch.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]

    with subtests.test("every engine through DDP"):
        ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
        for engine, zoo in ENGINES.items():
            whole = one_process_grads(engine, zoo, x, y)
            half = one_process_grads(engine, zoo, x[0::2], y[0::2])
            for name, g in whole.items():
                for rank in ranks:
                    torch.testing.assert_close(rank[engine][name], g, rtol=1e-12, atol=1e-12, msg=f"{engine} {name}")
            assert max(float((half[n] - whole[n]).norm() / whole[n].norm()) for n in whole) > 0.05, engine
        refusal = (tmp_path / "refusal.txt").read_text()  # FSDP2's fully_shard: refused in one line
        assert "is sharded (its parameters are DTensors" in refusal and "not supported yet" in refusal, refusal

    with subtests.test("the Hugging Face Trainer's DDP"):
        if not hf:
            pytest.skip("accelerate is not installed (the Hugging Face Trainer needs it)")
        monkeypatch.syspath_prepend(str(tmp_path))
        import hf_ddp

        for engine in ("backprop", "fa"):
            two, wrapped = torch.load(tmp_path / f"{engine}.pt", weights_only=False)
            one, alone = hf_ddp.train(str(tmp_path / "one"), 4, engine)
            assert (wrapped, alone) == ("DistributedDataParallel", "GPT2LMHeadModel")
            assert max(float((two[n] - one[n]).abs().max()) for n in one) < 1e-12, engine
