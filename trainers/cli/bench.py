"""``bench``: the timing suites of ``trainers.bench`` from the command line (``scripts/bench.py``,
``gradengines bench``)."""

import sys
import tempfile
from pathlib import Path

import torch

from gradengines.models.orthogonal import DEFAULT_BJORCK_ITERS
from gradengines.trainers.cli.args import OneLineParser, add_threads_flag, int_list, mlp_trainers, trainer_specs
from gradengines.trainers.cli.process import run_cli
from gradengines.trainers.core.distributed import check_device
from gradengines.trainers.core.errors import (
    ConfigError,
)
from gradengines.trainers.core.threads import set_threads

__all__ = ["bench_main"]


def bench_main(argv=None, prog: str | None = None) -> int:
    """``scripts/bench.py``: step time and peak memory, as ratios to backprop, JSON + Markdown."""
    from gradengines.trainers import bench

    parser = OneLineParser(prog=prog, description="Benchmark step time (median) and peak memory per trainer.")
    parser.add_argument("--suite",
                        choices=["overhead", "engines", "grads", "upkeep", "upkeep-optimizers", "upkeep-error",
                                 "recurrent", "residual", "scan", "user", "all"],
                        default="all")
    parser.add_argument("--lengths", default="256,1024,4096", help="comma list of sequence lengths (recurrent, scan)")
    parser.add_argument("--trainers", default=None,
                        help="';'-separated trainer specs, e.g. 'backprop;foton;foton:mode=lowmem' (engines suite; "
                             "default: every trainer that accepts an MLP) or 'backprop;ftbptt;dsf;bptt_loop' "
                             "(recurrent suite; that is its default) or "
                             "'backprop;highway:k=0;highway:k=5;highway:k=10' "
                             "(residual suite; its default: k = 0, 5, 10 on both paths)")
    parser.add_argument("--depths", default="8,32", help="comma list of MLP depths (engines suite)")
    parser.add_argument("--widths", default="256", help="comma list of MLP widths (engines and residual suites)")
    parser.add_argument("--residual-depth", type=int, default=32, help="blocks of the residual suite's residual_mlp")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batch-sizes", default="64,256", help="comma list of batch sizes (upkeep suite)")
    parser.add_argument("--optimizers", default="momentum,adam,adamw",
                        help="comma list of momentum, adam, adamw (upkeep-optimizers and upkeep-error suites)")
    parser.add_argument("--error-steps", type=int, default=1000,
                        help="training steps on digits of the upkeep-error suite (its width: --widths, depth: "
                             "--depths, batch: --batch-size)")
    parser.add_argument("--cell", default="gru", help="recurrent cell (recurrent suite)")
    parser.add_argument("--hidden", type=int, default=512, help="recurrent state size (recurrent and scan suites)")
    parser.add_argument("--recurrent-depths", default="1,3", help="comma list of recurrent layers (recurrent suite)")
    parser.add_argument("--recurrent-batch-size", type=int, default=128, help="batch (recurrent and scan suites)")
    parser.add_argument("--vocab", type=int, default=64, help="token vocabulary of the recurrent suite's LM")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA (all trainers alike)")
    parser.add_argument("--orthogonal", default="bjorck", help="orthogonality of the engines-suite MLP (or none)")
    parser.add_argument("--orthogonal-iters", type=int, default=DEFAULT_BJORCK_ITERS,
                        help="most Björck iterations per projection (fewer when the deviation allows)")
    parser.add_argument("--dropout", type=float, default=0.0, help="hidden dropout of the MLP (grads suite)")
    parser.add_argument("--grads-model", default="mlp",
                        help="zoo model of the grads suite: mlp (--depths x --widths) or another, e.g. ortho_lenet "
                             "(its own sizes, 8 x 8 inputs)")
    parser.add_argument("--steps", type=int, default=30,
                        help="timed steps per trainer, interleaved: each round one step of every trainer, ratios "
                             "are medians over rounds (engines, recurrent, residual); per round for overhead; >= 20")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (overhead suite)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None,
                        help="folder for bench.json and bench.md (default: bench_out/<suite>, one per suite)")
    add_threads_flag(parser)
    args = parser.parse_args(argv)

    def main():
        set_threads(args.threads)
        if args.steps < 20:
            raise ConfigError(f"--steps must be >= 20 for a meaningful median, got {args.steps}")
        sizes = {flag: int_list(getattr(args, flag), "--" + flag.replace("_", "-"), minimum=1)
                 for flag in ("depths", "widths", "lengths", "recurrent_depths", "batch_sizes")}
        for flag in ("batch_size", "residual_depth", "hidden", "recurrent_batch_size", "vocab", "rounds",
                     "orthogonal_iters", "warmup"):
            if getattr(args, flag) < (0 if flag == "warmup" else 1):
                raise ConfigError(f"--{flag.replace('_', '-')} must be >= {0 if flag == 'warmup' else 1}, "
                                  f"got {getattr(args, flag)}")
        if not 0.0 <= args.dropout < 1.0:
            raise ConfigError(f"--dropout must be in [0, 1), got {args.dropout}")
        check_device(args.device)
        args.out = args.out or f"bench_out/{args.suite}"
        Path(args.out).mkdir(parents=True, exist_ok=True)  # an unwritable --out fails now, not after the timing
        with tempfile.NamedTemporaryFile(dir=args.out):  # a read-only --out too
            pass
        engine_names = trainer_specs(args.trainers) if args.trainers else mlp_trainers()
        recurrent_names = trainer_specs(args.trainers or "backprop;ftbptt;dsf;bptt_loop")
        residual_names = trainer_specs(args.trainers or ";".join(
            ["backprop"] + [f"highway:k={k},path={p}" for p in ("batched", "reference") for k in (0, 5, 10)]))
        for name in {*engine_names, *recurrent_names, *residual_names} - {"bptt_loop"}:
            bench.engine_from_spec(name)  # unknown trainers and options fail here, before any timing
        device = torch.device(args.device)
        if args.tf32:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        rows = []
        if args.suite in ("overhead", "all"):
            for in_features, width, depth, batch in ((64, 64, 3, 64), (256, 1024, 4, 256)):
                rows.append(bench.bench_overhead(in_features=in_features, width=width, depth=depth,
                                                 batch_size=batch, n_train=8 * batch, steps=args.steps,
                                                 warmup=args.warmup, rounds=args.rounds, device=device))
        if args.suite in ("engines", "all"):
            rows += bench.bench_engines(trainers=engine_names, depths=sizes["depths"],
                                        widths=sizes["widths"], batch_size=args.batch_size, steps=args.steps,
                                        warmup=args.warmup, device=device,
                                        orthogonal=None if args.orthogonal == "none" else args.orthogonal,
                                        orthogonal_iters=args.orthogonal_iters)
        if args.suite in ("recurrent", "all"):
            rows += bench.bench_recurrent(trainers=recurrent_names, cell=args.cell,
                                          depths=sizes["recurrent_depths"], hidden=args.hidden,
                                          lengths=sizes["lengths"], batch_size=args.recurrent_batch_size,
                                          vocab=args.vocab, steps=args.steps, warmup=args.warmup, device=device)
        if args.suite in ("residual", "all"):
            for width in sizes["widths"]:
                rows += bench.bench_residual(trainers=residual_names, depth=args.residual_depth, width=width,
                                             batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                                             device=device)
        if args.suite in ("grads", "all"):
            rows += bench.bench_grads(trainers=engine_names, depths=sizes["depths"], widths=sizes["widths"],
                                      batch_size=args.batch_size, steps=args.steps, warmup=args.warmup, device=device,
                                      orthogonal=None if args.orthogonal == "none" else args.orthogonal,
                                      orthogonal_iters=args.orthogonal_iters, dropout=args.dropout,
                                      model_name=args.grads_model)
        if args.suite in ("upkeep", "all"):
            rows += bench.bench_upkeep(trainers=trainer_specs(args.trainers or "backprop;foton"),
                                       depths=sizes["depths"], widths=sizes["widths"],
                                       batch_sizes=sizes["batch_sizes"], steps=args.steps, warmup=args.warmup,
                                       device=device, orthogonal_iters=args.orthogonal_iters)
        optimizers = args.optimizers.split(",")
        unknown = sorted(set(optimizers) - set(bench.OPTIMIZERS))
        if unknown:
            raise ConfigError(f"--optimizers: unknown {', '.join(unknown)}; expected some of "
                              f"{', '.join(bench.OPTIMIZERS)}")
        if args.suite == "upkeep-optimizers":  # not in "all": it times O(n^3) upkeeps for minutes
            for depth in sizes["depths"]:
                rows += bench.bench_upkeep_optimizers(optimizers=optimizers, widths=sizes["widths"], depth=depth,
                                                      batch_size=args.batch_size, steps=args.steps,
                                                      warmup=args.warmup, device=device)
        if args.suite == "upkeep-error":
            for depth in sizes["depths"]:
                for width in sizes["widths"]:
                    rows += bench.orthogonality_over_steps(optimizers=optimizers, steps=args.error_steps,
                                                           depth=depth, width=width, batch_size=args.batch_size,
                                                           device=device)
        if args.suite in ("user", "all"):
            rows += bench.bench_user(steps=args.steps, warmup=args.warmup, device=device)
        if args.suite in ("scan", "all"):
            rows += bench.bench_scan(lengths=sizes["lengths"], batch_size=args.recurrent_batch_size,
                                     width=args.hidden, repeats=max(3, args.steps // 10), device=device)
        command = "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
        earlier = (Path(args.out) / "bench.md").exists()
        print(bench.write_results(rows, args.out, bench.machine_description(device), command.strip()))
        print(f"bench.json and bench.md in {args.out}{' (replacing the earlier ones)' if earlier else ''}")

    return run_cli(main)

