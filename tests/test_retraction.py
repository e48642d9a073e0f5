"""The Cayley retraction of SGD (orthogonal="retraction"): the math against the dense Cayley step, the
factors every engine leaves, the Trainer's step, clipping, fallbacks, refusals and exact resume."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradengines import models, tasks, trainers
from gradengines.models.errors import ModelConfigError
from gradengines.models.orthogonal import (
    DEFAULT_BJORCK_ITERS,
    make_orthogonal,
    orthogonal_method,
    orthogonality_error,
    polar,
)
from gradengines.models.orthogonal.cayley import cayley_retract, cayley_retract_lowrank
from gradengines.models.orthogonal.retraction import CayleyRetraction
from gradengines.trainers.cli import bench_main, train_main
from gradengines.trainers.core.errors import ConfigError

F64 = torch.float64
SHAPES = {"square": (24, 24), "wide": (16, 24), "tall": (24, 16)}  # (out, in)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def orthogonal_matrix(out, inp, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(max(out, inp), min(out, inp), generator=gen, dtype=F64))
    return q if out >= inp else q.T


def factors(out, inp, r, scale=1.0, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(out, r, generator=gen, dtype=F64), torch.randn(inp, r, generator=gen, dtype=F64))


def textbook_cayley(W, G, lr):
    """(I + lr/2 A)^{-1} (I - lr/2 A) X with A = G^ X^T - X G^^T, G^ = (I - X X^T / 2) G_X, written out."""
    wide = W.shape[0] < W.shape[1]
    X, GX = (W.T, G.T) if wide else (W, G)
    GX = (torch.eye(X.shape[0], dtype=F64) - X @ X.T / 2) @ GX
    A = GX @ X.T - X @ GX.T
    eye = torch.eye(A.shape[0], dtype=F64)
    Y = torch.linalg.inv(eye + lr / 2 * A) @ (eye - lr / 2 * A) @ X
    return Y.T if wide else Y


def one_step_beside_a_reference(model, x, y, lr):
    """One recorded backward and retraction step of ``model`` at ``lr``; returns the retraction and an untouched
    copy of the model holding the same batch's gradients (the step's expected input)."""
    reference = copy.deepcopy(model)
    F.cross_entropy(reference(x), y).backward()
    retraction = CayleyRetraction(model)
    with retraction.recording():
        F.cross_entropy(model(x), y).backward()
    retraction.step(torch.optim.SGD(model.parameters(), lr=lr))
    return retraction, reference


# ----------------------------------------------------------------------------- the math
@pytest.mark.parametrize("shape", SHAPES)
def test_dense_step_is_the_textbook_cayley_transform_and_orthogonal(shape):
    out, inp = SHAPES[shape]
    W = orthogonal_matrix(out, inp)
    G = torch.randn(out, inp, generator=torch.Generator().manual_seed(3), dtype=F64)
    Y = cayley_retract(W, G, 0.3)
    assert torch.allclose(Y, textbook_cayley(W, G, 0.3), atol=1e-13, rtol=0)
    assert orthogonality_error(Y) < 1e-13
    assert (Y - W).abs().max() > 0.05  # a real step


@pytest.mark.parametrize("shape", SHAPES)
def test_first_order_step_is_sgd_then_projection(shape):
    """(Y - W) / lr -> -[(I - X X^T) G_X + X skew(X^T G_X)], the gradient projected on the tangent space,
    which is also the first-order step of SGD followed by the polar projection: one lr means the same
    for the retraction and for bjorck/polar. A weight decay term lambda W changes nothing."""
    out, inp = SHAPES[shape]
    W = orthogonal_matrix(out, inp)
    G = torch.randn(out, inp, generator=torch.Generator().manual_seed(4), dtype=F64)
    wide = out < inp
    X, GX = (W.T, G.T) if wide else (W, G)
    tangent = GX - X @ (X.T @ GX + GX.T @ X) / 2
    tangent = tangent.T if wide else tangent
    lr = 1e-8  # the second-order terms are O(lr |G|^2), the rounding O(eps / lr)
    step = (cayley_retract(W, G, lr) - W) / lr
    assert torch.allclose(step, -tangent, atol=1e-5, rtol=0)
    assert torch.allclose(step, (polar(W - lr * G) - W) / lr, atol=1e-5, rtol=0)
    assert torch.allclose(cayley_retract(W, G + 0.7 * W, 0.3), cayley_retract(W, G, 0.3), atol=1e-13, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [0.05, 20.0])  # the Schur path, and the large-step path (whole inverse)
@pytest.mark.parametrize("given", ["none", "WQ", "both"])
def test_lowrank_step_equals_the_dense_cayley_step(shape, scale, given):
    out, inp = SHAPES[shape]
    W = orthogonal_matrix(out, inp)
    P, Q = factors(out, inp, r=3, scale=scale)
    known = {"WQ": W @ Q, "WtP": W.T @ P} if given == "both" else {"WQ": W @ Q} if given == "WQ" else {}
    Y = cayley_retract_lowrank(W, P, Q, 0.3, **known)
    assert torch.allclose(Y, cayley_retract(W, P @ Q.T, 0.3), atol=1e-12, rtol=0)
    assert orthogonality_error(Y) < 1e-13
    written = W.clone()
    assert cayley_retract_lowrank(written, P, Q, 0.3, inplace=True) is written
    assert torch.allclose(written, Y, atol=1e-14, rtol=0)


def drifted(out, inp, size, seed=5):
    """An orthogonal matrix moved off the orthogonal set by ``size`` (Frobenius): X^T X - I of that order."""
    W = orthogonal_matrix(out, inp)
    noise = torch.randn(out, inp, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return W + size * noise / noise.norm()


def frame_gram_error(W):
    X = W.T if W.shape[0] < W.shape[1] else W
    return X.T @ X - torch.eye(X.shape[1], dtype=F64)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_drift_measures_are_their_definitions(shape):
    """dense_drift = rms eigenvalue of X^T X - I over 64 eps; _drift_along = ||Q_s^T (X^T X - I) Q_s||_F / ||Q_s||_F^2
    on the first 16 of the batch's vectors; prepare_lowrank_cayley's risk = max(drift along / 64 eps, 2 ||S||_F)."""
    from gradengines.models.orthogonal.cayley import _drift_along, dense_drift, prepare_lowrank_cayley

    out, inp = SHAPES[shape]
    eps64 = 64 * torch.finfo(F64).eps
    W = drifted(out, inp, 1e-9)
    E = frame_gram_error(W)
    rms = float(torch.linalg.eigvalsh(E).square().mean().sqrt())
    assert float(dense_drift(W)) == pytest.approx(rms / eps64, rel=1e-6) and float(dense_drift(W)) > 1
    P, Q = factors(out, inp, r=20)  # more vectors than the 16 read
    X, QX = (W.T, P) if out < inp else (W, Q)
    Qs = QX[:, :16]
    expected = float((Qs.T @ E @ Qs).norm() / Qs.square().sum())
    assert float(_drift_along(X @ QX, QX)) == pytest.approx(expected, rel=1e-6)
    P, Q = factors(out, inp, r=3, scale=0.05)
    step = prepare_lowrank_cayley(W.clone(), P, Q, 0.3)
    risk = max(float(_drift_along(step.K, step.QX)) / eps64, 2 * float(torch.linalg.matrix_norm(step.S)))
    assert float(step.risk) == pytest.approx(risk, rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_drifted_weight_takes_the_step_then_one_bjorck_iteration_and_an_orthogonal_one_none(shape):
    """Above 64 eps of drift the dense step is the Cayley step of the drifted weight followed by exactly one Björck
    iteration (from a drift of 1e-3 one iteration leaves ~1e-6, two would leave ~1e-12); the low-rank step, drifted
    along the batch, ends orthogonal too, next to the dense one; an orthogonal weight takes the step alone."""
    from gradengines.models.orthogonal.projection import bjorck

    out, inp = SHAPES[shape]
    G = torch.randn(out, inp, generator=torch.Generator().manual_seed(3), dtype=F64)
    for size in (1e-9, 1e-3):
        W = drifted(out, inp, size)
        plain = cayley_retract(W, G, 0.3, drifted=False)
        got = cayley_retract(W, G, 0.3)
        torch.testing.assert_close(got, bjorck(plain, 1), rtol=0, atol=1e-15)
        assert frame_gram_error(plain).norm() > size / 10  # the step alone keeps the drift
    assert 1e-9 < frame_gram_error(got).norm() < 1e-4  # one iteration from 1e-3, not two
    W = drifted(out, inp, 1e-9)
    P, Q = factors(out, inp, r=3, scale=0.05)
    lowrank = cayley_retract_lowrank(W, P, Q, 0.3)
    assert frame_gram_error(lowrank).norm() < 1e-14
    torch.testing.assert_close(lowrank, bjorck(cayley_retract(W, P @ Q.T, 0.3, drifted=False), 1), rtol=0,
                               atol=1e-9)
    clean = orthogonal_matrix(out, inp)
    torch.testing.assert_close(cayley_retract(clean, G, 0.3), cayley_retract(clean, G, 0.3, drifted=False),
                               rtol=0, atol=0)


def test_lowrank_step_uses_the_dense_form_when_the_rank_is_not_low():
    W = orthogonal_matrix(12, 12)
    P, Q = factors(12, 12, r=6)
    assert torch.allclose(cayley_retract_lowrank(W, P, Q, 0.2), cayley_retract(W, P @ Q.T, 0.2), atol=1e-13)


@pytest.mark.parametrize("shape", SHAPES)
def test_many_steps_keep_the_weight_orthogonal_to_1e_12_in_float64(shape):
    out, inp = SHAPES[shape]
    W = orthogonal_matrix(out, inp)
    for step in range(300):
        P, Q = factors(out, inp, r=4, scale=0.3, seed=step)
        W = cayley_retract_lowrank(W, P, Q, 0.5)
    assert orthogonality_error(W) < 1e-12


# ----------------------------------------------------------------------------- the factors
def mlp(method="retraction", width=24, depth=4, dtype=F64, seed=0, **options):
    """The zoo MLP in ``dtype`` with hidden weights orthogonal in that precision (built in float32, so
    the float64 copy is first made orthogonal to 1e-15: a drift of 1e-7 would take the guarded step)."""
    torch.manual_seed(seed)
    model = models.build("mlp", in_features=10, out_features=5, depth=depth, width=width, activation="tanh",
                         orthogonal=method, **options).to(dtype)
    with torch.no_grad():
        for module in CayleyRetraction(model).modules:
            module.weight.copy_(polar(module.weight))
    return model


def batch(n=6, seed=0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 10, generator=gen, dtype=dtype), torch.randint(0, 5, (n,), generator=gen)


ENGINES = ["backprop", "foton", "foton:mode=jvp", "foton:mode=lowmem", "pepita", "fa", "dfa"]


@pytest.mark.parametrize("spec", ENGINES)
def test_every_engine_leaves_factors_and_the_step_is_the_cayley_step_of_its_gradient(spec):
    """One step of each engine: the retracted weights become cayley_retract(W, the engine's own .grad, lr)
    through the low-rank path (no dense fallback), everything else takes the optimizer's step."""
    from gradengines.trainers.bench import engine_from_spec

    model = mlp()
    x, y = batch()
    engine = engine_from_spec(spec)
    engine.check(model)
    reference = copy.deepcopy(model)
    engine_from_spec(spec).compute_grads(reference, x, y, F.cross_entropy)
    lr = 0.4
    retraction = CayleyRetraction(model)
    assert len(retraction.modules) == 3  # the hidden layers
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with retraction.recording():
        engine.compute_grads(model, x, y, F.cross_entropy)
    retraction.step(opt)
    assert retraction.lowrank_steps == 3 and retraction.dense_steps == 0, retraction.dense_reasons
    for (name, p), (_, p0) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        module = model.get_submodule(name.rsplit(".", 1)[0])
        expected = (cayley_retract(p0.detach(), p0.grad, lr) if orthogonal_method(module) == "retraction"
                    and name.endswith("weight") else p0.detach() - lr * p0.grad)
        assert torch.allclose(p, expected, atol=1e-12, rtol=0), name
    assert orthogonality_error(model) < 1e-13


def test_autograd_factors_cover_sequences_and_a_layer_called_twice():
    """A linear layer applied to (B, T, d) rows, and the same layer used twice in one forward: its gradient
    is the sum of every call's outer products, and the step is still the Cayley step of .grad."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = make_orthogonal(nn.Linear(32, 32, dtype=F64), "retraction")
            self.out = nn.Linear(32, 3, dtype=F64)

        def forward(self, x):  # (B, T, 32)
            return self.out(torch.tanh(self.inner(torch.tanh(self.inner(x)))).mean(1))

    torch.manual_seed(0)
    model = Twice()
    x = torch.randn(2, 3, 32, dtype=F64)
    y = torch.tensor([0, 2])
    retraction, reference = one_step_beside_a_reference(model, x, y, 0.3)
    assert retraction.lowrank_steps == 1 and retraction.dense_steps == 0, retraction.dense_reasons
    expected = cayley_retract(reference.inner.weight.detach(), reference.inner.weight.grad, 0.3)
    assert torch.allclose(model.inner.weight, expected, atol=1e-12, rtol=0)


def test_a_gradient_that_differs_from_its_factors_takes_the_exact_dense_step():
    """An engine (or anything) that changes .grad after the factors were recorded: the check on a random
    vector sees it and the layer takes the dense Cayley step of the .grad it has."""
    model = mlp()
    x, y = batch()
    retraction = CayleyRetraction(model)
    with retraction.recording():
        F.cross_entropy(model(x), y).backward()
    first = model.layers[1].weight
    first.grad.mul_(2.0)
    expected = cayley_retract(first.detach().clone(), first.grad, 0.1)
    retraction.step(torch.optim.SGD(model.parameters(), lr=0.1))
    assert retraction.dense_steps == 1 and retraction.lowrank_steps == 2
    assert retraction.dense_reasons == {"the engine's gradient differs from the recorded factors"}
    assert torch.allclose(first, expected, atol=1e-12, rtol=0)


def test_without_a_recording_every_layer_takes_the_dense_step():
    model = mlp()
    x, y = batch()
    reference = copy.deepcopy(model)
    F.cross_entropy(model(x), y).backward()
    F.cross_entropy(reference(x), y).backward()
    retraction = CayleyRetraction(model)
    retraction.step(torch.optim.SGD(model.parameters(), lr=0.2))
    assert retraction.dense_steps == 3 and retraction.lowrank_steps == 0
    layer, ref = model.layers[2], reference.layers[2]
    assert torch.allclose(layer.weight, cayley_retract(ref.weight.detach(), ref.weight.grad, 0.2), atol=1e-12)


# ----------------------------------------------------------------------------- through the Trainer
@pytest.fixture(scope="module")
def task():
    return tasks.build("teacher", in_features=10, num_classes=5, n_train=192, n_val=64, n_test=64, hidden=16)


def make_trainer(task, engine="backprop", logdir=None, **overrides):
    torch.manual_seed(0)
    model = models.build("mlp", in_features=10, out_features=5, depth=4, width=24, activation="tanh",
                         orthogonal="retraction")
    options = dict(batch_size=16, progress=False, optimizer="sgd", momentum=0.0, lr=0.3, log_every=4,
                   grad_agreement_every=0, dtype="float64")
    options.update(overrides)
    return trainers.Trainer(model, trainers.build_engine(engine), task, logdir=logdir, **options)


@pytest.mark.parametrize("engine", ["backprop", "foton", "pepita", "fa", "dfa"])
def test_every_engine_trains_through_the_trainer_and_stays_orthogonal(task, engine):
    trainer = make_trainer(task, engine)
    before = trainer.evaluate("val")["loss"]
    report = trainer.fit(steps=60)
    assert trainer.retraction.lowrank_steps == 60 * 3 and trainer.retraction.dense_steps == 0
    assert orthogonality_error(trainer.model) < 1e-12
    assert report["final_val"]["loss"] < before


def test_clipped_gradients_scale_the_factors(task):
    """With a clip far below the gradient norm, the step is the Cayley step of the clipped .grad."""
    trainer = make_trainer(task, clip_grad_norm=1e-3)
    layer = trainer.model.layers[1]
    before = layer.weight.detach().clone()
    captured = {}
    step = trainer.retraction.step

    def spy(optimizer, grad_scale=1.0):
        captured["grad"] = layer.weight.grad.clone()
        captured["scale"] = grad_scale
        step(optimizer, grad_scale)

    trainer.retraction.step = spy
    trainer.fit(steps=1)
    assert captured["scale"] < 0.1
    assert trainer.retraction.lowrank_steps == 3 and trainer.retraction.dense_steps == 0
    assert torch.allclose(layer.weight, cayley_retract(before, captured["grad"], 0.3), atol=1e-12, rtol=0)


@pytest.mark.parametrize("overrides", [dict(optimizer="adam"), dict(momentum=0.9), dict(optimizer="adamw")])
def test_momentum_and_adam_are_refused_in_one_line(task, overrides):
    with pytest.raises(ConfigError, match=r"orthogonal=retraction takes plain SGD steps .*use orthogonal=bjorck"):
        make_trainer(task, **overrides)


@pytest.mark.parametrize("optimizer", [lambda ps: torch.optim.Adam(ps, lr=0.1),
                                       lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)])
def test_the_step_refuses_an_optimizer_whose_step_is_not_plain_sgd(optimizer):
    model = mlp()
    x, y = batch()
    before = [p.detach().clone() for p in model.parameters()]
    retraction = CayleyRetraction(model)
    with retraction.recording():
        F.cross_entropy(model(x), y).backward()
    with pytest.raises(ModelConfigError, match="orthogonal=retraction takes plain SGD steps"):
        retraction.step(optimizer(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_command_line_refusal_names_the_flags(tmp_path, capsys):
    code = train_main(["--task", "teacher", "--task-option", "n_train=64", "--depth", "2", "--width", "8",
                       "--orthogonal", "retraction", "--optimizer", "adam", "--steps", "1", "--progress", "false",
                       "--logdir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--optimizer sgd" in err[0] and "--momentum 0" in err[0]
    assert not any(tmp_path.rglob("*.pt"))


# resume: tests/test_trainer.py::test_resume_equals_uninterrupted[retraction] (dropout, clipping, a cosine
# schedule, a crash after the last checkpoint; metrics and weights equal the uninterrupted run's)


def test_float32_training_stays_orthogonal_to_1e_5(task):
    trainer = make_trainer(task, dtype="float32", lr=0.5)
    trainer.fit(steps=300)
    errors = [r["engine/orthogonality_error"] for r in trainer.history if "engine/orthogonality_error" in r]
    assert len(errors) == 75 and max(errors) < 1e-5


def test_bench_upkeep_suite_times_all_three_upkeeps(tmp_path):
    out = tmp_path / "bench"
    assert bench_main(["--suite", "upkeep", "--trainers", "backprop;foton", "--depths", "3", "--widths", "16",
                       "--batch-sizes", "4", "--steps", "20", "--warmup", "1", "--out", str(out)]) == 0
    import json
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [(r["trainer"], r["upkeep"]) for r in rows] == [
        (t, u) for t in ("backprop", "foton") for u in ("none", f"Björck <= {DEFAULT_BJORCK_ITERS}", "retraction")]
    for r in rows:
        if r["upkeep"] == "none":
            assert r["ratio_to_plain"] == 1
        else:
            assert r["orthogonality_error"] < 1e-5 and r["ratio_to_plain"] > 0


def test_the_readme_loop_runs_as_written():
    import re
    import textwrap
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "models-tasks.md").read_text()  # its page
    code = textwrap.dedent(re.search(r"```python\n(\s*retraction = models\.retraction.*?)```", readme, re.S).group(1))
    model = mlp()
    x, y = batch()
    before = [p.detach().clone() for p in model.parameters()]
    scope = {"trainers": trainers, "models": models, "model": model, "engine": trainers.build_engine("foton"), "x": x,
             "y": y, "loss_fn": F.cross_entropy, "optimizer": torch.optim.SGD(model.parameters(), lr=0.3)}
    exec(code, scope)
    assert scope["retraction"].lowrank_steps == 3
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert orthogonality_error(model) < 1e-13


def test_the_trainer_notes_a_dense_fallback_once(task, capsys):
    """An engine whose .grad differs from what autograd saw (here: doubled) gets the exact dense step, and
    the run says so in one note, not once per step."""
    from gradengines.trainers.engines.backprop import Backprop

    class Doubled(Backprop):
        def compute_grads(self, model, inputs, targets, loss_fn):
            out = super().compute_grads(model, inputs, targets, loss_fn)
            for p in model.parameters():
                p.grad.mul_(2)
            return out

    torch.manual_seed(0)
    model = models.build("mlp", in_features=10, out_features=5, depth=3, width=24, activation="tanh",
                         orthogonal="retraction")
    trainer = trainers.Trainer(model, Doubled(), task, batch_size=16, progress=False, optimizer="sgd", momentum=0.0,
                               lr=0.1, grad_agreement_every=0, dtype="float64")
    trainer.fit(steps=5)
    notes = [line for line in capsys.readouterr().err.splitlines() if "dense Cayley step" in line]
    assert notes == ["note: retracted layers took the exact dense Cayley step, O(n^3) per layer: the engine's "
                     "gradient differs from the recorded factors"]
    assert trainer.retraction.dense_steps == 5 * 2 and trainer.retraction.lowrank_steps == 0
    assert orthogonality_error(trainer.model) < 1e-12


class HostReads:
    """Counts the calls that bring a tensor's value to the host (item, tolist, bool, float, int): on a GPU
    each is a synchronisation."""

    METHODS = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original):
                self.count += 1
                return _original(tensor, *args)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("engine", ["backprop", "foton"])
def test_a_step_reads_the_host_once_whatever_the_depth(engine, monkeypatch):
    """Every layer's checks (factors against .grad, drift, size of the step) are read in one host
    synchronisation, and the small systems of same-shape layers are solved in one batched call."""
    reads = {}
    for depth in (3, 9):
        model, (x, y) = mlp(depth=depth), batch()
        reference = copy.deepcopy(model)
        trainers.build_engine(engine).compute_grads(reference, x, y, F.cross_entropy)
        retraction = CayleyRetraction(model)
        with retraction.recording():
            trainers.build_engine(engine).compute_grads(model, x, y, F.cross_entropy)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        with monkeypatch.context() as patch:
            counter = HostReads(patch)
            retraction.step(optimizer)
        reads[depth] = counter.count
        assert retraction.lowrank_steps == depth - 1 and retraction.dense_steps == 0
        layer, ref = model.layers[-2], reference.layers[-2]
        assert torch.allclose(layer.weight, cayley_retract(ref.weight.detach(), ref.weight.grad, 0.2), atol=1e-12)
    assert reads == {3: 1, 9: 1}


def test_a_retracted_weight_left_out_of_the_optimizer_is_not_stepped():
    """A layer frozen by leaving its weight out of the optimizer keeps it, gradient or not (issue 41: the
    selection of the weights to retract turned from 'in the optimizer and with a gradient' to 'or')."""
    model = mlp()
    x, y = batch()
    retraction = CayleyRetraction(model)
    frozen = model.layers[1].weight.detach().clone()
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("layers.1.")], lr=0.1)
    with retraction.recording():
        trainers.build_engine("backprop").compute_grads(model, x, y, F.cross_entropy)
    assert model.layers[1].weight.grad is not None
    retraction.step(opt)
    assert torch.equal(model.layers[1].weight.detach(), frozen)


def test_the_drift_is_measured_from_the_identity():
    """dense_drift: rms eigenvalue of X^T X - I over 64 eps; an orthogonal matrix is below 1 (no correction), one
    scaled by 1 + 1e-10 above (issue 41: the identity not subtracted)."""
    from gradengines.models.orthogonal.cayley import dense_drift

    Q = torch.linalg.qr(torch.randn(12, 8, dtype=F64)).Q
    assert float(dense_drift(Q)) < 1 < float(dense_drift(Q * (1 + 1e-10)))


class TiedPair(nn.Module):
    """Two modules holding one retracted weight (a tied pair), then a plain head."""

    def __init__(self):
        super().__init__()
        self.first = make_orthogonal(nn.Linear(8, 8, dtype=F64), "retraction")
        self.second = nn.Linear(8, 8, dtype=F64)
        self.second.weight = self.first.weight
        make_orthogonal(self.second, "retraction")
        self.out = nn.Linear(8, 3, dtype=F64)

    def forward(self, x):
        return self.out(torch.tanh(self.second(torch.tanh(self.first(x)))))


def test_a_tied_retracted_weight_is_one_layer_stepped_once():
    """retracted_modules lists a weight two modules share once, so the step retracts it once: the dense Cayley step
    of its whole gradient (a second retraction would move it twice)."""
    from gradengines.models.orthogonal.retraction import retracted_modules

    torch.manual_seed(0)
    model = TiedPair()
    assert [m.weight for m in retracted_modules(model)] == [model.first.weight]
    x, y = torch.randn(4, 8, dtype=F64), torch.tensor([0, 1, 2, 0])
    retraction, reference = one_step_beside_a_reference(model, x, y, 0.3)
    expected = cayley_retract(reference.first.weight.detach(), reference.first.weight.grad, 0.3)
    torch.testing.assert_close(model.first.weight.detach(), expected, rtol=0, atol=1e-12)


def test_a_recording_ends_with_its_block_and_a_disabled_one_records_nothing():
    """After ``recording()`` no factor reaches it (record_layer_grads has no open recording), and
    ``recording(enabled=False)`` (gradients averaged over ranks afterwards) installs no hook and keeps nothing."""
    from gradengines.models.orthogonal.retraction import _RECORDING, record_layer_grads

    torch.manual_seed(0)
    model = TiedPair()
    x, y = torch.randn(4, 8, dtype=F64), torch.tensor([0, 1, 2, 0])
    retraction = CayleyRetraction(model)
    with retraction.recording():
        F.cross_entropy(model(x), y).backward()
    assert not _RECORDING
    kept = {k: len(v) for k, v in retraction._factors.items()}
    record_layer_grads(model.first, torch.randn(4, 8, dtype=F64), torch.randn(4, 8, dtype=F64), 1.0)
    assert {k: len(v) for k, v in retraction._factors.items()} == kept
    hooks = len(model.first._forward_hooks)
    with retraction.recording(enabled=False):
        assert len(model.first._forward_hooks) == hooks and not _RECORDING
        F.cross_entropy(model(x), y).backward()
    assert retraction._factors == {} and retraction._forward == {}


def test_the_optimizer_check_reads_only_the_groups_holding_a_retracted_weight():
    """Adam on the plain parameters beside plain SGD on the retracted weight is a valid split (its own group);
    Adam on a group holding the retracted weight alone is refused."""
    torch.manual_seed(0)
    model = TiedPair()
    retraction = CayleyRetraction(model)
    plain = [p for n, p in model.named_parameters() if "out" in n]
    retracted = [p for n, p in model.named_parameters() if "out" not in n]
    retraction.check_optimizer(torch.optim.SGD(retracted, lr=0.1))
    with pytest.raises(ModelConfigError, match="takes plain SGD steps"):
        retraction.check_optimizer(torch.optim.Adam(retracted, lr=0.1))
    retraction.check_optimizer(torch.optim.Adam(plain, lr=0.1))  # no retracted weight in it: not this check's


def test_factors_reported_without_a_forward_take_the_low_rank_step_of_their_product():
    """A layer-stack engine's report (record_layer_grads) of alpha D^T H for an input no forward call saw: no
    pre-activations to reuse, so the step computes W Q itself; the update is the Cayley step of that gradient."""
    from gradengines.models.orthogonal.retraction import record_layer_grads

    torch.manual_seed(0)
    layer = make_orthogonal(nn.Linear(24, 24, dtype=F64), "retraction")
    gen = torch.Generator().manual_seed(4)
    delta, inputs = torch.randn(3, 24, generator=gen, dtype=F64), torch.randn(3, 24, generator=gen, dtype=F64)
    before = layer.weight.detach().clone()
    retraction = CayleyRetraction(layer)
    with retraction.recording():
        record_layer_grads(layer, delta, inputs, 0.5)
    layer.weight.grad = 0.5 * delta.T @ inputs
    retraction.step(torch.optim.SGD(layer.parameters(), lr=0.3))
    assert retraction.lowrank_steps == 1 and retraction.dense_steps == 0, retraction.dense_reasons
    torch.testing.assert_close(layer.weight.detach(), cayley_retract(before, 0.5 * delta.T @ inputs, 0.3), rtol=0,
                               atol=1e-12)
