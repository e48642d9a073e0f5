"""Discovery that searches, then verifies (issue 63 item 3): where the structure found first fails the first-batch
self-check (a small conv-norm-act unit chained inside each block, whose concatenation the state alone does not
carry: HGNet's aggregation blocks), the engine tries the others the model offers and keeps the first that equals
autograd at k >= L, said in ``found``; where none does, the refusal names every one tried. Float64."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss


class Unit(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv, self.norm, self.act = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


class Aggregation(nn.Module):
    """x + agg([x, u1(x), u2(u1(x)), ...]): HGNet's block, its units chained inside it."""

    def __init__(self, c, units=3):
        super().__init__()
        self.layers = nn.ModuleList(Unit(c) for _ in range(units))
        self.agg = nn.Conv2d(c * (units + 1), c, 1)

    def forward(self, x):
        outs, h = [x], x
        for layer in self.layers:
            h = layer(h)
            outs.append(h)
        return x + self.agg(torch.cat(outs, 1))


class Net(nn.Module):
    def __init__(self, c=3):
        super().__init__()
        self.stem, self.blocks, self.head = nn.Conv2d(2, c, 3, padding=1), nn.Sequential(*(Aggregation(c)
                                                                                            for _ in range(2))), \
            nn.Linear(c, 4)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def case():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 2, 5, 5, generator=gen, dtype=torch.float64), torch.randint(0, 4, (4,), generator=gen)
    return Net().double().eval(), x, y


def test_a_failing_first_structure_gives_way_to_the_enclosing_blocks():
    model, x, y = case()
    stack = models.residual_stack(model, example=x)
    assert stack.found.startswith("3 blocks (Unit in blocks.0.layers)")  # the first found: the units of one block
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=4), x, y, cross_entropy_loss,
                                 strip="model."), exact) < 1e-10
    assert stack.found.startswith("2 blocks (Aggregation in blocks)") and "chosen where 3 blocks (Unit" in stack.found
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=0), x, y, cross_entropy_loss,
                                 strip="model."), exact) > 1e-3


def test_where_no_structure_passes_the_refusal_names_every_one_tried():
    model, x, y = case()
    stack = models.residual_stack(model, example=x)
    stack.__dict__["others"] = lambda: (other for other in [])  # no other structure: refused as before, said
    with pytest.raises(models.ModelConfigError, match=r"self-check: Highway-BP at k >= L .*\[structures tried: "
                                                      r"3 blocks \(Unit in blocks.0.layers\)\]$"):
        trainers.build_engine("highway", k=4).first_batch_check(stack, x, y, cross_entropy_loss)
    assert stack.found.startswith("3 blocks (Unit")  # the first structure kept
