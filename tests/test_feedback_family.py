"""The feedback-alignment family: the sign-symmetric rules against their definitions (float64, two steps, a
weight whose sign flips between them), the feedback's scale, DFA's one projection against separate
projections, and the alignment angles in the event file."""

import math

import pytest
import torch
from helpers import cosine, relative
from helpers import engine_grads as grads
from torch import nn

from gradengines import models, tasks, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy
from gradengines.trainers.engines.feedback_layers import covered_layers

SIGNED = ("usf", "brsf", "frsf")


def mlp(depth=3, width=5):
    torch.manual_seed(0)
    return models.build("mlp", in_features=6, out_features=3, depth=depth, width=width, activation="tanh").double()


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(16, 6, generator=gen, dtype=torch.float64), torch.randint(0, 3, (16,), generator=gen)


def fa_by_hand(model, B, x, y):
    """FA on a 3-layer tanh MLP with feedback B_2, B_3: e = softmax - onehot, delta_2 = (e B_3) * tanh',
    delta_1 = (delta_2 B_2) * tanh', G_l = delta_l^T h_{l-1} / n."""
    W = [layer.weight for layer in model.layers]
    b = [layer.bias for layer in model.layers]
    h1 = torch.tanh(x @ W[0].T + b[0])
    h2 = torch.tanh(h1 @ W[1].T + b[1])
    e = torch.softmax(h2 @ W[2].T + b[2], 1) - nn.functional.one_hot(y, 3).double()
    d2 = (e @ B[1]) * (1 - h2**2)
    d1 = (d2 @ B[0]) * (1 - h1**2)
    n = len(x)
    return {"layers.0.weight": d1.T @ x / n, "layers.0.bias": d1.mean(0), "layers.1.weight": d2.T @ h1 / n,
            "layers.1.bias": d2.mean(0), "layers.2.weight": e.T @ h2 / n, "layers.2.bias": e.mean(0)}


def used(engine, path):
    """The B_2, B_3 the engine says its last step applied, as it exposes them."""
    state = engine.state_dict()
    if path == "stack":
        return state["feedback"]
    return [state["layers"]["used"][name] for name in ("layers.1", "layers.2")]


@pytest.mark.parametrize("path", ["stack", "layers"])
@pytest.mark.parametrize("rule", SIGNED)
def test_each_sign_rule_is_its_definition_over_two_steps_as_a_weight_flips_sign(rule, path):
    """usf: B = sign(W) / sqrt(3 fan_in); frsf: |B| drawn once, kept; brsf: |B| drawn again each step, at most
    1 / sqrt(fan_in); the signs are the current W's, and the gradient is FA's with that B, written by hand."""
    model, (x, y) = mlp(), batch()
    engine = trainers.build_engine(rule, feedback_seed=3, path=path, scale="fan_in")
    grads(model, engine, x, y)
    first = [B.clone() for B in used(engine, path)]
    with torch.no_grad():  # the update that flips two of W_2's signs and one of W_3's
        model.layers[1].weight[0, 0] *= -1
        model.layers[1].weight[3, 2] *= -1
        model.layers[2].weight[1, 4] *= -1
    got = grads(model, engine, x, y)
    second = used(engine, path)
    weights = [model.layers[1].weight.detach(), model.layers[2].weight.detach()]
    for B1, B, W in zip(first, second, weights, strict=True):
        fan_in = W.shape[1]
        assert B.shape == W.shape and B.dtype == torch.float64
        assert torch.equal(torch.sign(B), torch.sign(W))  # the signs of this step's W
        assert (torch.sign(B) != torch.sign(B1)).sum() == (1 if W.shape[0] == 3 else 2)
        if rule == "usf":
            torch.testing.assert_close(B, torch.sign(W) / math.sqrt(3 * fan_in), rtol=1e-15, atol=0)
        elif rule == "frsf":
            assert torch.equal(B.abs(), B1.abs())  # fixed magnitudes
            assert B.abs().max() <= 1 / math.sqrt(fan_in) and len(B.abs().unique()) == B.numel()
        else:
            assert not torch.equal(B.abs(), B1.abs())  # drawn again at this step
            assert B.abs().max() <= 1 / math.sqrt(fan_in) and B.abs().min() > 0
    expected = fa_by_hand(model, second, x, y)
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-12, atol=1e-14, msg=name)


@pytest.mark.parametrize("path", ["stack", "layers"])
@pytest.mark.parametrize("rule", ["fa", *SIGNED])
def test_the_weight_scale_is_read_once_at_the_first_draw(rule, path):
    """scale=weight: B's rms is W's when first drawn and stays so while W grows (fixed feedback, not W's size)."""
    model, (x, y) = mlp(), batch()
    engine = trainers.build_engine(rule, scale="weight", path=path)
    rms = [layer.weight.detach().pow(2).mean().sqrt().item() for layer in model.layers[1:]]
    grads(model, engine, x, y)
    first = [B.pow(2).mean().sqrt().item() for B in used(engine, path)]
    with torch.no_grad():
        for layer in model.layers:
            layer.weight.mul_(3.0)
    grads(model, engine, x, y)
    second = [B.pow(2).mean().sqrt().item() for B in used(engine, path)]
    tolerance = 1e-12 if rule == "usf" else 0.35  # a draw of 25 or 15 magnitudes has its own rms
    assert first == pytest.approx(rms, rel=tolerance)
    assert second == pytest.approx(first, rel=1e-12 if rule != "brsf" else 0.35)


@pytest.mark.parametrize("rule", SIGNED)
def test_sign_feedback_is_neither_backprop_nor_fa(rule):
    model, (x, y) = mlp(), batch()
    mine = grads(model, trainers.build_engine(rule), x, y)
    exact = grads(model, trainers.build_engine("backprop"), x, y)
    fa = grads(model, trainers.build_engine("fa"), x, y)
    torch.testing.assert_close(mine["layers.2.weight"], exact["layers.2.weight"], rtol=1e-12, atol=1e-14)
    for other in (exact, fa):
        assert relative(mine["layers.0.weight"], other["layers.0.weight"]) > 1e-2
    if rule == "usf":  # sign-concordant: the hidden layer's gradient points near backprop's (fixed draws: > 0.5)
        assert cosine(mine["layers.1.weight"], exact["layers.1.weight"]) > 0.5


def test_frsf_keeps_its_magnitudes_in_the_checkpoint_and_brsf_its_step():
    model, (x, y) = mlp(), batch()
    for rule in ("frsf", "brsf"):
        engine = trainers.build_engine(rule, feedback_seed=4)
        grads(model, engine, x, y)
        grads(model, engine, x, y)
        after = grads(model, engine, x, y)
        restored = trainers.build_engine(rule, feedback_seed=4)  # as a resume builds it, from the run's options
        state = engine.state_dict()
        restored.load_state_dict(state)
        mine, theirs = grads(model, engine, x, y), grads(model, restored, x, y)
        assert all(torch.equal(g, theirs[n]) for n, g in mine.items())  # the next step is the same on both
        # frsf repeats its step on the same weights; brsf draws other magnitudes
        assert torch.equal(after["layers.0.weight"], mine["layers.0.weight"]) == (rule == "frsf")


@pytest.mark.parametrize("name", ["ortho_convnet", "ortho_lenet"])
def test_sign_rules_refuse_an_orthogonal_convolution_in_one_line(name):
    """Whichever layer after the first is the orthogonal convolution (ortho_lenet: only the second)."""
    model = models.build(name, in_features=64, out_features=10)
    with pytest.raises(trainers.IncompatibleModelError, match="signs are not the map's"):
        trainers.build_engine("usf").check(model)
    trainers.build_engine("fa").check(model)


def test_usf_on_the_layer_path_is_the_stack_path():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    stack = models.layer_stack(net)
    x, y = batch()
    expected = grads(stack, trainers.build_engine("usf", path="stack"), x, y, cross_entropy_loss)
    got = grads(stack, trainers.build_engine("usf", path="layers"), x, y, cross_entropy_loss)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-12, atol=1e-14, msg=name)


# ---- the feedback's scale ------------------------------------------------------------------------------------


def test_the_feedback_scale_measured_on_a_gpt2_layer():
    """GPT-2 draws its weights N(0, 0.02): scale=weight gives B that rms, the fan-in draw ~3.6 times more (the
    factor that compounds through FA's layers), glorot BioTorch's sqrt(2 / (fan_in + fan_out))."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=64, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).double()
    x = torch.randint(0, 50, (2, 8))
    name = "transformer.h.0.mlp.c_fc"  # Conv1D, W stored (in 64, out 256)
    W = model.get_submodule(name).weight.detach()

    def rms(rule, scale):
        engine = trainers.build_engine(rule, scale=scale, path="layers")
        grads(model, engine, x, x, sequence_cross_entropy)
        B = engine.state_dict()["layers"]["used"][name]
        assert B.shape == W.shape
        return B.pow(2).mean().sqrt().item()

    w = W.pow(2).mean().sqrt().item()
    assert 0.019 < w < 0.021
    assert rms("usf", "weight") == pytest.approx(w, rel=1e-12)
    assert rms("fa", "weight") == pytest.approx(w, rel=0.05)  # a draw of 16384 entries
    assert rms("frsf", "weight") == pytest.approx(w, rel=0.05)
    assert rms("usf", "glorot") == pytest.approx(math.sqrt(2 / (256 + 64)), rel=1e-12)
    assert rms("fa", "fan_in") == pytest.approx(1 / math.sqrt(3 * 64), rel=0.05)
    assert rms("fa", "fan_in") > 3 * w


@pytest.mark.parametrize("path", ["stack", "layers"])
def test_dfa_draws_each_matrix_at_its_layers_scale(path):
    """D_l's entries are U(-sqrt(3) r, sqrt(3) r): rms r (fan_in: 1 / sqrt(3 d_y), d_y = 3 outputs here), the
    bound sqrt(3) r filled (issue 41: the amplitude's sqrt(3), on either path)."""
    model = models.build("mlp", in_features=6, out_features=3, depth=3, width=400, activation="tanh").double()
    x, y = batch()
    engine = trainers.build_engine("dfa", scale="fan_in", feedback_seed=3, path=path)
    grads(model, engine, x, y)
    r = 1 / math.sqrt(3 * 3)
    matrices = engine.matrices() if path == "stack" else [engine.layers.matrix(f"layers.{i}") for i in (1, 2)]
    for D in matrices:
        assert D.shape == (3, 400)
        assert D.abs().max().item() <= math.sqrt(3) * r * (1 + 1e-12)
        assert D.abs().max().item() > 0.99 * math.sqrt(3) * r  # 1200 draws fill the bound
        assert D.pow(2).mean().sqrt().item() == pytest.approx(r, rel=0.05)


def test_glorot_on_the_layer_path_reads_both_fans_of_a_non_square_linear():
    """A Linear stores W as (out, in): Glorot's r = sqrt(2 / (fan_in + fan_out)) with fan_in 60, fan_out 90, as
    usf's B (r sign W) shows exactly (issue 41: fan_out read as the input's size)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 60), nn.Tanh(), nn.Linear(60, 90), nn.Tanh(), nn.Linear(90, 3)).double()
    x, y = batch()
    engine = trainers.build_engine("usf", scale="glorot", path="layers")
    grads(model, engine, x, y)
    B = engine.state_dict()["layers"]["used"]["2"]
    assert B.shape == (90, 60) and B.abs().unique().tolist() == [pytest.approx(math.sqrt(2 / (60 + 90)), rel=1e-12)]


def test_glorot_on_the_layer_path_reads_a_convolutions_fans_through_its_kernel():
    """A Conv2d (out 6, in 4, kernel 3 x 5): fan_in 4 * 15, fan_out 6 * 15 (issue 41: the kernel's width alone)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 6, (3, 5), padding=(1, 2)),
                          nn.Tanh(), nn.Flatten(), nn.Linear(6 * 16, 3)).double()
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(5, 1, 4, 4, generator=gen, dtype=torch.float64), torch.randint(0, 3, (5,), generator=gen)
    engine = trainers.build_engine("usf", scale="glorot", path="layers")
    grads(model, engine, x, y)
    B = engine.state_dict()["layers"]["used"]["2"]
    assert B.abs().unique().tolist() == [pytest.approx(math.sqrt(2 / (4 * 15 + 6 * 15)), rel=1e-12)]


def test_a_zero_weight_gets_a_zero_sign_feedback():
    """sign(0) = 0: a weight entry that is exactly zero sends nothing back, never inf or nan (usf, brsf, frsf)."""
    model, (x, y) = mlp(), batch()
    with torch.no_grad():
        model.layers[1].weight[0, 0] = 0.0
    for rule in SIGNED:
        engine = trainers.build_engine(rule)
        got = grads(model, engine, x, y)
        B = used(engine, "stack")[0]
        assert B[0, 0] == 0 and torch.isfinite(B).all() and all(torch.isfinite(g).all() for g in got.values())


@pytest.mark.parametrize("path", ["stack", "layers"])
def test_the_step_count_counts_steps_on_both_paths(path):
    """brsf draws step t's magnitudes from (seed, layer, t): the counter must advance by one a step."""
    model, (x, y) = mlp(), batch()
    engine = trainers.build_engine("brsf", path=path)
    for _ in range(3):
        grads(model, engine, x, y)
    assert (engine.steps if path == "stack" else engine.layers.step) == 3


@pytest.mark.parametrize("rule", ["fa", "usf", "brsf", "frsf", "dfa"])
def test_the_feedback_seed_takes_every_63_bit_seed_and_refuses_past_them(rule):
    trainers.build_engine(rule, feedback_seed=2**63 - 1)
    trainers.build_engine(rule, feedback_seed=0)
    for bad in (2**63, -1):
        with pytest.raises(trainers.ConfigError, match="feedback.seed"):
            trainers.build_engine(rule, feedback_seed=bad)


def test_a_checkpoint_without_a_step_count_resumes_brsfs_draws_from_the_first_step():
    """A state written before the step was recorded (no "steps") continues at step 0 of brsf's draws: the next
    step is the first step of a fresh engine."""
    model, (x, y) = mlp(), batch()
    first = grads(model, trainers.build_engine("brsf", feedback_seed=4), x, y)
    engine = trainers.build_engine("brsf", feedback_seed=4)
    grads(model, engine, x, y)
    state = {k: v for k, v in engine.state_dict().items() if k != "steps"}
    old = trainers.build_engine("brsf", feedback_seed=4)
    old.load_state_dict(state)
    assert all(torch.equal(g, first[n]) for n, g in grads(model, old, x, y).items())


# ---- DFA's one projection ------------------------------------------------------------------------------------


@pytest.mark.parametrize("slices", ["shared", "disjoint"])
def test_dfa_one_projection_is_the_separate_projections_with_the_same_matrices_on_the_stack(slices):
    model = mlp(depth=4, width=5)
    x, y = batch()
    one = trainers.build_engine("dfa", slices=slices, scale="weight", feedback_seed=2)
    got = grads(model, one, x, y)
    D = [m.clone() for m in one.matrices()]
    assert [m.shape for m in D] == [(3, 5)] * 3
    if slices == "shared":  # the same columns of one matrix, each layer at its own scale
        for m in D[1:]:
            assert cosine(m, D[0]) == pytest.approx(1, abs=1e-12) and not torch.equal(m, D[0])
    else:
        assert all(abs(cosine(m, D[0])) < 0.9 for m in D[1:])
    separate = trainers.build_engine("dfa")
    separate.load_state_dict({"feedback": D})
    expected = grads(model, separate, x, y)
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-12, atol=1e-14, msg=name)


class _Widths(nn.Module):
    """Layers of three input widths on a (B, T, d) sequence, an LM-like (B, T, C) output."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.out = nn.Linear(4, 6), nn.Linear(6, 3), nn.Linear(3, 6), nn.Linear(6, 5)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.out(torch.tanh(self.c(torch.tanh(self.b(h)))) + h)


@pytest.mark.parametrize("slices", ["shared", "disjoint"])
def test_dfa_one_projection_is_the_separate_projections_with_the_same_matrices_on_the_layer_path(slices):
    torch.manual_seed(0)
    model = _Widths().double()
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 7, 4, generator=gen, dtype=torch.float64), torch.randint(0, 5, (4, 7), generator=gen)
    one = trainers.build_engine("dfa", slices=slices, scale="glorot")
    got = grads(model, one, x, y, sequence_cross_entropy)
    names = [n for n, _ in covered_layers(model) if n != "a"]  # a reads the data
    D = {n: one.layers.matrix(n).clone() for n in names}
    assert {n: tuple(m.shape) for n, m in D.items()} == {"b": (5, 6), "c": (5, 3), "out": (5, 6)}
    first = {n: m[:, :3] / m[:, :3].norm() for n, m in D.items()}  # the first 3 columns, without the scale
    if slices == "shared":
        assert all(torch.allclose(first[n], first["b"], rtol=1e-12, atol=1e-15) for n in names)
    else:
        assert not any(torch.allclose(first[n], first["b"], rtol=1e-3) for n in ("c", "out"))
    # each D is its columns of the one drawn matrix, at its scale: all from column 0 when shared; when disjoint,
    # side by side, the columns of the three layers one partition of the 15 drawn
    (projection,) = one.layers.projection.values()
    spans = {n: (one.layers.slices[n][1], one.layers.slices[n][1] + D[n].shape[1]) for n in names}
    for n in names:
        columns = projection[:, spans[n][0]:spans[n][1]]
        assert cosine(D[n], columns) == pytest.approx(1, abs=1e-12), n
    if slices == "shared":
        assert projection.shape[1] == 6 and all(start == 0 for start, _ in spans.values())
    else:
        covered = sorted(c for start, end in spans.values() for c in range(start, end))
        assert projection.shape[1] == 15 and covered == list(range(15))
    separate = trainers.build_engine("dfa", path="layers")
    separate.layers.feedback.update(D)
    expected = grads(model, separate, x, y, sequence_cross_entropy)
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-12, atol=1e-14, msg=name)


# ---- alignment in TensorBoard --------------------------------------------------------------------------------


def test_alignment_angles_are_logged_to_tensorboard_and_the_summary(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gradengines.trainers.experiments.summary import alignment_table

    torch.manual_seed(0)
    model = models.build("mlp", in_features=64, out_features=10, depth=3, width=16)
    engine = trainers.build_engine("usf")
    trainer = trainers.Trainer(model, engine, tasks.build("digits"), progress=False, batch_size=32,
                               logdir=tmp_path / "run", log_every=1, grad_agreement_every=2)
    trainer.fit(steps=4)
    last = engine.alignment()
    assert sorted(last) == ["layers.1", "layers.2"]
    for name, B, W in zip(last, engine.matrices(), [model.layers[1].weight, model.layers[2].weight], strict=True):
        cos = (B.flatten() @ W.detach().flatten()) / (B.norm() * W.norm())
        assert last[name] == pytest.approx(math.degrees(math.acos(cos.item())), abs=1e-3)
        assert 0 < last[name] < 90  # sign-concordant feedback never points against W
    acc = EventAccumulator(str(trainer.run_dir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for name in last:
        events = acc.Scalars(f"engine/alignment_deg/{name}")
        assert len(events) == 4
        assert events[-1].value == pytest.approx(last[name], abs=1e-3)
    assert "grad/cosine/layers.1.weight" in tags  # beside the per-layer gradient cosine against backprop
    table = alignment_table({"usf": [{"history": trainer.history}]})
    assert "| usf | 2 |" in table


def test_the_family_compares_on_a_transformers_model_with_its_alignment_in_the_summary(tmp_path):
    """compare.py --trainers fa,usf,brsf,frsf,dfa on transformers' GPT-2 (the layer path): every run finishes,
    and summary.md gives the four chained rules' angles (DFA's D has no forward weight of its shape)."""
    pytest.importorskip("transformers")
    from gradengines.trainers.cli import compare_main

    logdir = tmp_path / "runs"
    assert compare_main(["--model", "transformers:GPT2LMHeadModel", "--model-option", "n_layer=1",
                         "--model-option", "n_embd=8", "--model-option", "n_head=2", "--task", "reverse",
                         "--trainers", "fa,usf,brsf,frsf,dfa", "--steps", "3", "--seeds", "0", "--logdir",
                         str(logdir), "--progress", "false", "--timing-rounds", "5", "--log-every", "1"]) == 0
    experiment = "compare-GPT2LMHeadModel-n_embd=8-n_head=2-n_layer=1-reverse-fa+usf+brsf+frsf+dfa"
    summary = (logdir / experiment / "summary.md").read_text()
    aligned = summary.split("## Alignment of the feedback with the forward weights")[1].split("##")[0]
    rows = [line.split("|")[1].strip() for line in aligned.splitlines() if line.startswith("| ") and "run" not in line]
    assert sorted(rows) == ["brsf", "fa", "frsf", "usf"]
    angles = {line.split("|")[1].strip(): float(line.split("|")[4]) for line in aligned.splitlines()
              if line.startswith("| ") and "run" not in line}
    assert angles["usf"] < 60 < angles["fa"]  # sign-concordant feedback stays near W; random feedback near 90


# ---- the stack path's draws, dtypes, checkpoints and angles ----------------------------------------------------


def convnet_batch(channels=1):
    torch.manual_seed(0)
    model = models.build("convnet", in_features=64, out_features=10, channels=channels, depth=2).double()
    gen = torch.Generator().manual_seed(2)
    return model, torch.randn(5, 64, generator=gen, dtype=torch.float64), torch.randint(0, 10, (5,), generator=gen)


def test_the_glorot_scale_is_the_fan_in_draw_rescaled_by_each_layers_fans():
    """Same seed, same draw: glorot's B / fan_in's B = sqrt(2 / (fan_in + fan_out)) / sqrt(1 / (3 fan_in)) per
    layer, with a convolution's fans C k^2 (in and out) and a dense layer's its in and out features. One output
    channel: a kernel of one row."""
    model, x, y = convnet_batch(channels=1)
    drawn = {}
    for scale in ("fan_in", "glorot"):
        engine = trainers.build_engine("fa", scale=scale)
        grads(model, engine, x, y)
        drawn[scale] = engine.feedback
    fans = [(9, 9), (16, 10)]  # the second convolution 1 -> 1 channel, 3 x 3; the output layer 16 -> 10
    assert [tuple(B.shape) for B in drawn["glorot"]] == [(1, 1, 3, 3), (10, 16)]
    for B, B0, (fan_in, fan_out) in zip(drawn["glorot"], drawn["fan_in"], fans, strict=True):
        ratio = math.sqrt(2 / (fan_in + fan_out)) * math.sqrt(3 * fan_in)
        torch.testing.assert_close(B, B0 * ratio, rtol=1e-12, atol=0)


@pytest.mark.parametrize("rule", ["fa", "dfa"])
def test_the_stack_paths_feedback_follows_the_model_to_another_dtype(rule):
    model, x, y = convnet_batch(channels=2)
    engine = trainers.build_engine(rule, path="stack")
    first = grads(model, engine, x, y)
    after = grads(model.float(), engine, x.float(), y)
    kept = engine.feedback if rule == "fa" else [engine.projection]
    assert all(t.dtype == torch.float32 for t in kept)
    for name, g in first.items():
        assert after[name].dtype == torch.float32
        torch.testing.assert_close(after[name].double(), g, rtol=1e-4, atol=1e-6, msg=name)


def test_fa_on_an_orthogonal_convolution_applies_the_feedback_it_was_given_after_a_load():
    """The random twin of an orthogonal convolution (its adjoint with kernel B) follows B: loading another
    engine's state gives that engine's step, not the twin built from the first B."""
    torch.manual_seed(0)
    model = models.build("ortho_lenet", in_features=64, out_features=10).double()
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 64, generator=gen, dtype=torch.float64), torch.randint(0, 10, (4,), generator=gen)
    engine, other = trainers.build_engine("fa", feedback_seed=1), trainers.build_engine("fa", feedback_seed=2)
    grads(model, engine, x, y)
    expected = grads(model, other, x, y)
    engine.load_state_dict(other.state_dict())
    for name, g in grads(model, engine, x, y).items():
        assert torch.equal(g, expected[name]), name


def test_shared_dfa_slices_on_the_stack_start_at_the_projections_first_column():
    """Launay et al.'s one matrix: with slices=shared every D_l is the first columns of the projection, scaled."""
    model = mlp(depth=4, width=5)
    x, y = batch()
    engine = trainers.build_engine("dfa", slices="shared")
    grads(model, engine, x, y)
    assert engine.projection.shape[1] == 5
    for (offset, width, amplitude), D in zip(engine.slices, engine.matrices(), strict=True):
        assert offset == 0 and torch.equal(D, engine.projection[:, :width] * amplitude)


def test_the_alignment_angle_is_0_for_the_weight_180_for_its_opposite_and_90_across():
    """The angle between B and W in degrees, also where rounding puts the cosine of -W a hair below -1."""
    model = mlp()
    x, y = batch()
    engine = trainers.build_engine("fa")
    grads(model, engine, x, y)
    W = [layer.weight.detach() for layer in model.layers[1:]]
    factors = (0.7, 1.3, 3.0, 5.0, 11.0)
    for sign, angle in ((1.0, 0.0), (-1.0, 180.0)):
        for factor in factors:
            engine.feedback = [sign * factor * w.clone() for w in W]
            grads(model, engine, x, y)
            assert all(a == pytest.approx(angle, abs=1e-5) for a in engine.alignment().values())
    cosines = [nn.functional.cosine_similarity(-f * w.flatten(), w.flatten(), dim=0).item() for f in factors for w in W]
    assert min(cosines) < -1  # the rounding the angle's clamp is for happened here
    across = [w - (w * torch.ones_like(w)).sum() / w.numel() for w in W]  # W with its mean removed ...
    engine.feedback = [torch.ones_like(w) for w in across]  # ... is orthogonal to the all-ones matrix
    model_w = [layer.weight for layer in model.layers[1:]]
    with torch.no_grad():
        for w, a in zip(model_w, across, strict=True):
            w.copy_(a)
    grads(model, engine, x, y)
    assert all(a == pytest.approx(90.0, abs=1e-5) for a in engine.alignment().values())
