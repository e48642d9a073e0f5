"""Step time of every engine at each precision and compiled, against the same engine in float32, eagerly: the
project Trainer's update (``Trainer.train_step``: the engine, clipping, the optimizer) on one fixed batch, each
configuration a Trainer of its own, timed round-robin in one process.

    .venv/bin/python scripts/benchmarks/precision_bench.py --device cpu --rounds 5 --steps 10
    .venv/bin/python scripts/benchmarks/precision_bench.py --device cuda --precisions 32,bf16-mixed,16-mixed \
        --compile inductor

Models: the zoo's GPT (``--depth`` blocks, ``--width``, 4 heads, a ``--vocab`` vocabulary, ``--seq-len`` tokens)
for backprop, Highway-BP, FA and DFA; the orthogonal tanh MLP (Björck, width ``--mlp-width``, depth 4) for
backprop, FA, DFA, PEPITA and FOTON. Per round, each configuration takes ``--steps`` steps after one untimed step;
the table gives the median step over rounds and the median of the per-round ratios to float32 eager (min-max).
A configuration refused (an engine that does not compile) is a row saying so.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gradengines import models, tasks, trainers
from gradengines.trainers.core.errors import ConfigError

GPT_ENGINES = ("backprop", "highway", "fa", "dfa")
MLP_ENGINES = ("backprop", "fa", "dfa", "pepita", "foton")


def gpt_case(args):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch_size * 4, args.seq_len + 1), generator=gen)
    split = tasks.Split(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
    task = tasks.Task("tokens", split, split, split, input_shape=(args.seq_len,), num_outputs=args.vocab,
                      metric_name="perplexity", loss_fn=tasks.sequence_cross_entropy,
                      output_shape=(args.seq_len, args.vocab))

    def build():
        torch.manual_seed(0)
        return models.build("gpt", in_features=args.seq_len, out_features=args.vocab, vocab_size=args.vocab,
                            depth=args.depth, width=args.width, heads=4)
    return task, build


def mlp_case(args):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size * 4, args.mlp_width, generator=gen)
    split = tasks.Split(x, x[:, :10].argmax(1))
    task = tasks.Task("features", split, split, split, input_shape=(args.mlp_width,), num_outputs=10)

    def build():
        torch.manual_seed(0)
        return models.build("mlp", in_features=args.mlp_width, out_features=10, depth=4, width=args.mlp_width,
                            activation="tanh", orthogonal="bjorck")
    return task, build


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precisions", default="32,bf16-mixed")
    parser.add_argument("--compile", default="inductor", help="a backend for the compiled rows ('' for none)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--mlp-width", type=int, default=512)
    parser.add_argument("--models", default="gpt,mlp")
    parser.add_argument("--engines", default="", help="only these engines (default: each model's)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    precisions = args.precisions.split(",")
    print("| model | engine | configuration | ms per step (median of rounds) | ratio to float32 eager (min-max) |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        task, build = (gpt_case if name == "gpt" else mlp_case)(args)
        engines = [e for e in (GPT_ENGINES if name == "gpt" else MLP_ENGINES)
                   if not args.engines or e in args.engines.split(",")]
        for engine in engines:
            configs = [(p, None) for p in precisions] + ([("32", args.compile)] if args.compile else [])
            runs, refused = {}, {}
            for precision, backend in configs:
                label = f"{precision}" + (f", compiled ({backend})" if backend else "")
                try:
                    trainer = trainers.Trainer(build(), trainers.build_engine(engine), task,
                                               batch_size=args.batch_size, precision=precision, compile=backend,
                                               device=args.device, clip_grad_norm=1.0, progress=False)
                except ConfigError as err:
                    refused[label] = str(err)
                    continue
                x, y = trainer._batch(0)
                runs[label] = (trainer, x, y, [])
            for trainer, x, y, _ in runs.values():  # untimed: first-call work (drawn feedback, compilation)
                trainer.train_step(x, y)
            for _ in range(args.rounds):
                for trainer, x, y, times in runs.values():
                    steps = []
                    for _ in range(args.steps):
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                        start = time.perf_counter()
                        trainer.train_step(x, y)
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                        steps.append(time.perf_counter() - start)
                    times.append(statistics.median(steps))
            base = runs.get("32", (None, None, None, None))[3]
            for label, (_, _, _, times) in runs.items():
                ratios = [t / b for t, b in zip(times, base, strict=True)] if base else []
                spread = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
                print(f"| {name} | {engine} | {label} | {1e3 * statistics.median(times):.2f} | {spread} |",
                      flush=True)
            for label, why in refused.items():
                print(f"| {name} | {engine} | {label} | refused: {why[:160]} | - |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
