"""Chains that cross stages (issue 63 item 3): hierarchical vision models (FocalNet, Swin-v2, CvT, SwiftFormer) keep
their layers in one list per stage and give each layer its stage's size besides the state, with a downsampling,
reshapes and a stage's own parameters between the last layer of a stage and the first of the next. Where no
structure found otherwise runs (the stages, which the forward cannot run passing their input through: the next
stage reads the dims the last one returns), the layers of every stage are found as one chain, and what the model
computes between two stages is an exact boundary, run as the model runs it (once, in training mode: its BatchNorm
statistics updated once per step). Float64."""

import copy

import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss


class Layer(nn.Module):
    """A pre-LN residual MLP on tokens (B, H W, C), told its stage's (H, W) as FocalNet's and Swin's layers are."""

    def __init__(self, c):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 2 * c), nn.Linear(2 * c, c)

    def forward(self, x, dims):
        assert x.shape[1] == dims[0] * dims[1]
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Stage(nn.Module):
    """A stage's token offset (its own parameter, read in its forward), its layers, then a downsampling (a strided
    convolution and BatchNorm on the tokens reshaped to an image); returns (state, before downsampling, dims) as
    FocalNet's stages do, the next stage reading the dims."""

    def __init__(self, c, out, depth, downsample):
        super().__init__()
        self.offset = nn.Parameter(0.1 * torch.randn(c))
        self.layers = nn.ModuleList(Layer(c) for _ in range(depth))
        self.down = nn.Sequential(nn.Conv2d(c, out, 2, stride=2), nn.BatchNorm2d(out)) if downsample else None

    def forward(self, x, dims):
        x = x + self.offset
        for layer in self.layers:
            x = layer(x, dims)
        before = x
        if self.down is not None:
            b, _, c = x.shape
            x = self.down(x.transpose(1, 2).reshape(b, c, *dims))
            dims = tuple(x.shape[-2:])
            x = x.flatten(2).transpose(1, 2)
        return x, before, dims


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(2, 4, 2, stride=2)
        self.stages = nn.ModuleList([Stage(4, 6, 2, True), Stage(6, 6, 2, False)])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        x = self.embed(x)
        dims = tuple(x.shape[-2:])
        x = x.flatten(2).transpose(1, 2)
        for stage in self.stages:
            x, _, dims = stage(x, dims)
        return self.head(x.mean(1))


def case():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 2, 8, 8, generator=gen, dtype=torch.float64), torch.randint(0, 3, (5,), generator=gen)
    return Net().double(), x, y


def test_the_layers_of_every_stage_are_one_chain_and_highway_bp_is_exact_through_the_stages():
    model, x, y = case()
    stack = models.residual_stack(model, example=x)
    assert stack.found.startswith("4 blocks (Layer in stages.0.layers, stages.1.layers)"), stack.found
    assert "1 of the boundaries what the model computes between 2 stages" in stack.found
    assert [b.describe() for b in stack.blocks].count("boundary") == 1
    model.eval()
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=5), x, y, cross_entropy_loss,
                                 strip="model."), exact) < 1e-10  # the second stage's offset and downsampling too
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=0), x, y, cross_entropy_loss,
                                 strip="model."), exact) > 1e-3


def test_in_training_mode_the_step_equals_autograd_and_updates_batchnorm_once():
    model, x, y = case()
    reference = copy.deepcopy(model).train()
    exact = autograd_grads(reference, cross_entropy_loss(reference(x), y))
    stack = models.residual_stack(model, example=x)
    model.train()
    engine = trainers.build_engine("highway", k=5)
    engine.first_batch_check(stack, x, y, cross_entropy_loss)
    fresh = copy.deepcopy(model)  # the self-check leaves the statistics as they were: one step from here
    stack = models.residual_stack(fresh, example=x)
    fresh.train()
    assert relative(engine_grads(stack, engine, x, y, cross_entropy_loss, strip="model."), exact) < 1e-10
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(fresh.stages[0].down[1], name),
                                   getattr(reference.stages[0].down[1], name), rtol=1e-12, atol=0, msg=name)
