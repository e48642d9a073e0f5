"""Helpers shared by test files (import as ``from helpers import ...``; tests/ is on pytest's path).

Gradients: ``engine_grads`` (one engine step, the grads by name), ``autograd_grads``, and the measures
``relative``, ``cosine``, ``max_relative`` and ``assert_same``. Data: ``write_tiny_ptb`` (a seeded word corpus) and
``write_ptb_text`` (given text). Models: nanoGPT's ``GPTConfig``, ``CausalSelfAttention``, ``MLP``,
``Block`` and ``GPT`` (its module names, shapes and forward contract). Time: ``FakeClock``, ``TimedBackprop``.
"""

import dataclasses
import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.core.engine import trainable_parameters
from gradengines.trainers.engines.backprop import Backprop

# ---- gradients ---------------------------------------------------------------------------------------------


def engine_grads(model, engine, inputs, targets, loss_fn=cross_entropy_loss, *, strip: str = "") -> dict:
    """One ``engine.compute_grads`` on the batch: ``{name: p.grad clone}`` for every trainable parameter,
    each name without the prefix ``strip`` (``"model."``: a declared stack's names as its model's)."""
    engine.compute_grads(model, inputs, targets, loss_fn)
    return {name.removeprefix(strip): p.grad.clone() for name, p in trainable_parameters(model)}


def autograd_grads(model, loss) -> dict:
    """``{name: d loss / d p}`` for every trainable parameter, by ``torch.autograd.grad`` (``.grad`` untouched)."""
    named = trainable_parameters(model)
    return dict(zip((n for n, _ in named), torch.autograd.grad(loss, [p for _, p in named]), strict=True))


def relative(a, b) -> float:
    """|a - b| / |b| of two tensors, or of two gradient dicts with the same names read as one vector."""
    if isinstance(b, torch.Tensor):
        return ((a - b).norm() / b.norm()).item()
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    num = sum((a[k] - b[k]).norm().item() ** 2 for k in b)
    return (num / sum(v.norm().item() ** 2 for v in b.values())) ** 0.5


def cosine(a, b) -> float:
    """<a, b> / (|a| |b|) of two tensors, or of two gradient dicts with the same names read as one vector."""
    if isinstance(b, dict):
        assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
        a, b = torch.cat([a[k].flatten() for k in b]), torch.cat([b[k].flatten() for k in b])
    a, b = a.flatten(), b.flatten()
    return (a @ b / (a.norm() * b.norm())).item()


def max_relative(a: dict, b: dict) -> float:
    """The largest |a[n] - b[n]| / |b[n]| over the names (a zero b[n] counts as 1e-300)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(((a[n] - b[n]).norm() / b[n].norm().clamp_min(1e-300)).item() for n in b)


def assert_same(a: dict, b: dict, tol: float = 1e-10) -> None:
    """Every tensor of ``a`` equals ``b``'s of the same name: rtol ``tol``, atol ``tol / 100``."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=tol, atol=tol * 1e-2, msg=name)


# ---- data --------------------------------------------------------------------------------------------------

WORDS = tuple("the cat sat on a mat ran".split())  # + <unk>, <eos>: a vocabulary of 9 ids
PTB_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")


def write_tiny_ptb(directory: Path, lines=(60, 12, 12), words_per_line: int = 6, seed: int = 0) -> Path:
    """A PTB-format word corpus (ptb.train/valid/test.txt) of the 7 ``WORDS`` in ``directory``; returns it."""
    gen = torch.Generator().manual_seed(seed)
    for name, count in zip(PTB_FILES, lines, strict=True):
        ids = torch.randint(0, len(WORDS), (count, words_per_line), generator=gen).tolist()
        (directory / name).write_text("".join(" ".join(WORDS[i] for i in line) + "\n" for line in ids))
    return directory


def write_ptb_text(directory: Path, train: str, valid: str | None = None, test: str | None = None) -> Path:
    """ptb.train/valid/test.txt in ``directory`` with the given text (``train``'s where one is not given)."""
    texts = (train, train if valid is None else valid, train if test is None else test)
    for name, text in zip(PTB_FILES, texts, strict=True):
        (directory / name).write_text(text, encoding="utf-8")
    return directory


# ---- nanoGPT (karpathy/nanoGPT model.py: its names, shapes and forward contract; no flash path) -------------


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
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
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


# ---- time --------------------------------------------------------------------------------------------------


class FakeClock:
    """Seconds that pass only when a test says so (``clock.now += s``)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class TimedBackprop(Backprop):
    """Exact backprop whose every gradient computation takes ``seconds`` of ``clock``."""

    def __init__(self, clock: FakeClock, seconds: float = 1.0):
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def compute_grads(self, *args):
        self.clock.now += self.seconds
        return super().compute_grads(*args)


def one_line_error(capsys) -> str:
    """The command's stderr, asserted to be one ``error: ...`` line."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


class Crash(Exception):
    pass


class CrashingBackprop(Backprop):
    """Exact backprop that dies after ``crash_at`` calls (simulates a killed job)."""

    def __init__(self, crash_at):
        super().__init__()
        self.calls, self.crash_at = 0, crash_at

    def compute_grads(self, *args):
        self.calls += 1
        if self.calls > self.crash_at:
            raise Crash
        return super().compute_grads(*args)


CrashingBackprop.name = "backprop"


def tiny_gpt2_batch():
    """A 1-layer transformers GPT-2 (width 8, 2 heads, vocabulary 11, no dropout; float64, seed 0) and a batch of
    3 x 6 token ids with their next tokens as targets (the perturbation engines' GPT-2 tests)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11, n_positions=6, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(2))
    return transformers.GPT2LMHeadModel(config).double(), ids, torch.roll(ids, -1, 1)
