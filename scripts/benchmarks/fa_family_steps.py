"""The FA family's gradient computation against backprop's: compute_grads alone, every engine interleaved
round by round, medians of the times and of the per-round ratios to backprop (BENCHMARKS.md "The
feedback-alignment family's gradient computation").

Models: the zoo's mlp (depth 4, width 256) and convnet on digits (batch 64), and transformers' GPT-2 (4 layers,
width 64, 2 heads, vocabulary 10000: PTB words' size) on random tokens (batch 16 x 32), the shapes of the GPT-2
PTB benchmark. An engine or option this checkout does not have is left out (the script runs on older commits
too, for a before/after).

    python scripts/benchmarks/fa_family_steps.py [--rounds 100] [--threads 2] [--models mlp,convnet,gpt2]
"""

import argparse
import statistics
import time

import torch

from gradengines import models, tasks, trainers

ENGINES = ("backprop", "fa", "fa:scale=weight", "usf", "brsf", "frsf", "dfa", "dfa:slices=disjoint")


def _engines() -> dict:
    built = {}
    for spec in ENGINES:
        name, _, options = spec.partition(":")
        values = dict(o.split("=") for o in options.split(",")) if options else {}
        try:
            built[spec] = trainers.build_engine(name, **values)
        except Exception as error:  # noqa: BLE001 (an older checkout: said and left out)
            print(f"  {spec}: not in this checkout ({type(error).__name__})")
    return built


def _gpt2():
    import transformers

    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(vocab_size=10000, n_positions=64, n_embd=64, n_layer=4, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 10000, (16, 32), generator=gen)
    y = torch.randint(0, 10000, (16, 32), generator=gen)

    def loss(out, t):
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), t.reshape(-1))
    return model, x, y, loss


def _case(name: str):
    if name == "gpt2":
        return _gpt2()
    task = tasks.build("digits")
    sizes = {"depth": 4, "width": 256} if name == "mlp" else {}
    model = models.build(name, in_features=64, out_features=10, **sizes)
    return model, task.train.inputs[:64], task.train.targets[:64], task.loss_fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default="mlp,convnet,gpt2")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.models.split(","):
        torch.manual_seed(0)
        model, x, y, loss_fn = _case(name)
        engines = _engines()
        times: dict[str, list[float]] = {k: [] for k in engines}
        for engine in engines.values():
            engine.check(model)
            for _ in range(args.warmup):
                engine.compute_grads(model, x, y, loss_fn)
        for _ in range(args.rounds):
            for key, engine in engines.items():
                start = time.perf_counter()
                engine.compute_grads(model, x, y, loss_fn)
                times[key].append(time.perf_counter() - start)
        print(f"{name} ({args.rounds} rounds, {args.threads} threads)")
        for key, values in times.items():
            ratio = statistics.median(a / b for a, b in zip(values, times["backprop"], strict=True))
            print(f"  {key:22s} {1e3 * statistics.median(values):8.2f} ms  ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
