"""The activity-perturbed forward gradient (``fgrad_act``, issue 50; Ren et al., ICLR 2023): one direction's estimate
against its definition computed by hand from autograd (per-example split, whole-batch scalar, demoted layers, GPT-2),
its error against the closed form of ``trainers/engines/activity_fgrad.py`` and against weight perturbation's, and the
first batch's choices. Float64 throughout."""

import math

import pytest
import torch
import torch.nn.functional as F
from engine_contract import EngineContract, toy_batch
from helpers import tiny_gpt2_batch
from torch import nn

from gradengines import tasks, trainers
from gradengines.tasks.base import cross_entropy_loss
from gradengines.trainers.core.engine import trainable_parameters
from gradengines.trainers.engines.activity_fgrad import ActivityForwardGradient
from gradengines.trainers.engines.directions import activity_direction, direction_of
from gradengines.trainers.engines.fgrad import ForwardGradient


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()


class ReadOutside(nn.Module):
    """``mid``'s weight is also read by an F.linear outside ``mid``'s forward; a LayerNorm has no covered layer."""

    def __init__(self):
        super().__init__()
        self.inp, self.mid, self.norm, self.out = nn.Linear(5, 6), nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = self.norm(h + torch.tanh(self.mid(h)) + 0.3 * F.linear(h, self.mid.weight))
        return self.out(h)


class Flattened(nn.Module):
    """A sequence model whose first layer sees the rows of (B, T, d) flattened to (B T, d), as OPT's MLP does."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x):
        b, t, d = x.shape
        return self.out(torch.tanh(self.inp(x.reshape(b * t, d))).reshape(b, t, 6).mean(1))


class CalledTwice(nn.Module):
    """One layer applied twice per forward (as an RNN cell or ALBERT's shared layers): each call its own perturbation,
    the two local backwards summed."""

    def __init__(self):
        super().__init__()
        self.inp, self.shared, self.out = nn.Linear(5, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(torch.tanh(self.shared(torch.tanh(self.shared(h)))))


class SharedTable(nn.Module):
    """A position table (T, d) through a Linear once for the whole batch, its output (1, T, d) broadcast to every
    example (a relative-position MLP): that layer takes the whole-batch scalar, the others their examples'."""

    def __init__(self):
        super().__init__()
        self.table, self.pos, self.inp, self.out = nn.Parameter(torch.randn(4, 5)), nn.Linear(5, 5), \
            nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x) + self.pos(self.table).unsqueeze(0))
        return self.out(h.mean(1))


def batch_normed(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).double()


def data(seed=1, n=16):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (n,), generator=gen)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def by_hand(engine, model, inputs, targets, loss_fn, forward, distribution="gaussian", seed=0, directions=1):
    """The mean of ``directions`` directions of step 0, each from its definition (``one_by_hand``)."""
    return sum(one_by_hand(engine, model, inputs, targets, loss_fn, forward, distribution, seed, index)
               for index in range(directions)) / directions


def one_by_hand(engine, model, inputs, targets, loss_fn, forward, distribution, seed, index):
    """Direction ``index`` of step 0 from its definition, with autograd on the whole model: s_b = d(e_b . y_b) along
    every perturbation (one backward per example, no assumption that examples do not interact), delta = s_b u at
    example b's rows (or S u), each perturbed call's parameters get autograd's vector-Jacobian product of that call
    alone, every other parameter S v. ``forward`` gives the outputs tensor."""
    plan = engine.plans[id(model)]
    params = [p for p in model.parameters() if p.requires_grad]
    calls = [[] for _ in plan.layers]
    inputs_of = [[] for _ in plan.layers]
    hooks = [m.register_forward_hook(lambda mod, a, out, k=k: (calls[k].append(out), inputs_of[k].append(a)) and None)
             for k, (_, m) in enumerate(plan.layers)]
    y = forward(model, inputs)
    for h in hooks:
        h.remove()
    (e,) = torch.autograd.grad(loss_fn(y, targets), y, retain_graph=True)
    u = [[activity_direction(z, distribution, seed, 0, index, k, c) for c, z in enumerate(zs)]
         for k, zs in enumerate(calls)]
    v = {i: direction_of(params[i].shape, params[i], distribution, seed, 0, index, i) for i in plan.weights}
    weights = [params[i] for i in plan.weights]
    outs = [z for zs in calls for z in zs]
    flat_u = [t for ts in u for t in ts]
    s = []
    for b in range(y.shape[0]):
        grads = torch.autograd.grad((e[b] * y[b]).sum(), outs + weights, retain_graph=True, allow_unused=True)
        g_out, g_w = grads[:len(outs)], grads[len(outs):]
        s_b = sum(float((g * u_).sum()) for g, u_ in zip(g_out, flat_u, strict=True) if g is not None)
        s_b += sum(float((g * v[i]).sum()) for i, g in zip(plan.weights, g_w, strict=True) if g is not None)
        s.append(s_b)
    s = torch.tensor(s, dtype=torch.float64)
    whole = float(s.sum())
    expected = [torch.zeros_like(p) for p in params]
    for i in plan.weights:
        expected[i] += whole * v[i]
    for k in range(len(plan.layers)):
        module, own = plan.layers[k][1], [params[i] for i in plan.layer_params[k]]
        for args, u_ in zip(inputs_of[k], u[k], strict=True):
            z = module(*[a.detach() for a in args])  # this call alone: not through an earlier call of the same layer
            rows = s.repeat_interleave(u_.shape[0] // s.shape[0]) if plan.per_example and not u_.shape[0] % len(s) \
                else torch.full((u_.shape[0],), whole, dtype=torch.float64)
            delta = u_ * rows.reshape(-1, *[1] * (u_.dim() - 1))
            for i, g in zip(plan.layer_params[k], torch.autograd.grad(z, own, delta), strict=True):
                expected[i] += g
    return flat(expected)


def estimate(engine, model, inputs, targets, loss_fn=cross_entropy_loss):
    model.zero_grad()
    engine.compute_grads(model, inputs, targets, loss_fn)
    return flat([p.grad for p in model.parameters()])


@pytest.mark.parametrize("case", ["mlp-gaussian", "mlp-rademacher", "three-directions", "read-outside", "batchnorm",
                                  "flattened", "called-twice", "shared-table"])
def test_directions_are_their_definition_computed_by_hand(case):
    distribution = "rademacher" if case.endswith("rademacher") else "gaussian"
    directions = 3 if case == "three-directions" else 1
    torch.manual_seed(0)
    model = {"read-outside": lambda: ReadOutside().double(), "three-directions": lambda: ReadOutside().double(),
             "flattened": lambda: Flattened().double(), "called-twice": lambda: CalledTwice().double(),
             "shared-table": lambda: SharedTable().double(), "batchnorm": batch_normed}.get(case, mlp)()
    x, y = data()
    if case in ("flattened", "shared-table"):
        x = torch.randn(16, 4, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    engine = trainers.build_engine("fgrad_act", distribution=distribution, seed=7, directions=directions)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    got = estimate(engine, model, x, y)
    model.load_state_dict(state)  # the BatchNorm statistics as the engine's pass found them
    want = by_hand(engine, model, x, y, cross_entropy_loss, lambda m, i: m(i), distribution, 7, directions)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    plan, line = engine.plans[id(model)], engine.structure(model)
    assert plan.per_example == (case != "batchnorm") and plan.shared == (["pos"] if case == "shared-table" else [])
    assert ("examples interact" in line) == (case == "batchnorm")
    read_outside = case in ("read-outside", "three-directions")
    assert plan.demoted == (["mid"] if read_outside else [])
    # mid's 2 and the norm's 2; BatchNorm's 2; the table
    assert len(plan.weights) == {"batchnorm": 2, "shared-table": 1}.get(case, 4 if read_outside else 0)
    exact = flat(torch.autograd.grad(cross_entropy_loss(model(x), y), list(model.parameters())))
    assert F.cosine_similarity(got, exact, dim=0) < 0.99  # the contrast: not backprop


def test_gpt2_one_direction_is_its_definition_and_its_tied_head_is_weight_perturbed():
    """transformers GPT-2 (float64): the tied lm_head (its weight is wte's, read by the embedding) is weight-perturbed,
    the 4 Conv1D layers activity-perturbed per example (rows of (B, T, d) grouped by example)."""
    pytest.importorskip("transformers")
    model, ids, targets = tiny_gpt2_batch()
    engine = trainers.build_engine("fgrad_act", seed=5)
    got = estimate(engine, model, ids, targets, tasks.sequence_cross_entropy)
    plan = engine.plans[id(model)]
    assert plan.demoted == ["lm_head"] and len(plan.layers) == 4 and plan.per_example and not plan.shared
    names = [name for name, _ in trainable_parameters(model)]
    assert [names[i] for i in plan.weights] == [n for n in names if ".ln_" in n or ".wte" in n or ".wpe" in n
                                                or n.startswith("transformer.ln_f")]
    want = by_hand(engine, model, ids, targets, tasks.sequence_cross_entropy, lambda m, i: m(i).logits, seed=5)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_its_error_is_the_closed_form_and_far_below_weight_perturbation():
    """Mean squared error of one Gaussian direction over 300 seeds: within 3 standard errors of
    sum_k sum_b ||x~_{k,b}||^2 (n_k S_b + ||G_{k,b}||^2); weight perturbation's (d + 1) ||g||^2 (its own test) is
    more than 8x larger on this fan-in of 40 (m B / n = 80 for agreeing examples), measured and in theory; the mean
    over seeds is within 3 sigma of the gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 40, generator=gen, dtype=torch.float64), torch.randint(0, 3, (16,), generator=gen)
    xs, zs = [], []
    hooks = [m.register_forward_hook(lambda mod, a, out: (xs.append(a[0]), zs.append(out)) and None)
             for m in (model[0], model[2])]
    loss = cross_entropy_loss(model(x), y)
    for h in hooks:
        h.remove()
    G = torch.autograd.grad(loss, zs, retain_graph=True)
    g = flat(torch.autograd.grad(loss, list(model.parameters())))
    S_b = sum((Gk ** 2).sum(1) for Gk in G)
    theory = sum(float(((xk.detach() ** 2).sum(1) + 1) @ (Gk.shape[1] * S_b + (Gk ** 2).sum(1)))
                 for xk, Gk in zip(xs, G, strict=True))
    seeds = 300
    act = torch.stack([estimate(ActivityForwardGradient(seed=s), model, x, y) for s in range(seeds)])
    mse = ((act - g) ** 2).sum(1)
    assert abs(float(mse.mean()) - theory) < 3 * float(mse.std()) / math.sqrt(seeds), (float(mse.mean()), theory)
    assert float((act.mean(0) - g).norm()) < 3 * math.sqrt(theory / seeds)
    weight_theory = (g.numel() + 1) * float(g @ g)
    weight = torch.stack([estimate(ForwardGradient(seed=s), model, x, y) for s in range(100)])
    assert theory < weight_theory / 8
    assert float(mse.mean()) < float(((weight - g) ** 2).sum(1).mean()) / 8


def test_bad_options_are_one_line():
    for options, flag in (({"directions": 0}, "--fgrad-act-directions"), ({"seed": -1}, "--fgrad-act-seed")):
        with pytest.raises(trainers.ConfigError, match=flag):
            trainers.build_engine("fgrad_act", **options)


class TestActivityForwardGradientContract(EngineContract):
    """The contract every engine passes (writes .grad only, overwrites, seeded, the loss falls, agreement logging),
    with 32 directions per step so that 30 Adam steps on the toy task lower the loss by a fifth."""

    engine_name = "fgrad_act"
    engine_options = {"directions": 32}

    def test_overwrites_instead_of_accumulating(self):
        """As the contract's, with a fresh engine for the second call: the directions follow the engine's step, not
        torch's global generator, so the same engine's second call draws others."""
        x, y = toy_batch()
        for model in self.compatible_models():
            torch.manual_seed(1)  # the dropout masks
            first = engine_grads_of(model, self.engine(), x, y)
            for p in model.parameters():
                p.grad.fill_(1e6)  # garbage that must not survive
            torch.manual_seed(1)
            self.engine().compute_grads(model, x, y, cross_entropy_loss)
            for n, p in model.named_parameters():
                torch.testing.assert_close(p.grad, first[n], msg=n)


def engine_grads_of(model, engine, x, y):
    engine.compute_grads(model, x, y, cross_entropy_loss)
    return {n: p.grad.clone() for n, p in model.named_parameters()}
