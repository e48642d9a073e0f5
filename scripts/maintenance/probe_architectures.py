"""Probe every gradient engine on many tiny transformers and timm architectures: exact, refused or wrong?

The evidence table for "Exact or refused, never silently wrong". For each architecture (a tiny random
config: hidden 8-16, two layers or stages, vocabulary 29, 7 tokens, batch 2, 32x32 images; float64,
``model.eval()``, ``torch.manual_seed(0)``; every BatchNorm's running statistics, every layer-scale
gamma and every all-zero weight randomised so that no residual branch is near zero) the script builds
inputs, targets and the loss as the framework's tasks do (causal LMs: the next tokens and
``tasks.base.sequence_cross_entropy``; classifiers: class ids and ``tasks.base.cross_entropy_loss``, each
example ending with the end-of-sequence id for an encoder-decoder classifier (MBart's, MT5's, ...), which reads
its hidden state there; encoder-decoders are called as the framework calls any model,
``models.call_model(model, x, y)``) and
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
    last_token: int | None = None  # seq-cls: every example ends with this id (an encoder-decoder's end of sequence)


def _hf(name: str, config: str, kind: str, note: str = "", last_token: int | None = None, **kwargs) -> Case:
    def build():
        import transformers
        cfg = getattr(transformers, config)(**kwargs)
        return getattr(transformers, name)(cfg)
    extra = {"mels": kwargs.get("num_mel_bins", 8), "frames": 2 * kwargs.get("max_source_positions", 8)}
    return Case("transformers", name, kind, build, note, width=kwargs.get("d_model", kwargs.get("hidden_size", 16)),
                last_token=last_token, **extra)


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
        *added_transformers_cases(),
    ]


def added_transformers_cases() -> list[Case]:
    """Issue 63: families the probe did not cover (recent decoder LMs with per-layer attention types, hybrids with
    state-space or linear-attention layers, efficient CNNs and CNN-transformer hybrids, encoder-decoder
    classifiers, more encoders)."""
    layers2 = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, experts_implementation="eager")
    mamba2 = dict(mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=4, mamba_d_conv=4, mamba_expand=2,
                  mamba_chunk_size=4)
    return [
        # recent decoder LMs, several with per-layer attention types (sliding window / full)
        _hf("Gemma3ForCausalLM", "Gemma3TextConfig", "lm", "sliding and full layers, sandwich norms", **LLAMA,
            head_dim=8, **layers2),
        _hf("Gemma3nForCausalLM", "Gemma3nTextConfig", "lm", "AltUp, LAuReL, per-layer inputs", **LLAMA, head_dim=8,
            **layers2, vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=4, laurel_rank=4,
            altup_num_inputs=2, num_kv_shared_layers=0, activation_sparsity_pattern=[0.0, 0.0]),
        _hf("VaultGemmaForCausalLM", "VaultGemmaConfig", "lm", **LLAMA, head_dim=8, **layers2),
        _hf("CohereForCausalLM", "CohereConfig", "lm", "parallel residual", **LLAMA),
        _hf("Cohere2ForCausalLM", "Cohere2Config", "lm", "parallel residual, sliding and full layers", **LLAMA,
            **layers2),
        _hf("OlmoForCausalLM", "OlmoConfig", "lm", "non-parametric LayerNorm", **LLAMA),
        _hf("Olmo2ForCausalLM", "Olmo2Config", "lm", "norms after each sublayer", **LLAMA),
        _hf("Olmo3ForCausalLM", "Olmo3Config", "lm", "sliding and full layers", **LLAMA, **layers2),
        _hf("OlmoeForCausalLM", "OlmoeConfig", "lm", "MoE", **LLAMA, num_experts=4, num_experts_per_tok=2,
            experts_implementation="eager"),
        _hf("Qwen3ForCausalLM", "Qwen3Config", "lm", "q/k norms", **LLAMA, head_dim=8),
        _hf("Qwen3MoeForCausalLM", "Qwen3MoeConfig", "lm", "MoE", **LLAMA, head_dim=8, **moe),
        _hf("SmolLM3ForCausalLM", "SmolLM3Config", "lm", "RoPE on some layers only", **LLAMA,
            no_rope_layers=[1, 0]),
        _hf("GlmForCausalLM", "GlmConfig", "lm", "partial rotary", **LLAMA, head_dim=8),
        _hf("Glm4ForCausalLM", "Glm4Config", "lm", "sandwich norms", **LLAMA, head_dim=8),
        _hf("PhimoeForCausalLM", "PhimoeConfig", "lm", "MoE", **LLAMA, num_local_experts=4, num_experts_per_tok=2,
            experts_implementation="eager"),
        _hf("GraniteForCausalLM", "GraniteConfig", "lm", "residual multiplier", **LLAMA, residual_multiplier=0.5,
            embedding_multiplier=2.0, logits_scaling=2.0, attention_multiplier=0.25),
        _hf("GraniteMoeForCausalLM", "GraniteMoeConfig", "lm", "MoE, residual multiplier", **LLAMA,
            num_local_experts=4, num_experts_per_tok=2, residual_multiplier=0.5, experts_implementation="eager"),
        _hf("HeliumForCausalLM", "HeliumConfig", "lm", **LLAMA, head_dim=8),
        _hf("DogeForCausalLM", "DogeConfig", "lm", "dynamic mask attention, learned residual weights", **LLAMA),
        _hf("Exaone4ForCausalLM", "Exaone4Config", "lm", "sliding and full layers, norms after sublayers", **LLAMA,
            **layers2),
        _hf("Ernie4_5ForCausalLM", "Ernie4_5Config", "lm", **LLAMA, head_dim=8),
        _hf("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", "lm", "MoE + shared expert", **LLAMA, head_dim=8,
            moe_num_experts=4, moe_k=2, moe_intermediate_size=16, moe_num_shared_experts=1, moe_layer_start_index=0,
            experts_implementation="eager"),
        _hf("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", "lm", "q/k norms", **LLAMA, head_dim=8),
        _hf("Dots1ForCausalLM", "Dots1Config", "lm", "MoE, dense first layer", **LLAMA, head_dim=8,
            n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16,
            first_k_dense_replace=1, n_group=1, topk_group=1, experts_implementation="eager"),
        _hf("SeedOssForCausalLM", "SeedOssConfig", "lm", **LLAMA, head_dim=8),
        _hf("ApertusForCausalLM", "ApertusConfig", "lm", "xIELU", **LLAMA),
        _hf("ArceeForCausalLM", "ArceeConfig", "lm", "ReLU^2 MLP", **LLAMA),
        _hf("MinistralForCausalLM", "MinistralConfig", "lm", "sliding and full layers", **LLAMA, head_dim=8,
            **layers2),
        _hf("Starcoder2ForCausalLM", "Starcoder2Config", "lm", **LLAMA),
        _hf("NemotronForCausalLM", "NemotronConfig", "lm", "LayerNorm1p", **LLAMA),
        _hf("PersimmonForCausalLM", "PersimmonConfig", "lm", "q/k LayerNorms", **LLAMA),
        _hf("DiffLlamaForCausalLM", "DiffLlamaConfig", "lm", "differential attention", **LLAMA),
        _hf("GptOssForCausalLM", "GptOssConfig", "lm", "attention sinks, MoE, sliding and full layers", **LLAMA,
            head_dim=8, num_local_experts=4, num_experts_per_tok=2, **layers2, experts_implementation="eager"),
        _hf("DeepseekV3ForCausalLM", "DeepseekV3Config", "lm", "multi-head latent attention, MoE", **LLAMA,
            kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=4, n_routed_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1, n_group=1,
            topk_group=1, experts_implementation="eager"),
        _hf("MptForCausalLM", "MptConfig", "lm", "ALiBi", vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2,
            expansion_ratio=2, max_seq_len=32, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        _hf("BioGptForCausalLM", "BioGptConfig", "lm", **{k: v for k, v in BERT.items() if k != "num_labels"},
            bos_token_id=1, eos_token_id=2),
        _hf("JetMoeForCausalLM", "JetMoeConfig", "lm", "mixture of attention heads and of MLPs", vocab_size=VOCAB,
            hidden_size=16, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8, intermediate_size=32,
            max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2, pad_token_id=0, bos_token_id=1,
            eos_token_id=2),
        # hybrids: state-space, convolution or linear-attention layers among attention layers
        _hf("Mamba2ForCausalLM", "Mamba2Config", "lm", "state space (SSD)", vocab_size=VOCAB, hidden_size=16,
            num_heads=4, head_dim=8, state_size=4, num_hidden_layers=2, expand=2, n_groups=1, conv_kernel=4,
            chunk_size=4, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        _hf("FalconMambaForCausalLM", "FalconMambaConfig", "lm", "state space, RMS-normed dt/B/C", vocab_size=VOCAB,
            hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4, bos_token_id=1,
            eos_token_id=2, pad_token_id=0),
        # four layers: two periods of (Mamba, attention), so that a layer comes again (a real Jamba has 32)
        _hf("JambaForCausalLM", "JambaConfig", "lm", "Mamba and attention layers, MoE",
            **{**LLAMA, "num_hidden_layers": 4}, attn_layer_period=2,
            attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2,
            mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False,
            experts_implementation="eager"),
        _hf("ZambaForCausalLM", "ZambaConfig", "lm", "Mamba layers and a shared attention block", **LLAMA,
            attention_hidden_size=32, attention_head_dim=16, n_mamba_heads=2, mamba_d_state=4, mamba_d_conv=4,
            mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False, layers_block_type=["hybrid", "hybrid"]),
        _hf("Zamba2ForCausalLM", "Zamba2Config", "lm", "Mamba2 layers and a shared attention block", **LLAMA,
            mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=4, chunk_size=4,
            use_mamba_kernels=False, layers_block_type=["mamba", "hybrid"], num_mem_blocks=1),
        _hf("BambaForCausalLM", "BambaConfig", "lm", "Mamba2 and attention layers", **LLAMA, attn_layer_indices=[1],
            **mamba2),
        _hf("FalconH1ForCausalLM", "FalconH1Config", "lm", "parallel Mamba2 and attention", **LLAMA, mamba_d_ssm=32,
            **mamba2),
        _hf("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", "lm", "Mamba2 and attention layers, MoE", **LLAMA,
            layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=16,
            residual_multiplier=0.5, experts_implementation="eager", **mamba2),
        _hf("NemotronHForCausalLM", "NemotronHConfig", "lm", "Mamba2, attention and MLP layers", vocab_size=VOCAB,
            hidden_size=16, layers_block_type=["mamba", "attention", "mlp"], num_attention_heads=2,
            num_key_value_heads=2, head_dim=8, intermediate_size=32, ssm_state_size=4, mamba_num_heads=4,
            mamba_head_dim=8, n_groups=1, conv_kernel=4, expand=2, chunk_size=4, max_position_embeddings=32,
            use_mamba_kernels=False, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        _hf("Lfm2ForCausalLM", "Lfm2Config", "lm", "short convolution and attention layers", **LLAMA,
            layer_types=["conv", "full_attention"]),
        _hf("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", "lm", "RG-LRU recurrence and local attention",
            **{k: v for k, v in LLAMA.items() if k != "max_position_embeddings"}, lru_width=16,
            attention_window_size=4, conv1d_width=4, block_types=["recurrent", "attention"]),
        _hf("Qwen3NextForCausalLM", "Qwen3NextConfig", "lm", "gated DeltaNet and gated attention layers, MoE",
            **LLAMA, head_dim=8, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=2, shared_expert_intermediate_size=16,
            layer_types=["linear_attention", "full_attention"], **moe),
        _hf("MiniMaxForCausalLM", "MiniMaxConfig", "lm", "lightning (linear) and softmax attention layers, MoE",
            **LLAMA, head_dim=8, num_local_experts=4, num_experts_per_tok=2, block_size=4,
            layer_types=["linear_attention", "full_attention"], experts_implementation="eager"),
        # use_cache=False: in eval mode RWKV otherwise writes its state in place, and autograd itself fails
        _hf("RwkvForCausalLM", "RwkvConfig", "lm", "RWKV time mixing", vocab_size=VOCAB, context_length=32,
            hidden_size=16, num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32, bos_token_id=1,
            eos_token_id=2, use_cache=False),
        # encoders
        _hf("ModernBertForSequenceClassification", "ModernBertConfig", "seq-cls", "global and local attention layers",
            **BERT, layer_types=["full_attention", "sliding_attention"], local_attention=4, cls_token_id=1,
            sep_token_id=2),
        _hf("EuroBertForSequenceClassification", "EuroBertConfig", "seq-cls", "Llama-style encoder", **BERT,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2),
        _hf("MegatronBertForSequenceClassification", "MegatronBertConfig", "seq-cls", "pre-LN", **BERT),
        _hf("RobertaPreLayerNormForSequenceClassification", "RobertaPreLayerNormConfig", "seq-cls", "pre-LN",
            **{**BERT, "pad_token_id": 1}),
        _hf("RoFormerForSequenceClassification", "RoFormerConfig", "seq-cls", "rotary, post-LN", **BERT,
            embedding_size=16),
        _hf("ConvBertForSequenceClassification", "ConvBertConfig", "seq-cls", "span-based dynamic convolution",
            **BERT, embedding_size=16, head_ratio=1, conv_kernel_size=3),
        _hf("DebertaForSequenceClassification", "DebertaConfig", "seq-cls", "disentangled relative attention (v1)",
            **BERT, relative_attention=True, max_relative_positions=16, pos_att_type=["p2c", "c2p"]),
        _hf("FunnelForSequenceClassification", "FunnelConfig", "seq-cls", "pooling between blocks", vocab_size=VOCAB,
            block_sizes=[1, 1], d_model=16, n_head=2, d_head=8, d_inner=32, num_decoder_layers=1, num_labels=LABELS,
            pad_token_id=0),
        _hf("SqueezeBertForSequenceClassification", "SqueezeBertConfig", "seq-cls", "grouped convolutions", **BERT,
            embedding_size=16, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2, intermediate_groups=2,
            output_groups=2),
        _hf("FNetForSequenceClassification", "FNetConfig", "seq-cls", "Fourier mixing", **BERT),
        _hf("NystromformerForSequenceClassification", "NystromformerConfig", "seq-cls", "Nystrom attention", **BERT,
            num_landmarks=7, segment_means_seq_len=SEQ),
        # encoder-decoder classifiers (the decoder reads the input; the last end-of-sequence token is classified)
        _hf("MBartForSequenceClassification", "MBartConfig", "seq-cls", "encoder-decoder classifier", **SEQ2SEQ,
            num_labels=LABELS, last_token=2),
        _hf("PLBartForSequenceClassification", "PLBartConfig", "seq-cls", "encoder-decoder classifier", **SEQ2SEQ,
            num_labels=LABELS, last_token=2),
        _hf("MvpForSequenceClassification", "MvpConfig", "seq-cls", "encoder-decoder classifier", **SEQ2SEQ,
            num_labels=LABELS, last_token=2),
        _hf("BigBirdPegasusForSequenceClassification", "BigBirdPegasusConfig", "seq-cls",
            "encoder-decoder classifier, full attention at this length", **SEQ2SEQ, attention_type="original_full",
            num_labels=LABELS, last_token=2),
        _hf("MT5ForSequenceClassification", "MT5Config", "seq-cls", "encoder-decoder classifier", **T5,
            num_labels=LABELS, last_token=1),
        _hf("UMT5ForSequenceClassification", "UMT5Config", "seq-cls", "encoder-decoder classifier, per-layer bias",
            **T5, num_labels=LABELS, last_token=1),
        # efficient CNNs and CNN-transformer hybrids
        _hf("EfficientNetForImageClassification", "EfficientNetConfig", "img-cls", "MBConv, SE", image_size=IMAGE,
            width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=IMAGE_LABELS),
        _hf("MobileNetV1ForImageClassification", "MobileNetV1Config", "img-cls", "depthwise separable",
            image_size=IMAGE, depth_multiplier=0.25, min_depth=4, num_labels=IMAGE_LABELS),
        _hf("MobileNetV2ForImageClassification", "MobileNetV2Config", "img-cls", "inverted residuals",
            image_size=IMAGE, depth_multiplier=0.25, min_depth=4, num_labels=IMAGE_LABELS),
        _hf("RegNetForImageClassification", "RegNetConfig", "img-cls", "grouped bottlenecks, SE", embedding_size=8,
            hidden_sizes=[8, 16], depths=[2, 2], groups_width=8, layer_type="y", num_labels=IMAGE_LABELS),
        _hf("BitForImageClassification", "BitConfig", "img-cls", "pre-activation, weight standardisation",
            embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2], layer_type="preactivation", num_groups=2,
            num_labels=IMAGE_LABELS),
        _hf("ConvNextV2ForImageClassification", "ConvNextV2Config", "img-cls", "global response norm",
            hidden_sizes=[8, 16], depths=[2, 2], num_stages=2, image_size=IMAGE, num_labels=IMAGE_LABELS),
        _hf("HGNetV2ForImageClassification", "HGNetV2Config", "img-cls", "HG blocks, learnable affine",
            embedding_size=8, depths=[1, 1], hidden_sizes=[16, 32], stem_channels=[3, 8, 8],
            stage_in_channels=[8, 16], stage_mid_channels=[8, 8], stage_out_channels=[16, 32], stage_num_blocks=[1, 2],
            stage_downsample=[False, True], stage_light_block=[False, True], stage_kernel_size=[3, 3],
            stage_numb_of_layers=[2, 2], use_learnable_affine_block=True, num_labels=IMAGE_LABELS),
        _hf("PoolFormerForImageClassification", "PoolFormerConfig", "img-cls", "MetaFormer, pooling mixer",
            hidden_sizes=[8, 16], depths=[2, 2], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1],
            num_encoder_blocks=2, num_labels=IMAGE_LABELS),
        _image(64, _hf("MobileViTV2ForImageClassification", "MobileViTV2Config", "img-cls",
                       "separable attention blocks", image_size=64, width_multiplier=0.25, n_attn_blocks=[1, 1, 1],
                       base_attn_unit_dims=[16, 16, 16], num_labels=IMAGE_LABELS)),
        _hf("CvtForImageClassification", "CvtConfig", "img-cls", "convolutional token embedding and projections",
            embed_dim=[8, 16], num_heads=[1, 2], depth=[1, 2], patch_sizes=[7, 3], patch_stride=[4, 2],
            patch_padding=[2, 1], mlp_ratio=[2.0, 2.0], attention_drop_rate=[0.0, 0.0], drop_rate=[0.0, 0.0],
            drop_path_rate=[0.0, 0.0], qkv_bias=[True, True], cls_token=[False, True],
            qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 3], padding_kv=[1, 1], stride_kv=[2, 2],
            padding_q=[1, 1], stride_q=[1, 1], num_labels=IMAGE_LABELS),
        _hf("LevitForImageClassification", "LevitConfig", "img-cls", "attention bias, BatchNorm", image_size=IMAGE,
            hidden_sizes=[16, 32], num_attention_heads=[2, 2], depths=[2, 2], key_dim=[8, 8], patch_size=16,
            down_ops=[["Subsample", 8, 2, 4, 2, 2]], num_labels=IMAGE_LABELS),
        _hf("SwiftFormerForImageClassification", "SwiftFormerConfig", "img-cls", "convolution, then additive attention",
            image_size=IMAGE, depths=[1, 2], embed_dims=[8, 16], downsamples=[True, True], num_labels=IMAGE_LABELS),
        _hf("SegformerForImageClassification", "SegformerConfig", "img-cls", "efficient attention, Mix-FFN",
            num_encoder_blocks=2, depths=[2, 2], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], num_labels=IMAGE_LABELS),
        _hf("PvtV2ForImageClassification", "PvtV2Config", "img-cls", "spatial-reduction attention, conv FFN",
            image_size=IMAGE, num_encoder_blocks=2, depths=[2, 2], sr_ratios=[2, 1], hidden_sizes=[8, 16],
            patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
            num_labels=IMAGE_LABELS),
        _hf("FocalNetForImageClassification", "FocalNetConfig", "img-cls", "focal modulation, layer scale",
            image_size=IMAGE, patch_size=4, embed_dim=8, hidden_sizes=[8, 16], depths=[2, 2], focal_levels=[2, 2],
            focal_windows=[3, 3], use_layerscale=True, num_labels=IMAGE_LABELS),
        _hf("Swinv2ForImageClassification", "Swinv2Config", "img-cls", "windows, continuous position bias MLP",
            image_size=IMAGE, patch_size=4, embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=4,
            num_labels=IMAGE_LABELS),
        _hf("Dinov2ForImageClassification", "Dinov2Config", "img-cls", "layer scale", hidden_size=16,
            num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, image_size=IMAGE, patch_size=8,
            num_labels=IMAGE_LABELS),
        _hf("HieraForImageClassification", "HieraConfig", "img-cls", "hierarchical ViT, mask-unit attention",
            embed_dim=8, image_size=[IMAGE, IMAGE], patch_size=[3, 3], patch_stride=[2, 2], patch_padding=[1, 1],
            depths=[1, 2], num_heads=[1, 2], query_stride=[2, 2], masked_unit_size=[4, 4],
            masked_unit_attention=[True, False], num_query_pool=1, num_labels=IMAGE_LABELS),
    ]


def _image(size: int, case: Case) -> Case:
    """``case`` on size x size images (a model whose last stage would be smaller than its kernels at 32x32)."""
    case.image = size
    return case


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
        if case.last_token is not None:  # BART's and T5's classifiers read the hidden state at the end token
            x[:, -1] = case.last_token
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

    made: dict[int, nn.Module] = {}

    def highway(k: int) -> Callable:
        def setup():
            m = copy.deepcopy(pristine)
            stack = made[k] = models.residual_stack(m, example=(x, y))
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
    elif 1000 in made:  # the structure the engine ran: another where the first found failed its self-check
        row["found"] = getattr(made[1000], "found", row["found"])
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
