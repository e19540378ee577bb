"""The realistic-shape Llama on one CUDA device, every mode under Inductor against stock (``python -m benchmarks.gpu``).

Run by ``scripts/gpu_check``. Per point: ``torch.compile`` (Inductor, Triton
kernels) of a fresh copy, one warm-up step, then the measured step
(:func:`hyper_ac.memory.measure_step` on the device: the caching allocator's
peak allocated bytes, its reserved bytes beside) and ``--steps`` timed steps
(CUDA-synchronised, median). Peaks are of the step alone (parameters and the
batch existed before it). Nothing is asserted (``tests/python/test_cuda.py``
checks correctness). Writes ``results.json`` and ``results.md`` to ``--out``.

    python -m benchmarks.gpu [--layers 8 --hidden 512 --seq 512 --batch 2] [--out benchmarks/results/gpu]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.provenance import code_commit, machine_load

POINTS = ("stock", "hyper_ac off", "hyper_ac full", "hyper_ac selective", "hyper_ac auto", "hyper_ac budget 0.5",
          "hyper_ac budget 0.3")
CHECKOUT = Path(__file__).resolve().parent.parent


def _config(point: str) -> dict:
    mode = point.split()[1]
    if mode == "budget":
        return {"ac_mode": "budget", "ac_memory_budget": float(point.split()[2])}
    return {"ac_mode": mode}


def measure(point: str, model, batch, steps: int) -> dict:
    import torch

    import hyper_ac
    from hyper_ac import memory

    trained = copy.deepcopy(model)
    results: list = []
    if point == "stock":
        compiled = torch.compile(trained, fullgraph=True)
    else:
        compiled = torch.compile(trained, fullgraph=True, backend=hyper_ac.backend(
            _config(point), model=trained, compiler="inductor", on_result=results.append))
    t0 = time.perf_counter()
    memory.loss_of(compiled(**batch)).backward()
    torch.cuda.synchronize()
    compile_seconds = time.perf_counter() - t0
    for p in trained.parameters():
        p.grad = None
    step = memory.measure_step(lambda: compiled(**batch))
    times = []
    for _ in range(steps):
        for p in trained.parameters():
            p.grad = None
        torch.cuda.synchronize()
        start = time.perf_counter()
        memory.loss_of(compiled(**batch)).backward()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    stats = results[-1].stats if results and results[-1].stats else {}
    row = {"point": point, "peak_bytes": step.peak_bytes, "reserved_peak_bytes": step.reserved_peak_bytes,
           "step_seconds": statistics.median(times), "compile_seconds": compile_seconds,
           "route": results[-1].plan.get("route") if results else "stock",
           "simulated_activation_peak_after": stats.get("simulated_activation_peak_after")}
    del compiled, trained
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--points", nargs="+", default=list(POINTS))
    parser.add_argument("--out", default=str(CHECKOUT / "benchmarks" / "results" / "gpu"))
    args = parser.parse_args(argv)
    import torch

    from hyper_ac import models

    if not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device here (torch.cuda.is_available() is False); nothing measured",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = models.build("llama", args.layers, hidden=args.hidden, heads=8, max_seq=args.seq,
                         attn_implementation="sdpa").to("cuda")
    batch = {k: v.to("cuda") for k, v in models.example_batch("llama", batch=args.batch, seq=args.seq).items()}
    from benchmarks.cli import base_meta
    from benchmarks.report import provenance_header

    argv = list(argv if argv is not None else sys.argv[1:])
    meta = {**base_meta(argv, code_commit(), machine_load()), "device": torch.cuda.get_device_name(),
            "command": "python -m benchmarks.gpu " + " ".join(argv),
            "shape": {k: getattr(args, k) for k in ("layers", "hidden", "seq", "batch")}}
    rows = []
    for point in args.points:
        try:
            rows.append(measure(point, model, batch, args.steps))
        except Exception as error:  # a point that fails is recorded, the run goes on
            rows.append({"point": point, "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"})
        print(json.dumps(rows[-1]), flush=True)
    stock = next((r for r in rows if r["point"] == "stock" and "error" not in r), None)
    lines = [f"# Llama on {meta['device']} under Inductor", "", *provenance_header(meta), "",
             f"{args.layers} layers, hidden "
             f"{args.hidden}, seq {args.seq}, batch {args.batch}, fp32, sdpa.", "",
             "| point | peak | × stock | reserved | step | × stock | route |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['point']} | fails: {r['error']} | | | | | |")
            continue
        ratio = f"{r['peak_bytes'] / stock['peak_bytes']:.3f}" if stock else "—"
        speed = f"{r['step_seconds'] / stock['step_seconds']:.2f}" if stock else "—"
        lines.append(f"| {r['point']} | {r['peak_bytes'] / 2**20:.1f} MiB | {ratio} | "
                     f"{(r['reserved_peak_bytes'] or 0) / 2**20:.1f} MiB | {r['step_seconds'] * 1e3:.2f} ms | {speed} | "
                     f"{r['route']} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "results.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
