"""The engines inside the Hugging Face Trainer (issue 49, ``trainers/loops/hf.py``): with backprop the engine's
Trainer ends where the stock ``transformers.Trainer`` ends (float64, gradient accumulation, clipping, AdamW and its
schedule), Highway-BP at k >= 2L too and at k = 0 not; the engine's scalars reach the log history; the engine's state
survives ``resume_from_checkpoint``; a model whose own loss is not its loss_function's is refused in one line."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from gradengines.trainers.core.errors import ConfigError  # noqa: E402
from gradengines.trainers.loops.hf import ENGINE_FILE, EngineTrainer  # noqa: E402

VOCAB, LENGTH, LAYERS = 17, 8, 2


def tiny_gpt2(seed=0):
    """A 2-layer GPT-2 without dropout (two engines, one function), float64."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=LAYERS, n_embd=8, n_head=2, vocab_size=VOCAB, n_positions=LENGTH,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).double()


def token_windows(n=24, seed=1):
    """Causal-LM items as the Trainer takes them: input_ids and labels (the model shifts them)."""
    ids = torch.randint(0, VOCAB, (n, LENGTH), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def arguments(tmp_path, **overrides):
    options = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                   max_steps=3, learning_rate=5e-3, max_grad_norm=0.5, logging_steps=1, save_strategy="no",
                   report_to="none", use_cpu=True, seed=0, disable_tqdm=True, lr_scheduler_type="linear",
                   warmup_steps=1)
    return transformers.TrainingArguments(**{**options, **overrides})


def trained(tmp_path, trainer_class=transformers.Trainer, **engine):
    model = tiny_gpt2()
    trainer = trainer_class(model=model, args=arguments(tmp_path / "out"), train_dataset=token_windows(), **engine)
    trainer.train()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, trainer


def largest_difference(a, b):
    return max(float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(1e-30)) for n in b)


def test_the_engine_trainer_ends_where_the_stock_trainer_ends_with_backprop_and_exact_highway(tmp_path):
    """3 optimizer steps of 2 accumulated micro-batches, clipped, AdamW with warmup and decay: backprop and
    Highway-BP at k = 2L give the stock Trainer's parameters (1e-10, float64); Highway-BP at k = 0 does not."""
    stock, _ = trained(tmp_path / "stock")
    mine, trainer = trained(tmp_path / "backprop", EngineTrainer, engine="backprop")
    assert largest_difference(mine, stock) < 1e-10
    assert [r["loss"] for r in trainer.state.log_history if "loss" in r] == pytest.approx(
        [r["loss"] for r in _.state.log_history if "loss" in r], rel=1e-10)
    exact, _ = trained(tmp_path / "highway", EngineTrainer, engine="highway", engine_options={"k": 2 * LAYERS})
    assert largest_difference(exact, stock) < 1e-10
    truncated, _ = trained(tmp_path / "k0", EngineTrainer, engine="highway", engine_options={"k": 0})
    assert largest_difference(truncated, stock) > 1e-4


def test_the_engine_s_scalars_reach_the_log_history_and_its_state_survives_a_resume(tmp_path):
    """FA (its feedback matrices drawn once, its state): the alignment angles of every covered layer are in each
    training log; 4 steps with a checkpoint at 2, resumed from it by a fresh EngineTrainer, end with the
    uninterrupted run's parameters, while a resume that lost engine.pt is refused in one line."""
    def run(where, steps, resume=None):
        model = tiny_gpt2()
        args = arguments(where, max_steps=steps, save_strategy="steps", save_steps=2)
        trainer = EngineTrainer(model=model, args=args, train_dataset=token_windows(), engine="fa")
        trainer.train(resume_from_checkpoint=resume)
        return {n: p.detach().clone() for n, p in model.named_parameters()}, trainer

    whole, trainer = run(tmp_path / "whole", 4)
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 4 and all(any(k.startswith("engine/alignment_deg/") for k in r) for r in logs)
    checkpoint = tmp_path / "whole" / "checkpoint-2"
    assert (checkpoint / ENGINE_FILE).is_file()
    resumed, _ = run(tmp_path / "whole", 4, resume=str(checkpoint))
    assert largest_difference(resumed, whole) < 1e-12
    (checkpoint / ENGINE_FILE).unlink()
    with pytest.raises(ConfigError, match=f"has no {ENGINE_FILE} \\(the engine's state\\)"):
        run(tmp_path / "whole", 4, resume=str(checkpoint))


class MeanLoss(torch.nn.Module):
    """A causal LM that takes no loss arguments (its loss a mean per micro-batch, which the stock step divides by
    the accumulation steps), or whose own loss is ``scale`` times its loss_function's."""

    def __init__(self, scale=1.0):
        super().__init__()
        self.inner, self.scale = tiny_gpt2(), scale
        self.config, self.loss_function = self.inner.config, self.inner.loss_function

    def forward(self, input_ids, labels=None):
        out = self.inner(input_ids=input_ids, labels=labels)
        return {"loss": None if labels is None else self.scale * out.loss, "logits": out.logits}


def test_a_model_without_loss_arguments_is_scaled_for_accumulation_as_the_stock_step_scales_it(tmp_path):
    def run(where, trainer_class=transformers.Trainer):
        model = MeanLoss()
        trainer = trainer_class(model=model, args=arguments(where), train_dataset=token_windows())
        assert not trainer.model_accepts_loss_kwargs
        trainer.train()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    assert largest_difference(run(tmp_path / "mine", EngineTrainer), run(tmp_path / "stock")) < 1e-10


def test_an_own_loss_the_engine_would_not_train_and_bad_options_are_one_line(tmp_path):
    trainer = EngineTrainer(model=MeanLoss(scale=2.0), args=arguments(tmp_path), train_dataset=token_windows())
    with pytest.raises(ConfigError, match="own loss is .* where its loss_function of its logits gives"):
        trainer.train()
    with pytest.raises(ConfigError, match="label_smoothing_factor is not supported"):
        EngineTrainer(model=tiny_gpt2(), args=arguments(tmp_path, label_smoothing_factor=0.1))
    with pytest.raises(ConfigError, match="engine_options go with an engine's name"):
        from gradengines.trainers import build_engine
        EngineTrainer(model=tiny_gpt2(), args=arguments(tmp_path), engine=build_engine("fa"),
                      engine_options={"k": 1})


def test_in_bf16_mixed_precision_the_engine_trainer_ends_where_the_stock_trainer_ends(tmp_path):
    """TrainingArguments(bf16=True) on the CPU: the stock step and the engine both run under the Trainer's autocast
    (float32 model): backprop's parameters are the stock Trainer's."""
    def run(where, trainer_class=transformers.Trainer, bf16=True, **engine):
        model = tiny_gpt2().float()
        trainer_class(model=model, args=arguments(where, bf16=bf16), train_dataset=token_windows(), **engine).train()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    stock = run(tmp_path / "stock")
    assert largest_difference(run(tmp_path / "mine", EngineTrainer, engine="backprop"), stock) < 1e-6
    assert largest_difference(run(tmp_path / "fp32", EngineTrainer, bf16=False, engine="backprop"), stock) > 1e-4
