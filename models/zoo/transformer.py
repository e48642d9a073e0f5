"""GPT-style pre-LayerNorm Transformer language model, split for Highway-BP.

Each of the ``depth`` Transformer layers is two residual sublayers (self-attention, then
MLP), so the residual stack has L = 2 depth blocks. With the gamma split of the
Highway-BP paper (Sec. 5.1.1, App. C.3, Eq. 16-17):

    g_i(h) = Sublayer_i(LN_i(h)) + gamma h        (branch)
    r_i(h, z) = (1 - gamma) h + z                 (combine; K_i = (1 - gamma) I)

which is h + Sublayer_i(LN_i(h)) for any gamma: exact backprop is unchanged, gamma = 0
is the naive split (which the paper reports diverging) and gamma = 1 is the
fixed-point iteration. Option ``split_gamma``, default 0.2 (the paper's GPT-2).

    h_0 = drop(tok_emb(x) + pos_emb[:T])          stem, x: (B, T) token ids
    Attention: causal multi-head self-attention, Linear(d, 3d) -> heads -> Linear(d, d), drop
    MLP:       Linear(d, 4d) -> GELU -> Linear(4d, d), drop
    y = Linear(LN_f(h_L))                          head: per-step logits (B, T, vocab)

GPT-2 initialisation: N(0, 0.02) for Linear and Embedding weights, zero biases, the last
Linear of each sublayer N(0, 0.02 / sqrt(2 depth)). The attention is written out (no
fused kernel) so ``torch.func.vmap`` can batch it over layers. Residual-stack protocol:
``stem``, ``blocks``, ``head``.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gradengines.models.errors import ModelConfigError, positive_int

__all__ = ["GPT", "AttentionSublayer", "MLPSublayer"]


class _Sublayer(nn.Module):
    """The gamma split shared by both sublayers; subclasses define ``transform``."""

    def __init__(self, width: int, gamma: float):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gamma = gamma

    def branch(self, h):
        """g(h) = Sublayer(LN(h)) + gamma h."""
        return self.transform(self.norm(h)) + self.gamma * h

    def combine(self, h, z):
        """r(h, z) = (1 - gamma) h + z."""
        return (1.0 - self.gamma) * h + z

    def forward(self, h):
        return self.combine(h, self.branch(h))


class AttentionSublayer(_Sublayer):
    def __init__(self, width: int, heads: int, gamma: float, dropout: float):
        super().__init__(width, gamma)
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def transform(self, x):
        """Causal self-attention: (B, T, d) -> (B, T, d)."""
        B, T, d = x.shape
        q, k, v = (t.reshape(B, T, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))  # (B, heads, T, d / heads)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.drop(self.proj((att @ v).transpose(1, 2).reshape(B, T, d)))


class MLPSublayer(_Sublayer):
    def __init__(self, width: int, gamma: float, dropout: float):
        super().__init__(width, gamma)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def transform(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class GPT(nn.Module):
    """Token and position embeddings, 2 * ``depth`` sublayers, final LayerNorm and Linear head."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        vocab_size: int | None = None,
        depth: int = 4,
        width: int = 128,
        heads: int = 4,
        split_gamma: float = 0.2,
        dropout: float = 0.0,
        max_len: int | None = None,
        tie_weights: bool = False,
    ):
        super().__init__()
        vocab_size = out_features if vocab_size is None else vocab_size
        max_len = in_features if max_len is None else max_len
        for name, value in (("in_features", in_features), ("out_features", out_features), ("depth", depth),
                            ("width", width), ("heads", heads), ("vocab_size", vocab_size), ("max_len", max_len)):
            positive_int(name, value)
        if width % heads:
            raise ModelConfigError(f"width {width} is not divisible by heads {heads}")
        gamma = split_gamma
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma <= 1.0:
            raise ModelConfigError(f"split_gamma must be in [0, 1], got {gamma!r}")
        if not 0.0 <= dropout < 1.0:
            raise ModelConfigError(f"dropout must be in [0, 1), got {dropout}")
        if tie_weights and vocab_size != out_features:
            raise ModelConfigError("tie_weights needs vocab_size == out_features")
        self.depth, self.max_len = depth, max_len
        self.tok_emb = nn.Embedding(vocab_size, width)
        self.pos_emb = nn.Parameter(torch.zeros(max_len, width))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(AttentionSublayer(width, heads, float(gamma), dropout))
            self.blocks.append(MLPSublayer(width, float(gamma), dropout))
        self.final_norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, out_features)
        self._init_weights()
        if tie_weights:
            self.fc.weight = self.tok_emb.weight

    def _init_weights(self):
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.pos_emb, std=0.02)
        for block in self.blocks:
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * self.depth))

    def stem(self, x):
        """(B, T) int64 token ids -> the stream (B, T, width)."""
        if x.is_floating_point():
            raise RuntimeError("gpt takes int64 token ids (B, T)")
        if x.shape[1] > self.max_len:
            raise RuntimeError(f"sequence length {x.shape[1]} exceeds max_len {self.max_len}")
        return self.drop(self.tok_emb(x) + self.pos_emb[: x.shape[1]])

    def head(self, h):
        """(B, T, width) -> per-step logits (B, T, out_features)."""
        return self.fc(self.final_norm(h))

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)
