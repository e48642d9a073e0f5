"""What the first-batch self-check costs (trainers/core/self_check.py), against a training step of the same
engine and a backprop step on the same batch, float32, one thread: transformers' GPT-2 (4 layers, width 64,
sequence 64, batch 32, vocabulary 10000: the size of BENCHMARKS' PTB rows) for Highway-BP (k = 4) and FA/DFA's
layer path, and the zoo's residual_mlp declared through models.residual_stack (depth 16, width 256, digits
batch 64). Each time is the median of ``--rounds`` interleaved rounds (check, step, backprop).

    python scripts/benchmarks/self_check_cost.py [--rounds 5]
"""

import argparse
import statistics
import time

import torch

from gradengines import models, tasks, trainers
from gradengines.tasks.base import sequence_cross_entropy


def _gpt2():
    import transformers

    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(vocab_size=10000, n_positions=64, n_embd=64, n_layer=4, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 10000, (32, 65), generator=gen)
    return model, tokens[:, :-1], tokens[:, 1:], sequence_cross_entropy


def _residual_mlp():
    task = tasks.build("digits")
    model = models.build("residual_mlp", in_features=64, out_features=10, depth=16, width=256)
    return model, task.train.inputs[:64], task.train.targets[:64], task.loss_fn


def _seconds(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("| model | engine | self-check (ms) | engine step (ms) | backprop step (ms) | check / step | "
          "check / backprop |")
    print("|---|---|---|---|---|---|---|")
    for label, build, engines in (("GPT-2 (transformers, 4 x 64)", _gpt2, ("highway", "fa", "dfa")),
                                  ("residual_mlp declared as a found stack (16 x 256)", _residual_mlp, ("highway",))):
        model, x, y, loss_fn = build()
        stack = models.residual_stack(model, example=(x[:2], y[:2]))
        backprop = trainers.build_engine("backprop")
        for name in engines:
            target = stack if name == "highway" else model
            engine = trainers.build_engine(name, **({"k": 4} if name == "highway" else {"path": "layers"}))
            engine.compute_grads(target, x, y, loss_fn)  # warm-up (and the check, once)
            checks, steps, backs = [], [], []
            for _ in range(args.rounds):
                checks.append(_seconds(engine.first_batch_check, target, x, y, loss_fn))
                steps.append(_seconds(engine.compute_grads, target, x, y, loss_fn))
                backs.append(_seconds(backprop.compute_grads, model, x, y, loss_fn))
            c, s, b = (1000 * statistics.median(v) for v in (checks, steps, backs))
            print(f"| {label} | {name} | {c:.0f} | {s:.0f} | {b:.0f} | {c / s:.2f} | {c / b:.2f} |")


if __name__ == "__main__":
    main()
