"""Mixed precision (issue 49, ``trainers/core/precision.py``): under ``torch.autocast`` the backprop engine is autograd
under the same autocast, the exact settings of Highway-BP (k >= L) and FA (B = W, its self-check) agree with it
within the half-precision tolerance and their truncated or random settings do not; the self-check passes and
refuses at that tolerance; ``--precision`` trains (bf16, and float16 with a loss scaler that unscales before the
step) and refuses what it cannot do in one line."""

import pytest
import torch
from helpers import one_line_error

from gradengines import models, tasks, trainers
from gradengines.models.errors import ModelConfigError
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy
from gradengines.trainers.cli import train_main
from gradengines.trainers.core.errors import ConfigError
from gradengines.trainers.core.precision import precision_of
from gradengines.trainers.core.self_check import tolerance

HALVES = [torch.bfloat16, torch.float16]


def grads_under(dtype, model, compute):
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype):
        compute()
    return [p.grad.clone() for p in model.parameters()]


def autograd(model, x, y, loss_fn, dtype):
    def compute():
        loss_fn(model(x), y).backward()
    return grads_under(dtype, model, compute)


def engine(model, name, x, y, loss_fn, dtype, **options):
    return grads_under(dtype, model, lambda: trainers.build_engine(name, **options).compute_grads(model, x, y,
                                                                                                   loss_fn))


def relative(got, expected):
    return max(float((g - e).norm() / e.norm().clamp_min(1e-12)) for g, e in zip(got, expected, strict=True))


@pytest.mark.parametrize("dtype", HALVES, ids=["bf16", "fp16"])
def test_under_autocast_backprop_is_autograd_and_highway_at_full_k_within_the_half_tolerance(dtype):
    """Backprop: autograd under the same autocast, bit for bit, gradients float32 like the parameters. Highway-BP
    on a residual MLP (3 blocks) and the zoo's GPT (2 blocks): k = L within tolerance(half) of it, k = 0 not."""
    torch.manual_seed(0)
    mlp = models.build("residual_mlp", in_features=16, out_features=4, depth=3, width=32)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    reference = autograd(mlp, x, y, cross_entropy_loss, dtype)
    mine = engine(mlp, "backprop", x, y, cross_entropy_loss, dtype)
    assert all(torch.equal(a, b) and a.dtype == torch.float32 for a, b in zip(mine, reference, strict=True))
    assert relative(engine(mlp, "highway", x, y, cross_entropy_loss, dtype, k=3), reference) < 3e-2
    assert relative(engine(mlp, "highway", x, y, cross_entropy_loss, dtype, k=0), reference) > 0.1
    gpt = models.build("gpt", in_features=12, out_features=50, vocab_size=50, depth=2, width=32, heads=2)
    ids, targets = torch.randint(0, 50, (8, 12)), torch.randint(0, 50, (8, 12))
    reference = autograd(gpt, ids, targets, sequence_cross_entropy, dtype)
    assert relative(engine(gpt, "highway", ids, targets, sequence_cross_entropy, dtype, k=4), reference) < 3e-2
    assert relative(engine(gpt, "highway", ids, targets, sequence_cross_entropy, dtype, k=0), reference) > 0.1


def test_every_mlp_engine_runs_under_autocast_and_writes_float32_gradients():
    """The engines that write their own gradients (the layer-stack passes) give them in the parameters' dtype."""
    torch.manual_seed(0)
    mlp = models.build("mlp", in_features=16, out_features=4, depth=3, width=32, orthogonal="bjorck")
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    for name in ("fa", "dfa", "usf", "brsf", "frsf", "pepita", "foton"):
        for dtype in HALVES:
            got = engine(mlp, name, x, y, cross_entropy_loss, dtype)
            assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in got), (name, dtype)


def test_the_self_check_at_half_precision_passes_a_sound_model_and_refuses_a_broken_one(monkeypatch):
    """Under bf16 autocast the tolerance is half precision's; FA's layer-path check (B = the weight each call uses,
    against autograd under the same autocast) passes on convolutions that standardise their weight in the forward,
    and refuses, in one line, the planted failure of tests/test_self_check.py (the layer function bypassing the
    weight transform)."""
    from test_self_check import StdConv2d, bypass_weight_transforms, convnet, images

    assert tolerance(torch.float32) == 1e-3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert tolerance(torch.float32) == 3e-2
    (x, y), model = images(), convnet(StdConv2d).float()
    x = x.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trainers.build_engine("fa", path="layers").compute_grads(model, x, y, cross_entropy_loss)
    bypass_weight_transforms(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ModelConfigError) as err:
        trainers.build_engine("fa", path="layers").compute_grads(convnet(StdConv2d).float(), x, y,
                                                                 cross_entropy_loss)
    assert "forward through the layer functions is not the model's own" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_trainer_trains_in_bf16_and_in_float16_with_a_scaler_that_unscales_before_the_step():
    """bf16-mixed: float32 weights that learn the digits. 16-mixed: one clipped SGD step equals the step autograd
    and torch's GradScaler take by hand under the same autocast (unscaled before clipping: the scale never reaches
    the update)."""
    task = tasks.build("digits")
    torch.manual_seed(0)
    model = models.build("mlp", in_features=64, out_features=10, depth=2, width=64)
    trainer = trainers.Trainer(model, trainers.build_engine("fa"), task, precision="bf16-mixed", batch_size=64,
                               lr=0.01, progress=False)
    report = trainer.fit(epochs=3)
    assert all(p.dtype == torch.float32 for p in model.parameters()) and report["test"]["accuracy"] > 0.8
    torch.manual_seed(0)
    model = models.build("mlp", in_features=64, out_features=10, depth=2, width=64)
    by_hand = [p.detach().clone() for p in model.parameters()]
    trainer = trainers.Trainer(model, trainers.build_engine("backprop"), task, precision="16-mixed", batch_size=64,
                               optimizer="sgd", momentum=0.0, lr=0.1, clip_grad_norm=0.5, progress=False)
    x, y = trainer._batch(0)
    trainer.train_step(x, y)
    twin = models.build("mlp", in_features=64, out_features=10, depth=2, width=64)
    with torch.no_grad():
        for p, q in zip(twin.parameters(), by_hand, strict=True):
            p.copy_(q)
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = cross_entropy_loss(twin(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    assert norm > 0.5  # clipping acts: on the unscaled gradients
    scaler.step(optimizer)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert trainer.update.scaler.get_scale() == scaler.get_scale() == 2.0**16


def test_precision_options_are_checked_in_one_line(tmp_path, capsys):
    assert precision_of(None, "float64").dtype == torch.float64 and precision_of("64", "float32").dtype == torch.float64
    with pytest.raises(ConfigError, match="--precision bf16-mixed keeps float32 parameters; --dtype float64"):
        precision_of("bf16-mixed", "float64")
    flags = ["--trainer", "backprop", "--model", "mlp", "--steps", "2", "--progress", "false", "--logdir",
             str(tmp_path)]
    with pytest.raises(SystemExit) as exit_code:  # argparse's choices
        train_main([*flags, "--precision", "bf16"])
    assert exit_code.value.code == 2 and "invalid choice: 'bf16'" in capsys.readouterr().err
    assert train_main([*flags, "--precision", "bf16-mixed", "--dtype", "float64"]) == 2
    assert "keeps float32 parameters" in one_line_error(capsys)
    assert train_main([*flags, "--precision", "bf16-mixed"]) == 0
    capsys.readouterr()
    assert train_main(["--trainer", "foton", "--model", "mlp", "--orthogonal", "retraction", "--optimizer", "sgd",
                       "--momentum", "0", "--precision", "16-mixed", "--steps", "1", "--progress", "false",
                       "--logdir", str(tmp_path)]) == 2
    assert "16-mixed scales the loss, which the Cayley retraction" in one_line_error(capsys)
