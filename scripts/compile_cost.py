"""What planning with Inductor's dry run adds to a compile: hyper_ac against stock ``torch.compile``.

Per mode, one fresh process with an empty Inductor cache (``TORCHINDUCTOR_CACHE_DIR``
in a new temporary directory): the first training step of a freshly built model is
timed (**cold**: Inductor writes and builds its C++ kernels), then the first step of a
second freshly built model in the same process (**warm**: Inductor's FX graph and
kernel caches hit). hyper_ac's dry runs compile as the real compile will and share
the FX graph cache with it (docs/mincut.md "Measured peaks"): cold, the kept
candidate's real compile loads its dry run's work; warm, the candidates' figures are
remembered from the cold compile (no dry run) and the real compile hits the cache. Each hyper_ac mode compiles through ``hyper_ac.backend(config,
compiler="inductor")``; its row gives the plan's ``oracle_calls`` (candidates asked for),
the dry runs (one Inductor compile each without the C++ builds; a candidate measured
before in the process is answered without one) and whether stock's lower bound
spared stock's dry run. The ratio is the mode's compile over stock's, cold to
cold and warm to warm: the issue-37 goal is compile + plan <= 2x stock's compile.

    python scripts/compile_cost.py --model llama --layers 8 --hidden 512 --seq 512 --batch 2 \\
        --modes stock full auto 'budget 0.5' --out benchmarks/results/compile_cost
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _config(mode: str):
    """None for stock; else the hyper_ac config of ``mode`` (``budget F``: the config's fraction F)."""
    if mode == "stock":
        return None
    if mode.startswith("budget "):
        return {"ac_mode": "budget", "ac_memory_budget": float(mode.split()[1])}
    return {"ac_mode": mode}


def _child(args: argparse.Namespace) -> None:
    """One mode in this process: two compiles (cold, warm), one JSON line on stdout."""
    import torch
    import torch._functorch.config as functorch_config

    import hyper_ac
    from benchmarks.common import ModelSpec, _loss_of, build_batch, build_model

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    spec = ModelSpec(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, batch=args.batch)
    config = _config(args.child)
    seconds, plans, dry_runs = [], [], []
    # The dry runs each compile ran: the core asks for each distinct candidate (`oracle_calls`), and
    # the oracle answers a candidate measured before in this process without one (oracle.measurement_key).
    from hyper_ac.lower import oracle

    measure = oracle.dry_run_peak

    def counted(*a, **k):
        dry_runs[-1] += 1
        return measure(*a, **k)

    oracle.dry_run_peak = counted
    for _ in range(2):
        dry_runs.append(0)
        torch._dynamo.reset()
        model, batch = build_model(args.model, spec), build_batch(args.model, spec)
        if config is None:
            run = torch.compile(model)
        else:
            run = torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler="inductor",
                                                                on_result=lambda r: plans.append(r.plan)))
        with functorch_config.patch(enable_autograd_cache=False):  # as the frontier compiles
            started = time.perf_counter()
            _loss_of(run(**batch)).backward()
            seconds.append(time.perf_counter() - started)
    stats = [p["stats"] for p in plans]
    print(json.dumps({"mode": args.child, "cold_s": seconds[0], "warm_s": seconds[1],
                      "oracle_calls": [s.get("oracle_calls", 0) for s in stats],
                      "dry_runs": dry_runs if config is not None else [],
                      "stock_measured": [s.get("measured_stock_peak", -1) >= 0 for s in stats],
                      "routes": [p.get("route") for p in plans]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)  # benchmarks.common.ModelSpec's, as the realistic tier
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["stock", "full", "auto", "budget 0.5"])
    parser.add_argument("--out", type=Path, default=None, help="write results.md and meta.json here (else stdout only)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    if "stock" not in args.modes:
        raise SystemExit("--modes must include stock: the ratios are to its compile")
    from benchmarks.provenance import code_commit, machine_load

    commit, load = code_commit(), machine_load()
    rows = {}
    for mode in args.modes:
        with tempfile.TemporaryDirectory(prefix="hyper_ac_compile_cost_") as cache:
            command = [sys.executable, __file__, "--child", mode, "--model", args.model, "--layers", str(args.layers),
                       "--hidden", str(args.hidden), "--heads", str(args.heads), "--seq", str(args.seq),
                       "--batch", str(args.batch)]
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{mode}: the child failed ({done.returncode}):\n{done.stderr[-4000:]}")
        rows[mode] = json.loads(lines[-1])
        print(json.dumps(rows[mode]), flush=True)
    import torch
    import transformers

    stock = rows["stock"]
    shape = (f"{args.model}, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, seq {args.seq}, "
             f"batch {args.batch}, fp32, CPU, 1 torch thread")
    argv = " ".join(f"'{a}'" if " " in a else a for a in sys.argv[1:])
    out = [
        "# What planning with Inductor's dry run adds to a compile",
        "",
        f"- command: `python scripts/compile_cost.py {argv}`",
        f"- commit: {commit}",
        f"- date: {time.strftime('%Y-%m-%d')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU threads, CPython {platform.python_version()}; {load}",
        f"- torch {torch.__version__}, transformers {transformers.__version__}",
        "",
        f"{shape}. Per mode one fresh process with an empty Inductor cache: **cold** is the first step of a",
        "fresh model (Inductor builds its C++ kernels), **warm** the first step of a second fresh model in the same",
        "process (Inductor's caches hit; hyper_ac's dry-run figures remembered). Candidates: the plan's",
        "`oracle_calls` (each distinct candidate the core asked the oracle for), in the cold compile, then the",
        "warm one; dry runs: how many of those were compiled and run (a figure measured before in the process is",
        "not); stock dry-run: whether stock was measured for the never-above-stock guard (no: stock's lower bound",
        "sufficed).",
        "",
        "| mode | cold s | cold × stock | warm s | warm × stock | candidates | dry runs | stock dry-run | route |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, row in rows.items():
        calls = ", ".join(str(c) for c in row["oracle_calls"]) or "–"
        dry = ", ".join(str(c) for c in row.get("dry_runs", [])) or "–"
        measured = ", ".join("yes" if m else "no" for m in row["stock_measured"]) or "–"
        routes = ", ".join(r or "?" for r in row["routes"]) or "–"
        out.append(f"| {mode} | {row['cold_s']:.1f} | {row['cold_s'] / stock['cold_s']:.2f}× | {row['warm_s']:.1f} | "
                   f"{row['warm_s'] / stock['warm_s']:.2f}× | {calls} | {dry} | {measured} | {routes} |")
    text = "\n".join(out) + "\n"
    print(text)
    if args.out is not None:
        meta = {"command": f"python scripts/compile_cost.py {argv}", "commit": commit,
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPU threads, CPython {platform.python_version()}",
                "load": load, "torch": torch.__version__, "transformers": transformers.__version__,
                "shape": shape, "rows": rows}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(text)
        (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
