"""DSF and FT-BPTT (``trainers.engines.dsf``): identities with BPTT, causality, feedback options."""

import math

import pytest
import torch
from engine_contract import EngineContract
from helpers import engine_grads, max_relative, write_ptb_text

from gradengines import models, tasks, trainers
from gradengines.tasks.base import sequence_cross_entropy
from gradengines.trainers.cli import train_main

B, T, D_IN, CLASSES = 3, 9, 2, 4
SHAPES = ["rnn_lm", "rnn_block_lm"]


class TestDSFContract(EngineContract):
    engine_name = "dsf"

    def make_models(self, dtype=torch.float32):
        """Sequence classifiers on the toy batch: 12 features read as 12 steps of 1 feature."""
        torch.manual_seed(0)
        return [models.build(shape, in_features=12, out_features=4, input_dim=1, cell=cell, hidden=10, depth=2)
                for shape, cell in (("rnn_lm", "gru"), ("rnn_block_lm", "lstm"))]

    @pytest.mark.parametrize("index", [0, 1])
    def test_loss_falls_on_a_toy_task(self, index):
        """Per-step targets (which quarter x_t falls in, plus x_{t-1}'s sign): the contract's
        random-label toy batch is a memorisation task an RNN reading 12 scalars barely starts in 30 steps."""
        torch.manual_seed(0)
        shape, cell = SHAPES[index], ("gru", "lstm")[index]
        model = models.build(shape, in_features=12, out_features=4, input_dim=1, cell=cell, hidden=16,
                             depth=2, per_step=True)
        x = torch.randn(64, 12, 1, generator=torch.Generator().manual_seed(0))
        y = (x[..., 0] > 0).long() * 2 + (torch.roll(x[..., 0], 1, dims=1) > 0).long()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        engine = self.engine()
        losses = []
        for _ in range(30):
            losses.append(engine.compute_grads(model, x, y, sequence_cross_entropy).loss.item())
            opt.step()
        assert losses[-1] < 0.8 * losses[0], losses


class TestDSFTiedContract(TestDSFContract):
    engine_options = {"feedback": "tied"}


class TestDSFGateContract(TestDSFContract):
    engine_options = {"feedback": "gate", "refresh": 3}


class TestFTBPTTContract(TestDSFContract):
    engine_name = "ftbptt"


def sequence_model(shape="rnn_lm", cell="diagonal", depth=1, seed=0):
    """float64, per-step outputs from float features: every h_t reaches the loss directly."""
    torch.manual_seed(seed)
    return models.build(shape, in_features=T, out_features=CLASSES, input_dim=D_IN, cell=cell, hidden=6,
                        depth=depth, per_step=True).double()


def sequence_batch(seed=1, steps=T):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, steps, D_IN, generator=gen, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (B, steps), generator=gen)
    return x, y


def zero_recurrent_weights(model):
    """W_hh = 0 in every fused layer: the gates no longer read h_{t-1}."""
    with torch.no_grad():
        for layer in model.recurrent_layers:
            layer.rnn.weight_hh_l0.zero_()
    return model


def grads_of(engine, model, x, y):
    return engine_grads(model, engine, x, y, sequence_cross_entropy)


def input_gradient(engine, model, x, y, weights=None):
    """dL/dx through the engine's time-parallel step (or through plain autograd if engine is None)."""
    x = x.clone().requires_grad_(True)
    loss_of = (lambda out: sequence_cross_entropy(out, y)) if weights is None else \
        (lambda out: (out.sum(-1) * weights).sum())
    if engine is None:
        return torch.autograd.grad(loss_of(model(x)), x)[0]
    with engine.time_parallel(model):
        return torch.autograd.grad(loss_of(model(x)), x)[0]


# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("depth", [1, 3])
def test_tied_feedback_on_diagonal_linear_recurrence_is_bptt(shape, depth):
    """h_t = lambda h_{t-1} + B x_t has J = diag(lambda): DSF with a = lambda is exact BPTT."""
    model = sequence_model(shape, depth=depth)
    x, y = sequence_batch()
    exact = grads_of(trainers.build_engine("backprop"), model, x, y)
    dsf = grads_of(trainers.build_engine("dsf", feedback="tied"), model, x, y)
    assert max_relative(dsf, exact) < 1e-10
    # the feedback matters: the authors' linspace a and FT-BPTT are far from it
    for engine in (trainers.build_engine("dsf"), trainers.build_engine("ftbptt")):
        other = grads_of(engine, model, x, y)
        worst = max_relative(other, exact)
        assert worst > 1e-2
    # and the inputs' gradient (what a layer below would receive)
    torch.testing.assert_close(input_gradient(trainers.build_engine("dsf", feedback="tied"), model, x, y),
                               input_gradient(None, model, x, y), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("scan", ["sequential", "hillis_steele", "chunked"])
def test_tied_exactness_holds_for_every_scan_form(scan):
    model = sequence_model(depth=2)
    x, y = sequence_batch(steps=70)
    exact = grads_of(trainers.build_engine("backprop"), model, x, y)
    dsf = grads_of(trainers.build_engine("dsf", feedback="tied", scan=scan), model, x, y)
    assert max_relative(dsf, exact) < 1e-10


def test_gru_with_zero_recurrent_weights_is_exact_with_tied_update_gate():
    """With W_hh = 0 the GRU's Jacobian is exactly diag(z_t): tied DSF equals BPTT, W_hh's grad included."""
    model = zero_recurrent_weights(sequence_model(cell="gru", depth=2))
    x, y = sequence_batch()
    exact = grads_of(trainers.build_engine("backprop"), model, x, y)
    dsf = grads_of(trainers.build_engine("dsf", feedback="tied"), model, x, y)
    assert max_relative(dsf, exact) < 1e-10
    # with the real (non-zero) W_hh, tied is only an approximation
    model = sequence_model(cell="gru", depth=2)
    exact = grads_of(trainers.build_engine("backprop"), model, x, y)
    dsf = grads_of(trainers.build_engine("dsf", feedback="tied"), model, x, y)
    assert max_relative(dsf, exact) > 1e-3


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm", "diagonal"])
def test_zero_feedback_is_ftbptt(cell):
    model = sequence_model(cell=cell, depth=2)
    x, y = sequence_batch()
    ft = grads_of(trainers.build_engine("ftbptt"), model, x, y)
    zero = grads_of(trainers.build_engine("dsf", feedback="constant", decay=0.0), model, x, y)
    assert max_relative(zero, ft) < 1e-14


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm", "diagonal"])
@pytest.mark.parametrize("shape", SHAPES)
def test_single_step_sequences_all_engines_agree(cell, shape):
    """T = 1: there is no time to propagate through; BPTT, FT-BPTT and DSF coincide."""
    model = sequence_model(shape, cell=cell, depth=2)
    x, y = sequence_batch(steps=1)
    exact = grads_of(trainers.build_engine("backprop"), model, x, y)
    for engine in ("ftbptt", "dsf"):
        got = grads_of(trainers.build_engine(engine), model, x, y)
        assert max_relative(got, exact) < 1e-12


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm", "diagonal"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_outputs_and_loss_equal_bptt(cell, shape):
    model = sequence_model(shape, cell=cell, depth=2)
    x, y = sequence_batch()
    want = trainers.build_engine("backprop").compute_grads(model, x, y, sequence_cross_entropy)
    for engine in ("ftbptt", "dsf"):
        got = trainers.build_engine(engine).compute_grads(model, x, y, sequence_cross_entropy)
        torch.testing.assert_close(got.outputs, want.outputs, rtol=0, atol=1e-12)
        torch.testing.assert_close(got.loss, want.loss, rtol=0, atol=1e-12)


def test_linspace_feedback_is_the_closed_form_on_one_diagonal_layer():
    """One diagonal layer, loss sum_t <w_t, h_t>: dL/dB = sum_t g_t x_t^T with g_t = sum_k a^k w_{t+k}."""
    torch.manual_seed(0)
    model = models.build("rnn_lm", in_features=T, out_features=1, input_dim=D_IN, cell="diagonal", hidden=5,
                         per_step=True).double()
    layer = model.recurrent_layers[0]
    x, _ = sequence_batch()
    w = torch.randn(B, T, 5, dtype=torch.float64)
    engine = trainers.build_engine("dsf")
    with engine.time_parallel(model):
        h = layer(model.input_features(x))
        grad_B = torch.autograd.grad((h * w).sum(), layer.B.weight)[0]
    a = torch.linspace(0, 1, 5, dtype=torch.float64)
    g = torch.stack([sum(a ** (k - t) * w[:, k] for k in range(t, T)) for t in range(T)], dim=1)
    u = model.input_features(x).detach()
    torch.testing.assert_close(grad_B, torch.einsum("btd,bti->di", g, u), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES)
def test_lstm_tied_feedback_runs_on_the_cell_state_and_is_bptt_when_w_hh_is_zero(shape):
    """With W_hh = 0 the gates do not read h_{t-1}: the only path through time is
    c_t = f_t c_{t-1} + i_t g_t, and tied DSF (a_t = f_{t+1} on the error at c_t after the h
    readout) is exact BPTT. Nothing above reads c, so the feedback must act after the readout."""
    model = zero_recurrent_weights(sequence_model(shape, cell="lstm", depth=2))
    x, y = sequence_batch()
    exact = grads_of(trainers.build_engine("backprop"), model, x, y)
    tied = grads_of(trainers.build_engine("dsf", feedback="tied"), model, x, y)
    assert max_relative(tied, exact) < 1e-10
    ft = grads_of(trainers.build_engine("ftbptt"), model, x, y)
    for feedback in ("gate", "linspace"):  # stationary feedbacks act too, and are not exact
        got = grads_of(trainers.build_engine("dsf", feedback=feedback), model, x, y)
        assert max_relative(got, ft) > 1e-3
        assert max_relative(got, exact) > 1e-3
    model = sequence_model(shape, cell="lstm", depth=2)  # with the real W_hh, tied is only an approximation
    exact = grads_of(trainers.build_engine("backprop"), model, x, y)
    assert max_relative(grads_of(trainers.build_engine("dsf", feedback="tied"), model, x, y), exact) > 1e-3


# ---------------------------------------------------------------- causality


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_feedback_is_causal_and_ftbptt_does_not_leak_through_time(cell):
    """Loss at step t0 only: DSF sends error to steps s <= t0 and none to s > t0; FT-BPTT only to t0."""
    model = sequence_model(cell=cell, depth=2)
    x, y = sequence_batch()
    t0 = 4
    weights = torch.zeros(B, T, dtype=torch.float64)
    weights[:, t0] = 1.0
    dsf = input_gradient(trainers.build_engine("dsf"), model, x, y, weights).abs().sum(dim=(0, 2))
    ft = input_gradient(trainers.build_engine("ftbptt"), model, x, y, weights).abs().sum(dim=(0, 2))
    assert torch.all(dsf[t0 + 1:] == 0) and torch.all(dsf[: t0 + 1] > 0)
    assert torch.all(ft[t0 + 1:] == 0) and torch.all(ft[:t0] == 0) and ft[t0] > 0


# ---------------------------------------------------------------- feedback options


def test_gate_feedback_is_the_mean_update_gate_refreshed_every_n_steps():
    model = sequence_model(cell="gru", depth=1)
    layer = model.recurrent_layers[0]
    engine = trainers.build_engine("dsf", feedback="gate", refresh=3)
    batches = [sequence_batch(seed=s) for s in range(5)]

    def gate_mean(x):
        with torch.no_grad():
            u = model.input_features(x)
            states = layer.forward_sequence(u)
            prev = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)
            return layer.gate(u.reshape(-1, 6), prev.reshape(-1, 6)).mean(0)

    means = [gate_mean(x) for x, _ in batches]
    seen = []
    for x, y in batches:
        engine.compute_grads(model, x, y, sequence_cross_entropy)
        seen.append(engine.a[0].clone())
    torch.testing.assert_close(seen[0], means[0])  # step 0: its own batch
    torch.testing.assert_close(seen[1], means[0])  # held ...
    torch.testing.assert_close(seen[2], means[0])
    torch.testing.assert_close(seen[3], (means[1] + means[2] + means[3]) / 3)  # ... refreshed at step 3
    torch.testing.assert_close(seen[4], seen[3])
    # the state survives a checkpoint round trip: a fresh engine continues identically
    clone = trainers.build_engine("dsf", feedback="gate", refresh=3)
    engine2 = trainers.build_engine("dsf", feedback="gate", refresh=3)
    for x, y in batches[:2]:
        engine2.compute_grads(model, x, y, sequence_cross_entropy)
    clone.load_state_dict(engine2.state_dict())
    for x, y in batches[2:4]:
        engine2.compute_grads(model, x, y, sequence_cross_entropy)
        clone.compute_grads(model, x, y, sequence_cross_entropy)
    torch.testing.assert_close(clone.a[0], engine2.a[0])
    torch.testing.assert_close(clone.a[0], seen[3])


def test_metrics_report_the_mean_feedback_per_layer():
    model = sequence_model(cell="gru", depth=2)
    x, y = sequence_batch()
    engine = trainers.build_engine("dsf")
    engine.compute_grads(model, x, y, sequence_cross_entropy)
    assert engine.metrics() == {"feedback_mean/layer0": pytest.approx(0.5), "feedback_mean/layer1": pytest.approx(0.5)}


def test_recurrent_layers_are_restored_after_the_step():
    model = sequence_model(cell="gru", depth=2)
    x, y = sequence_batch()
    trainers.build_engine("dsf").compute_grads(model, x, y, sequence_cross_entropy)
    assert all("forward" not in layer.__dict__ for layer in model.recurrent_layers)
    with pytest.raises(RuntimeError, match="boom"):
        with trainers.build_engine("dsf").time_parallel(model):
            raise RuntimeError("boom")
    assert all("forward" not in layer.__dict__ for layer in model.recurrent_layers)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("engine", ["dsf", "ftbptt"])
def test_a_parameter_the_loss_never_reaches_gets_a_zero_gradient_and_the_step_goes_on(engine):
    """A model with a module its forward does not use (a user's leftover head): its parameters get a zero
    gradient, as under backprop, and the step does not fail on them."""
    model = sequence_model(cell="gru")
    model.unused = torch.nn.Linear(3, 3).double()
    x, y = sequence_batch()
    got = grads_of(trainers.build_engine(engine), model, x, y)
    assert not got["unused.weight"].any() and not got["unused.bias"].any()
    assert all(torch.isfinite(g).all() for g in got.values()) and got["stem.weight"].abs().sum() > 0


def test_constant_feedback_defaults_to_a_half_and_a_refresh_of_one_step_is_taken():
    """The documented default a = 0.5 of feedback=constant (--dsf-decay), and refresh's smallest value, 1."""
    assert trainers.build_engine("dsf").Options().decay == 0.5
    a = trainers.build_engine("dsf", feedback="constant").coefficients(0, None, size=3, device="cpu")
    assert a.tolist() == [0.5, 0.5, 0.5]
    trainers.build_engine("dsf", feedback="gate", refresh=1)


@pytest.mark.parametrize("options, match", [
    ({"decay": 1.5}, "decay"),
    ({"refresh": 0}, "refresh"),
    ({"feedback": "dense"}, "feedback"),
    ({"scan": "fft", "feedback": "tied"}, "time-invariant"),
    ({"scan": "blelloch"}, "scan"),
])
def test_bad_options_raise_config_error(options, match):
    with pytest.raises(trainers.ConfigError, match=match):
        trainers.build_engine("dsf", **options)


def test_incompatible_models_are_refused_with_one_line():
    mlp = models.build("mlp", in_features=12, out_features=4)
    for name in ("dsf", "ftbptt"):
        with pytest.raises(trainers.IncompatibleModelError, match="recurrent layers"):
            trainers.build_engine(name).check(mlp)
    rnn = sequence_model(cell="rnn")
    with pytest.raises(trainers.IncompatibleModelError, match="diagonal direct path"):
        trainers.build_engine("dsf", feedback="tied").check(rnn)
    trainers.build_engine("dsf").check(rnn)  # linspace is fine on any cell
    rnn.recurrent_layers.append(torch.nn.Linear(6, 6))
    with pytest.raises(trainers.IncompatibleModelError, match="RecurrentLayer protocol"):
        trainers.build_engine("dsf").check(rnn)


def test_cli_refuses_dsf_on_an_mlp_with_exit_2(tmp_path, capsys):
    code = train_main(["--trainer", "dsf", "--model", "mlp", "--logdir", str(tmp_path / "r"), "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "recurrent layers" in err
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- with the Trainer


@pytest.mark.parametrize("spec", [("ftbptt", {}), ("dsf", {}), ("dsf", {"feedback": "gate", "refresh": 2})])
def test_trainer_trains_a_tiny_ptb_char_model(spec, tmp_path):
    write_ptb_text(tmp_path, " the cat sat on the mat \n the dog sat \n a <unk> ran \n" * 4)
    task = tasks.build("ptb-char", data_dir=tmp_path, seq_len=8)
    torch.manual_seed(0)
    model = models.build("rnn_lm", in_features=task.in_features, out_features=task.num_outputs, cell="gru",
                         hidden=16, depth=2)
    name, options = spec
    trainer = trainers.Trainer(model, trainers.build_engine(name, **options), task, progress=False, batch_size=4,
                               lr=1e-2, optimizer="adam")
    report = trainer.fit(steps=12)
    assert report["steps"] == 12 and math.isfinite(report["test"]["perplexity"])
    assert report["best_val"]["perplexity"] < task.num_outputs  # learned something: better than uniform
    assert all(p is q for p, q in zip(model.parameters(), trainer.model.parameters(), strict=True))



def test_resume_restores_the_gate_feedback_state(tmp_path):
    """feedback=gate keeps running sums between refreshes: a resumed run must continue them exactly."""
    task = tasks.build("copy", n_symbols=3, length=2, delay=3, n_train=32, n_val=8, n_test=8)

    def trainer(folder):
        torch.manual_seed(0)
        model = models.build("rnn_lm", in_features=task.in_features, out_features=task.num_outputs, vocab_size=5,
                             cell="gru", hidden=8, depth=2)
        return trainers.Trainer(model, trainers.build_engine("dsf", feedback="gate", refresh=3), task,
                                logdir=tmp_path / folder, progress=False, batch_size=8, lr=1e-2, seed=0,
                                checkpoint_every=1)

    whole = trainer("whole")
    whole.fit(steps=8)
    first = trainer("resumed")
    first.fit(steps=5)
    resumed = trainer("resumed")
    resumed.fit(steps=8, resume=True)
    assert resumed.engine.steps == 8
    torch.testing.assert_close(resumed.engine.a[1], whole.engine.a[1], rtol=0, atol=0)
    for pa, pb in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
