"""Planning without the memory, checked against real steps (``python -m benchmarks.fake_planning``, issue 38).

Two parts, nothing asserted (``tests/python/test_fake.py`` checks correctness):

* **prediction**: per model (the bench models at the bench shape, and the
  realistic-shape Llama), the joint graph captured on fake tensors
  (:func:`hyper_ac.frontend.fake.capture_fake`), planned by the core in each
  mode; its simulated step peak beside the measured peak of the real step
  (:func:`hyper_ac.memory.measure_step`, the CPU's counting allocator):
  ``off`` against the uncompiled eager step (everything saved), the planned
  modes against ``torch.compile(model, backend=hyper_ac.backend(mode,
  compiler="eager"))``. PyTorch's ``MemTracker`` (``torch.distributed._tools``),
  run on the same fake model eagerly, predicts the eager step; it cannot see a
  compiled plan, so it has an ``off`` figure only. Peaks are of the step alone:
  what existed before it (parameters, the batch) is not counted, gradients are.
* **8B**: ``python -m hyper_ac plan --hf-config examples/hf_configs/llama3_8b.json
  --seq 8192 --dtype bf16 --hardware h100 --device-memory 80GiB`` in a child
  process: its wall time, its peak RSS and its table.

    python -m benchmarks.fake_planning [--models ...] [--no-realistic] [--no-8b] [--out benchmarks/results/fake_planning]
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_MODELS, TIERS, ModelSpec, build_batch, build_model
from benchmarks.provenance import code_commit, machine_load

MODES = ("off", "full", "selective", "auto", "budget 0.5")
REALISTIC = TIERS["realistic"].spec
BENCH = TIERS["bench"].spec
CHECKOUT = Path(__file__).resolve().parent.parent
EIGHT_B = ["--hf-config", str(CHECKOUT / "examples" / "hf_configs" / "llama3_8b.json"), "--seq", "8192",
           "--batch", "1", "--dtype", "bf16", "--hardware", "h100", "--device-memory", "80GiB"]


def _config(mode: str) -> dict:
    if mode.startswith("budget"):
        return {"ac_mode": "budget", "ac_memory_budget": float(mode.split()[1]), "ac_peak_oracle": "off"}
    return {"ac_mode": mode, "ac_peak_oracle": "off"}


def _fake_batch(batch: dict) -> dict:
    import torch

    return {key: torch.zeros_like(value) for key, value in batch.items()}


def _memtracker_eager_peak(name: str, spec: ModelSpec, batch: dict) -> int:
    """MemTracker's peak of the eager step on fake tensors, less the parameters and buffers (not counted as measured)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from hyper_ac.memory import loss_of

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build_model(name, spec)
        fake = _fake_batch(batch)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            loss_of(model(**fake)).backward()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    resident = sum(v for k, v in peak.items() if getattr(k, "value", k) in ("Parameter", "Buffer"))
    return int(peak["Total"] - resident)


def predict(name: str, spec: ModelSpec, modes=MODES) -> list[dict]:
    import torch

    import hyper_ac
    from hyper_ac import memory
    from hyper_ac.frontend.fake import capture_fake

    torch.manual_seed(0)
    model = build_model(name, spec)
    batch = build_batch(name, spec)
    captured = capture_fake(lambda: build_model(name, spec), lambda: _fake_batch(batch))
    graph_json = captured.to_json()
    rows = []
    for mode in modes:
        cfg = _config(mode if mode != "off" else "full")
        stats = hyper_ac.plan(graph_json, cfg, captured.model).stats
        predicted = stats["simulated_activation_peak_autograd" if mode == "off" else "simulated_activation_peak_after"]
        trained = copy.deepcopy(model)
        if mode == "off":
            run = trained
        else:
            run = torch.compile(trained, backend=hyper_ac.backend(cfg, model=trained, compiler="eager"), fullgraph=True)
            memory.loss_of(run(**batch)).backward()  # compile and warm up
        for p in trained.parameters():
            p.grad = None
        measured = memory.measure_step(lambda: run(**batch)).peak_bytes
        row = {"model": name, "shape": f"{spec.layers}x{spec.hidden}, seq {spec.seq}, batch {spec.batch}",
               "mode": mode, "predicted": int(predicted), "measured": int(measured),
               "ratio": predicted / measured}
        if mode == "off":
            try:
                row["memtracker"] = _memtracker_eager_peak(name, spec, batch)
                row["memtracker_ratio"] = row["memtracker"] / measured
            except Exception as error:  # its eager run on fake tensors fails for some models: recorded, not fatal
                row["memtracker_error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch._dynamo.reset()
    return rows


def eight_b() -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hyper_ac", "plan", *EIGHT_B], capture_output=True, text=True,
                          cwd=CHECKOUT)
    wall = time.perf_counter() - t0
    rss = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) * 1024
    return {"command": "python -m hyper_ac plan " + " ".join(a if "/" not in a else Path(a).relative_to(CHECKOUT).as_posix()
                                                             for a in EIGHT_B),
            "returncode": done.returncode, "wall_seconds": wall, "peak_rss_bytes": rss, "stdout": done.stdout}


def _report(meta: dict, rows: list[dict], big: dict | None) -> str:
    from benchmarks.report import provenance_header

    lines = ["# Planning from a config on fake tensors", "", *provenance_header(meta), "",
             "Predicted: the core's simulated step peak of the graph captured on fake tensors. Measured: the real "
             "step on this CPU (counting allocator): `off` uncompiled eager, the rest `hyper_ac.backend(mode, "
             "compiler=\"eager\")`. MemTracker: PyTorch's estimate of the eager, uncheckpointed step, the one "
             "figure it has for a model (it cannot see a compiled plan), set beside every mode's measurement.", "",
             "| model | shape | mode | predicted | measured | predicted / measured | MemTracker / measured |",
             "|---|---|---|---:|---:|---:|---:|"]
    # MemTracker has one figure per model (the eager, uncheckpointed step): set beside every mode's measurement.
    tracked = {(r["model"], r["shape"]): r for r in rows if r["mode"] == "off"}
    for r in rows:
        off = tracked.get((r["model"], r["shape"]), {})
        mt = f"{off['memtracker'] / r['measured']:.4f}" if "memtracker" in off else (
            f"fails: {off['memtracker_error']}" if "memtracker_error" in off else "—")
        lines.append(f"| {r['model']} | {r['shape']} | {r['mode']} | {r['predicted']:,} | {r['measured']:,} | "
                     f"{r['ratio']:.4f} | {mt} |")
    if rows:
        worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
        lines += ["", f"Largest error: {abs(worst['ratio'] - 1) * 100:.2f}% ({worst['model']} {worst['mode']})."]
    if big is not None:
        lines += ["", "## Llama-3-8B shape from its config", "",
                  f"`{big['command']}`: exit {big['returncode']}, {big['wall_seconds']:.1f} s wall, "
                  f"peak RSS {big['peak_rss_bytes'] / 2**30:.2f} GiB.", "", "```", big["stdout"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def regenerate(out: Path) -> str:
    """results.md again from results.json (the report's form changed, the figures did not)."""
    doc = json.loads((out / "results.json").read_text())
    text = _report(json.loads((out / "meta.json").read_text()), doc["rows"], doc["8b"])
    (out / "results.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fake_planning", description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--no-realistic", action="store_true", help="skip the realistic-shape Llama")
    parser.add_argument("--no-8b", action="store_true", help="skip planning the 8B shape")
    parser.add_argument("--out", default=str(CHECKOUT / "benchmarks" / "results" / "fake_planning"))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from benchmarks.cli import base_meta

    argv = list(argv if argv is not None else sys.argv[1:])
    meta = {**base_meta(argv, code_commit(), machine_load()),
            "command": "python -m benchmarks.fake_planning " + " ".join(argv)}
    rows: list[dict] = []
    for name in args.models:
        rows += predict(name, BENCH)
    if not args.no_realistic:
        rows += predict("llama", REALISTIC)
    big = None if args.no_8b else eight_b()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "results.json").write_text(json.dumps({"rows": rows, "8b": big}, indent=1) + "\n")
    (out / "results.md").write_text(_report(meta, rows, big))
    print(_report(meta, rows, big))
    return 0


if __name__ == "__main__":
    sys.exit(main())
