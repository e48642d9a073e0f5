"""Models as people write them, called through models.call_model without a wrapper class: a
state-taking RNN language model in pytorch/examples' style ((T, B) tokens, forward(input, hidden)
-> (log_probs (T*B, V), hidden)), a nanoGPT-style model (forward(idx, targets=None) -> (logits,
loss), the last position only without targets), a dict and an object with .logits. In float64:
forward and gradients unchanged, and each engine's identities as on the zoo; from the command line,
each trains from a file; every refusal is one line."""

import dataclasses
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import GPT, GPTConfig, assert_same, autograd_grads, engine_grads, relative, write_tiny_ptb
from torch import nn
from torch.nn import functional as F

from gradengines import models, trainers
from gradengines.models.adapters.calling import call_model
from gradengines.tasks.base import sequence_cross_entropy

V, E, H, T, B = 9, 5, 4, 6, 3


class RNNModel(nn.Module):
    """pytorch/examples' word_language_model layout: encoder, rnn (seq-first), decoder, init_hidden."""

    def __init__(self, rnn_type="LSTM", ntoken=V, ninp=E, nhid=H, nlayers=2, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers, self.ntoken = rnn_type, nhid, nlayers, ntoken

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        zeros = weight.new_zeros(self.nlayers, bsz, self.nhid)
        return (zeros, zeros.clone()) if self.rnn_type == "LSTM" else zeros


class DictLM(nn.Module):
    """Returns a dict, Hugging Face style: logits and a hidden state."""

    def __init__(self, vocab=V):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, E), nn.Linear(E, vocab)

    def forward(self, tokens):
        hidden = torch.tanh(self.embed(tokens))
        return {"hidden_states": hidden, "logits": self.head(hidden)}


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    aux: float = 0.0


class ObjectLM(DictLM):
    """Returns an object with .logits."""

    def forward(self, tokens):
        return Output(super().forward(tokens)["logits"])


class CachedMaskLM(nn.Module):
    """pytorch/examples' TransformerModel habits: (T, B) tokens, (T, B, V) log-probs, a mask cached on first use."""

    def __init__(self, ntoken=V, ninp=E):
        super().__init__()
        self.src_mask = None
        self.encoder, self.decoder = nn.Embedding(ntoken, ninp), nn.Linear(ninp, ntoken)

    def forward(self, src, has_mask=True):
        if has_mask and (self.src_mask is None or self.src_mask.size(0) != len(src)):
            self.src_mask = torch.tril(torch.ones(len(src), len(src), device=src.device))
        x = self.encoder(src)  # (T, B, E): each step the mean of the steps so far
        mask = self.src_mask / self.src_mask.sum(1, keepdim=True)
        return F.log_softmax(self.decoder(torch.einsum("ts,sbe->tbe", mask, x)), dim=-1)


def batch(vocab=V, ignore=None):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, vocab, (B, T), generator=gen), torch.randint(0, vocab, (B, T), generator=gen)
    if ignore is not None:
        y[0, :2] = ignore
    return x, y


def grads(model, engine, x, y, loss_fn=sequence_cross_entropy):
    return engine_grads(model, engine, x, y, loss_fn)


def rnn_model(rnn_type="LSTM", zero_recurrent=False):
    torch.manual_seed(0)
    model = models.declare_call(RNNModel(rnn_type).double(), layout="time_first")
    if zero_recurrent:
        with torch.no_grad():
            for k in range(model.nlayers):
                getattr(model.rnn, f"weight_hh_l{k}").zero_()
    return model


def rnn_by_hand(model, x, y):
    """The model's outputs and loss as its authors' training loop computes them, read back as (B, T, V)."""
    log_probs, _ = model(x.t(), model.init_hidden(x.shape[0]))
    return log_probs.view(T, B, V).transpose(0, 1), F.nll_loss(log_probs, y.t().reshape(-1))


# ---- the state-taking RNN language model ---------------------------------------------------------

@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU"])
def test_a_state_taking_rnn_is_called_with_a_fresh_state_and_read_back_batch_first(rnn_type):
    model = rnn_model(rnn_type)
    x, y = batch()
    want, loss = rnn_by_hand(model, x, y)
    torch.testing.assert_close(call_model(model, x, y).outputs, want, rtol=0, atol=0)
    exact = autograd_grads(model, loss)
    assert_same(grads(model, trainers.build_engine("backprop"), x, y), exact, tol=1e-12)
    models.wrap_recurrent(model)  # the recurrent engines' view: the same forward and gradients
    torch.testing.assert_close(call_model(model, x, y).outputs, want, rtol=1e-12, atol=1e-12)
    assert_same(grads(model, trainers.build_engine("backprop"), x, y), exact, tol=1e-12)


@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU"])
def test_highway_over_time_with_k_at_least_t_is_bptt_on_the_state_taking_rnn(rnn_type):
    model = models.wrap_recurrent(rnn_model(rnn_type))
    x, y = batch()
    exact = autograd_grads(model, rnn_by_hand(model, x, y)[1])
    assert_same(grads(model, trainers.build_engine("highway", k=T), x, y), exact)
    approx = grads(model, trainers.build_engine("highway", k=1), x, y)
    assert (approx["rnn.weight_hh_l0"] - exact["rnn.weight_hh_l0"]).norm() > 1e-6


@pytest.mark.parametrize("rnn_type", ["LSTM", "GRU"])
def test_tied_dsf_with_zero_recurrent_weights_is_bptt_on_the_state_taking_rnn(rnn_type):
    """W_hh = 0 leaves the gate's path through time alone: tied DSF is BPTT; with W_hh != 0 it is not."""
    model = models.wrap_recurrent(rnn_model(rnn_type, zero_recurrent=True))
    x, y = batch()
    exact = autograd_grads(model, rnn_by_hand(model, x, y)[1])
    assert_same(grads(model, trainers.build_engine("dsf", feedback="tied"), x, y), exact)
    model = models.wrap_recurrent(rnn_model(rnn_type))  # the contrast: W_hh != 0, a path DSF's feedback leaves out
    exact = autograd_grads(model, rnn_by_hand(model, x, y)[1])
    assert relative(grads(model, trainers.build_engine("dsf", feedback="tied"), x, y), exact) > 1e-2


def test_ftbptt_on_the_state_taking_rnn_is_the_unrolled_cell_with_the_state_detached():
    model = models.wrap_recurrent(rnn_model("GRU"))
    x, y = batch()
    rnn = model.rnn
    inputs = model.encoder(x.t())  # (T, B, E)
    for k in range(model.nlayers):
        w = [getattr(rnn, f"{n}_l{k}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        h, outs = inputs.new_zeros(B, H), []
        for t in range(T):
            h = torch.gru_cell(inputs[t], h.detach(), *w)  # no gradient through time
            outs.append(h)
        inputs = torch.stack(outs)
    loss = F.nll_loss(F.log_softmax(model.decoder(inputs).view(-1, V), dim=1), y.t().reshape(-1))
    assert_same(grads(model, trainers.build_engine("ftbptt"), x, y), autograd_grads(model, loss))


# ---- nanoGPT-style (logits, loss) ------------------------------------------------------------------

def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=8)).double()


def test_a_logits_loss_model_gets_its_targets_and_its_own_loss_on_request():
    model = gpt()
    x, y = batch(ignore=-1)  # nanoGPT's own ignore_index
    logits, loss = model(x, y)
    torch.testing.assert_close(call_model(model, x, y).outputs, logits, rtol=0, atol=0)  # every position
    assert call_model(model, x, y).loss is None  # the task's loss, unless declared
    x, y = batch()  # the task's loss must read the targets: it is compared with the model's on the first use
    exact = autograd_grads(model, model(x, y)[1])
    calls = []

    def task_loss(out, t):
        calls.append(1)
        return sequence_cross_entropy(out, t)

    engine = trainers.build_engine("backprop")
    models.declare_call(model, loss="model")
    assert_same(grads(model, engine, x, y, loss_fn=task_loss), exact, tol=1e-12)
    assert len(calls) == 1  # the comparison on the first batch
    assert_same(grads(model, engine, x, y, loss_fn=task_loss), exact, tol=1e-12)
    assert len(calls) == 1  # afterwards the model's loss alone


def test_a_model_loss_that_cannot_be_compared_with_the_tasks_is_one_line():
    model = models.declare_call(gpt(), loss="model")
    x, y = batch(ignore=-1)  # nanoGPT's ignore index, which the task's loss (-100) reads as a class
    with pytest.raises(models.ModelConfigError, match="the task's loss, which it is compared with, cannot be") \
            as info:
        grads(model, trainers.build_engine("backprop"), x, y)
    assert "\n" not in str(info.value)


# ---- a model that computes its own loss against shifted labels (transformers' causal LMs) ---------

class ShiftingLM(DictLM):
    """transformers' causal-LM contract: ``labels`` are shifted inside (position t scored against
    labels[t + 1]) unless ``shift_labels`` are given; the loss on float32 logits."""

    def __init__(self, vocab=V, scale=1.0):
        super().__init__(vocab)
        self.scale, self.seen = scale, []

    def forward(self, tokens, labels=None, shift_labels=None):
        self.seen.append(sorted(k for k, v in (("labels", labels), ("shift_labels", shift_labels)) if v is not None))
        logits = self.scale * super().forward(tokens)["logits"]
        loss = None
        if labels is not None:
            if shift_labels is None:
                shift_labels = F.pad(labels, (0, 1), value=-100)[:, 1:]
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), shift_labels.reshape(-1))
        return {"logits": logits, "loss": loss}


def test_labels_are_passed_only_when_the_models_loss_is_used():
    torch.manual_seed(0)
    model = ShiftingLM().double()
    x, y = batch()
    assert models.adapters.calling.describe(model) == "model(inputs)"
    trainers.build_engine("backprop").compute_grads(model, x, y, sequence_cross_entropy)
    assert model.seen == [[]]  # no loss computed that nothing reads
    models.declare_call(model, loss="model", targets="labels+shift_labels")
    assert models.adapters.calling.describe(model) == "model(inputs, labels=targets, shift_labels=targets)"


@pytest.mark.parametrize("scale", [1.0, 1e-5])
def test_a_model_loss_against_shifted_labels_is_refused_in_one_line(scale):
    torch.manual_seed(0)
    model = models.declare_call(ShiftingLM(scale=scale).double(), loss="model")  # auto: labels=targets
    x, y = batch()
    logits = model(x)["logits"]
    gap = abs(model(x, labels=y)["loss"] - sequence_cross_entropy(logits, y)) / sequence_cross_entropy(logits, y)
    assert (gap > 1e-3) if scale == 1.0 else (gap < 1e-5)  # near-uniform logits: the values nearly agree
    with pytest.raises(models.ModelConfigError) as info:
        trainers.build_engine("backprop").compute_grads(model, x, y, sequence_cross_entropy)
    message = str(info.value)
    assert "is the task's loss against targets shifted once more" in message and "\n" not in message
    assert "targets=labels+shift_labels" in message
    assert all(p.grad is None for p in model.parameters())  # refused before any gradient is written


def test_a_model_loss_given_unshifted_targets_is_the_tasks_and_trains_as_backprop():
    torch.manual_seed(0)
    model = ShiftingLM().double()
    x, y = batch()
    exact = autograd_grads(model, sequence_cross_entropy(model(x)["logits"], y))
    models.declare_call(model, loss="model", targets="labels+shift_labels")
    assert_same(grads(model, trainers.build_engine("backprop"), x, y), exact, tol=1e-6)  # own loss: float32
    model.seen.clear()
    with pytest.raises(models.ModelConfigError):  # the same model and call without shift_labels
        grads(models.declare_call(model, loss="model", targets="labels"), trainers.build_engine("backprop"), x, y)


class AuxiliaryLM(ShiftingLM):
    """A model whose own loss is its cross-entropy plus an auxiliary term that does not read the logits (a
    mixture-of-experts router's load-balancing loss, here a penalty on the embedding): a loss that differs from
    the task's on purpose. ``shift``: its labels are shifted inside too (the double shift, auxiliary term and all)."""

    def __init__(self, shift=False):
        super().__init__()
        self.shift = shift

    def forward(self, tokens, labels=None, shift_labels=None):
        out = super().forward(tokens, labels, None if self.shift else labels if shift_labels is None else shift_labels)
        if out["loss"] is not None:
            out["loss"] = out["loss"] + 0.3 * self.embed.weight.pow(2).mean()
        return out


def test_a_models_own_loss_with_an_auxiliary_term_trains_as_autograd_of_that_loss():
    torch.manual_seed(0)
    model = models.declare_call(AuxiliaryLM().double(), loss="model")
    x, y = batch()
    own = model(x, labels=y)["loss"]
    exact = autograd_grads(model, own)
    task = autograd_grads(model, sequence_cross_entropy(model(x)["logits"], y))
    assert relative(exact, task) > 1e-2  # the auxiliary term moves the gradient: a contrast
    got = grads(model, trainers.build_engine("backprop"), x, y)
    assert relative(got, exact) < 1e-12
    difference = models.adapters.calling.own_loss_difference(model)
    assert difference.startswith(f"the model's own loss is {float(own):.6g} where the task's loss of its outputs is ")
    apart = float(re.search(r"its gradient at the outputs (\S+) relative apart", difference)[1])
    assert apart < 1e-6  # the auxiliary term does not read the logits (float32 rounding of the model's loss only)
    models.declare_call(model, loss="own")  # declared to differ: nothing to say
    assert_same(grads(model, trainers.build_engine("backprop"), x, y), exact, tol=1e-12)
    assert models.adapters.calling.own_loss_difference(model) is None


def test_the_double_shift_under_an_auxiliary_term_is_still_refused():
    torch.manual_seed(0)
    model = models.declare_call(AuxiliaryLM(shift=True).double(), loss="own")  # even declared to differ
    x, y = batch()
    with pytest.raises(models.ModelConfigError, match="shifted once more"):
        grads(model, trainers.build_engine("backprop"), x, y)
    assert all(p.grad is None for p in model.parameters())


def test_the_trainer_says_how_far_a_models_own_loss_is_in_one_line(capsys):
    from gradengines import tasks

    task = tasks.build("copy", n_train=16, n_val=8, n_test=8, delay=2, length=3)
    vocab = task.num_outputs
    model = models.declare_call(AuxiliaryLM().double(), loss="model")
    tokens = int(task.train.inputs.max()) + 1
    model.embed, model.head = nn.Embedding(tokens, E).double(), nn.Linear(E, vocab).double()
    trainers.Trainer(model, trainers.build_engine("backprop"), task, dtype="float64")
    notes = [line for line in capsys.readouterr().err.splitlines() if "loss=model" in line]
    assert len(notes) == 1 and notes[0].startswith("note: loss=model: the model's own loss is ")
    assert "declare_call(model, loss='own') declares that it differs" in notes[0]
    models.declare_call(model, loss="own")
    trainers.Trainer(model, trainers.build_engine("backprop"), task, dtype="float64")
    assert "loss=model" not in capsys.readouterr().err


def test_float32_rounding_of_a_models_own_loss_is_accepted():
    torch.manual_seed(0)
    model = models.declare_call(ShiftingLM(), loss="model", targets="labels+shift_labels")  # float32
    x, y = batch()
    with torch.no_grad():
        model.head.weight.mul_(30)  # large logits: the float32 loss rounds differently from a float64 one
    own = model(x, labels=y, shift_labels=y)["loss"]
    assert own.item() != sequence_cross_entropy(model(x)["logits"].double(), y).item()
    got = grads(model, trainers.build_engine("backprop"), x, y)
    assert all(p.grad is not None for p in model.parameters())
    assert relative(got, autograd_grads(model, own)) < 1e-5  # the gradient of the model's own loss, float32


def gpt_stack(model, x, y):
    t = model.transformer
    return models.residual_stack(
        model, stem=lambda idx: t.wte(idx) + t.wpe(torch.arange(idx.shape[1])),
        blocks=[pair for b in t.h for pair in ((b.ln_1, b.attn), (b.ln_2, b.mlp))],
        head=lambda h: model.lm_head(t.ln_f(h)), example=(x, y))


def test_highway_on_the_logits_loss_model_is_backprop_of_its_own_loss_at_full_k():
    model = gpt()
    x, y = batch()
    stack = gpt_stack(model, x, y)  # checked against the logits the model returns with targets
    exact = autograd_grads(model, model(x, y)[1])
    highway = engine_grads(stack, trainers.build_engine("highway", k=2 * len(model.transformer.h)), x, y,
                           sequence_cross_entropy, strip="model.")
    assert_same(highway, exact)


def test_a_declaration_checked_without_targets_sees_the_last_position_only():
    model = gpt()
    x, _ = batch()
    with pytest.raises(models.ModelConfigError, match=r"the model.s output, model\(inputs\) read as .*, is "
                                                      r"\(3, 1, 9\); the likely cause: a forward that returns other "
                                                      r"outputs without targets"):
        gpt_stack(model, x, None)


# ---- dict and object outputs -----------------------------------------------------------------------

@pytest.mark.parametrize("cls", [DictLM, ObjectLM])
def test_dict_and_object_outputs_are_read_at_their_logits(cls):
    torch.manual_seed(0)
    model = cls().double()
    x, y = batch()
    logits = DictLM.forward(model, x)["logits"]
    torch.testing.assert_close(call_model(model, x, y).outputs, logits, rtol=0, atol=0)
    exact = autograd_grads(model, sequence_cross_entropy(logits, y))
    assert_same(grads(model, trainers.build_engine("backprop"), x, y), exact, tol=1e-12)
    report = trainers.gradient_agreement(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
    assert report["global"] == pytest.approx(1.0, abs=1e-12)


def test_a_declared_output_reads_another_part():
    torch.manual_seed(0)
    model = models.declare_call(DictLM().double(), output="hidden_states")
    x, y = batch()
    torch.testing.assert_close(call_model(model, x, y).outputs, torch.tanh(model.embed(x)))


class TwoTensors(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return {"scores": self.head(x), "features": x}


class ListFirst(TwoTensors):
    def forward(self, x):
        return ["not a tensor", self.head(x)]


@pytest.mark.parametrize("model, call, expected", [
    (TwoTensors(), {}, "returns a dict with keys scores, features and none is 'logits'; say which part is the "
                       "output: --model-call output="),
    (ListFirst(), {}, "returns a list whose first element is str, not a tensor"),
    (TwoTensors(), {"output": "logits"}, "returns a dict with keys scores, features, which has no output 'logits'"),
    (ListFirst(), {"output": 5}, "returns a list of 2; output 5 is not one of its positions"),
    (ListFirst(), {"output": 1, "loss": "model"}, "loss=model, but the forward returns no single scalar loss"),
    (TwoTensors(), {"state": "init_hidden"}, "TwoTensors has no method 'init_hidden'"),
    (TwoTensors(), {"targets": "labels"}, "forward has no parameter 'labels'"),
    (TwoTensors(), {"targets": "labels+shift_labels"}, "forward has no parameter 'labels'"),
])
def test_a_return_value_that_cannot_be_read_is_one_line(model, call, expected):
    models.declare_call(model, **call)
    with pytest.raises(models.ModelConfigError) as info:
        call_model(model, torch.ones(2, 4), torch.zeros(2, dtype=torch.long))
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("field, value, expected", [("layout", "seq_first", "layout is batch_first or time_first"),
                                                    ("loss", "mine", "loss is task or model"),
                                                    ("output", "", "output is a tuple index"),
                                                    ("state", "a b", "state is auto, none, no or a name"),
                                                    ("targets", "labels+", "targets is auto, no, a keyword or")])
def test_a_bad_declaration_is_one_line(field, value, expected):
    with pytest.raises(models.ModelConfigError, match=expected):
        models.ModelCall(**{field: value})


# ---- the command line: each style from a file, no wrapper ------------------------------------------

@pytest.fixture
def model_file(tmp_path):
    import inspect

    import helpers

    source = ("import dataclasses\nimport math\n\nimport torch\nfrom torch import nn\n"
              f"from torch.nn import functional as F\n\nV, E, H, T = {V}, {E}, {H}, {T}\n\n")
    for obj in (RNNModel, GPTConfig, helpers.CausalSelfAttention, helpers.MLP, helpers.Block, GPT, DictLM, Output,
                ObjectLM, CachedMaskLM):
        source += ("@dataclasses.dataclass\n" if obj is Output else "") + inspect.getsource(obj) + "\n\n"
    source += textwrap.dedent(f'''
        def nanogpt(vocab_size={V}):  # nanoGPT's GPT(config), sized by a factory
            return GPT(GPTConfig(vocab_size=vocab_size, block_size={T}, n_layer=2, n_head=2, n_embd=8))


        def gpt_stack(vocab_size={V}):  # a declaration, not a wrapper: Highway-BP needs the residual path
            from gradengines import models
            model = nanogpt(vocab_size)
            t = model.transformer
            idx = torch.zeros(2, {T}, dtype=torch.long)
            return models.residual_stack(
                model, stem=lambda i: t.wte(i) + t.wpe(torch.arange(i.shape[1])),
                blocks=[pair for b in t.h for pair in ((b.ln_1, b.attn), (b.ln_2, b.mlp))],
                head=lambda h: model.lm_head(t.ln_f(h)), example=(idx, idx))
    ''')
    path = tmp_path / "user_lms.py"
    path.write_text(source)
    return path


@pytest.fixture
def ptb(tmp_path):
    """A tiny PTB-format word corpus of 7 words (+ <unk>, <eos>: V = 9)."""
    return ["--task", "ptb-word", "--data-dir", str(write_tiny_ptb(tmp_path)), "--task-option", f"seq_len={T}",
            "--steps", "2", "--progress", "false", "--experiment", "e", "--logdir", str(tmp_path / "runs")]


def result(ptb, run):
    return json.loads((Path(ptb[ptb.index("--logdir") + 1]) / "e" / run / "seed0" / "result.json").read_text())


@pytest.mark.parametrize("model, trainers_, call", [
    ("RNNModel", ["backprop", "dsf", "ftbptt", "highway"], ["layout=time_first"]),
    ("nanogpt", ["backprop"], ["loss=model"]),
    ("gpt_stack", ["highway"], []),
    ("DictLM", ["backprop"], []),
    ("ObjectLM", ["backprop"], []),
    ("CachedMaskLM", ["backprop"], ["layout=time_first"]),  # never run on meta tensors (its cache kept one)
])
def test_each_style_trains_from_a_file_without_a_wrapper(model, trainers_, call, model_file, ptb):
    from gradengines.trainers.cli import train_main

    size = ["--model-option", f"ntoken={V}"] if model == "RNNModel" else []
    for trainer in trainers_:
        flags = [f for c in call for f in ("--model-call", c)]
        assert train_main(["--model", f"{model_file}:{model}", *size, *flags, "--trainer", trainer, *ptb]) == 0
        record = result(ptb, trainer)
        assert record["steps"] == 2 and record["final_val"]["perplexity"] < 2 * V  # trained, finite
        assert record["model"].get("call") == (", ".join(call) or None)


def test_the_command_line_refuses_what_it_cannot_call_in_one_line(model_file, ptb, capsys):
    from gradengines.trainers.cli import train_main

    cases = [
        (["--model", f"{model_file}:RNNModel", "--model-option", f"ntoken={V}"],
         "called as model(inputs, model.init_hidden(B)); a model that reads (T, B) inputs needs --model-call "
         "layout=time_first"),
        (["--model", f"{model_file}:DictLM", "--model-call", "shape=1"], "--model-call has no key 'shape'"),
        (["--model", f"{model_file}:DictLM", "--model-call", "output=scores"], "which has no output 'scores'"),
        (["--model", f"{model_file}:DictLM", "--model-call", "layout=tb"], "layout is batch_first or time_first"),
    ]
    for flags, expected in cases:
        assert train_main([*flags, *ptb]) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err


def test_a_resume_under_another_declared_call_is_refused_in_one_line(model_file, ptb, capsys):
    from gradengines.trainers.cli import train_main

    flags = ["--model", f"{model_file}:nanogpt", "--checkpoint-every", "1", *ptb]
    assert train_main([*flags, "--model-call", "loss=model"]) == 0
    capsys.readouterr()
    assert train_main([*flags, "--steps", "3", "--resume"]) == 2  # the later --steps wins
    err = capsys.readouterr().err
    assert "its checkpoint is of another model (call 'loss=model' there, None here)" in err and err.count("\n") == 1
    assert train_main([*flags, "--steps", "3", "--resume", "--model-call", "loss=model"]) == 0


def test_a_required_targets_keyword_among_several_is_not_read_as_a_state():
    class Required(nn.Module):
        def forward(self, tokens, labels, shift_labels=None):
            return tokens.float()

    model = models.declare_call(Required(), targets="labels+shift_labels")
    assert models.adapters.calling.describe(model) == "model(inputs, labels=targets, shift_labels=targets)"


class UntrainableLossLM(ShiftingLM):
    """Its own loss made untrainable: detached, constant in the parameters, or not finite."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, tokens, labels=None, shift_labels=None):
        out = super().forward(tokens, labels, labels if shift_labels is None else shift_labels)
        if out["loss"] is not None:
            out["loss"] = {"detached": out["loss"].detach(), "constant": out["logits"].sum() * 0 + 2.0,
                           "nan": out["loss"] * float("nan")}[self.how]
        return out


@pytest.mark.parametrize("mode", ["model", "own"])
@pytest.mark.parametrize("how, said", [("detached", "has no gradient on the first batch (detached from the graph)"),
                                       ("constant", "has no gradient on the first batch (constant in every parameter)"),
                                       ("nan", "the model's own loss is nan on the first batch")])
def test_an_own_loss_that_cannot_train_is_refused_before_the_run_in_the_mode_declared(tmp_path, how, said, mode):
    from gradengines import tasks

    task = tasks.build("copy", n_train=16, n_val=8, n_test=8, delay=2, length=3)
    model = models.declare_call(UntrainableLossLM(how).double(), loss=mode)
    model.embed, model.head = nn.Embedding(int(task.train.inputs.max()) + 1, E).double(), \
        nn.Linear(E, task.num_outputs).double()
    with pytest.raises(trainers.ConfigError) as refused:
        trainers.Trainer(model, trainers.build_engine("backprop"), task, dtype="float64", logdir=tmp_path)
    assert str(refused.value).startswith(f"model call: loss={mode}, but ") and said in str(refused.value)
    assert "\n" not in str(refused.value) and not any(tmp_path.iterdir())
