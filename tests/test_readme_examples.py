"""The README's "your own model" examples, run as written: an nn.GRU language model with DSF and a
nanoGPT-style model (nanoGPT's module names and config) with Highway-BP, each in a plain loop."""

import dataclasses
import math
import re
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import models
import trainers

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def example(first_line: str) -> str:
    return re.search(rf"```python\n({re.escape(first_line)}.*?)```", README, re.S).group(1)


@dataclasses.dataclass
class GPTConfig:
    """nanoGPT's config fields (the ones its model reads)."""

    block_size: int = 64
    vocab_size: int = 50
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(config.n_embd), CausalSelfAttention(config)
        self.ln_2, self.mlp = nn.LayerNorm(config.n_embd), MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT: its module names, and its forward returning (logits, loss)."""

    def __init__(self, config):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd), wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout), h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1])))
        for block in t.h:
            x = block(x)
        x = t.ln_f(x)
        if targets is None:  # nanoGPT: the last position only
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class RNNModel(nn.Module):
    """pytorch/examples' word_language_model RNNModel: its constructor, forward and init_hidden contracts."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.drop, self.encoder = nn.Dropout(dropout), nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers, self.ntoken = rnn_type, nhid, nlayers, ntoken

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def token_batches(vocab, n=4, length=16):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, vocab, (8, length), generator=gen), torch.randint(0, vocab, (8, length), generator=gen))
            for _ in range(n)]


def test_the_gru_language_model_example_trains_with_dsf():
    vocab = 20
    scope = {"nn": nn, "torch": torch, "F": F, "models": models, "trainers": trainers, "vocab": vocab,
             "batches": token_batches(vocab)}
    torch.manual_seed(0)
    exec(example("class LanguageModel(nn.Module):"), scope)  # noqa: S102 - the README's example
    model = scope["model"]
    assert len(model.recurrent_layers) == 2 and model.rnn.weight_hh_l1.grad is not None


def test_the_nanogpt_example_trains_with_highway_and_matches_backprop_at_full_k():
    vocab = 30
    torch.manual_seed(0)
    scope = {"nn": nn, "torch": torch, "F": F, "models": models, "trainers": trainers, "vocab": vocab,
             "GPT": GPT, "GPTConfig": GPTConfig, "batches": token_batches(vocab)}
    code = example("gpt = GPT(GPTConfig(")
    exec(code, scope)  # noqa: S102 - the README's example
    gpt, stack = scope["gpt"], scope["stack"]
    idx, targets = token_batches(vocab, n=1)[0]
    logits, loss = gpt(idx, targets)
    torch.testing.assert_close(stack(idx), logits)  # the declaration is the model's forward
    gpt.double()  # the README says k >= 2 x n_layer is exactly backprop: check it, in float64
    loss_fn = lambda y, t: F.cross_entropy(y.flatten(0, 1), t.flatten())  # noqa: E731
    exact = trainers.build_engine("backprop")
    exact.compute_grads(stack, idx, targets, loss_fn)
    want = [p.grad.clone() for p in gpt.parameters()]
    trainers.build_engine("highway", k=2 * len(gpt.transformer.h)).compute_grads(stack, idx, targets, loss_fn)
    for p, g in zip(gpt.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)


def test_the_unmodified_models_example_trains_an_rnn_with_dsf_and_nanogpt_with_its_own_loss(tmp_path, monkeypatch):
    """The README's Python example with pytorch/examples' RNNModel and nanoGPT's GPT, on a tiny PTB-format corpus."""
    import sys
    import types

    from helpers import write_tiny_ptb

    write_tiny_ptb(tmp_path, lines=(200, 30, 30), words_per_line=8)
    monkeypatch.setitem(sys.modules, "nanogpt", types.SimpleNamespace(GPT=GPT, GPTConfig=GPTConfig))
    monkeypatch.setitem(sys.modules, "rnn_model", types.SimpleNamespace(RNNModel=RNNModel))
    code = example("import models, tasks, trainers\nfrom nanogpt import").replace("../shared/data/ptb", str(tmp_path))
    torch.manual_seed(0)
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the README's example
    lm, gpt, task = scope["lm"], scope["gpt"], scope["task"]
    assert len(lm.recurrent_layers) == 2 and lm.rnn.weight_hh_l1.grad is not None
    x, y = task.val.inputs[:4], task.val.targets[:4]
    own = gpt(x, y)[1]
    assert models.call_model(gpt, x, y).loss == own  # the loss it returns, every position's logits
    assert models.call_model(gpt, x, y).outputs.shape == (4, x.shape[1], task.num_outputs)
