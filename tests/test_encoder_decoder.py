"""transformers' encoder-decoder models (BART, T5, Marian) as transformers trains them, tiny random configurations
in float64: the inputs go to the encoder, the targets shifted by the model's own shift to the decoder (teacher
forcing), the output at position t predicts target t; the ``reverse`` task (one vocabulary) from the command line."""

import pytest
import torch
from helpers import autograd_grads, engine_grads, relative

from gradengines import models, tasks, trainers
from gradengines.tasks.base import sequence_cross_entropy

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

V, T, B = 13, 6, 3


def t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=V, d_model=8, d_kv=4, d_ff=16, num_layers=2, num_decoder_layers=2, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0))


def bart():
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=V, d_model=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0))


def marian():
    return transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=V, d_model=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=V - 1, decoder_start_token_id=V - 1))


BUILD = {"t5": t5, "bart": bart, "marian": marian}


@pytest.fixture
def fresh_notes():
    """What a structure's note says is said once per command: forget what other tests' runs said."""
    from gradengines.trainers.run.records import forget_notes

    forget_notes()


def found(model):
    """A batch for ``model`` (float64, eval), autograd's gradients of transformers' own loss, the stack found."""
    model = model.double().eval()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, V - 1, (B, T), generator=gen), torch.randint(0, V - 1, (B, T), generator=gen)
    exact = autograd_grads(model, sequence_cross_entropy(model(input_ids=x, labels=y).logits, y))
    return x, y, exact, models.residual_stack(model, example=(x, y))


def case(name):
    torch.manual_seed(0)
    model = BUILD[name]().double().eval()
    gen = torch.Generator().manual_seed(1)
    return model, torch.randint(0, V - 1, (B, T), generator=gen), torch.randint(0, V - 1, (B, T), generator=gen)


@pytest.mark.parametrize("name", sorted(BUILD))
def test_the_decoder_reads_the_targets_as_transformers_shifts_them(name):
    model, x, y = case(name)
    with torch.no_grad():
        theirs = model(input_ids=x, labels=y).logits  # transformers' own teacher forcing
        ours = models.call_model(model, x, y).outputs
    assert ours.shape == (B, T, V) and torch.equal(ours, theirs)


@pytest.mark.parametrize("name", sorted(BUILD))
def test_backprop_is_autograd_of_the_next_token_loss_of_transformers_own_call(name):
    model, x, y = case(name)
    exact = autograd_grads(model, sequence_cross_entropy(model(input_ids=x, labels=y).logits, y))
    assert relative(engine_grads(model, trainers.build_engine("backprop"), x, y, sequence_cross_entropy),
                    exact) < 1e-12


@pytest.mark.parametrize("name", ["bart", "marian"])
def test_highway_at_full_k_is_autograd_with_the_encoder_as_a_side_input(name):
    model, x, y = case(name)
    exact = autograd_grads(model, sequence_cross_entropy(model(input_ids=x, labels=y).logits, y))
    stack = models.residual_stack(model, example=(x, y))
    assert stack.found.endswith("1 side input (encoder_hidden_states) read by every block")
    assert f"EncoderLayer in model.encoder.layers) as 2 residual sublayers: 2 LayerNorm(h + z), whose output feeds " \
           f"2 blocks ({type(model).__name__.removesuffix('ForConditionalGeneration').removesuffix('MTModel')}" \
           f"DecoderLayer" in stack.found
    got = engine_grads(stack, trainers.build_engine("highway", k=100), x, y, sequence_cross_entropy,
                       strip="model.")
    assert relative(got, exact) < 1e-10


def test_an_encoder_decoder_without_token_targets_is_refused_in_one_line():
    model, x, _ = case("bart")
    with pytest.raises(models.ModelConfigError, match=r"BartForConditionalGeneration is an encoder-decoder model: "
                                                      r"its decoder reads the target tokens \(B, T\), got \(3,\)"):
        models.call_model(model, x, torch.zeros(B, dtype=torch.int64))


def test_the_reverse_task_has_one_vocabulary_and_reversed_targets():
    task = tasks.build("reverse", n_symbols=5, length=4, n_train=10, n_val=2, n_test=2)
    assert torch.equal(task.train.targets, task.train.inputs.flip(1))
    assert int(task.train.inputs.max()) < 5 and task.num_outputs == 5 and tuple(task.expected_output_shape) == (4, 5)


def test_bart_trains_on_the_reverse_task_from_the_command_line_with_highway(tmp_path, capsys):
    from gradengines.trainers.cli import train_main
    from gradengines.trainers.run.records import forget_notes

    forget_notes()  # a note is said once per process: another test on this worker may have said this one (a command
    # line forgets them as it starts: run_cli)

    sizes = ["d_model=8", "encoder_layers=2", "decoder_layers=2", "encoder_attention_heads=2",
             "decoder_attention_heads=2", "encoder_ffn_dim=16", "decoder_ffn_dim=16"]
    code = train_main(["--model", "transformers:BartForConditionalGeneration",
                       *[flag for size in sizes for flag in ("--model-option", size)], "--task", "reverse",
                       "--task-option", "n_train=64", "--trainer", "highway", "--highway-k", "1", "--steps", "2",
                       "--logdir", str(tmp_path), "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 0 and "1 side input (encoder_hidden_states) read by every block" in err


def test_t5_with_three_layers_is_exact_at_full_k_its_first_block_with_the_stem():
    """T5's first block computes the relative position bias and returns it to the others: it joins the stem."""
    torch.manual_seed(0)
    x, y, exact, stack = found(transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=V, d_model=8, d_kv=4, d_ff=16, num_layers=3, num_decoder_layers=3, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0)))
    assert stack.found.startswith("2 blocks (T5Block in encoder.block)")
    assert ", whose output feeds 2 blocks (T5Block in decoder.block)" in stack.found
    assert "decoder.block.0, which computes" in stack.found
    got = engine_grads(stack, trainers.build_engine("highway", k=100), x, y, sequence_cross_entropy,
                       strip="model.")
    assert relative(got, exact) < 1e-6  # T5's RMSNorm computes its variance in float32: ~1e-8 (the check's floor)
    k0 = engine_grads(stack, trainers.build_engine("highway", k=0), x, y, sequence_cross_entropy, strip="model.")
    assert relative(k0["decoder.block.1.layer.0.SelfAttention.q.weight"],
                    exact["decoder.block.1.layer.0.SelfAttention.q.weight"]) > 1e-4


CLI = {  # the architectures that ended in a traceback, by name from the command line, tiny sizes
    "OPTForCausalLM": ("reverse", ["hidden_size=8", "num_hidden_layers=2", "ffn_dim=16", "num_attention_heads=2",
                                   "word_embed_proj_dim=8"]),
    "DebertaV2ForTokenClassification": ("copy", ["hidden_size=8", "num_hidden_layers=2", "num_attention_heads=2",
                                                 "intermediate_size=16", "relative_attention=True",
                                                 "max_relative_positions=8"]),
    "T5ForConditionalGeneration": ("reverse", ["d_model=8", "d_kv=4", "d_ff=16", "num_layers=3",
                                               "num_decoder_layers=3", "num_heads=2"]),
    "BeitForImageClassification": ("digits", ["hidden_size=8", "num_hidden_layers=2", "num_attention_heads=2",
                                              "intermediate_size=16", "patch_size=2",
                                              "use_shared_relative_position_bias=True", "layer_scale_init_value=0.5"]),
}


@pytest.mark.parametrize("trainer", ["highway", "fa", "dfa"])
@pytest.mark.parametrize("name", sorted(CLI))
def test_the_command_line_trains_them_without_a_traceback(name, trainer, tmp_path, capsys, fresh_notes):
    from gradengines.trainers.cli import train_main

    task, sizes = CLI[name]
    data = ["--task-option", "flatten=False"] if task == "digits" else [
        "--task-option", "n_train=32", "--task-option", "n_val=8", "--task-option", "n_test=8"]
    code = train_main(["--model", f"transformers:{name}", *[f for size in sizes for f in ("--model-option", size)],
                       "--task", task, *data, "--trainer", trainer, "--steps", "1", "--eval-batches", "1", "--logdir",
                       str(tmp_path), "--progress", "false"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err
    said = {"highway": "note: highway: found ", "fa": "note: fa: the backward of ",
            "dfa": "note: dfa: the backward of "}
    assert said[trainer] in err  # what was found or covered, in one line


@pytest.mark.parametrize("trainer", ["highway", "fa", "dfa"])
def test_transformers_swin_trains_with_fa_and_dfa_and_highway_across_its_stages(trainer, tmp_path, capsys, fresh_notes):
    from gradengines.trainers.cli import train_main

    sizes = ["embed_dim=8", "depths=(1,1)", "num_heads=(2,2)", "patch_size=2", "window_size=2"]
    code = train_main(["--model", "transformers:SwinForImageClassification",
                       *[f for size in sizes for f in ("--model-option", size)], "--task", "digits", "--task-option",
                       "flatten=False", "--trainer", trainer, "--steps", "1", "--eval-batches", "1", "--logdir",
                       str(tmp_path), "--progress", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 0 and not any("Traceback" in line for line in err)
    if trainer == "highway":  # its stages read what the stage before returned: the layers, across the stages
        assert any(line.startswith("note: highway: found 2 blocks (SwinLayer in swin.encoder.layers.0.blocks, "
                                   "swin.encoder.layers.1.blocks)") and "between 2 stages" in line for line in err), err
    else:
        assert any(line.startswith(f"note: {trainer}: the backward of 15 layers") for line in err)


def test_both_chains_run_highway_bp_the_encoder_approximated_where_its_depth_exceeds_k():
    """Encoder of 3 layers, decoder of 1: at k = 1 the decoder is exact (k >= its depth), so the error reaching the
    encoder's output is exact, and the encoder's first layer is still approximate: Highway-BP runs on the encoder
    too (with the encoder backpropagated exactly, as a side input's producer alone, it would be exact). k = 3: all
    exact."""
    torch.manual_seed(0)
    x, y, exact, stack = found(transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=V, d_model=8, encoder_layers=3, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)))
    assert stack.found.startswith("3 blocks (BartEncoderLayer in model.encoder.layers)")
    k1 = engine_grads(stack, trainers.build_engine("highway", k=1), x, y, sequence_cross_entropy, strip="model.")
    decoder = [n for n in exact if n.startswith("model.decoder.layers.")]
    assert relative({n: k1[n] for n in decoder}, {n: exact[n] for n in decoder}) < 1e-10
    first = "model.encoder.layers.0.fc1.weight"
    assert relative(k1[first], exact[first]) > 1e-4
    k3 = engine_grads(stack, trainers.build_engine("highway", k=3), x, y, sequence_cross_entropy, strip="model.")
    assert relative(k3, exact) < 1e-10


def test_ptb_reverse_is_real_text_to_be_written_backwards_and_bart_trains_on_it(tmp_path, capsys):
    from helpers import write_tiny_ptb

    from gradengines.trainers.cli import train_main

    data = write_tiny_ptb(tmp_path)
    task = tasks.build("ptb-reverse", data_dir=data, seq_len=5)
    assert torch.equal(task.train.targets, task.train.inputs.flip(1)) and task.metric_name == "accuracy"
    assert task.num_outputs == len(task.vocab) and int(task.train.inputs.max()) < len(task.vocab)
    sizes = ["d_model=8", "encoder_layers=2", "decoder_layers=2", "encoder_attention_heads=2",
             "decoder_attention_heads=2", "encoder_ffn_dim=16", "decoder_ffn_dim=16"]
    code = train_main(["--model", "transformers:BartForConditionalGeneration",
                       *[flag for size in sizes for flag in ("--model-option", size)], "--task", "ptb-reverse",
                       "--data-dir", str(data), "--task-option", "seq_len=5", "--trainer", "highway", "--steps", "2",
                       "--logdir", str(tmp_path / "runs"), "--progress", "false"])
    err = capsys.readouterr().err  # what was found is said once per process: another test may have said it
    assert code == 0 and "Traceback" not in err and list((tmp_path / "runs").rglob("result.json"))


def classifier(family):
    """BART's and T5's sequence-classification heads, tiny, 3 classes: they make their decoder inputs from their
    own input ids; fine-tuning them on class labels is routine (GLUE)."""
    if family == "bart":
        config = transformers.BartConfig(
            vocab_size=V, d_model=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, classifier_dropout=0.0, num_labels=3)
        return transformers.BartForSequenceClassification(config).double()
    config = transformers.T5Config(vocab_size=V, d_model=8, d_kv=4, d_ff=16, num_layers=2, num_decoder_layers=2,
                                   num_heads=2, dropout_rate=0.0, classifier_dropout=0.0, decoder_start_token_id=0,
                                   pad_token_id=0, eos_token_id=1, num_labels=3)
    return transformers.T5ForSequenceClassification(config).double()


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_an_encoder_decoder_classifier_trains_on_class_labels_exact_where_exact(family):
    """Backprop refused these models (their targets are class ids, not tokens) though autograd trains them: now
    backprop is autograd of transformers' own call, FA and DFA run, Highway-BP at full k is exact; the LM head of
    the family still refuses class ids (above)."""
    torch.manual_seed(0)
    model = classifier(family)
    x = torch.randint(3, V, (B, T))
    x[:, -1] = 2 if family == "bart" else 1  # BART classifies at its eos token, T5 reads the last one
    y = torch.tensor([0, 2, 1])
    exact = autograd_grads(model, torch.nn.functional.cross_entropy(model(input_ids=x).logits, y))
    loss = torch.nn.functional.cross_entropy
    assert relative(engine_grads(model, trainers.build_engine("backprop"), x, y, loss), exact) < 1e-12
    for engine in ("fa", "dfa"):
        grads = engine_grads(model, trainers.build_engine(engine), x, y, loss)
        assert all(torch.isfinite(g).all() for g in grads.values())
    stack = models.residual_stack(model, example=(x[:2], y[:2]))
    got = engine_grads(stack, trainers.build_engine("highway", k=16), x, y, loss, strip="model.")
    assert relative(got, exact) < 1e-10


def _head(family: str, head: str):
    """A tiny float64 classification (3 classes) or question-answering (start/end) head of an encoder-decoder
    family: BART-like families share BART's config fields, T5-like ones T5's."""
    labels = 3 if head == "ForSequenceClassification" else 2
    cls, config_class = getattr(transformers, family + head), getattr(transformers, family + "Config")
    if family in ("T5", "MT5", "UMT5"):
        config = config_class(vocab_size=V, d_model=8, d_kv=4, d_ff=16, num_layers=2, num_decoder_layers=2,
                              num_heads=2, dropout_rate=0.0, classifier_dropout=0.0, decoder_start_token_id=0,
                              pad_token_id=0, eos_token_id=1, num_labels=labels)
    else:
        config = config_class(vocab_size=V, d_model=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
                              max_position_embeddings=16, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                              classifier_dropout=0.0, num_labels=labels)
    return cls(config).double()


@pytest.mark.parametrize("family, head", [
    *((f, "ForSequenceClassification") for f in ("MBart", "PLBart", "Mvp", "MT5", "UMT5")),
    *((f, "ForQuestionAnswering") for f in ("Bart", "MBart", "T5", "UMT5"))])
def test_every_encoder_decoder_label_head_trains_under_backprop_and_each_engine_is_exact_or_refused(family, head):
    """Item 2 of "exact or refused": the classification and question-answering heads of encoder-decoder families
    make their own decoder inputs; given one label per example (a class; a start position, the head's output
    declared as start_logits) backprop is autograd of transformers' own call, never refused; FA and DFA give finite
    gradients or one line; Highway-BP at full k equals autograd or is refused in one line."""
    torch.manual_seed(0)
    model = _head(family, head)
    if head == "ForQuestionAnswering":
        models.declare_call(model, output="start_logits")
    x = torch.randint(3, V, (B, T))
    x[:, -1] = model.config.eos_token_id
    y = torch.tensor([0, 2, 1])
    out = model(input_ids=x)
    logits = out.start_logits if head == "ForQuestionAnswering" else out.logits
    exact = autograd_grads(model, torch.nn.functional.cross_entropy(logits, y))
    loss = torch.nn.functional.cross_entropy
    assert relative(engine_grads(model, trainers.build_engine("backprop"), x, y, loss), exact) < 1e-12
    for name in ("fa", "dfa", "highway"):
        try:
            if name == "highway":
                stack = models.residual_stack(model, example=(x[:2], y[:2]))
                grads = engine_grads(stack, trainers.build_engine(name, k=16), x, y, loss, strip="model.")
                # T5-like norms take their variance in float32 even in a float64 model: rounding of 1e-8 there
                assert relative(grads, exact) < (1e-7 if "T5" in family else 1e-10)
            else:
                grads = engine_grads(model, trainers.build_engine(name), x, y, loss)
        except models.ModelConfigError as err:  # the engines' refusals (IncompatibleModelError among them)
            assert "\n" not in str(err), name
            continue
        assert all(torch.isfinite(g).all() for g in grads.values()), name
