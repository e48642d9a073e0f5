"""Hugging Face transformers' models as researchers train them, on tiny random configurations (no
download): GPT-2 and Llama causal LMs, BERT for sequence and token classification. Float64 where an
identity is claimed. Skipped where transformers is not installed (CI installs it: requirements.txt)."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative, write_tiny_ptb
from torch import nn

from gradengines import models, trainers
from gradengines.tasks.base import cross_entropy_loss, sequence_cross_entropy

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()  # tiny configs: token ids outside the tiny vocabulary, etc.

V, T, B = 23, 7, 3


def gpt2(vocab=V, **overrides):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=16, n_embd=8, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **overrides)
    return transformers.GPT2LMHeadModel(config).double()


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(config).double()


def bert(head="BertForSequenceClassification"):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=V, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=16, num_labels=4,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return getattr(transformers, head)(config).double()


CAUSAL = {"gpt2": gpt2, "llama": llama}


def lm_batch(batch=B, steps=T, seed=1):
    """Tokens and the next tokens, as the language tasks give them (targets already shifted)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (batch, steps + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


# ---- item 1: no silent wrong target ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_backprop_on_a_causal_lm_is_autograd_of_the_next_token_loss(name):
    model = CAUSAL[name]()
    x, y = lm_batch()
    exact = autograd_grads(model, sequence_cross_entropy(model(x).logits, y))
    got = engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
    assert relative(got, exact) < 1e-12


@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_the_default_call_passes_no_labels(name):
    model = CAUSAL[name]()
    assert models.adapters.calling.describe(model) == "model(inputs)"
    x, y = lm_batch()
    assert models.call_model(model, x, y).loss is None


@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_the_models_own_loss_on_shifted_labels_is_refused_in_one_line(name):
    model = models.declare_call(CAUSAL[name](), loss="model")  # labels=targets: shifted again inside
    x, y = lm_batch()
    with torch.no_grad():
        own = model(x, labels=y).loss
        task = sequence_cross_entropy(model(x).logits, y)
    assert abs(float(own - task)) / float(task) < 0.05  # close in value: only the gradient shows how far
    with pytest.raises(models.ModelConfigError) as info:
        trainers.build_engine("backprop").compute_grads(model, x, y, sequence_cross_entropy)
    message = str(info.value)
    assert "\n" not in message and "shifts `labels` itself" in message and "targets=labels+shift_labels" in message


@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_the_models_own_loss_with_shift_labels_trains_as_the_task_loss(name):
    model = CAUSAL[name]()
    x, y = lm_batch()
    exact = autograd_grads(model, sequence_cross_entropy(model(x).logits, y))
    models.declare_call(model, loss="model", targets="labels+shift_labels")
    got = engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
    assert relative(got, exact) < 1e-6  # float32 loss


def test_the_trainer_refuses_the_double_shift_before_training(tmp_path):
    from gradengines import tasks

    task = tasks.build("ptb-word", data_dir=write_tiny_ptb(tmp_path), seq_len=T)
    model = models.declare_call(gpt2(vocab=len(task.vocab)).float(), loss="model")
    with pytest.raises(trainers.ConfigError, match="targets=labels\\+shift_labels") as info:
        trainers.Trainer(model, trainers.build_engine("backprop"), task)
    assert "\n" not in str(info.value)
    models.declare_call(model, loss="model", targets="labels+shift_labels")
    trainers.Trainer(model, trainers.build_engine("backprop"), task)  # accepted


def mixtral(eager=True):
    """A mixture-of-experts causal LM whose own loss adds its router's load-balancing term (issue 42)."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=V, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                        num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.5,
                                        max_position_embeddings=16, experts_implementation="eager")
    return transformers.MixtralForCausalLM(config).double()  # eager experts: grouped_mm has no float64


def test_a_mixture_of_experts_trains_on_its_own_loss_router_term_included():
    model = mixtral()
    x, y = lm_batch()
    out = model(x, labels=y.contiguous(), shift_labels=y.contiguous())
    task = autograd_grads(model, sequence_cross_entropy(model(x).logits, y))
    exact = autograd_grads(model, out.loss)
    assert out.aux_loss > 0 and relative(exact, task) > 1e-3  # the router's term: a contrast
    models.declare_call(model, loss="model", targets="labels+shift_labels")
    assert relative(engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy), exact) < 1e-12
    assert models.adapters.calling.own_loss_difference(model).startswith(
        f"the model's own loss is {float(out.loss):.6g} where the task's loss of its outputs is "
        f"{float(sequence_cross_entropy(out.logits, y)):.6g}")
    shifted_twice = models.declare_call(mixtral(), loss="model")  # labels=targets: the double shift, router and all
    with pytest.raises(models.ModelConfigError, match="the task's loss against targets shifted once more"):
        engine_grads(shifted_twice, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)


def test_a_mixture_of_experts_by_name_trains_on_its_own_loss_from_the_command_line(tmp_path, capsys):
    moe = ["--model", "transformers:MixtralForCausalLM", "--task", "ptb-word", "--data-dir",
           str(write_tiny_ptb(tmp_path)), "--task-option", f"seq_len={T}",
           "--model-option", "output_router_logits=True",
           *(w for o in ("hidden_size=8", "intermediate_size=16", "num_hidden_layers=1", "num_attention_heads=2",
                         "num_key_value_heads=1", "num_local_experts=4", "num_experts_per_tok=2")
             for w in ("--model-option", o))]
    own = ["--model-call", "loss=model", "--model-call", "targets=labels+shift_labels"]
    assert cli(*moe, *own, tmp_path=tmp_path) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: loss=model")]
    assert len(notes) == 1 and "--model-call loss=own declares that it differs" in notes[0]
    assert cli(*moe, "--model-call", "loss=own", *own[2:], "--run-name", "own", tmp_path=tmp_path) == 0
    assert "note: loss=model" not in capsys.readouterr().err
    assert cli(*moe, "--model-call", "loss=model", "--run-name", "twice", tmp_path=tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: model call: loss=model, but the model's own loss")
    assert "shifted once more" in err[-1]


def test_bert_for_sequence_classification_own_loss_is_the_tasks():
    model = bert()
    x = lm_batch()[0]
    y = torch.tensor([0, 3, 1])
    exact = autograd_grads(model, cross_entropy_loss(model(x).logits, y))
    models.declare_call(model, loss="model")  # labels=targets: a classifier does not shift them
    assert relative(engine_grads(model, trainers.build_engine("backprop"), x, y, cross_entropy_loss), exact) < 1e-6


# ---- item 4: an architecture by name, sized to the task ---------------------------------------------

def test_an_architecture_by_name_is_built_from_its_config_and_sized_to_the_task():
    model = models.build("transformers:BertForTokenClassification", input_vocab=10, out_features=9,
                         input_shape=[70], num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
                         intermediate_size=16)
    assert isinstance(model, transformers.BertForTokenClassification)
    assert (model.config.vocab_size, model.config.num_labels, model.config.num_hidden_layers) == (10, 9, 1)
    lm = models.build("transformers:GPT2LMHeadModel", input_vocab=9, out_features=9, input_shape=[2048],
                      n_layer=1, n_embd=8, n_head=2)
    assert (lm.config.vocab_size, lm.config.n_positions) == (9, 2048)  # the sequence fits the position table


@pytest.mark.parametrize("name, options, expected", [
    ("transformers:GPT2LMHeadModel", {"n_layers": 2}, "GPT2Config has no field n_layers; its fields:"),
    ("transformers:GPT2LMHeadModel", {"input_vocab": 10, "out_features": 9},
     "outputs are its vocabulary, but the task's inputs have 10 ids and its outputs 9 classes"),
    ("transformers:GPT2LMHeadModel", {"n_embd": 9, "n_head": 2}, "could not be built"),
])
def test_a_bad_architecture_option_is_one_line(name, options, expected):
    with pytest.raises(models.ModelConfigError, match=expected) as info:
        models.build(name, **options)
    assert "\n" not in str(info.value)


def cli(*args, tmp_path):
    from gradengines.trainers.cli import train_main

    return train_main([*args, "--steps", "3", "--progress", "false", "--logdir", str(tmp_path / "runs"),
                       "--experiment", "e", "--eval-batches", "1"])


def test_a_causal_lm_by_name_trains_from_the_command_line_and_its_double_shift_is_refused(tmp_path, capsys):
    gpt = ["--model", "transformers:GPT2LMHeadModel", "--model-option", "n_layer=1", "--model-option", "n_embd=8",
           "--model-option", "n_head=2", "--task", "ptb-word", "--data-dir", str(write_tiny_ptb(tmp_path)),
           "--task-option", f"seq_len={T}"]
    assert cli(*gpt, tmp_path=tmp_path) == 0
    assert cli(*gpt, "--model-call", "loss=model", "--run-name", "own", tmp_path=tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "targets=labels+shift_labels" in err[-1] and "shifts `labels` itself" in err[-1]
    assert cli(*gpt, "--model-call", "loss=model", "--model-call", "targets=labels+shift_labels", "--run-name",
               "shifted", tmp_path=tmp_path) == 0


def test_a_token_classifier_by_name_trains_on_the_copy_task(tmp_path):
    assert cli("--model", "transformers:BertForTokenClassification", "--model-option", "num_hidden_layers=1",
               "--model-option", "hidden_size=8", "--model-option", "num_attention_heads=2",
               "--model-option", "intermediate_size=16", "--task", "copy", "--task-option", "n_train=32",
               "--task-option", "delay=3", tmp_path=tmp_path) == 0


# ---- items 2-3: the residual structure found, Highway-BP exact at k >= L --------------------------------

def classify(batch=B, steps=T, seed=1):
    x = lm_batch(batch, steps, seed)[0]
    x[0, -2:] = 0
    return x, torch.arange(batch) % 4


def token_labels(batch=B, steps=T, seed=1):
    x, y = lm_batch(batch, steps, seed)
    return x, y % 4


MODELS = {  # builder, batch maker, loss, what is found, L (residual sublayers)
    "gpt2": (gpt2, lm_batch, sequence_cross_entropy, "2 blocks (GPT2Block in transformer.h) as 4 residual "
             "sublayers: 4 h + z", 4),
    "llama": (llama, lm_batch, sequence_cross_entropy, "2 blocks (LlamaDecoderLayer in model.layers) as 4 "
              "residual sublayers: 4 h + z", 4),
    "bert": (bert, classify, cross_entropy_loss, "2 blocks (BertLayer in bert.encoder.layer) as 4 residual "
             "sublayers: 4 LayerNorm(h + z)", 4),
    "bert-tokens": (lambda: bert("BertForTokenClassification"), token_labels, sequence_cross_entropy,
                    "2 blocks (BertLayer in bert.encoder.layer) as 4 residual sublayers: 4 LayerNorm(h + z)", 4),
}
# LlamaRMSNorm computes in float32 whatever the input's dtype: float64 agreement is to its rounding
TOLERANCE = {"llama": 1e-6}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_highway_on_the_structure_found_is_backprop_at_full_k_and_not_at_k0(name):
    build, make, loss_fn, found, L = MODELS[name]
    model = build().eval()
    x, y = make()
    exact = autograd_grads(model, loss_fn(model(x).logits, y))
    assert relative(engine_grads(model, trainers.build_engine("backprop"), x, y, loss_fn), exact) < 1e-12
    stack = models.residual_stack(model, example=x)
    assert stack.found == found
    full = engine_grads(stack, trainers.build_engine("highway", k=L), x, y, loss_fn, strip="model.")
    assert relative(full, exact) < TOLERANCE.get(name, 1e-12)
    k0 = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, loss_fn, strip="model.")
    assert relative(k0, exact) > 1e-3


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_masks_and_rotary_tables_are_rebuilt_for_another_batch_size_and_length(name):
    build, make, loss_fn, _, L = MODELS[name]
    model = build().eval()
    stack = models.residual_stack(model, example=make()[0])  # found on (3, 7)
    x, y = make(batch=2, steps=T + 3, seed=4)
    exact = autograd_grads(model, loss_fn(model(x).logits, y))
    got = engine_grads(stack, trainers.build_engine("highway", k=L), x, y, loss_fn, strip="model.")
    assert relative(got, exact) < TOLERANCE.get(name, 1e-12)


def test_the_found_gpt2_stack_is_the_hand_declared_one():
    model = gpt2().eval()
    x, y = lm_batch()
    t = model.transformer

    class Attention(nn.Module):  # the 7 lines users needed: GPT-2's attention returns a tuple
        def __init__(self, attn):
            super().__init__()
            self.attn = attn

        def forward(self, h):
            return self.attn(h)[0]

    hand = models.residual_stack(
        model, stem=lambda idx: t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))),
        blocks=[pair for b in t.h for pair in ((b.ln_1, Attention(b.attn)), (b.ln_2, b.mlp))],
        head=lambda h: model.lm_head(t.ln_f(h)), example=x)
    found = models.residual_stack(model, example=x)
    for k in (0, 1, 2):
        engine = trainers.build_engine("highway", k=k)
        assert relative(engine_grads(found, engine, x, y, sequence_cross_entropy),
                        engine_grads(hand, engine, x, y, sequence_cross_entropy)) < 1e-12


def test_highway_finds_the_stack_from_the_command_line_and_says_so(tmp_path, capsys):
    gpt = ["--model", "transformers:GPT2LMHeadModel", "--model-option", "n_layer=2", "--model-option", "n_embd=8",
           "--model-option", "n_head=2", "--task", "ptb-word", "--data-dir", str(write_tiny_ptb(tmp_path)),
           "--task-option", f"seq_len={T}", "--trainer", "highway", "--highway-k", "1"]
    assert cli(*gpt, tmp_path=tmp_path) == 0
    assert "note: highway: found 2 blocks (GPT2Block in transformer.h) as 4 residual sublayers: 4 h + z" \
        in capsys.readouterr().err


# ---- item 6: FA and DFA on the model as it is -------------------------------------------------------

def test_fa_on_gpt2_covers_its_conv1d_layers_and_with_b_equal_w_is_backprop():
    from gradengines.trainers.engines.feedback_layers import covered_layers

    model = gpt2().eval()
    x, y = lm_batch()
    exact = engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy)
    covered = covered_layers(model)
    assert [type(m).__name__ for _, m in covered].count("Conv1D") == 8 and len(covered) == 9  # + the tied head
    engine = trainers.build_engine("fa")
    drawn = engine_grads(model, engine, x, y, sequence_cross_entropy)
    for name, _ in covered[:-1]:
        assert relative(drawn[f"{name}.weight"], exact[f"{name}.weight"]) > 1e-3, name
    for name, module in covered:
        engine.layers.feedback[name] = module.weight.detach().clone()
    assert relative(engine_grads(model, engine, x, y, sequence_cross_entropy), exact) < 1e-12
    dfa = engine_grads(model, trainers.build_engine("dfa"), x, y, sequence_cross_entropy)
    assert relative(dfa, exact) > 1e-3 and all(torch.isfinite(g).all() for g in dfa.values())


@pytest.mark.parametrize("engine", ["fa", "dfa"])
def test_longformer_which_writes_into_its_query_projection_passes_the_layer_paths_self_check(engine):
    """transformers' Longformer scales its query projection in place through a view: the layer path's first-batch
    self-check (each local backward with the forward weight as feedback equals autograd's) passes, so FA and DFA
    train it (they refused it: "Output 0 of _LocalBackward is a view and is being modified inplace")."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LongformerConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           intermediate_size=32, max_position_embeddings=64, num_labels=3,
                                           attention_window=4, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0)
    model = transformers.LongformerForSequenceClassification(config).double()
    x, y = torch.randint(1, 20, (2, 8), generator=torch.Generator().manual_seed(1)), torch.tensor([0, 2])
    built = trainers.build_engine(engine)
    built.prepare(model, x, y, cross_entropy_loss)
    got = engine_grads(model, built, x, y)
    exact = engine_grads(model, trainers.build_engine("backprop"), x, y)
    assert all(torch.isfinite(g).all() for g in got.values()) and relative(got, exact) > 1e-3  # not backprop


def test_a_hybrid_of_mamba_and_attention_layers_is_one_residual_chain_exact_at_k_of_its_depth():
    """transformers' Jamba alternates Mamba and attention decoder layers (two classes, each twice, in model.layers):
    discovery finds them as one chain, and Highway-BP at k >= L is backprop, at k = 0 not (float64; Mamba's
    reference scan runs partly in float32, hence 1e-6)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.JambaConfig(
        vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, num_experts=1, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, mamba_d_state=4, mamba_d_conv=2, mamba_expand=2, mamba_dt_rank=4,
        use_mamba_kernels=False)
    model = transformers.JambaForCausalLM(config).double()
    ids = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(ids, -1, 1)
    stack = models.residual_stack(model, example=(ids, targets))
    assert stack.found.startswith("4 blocks (JambaMambaDecoderLayer, JambaAttentionDecoderLayer in model.layers)")
    exact = engine_grads(stack, trainers.build_engine("backprop"), ids, targets, sequence_cross_entropy)
    depth = len(stack.blocks)
    got = engine_grads(stack, trainers.build_engine("highway", k=depth), ids, targets, sequence_cross_entropy)
    assert relative(got, exact) < 1e-6
    assert relative(engine_grads(stack, trainers.build_engine("highway", k=0), ids, targets,
                                 sequence_cross_entropy), exact) > 1e-3


def test_a_causal_lm_s_own_loss_refused_is_one_line_without_transformers_own_warning(tmp_path):
    """transformers printed "loss_type=None ... unrecognized" before the refusal of loss=model on a causal LM (it
    shifts the labels once more); the first calls of the model hold its warnings back (a real process: pytest's log
    capture would hide it in this one)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "train.py"
    flags = ["--model", "transformers:GPT2LMHeadModel", "--model-option", "n_layer=1", "--model-option", "n_embd=16",
             "--model-option", "n_head=2", "--task", "reverse", "--model-call", "loss=model", "--steps", "1",
             "--progress", "false", "--logdir", str(tmp_path)]
    done = subprocess.run([sys.executable, str(script), *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the model's own loss" in done.stderr and "shifted once more" in done.stderr
