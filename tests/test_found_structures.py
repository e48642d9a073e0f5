"""Found structures that ended in a traceback (issue 39 item 4), now exact at k >= L and not at k = 0, float64:
a first block fed the raw input (no stem to train: a patchify stem taken as a block), a block whose pre-LN split
cannot run (transformers' OPT in its default pre-LN layout: the whole block is then the sublayer)."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy


class Residual(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class RawInput(nn.Module):
    """Residual blocks on the raw input, then a head: nothing before the first block."""

    def __init__(self, width=6, layers=3):
        super().__init__()
        self.blocks = nn.ModuleList(Residual(width) for _ in range(layers))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def check_exact_and_k0(model, x, y, loss_fn, parameter):
    exact = autograd_grads(model, loss_fn(models.call_model(model, x, y).outputs, y))
    stack = models.residual_stack(model, example=(x, y))
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=100), x, y, loss_fn, strip="model."),
                    exact) < 1e-10
    k0 = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, loss_fn, strip="model.")
    assert relative(k0[parameter], exact[parameter]) > 1e-4
    return stack


def classified(model, features):
    """``model`` in float64 (seeded) and a batch of 5 samples of ``features`` with 4 classes."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, features, generator=gen, dtype=torch.float64), torch.randint(0, 4, (5,), generator=gen)
    return model().double(), x, y


def refused(model_class, pattern):
    """discover on ``model_class`` (``classified``) raises one ModelConfigError line matching ``pattern``."""
    model, x, _ = classified(model_class, 3)
    with pytest.raises(models.ModelConfigError, match=pattern):
        models.residual_stack(model, example=x)


def test_blocks_on_the_raw_input_are_exact_at_full_k():
    model, x, y = classified(RawInput, 6)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.fc.weight")
    assert stack.found.startswith("3 blocks (Residual in blocks)")


def test_opt_in_its_default_pre_ln_layout_is_exact_at_full_k():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.OPTConfig(vocab_size=23, hidden_size=8, num_hidden_layers=2, ffn_dim=16,
                                    num_attention_heads=2, max_position_embeddings=16, word_embed_proj_dim=8,
                                    dropout=0.0)
    model = transformers.OPTForCausalLM(config).double().eval()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 23, (3, 7), generator=gen), torch.randint(0, 23, (3, 7), generator=gen)
    stack = check_exact_and_k0(model, x, y, sequence_cross_entropy, "model.decoder.layers.0.fc1.weight")
    assert "2 blocks (OPTDecoderLayer in model.decoder.layers)" in stack.found


class Widening(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.fc = nn.Linear(cin, cout)

    def forward(self, h):
        return torch.tanh(self.fc(h))


def test_a_structure_whose_blocks_all_change_shape_says_that_highway_is_backprop_there():
    torch.manual_seed(0)
    model = nn.Sequential(Widening(4, 5), Widening(5, 6), Widening(6, 7), nn.Linear(7, 3)).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    stack = models.residual_stack(model, example=x)
    assert stack.found.endswith("3 exact boundaries (a shape change); every block changes the state's shape, so "
                                "each is an exact boundary: Highway-BP is backprop here")


class MaskedBlock(nn.Module):
    """h + W tanh(mask * LN(h)): the mask a per-block argument (Gemma-2's sliding and global layers)."""

    def __init__(self, width=6):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, h, mask):
        return h + self.fc(torch.tanh(mask * self.norm(h)))


class Alternating(nn.Module):
    def __init__(self, width=6, layers=4):
        super().__init__()
        self.embed, self.head = nn.Linear(3, width), nn.Linear(width, 4)
        self.blocks = nn.ModuleList(MaskedBlock(width) for _ in range(layers))

    def forward(self, x):
        local = (torch.arange(x.shape[-1] * 2) % 2).to(x.dtype).repeat(3)[:6]  # rebuilt for every batch
        masks = {"local": local, "global": torch.ones_like(local)}
        h = self.embed(x)
        for i, block in enumerate(self.blocks):
            h = block(h, masks["local" if i % 2 else "global"])
        return self.head(h)


def test_blocks_given_their_own_masks_are_found_each_with_its_arguments_and_exact():
    model, x, y = classified(Alternating, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.fc.weight")
    assert "; each block given its own arguments (masks)" in stack.found


class BiasFromFirst(nn.Module):
    """The first block computes a bias and returns it beside the state; the others are given it (T5)."""

    def __init__(self, width=6, layers=3):
        super().__init__()
        self.embed, self.head = nn.Linear(3, width), nn.Linear(width, 4)
        self.blocks = nn.ModuleList(BiasBlock(width, first=i == 0) for i in range(layers))

    def forward(self, x):
        h, bias = self.embed(x), None
        for block in self.blocks:
            h, bias = block(h, bias)
        return self.head(h)


class BiasBlock(nn.Module):
    def __init__(self, width, first):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.table = nn.Parameter(torch.randn(width)) if first else None

    def forward(self, h, bias=None):
        bias = 2 * self.table if bias is None else bias
        return h + self.fc(torch.tanh(h + bias)), bias


def test_a_first_block_that_returns_what_the_others_read_joins_the_stem_and_highway_is_exact():
    """T5's layout: the first block computes a bias from its own table and returns it to the others; it is
    backpropagated exactly with the stem, the bias a side input of the rest."""
    model, x, y = classified(BiasFromFirst, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.1.fc.weight")
    assert stack.found.startswith("2 blocks (BiasBlock in blocks)")
    assert stack.found.endswith("; blocks.0, which computes what the others are given besides the state (a position "
                                "bias), backpropagated exactly with the stem; 1 side input (bias) read by every block")


class ChainOfBiases(BiasFromFirst):
    """Every block computes a new bias from the one it is given: no single block opens them all."""

    def __init__(self):
        super().__init__()
        for block in self.blocks:
            block.table = nn.Parameter(torch.randn(6))

    def forward(self, x):
        h, bias = self.embed(x), None
        for block in self.blocks:
            h, bias = block(h, bias)
            bias = bias + block.table
        return self.head(h)


def test_blocks_given_what_several_earlier_blocks_returned_are_refused_in_one_line():
    refused(ChainOfBiases, r"^residual_stack: the blocks found \(BiasBlock\) are given "
                           r"different arguments")


class Fails(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        raise AttributeError("'Config' object has no attribute 'decoder_start_token_id'")


def test_an_example_the_model_cannot_run_is_refused_in_one_line_by_discovery():
    with pytest.raises(models.ModelConfigError, match=r"^residual_stack: the example does not run through Fails "
                                                      r"\(AttributeError: 'Config' object has no attribute"):
        models.residual_stack(Fails(), example=torch.randn(2, 3))


class Stages(nn.Module):
    """ConvNeXt's layout: stages of residual blocks joined by a downsampling layer called on the state alone."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3, 6), nn.Linear(8, 4)
        self.stage1 = nn.Sequential(Residual(6), Residual(6))
        self.down = nn.Linear(6, 8)
        self.stage2 = nn.Sequential(Residual(8), Residual(8), Residual(8))

    def forward(self, x):
        return self.head(self.stage2(self.down(self.stage1(self.embed(x)))))


def test_stages_joined_by_a_downsampling_layer_are_found_block_by_block_the_join_an_exact_boundary():
    model, x, y = classified(Stages, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "stage1.0.fc.weight")
    assert stack.found == ("5 blocks (Residual in stage1, stage2) as 6 residual sublayers: 5 h + z, 1 exact boundaries "
                           "(a shape change); 1 of the boundaries joins between the blocks (Linear)")


def hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_discovery_leaves_no_hook_on_the_model_found_or_refused():
    model, x, _ = classified(RawInput, 6)
    models.residual_stack(model, example=x)
    assert hooks(model) == 0
    plain = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with pytest.raises(models.ModelConfigError, match="found no repeated blocks"):
        models.residual_stack(plain, example=torch.randn(2, 3))
    assert hooks(plain) == 0
    failing = Fails()
    with pytest.raises(models.ModelConfigError, match="the example does not run through Fails"):
        models.residual_stack(failing, example=torch.randn(2, 3))
    assert hooks(failing) == 0


def test_the_public_residual_sublayer_defaults_to_the_plain_residual():
    """README: ``gamma`` (Highway-BP's split of the residual) is 0 unless given: branch = fn(norm(h)), h + branch."""
    sub = models.adapters.residual.ResidualSublayer(nn.Linear(3, 3))
    h = torch.randn(2, 3)
    assert sub.gamma == 0.0 and isinstance(sub.norm, nn.Identity)
    assert torch.equal(sub(h), h + sub.fn(h))


def test_a_first_block_is_a_provider_only_when_no_other_block_hands_the_later_ones_anything():
    """T5's shape: block 0 returns (y, bias) and every later block reads the bias: block 0 joins the stem. If block
    1 also returns a tensor that block 2 reads, the chain is not that shape (issue 41: the blocks checked for
    such tensors started one too late)."""
    from gradengines.models.adapters.discovery import _Call, _returns_what_the_others_read

    h0, y0, bias, y1, extra, y2 = (torch.randn(2) for _ in range(6))

    def chain(b1_returns, b2_reads):
        return [_Call(nn.Identity(), 0, 1, args=(h0,), x=h0, y=y0, output=(y0, bias)),
                _Call(nn.Identity(), 2, 3, args=(y0, bias), x=y0, y=y1, output=b1_returns),
                _Call(nn.Identity(), 4, 5, args=b2_reads, x=y1, y=y2, output=(y2,))]

    provider = chain((y1,), (y1, bias))
    assert _returns_what_the_others_read(provider) is provider[0]
    assert _returns_what_the_others_read(chain((y1, extra), (y1, bias, extra))) is None


class PostLN(nn.Module):
    def __init__(self, width=6):
        super().__init__()
        self.fc, self.ln = nn.Linear(width, width), nn.LayerNorm(width)

    def forward(self, h):
        return self.ln(h + torch.tanh(self.fc(h)))


class PostLNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.head = nn.Linear(5, 6), nn.Linear(6, 4)
        self.blocks = nn.ModuleList(PostLN() for _ in range(3))

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def test_gamma_splits_only_a_plain_residual_and_a_found_post_ln_stack_stays_exact():
    """The paper's split (branch z + gamma h) is of h + z; a post-LN block's LN(h + z) keeps its own reading
    (z = [a, b]) whatever gamma: exact at full k with gamma 0.2 (issue 41: the split applied to every kind)."""
    model, x, y = classified(PostLNNet, 5)
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    stack = models.residual_stack(model, example=(x, y), gamma=0.2)
    assert stack.found.endswith("3 LayerNorm(h + z)")
    got = engine_grads(stack, trainers.build_engine("highway", k=100), x, y, cross_entropy_loss, strip="model.")
    assert relative(got, exact) < 1e-10


class Mixer(nn.Module):
    """A token-mixing residual block of another class (an attention stage's block): h + W softmax(h) ."""

    def __init__(self, width):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, h):
        return h + self.fc(torch.softmax(self.norm(h), dim=-1))


class HybridStages(nn.Module):
    """A hybrid convnet's layout: a stage of one block kind, a downsampling layer, a stage of another kind, then a
    third stage fed directly (no join): the chain runs through all seven blocks of three classes."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3, 6), nn.Linear(8, 4)
        self.convs = nn.Sequential(Residual(6), Residual(6), Residual(6))
        self.down = nn.Linear(6, 8)
        self.mixers = nn.ModuleList([Mixer(8), Mixer(8)])
        self.last = nn.Sequential(Residual(8), Residual(8))

    def forward(self, x):
        h = self.down(self.convs(self.embed(x)))
        for mixer in self.mixers:
            h = mixer(h)
        return self.head(self.last(h))


def test_stages_of_different_block_classes_are_one_chain_across_their_seams_exact_at_full_k():
    model, x, y = classified(HybridStages, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "convs.0.fc.weight")
    assert len(stack.chain) == 7 and [type(m).__name__ for m in stack.chain] == ["Residual"] * 3 + ["Mixer"] * 2 \
        + ["Residual"] * 2
    assert stack.found.startswith("7 blocks (Residual, Mixer in convs, last, mixers) as 8 residual sublayers")
    k1 = engine_grads(stack, trainers.build_engine("highway", k=1), x, y, cross_entropy_loss, strip="model.")
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    assert relative(k1["convs.0.fc.weight"], exact["convs.0.fc.weight"]) > 1e-4  # a block k + 1 away is approximated



class Layer(nn.Module):
    def __init__(self, width_in, width_out):
        super().__init__()
        self.fc = nn.Linear(width_in, width_out)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class StemLayersBeforeStages(nn.Module):
    """A stem of two layers (the first widens) fed into ConvNeXt-like stages: stitched to the stages, the stem's
    layers cannot be passed through when the forward is run again for the head (the join would be given the raw
    input), so that structure does not reproduce the model and the stages alone are the stack."""

    def __init__(self):
        super().__init__()
        self.stem, self.head = nn.Sequential(Layer(3, 6), Layer(6, 6)), nn.Linear(8, 4)
        self.stage1 = nn.Sequential(Residual(6), Residual(6))
        self.down = nn.Linear(6, 8)
        self.stage2 = nn.Sequential(Residual(8), Residual(8))

    def forward(self, x):
        return self.head(self.stage2(self.down(self.stage1(self.stem(x)))))


def test_stages_stitched_only_where_the_found_structure_reproduces_the_model():
    model, x, y = classified(StemLayersBeforeStages, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "stage1.0.fc.weight")
    assert [type(m).__name__ for m in stack.chain] == ["Residual"] * 4


class ScaleNorm(nn.Module):
    """A norm of the user's own (not an nn.LayerNorm), as Llama's RMSNorm: known by its class name."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))

    def forward(self, h):
        return self.weight * h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


class PreNormBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm1, self.mix, self.norm2 = ScaleNorm(width), nn.Linear(width, width), ScaleNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))

    def forward(self, h):
        h = h + self.mix(self.norm1(h))
        return h + self.mlp(self.norm2(h))


class PreNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.blocks, self.head = nn.Linear(3, 6), nn.ModuleList(PreNormBlock(6) for _ in range(2)), \
            nn.Linear(6, 4)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def test_a_pre_norm_block_with_a_norm_of_the_users_own_class_is_split_into_its_two_sublayers():
    model, x, y = classified(PreNormNet, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.mix.weight")
    assert stack.found == "2 blocks (PreNormBlock in blocks) as 4 residual sublayers: 4 h + z"


class NormAct(nn.Module):
    """A norm and its activation, one module (timm's BatchNormAct2d)."""

    def __init__(self, width):
        super().__init__()
        self.norm, self.act = nn.LayerNorm(width), nn.Tanh()

    def forward(self, h):
        return self.act(self.norm(h))


class NormsJoinedByLayers(nn.Module):
    """DenseNet's pattern: modules of one class with parameters, each fed through a layer, never one by the
    other: no residual block repeats here."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3, 6), nn.Linear(6, 4)
        self.n1, self.c1, self.n2, self.c2, self.n3 = NormAct(6), nn.Linear(6, 6), NormAct(6), nn.Linear(6, 6), \
            NormAct(6)

    def forward(self, x):
        return self.head(self.n3(self.c2(self.n2(self.c1(self.n1(self.embed(x)))))))


def test_modules_of_one_class_each_fed_through_a_layer_are_no_chain():
    refused(NormsJoinedByLayers, "found no repeated blocks in NormsJoinedByLayers")


class TrailingActivations(nn.Module):
    """Two residual blocks, then four parameter-free activations in a row (a longer run, but no block)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3, 6), nn.Linear(6, 4)
        self.blocks = nn.Sequential(Residual(6), Residual(6))
        self.acts = nn.Sequential(nn.Tanh(), nn.Tanh(), nn.Tanh(), nn.Tanh())

    def forward(self, x):
        return self.head(self.acts(self.blocks(self.embed(x))))


def test_modules_without_parameters_are_never_blocks_however_long_their_run():
    model, x, y = classified(TrailingActivations, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.fc.weight")
    assert stack.found == "2 blocks (Residual in blocks) as 2 residual sublayers: 2 h + z"


class CachingBlock(nn.Module):
    """A block a generation loop calls with ``use_cache=True`` (transformers' decoder layers): it records what it
    was given; with a cache on it would return one beside its state."""

    def __init__(self, width):
        super().__init__()
        self.fc, self.given = nn.Linear(width, width), []

    def forward(self, h, use_cache=False, window=None):
        self.given.append(use_cache)
        out = h + torch.tanh(self.fc(h))
        return (out, ("cache", out.detach())) if use_cache else (out,)


class CachingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(3, 6), nn.Linear(6, 4)
        self.blocks = nn.ModuleList(CachingBlock(6) for _ in range(3))

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, use_cache=True, window=tuple(range(2)))[0]  # equal, not one object: the same arguments
        return self.head(h)


def test_found_blocks_are_computed_again_without_a_generation_cache():
    model, x, y = classified(CachingModel, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.fc.weight")
    for block in model.blocks:
        block.given.clear()
    engine = trainers.build_engine("highway", k=1, self_check=False)  # the check runs the model's own forward
    engine_grads(stack, engine, x, y, cross_entropy_loss, strip="model.")
    computed = [flag for block in model.blocks for flag in block.given]
    assert computed and not any(computed)  # the engine's calls: use_cache off (the model's own run is stopped)
    assert "each block given its own arguments" not in stack.found  # use_cache=True to each: the same arguments


class VarargsBlock(nn.Module):
    """A block whose forward takes ``*args``: a table it is given besides the state has no parameter name."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, *args):
        h, table = args
        return h + torch.tanh(self.fc(h) + table)


class VarargsModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head, self.table = nn.Linear(3, 6), nn.Linear(6, 4), nn.Parameter(0.1 * torch.randn(6))
        self.blocks = nn.ModuleList(VarargsBlock(6) for _ in range(2))

    def forward(self, x):
        h, table = self.embed(x), torch.tanh(self.table)
        for block in self.blocks:
            h = block(h, table)
        return self.head(h)


def test_a_side_input_given_through_star_args_is_named_by_its_position_and_exact():
    model, x, y = classified(VarargsModel, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.fc.weight")
    assert stack.found.endswith("; 1 side input (argument 1) read by every block")


class KeywordMaskedBlock(MaskedBlock):
    """The state given by keyword (``hidden_states=``), a mask beside it."""

    def forward(self, hidden_states, mask):
        return super().forward(hidden_states, mask)


class KeywordStates(nn.Module):
    """Blocks called with keywords only; the second block alone is given the local mask (the first differs from
    only one other)."""

    def __init__(self, width=6, layers=3):
        super().__init__()
        self.embed, self.head = nn.Linear(3, width), nn.Linear(width, 4)
        self.blocks = nn.ModuleList(KeywordMaskedBlock(width) for _ in range(layers))

    def forward(self, x):
        local = (torch.arange(6) % 2).to(x.dtype)
        every = torch.ones_like(local)  # one tensor given to all blocks but the second
        h = self.embed(x)
        for i, block in enumerate(self.blocks):
            h = block(hidden_states=h, mask=local if i == 1 else every)
        return self.head(h)


def test_blocks_given_their_state_by_keyword_and_one_block_its_own_mask_are_exact():
    model, x, y = classified(KeywordStates, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.fc.weight")
    assert "; each block given its own arguments (masks)" in stack.found
    assert stack.contexts[0].where == "hidden_states"


class PassedOnBlock(nn.Module):
    """Each block computes a bias from its own table and returns it; the next block is given it."""

    def __init__(self, width):
        super().__init__()
        self.fc, self.table = nn.Linear(width, width), nn.Parameter(torch.randn(width))

    def forward(self, h, bias):
        return h + self.fc(torch.tanh(h + bias)), 2 * self.table


class PassedOnBiases(nn.Module):
    def __init__(self, width=6, layers=4):
        super().__init__()
        self.embed, self.head = nn.Linear(3, width), nn.Linear(width, 4)
        self.blocks = nn.ModuleList(PassedOnBlock(width) for _ in range(layers))

    def forward(self, x):
        h = self.embed(x)
        bias = torch.zeros_like(h[0])
        for block in self.blocks:
            h, bias = block(h, bias)
        return self.head(h)


def test_blocks_given_what_the_block_before_them_returned_are_refused_naming_one():
    refused(PassedOnBiases, r"^residual_stack: blocks\.1 is given a tensor an earlier block "
                            r"returned besides its state")


class ParallelBlock(nn.Module):
    """GPT-J's parallel residual: one norm read twice, h + mix(LN(h)) + mlp(LN(h)); the pre-LN split (stopping
    at the second norm's input, which is h itself) cannot give this block, so the whole block is one sublayer."""

    def __init__(self, width):
        super().__init__()
        self.norm, self.mix = nn.LayerNorm(width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))

    def forward(self, h):
        a = self.mix(self.norm(h))
        return h + a + self.mlp(self.norm(h))


class ParallelNet(PreNormNet):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(ParallelBlock(6) for _ in range(2))


def test_a_parallel_residual_block_is_one_sublayer_not_a_wrong_split():
    model, x, y = classified(ParallelNet, 3)
    stack = check_exact_and_k0(model, x, y, cross_entropy_loss, "blocks.0.mix.weight")
    assert stack.found == "2 blocks (ParallelBlock in blocks) as 2 residual sublayers: 2 h + z"


class NormedHead(nn.Module):
    """Residual blocks, then a head with BatchNorm: in training mode its statistics are the batch's."""

    def __init__(self):
        super().__init__()
        self.embed, self.blocks = nn.Linear(3, 6), nn.Sequential(Residual(6), Residual(6))
        self.norm, self.out = nn.BatchNorm1d(6), nn.Linear(6, 4)

    def forward(self, x):
        return self.out(self.norm(self.blocks(self.embed(x))))


def test_a_head_with_batchnorm_in_training_mode_is_exact_and_updated_once_per_step():
    model, x, y = classified(NormedHead, 3)
    model.train()
    before = model.norm.running_mean.clone()
    exact = autograd_grads(model, cross_entropy_loss(model(x), y))
    after_one_forward = model.norm.running_mean.clone()
    model.norm.running_mean.copy_(before)
    model.norm.num_batches_tracked.zero_()
    stack = models.residual_stack(model, example=(x, y))
    model.norm.running_mean.copy_(before)
    model.norm.num_batches_tracked.zero_()
    got = engine_grads(stack, trainers.build_engine("highway", k=100, self_check=False), x, y, cross_entropy_loss,
                       strip="model.")
    assert relative(got, exact) < 1e-10
    torch.testing.assert_close(model.norm.running_mean, after_one_forward, rtol=1e-12, atol=1e-14)


class StateAtTwoPlaces(nn.Module):
    """A hybrid of two block classes whose later blocks are given their state by keyword, the first positionally:
    the state is not at one place in the blocks' arguments."""

    def __init__(self, width=6):
        super().__init__()
        self.embed, self.head = nn.Linear(3, width), nn.Linear(width, 4)
        self.blocks = nn.ModuleList([MaskedBlock(width), KeywordMaskedBlock(width), MaskedBlock(width),
                                     KeywordMaskedBlock(width)])

    def forward(self, x):
        local = (torch.arange(6) % 2).to(x.dtype)
        h = self.embed(x)
        for i, block in enumerate(self.blocks):
            h = block(h, local) if i == 0 else block(**{"h" if i % 2 == 0 else "hidden_states": h},
                                                      mask=local * i)
        return self.head(h)


def test_blocks_given_their_state_at_different_places_are_refused_naming_the_first_blocks_class():
    refused(StateAtTwoPlaces, r"^residual_stack: the blocks found \(MaskedBlock\) take their "
                              r"state at different places")
