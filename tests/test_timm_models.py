"""timm's models as researchers train them, on tiny random configurations: the original ResNet
(BasicBlock and Bottleneck: ReLU(h + z), in-place ReLUs, projection shortcuts) and the ViT, in
float64. timm needs torchvision, which imports here only beside torch 2.14.1: these tests run in
.venv-timm (`bash scripts/setup.sh timm`, then `.venv-timm/bin/python -m pytest tests/test_timm_models.py`)
and are skipped in CI's environment, which has no timm."""

import functools

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss

timm = pytest.importorskip("timm")


def randomised(model):
    """BatchNorm with non-trivial affine parameters and statistics: timm zero-initialises each block's last
    BatchNorm, which makes every residual branch zero and Highway-BP exact at any k."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen, dtype=m.weight.dtype) + 0.5)
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen, dtype=m.bias.dtype))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen, dtype=m.bias.dtype) + 0.5)
    return model


CASES = {  # model, training mode, what is found, the longest segment
    "resnet18": (lambda: timm.create_model("resnet18", num_classes=10, in_chans=1, channels=(8, 16, 16, 32)),
                 False, "8 blocks (BasicBlock in layer1, layer2, layer3, layer4) as 8 residual sublayers: "
                        "4 exact boundaries (a shape change), 4 ReLU(h + z)", 1),
    "resnet18-train": (lambda: timm.create_model("resnet18", num_classes=10, in_chans=1, channels=(8, 16, 16, 32)),
                       True, None, 1),
    "resnet26": (lambda: timm.create_model("resnet26", num_classes=10, in_chans=1, channels=(4, 8, 8, 8)),
                 False, "8 blocks (Bottleneck in layer1, layer2, layer3, layer4) as 8 residual sublayers: "
                        "3 exact boundaries (a shape change), 5 ReLU(h + z)", 3),  # layer4 keeps 1 x 1
    "vit": (lambda: timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, num_classes=10,
                                      in_chans=1, embed_dim=16, depth=3, num_heads=2),
            False, "3 blocks (Block in blocks) as 6 residual sublayers: 6 h + z", 6),
}


def grads(model, engine, x, y):
    """The engine's grads, a stack's named as its model's parameters (without ``model.``)."""
    return engine_grads(model, engine, x, y, strip="model.")


@pytest.mark.parametrize("name", sorted(CASES))
def test_highway_on_the_structure_found_is_backprop_at_full_k_and_not_at_k0(name):
    build, training, found, L = CASES[name]
    torch.manual_seed(0)
    model = randomised(build().double()).train(training)
    x, y = torch.randn(4, 1, 16, 16, dtype=torch.float64), torch.tensor([1, 4, 7, 0])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    model.load_state_dict(state)  # BatchNorm's statistics as before that forward
    assert relative(grads(model, trainers.build_engine("backprop"), x, y), exact) < 1e-12
    model.load_state_dict(state)
    stack = models.residual_stack(model, example=x)
    assert found is None or stack.found == found
    model.load_state_dict(state)
    assert relative(grads(stack, trainers.build_engine("highway", k=L), x, y), exact) < 1e-12
    assert relative(grads(stack, trainers.build_engine("highway", k=0), x, y), exact) > 1e-3 if L > 1 else True


def test_a_deeper_resnet_segment_is_approximated_at_k0_and_exact_at_its_length():
    torch.manual_seed(0)
    model = randomised(timm.create_model("resnet34", num_classes=10, in_chans=1, channels=(8, 8, 8, 8))
                       .double()).eval()  # segments of 2, 3 and 8 blocks (layer4 keeps layer3's 1 x 1)
    x, y = torch.randn(4, 1, 16, 16, dtype=torch.float64), torch.tensor([1, 4, 7, 0])
    stack = models.residual_stack(model, example=x)
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    assert stack.found.endswith("3 exact boundaries (a shape change), 13 ReLU(h + z)")
    assert relative(grads(stack, trainers.build_engine("highway", k=8), x, y), exact) < 1e-12
    assert relative(grads(stack, trainers.build_engine("highway", k=7), x, y), exact) > 1e-6
    assert relative(grads(stack, trainers.build_engine("highway", k=0), x, y), exact) > 1e-3


def test_timm_create_model_trains_from_the_command_line(tmp_path, capsys):
    from gradengines.trainers.cli import train_main

    timm_model = ["--model", "timm:create_model", "--model-option", "model_name=resnet18", "--model-option",
                  "num_classes=10", "--model-option", "in_chans=1", "--model-option", "channels=(8,8,16,16)",
                  "--task", "digits", "--task-option", "flatten=False", "--steps", "3", "--progress", "false",
                  "--logdir", str(tmp_path / "runs"), "--eval-batches", "1"]
    assert train_main(timm_model) == 0
    assert train_main([*timm_model, "--trainer", "highway", "--highway-k", "1"]) == 0
    assert "note: highway: found 8 blocks (BasicBlock in layer1, layer2, layer3, layer4)" in capsys.readouterr().err


def test_fa_on_a_resnet_covers_every_convolution_and_with_b_equal_w_is_backprop():
    from gradengines.trainers.engines.feedback_layers import covered_layers

    torch.manual_seed(0)
    model = randomised(timm.create_model("resnet18", num_classes=10, in_chans=1, channels=(8, 16, 16, 32))
                       .double()).eval()
    x, y = torch.randn(4, 1, 16, 16, dtype=torch.float64), torch.tensor([1, 4, 7, 0])
    exact = grads(model, trainers.build_engine("backprop"), x, y)
    covered = covered_layers(model)
    assert len(covered) == 22  # the stem, 2 per block, 4 projection shortcuts, the classifier
    engine = trainers.build_engine("fa")
    drawn = grads(model, engine, x, y)
    assert len(engine.layers.feedback) == 21  # all but the stem, whose input is the image
    for name in engine.layers.feedback:
        if name != "fc":
            assert relative(drawn[f"{name}.weight"], exact[f"{name}.weight"]) > 1e-3, name
    for name, module in covered:
        if name in engine.layers.feedback:
            engine.layers.feedback[name] = module.weight.detach().clone()
    assert relative(grads(model, engine, x, y), exact) < 1e-12


# ---- FA with B = W on layers whose forward transforms the weight or pads the input (issue 39, item 5) -------

AS_WRITTEN = {  # StdConv2d (weight standardisation) and Conv2dSame (TF "same" padding in the forward)
    "resnetv2 (StdConv2d)": lambda: timm.models.resnetv2.ResNetV2(
        layers=[1, 1], channels=(32, 64), num_classes=4, stem_chs=32,
        norm_layer=functools.partial(timm.layers.GroupNormAct, num_groups=8)),
    "tf_mobilenetv3_small_minimal_100": lambda: timm.create_model("tf_mobilenetv3_small_minimal_100",
                                                                  num_classes=4),
}


@pytest.mark.parametrize("name", sorted(AS_WRITTEN))
def test_fa_with_b_equal_w_is_backprop_where_the_layers_transform_their_weight_or_pad(name):
    torch.manual_seed(0)
    model = randomised(AS_WRITTEN[name]()).double().eval()
    kinds = {type(m).__name__ for m in model.modules()}
    assert kinds & {"StdConv2d", "Conv2dSame"}  # the kind this test is about is there
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 3, 32, 32, generator=gen, dtype=torch.float64), torch.tensor([0, 3])
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    engine = trainers.build_engine("fa", path="layers")
    engine.layers.mirror = True  # B = the weight each layer's call uses
    assert relative(engine_grads(model, engine, x, y), exact) < 1e-10
    dfa = engine_grads(model, trainers.build_engine("dfa", path="layers"), x, y)
    assert all(torch.isfinite(g).all() for g in dfa.values())


@pytest.mark.parametrize("trainer", ["highway", "fa", "dfa"])
@pytest.mark.parametrize("name", ["resnetv2_50x1_bit", "tf_mobilenetv3_small_minimal_100"])
def test_the_command_line_trains_them_without_a_traceback(name, trainer, tmp_path, capsys):
    """StdConv2d and Conv2dSame by name from train.py: each engine trains a step and says what it found or covers."""
    from gradengines.trainers.cli import train_main

    code = train_main(["--model", "timm:create_model", "--model-option", f"model_name={name}", "--model-option",
                       "num_classes=10", "--model-option", "in_chans=1", "--task", "digits", "--task-option",
                       "flatten=False", "--trainer", trainer, "--steps", "1", "--eval-batches", "1", "--batch-size",
                       "8", "--logdir", str(tmp_path), "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err and f"note: {trainer}: " in err


def test_nfnets_stem_of_in_place_activations_leaves_the_example_and_highway_is_exact():
    """timm's eca_nfnet_l0 (issue 47): discovery runs the forward with the stem's convolutions passing their input
    through, and the stem's in-place activation wrote into the example (3.9 on unit-normal inputs); Highway-BP at
    full k then matched autograd only on the changed data. Now the example is left as given and Highway-BP is
    autograd's on it (float64, a 32 x 32 image: every stage keeps a spatial size)."""
    torch.manual_seed(0)
    model = timm.create_model("eca_nfnet_l0", num_classes=10, in_chans=1).double().eval()
    x, y = torch.randn(2, 1, 32, 32, dtype=torch.float64), torch.tensor([1, 4])
    given = x.clone()
    stack = models.residual_stack(model, example=(x, y))
    assert torch.equal(x, given) and x._version == 0
    assert stack.found.startswith("12 blocks (NormFreeBlock in stages.0, stages.1, stages.2, stages.3)")
    exact = autograd_grads(model, cross_entropy_loss(model(x.clone()), y))
    assert relative(grads(stack, trainers.build_engine("highway", k=20), x, y), exact) < 1e-10
    assert torch.equal(x, given)
