"""Sharded training side by side (``python -m benchmarks.sharded``, issue 36).

Per composition — tensor parallel (``tp``, 2 ranks), sequence parallel (``sp``,
2 ranks) and FSDP2 × TP on a 2 × 2 mesh (``fsdp_tp``, 4 ranks), gloo on
loopback, one torch thread per rank — one training step of a HF Llama
(:func:`hyper_ac.models.parallelize`, sdpa attention) at a shape where
activations set the peak, for every point:

* ``stock``: ``torch.compile`` (Inductor);
* torchtitan's ``apply_ac`` equivalents under Inductor: ``checkpoint_wrapper``
  (every decoder layer, non-reentrant: full AC) and ``sac`` (the same with
  torchtitan's op save-list, :func:`benchmarks.frontier.sac_context_fn`);
  where one of them fails under compile on DTensor, the same wrapper on the
  uncompiled model is measured (``... (no compile)``) and the failure recorded;
* PyTorch's ``activation_memory_budget`` 0.5;
* every hyper_ac mode through ``hyper_ac.backend(..., compiler="inductor")``.

Each point runs on fresh rank processes (a step measured after another point's in
the same processes peaks higher), is compiled on every rank, stepped once (compile and warm-up),
then :data:`TRACKED_STEPS` times under :func:`hyper_ac.memory.track` (the rank's exact CPU
peak, median of the steps: gloo's collective threads allocate too), then
``--steps`` timed steps (median). The table shows, per point, the largest peak
over the ranks and its ratio to stock's, and the median step time over stock's.
Nothing is asserted; ``tests/python/test_sharded.py`` checks correctness.

    python -m benchmarks.sharded [--compositions tp sp fsdp_tp] [--out benchmarks/results/sharded]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import socket
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

WORLD = {"tp": 2, "sp": 2, "fsdp_tp": 4}
POINTS = ("stock", "checkpoint_wrapper", "sac", "torch_budget 0.5", "hyper_ac off", "hyper_ac full",
          "hyper_ac selective", "hyper_ac auto", "hyper_ac budget 0.5")
WRAPPERS = ("checkpoint_wrapper", "sac")
# Steps measured per rank, their median kept: gloo runs collectives on its own threads, whose
# buffers the counting allocator sees too, so one step's peak moves by a few MiB with timing.
TRACKED_STEPS = 3


@dataclasses.dataclass(frozen=True)
class ShardedSpec:
    layers: int = 4
    hidden: int = 512
    intermediate: int = 1376
    heads: int = 8
    vocab: int = 2048
    seq: int = 512
    batch: int = 1


def _build(spec: ShardedSpec):
    from hyper_ac import models

    model = models.hf_model("llama", spec.layers, hidden=spec.hidden, heads=spec.heads, vocab=spec.vocab,
                            max_seq=spec.seq, attn_implementation="sdpa", intermediate_size=spec.intermediate)
    batch = models.example_batch("llama", batch=spec.batch, seq=spec.seq, vocab=spec.vocab)
    return model, batch


def _meshes(composition: str):
    from torch.distributed.device_mesh import init_device_mesh

    if composition == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        return mesh["tp"], mesh["dp"]
    return init_device_mesh("cpu", (WORLD[composition],), mesh_dim_names=("tp",)), None


def _wrapper(point: str) -> Callable:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    from benchmarks.frontier import sac_context_fn

    kwargs = {"context_fn": sac_context_fn(), "preserve_rng_state": False} if point.startswith("sac") else {}
    return lambda layer: checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)


def _prepare(point: str, composition: str, spec: ShardedSpec):
    """(model, the step's callable, config patch for the compile) of one point, freshly built and sharded."""
    import torch
    import torch._functorch.config as functorch_config

    import hyper_ac
    from hyper_ac import models

    model, batch = _build(spec)
    tp_mesh, dp_mesh = _meshes(composition)
    wrap = _wrapper(point) if point.split(" (")[0] in WRAPPERS else None
    models.parallelize(model, tp_mesh, sequence_parallel=composition == "sp", dp_mesh=dp_mesh, wrap_layer=wrap)
    patch: Callable = contextlib.nullcontext
    if point.endswith("(no compile)"):
        return model, batch, model, patch
    if point.startswith("hyper_ac"):
        mode = point.split()[1]
        config = {"ac_mode": mode, **({"ac_memory_budget": 0.5} if mode == "budget" else {})}
        run = torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler="inductor"))
    else:
        if point.startswith("torch_budget"):
            patch = functools.partial(functorch_config.patch, activation_memory_budget=float(point.split()[1]))
        run = torch.compile(model, backend="inductor")
    return model, batch, run, patch


def _measure(point: str, composition: str, spec: ShardedSpec, steps: int) -> dict:
    import gc

    import torch
    import torch._dynamo
    import torch._functorch.config as functorch_config

    from hyper_ac import memory

    torch._dynamo.reset()
    model, batch, run, patch = _prepare(point, composition, spec)

    def step() -> None:
        run(**batch).loss.backward()
        model.zero_grad(set_to_none=True)

    with functorch_config.patch(enable_autograd_cache=False):
        t0 = time.perf_counter()
        with patch():
            step()  # compiles the forward and the backward
        compile_seconds = time.perf_counter() - t0
        gc.collect()
        peaks = []
        for _ in range(TRACKED_STEPS):
            with memory.track() as tracked:
                step()
            peaks.append(tracked.peak_bytes)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    torch._dynamo.reset()
    return {"peak_bytes": int(statistics.median(peaks)), "step_seconds": statistics.median(times),
            "compile_seconds": compile_seconds}


def _worker(composition: str, spec: ShardedSpec, points: tuple, steps: int, rank: int, port: int,
            out_dir: str) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    rows: list = []
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD[composition], timeout=timedelta(seconds=900))
        torch.set_num_threads(1)
        warnings.simplefilter("ignore")
        for point in points:
            row = {"composition": composition, "point": point, "rank": rank, "status": "ok", "error": ""}
            try:
                row.update(_measure(point, composition, spec, steps))
            except Exception as exc:  # recorded; the ranks fail alike, so they stay in step
                row.update(status="error", error=_error_line(exc))
                if os.environ.get("HYPER_AC_BENCH_TRACEBACK"):
                    traceback.print_exc()
            rows.append(row)
            if rank == 0:
                print(f"  {composition} {point}: " + (f"peak {row['peak_bytes'] / 2**20:.1f} MiB, step "
                      f"{row['step_seconds']:.2f} s" if row["status"] == "ok" else row["error"]),
                      file=sys.stderr, flush=True)
        dist.barrier()
    finally:
        Path(out_dir, f"{composition}_rank{rank}.json").write_text(json.dumps(rows))
        if dist.is_initialized():
            dist.destroy_process_group()


def _error_line(exc: BaseException) -> str:
    """The line that says what failed: a compiler failure's inner error (``backend=... raised:``
    is followed by it), else the exception's first line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    inner = next((line for line in lines if "Error:" in line or "Error " in line.split(":")[0]), None)
    return (inner or f"{type(exc).__name__}: {lines[0] if lines else ''}")[:240]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sharded(compositions: tuple, spec: ShardedSpec, steps: int, out_dir: Path,
                points: tuple = POINTS) -> list[dict]:
    """Every point of every composition; one row per (composition, point): the largest peak
    over the ranks, the median step time of rank 0, and each rank's peak."""
    import torch.multiprocessing as mp

    rows: list = []
    for composition in compositions:
        world = WORLD[composition]
        todo = list(points)
        while todo:
            point = todo.pop(0)
            # Fresh ranks per point: a step measured after another point's in the same processes
            # peaked up to 16% higher than the same step measured first (FSDP2 x TP).
            mp.start_processes(functools.partial(_worker, composition, spec, (point,), steps),
                               args=(_free_port(), str(out_dir)), nprocs=world, start_method="spawn")
            entries = [json.loads((out_dir / f"{composition}_rank{r}.json").read_text())[0] for r in range(world)]
            for r in range(world):
                (out_dir / f"{composition}_rank{r}.json").unlink()
            ok = all(e["status"] == "ok" for e in entries)
            rows.append({"composition": composition, "point": point,
                         "status": "ok" if ok else "error",
                         "error": next((e["error"] for e in entries if e["error"]), ""),
                         "peak_bytes": max(e["peak_bytes"] for e in entries) if ok else None,
                         "rank_peaks": [e.get("peak_bytes") for e in entries],
                         "step_seconds": entries[0].get("step_seconds"),
                         "compile_seconds": entries[0].get("compile_seconds")})
            if not ok and point in WRAPPERS:  # stock checkpointing of DTensor under compile: the uncompiled wrapper
                todo.insert(0, f"{point} (no compile)")
    return rows


def report(rows: list[dict], meta: dict) -> str:
    from benchmarks.report import provenance_header

    lines = ["# Sharded training: per-rank peak and step time under Inductor", "",
             *provenance_header(meta), "",
             f"HF Llama, {meta['spec']['layers']} layers, hidden {meta['spec']['hidden']}, MLP "
             f"{meta['spec']['intermediate']}, {meta['spec']['heads']} heads, vocab {meta['spec']['vocab']}, seq "
             f"{meta['spec']['seq']}, batch {meta['spec']['batch']}, fp32, sdpa attention; gloo on loopback, one "
             f"torch thread per rank. Peak: the largest rank's exact CPU peak of a step (`hyper_ac.memory.track`; "
             f"per rank the median of {TRACKED_STEPS} steps: gloo's collective threads allocate too, so a "
             "single step's peak moves with timing); each point on fresh rank processes; step: rank 0's median of the timed steps; both against stock "
             "`torch.compile` (Inductor) of the same composition in the same run.", ""]
    for composition in dict.fromkeys(r["composition"] for r in rows):
        mine = [r for r in rows if r["composition"] == composition]
        stock = next((r for r in mine if r["point"] == "stock" and r["status"] == "ok"), None)
        lines += [f"## {composition} ({WORLD[composition]} ranks)", "",
                  "| point | peak MiB | peak × stock | step s | step × stock | per-rank peaks MiB |",
                  "|---|---|---|---|---|---|"]
        for r in mine:
            if r["status"] != "ok":
                lines.append(f"| {r['point']} | error: {r['error']} | | | | |")
                continue
            peak_ratio = f"{r['peak_bytes'] / stock['peak_bytes']:.3f}" if stock else "-"
            step_ratio = f"{r['step_seconds'] / stock['step_seconds']:.2f}" if stock else "-"
            ranks = ", ".join(f"{p / 2**20:.1f}" for p in r["rank_peaks"])
            lines.append(f"| {r['point']} | {r['peak_bytes'] / 2**20:.1f} | {peak_ratio} | {r['step_seconds']:.2f} "
                         f"| {step_ratio} | {ranks} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[list] = None) -> int:
    from benchmarks.cli import base_meta
    from benchmarks.provenance import code_commit, machine_load

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sharded", description=__doc__.splitlines()[0])
    parser.add_argument("--compositions", nargs="+", choices=list(WORLD), default=list(WORLD))
    parser.add_argument("--points", nargs="+", choices=list(POINTS), default=list(POINTS))
    parser.add_argument("--steps", type=int, default=3, help="timed steps per point (median)")
    for field in dataclasses.fields(ShardedSpec):
        parser.add_argument(f"--{field.name}", type=int, default=field.default)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sharded"))
    args = parser.parse_args(argv)
    spec = ShardedSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ShardedSpec)})
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    meta = base_meta(argv, code_commit(), machine_load())
    meta["command"] = "python -m benchmarks.sharded " + " ".join(argv)
    rows = run_sharded(tuple(args.compositions), spec, args.steps, args.out, tuple(args.points))
    meta.update(spec=dataclasses.asdict(spec), compositions=args.compositions, steps=args.steps,
                total_seconds=time.perf_counter() - started)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
    (args.out / "results.md").write_text(report(rows, meta) + "\n")
    print(report(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
