"""Where each engine's gradient computation spends its time, beside backprop's: torch's profiler over N
``compute_grads`` calls of each trainer on one zoo model: the operators' total self CPU time, their count (what
the dispatcher and Python pay per call), and the top ones (issue 32). The time itself is bench.py's (round-robin,
``--suite grads --grads-model``): on a shared VM one trainer's calls in a row can read 2x apart between runs.

    python scripts/maintenance/profile_grads.py --model ortho_lenet --trainers backprop,fa,dfa --batch-size 64 \
        --calls 200
    python scripts/maintenance/profile_grads.py --model mlp --depth 32 --width 256 --trainers backprop,foton \
        --calls 100

One thread (the comparison is per operator, not of parallel speed-ups); 8 x 8 inputs of 64 features (digits'
shape) for the CNNs, ``--features`` otherwise.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from gradengines import models, trainers
from gradengines.trainers.bench.timing import classification_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ortho_lenet")
    parser.add_argument("--trainers", default="backprop,fa,dfa")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--depth", type=int, default=None, help="mlp: hidden layers (with --width: the bench suites' "
                        "orthogonal tanh MLP, Björck-marked)")
    parser.add_argument("--width", type=int, default=None, help="mlp: layer width (also its input features)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    trainers.set_threads(1)
    sizes = {} if args.depth is None else {"depth": args.depth, "width": args.width, "activation": "tanh",
                                           "orthogonal": "bjorck"}
    features = args.width if args.depth is not None else args.features
    x, y = classification_batch(args.batch_size, features, "cpu")
    torch.manual_seed(0)
    model = models.build(args.model, in_features=features, out_features=10, **sizes)
    for name in args.trainers.split(","):
        engine = trainers.build_engine(name)
        for _ in range(10):  # warm-up (FA's feedback and twins drawn here)
            engine.compute_grads(model, x, y, F.cross_entropy)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.calls):
                engine.compute_grads(model, x, y, F.cross_entropy)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events) / args.calls / 1e3
        calls = sum(e.count for e in events) / args.calls
        print(f"\n## {name}: operators {total:.3f} ms self CPU in {calls:.0f} operator calls per compute_grads "
              f"({args.calls} profiled calls)\n")
        print("| operator | calls per step | self ms per step |\n|---|---|---|")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]:
            print(f"| {e.key} | {e.count / args.calls:g} | {e.self_cpu_time_total / args.calls / 1e3:.3f} |")


if __name__ == "__main__":
    main()
