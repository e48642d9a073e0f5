"""Suite ``user``: every engine on user-style models (an nn.GRU LM wrapped by ``models.wrap_recurrent``, an
nn.Sequential MLP by ``models.layer_stack``) and on the zoo model of the same sizes: what wrapping costs."""


import torch
import torch.nn.functional as F
from torch import nn

from gradengines import models
from gradengines.models.orthogonal import project_
from gradengines.trainers.bench.timing import (
    SuiteProgress,
    engine_from_spec,
    time_round_robin,
    training_step,
)

__all__ = ["bench_user"]


class _UserGRULanguageModel(nn.Module):
    """A language model written the way users write it: nn.Embedding, a 2-layer nn.GRU with
    batch_first=False, nn.Linear; the zoo's ``rnn_lm`` with the same sizes is its equivalent."""

    def __init__(self, vocab: int, hidden: int, depth: int):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, hidden), nn.Linear(hidden, vocab)
        self.rnn = nn.GRU(hidden, hidden, num_layers=depth)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens).transpose(0, 1))
        return self.head(out.transpose(0, 1))


def bench_user(*, steps, warmup, device, hidden=256, length=256, vocab=64, batch_size=64, width=256,
               depth=8) -> list[dict]:
    """Every engine on a user-style model (``models.wrap_recurrent`` on an nn.GRU LM; ``models.layer_stack``
    on an orthogonal nn.Sequential tanh MLP) and on the zoo model with the same sizes (``rnn_lm``, ``mlp``),
    all steps of one configuration timed round-robin; ratios to backprop on the same model, and user / zoo."""
    from gradengines.tasks.base import sequence_cross_entropy

    rows = []
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch_size, length), generator=gen).to(device)
    targets = torch.randint(0, vocab, (batch_size, length), generator=gen).to(device)
    x = torch.randn(batch_size, width, generator=gen).to(device)
    y = torch.randint(0, 10, (batch_size,), generator=gen).to(device)

    def gru_user():
        return models.wrap_recurrent(_UserGRULanguageModel(vocab, hidden, 2))

    def gru_zoo():
        return models.build("rnn_lm", in_features=length, out_features=vocab, cell="gru", hidden=hidden, depth=2)

    def mlp_user():
        parts = []
        for _ in range(depth - 1):
            parts += [nn.Linear(width, width), nn.Tanh()]
        return models.layer_stack(nn.Sequential(*parts, nn.Linear(width, 10)), orthogonal="bjorck")

    def mlp_zoo():
        return models.build("mlp", in_features=width, out_features=10, depth=depth, width=width, activation="tanh",
                            orthogonal="bjorck")

    configs = [("gru lm 2 x 256, T 256", {"user (nn.GRU, wrap_recurrent)": gru_user, "zoo (rnn_lm)": gru_zoo},
                ["backprop", "ftbptt", "dsf", "highway:k=2"], tokens, targets, sequence_cross_entropy, None),
               (f"tanh mlp {depth} x {width}, Bjorck", {"user (nn.Sequential, layer_stack)": mlp_user,
                                                        "zoo (mlp)": mlp_zoo},
                ["backprop", "foton", "pepita", "fa", "dfa"], x, y, F.cross_entropy, project_)]
    progress = SuiteProgress("user", sum(len(b) * len(t) for _, b, t, *_ in configs))
    for label, builds, names, inputs, labels, loss_fn, after in configs:
        steps_by = {}
        for kind, build in builds.items():
            for name in names:
                torch.manual_seed(0)
                model = build().to(device)
                engine = engine_from_spec(name)
                engine.check(model)
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
                steps_by[(kind, name)] = training_step(engine, model, inputs, labels, loss_fn, opt, after=after)
        timed = time_round_robin(dict(steps_by), timed=steps, rounds=steps, warmup=warmup, device=device)
        for (kind, name), t in timed.items():
            progress(f"{name} on {kind}", t["step_ms"])
        for name in names:
            user, zoo = (timed[(kind, name)] for kind in builds)
            user_base, zoo_base = (timed[(kind, "backprop")] for kind in builds)
            rows.append({"suite": "user", "model": label, "trainer": name, "user_ms": user["step_ms"],
                         "zoo_ms": zoo["step_ms"],
                         "user_ratio_to_backprop": user["ratio_to_baseline"] / user_base["ratio_to_baseline"],
                         "zoo_ratio_to_backprop": zoo["ratio_to_baseline"] / zoo_base["ratio_to_baseline"],
                         "user_over_zoo": user["ratio_to_baseline"] / zoo["ratio_to_baseline"]})
    return rows

