"""Benchmark suite: ``python -m benchmarks [--quick] [--models ...] [--out DIR]`` (from the checkout).

Three parts (benchmarks/README.md explains every column):

1. **step** (``benchmarks.step``): one training step (forward + backward) of
   each model under each strategy — no checkpointing, PyTorch's min-cut
   partitioner (default and with ``activation_memory_budget``), eager
   ``torch.utils.checkpoint`` per layer, and hyper_ac ``full`` /
   ``selective`` / ``auto`` / ``budget`` through ``torch.compile`` — with
   measured peak memory, activation bytes saved for backward, recompute
   FLOPs, step time, planning time, bitwise loss/gradient equality, and the
   simulated peak the core predicts next to the measured one.
2. **scaling** (``benchmarks.scaling``, ``benchmarks.replicate``,
   ``benchmarks.flow``): time to plan the same joint graphs with hyper_ac and
   with PyTorch's ``min_cut_rematerialization_partition`` from ~1k to 100k+
   nodes, the C++ core alone at ~1M nodes, and the core's max-flow against
   ``networkx.minimum_cut`` on the same flow network.
3. **outputs** (``benchmarks.report``): ``results.md``, ``results.csv``,
   ``scaling.csv``, ``flow.csv``, ``frontier_points.json`` and PNG plots under
   ``--out`` (default ``benchmarks/results``; ``--quick`` without ``--out``
   writes to a fresh temporary directory, never over the committed results).

Nothing here asserts a timing: targets are reported as ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import shlex
import sys
import time
import tempfile
import traceback
from pathlib import Path
from typing import Optional

from benchmarks.common import DEFAULT_MODELS, INDUCTOR, TIERS, ModelSpec, hac_strategy_config, QUICK_MODELS, QUICK_STRATEGIES, STRATEGIES, ScalingOptions, _first_line
from benchmarks.step import StepOptions, run_frontier_points, run_step_benchmark
from benchmarks.scaling import run_scaling
from benchmarks.report import STEP_COLUMNS, _write_csv, render_markdown, render_plots
from benchmarks.provenance import code_commit, machine_load
from benchmarks.frontier import SYSTEMS as FRONTIER_SYSTEMS

#: The committed results (results.md, CSVs, plots) a full run writes.
RESULTS_DIR = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one model, few strategies (< 60 s)")
    parser.add_argument("--models", nargs="+", default=None, help=f"models (default: {' '.join(DEFAULT_MODELS)})")
    parser.add_argument("--strategies", nargs="+", default=None, choices=STRATEGIES, metavar="S",
                        help=f"strategies (default: all of {' '.join(STRATEGIES)})")
    parser.add_argument("--out", default=None,
                        help=f"output directory (default {RESULTS_DIR}; with --quick a fresh temporary directory, "
                             "so a smoke run never overwrites the committed results)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="dropout probability of every model (default 0; every strategy draws from the same seed)")
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per cell (median)")
    parser.add_argument("--paired-rounds", type=int, default=10,
                        help="inductor_* cells: rounds of interleaved stock/strategy steps for the step-time ratio "
                             "(median of per-round ratios); 0 reports the ratio of sequential medians")
    parser.add_argument("--parts", nargs="+", default=["step", "scaling"], choices=["step", "scaling", "frontier"],
                        help="step, scaling (the default pair) and/or frontier (issue 24: every memory knob under "
                             "Inductor against hyper_ac; writes OUT/frontier/, or OUT itself when it is the only part "
                             "and --out is given)")
    parser.add_argument("--frontier-systems", nargs="+", default=None, choices=FRONTIER_SYSTEMS, metavar="S",
                        help=f"frontier part: the systems to measure besides stock (default: all of "
                             f"{' '.join(FRONTIER_SYSTEMS)})")
    parser.add_argument("--frontier-points", nargs="+", default=None, metavar="P",
                        help="frontier part: only the points of these names (as the table's point column, e.g. "
                             "'auto (measured)'), stock's always")
    parser.add_argument("--tiers", nargs="+", default=None, choices=list(TIERS), metavar="T",
                        help="frontier part: measure each of these tiers, at its own shape and models ("
                             + "; ".join(f"{name}: {' '.join(tier.models)} at {tier.spec.layers} layers, hidden "
                                         f"{tier.spec.hidden}, seq {tier.spec.seq}, batch {tier.spec.batch}"
                                         for name, tier in TIERS.items())
                             + "), in one run onto one page; --models keeps those of each tier's models")
    parser.add_argument("--frontier-merge", default=None, metavar="DIR",
                        help="frontier part: write DIR's earlier page with this run's rows in place of the same "
                             "points (stock's rows stay DIR's; the header names both commands)")
    parser.add_argument("--captured-layers", nargs="+", type=int, default=None)
    parser.add_argument("--synthetic-layers", nargs="+", type=int, default=None)
    parser.add_argument("--core-nodes", type=int, default=None)
    parser.add_argument("--codegen", nargs="+", choices=["lazy", "eager"], default=None,
                        help="scaling part: GraphModule code generation while timing both sides: lazy (default; "
                             "deferred to the first call, as inside torch.compile) and/or eager (at construction)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: stable timings on a shared machine)")
    parser.add_argument("--fx-runner", choices=["boxed", "plain"], default="boxed",
                        help="compiled strategies run their modules as boxed FX code that frees inputs at last use "
                             "(default, like Inductor) or as the backend's own runner (plain)")
    parser.add_argument("--buffer-reuse", choices=["auto", "inductor", "none"], default=None,
                        help="config key buffer_reuse of every hyper_ac strategy (default: the config's own, auto)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if args.paired_rounds < 0:
        parser.error(f"--paired-rounds must be >= 0, got {args.paired_rounds}")
    if args.tiers:
        if args.parts != ["frontier"]:
            parser.error(f"--tiers is for the frontier part alone (--parts frontier), got --parts {' '.join(args.parts)}")
        shaped = [flag for flag in ("quick", "layers", "hidden", "seq", "batch") if getattr(args, flag)]
        if shaped:
            parser.error(f"--tiers sets each tier's shape: drop {', '.join('--' + f for f in shaped)}, or drop "
                         "--tiers to measure one shape")
        if args.frontier_merge:
            parser.error("--tiers writes a page of its own: drop --frontier-merge")
        known = {m for name in args.tiers for m in TIERS[name].models}
        unknown = [m for m in args.models or () if m not in known]
        if unknown:
            parser.error(f"--models {' '.join(unknown)}: in none of the tiers {' '.join(args.tiers)} "
                         f"(their models: {' '.join(sorted(known))})")
    return args


def frontier_groups(args: argparse.Namespace, spec: ModelSpec, models: tuple) -> list[tuple]:
    """What the frontier part measures, as (tier name or None, shape, models): each tier of
    ``--tiers`` with its models (those of ``--models`` when given), else the one shape."""
    if not args.tiers:
        return [(None, spec, models)]
    groups = []
    for name in dict.fromkeys(args.tiers):
        tier = TIERS[name]
        chosen = tuple(m for m in tier.models if not args.models or m in args.models)
        if chosen:
            groups.append((name, dataclasses.replace(tier.spec, dropout=args.dropout), chosen))
    return groups


def base_meta(argv: list[str], commit: str, load: str) -> dict:
    """The provenance every run's meta.json starts with (command, commit, date, machine, load, versions)."""
    import torch

    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover
        tf_version = "-"
    return {
        "command": "python -m benchmarks " + shlex.join(argv),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU threads, {platform.python_implementation()} "
                   f"{platform.python_version()}",
        "load": load,
        "torch": torch.__version__,
        "transformers": tf_version,
    }


def _run_frontier(args: argparse.Namespace, argv: list[str], spec: ModelSpec, models: tuple, out_dir: Path,
                  commit: str, load: str, log) -> None:
    """The frontier part (benchmarks.frontier) into ``out_dir``: results.md, frontier.csv, plots, meta.json;
    with ``--tiers`` every tier in turn onto the one page."""
    import torch

    from benchmarks.frontier import run_frontier
    from benchmarks.frontier_report import merge_frontier, read_frontier, section, write_frontier

    started = time.perf_counter()
    groups = frontier_groups(args, spec, models)
    meta = {**base_meta(argv, commit, load), "spec": dataclasses.asdict(groups[0][1]), "quick": args.quick,
            "models": [f"{tier}/{m}" if tier else m for tier, _, chosen in groups for m in chosen],
            "systems": list(args.frontier_systems or FRONTIER_SYSTEMS),
            "threads": torch.get_num_threads(), "paired_rounds": args.paired_rounds}
    if args.tiers:
        meta["tiers"] = {name: {"spec": dataclasses.asdict(shape), "models": list(chosen)}
                         for name, shape, chosen in groups}

    base = read_frontier(Path(args.frontier_merge)) if args.frontier_merge else None
    done: list[dict] = []  # the rows of the tiers measured before this one

    def write(rows: list) -> None:  # after each point: a run cut short keeps what it measured
        rows = done + rows
        meta["models_done"] = list(dict.fromkeys(section(r) for r in rows))
        meta["total_seconds"] = time.perf_counter() - started
        page_meta, page_rows = meta, [dict(r) for r in rows]
        if base is not None:
            page_meta, page_rows = merge_frontier(*base, meta, page_rows)
        write_frontier(out_dir, page_meta, page_rows, plots=not (args.no_plots or args.quick), log=log)

    for tier, shape, chosen in groups:
        log(f"frontier: {len(chosen)} model(s)" + (f" of the {tier} tier" if tier else "") +
            f", {shape}, {args.paired_rounds} paired rounds per point")
        done += run_frontier(chosen, StepOptions(shape, paired_rounds=args.paired_rounds), log,
                             args.frontier_systems, on_model=write, point_names=args.frontier_points, tier=tier)
    log(f"wrote {out_dir}/results.md ({meta['total_seconds']:.0f} s)")


def output_dir(args: argparse.Namespace) -> Path:
    """``--out`` when given; else a fresh temporary directory for ``--quick``
    (a smoke run never overwrites the committed results), else :data:`RESULTS_DIR`."""
    if args.out is not None:
        return Path(args.out)
    if args.quick:
        return Path(tempfile.mkdtemp(prefix="hyper_ac_bench_quick_"))
    return RESULTS_DIR


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    args = _parse(argv)
    import torch

    started = time.perf_counter()
    commit, load = code_commit(), machine_load()
    out_dir = output_dir(args)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    torch.manual_seed(0)
    threads_before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        spec = ModelSpec(layers=2, hidden=64, heads=4, seq=32, batch=2)
        models = tuple(args.models or QUICK_MODELS)
        strategies = tuple(args.strategies or QUICK_STRATEGIES)
        timed = 3
        scaling_opts = ScalingOptions(captured_layers=(4,), synthetic_layers=(8,), validate_layers=4,
                                      core_nodes=20_000, flow_layers=(4, 8), networkx_limit_seconds=10,
                                      best_of_small=1, core_repeat=1)
    else:
        spec = ModelSpec()
        models = tuple(args.models or DEFAULT_MODELS)
        strategies = tuple(args.strategies or STRATEGIES)
        timed = 7
        scaling_opts = ScalingOptions()
    spec = ModelSpec(layers=args.layers or spec.layers, hidden=args.hidden or spec.hidden, heads=spec.heads,
                     seq=args.seq or spec.seq, batch=args.batch or spec.batch, dropout=args.dropout)
    if args.captured_layers:
        scaling_opts.captured_layers = tuple(args.captured_layers)
    if args.synthetic_layers:
        scaling_opts.synthetic_layers = tuple(args.synthetic_layers)
    if args.core_nodes:
        scaling_opts.core_nodes = args.core_nodes
    if args.codegen:
        scaling_opts.codegen = tuple(dict.fromkeys(args.codegen))
    # the references run first so every ratio can be computed
    order = [s for s in ("none", "eager", "torch_mincut", "inductor") if s in strategies]
    strategies = tuple(order + [s for s in strategies if s not in order])

    from hyper_ac import memory

    if not memory.is_available():
        log("hyper_ac._memory is not built: peak memory columns stay empty")

    if "frontier" in args.parts:
        frontier_dir = out_dir if args.out is not None and args.parts == ["frontier"] else out_dir / "frontier"
        _run_frontier(args, argv, spec, models, frontier_dir, commit, load, log)
        if args.parts == ["frontier"]:
            torch.set_num_threads(threads_before)
            return 0  # gradients are reported there, not asserted

    step_rows: list[dict] = []
    frontier_points: dict = {}
    if "step" in args.parts:
        log(f"step benchmark: {len(models)} model(s) x {len(strategies)} strategies, {spec}")
        step_opts = StepOptions(spec, timed_steps=args.steps or timed, runner=args.fx_runner,
                                paired_rounds=args.paired_rounds, buffer_reuse=args.buffer_reuse)
        step_rows, extras = run_step_benchmark(models, strategies, step_opts, log)
        frontier_points = run_frontier_points(extras, log)
        del extras
        gc.collect()

    scaling: list[dict] = []
    core_rows: list[dict] = []
    flow_rows: list[dict] = []
    notes: dict = {}
    if "scaling" in args.parts:
        log("planning-time scaling")
        try:
            scaling, core_rows, flow_rows, notes = run_scaling(scaling_opts, log)
        except Exception as exc:
            notes["error"] = _first_line(exc)
            log(f"  scaling failed: {notes['error']}")
            if os.environ.get("HYPER_AC_BENCH_TRACEBACK"):
                traceback.print_exc()

    meta = {**base_meta(argv, commit, load),
        "spec": dataclasses.asdict(spec),
        "quick": args.quick,
        "models": list(models),
        "strategies": list(strategies),
        "threads": torch.get_num_threads(),
        "core_repeat": scaling_opts.core_repeat,
        "fx_runner": args.fx_runner,
        # the core's resolved value (its default when --buffer-reuse is not given)
        "buffer_reuse": hac_strategy_config("inductor_full", args.buffer_reuse).buffer_reuse,
    }
    if step_rows:
        _write_csv(out_dir / "results.csv", step_rows, STEP_COLUMNS)
    if scaling:
        _write_csv(out_dir / "scaling.csv", scaling)
    if core_rows:
        _write_csv(out_dir / "core.csv", core_rows)
    if flow_rows:
        _write_csv(out_dir / "flow.csv", flow_rows)
    if frontier_points:
        with open(out_dir / "frontier_points.json", "w") as f:
            json.dump(frontier_points, f, indent=1, default=str)
    plots = [] if args.no_plots or args.quick else render_plots(
        out_dir, step_rows, frontier_points, scaling, core_rows, log)
    meta["total_seconds"] = time.perf_counter() - started
    meta["notes"] = notes
    meta["plots"] = plots
    (out_dir / "results.md").write_text(render_markdown(
        meta, step_rows, frontier_points, scaling, core_rows, flow_rows, notes))
    with open(out_dir / "meta.json", "w") as f:
        json.dump(meta, f, indent=1, default=str)
    log(f"wrote {out_dir}/results.md ({meta['total_seconds']:.0f} s)")
    print((out_dir / "results.md").read_text())
    torch.set_num_threads(threads_before)
    # Inductor rows are compared with allclose (fusion changes rounding), the rest bitwise.
    failed = [r for r in step_rows if r.get("status") == "ok" and
              (r.get("grads_allclose") is False if r["strategy"] in INDUCTOR else r.get("grads_equal") is False)]
    return 1 if failed else 0
