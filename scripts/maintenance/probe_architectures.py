"""Probe every gradient engine on many tiny transformers and timm architectures: exact, refused or wrong?

The evidence table for "Exact or refused, never silently wrong". For each architecture (a tiny random
config: hidden 8-16, two layers or stages, vocabulary 29, 7 tokens, batch 2, 32x32 images; float64,
``model.eval()``, ``torch.manual_seed(0)``; every BatchNorm's running statistics, every layer-scale
gamma and every all-zero weight randomised so that no residual branch is near zero) the script builds
inputs, targets and the loss as the framework's tasks do (causal LMs: the next tokens and
``tasks.base.sequence_cross_entropy``; classifiers: class ids and ``tasks.base.cross_entropy_loss``;
encoder-decoders are called as the framework calls any model, ``models.call_model(model, x, y)``) and
runs, each on a fresh deep copy, through the public API only:

* ``backprop`` on the model;
* ``highway`` with k = 1000 (>= depth: claimed exact) on ``models.residual_stack(model, example=(x, y))``
  (structure discovery; ``stack.found`` is recorded), and with k = 0 on the same structure (a contrast:
  it should differ from autograd);
* ``fa`` and ``dfa`` (path auto: the layer path on these models): do they run; and FA with every
  feedback matrix set to the weight each layer's call uses (``engine.layers.mirror``: the weight as the
  forward computes it, e.g. standardised), which must equal backprop.

Gradients are compared with ``torch.autograd.grad`` of ``loss_fn(models.call_model(model, x, y).outputs, y)``
on the original model, per parameter: ``||g - g_ref|| / max(||g_ref||, 1e-30 ||g_ref of all||)``.
Each (architecture, engine) is one of: ``exact`` (every relative error < 1e-6), ``wrong`` (it ran, but some
parameter's relative error is > 1e-6, or the loss it returns is not the model's: silently wrong),
``runs`` (nothing to compare: random feedback, k = 0), ``refused`` (an error of the framework's own,
``models.errors`` / ``trainers.core.errors`` / ``tasks.errors``: a one-line refusal) or ``traceback``
(any other exception). A parameter whose reference gradient is numerically zero (below 1e-8 of the
total, e.g. an attention key bias or a pooling mixer's norm bias, whose gradient is exactly zero in exact
arithmetic: ~1e-18 of the total here) is compared against 1e-8 of the total instead, so that rounding
noise is not called wrong; the table says ``exact (n noise)`` where the strict floor (1e-30) alone would
have called n parameters wrong (the JSON keeps ``max_rel_strict``). The loss each engine returns is
compared with the model's too (relative 1e-9). An architecture whose config or model cannot be built is
recorded as ``skipped``. The results are those of the working tree the script runs in (printed at the end).

Run it (in either environment; transformers and timm are imported only when probed):

    .venv/bin/python scripts/maintenance/probe_architectures.py --library transformers \
        --out /tmp/probe-transformers.json
    .venv-timm/bin/python scripts/maintenance/probe_architectures.py --library timm --out /tmp/probe-timm.json

``--library all`` (the default) probes every library that imports; ``--only REGEX`` a subset. The JSON
holds one row per architecture with the full messages, the worst parameters and the timings; stdout gets
the markdown table and a count per engine column.
"""

import argparse
import copy
import importlib
import json
import math
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gradengines import (
    models,  # noqa: E402
    trainers,  # noqa: E402
)
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy  # noqa: E402

RTOL = 1e-6  # float64: an exact method agrees to ~1e-12
NOISE = 1e-8  # a reference gradient below this fraction of the total is numerically zero
LOSS_RTOL = 1e-9
VOCAB, SEQ, BATCH, IMAGE, LABELS, IMAGE_LABELS = 29, 7, 2, 32, 3, 10
COLUMNS = ("backprop", "highway_exact", "highway_k0", "fa", "fa_bw", "dfa")
HEADERS = ("backprop", "highway k>=L", "highway k=0 (differs?)", "fa runs", "fa(B=W)=backprop", "dfa")


def _refusal_classes() -> tuple[type, ...]:
    """Every exception class the framework defines: raising one of them is a one-line refusal."""
    found = []
    for name in ("gradengines.models.errors", "gradengines.trainers.core.errors", "gradengines.tasks.errors"):
        module = importlib.import_module(name)
        found += [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, BaseException)
                  and v.__module__ == module.__name__]
    return tuple(found) + (models.ModelConfigError, trainers.ConfigError, trainers.IncompatibleModelError)


REFUSALS = _refusal_classes()


def first_line(err: BaseException, limit: int = 160) -> str:
    text = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


# ---- the architectures -------------------------------------------------------------------------------


@dataclass
class Case:
    library: str
    name: str
    kind: str  # lm, seq2seq, seq-cls, img-cls, encoder, audio-cls
    build: Callable[[], nn.Module]
    note: str = ""
    image: int = IMAGE
    mels: int = 8
    frames: int = 16
    width: int = 16  # encoder: the hidden size the targets index


def _hf(name: str, config: str, kind: str, note: str = "", **kwargs) -> Case:
    def build():
        import transformers
        cfg = getattr(transformers, config)(**kwargs)
        return getattr(transformers, name)(cfg)
    extra = {"mels": kwargs.get("num_mel_bins", 8), "frames": 2 * kwargs.get("max_source_positions", 8)}
    return Case("transformers", name, kind, build, note, width=kwargs.get("d_model", kwargs.get("hidden_size", 16)),
                **extra)


LLAMA = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BERT = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=40, num_labels=LABELS, pad_token_id=0)
VIT = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=IMAGE,
           patch_size=8, num_channels=3, num_labels=IMAGE_LABELS)
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
               decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
               pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
T5 = dict(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
          relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1,
          decoder_start_token_id=0)


def transformers_cases() -> list[Case]:
    return [
        _hf("GPT2LMHeadModel", "GPT2Config", "lm", vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2,
            bos_token_id=1, eos_token_id=2),
        _hf("GPTNeoXForCausalLM", "GPTNeoXConfig", "lm", "parallel residual", vocab_size=VOCAB, hidden_size=16,
            num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
            use_parallel_residual=True, bos_token_id=1, eos_token_id=2),
        _hf("GPTJForCausalLM", "GPTJConfig", "lm", "parallel residual", vocab_size=VOCAB, n_positions=32, n_embd=16,
            n_layer=2, n_head=2, rotary_dim=4, bos_token_id=1, eos_token_id=2),
        _hf("FalconForCausalLM", "FalconConfig", "lm", "parallel attention", vocab_size=VOCAB, hidden_size=16,
            num_hidden_layers=2, num_attention_heads=2, bos_token_id=1, eos_token_id=2),
        _hf("PhiForCausalLM", "PhiConfig", "lm", "parallel residual", vocab_size=VOCAB, hidden_size=16,
            intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32,
            bos_token_id=1, eos_token_id=2),
        _hf("OPTForCausalLM", "OPTConfig", "lm", "pre-LN", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
            ffn_dim=32, num_attention_heads=2, max_position_embeddings=32, word_embed_proj_dim=16, pad_token_id=1,
            bos_token_id=2, eos_token_id=2),
        _post_ln_opt(),
        _hf("LlamaForCausalLM", "LlamaConfig", "lm", **LLAMA),
        _hf("Qwen2ForCausalLM", "Qwen2Config", "lm", **LLAMA),
        _hf("MistralForCausalLM", "MistralConfig", "lm", **LLAMA),
        _hf("GemmaForCausalLM", "GemmaConfig", "lm", **LLAMA, head_dim=8),
        _hf("Gemma2ForCausalLM", "Gemma2Config", "lm", "sandwich norms", **LLAMA, head_dim=8),
        _hf("StableLmForCausalLM", "StableLmConfig", "lm", **LLAMA),
        _hf("Phi3ForCausalLM", "Phi3Config", "lm", **LLAMA),
        # eager experts: the default grouped_mm kernel has no float64
        _hf("MixtralForCausalLM", "MixtralConfig", "lm", "MoE", **LLAMA, num_local_experts=4, num_experts_per_tok=2,
            experts_implementation="eager"),
        _hf("Qwen2MoeForCausalLM", "Qwen2MoeConfig", "lm", "MoE + shared expert", **LLAMA, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
            experts_implementation="eager"),
        _hf("BloomForCausalLM", "BloomConfig", "lm", "ALiBi", vocab_size=VOCAB, hidden_size=16, n_layer=2, n_head=2,
            bos_token_id=1, eos_token_id=2, pad_token_id=0),
        _hf("CodeGenForCausalLM", "CodeGenConfig", "lm", "parallel residual", vocab_size=VOCAB, n_positions=32,
            n_ctx=32, n_embd=16, n_layer=2, n_head=2, rotary_dim=4, bos_token_id=1, eos_token_id=2),
        _hf("GPTNeoForCausalLM", "GPTNeoConfig", "lm", "local attention", vocab_size=VOCAB, hidden_size=16,
            num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]], window_size=4,
            max_position_embeddings=32, bos_token_id=1, eos_token_id=2),
        _hf("GPTBigCodeForCausalLM", "GPTBigCodeConfig", "lm", "multi-query", vocab_size=VOCAB, n_positions=32,
            n_embd=16, n_layer=2, n_head=2, multi_query=True, bos_token_id=1, eos_token_id=2),
        _hf("MambaForCausalLM", "MambaConfig", "lm", "state space (not residual attention)", vocab_size=VOCAB,
            hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4, bos_token_id=1,
            eos_token_id=2, pad_token_id=0),
        _hf("BertForSequenceClassification", "BertConfig", "seq-cls", "post-LN", **BERT),
        _hf("RobertaForSequenceClassification", "RobertaConfig", "seq-cls", "post-LN",
            **{**BERT, "pad_token_id": 1}),
        _hf("XLMRobertaForSequenceClassification", "XLMRobertaConfig", "seq-cls", "post-LN",
            **{**BERT, "pad_token_id": 1}),
        _hf("ElectraForSequenceClassification", "ElectraConfig", "seq-cls", "post-LN", **BERT, embedding_size=8),
        _hf("MPNetForSequenceClassification", "MPNetConfig", "seq-cls", "relative bias", **{**BERT, "pad_token_id": 1}),
        _hf("DistilBertForSequenceClassification", "DistilBertConfig", "seq-cls", "post-LN", vocab_size=VOCAB,
            dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=32, num_labels=LABELS,
            pad_token_id=0),
        _hf("AlbertForSequenceClassification", "AlbertConfig", "seq-cls", "one layer shared by all", **BERT,
            embedding_size=8, num_hidden_groups=1),
        _hf("DebertaV2ForSequenceClassification", "DebertaV2Config", "seq-cls", "disentangled relative attention",
            **BERT, relative_attention=True, position_buckets=8, max_relative_positions=16,
            pos_att_type=["p2c", "c2p"]),
        _hf("ViTForImageClassification", "ViTConfig", "img-cls", **VIT),
        _hf("DeiTForImageClassification", "DeiTConfig", "img-cls", **VIT),
        _hf("BeitForImageClassification", "BeitConfig", "img-cls", "shared relative position bias, layer scale",
            **VIT, use_shared_relative_position_bias=True, layer_scale_init_value=0.1, use_mean_pooling=True),
        _hf("Data2VecVisionForImageClassification", "Data2VecVisionConfig", "img-cls", "layer scale",
            **VIT, use_relative_position_bias=True, layer_scale_init_value=0.1, use_mean_pooling=True),
        _hf("SwinForImageClassification", "SwinConfig", "img-cls", "windows, patch merging", image_size=IMAGE,
            patch_size=4, num_channels=3, embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=4,
            num_labels=IMAGE_LABELS),
        _hf("ConvNextForImageClassification", "ConvNextConfig", "img-cls", "layer scale", num_channels=3,
            hidden_sizes=[8, 16], depths=[2, 2], num_stages=2, image_size=IMAGE, num_labels=IMAGE_LABELS),
        _hf("ResNetForImageClassification", "ResNetConfig", "img-cls", "BatchNorm", num_channels=3,
            embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2], layer_type="basic", num_labels=IMAGE_LABELS),
        _hf("MobileViTForImageClassification", "MobileViTConfig", "img-cls", "conv + transformer", num_channels=3,
            image_size=IMAGE, patch_size=2, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 8, 16, 16, 16, 32],
            num_attention_heads=2, mlp_ratio=2.0, num_labels=IMAGE_LABELS),
        _hf("WhisperForAudioClassification", "WhisperConfig", "audio-cls", "encoder + classifier", vocab_size=VOCAB,
            num_mel_bins=8, encoder_layers=2, encoder_attention_heads=2, decoder_layers=2, decoder_attention_heads=2,
            d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=8, max_target_positions=16,
            num_labels=LABELS, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
        _hf("T5EncoderModel", "T5Config", "encoder", "relative bias, RMSNorm; hidden states as logits", **T5),
        _hf("BartForConditionalGeneration", "BartConfig", "seq2seq", **SEQ2SEQ),
        _hf("MBartForConditionalGeneration", "MBartConfig", "seq2seq", **SEQ2SEQ),
        _hf("MarianMTModel", "MarianConfig", "seq2seq", **{**SEQ2SEQ, "decoder_start_token_id": 1}),
        _hf("PegasusForConditionalGeneration", "PegasusConfig", "seq2seq", **{**SEQ2SEQ, "decoder_start_token_id": 1}),
        _hf("BlenderbotSmallForConditionalGeneration", "BlenderbotSmallConfig", "seq2seq", **SEQ2SEQ),
        _hf("LEDForConditionalGeneration", "LEDConfig", "seq2seq", "local attention", vocab_size=VOCAB, d_model=16,
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=32, decoder_ffn_dim=32, max_encoder_position_embeddings=32,
            max_decoder_position_embeddings=32, attention_window=[4, 4], pad_token_id=1, bos_token_id=0,
            eos_token_id=2, decoder_start_token_id=2),
        _hf("T5ForConditionalGeneration", "T5Config", "seq2seq", **T5),
    ]


def _post_ln_opt() -> Case:
    case = _hf("OPTForCausalLM", "OPTConfig", "lm", "post-LN (do_layer_norm_before=False)", vocab_size=VOCAB,
               hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2, max_position_embeddings=32,
               word_embed_proj_dim=16, do_layer_norm_before=False, pad_token_id=1, bos_token_id=2, eos_token_id=2)
    case.name = "OPTForCausalLM (post-LN)"
    return case


def _timm(name: str, note: str = "", image: int = IMAGE, cls: str = "", **kwargs) -> Case:
    """A timm model by name, or (``cls``: "module.Class") its class built directly where the name's own
    arguments cannot be overridden (MLP-Mixer, ConvMixer)."""
    def build():
        import timm
        if cls:
            module, _, attr = cls.rpartition(".")
            return getattr(importlib.import_module(module), attr)(num_classes=IMAGE_LABELS, **kwargs)
        return timm.create_model(name, pretrained=False, num_classes=IMAGE_LABELS, **kwargs)
    return Case("timm", name, "img-cls", build, note, image=image)


TINY_VIT = dict(img_size=IMAGE, patch_size=8, embed_dim=16, depth=2, num_heads=2)


def timm_cases() -> list[Case]:
    return [
        _timm("resnet18", "BasicBlock, relu(h + z)"),
        _timm("resnet50", "Bottleneck"),
        _timm("resnetv2_50", "pre-activation"),
        _timm("mobilenetv3_small_050", "inverted residuals, SE"),
        _timm("tf_mobilenetv3_small_minimal_100", "TF 'same' padding"),
        _timm("efficientnet_b0", "MBConv, SE"),
        _timm("regnetx_002"),
        _timm("regnety_002", "SE"),
        _timm("deit_tiny_patch16_224", "ViT, 2 blocks", **TINY_VIT),
        _timm("vit_tiny_patch16_224", "ViT, 2 blocks", **TINY_VIT),
        _timm("swin_tiny_patch4_window7_224", "windows, patch merging", img_size=IMAGE, window_size=4, embed_dim=16,
              depths=(2, 2), num_heads=(2, 2)),
        _timm("convnext_atto", "layer scale"),
        _timm("densenet121", "concatenation, not addition"),
        _timm("cait_xxs24_224", "layer scale, class attention", **TINY_VIT, depth_token_only=1),
        _timm("beit_base_patch16_224", "shared relative position bias, layer scale", **TINY_VIT,
              use_shared_rel_pos_bias=True, use_rel_pos_bias=False, init_values=0.1),
        _timm("poolformer_s12", "MetaFormer, pooling mixer"),
        _timm("mixer_s16_224", "MLP-Mixer, class MlpMixer", cls="timm.models.mlp_mixer.MlpMixer", img_size=IMAGE,
              patch_size=8, num_blocks=2, embed_dim=16),
        # efficientformer_l1's attention bias is fixed at 7x7 (224x224 input only): v2, which takes img_size
        _timm("efficientformerv2_s0", "attention bias", img_size=IMAGE),
        _timm("levit_128s", "attention bias, BatchNorm", img_size=IMAGE),
        _timm("xcit_nano_12_p16_224", "cross-covariance attention, layer scale", img_size=IMAGE, depth=2),
        _timm("convmixer_768_32", "class ConvMixer, dim 16, depth 2", cls="timm.models.convmixer.ConvMixer", dim=16,
              depth=2, kernel_size=3, patch_size=4),
        _timm("ghostnet_100"),
        _timm("rexnet_100"),
        _timm("dla34", "aggregation trees"),
        _timm("cspresnet50", "cross-stage partial"),
        _timm("ese_vovnet19b_dw", "one-shot aggregation"),
        _timm("nf_resnet26", "normalizer-free, weight standardisation"),
        _timm("repvgg_a0", "re-parameterisable branches"),
        _timm("hrnet_w18_small", "multi-resolution fusion"),
        _timm("mobilenetv1_100", "depthwise separable"),
        # hybrids (issue 51): stages of different block kinds, relative-position MLPs
        _timm("coatnet_nano_rw_224", "MBConv stages, then attention stages", img_size=64, image=64),
        _timm("coatnet_rmlp_nano_rw_224", "as CoAtNet, relative-position MLP", img_size=64, image=64),
        _timm("maxxvit_rmlp_nano_rw_256", "block and grid attention, relative-position MLP", img_size=128,
              image=128),
        _timm("fastvit_t8", "reparameterisable stem, RepMixer stages"),
        _timm("tiny_vit_5m_224", "MBConv stage, then attention stages"),
        _timm("caformer_s18", "MetaFormer: convolution stages, then attention stages"),
        _timm("convit_tiny", "gated positional, then plain attention", img_size=IMAGE, patch_size=8, embed_dim=48,
              depth=4, num_heads=4, local_up_to_layer=2),
        _timm("coat_lite_tiny", "serial blocks, convolutional position encoding", img_size=IMAGE),
        _timm("edgenext_xx_small", "convolution stages, then split transposed attention"),
        _timm("efficientvit_b0", "MBConv, then linear attention"),
        _timm("nextvit_small", "convolution and transformer blocks in each stage"),
        _timm("repvit_m1", "re-parameterisable mobile ViT-like blocks"),
        _timm("mobilevitv2_050", "convolution, then separable attention blocks"),
        _timm("vit_relpos_small_patch16_224", "relative-position MLP", **TINY_VIT),
        _timm("swinv2_tiny_window8_256", "windows, continuous position bias MLP", img_size=IMAGE, window_size=4,
              embed_dim=16, depths=(2, 2), num_heads=(2, 2)),
    ]


# ---- one architecture ---------------------------------------------------------------------------------

LAYER_SCALE = re.compile(r"(gamma|^lambda|layer_scale|skipinit|_gain$|^gain$)")
NORMS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


def randomise(model: nn.Module, gen: torch.Generator) -> int:
    """BatchNorm running statistics, layer-scale gammas and all-zero weights: random (no branch near zero)."""
    changed = 0
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
                if t is None or not t.is_floating_point():
                    continue
                full = f"{module_name}.{name}" if module_name else name
                if isinstance(module, nn.modules.batchnorm._BatchNorm) and name in ("running_mean", "running_var"):
                    r = torch.rand(t.shape, generator=gen, dtype=torch.float64)
                    t.copy_(0.4 * (r - 0.5) if name == "running_mean" else 0.5 + r)
                elif LAYER_SCALE.search(name.lower()) or "layer_scale" in full.lower() or (
                        isinstance(t, nn.Parameter) and not name.endswith("bias") and bool((t == 0).all())):
                    if isinstance(module, NORMS) or LAYER_SCALE.search(name.lower()) or "layer_scale" in full.lower():
                        t.copy_(0.5 + torch.rand(t.shape, generator=gen, dtype=torch.float64))
                    else:
                        t.copy_(0.1 * torch.randn(t.shape, generator=gen, dtype=torch.float64))
                else:
                    continue
                changed += 1
    return changed


def batch(case: Case, gen: torch.Generator):
    """(inputs, targets, loss_fn) as the framework's tasks make them."""
    if case.kind in ("lm", "seq2seq"):
        tokens = torch.randint(3, VOCAB, (BATCH, SEQ + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:].contiguous(), sequence_cross_entropy
    if case.kind == "encoder":
        x = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
        return x, torch.randint(0, case.width, (BATCH, SEQ), generator=gen), sequence_cross_entropy
    if case.kind == "seq-cls":
        x = torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen)
        return x, torch.randint(0, LABELS, (BATCH,), generator=gen), cross_entropy_loss
    if case.kind == "audio-cls":
        x = torch.randn(BATCH, case.mels, case.frames, generator=gen, dtype=torch.float64)
        return x, torch.randint(0, LABELS, (BATCH,), generator=gen), cross_entropy_loss
    x = torch.randn(BATCH, 3, case.image, case.image, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, IMAGE_LABELS, (BATCH,), generator=gen), cross_entropy_loss


def reference(model, x, y, loss_fn):
    """The loss and autograd's gradient of every trainable parameter (zeros where unused)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    loss = loss_fn(models.call_model(model, x, y).outputs, y)
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    return float(loss.detach()), {n: (torch.zeros_like(p) if g is None else g.detach())
                                  for (n, p), g in zip(params, grads, strict=True)}


def compare(model: nn.Module, ref: dict) -> dict:
    """Per-parameter relative error of ``p.grad`` (None: zeros) against the reference gradients:
    ``||g - g_ref|| / max(||g_ref||, NOISE ||g_ref of all||)``. ``max_rel_strict`` uses the floor 1e-30 instead;
    ``noise`` names the parameters that only the strict floor calls wrong (numerically zero gradients)."""
    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in ref.values()))
    errors, noise, strict = [], [], 0.0
    for name, p in model.named_parameters():
        if name not in ref:
            continue
        r = ref[name].double()
        g = torch.zeros_like(r) if p.grad is None else p.grad.double()
        gap, size = float((g - r).norm()), float(r.norm())
        rel = gap / max(size, NOISE * total, 1e-300)
        rel_strict = gap / max(size, 1e-30 * total, 1e-300)
        strict = max(strict, rel_strict) if rel_strict == rel_strict else float("nan")
        if rel < RTOL <= rel_strict:
            noise.append(name)
        errors.append((rel, name, size / max(total, 1e-300)))
    errors.sort(key=lambda e: (e[0] == e[0], e[0]), reverse=True)  # NaN first
    bad = [e for e in errors if not e[0] < RTOL]  # NaN counts as bad
    return {"max_rel": errors[0][0] if errors else 0.0, "max_rel_strict": strict, "n_wrong": len(bad),
            "n_params": len(errors), "worst": [{"name": n, "rel": r, "ref_share": f} for r, n, f in errors[:3]],
            "noise": noise}


def classify_exception(err: BaseException) -> dict:
    status = "refused" if isinstance(err, REFUSALS) else "traceback"
    cell = {"status": status, "reason": first_line(err), "message": first_line(err, 2000)}
    if status == "traceback":
        cell["trace"] = traceback.format_exc(limit=-3)[-1500:]
    return cell


def run_engine(setup: Callable, x, y, loss_fn, ref, ref_loss, compared: bool) -> dict:
    """One engine: ``setup()`` gives (engine, what it runs on: the model or its stack, the model whose
    ``p.grad`` is read); classified. A failure in the setup (a deep copy, the discovery) is a finding too."""
    start = time.perf_counter()
    try:
        engine, target, model = setup()
        out = engine.compute_grads(target, x, y, loss_fn)
    except Exception as err:  # noqa: BLE001 - every failure is a finding
        cell = classify_exception(err)
        cell["seconds"] = round(time.perf_counter() - start, 3)
        return cell
    cell: dict = {"status": "runs", "seconds": round(time.perf_counter() - start, 3)}
    loss = float(out.loss)
    if ref_loss is not None:
        cell["loss_gap"] = abs(loss - ref_loss) / max(abs(ref_loss), 1e-300)
    if ref is not None:
        cell.update(compare(model, ref))
    if ref_loss is not None and not cell["loss_gap"] < LOSS_RTOL:
        cell.update(status="wrong", reason=f"its loss {loss:.10g} is not the model's {ref_loss:.10g}")
    elif compared and ref is not None:
        if cell["n_wrong"]:
            worst = ", ".join(f"{w['name']} {w['rel']:.1e}" for w in cell["worst"] if not w["rel"] < RTOL)
            cell.update(status="wrong", reason=f"{cell['n_wrong']}/{cell['n_params']} params off: {worst}")
        else:
            cell["status"] = "exact"
    return cell


def probe(case: Case) -> dict:
    row: dict = {"library": case.library, "architecture": case.name, "kind": case.kind, "note": case.note}
    start = time.perf_counter()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    try:
        model = case.build().double().eval()
        row["randomised"] = randomise(model, gen)
        x, y, loss_fn = batch(case, gen)
        row["parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        pristine = copy.deepcopy(model)  # before any forward: some models cache tensors in eval mode
    except Exception as err:  # noqa: BLE001
        row.update(skipped=first_line(err, 300), seconds=round(time.perf_counter() - start, 2))
        return row
    row["build_seconds"] = round(time.perf_counter() - start, 2)
    ref = ref_loss = None
    try:
        ref_loss, ref = reference(model, x, y, loss_fn)
        row["loss"] = ref_loss
    except Exception as err:  # noqa: BLE001
        row["reference"] = classify_exception(err)

    def plain(engine: str, **options) -> Callable:
        def setup():
            m = copy.deepcopy(pristine)
            return trainers.build_engine(engine, **options), m, m
        return setup

    def highway(k: int) -> Callable:
        def setup():
            m = copy.deepcopy(pristine)
            stack = models.residual_stack(m, example=(x, y))
            row.setdefault("found", getattr(stack, "found", type(stack).__name__))
            row["boundaries_only"] = all(getattr(b, "describe", str)() == "boundary" for b in stack.blocks)
            return trainers.build_engine("highway", k=k), stack, m
        return setup

    def fa_bw():
        m = copy.deepcopy(pristine)
        return _fa_bw(m), m, m

    setups = {"backprop": (plain("backprop"), True), "highway_exact": (highway(1000), True),
              "highway_k0": (highway(0), False), "fa": (plain("fa"), False), "fa_bw": (fa_bw, True),
              "dfa": (plain("dfa"), False)}
    cells = {column: run_engine(setup, x, y, loss_fn, ref, ref_loss, compared)
             for column, (setup, compared) in setups.items()}
    if "found" not in row:  # the discovery failed: say how
        row["found"] = f"{cells['highway_exact']['status']}: {cells['highway_exact']['reason']}"
    row["cells"] = cells
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def _fa_bw(model: nn.Module):
    """FA whose every feedback matrix is its layer's forward weight: backprop, if the layer path is exact."""
    engine = trainers.build_engine("fa")
    engine.layers.mirror = True  # B = the weight each layer's call uses (a standardised weight, not the stored)
    return engine


# ---- the table ----------------------------------------------------------------------------------------


def short(text: str, limit: int) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def short_found(found: str) -> str:
    m = re.match(r"(\d+) blocks \((\w+) in [^)]*\) as (\d+) residual sublayers: (.*)", found)
    if m:
        kinds = m.group(4).replace("exact boundaries (a shape change)", "boundary")
        return short(f"{m.group(1)}×{m.group(2)} → {m.group(3)}: {kinds}", 70)
    return short(found, 70)


def cell_text(column: str, cell: dict | None, row: dict) -> str:
    if cell is None:
        return "-"
    status = cell["status"]
    if status in ("refused", "traceback"):
        return f"{status}: {short(cell['reason'], 60)}"
    if status == "wrong":
        return f"**WRONG**: {short(cell['reason'], 70)}"
    if column == "highway_k0" and status == "runs":
        if "max_rel" not in cell:
            return "runs"
        if cell["max_rel"] > RTOL:
            return f"differs ({cell['max_rel']:.0e})"
        return "same (all boundaries: exact VJPs)" if row.get("boundaries_only") else "**SAME as autograd**"
    if status == "exact" and cell.get("noise"):
        return f"exact ({len(cell['noise'])} noise)"
    return status


def table(rows: list[dict]) -> str:
    lines = ["| library | architecture | discovery found | " + " | ".join(HEADERS) + " |",
             "|" + "---|" * (3 + len(HEADERS))]
    for row in rows:
        name = row["architecture"] + (f" ({row['note']})" if row.get("note") and row["kind"] != "lm" else "")
        if "skipped" in row:
            lines.append(f"| {row['library']} | {short(name, 60)} | skipped: {short(row['skipped'], 90)} |"
                         + " |" * len(HEADERS))
            continue
        found = short_found(row.get("found", "-"))
        cells = [cell_text(c, row["cells"].get(c), row) for c in COLUMNS]
        lines.append(f"| {row['library']} | {short(name, 60)} | {found} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    statuses = ("exact", "wrong", "runs", "refused", "traceback")
    lines = ["| engine | " + " | ".join(statuses) + " |", "|---|" + "---|" * len(statuses)]
    for column, header in zip(COLUMNS, HEADERS, strict=True):
        counts = dict.fromkeys(statuses, 0)
        for row in rows:
            cell = row.get("cells", {}).get(column)
            if cell is not None:
                counts[cell["status"]] += 1
        lines.append(f"| {header} | " + " | ".join(str(counts[s]) for s in statuses) + " |")
    built = sum("skipped" not in r for r in rows)
    return "\n".join(lines) + f"\n\n{built} architectures probed, {len(rows) - built} skipped (could not be built)."


def tree() -> str:
    """The commit the results are of, and the files changed since (engines are edited in place)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    changed = [line[3:] for line in changed if line.strip()]
    return head + (f" + changes to {', '.join(changed)}" if changed else "")


def libraries(asked: str) -> list[str]:
    wanted = ["transformers", "timm"] if asked == "all" else [asked]
    usable = []
    for name in wanted:
        try:
            importlib.import_module(name)
            usable.append(name)
        except ImportError as err:
            if asked != "all":
                raise SystemExit(f"--library {name}: cannot import it here ({err})") from None
            print(f"note: {name} is not importable here, not probed", file=sys.stderr)
    return usable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", choices=("transformers", "timm", "all"), default="all")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--only", help="probe only architectures whose name matches this regular expression")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    cases = []
    for library in libraries(args.library):
        if library == "transformers":
            import transformers
            transformers.logging.set_verbosity_error()
            cases += transformers_cases()
        else:
            cases += timm_cases()
    if args.only:
        cases = [c for c in cases if re.search(args.only, c.name)]
    start, rows = time.perf_counter(), []
    for i, case in enumerate(cases, 1):
        row = probe(case)
        rows.append(row)
        states = "skipped" if "skipped" in row else " ".join(row["cells"][c]["status"] for c in COLUMNS)
        print(f"[{i}/{len(cases)}] {case.library} {case.name}: {states} ({row.get('seconds', 0):.1f}s)",
              file=sys.stderr, flush=True)
    wall = time.perf_counter() - start
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    print()
    print(summary(rows))
    print(f"\nwall time {wall:.0f} s, torch {torch.__version__}, tree {tree()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
