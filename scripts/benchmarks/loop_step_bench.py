"""The Hugging Face Trainer's step with an engine (``trainers.loops.hf.EngineTrainer``) against the project
Trainer's step, same model (a transformers GPT-2), engine, batch and optimizer (AdamW): median seconds per step of
each, measured round-robin in one process, and their ratio.

    .venv/bin/python scripts/benchmarks/loop_step_bench.py --engines backprop,highway --steps 30 --rounds 3

Each round runs ``--steps`` steps in each loop and keeps the steps after the first ``--warmup``; a step is
timed from the loop's own hooks (the HF Trainer's ``on_step_begin``/``on_step_end``, the project Trainer's
``step_times``: one pass of its loop, agreement and evaluation off). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from gradengines import tasks, trainers
from gradengines.trainers.loops.hf import EngineTrainer
from gradengines.trainers.loops.setup import model_for_engine


def gpt2(vocab: int, width: int, layers: int, seq_len: int, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=vocab, n_positions=seq_len,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


class StepClock(transformers.TrainerCallback):
    """Seconds of each optimizer step of the HF Trainer."""

    def __init__(self):
        self.times: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def hf_step(engine: str, ids: torch.Tensor, args, steps: int, folder: str) -> list[float]:
    model = gpt2(args.vocab, args.width, args.layers, args.seq_len)
    windows = [{"input_ids": row[:-1], "labels": row[:-1]} for row in ids]
    clock = StepClock()
    options = transformers.TrainingArguments(
        output_dir=folder, max_steps=steps, per_device_train_batch_size=args.batch_size, learning_rate=1e-3,
        logging_steps=10**6, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        max_grad_norm=1.0, dataloader_num_workers=0)
    EngineTrainer(model=model, args=options, train_dataset=windows, engine=engine, callbacks=[clock]).train()
    return clock.times


def project_step(engine: str, task, args, steps: int) -> list[float]:
    model = gpt2(args.vocab, args.width, args.layers, args.seq_len)
    built = trainers.build_engine(engine)
    model = model_for_engine(built, model, task.train.take(slice(0, 2)))  # Highway-BP: the stack, as the CLI finds it
    trainer = trainers.Trainer(model, built, task, batch_size=args.batch_size,
                               optimizer="adamw", lr=1e-3, clip_grad_norm=1.0, eval_every=10**6, log_every=10**6,
                               grad_agreement_every=0, progress=False, eval_batches=1, eval_batch_size=args.batch_size)
    trainer.fit(steps=steps)
    return trainer.step_times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="backprop,highway")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--out", default="/tmp/loop_step_bench")
    args = parser.parse_args(argv)
    n = args.batch_size * (args.steps + 1)
    ids = torch.randint(0, args.vocab, (n, args.seq_len + 1), generator=torch.Generator().manual_seed(0))
    split = [{"input_ids": row[:-1], "labels": row[1:]} for row in ids]  # the project's targets: the next tokens
    task = tasks.from_datasets(split, split[:args.batch_size], split[:args.batch_size], num_outputs=args.vocab,
                               metric="perplexity", name="random-tokens")
    print("| engine | HF Trainer s/step | project Trainer s/step | ratio HF / project | rounds |")
    print("|---|---|---|---|---|")
    for engine in args.engines.split(","):
        hf, mine = [], []
        for _ in range(args.rounds):  # round-robin: the two loops share the machine's state
            hf.append(statistics.median(hf_step(engine, ids, args, args.steps, args.out)[args.warmup:]))
            mine.append(statistics.median(project_step(engine, task, args, args.steps)[args.warmup:]))
        ratios = [a / b for a, b in zip(hf, mine, strict=True)]
        print(f"| {engine} | {statistics.median(hf):.4f} | {statistics.median(mine):.4f} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | {args.rounds} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
