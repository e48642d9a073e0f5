"""A user's language model written with torch.nn.GRU / nn.LSTM (not the zoo's layers), wrapped in
place by models.wrap_recurrent: its forward and Parameters unchanged, and in float64 the identities
DSF, FT-BPTT and Highway-BP have on the zoo."""

import pytest
import torch
from helpers import assert_same, engine_grads, relative
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import sequence_cross_entropy
from gradengines.trainers.core.errors import ModelConfigError

V, E, H, T = 11, 6, 5, 7


class GRULanguageModel(nn.Module):
    """The way users write it: embedding, a 2-layer nn.GRU (batch_first=False), a head."""

    def __init__(self, cell=nn.GRU, batch_first=False, layers=2, vocab_in=V, vocab_out=V):
        super().__init__()
        self.batch_first = batch_first
        self.embedding = nn.Embedding(vocab_in, E)
        self.rnn = cell(E, H, num_layers=layers, batch_first=batch_first)
        self.head = nn.Linear(H, vocab_out)

    def forward(self, tokens, state=None):  # tokens (B, T)
        x = self.embedding(tokens)
        if not self.batch_first:
            x = x.transpose(0, 1)
        out, _ = self.rnn(x, state)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return self.head(out)  # (B, T, V)


def user_model(cell=nn.GRU, batch_first=False, zero_recurrent=False, layers=2):
    torch.manual_seed(0)
    model = GRULanguageModel(cell, batch_first, layers).double()
    if zero_recurrent:
        with torch.no_grad():
            for k in range(layers):
                getattr(model.rnn, f"weight_hh_l{k}").zero_()
    return model


def batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (3, T), generator=gen), torch.randint(0, V, (3, T), generator=gen)


def grads(model, engine, x, y):
    return engine_grads(model, engine, x, y, sequence_cross_entropy)


@pytest.mark.parametrize("cell, batch_first", [(nn.GRU, False), (nn.GRU, True), (nn.LSTM, False), (nn.LSTM, True),
                                               (nn.RNN, False)])
def test_wrapping_keeps_the_forward_the_parameters_and_backprop(cell, batch_first):
    model = user_model(cell, batch_first)
    x, y = batch()
    before_out, before_grads = model(x), grads(model, trainers.build_engine("backprop"), x, y)
    params, keys = [p for p in model.parameters()], list(model.state_dict())
    assert models.wrap_recurrent(model) is model and len(model.recurrent_layers) == 2
    assert [p for p in model.parameters()] == params and all(a is b for a, b in zip(model.parameters(), params,
                                                                                     strict=True))
    assert list(model.state_dict()) == keys
    assert model.recurrent_layers[1].rnn.weight_ih_l0 is model.rnn.weight_ih_l1  # shared, not copied
    torch.testing.assert_close(model(x), before_out, rtol=1e-12, atol=1e-12)
    assert_same(grads(model, trainers.build_engine("backprop"), x, y), before_grads, tol=1e-12)
    # an initial state, in the user's layout
    h0 = torch.randn(2, 3, H, dtype=torch.float64)
    state = (h0, torch.randn(2, 3, H, dtype=torch.float64)) if cell is nn.LSTM else h0
    wrapped_out = model(x, state)
    original = user_model(cell, batch_first)
    torch.testing.assert_close(wrapped_out, original(x, state), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
def test_tied_dsf_with_zero_recurrent_weights_is_bptt(cell):
    """With W_hh = 0 the only path through time is the gate's (GRU: h_t = z_t h_{t-1} + ...; LSTM:
    c_t = f_t c_{t-1} + ...): DSF with the tied feedback is exact BPTT, as on the zoo's layers."""
    model = models.wrap_recurrent(user_model(cell, zero_recurrent=True))
    x, y = batch()
    exact = grads(model, trainers.build_engine("backprop"), x, y)
    assert_same(grads(model, trainers.build_engine("dsf", feedback="tied"), x, y), exact)


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
def test_tied_dsf_with_nonzero_recurrent_weights_is_not_bptt(cell):
    """The contrast to the identity above: with W_hh != 0 the path through W_hh, which DSF's diagonal feedback
    leaves out, carries part of the gradient through time."""
    model = models.wrap_recurrent(user_model(cell))
    x, y = batch()
    exact = grads(model, trainers.build_engine("backprop"), x, y)
    tied = grads(model, trainers.build_engine("dsf", feedback="tied"), x, y)
    assert relative(tied, exact) > 1e-2 and relative(tied["rnn.weight_hh_l0"], exact["rnn.weight_hh_l0"]) > 1e-2


def test_ftbptt_is_dsf_with_a_zero_feedback_and_differs_from_bptt():
    model = models.wrap_recurrent(user_model())
    x, y = batch()
    ft = grads(model, trainers.build_engine("ftbptt"), x, y)
    assert_same(grads(model, trainers.build_engine("dsf", feedback="constant", decay=0.0), x, y), ft)
    exact = grads(model, trainers.build_engine("backprop"), x, y)
    assert (ft["rnn.weight_hh_l0"] - exact["rnn.weight_hh_l0"]).norm() > 1e-3 * exact["rnn.weight_hh_l0"].norm()


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
def test_highway_over_time_with_k_at_least_T_is_bptt(cell):
    model = models.wrap_recurrent(user_model(cell))
    x, y = batch()
    exact = grads(model, trainers.build_engine("backprop"), x, y)
    for k in (T - 1, T):  # no path through T steps crosses more than T - 1 of them
        assert_same(grads(model, trainers.build_engine("highway", k=k), x, y), exact)


@pytest.mark.parametrize("cell", [nn.GRU, nn.LSTM])
def test_highway_over_time_with_k_below_T_is_not_bptt_and_at_k0_is_its_own_rule(cell):
    """The contrast to the identity above: k < T - 1 leaves out the paths through time that cross more than k
    steps' W_hh, so every such k differs from BPTT. At k = 0 only the residual path K_t is left, as on the zoo:
    on a GRU (K_t = z_t) that is DSF with the tied feedback; on an LSTM (the errors arrive on h, K carries c
    only) it is FT-BPTT."""
    model = models.wrap_recurrent(user_model(cell))
    x, y = batch()
    exact = grads(model, trainers.build_engine("backprop"), x, y)
    gaps = [relative(grads(model, trainers.build_engine("highway", k=k), x, y), exact) for k in range(T - 1)]
    assert gaps[0] > 1e-2 and min(gaps) > 1e-8, gaps
    name, options = ("dsf", {"feedback": "tied"}) if cell is nn.GRU else ("ftbptt", {})
    assert_same(grads(model, trainers.build_engine("highway", k=0), x, y),
                grads(model, trainers.build_engine(name, **options), x, y), tol=1e-12)


def test_a_wrapped_model_trains_through_the_trainer_updating_the_users_parameters():
    from gradengines import tasks

    task = tasks.build("copy", n_symbols=4, length=3, delay=2, n_train=64, n_val=16, n_test=16)
    torch.manual_seed(0)
    model = models.wrap_recurrent(GRULanguageModel(vocab_in=8, vocab_out=task.num_outputs))
    weight, before = model.rnn.weight_hh_l1, model.rnn.weight_hh_l1.detach().clone()
    trainers.Trainer(model, trainers.build_engine("dsf"), task, batch_size=16, progress=False).fit(steps=3)
    assert model.rnn.weight_hh_l1 is weight and not torch.equal(weight.detach(), before)


@pytest.mark.parametrize("module, expected", [
    (nn.GRU(3, 4, bidirectional=True), "(GRU) is bidirectional"),
    (nn.LSTM(3, 4, num_layers=2, dropout=0.1), "(LSTM) has dropout between its layers"),
    (nn.LSTM(3, 4, proj_size=2), "(LSTM) projects its hidden state"),
    (nn.RNN(3, 4, nonlinearity="relu"), "(RNN) uses ReLU"),
    (nn.Linear(3, 4), "Linear holds no nn.GRU, nn.LSTM or nn.RNN module"),
])
def test_what_cannot_be_wrapped_is_refused_in_one_line(module, expected):
    with pytest.raises(models.ModelConfigError) as err:
        models.wrap_recurrent(nn.Sequential(module) if not isinstance(module, nn.Linear) else module)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert "forward" not in module.__dict__  # nothing changed


def test_the_command_line_wraps_a_users_recurrent_model_for_dsf(tmp_path, capsys):
    """--model file.py:Class with an nn.GRU inside: DSF accepts it without a factory; compare includes
    the recurrent trainers; a bidirectional GRU is left unwrapped for backprop and refused by DSF in one line."""
    import json
    import textwrap

    from gradengines.trainers.cli import compare_main, train_main

    path = tmp_path / "lm.py"
    path.write_text(textwrap.dedent('''
        from torch import nn

        class LM(nn.Module):
            def __init__(self, vocab=8, out=5, hidden=8, bidirectional=False):
                super().__init__()
                self.embed = nn.Embedding(vocab, hidden)
                self.rnn = nn.GRU(hidden, hidden, num_layers=2, batch_first=True, bidirectional=bidirectional)
                self.head = nn.Linear(hidden * (2 if bidirectional else 1), out)

            def forward(self, tokens):
                return self.head(self.rnn(self.embed(tokens))[0])
    '''))
    task = ["--task", "copy", "--task-option", "n_symbols=4", "--task-option", "length=3", "--task-option", "delay=2",
            "--steps", "2", "--progress", "false", "--experiment", "e"]
    assert train_main(["--model", f"{path}:LM", "--trainer", "dsf", *task, "--logdir", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "e" / "dsf" / "seed0" / "result.json").read_text())["steps"] == 2
    assert compare_main(["--model", f"{path}:LM", *task, "--seeds", "0", "--timing-rounds", "5",
                         "--logdir", str(tmp_path / "b")]) == 0  # 5 timing rounds: which trainers run is asked here
    runs = sorted(p.name for p in (tmp_path / "b" / "e").iterdir() if p.is_dir())
    assert {"backprop", "dsf", "ftbptt", "highway"} <= set(runs)
    capsys.readouterr()
    bidirectional = ["--model", f"{path}:LM", "--model-option", "bidirectional=True", *task]
    assert train_main([*bidirectional, "--logdir", str(tmp_path / "c")]) == 0  # backprop needs no structure
    assert train_main([*bidirectional, "--trainer", "dsf", "--logdir", str(tmp_path / "d")]) == 2
    assert "trainer 'dsf' needs a model with recurrent layers" in capsys.readouterr().err
    # Highway-BP says the real reason too, not only that no repeated blocks were found
    assert train_main([*bidirectional, "--trainer", "highway", "--logdir", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "LM's recurrent modules cannot be its recurrent layers (" in err, err
    assert "is bidirectional" in err and "no residual stack was found in it" in err


@pytest.mark.filterwarnings("ignore:dropout option adds dropout after all but last recurrent layer")
def test_the_command_line_says_why_a_recurrent_model_was_refused(tmp_path, capsys):
    """Dropout between two GRU layers cannot be wrapped: --trainer dsf says so, not only that the model 'is
    not one'; a one-layer GRU with dropout (which torch ignores) is accepted."""
    from gradengines.trainers.cli import train_main

    source = ("import torch\nfrom torch import nn\n\n\nclass LM(nn.Module):\n"
              "    def __init__(self, layers=2, out_features=10):\n        super().__init__()\n"
              "        self.embed = nn.Embedding(16, 8)\n"
              "        self.rnn = nn.GRU(8, 8, num_layers=layers, dropout=0.5, batch_first=True)\n"
              "        self.head = nn.Linear(8, out_features)\n\n"
              "    def forward(self, x):\n        return self.head(self.rnn(self.embed(x))[0])\n")
    (tmp_path / "lm.py").write_text(source)
    flags = ["--trainer", "dsf", "--task", "copy", "--task-option", "length=3", "--task-option", "delay=2",
             "--steps", "2", "--progress", "false", "--logdir", str(tmp_path / "runs")]
    assert train_main([*flags, "--model", f"{tmp_path / 'lm.py'}:LM"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has dropout between its layers" in err, err
    assert train_main([*flags, "--model", f"{tmp_path / 'lm.py'}:LM", "--model-option", "layers=1"]) == 0


def test_a_model_file_imports_a_module_beside_it(tmp_path, capsys):
    from gradengines.trainers.cli import train_main

    (tmp_path / "helper_net_mod.py").write_text(
        "from torch import nn\n\n\nclass Net(nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))\n")
    (tmp_path / "entry.py").write_text("from helper_net_mod import Net  # beside this file, no PYTHONPATH\n")
    assert train_main(["--model", f"{tmp_path / 'entry.py'}:Net", "--steps", "2", "--progress", "false",
                       "--logdir", str(tmp_path / "runs")]) == 0, capsys.readouterr().err


class DetachingLayer(nn.Module):
    """A user's own recurrent layer (the RecurrentLayer protocol) whose states may be detached from its weights."""

    def __init__(self, d: int, detach: bool):
        super().__init__()
        self.mix, self.state_size, self.detach = nn.Linear(2 * d, d), d, detach

    def cell(self, x_t, h_prev):
        return torch.tanh(self.mix(torch.cat([x_t, h_prev], -1)))

    def cell_with_gate(self, x_t, h_prev):
        return self.cell(x_t, h_prev), torch.zeros_like(h_prev)

    def forward_sequence(self, x, h0=None):
        h, states = (x.new_zeros(x.shape[0], self.state_size) if h0 is None else h0), []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            states.append(h)
        states = torch.stack(states, 1)
        return states.detach() if self.detach else states

    def output(self, states):
        return states

    def forward(self, x, h0=None):
        return self.output(self.forward_sequence(x, h0))


class DeclaredLM(nn.Module):
    def __init__(self, detach: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(7, 6), nn.Linear(6, 7)
        self.recurrent_layers = nn.ModuleList([DetachingLayer(6, detach)])

    def forward(self, x):
        return self.head(self.recurrent_layers[0](self.embed(x)))


@pytest.mark.parametrize("engine, options", [("dsf", {}), ("ftbptt", {}), ("tbptt", {"k": 5}), ("highway", {"k": 5})])
def test_a_declared_layer_whose_states_are_detached_is_refused_naming_its_parameters(engine, options):
    """Autograd gives the weights of a layer that detaches its states no gradient; an engine that recomputes
    the cell would train them: refused in one line naming them. The same layer without the detach trains, and
    backprop (autograd itself) is never refused."""
    x, y = torch.randint(0, 7, (3, 5)), torch.randint(0, 7, (3, 5))

    def loss_fn(out, t):
        return nn.functional.cross_entropy(out.reshape(-1, 7), t.reshape(-1))

    detached = DeclaredLM(detach=True)
    with pytest.raises(ModelConfigError, match=r"recurrent layer 0 \(DetachingLayer\) returns states detached from "
                                               r"its parameters \(recurrent_layers\.0\.mix\.weight, "
                                               r"recurrent_layers\.0\.mix\.bias\)") as err:
        trainers.build_engine(engine, **options).compute_grads(detached, x, y, loss_fn)
    assert "\n" not in str(err.value) and detached.recurrent_layers[0].mix.weight.grad is None
    trainers.build_engine("backprop").compute_grads(detached, x, y, loss_fn)
    assert not detached.recurrent_layers[0].mix.weight.grad.any()  # autograd's own answer: no gradient through
    attached = DeclaredLM(detach=False)
    trainers.build_engine(engine, **options).compute_grads(attached, x, y, loss_fn)
    assert attached.recurrent_layers[0].mix.weight.grad.abs().sum() > 0
