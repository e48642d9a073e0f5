"""Peak memory and step time of the forward-only and zeroth-order engines against inference and backprop.

    .venv/bin/python scripts/benchmarks/forward_only_memory.py

For each model, the peak extra memory of one call (``trainers.bench.timing.peak_step_memory_mb``: the profiler's
live CPU allocations on a CPU, ``max_memory_allocated`` on a GPU; the parameters, allocated before, are not
counted, ``.grad`` is cleared before each call so the gradients written count) of: inference (the model's forward
under ``no_grad``), and each engine's ``compute_grads``; and the median time of 5 ``compute_grads`` calls after one.
Models: a transformers GPT-2 (4 layers, width 256, vocabulary 5,000, 128 tokens, batch 8: backprop, fgrad,
fgrad_act, mezo) and the zoo's orthogonal tanh MLP (Björck, depth 8, width 512, batch 64: also foton and pepita).
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gradengines import models, tasks, trainers
from gradengines.models.adapters.calling import call_model
from gradengines.trainers.bench.timing import peak_step_memory_mb


def gpt2_case():
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=5000, n_positions=128,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 5000, (8, 129), generator=torch.Generator().manual_seed(1))
    return "transformers GPT-2 (4 x 256)", model, ids[:, :-1], ids[:, 1:], tasks.sequence_cross_entropy, \
        ["backprop", "fgrad", "fgrad_act", "mezo"]


def mlp_case():
    torch.manual_seed(0)
    model = models.build("mlp", in_features=512, out_features=10, depth=8, width=512, activation="tanh",
                         orthogonal="bjorck")
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1))
    return "orthogonal MLP (8 x 512)", model, x, x[:, :10].argmax(1), tasks.base.cross_entropy_loss, \
        ["backprop", "fgrad", "fgrad_act", "mezo", "foton", "pepita"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device("cpu")
    print("| model | parameters MB | what | peak extra MB | / inference | / backprop | ms per call | / backprop |")
    print("|---|---|---|---|---|---|---|---|")
    for case in (gpt2_case, mlp_case):
        name, model, x, y, loss_fn, engines = case()
        params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20

        def inference(model=model, x=x, y=y):
            with torch.no_grad():
                call_model(model, x, y)

        rows = {"inference (no_grad forward)": (peak_step_memory_mb(inference, device), None)}
        for engine_name in engines:
            engine = trainers.build_engine(engine_name)

            def clear(model=model):
                for p in model.parameters():
                    p.grad = None

            def compute(model=model, engine=engine, x=x, y=y, loss_fn=loss_fn):
                engine.compute_grads(model, x, y, loss_fn)

            def step():
                clear()
                compute()

            step()  # first call: the engine's checks, drawn feedback
            peaks = []
            for _ in range(3):
                clear()  # before the measured call: the gradients it writes count
                peaks.append(peak_step_memory_mb(compute, device))
            memory = statistics.median(peaks)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            rows[engine_name] = (memory, 1e3 * statistics.median(times))
        base_mb, base_ms = rows["inference (no_grad forward)"][0], rows["backprop"][1]
        backprop_mb = rows["backprop"][0]
        for what, (mb, ms) in rows.items():
            timing = "-" if ms is None else f"{ms:.1f} | {ms / base_ms:.2f}"
            print(f"| {name} | {params_mb:.1f} | {what} | {mb:.1f} | {mb / base_mb:.2f} | {mb / backprop_mb:.2f} | "
                  f"{timing if ms is not None else '- | -'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
