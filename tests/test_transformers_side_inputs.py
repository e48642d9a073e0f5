"""transformers' architectures whose blocks read more than their state, on tiny random configurations in float64
(no download): BART's decoder blocks read the encoder's output (cross-attention), DeBERTa-v2's every layer reads
the relative-position table, BEiT with one relative position bias shared by all blocks and layer scale. Each
was silently wrong at k >= L before side inputs were followed (relative error 1.0 on the encoder, the table, the
bias); now Highway-BP at k >= L is autograd on every parameter, k = 0 is not, and with side inputs dropped again
the first-batch self-check refuses in one line naming the parameters."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative

from gradengines import models, trainers
from gradengines.models.adapters.discovery import ResidualFound
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

V, T, B = 23, 7, 3


def bart():
    config = transformers.BartConfig(vocab_size=V, d_model=8, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                      decoder_ffn_dim=16, max_position_embeddings=16, dropout=0.0,
                                      attention_dropout=0.0, activation_dropout=0.0)
    return transformers.BartForConditionalGeneration(config), "tokens"


def deberta_v2():
    config = transformers.DebertaV2Config(vocab_size=V, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=16, max_position_embeddings=16, num_labels=4,
                                          relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=4,
                                          max_relative_positions=8,
                                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.DebertaV2ForSequenceClassification(config), "classes"


def beit_shared_bias():
    config = transformers.BeitConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=8, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=16, num_labels=4,
                                     use_shared_relative_position_bias=True, layer_scale_init_value=0.5,
                                     use_mean_pooling=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BeitForImageClassification(config)
    with torch.no_grad():  # no residual branch near zero, no bias near zero
        for name, p in model.named_parameters():
            if "lambda" in name:
                p.uniform_(0.5, 1.5)
            if "relative_position_bias_table" in name:
                p.normal_()
    return model, "images"


CASES = {"bart": (bart, "encoder_hidden_states", "model.encoder.layers.0.fc1.weight"),
         "deberta_v2": (deberta_v2, "rel_embeddings", "deberta.encoder.rel_embeddings.weight"),
         "beit_shared_bias": (beit_shared_bias, "attention_mask",
                              "beit.shared_position_bias.relative_position_bias_table")}


def case(name):
    torch.manual_seed(0)
    build, side, parameter = CASES[name]
    model, kind = build()
    model = model.double().eval()
    gen = torch.Generator().manual_seed(1)
    if kind == "images":
        x, y = torch.randn(B, 3, 16, 16, generator=gen, dtype=torch.float64), torch.randint(0, 4, (B,), generator=gen)
    else:
        x = torch.randint(0, V, (B, T), generator=gen)
        y = torch.randint(0, V, (B, T), generator=gen) if kind == "tokens" else torch.randint(0, 4, (B,), generator=gen)
    loss_fn = sequence_cross_entropy if kind == "tokens" else cross_entropy_loss
    return model, x, y, loss_fn, side, parameter


@pytest.mark.parametrize("name", sorted(CASES))
def test_highway_follows_the_side_input_exact_at_full_k_and_not_at_k0(name):
    model, x, y, loss_fn, side, parameter = case(name)
    exact = autograd_grads(model, loss_fn(models.call_model(model, x, y).outputs, y))
    stack = models.residual_stack(model, example=(x, y))
    assert stack.found.endswith(f"; 1 side input ({side}) read by every block")
    got = engine_grads(stack, trainers.build_engine("highway", k=100), x, y, loss_fn, strip="model.")
    assert relative(got, exact) < 1e-10
    assert relative(got[parameter], exact[parameter]) < 1e-10
    k0 = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, loss_fn, strip="model.")
    assert relative(k0[parameter], exact[parameter]) > 1e-4


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_side_inputs_dropped_the_self_check_refuses_naming_the_parameters(name, monkeypatch):
    model, x, y, loss_fn, _, parameter = case(name)
    stack = models.residual_stack(model, example=(x, y))
    monkeypatch.setattr(ResidualFound, "side_inputs", lambda self: [])
    with pytest.raises(models.ModelConfigError) as info:
        trainers.build_engine("highway", k=100).compute_grads(stack, x, y, loss_fn)
    message = str(info.value)
    assert "\n" not in message and message.startswith("self-check: Highway-BP at k >= L on the residual stack found")
    assert "a side input Highway-BP does not follow" in message
    assert parameter.rpartition(".")[0] in message or "parameter gradients differ" in message
