"""Every GPU row BENCHMARKS.md is missing, in one run on one GPU, one folder per table under OUT (each with its
bench.json and bench.md), OUT/times.txt with the seconds each part took:

    highway_gru_<precision>_T<length>  Highway-BP over time, 1-layer GRU LM (hidden 512, batch 128): backprop
                                       (cuDNN), bptt_loop, highway k = 0, 5, 10 (Highway-BP paper, Table 3)
    highway_residual_<precision>       Highway-BP on the 32-block residual MLP (width 256, batch 256), both paths
    engines_<upkeep>                   backprop and FOTON steps on the orthogonal tanh MLP (depth 8, 32; width 256,
                                       1024; batch 256) with Björck x3 and with the retraction
    upkeep                             orthogonal / plain step: Björck (adaptive) and retraction, backprop and FOTON,
                                       depth 8, 32, width 256, 1024, batch 64, 256
    grads_ortho_lenet                  gradient computation alone of backprop, FA, DFA, FOTON, PEPITA on the
                                       orthogonal CNN (8 x 8 inputs, batch 64)
    upkeep_optimizers                  orthogonal / plain step under momentum SGD, Adam, AdamW and every upkeep;
                                       depth 4, width 256, 1024, batch 64
    grads_foton_b<batch>               gradient computation alone, FOTON against backprop (and the bare pass) on the
                                       orthogonal tanh MLP, depth 8, 32, 64, width 256, 1024
    precision_compile.md               every engine's step in float32, bf16-mixed, 16-mixed and compiled (inductor) on
                                       the zoo's GPT and the orthogonal MLP (precision_bench.py)

<precision> is tf32 and fp32 on CUDA. Every part is the ``scripts/bench.py`` command its bench.json records, run
in this one process: a GPU session's minutes are not spent loading torch and CUDA ten times (about 3 s per part
on the CPU), and TF32 is switched back off after each part that allowed it.

    .venv/bin/python scripts/benchmarks/gpu_rows.py [OUT]            on the GPU (--device, default cuda)
    .venv/bin/python scripts/benchmarks/gpu_rows.py OUT --dry-run    the same commands at tiny sizes on the CPU, in
                                                                     seconds (tests/test_gpu_rows.py runs it)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precision_bench  # noqa: E402 - beside this file

from gradengines.trainers.cli.bench import bench_main  # noqa: E402

#: Sizes of the real run and of the dry run (tiny, on the CPU).
SIZES = {
    "gpu": dict(precisions=("tf32", "fp32"), lengths=("256", "1024"), hidden="512", rbatch="128", rdepth="32",
                widths="256,1024", depths="8,32", fdepths="8,32,64", batch="256", batches="64,256", steps="30",
                warmup="5", obatch="64"),
    "dry": dict(precisions=("fp32",), lengths=("8",), hidden="8", rbatch="4", rdepth="3", widths="8", depths="2",
                fdepths="2", batch="8", batches="4", steps="20", warmup="1", obatch="4"),
}


def parts(size: dict) -> list[tuple[str, list[str]]]:
    """The bench.py commands, in order: (folder name, flags without the shared --device/--steps/--warmup/--out)."""
    out = []
    for precision in size["precisions"]:
        tf32 = ["--tf32"] if precision == "tf32" else []
        for length in size["lengths"]:
            out.append((f"highway_gru_{precision}_T{length}",
                        ["--suite", "recurrent", "--cell", "gru", "--hidden", size["hidden"], "--recurrent-depths",
                         "1", "--lengths", length, "--recurrent-batch-size", size["rbatch"], "--trainers",
                         "backprop;bptt_loop;highway:k=0;highway:k=5;highway:k=10", *tf32]))
        out.append((f"highway_residual_{precision}",
                    ["--suite", "residual", "--residual-depth", size["rdepth"], "--widths",
                     size["widths"].split(",")[0], "--batch-size", size["batch"], *tf32]))
    for upkeep in ("bjorck", "retraction"):
        out.append((f"engines_{upkeep}", ["--suite", "engines", "--trainers", "backprop;foton", "--depths",
                                          size["depths"], "--widths", size["widths"], "--batch-size", size["batch"],
                                          "--orthogonal", upkeep]))
    out.append(("upkeep", ["--suite", "upkeep", "--trainers", "backprop;foton", "--depths", size["depths"],
                           "--widths", size["widths"], "--batch-sizes", size["batches"]]))
    out.append(("grads_ortho_lenet", ["--suite", "grads", "--grads-model", "ortho_lenet", "--trainers",
                                      "backprop;fa;dfa;foton;pepita", "--batch-size", size["obatch"]]))
    out.append(("upkeep_optimizers", ["--suite", "upkeep-optimizers", "--depths", "4", "--widths", size["widths"],
                                      "--batch-size", size["obatch"]]))
    for batch in size["batches"].split(","):
        out.append((f"grads_foton_b{batch}", ["--suite", "grads", "--trainers", "backprop;foton", "--depths",
                                              size["fdepths"], "--widths", size["widths"], "--batch-size", batch]))
    return out


def precision_flags(dry: bool, device: str) -> list[str]:
    """precision_bench.py's flags: every engine on a GPU; one engine at tiny sizes in the dry run."""
    if dry:
        return ["--device", "cpu", "--models", "gpt", "--engines", "backprop", "--precisions", "32,bf16-mixed",
                "--compile", "aot_eager", "--rounds", "1", "--steps", "2", "--depth", "1", "--width", "16",
                "--vocab", "50", "--seq-len", "8"]
    return ["--device", device, "--precisions", "32,bf16-mixed,16-mixed", "--compile", "inductor", "--rounds", "5",
            "--steps", "20"]


@contextlib.contextmanager
def tf32_restored():
    """A part's --tf32 stays inside the part (it sets torch's process-wide flags)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="bench_out/gpu_rows")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: checks that every part runs")
    args = parser.parse_args(argv)
    size = SIZES["dry" if args.dry_run else "gpu"]
    device = "cpu" if args.dry_run else args.device
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    times = out / "times.txt"
    times.write_text("")

    def timed(name, run) -> None:
        print(f"[gpu_rows] {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        code = run()
        if code:
            raise SystemExit(f"[gpu_rows] {name} failed (exit status {code}); the parts before it are in {out}")
        with times.open("a") as file:
            file.write(f"{name} {time.perf_counter() - start:.0f} s\n")

    for name, flags in parts(size):
        command = [*flags, "--device", device, "--steps", size["steps"], "--warmup", size["warmup"], "--out",
                   str(out / name)]
        with tf32_restored(), contextlib.redirect_stdout(io.StringIO()):
            timed(name, lambda command=command: bench_main(command))
    table = io.StringIO()

    def precision_table() -> int:
        with contextlib.redirect_stdout(table):
            code = precision_bench.main(precision_flags(args.dry_run, device))
        (out / "precision_compile.md").write_text(table.getvalue())
        return code

    timed("precision_compile", precision_table)
    print(times.read_text(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
