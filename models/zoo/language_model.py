"""Recurrent sequence models of the DSF authors' code (PTB and WikiText-103 modes).

``RecurrentLM`` (zoo name ``rnn_lm``, the PTB mode)::

    x_0 = drop(embed(tokens))          or  drop(Linear(input_dim -> hidden)(features))
    x_l = x_{l-1} + drop(RNN_l(x_{l-1}))           l = 1 .. depth   (residual between layers)
    y   = head(x_depth)                 per step: (B, T, out_features)
        = head(x_depth[:, -1])          per_step=False: (B, out_features), from the last step

``RecurrentBlockLM`` (zoo name ``rnn_block_lm``, the WT103 mode), pre-LayerNorm blocks::

    x = x + drop(Linear(RNN(LN(x))))
    x = x + drop(MLP(LN(x)))            MLP = Linear(d, 4d) -> GELU -> Linear(4d, d)
    y = head(LN(x))                     (per step, or the last step)

``depth`` counts (RNN block + MLP block) pairs.

Inputs (the CLI passes ``in_features`` = the task's flattened input size, which for token
tasks is the sequence length, not the vocabulary; it is only checked to be positive):

* ``input_dim=None`` (default): the inputs are int64 token ids (B, T) and go through
  ``nn.Embedding(vocab_size, hidden)``; ``vocab_size`` defaults to ``out_features``, the
  vocabulary of the language-modelling tasks (``ptb-char``, ``ptb-word``). The ``copy``
  task has ``n_symbols + 2`` input ids but ``n_symbols + 1`` outputs: pass ``vocab_size``.
* ``input_dim=k``: the inputs are float features (B, T, k) (e.g. k = 1 for ``seq-digits``,
  k = 2 for ``adding``); (B, T) is read as k = 1. A ``Linear(k, hidden)`` projects them.
* ``per_step`` defaults to True for token inputs (one output per step) and False for
  feature inputs (classification from the last step's state).

Initialisation as in the authors' code: the ``Linear`` and ``Embedding`` layers outside
the recurrent cells N(0, 0.02), biases 0, LayerNorm (1, 0); in the block model the last
Linear of each residual branch N(0, 0.02 / sqrt(2 depth)); the recurrent cells keep
PyTorch's defaults. ``tie_weights=True`` shares the head's weight with the embedding
(token inputs with ``vocab_size == out_features`` only). ``dropout`` (default 0, as the
authors) is plain ``nn.Dropout``.

Engines: ``recurrent_layers`` is the ``nn.ModuleList`` of the recurrent layers
(``models.layers.recurrent``), bottom to top.
"""

import math

import torch.nn as nn

from gradengines.models.errors import ModelConfigError, positive_int
from gradengines.models.layers.recurrent import CELLS, build_cell

__all__ = ["RecurrentLM", "RecurrentBlockLM"]


class _SequenceModel(nn.Module):
    """Options, input stem, head and initialisation shared by both models; subclasses add
    their layers in ``_build_layers`` (``recurrent_layers`` first) and define ``forward``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        vocab_size: int | None = None,
        input_dim: int | None = None,
        cell: str = "gru",
        hidden: int = 256,
        depth: int = 1,
        dropout: float = 0.0,
        tie_weights: bool = False,
        per_step: bool | None = None,
    ):
        super().__init__()
        self._setup(in_features, out_features, vocab_size, input_dim, cell, hidden, depth, dropout,
                    tie_weights, per_step)
        self._build_layers(cell, hidden, depth)
        self._init_weights()

    def _build_layers(self, cell: str, d: int, depth: int) -> None:
        raise NotImplementedError

    def _setup(self, in_features, out_features, vocab_size, input_dim, cell, hidden, depth, dropout,
               tie_weights, per_step):
        for name, value in (("in_features", in_features), ("out_features", out_features),
                            ("hidden", hidden), ("depth", depth)):
            positive_int(name, value)
        for name, value in (("vocab_size", vocab_size), ("input_dim", input_dim)):
            if value is not None:
                positive_int(name, value)
        if cell not in CELLS:
            raise ModelConfigError(f"unknown cell {cell!r}; choose one of {', '.join(CELLS)}")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
            raise ModelConfigError(f"dropout must be a number in [0, 1), got {dropout!r}")
        if per_step is not None and not isinstance(per_step, bool):
            raise ModelConfigError(f"per_step must be True, False or None, got {per_step!r}")
        if not isinstance(tie_weights, bool):
            raise ModelConfigError(f"tie_weights must be True or False, got {tie_weights!r}")
        if input_dim is not None and vocab_size is not None:
            raise ModelConfigError("give vocab_size (token inputs) or input_dim (float features), not both")
        self.tokens = input_dim is None
        self.per_step = self.tokens if per_step is None else per_step
        self.cell_name, self.hidden, self.depth = cell, hidden, depth
        if self.tokens:
            self.vocab_size = out_features if vocab_size is None else vocab_size
            self.stem = nn.Embedding(self.vocab_size, hidden)
        else:
            self.input_dim = input_dim
            self.stem = nn.Linear(input_dim, hidden)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, out_features)
        if tie_weights and (not self.tokens or self.vocab_size != out_features):
            raise ModelConfigError("tie_weights needs token inputs with vocab_size == out_features")
        self.tie_weights = tie_weights

    def _init_weights(self):
        recurrent = set(self.recurrent_layers.modules())
        for module in self.modules():
            if module in recurrent:
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if self.tie_weights:
            self.head.weight = self.stem.weight

    def input_features(self, x):
        """x_0 = drop(stem(x)): (B, T) ids or (B, T, input_dim) features -> (B, T, hidden)."""
        if self.tokens:
            if x.is_floating_point():
                raise RuntimeError("this model takes int64 token ids (built with input_dim=None); "
                                   "pass input_dim for float feature inputs")
        else:
            if not x.is_floating_point():
                raise RuntimeError(f"this model takes float features (input_dim={self.input_dim}), got {x.dtype}")
            if x.dim() == 2 and self.input_dim == 1:
                x = x.unsqueeze(-1)
        return self.drop(self.stem(x))

    def readout(self, x):
        """(B, T, hidden) -> per-step logits (B, T, out) or last-step logits (B, out)."""
        return self.head(x if self.per_step else x[:, -1])


class RecurrentLM(_SequenceModel):
    """Embedding / input projection -> ``depth`` residual recurrent layers -> Linear head."""

    def _build_layers(self, cell, d, depth):
        self.recurrent_layers = nn.ModuleList(build_cell(cell, d, d) for _ in range(depth))

    def forward(self, x):
        x = self.input_features(x)  # (B, T, hidden)
        for layer in self.recurrent_layers:
            x = x + self.drop(layer(x))
        return self.readout(x)


class RecurrentBlockLM(_SequenceModel):
    """Pre-LayerNorm blocks: x += Linear(RNN(LN x)); x += MLP(LN x); then LN and the head."""

    def _build_layers(self, cell, d, depth):
        self.recurrent_layers = nn.ModuleList(build_cell(cell, d, d) for _ in range(depth))
        self.rnn_norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))
        self.rnn_projs = nn.ModuleList(nn.Linear(d, d) for _ in range(depth))
        self.mlp_norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(depth)
        )
        self.final_norm = nn.LayerNorm(d)

    def _init_weights(self):
        super()._init_weights()
        scaled = 0.02 / math.sqrt(2 * self.depth)  # GPT-2 style: last Linear of each residual branch
        for proj, mlp in zip(self.rnn_projs, self.mlps, strict=True):
            nn.init.normal_(proj.weight, std=scaled)
            nn.init.normal_(mlp[-1].weight, std=scaled)

    def forward(self, x):
        x = self.input_features(x)  # (B, T, d)
        for rnn, norm1, proj, norm2, mlp in zip(self.recurrent_layers, self.rnn_norms, self.rnn_projs,
                                                self.mlp_norms, self.mlps, strict=True):
            x = x + self.drop(proj(rnn(norm1(x))))
            x = x + self.drop(mlp(norm2(x)))
        return self.readout(self.final_norm(x))
