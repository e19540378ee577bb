"""Part 2: planning time against graph size (hyper_ac vs PyTorch's min-cut partitioner), and the C++ core alone at ~1M nodes."""

from __future__ import annotations

import gc
import json
import math
import time
from typing import Any, Callable

from benchmarks.common import (ScalingOptions, _best, _first_line, _progress, _quiet, _ratio, _solve_seconds, best_plan,
                               cli_timings, hac_config)
from benchmarks.replicate import _summary, replicate_layers, replicate_layers_json, same_structure
from benchmarks.flow import run_flow_comparison
from hyper_ac import fx_meta
from hyper_ac._fx import copy_graph_module

# --------------------------------------------------------------------------
# part 2b: planning time vs graph size
# --------------------------------------------------------------------------



def _capture_transformer(layers: int, dim: int, seq: int):
    import torch

    from hyper_ac.frontend.capture import capture_joint
    from hyper_ac.models import build

    model = build("transformer", layers, dim=dim, heads=4, max_seq=seq)
    ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(0))
    with _quiet():
        return capture_joint(model, ids, ids)


#: How the timed steps generate the Python code of the GraphModules they build.
#: ``lazy``: as inside ``torch.compile`` (``torch._dynamo.config.use_lazy_graph_module``, on by
#: default; dynamo and Inductor's ``compile_fx`` run under ``_use_lazy_graph_module(True)``), code
#: generation is deferred to the module's first call, which the timing leaves out on both sides.
#: ``eager``: every new module generates its code when built (plain ``fx.GraphModule``).
CODEGEN_MODES = ("lazy", "eager")


def _codegen(codegen: str):
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    if codegen not in CODEGEN_MODES:
        raise ValueError(f"codegen must be one of {', '.join(CODEGEN_MODES)}, got {codegen!r}")
    return _use_lazy_graph_module(codegen == "lazy")


def time_torch_mincut(gm, num_fwd_outputs: int, codegen: str = "lazy") -> float:
    """``min_cut_rematerialization_partition`` on a copy of ``gm`` (decide + split), under ``codegen``."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    g = copy_graph_module(gm)
    with _quiet(), _codegen(codegen):
        t0 = time.perf_counter()
        min_cut_rematerialization_partition(g, None, num_fwd_outputs=num_fwd_outputs)
        return time.perf_counter() - t0


def time_hyper_ac(gm, num_fwd_outputs: int, mode: str = "auto", codegen: str = "lazy") -> dict:
    """hyper_ac end to end on an annotated joint graph: serialise, core plan, apply, split; both splits.
    Every step under ``codegen`` (:data:`CODEGEN_MODES`), as :func:`time_torch_mincut`.

    ``split: torch`` (``hac_*``): plan, apply, then ``partition_joint`` with PyTorch's
    ``_extract_fwd_bwd_modules``. ``split: native`` (``hac_native_*``): the plan with the core's
    split (``hyper_ac.plan(..., with_split=True)``), apply, then ``partition_joint(..., split=...)``,
    which builds both modules in one pass. Each on its own copy of the graph.
    """
    import hyper_ac
    from hyper_ac.lower.apply import apply_plan
    from hyper_ac.lower.partition import partition_joint

    config = hac_config(mode)
    g = copy_graph_module(gm)
    with _quiet(), _codegen(codegen):
        t0 = time.perf_counter()
        result = hyper_ac.plan(g, config)
        t2 = time.perf_counter()
        plan = result.plan
        # as the backend does: no recompile of the joint before the partition builds new modules
        apply_plan(g, plan, recompile=False)
        t3 = time.perf_counter()
        partition_joint(g, None, num_fwd_outputs=num_fwd_outputs)
        t4 = time.perf_counter()
    del g
    g = copy_graph_module(gm)
    with _quiet(), _codegen(codegen):
        n0 = time.perf_counter()
        native = hyper_ac.plan(g, config, with_split=True)
        n2 = time.perf_counter()
        apply_plan(g, native.plan, recompile=False)
        n3 = time.perf_counter()
        partition_joint(g, None, num_fwd_outputs=num_fwd_outputs, split=native.split)
        n4 = time.perf_counter()
    return {"hac_serialize_seconds": result.serialize_seconds, "hac_core_seconds": result.plan_seconds,
            "hac_apply_seconds": t3 - t2,
            "hac_partition_seconds": t4 - t3, "hac_seconds": t3 - t0, "hac_with_partition_seconds": t4 - t0,
            "hac_native_core_seconds": native.plan_seconds, "hac_native_split_seconds": n4 - n3,
            "hac_native_seconds": n4 - n0,
            "hac_mode": mode, "codegen": codegen,
            "hac_duplicated": plan.get("stats", {}).get("nodes_duplicated")}


def _repeats(opts: ScalingOptions, nodes: int) -> int:
    """Best of 3 below 20k nodes (cheap, and the machine is shared), one run above."""
    return max(opts.repeat, opts.best_of_small if nodes < 20_000 else 1)


def run_scaling(opts: ScalingOptions, log: Callable[[str], None]) -> tuple[list[dict], list[dict], list[dict], dict]:
    """(scaling rows, core-only rows, flow rows, notes)."""
    notes: dict = {}
    graphs: list[tuple[str, int, Any, int]] = []  # (source, layers, gm, num_fwd_outputs)
    t0 = time.perf_counter()
    template = _capture_transformer(opts.template_layers, opts.dim, opts.seq)
    notes["template_capture_seconds"] = time.perf_counter() - t0
    for layers in _progress(list(opts.captured_layers), desc="capture", unit="graph"):
        t0 = time.perf_counter()
        cap = _capture_transformer(layers, opts.dim, opts.seq)
        log(f"  captured {layers} layers: {cap.num_nodes} nodes in {time.perf_counter() - t0:.1f} s")
        graphs.append(("captured", layers, cap.graph_module, cap.num_fwd_outputs))
        if layers == opts.validate_layers:
            synth = replicate_layers(template.graph_module, template.num_fwd_outputs, layers)
            notes["synthetic_matches_captured"] = {
                "layers": layers, "nodes": len(synth.graph.nodes),
                "same_structure": same_structure(synth, cap.graph_module) and _summary(synth) == _summary(cap.graph_module)}
    for layers in opts.synthetic_layers:
        t0 = time.perf_counter()
        gm = replicate_layers(template.graph_module, template.num_fwd_outputs, layers)
        log(f"  synthesised {layers} layers: {len(gm.graph.nodes)} nodes in {time.perf_counter() - t0:.1f} s")
        graphs.append(("synthetic", layers, gm, template.num_fwd_outputs))

    rows: list[dict] = []
    torch_too_slow = {codegen: False for codegen in opts.codegen}
    notes["codegen"] = list(opts.codegen)
    cases = [(g, codegen) for g in graphs for codegen in opts.codegen]
    for (source, layers, gm, nfo), codegen in _progress(cases, desc="plan-time", unit="graph"):
        row: dict = {"source": source, "layers": layers, "nodes": len(gm.graph.nodes), "codegen": codegen}
        for mode in ("auto", "selective"):
            try:
                runs = [time_hyper_ac(gm, nfo, mode, codegen) for _ in range(_repeats(opts, row["nodes"]))]
                best = dict(runs[0])
                for key in runs[0]:
                    if key.endswith("_seconds"):
                        best[key] = min(r[key] for r in runs)  # each part's best run
                row.update(best)
                break
            except Exception as exc:
                row["hac_error"] = f"{mode}: {_first_line(exc)}"
                log(f"  hyper_ac {mode} on {row['nodes']} nodes: {row['hac_error']}")
        if torch_too_slow[codegen]:
            row["torch_error"] = f"skipped (an earlier size took > {opts.torch_limit_seconds:.0f} s)"
        else:
            try:
                row["torch_seconds"] = min(time_torch_mincut(gm, nfo, codegen)
                                           for _ in range(_repeats(opts, row["nodes"])))
                torch_too_slow[codegen] = row["torch_seconds"] > opts.torch_limit_seconds
            except Exception as exc:
                row["torch_error"] = _first_line(exc)
                log(f"  torch min-cut on {row['nodes']} nodes: {row['torch_error']}")
        row["speedup"] = _ratio(row.get("torch_seconds"), row.get("hac_seconds"))
        row["speedup_with_partition"] = _ratio(row.get("torch_seconds"), row.get("hac_with_partition_seconds"))
        row["speedup_native_split"] = _ratio(row.get("torch_seconds"), row.get("hac_native_seconds"))
        row["core_speedup"] = _ratio(row.get("torch_seconds"), row.get("hac_core_seconds"))
        log(f"  {row['nodes']:>7} nodes, {codegen} codegen: torch {row.get('torch_seconds', float('nan')):.2f} s, "
            f"hyper_ac {row.get('hac_seconds', float('nan')):.2f} s (core {row.get('hac_core_seconds', float('nan')):.3f} s); "
            f"incl. split: torch's {row.get('hac_with_partition_seconds', float('nan')):.2f} s "
            f"({row.get('speedup_with_partition') or float('nan'):.1f}x), native "
            f"{row.get('hac_native_seconds', float('nan')):.2f} s ({row.get('speedup_native_split') or float('nan'):.1f}x)")
        rows.append(row)

    core_rows = run_core_only(template, opts, log)
    flow_rows = run_flow_comparison([g for g in graphs if g[1] in opts.flow_layers], opts, log)
    return rows, core_rows, flow_rows, notes


_NODE_DEFAULTS = {
    "flops": 0.0, "rng": False, "symint": False, "collective": False, "view": False, "mutated_inputs": [],
    "aliased_inputs": [], "role": "activation", "subgraph": False, "policy": None, "recomputed_from": None,
    "module_stack": [],
}


def lean_document(doc: dict) -> dict:
    """The same graph without node fields at their documented defaults (docs/graph-format.md)."""
    nodes = []
    for n in doc["nodes"]:
        nodes.append({k: v for k, v in n.items() if k not in _NODE_DEFAULTS or v != _NODE_DEFAULTS[k]})
    out = dict(doc)
    out["nodes"] = nodes
    return out


def run_core_only(template, opts: ScalingOptions, log: Callable[[str], None]) -> list[dict]:
    """The C++ core alone on a ~``core_nodes`` graph JSON built in Python (replicated layers)."""
    from hyper_ac import _core
    from hyper_ac.frontend.serialize import serialize_graph

    rows: list[dict] = []
    doc = serialize_graph(template.graph_module)
    acc = [i for i, n in enumerate(template.graph_module.graph.nodes) if fx_meta.is_gradient_acc(n)]
    base = len(doc["nodes"])
    per_layer = len(replicate_layers_json(doc, opts.template_layers + 1, acc)["nodes"]) - base
    k = max(opts.template_layers, opts.template_layers + int(math.ceil((opts.core_nodes - base) / max(per_layer, 1))))
    t0 = time.perf_counter()
    from hyper_ac.frontend import serialize

    wire = getattr(serialize, "compact", lean_document)  # the form to_json sends the core
    big = wire(replicate_layers_json(doc, k, acc))
    text = json.dumps(big, separators=(",", ":"))
    build_seconds = time.perf_counter() - t0
    n = len(big["nodes"])
    del big
    gc.collect()
    row: dict = {"nodes": n, "layers": k, "json_mb": len(text) / 1e6, "build_seconds": build_seconds}
    log(f"  core-only graph: {n} nodes, {row['json_mb']:.0f} MB JSON, built in {build_seconds:.1f} s")
    try:  # the loaders against json.loads of the same bytes, in this run (benchmarks/loading.py)
        from benchmarks.loading import measure_loading_text

        row.update({k: v for k, v in measure_loading_text(text, opts.core_repeat).items() if k != "json_mb"})
    except Exception as exc:
        row["loading_error"] = _first_line(exc)
    try:  # from graph bytes to plan bytes: the CLI and the Python route (benchmarks/plan_output.py)
        from benchmarks.plan_output import measure_plan_output_text

        row.update({f"plan_output_{k}" if k == "json_loads_seconds" else k: v
                    for k, v in measure_plan_output_text(text, opts.core_repeat).items()
                    if k not in ("json_mb", "mode", "repeat")})
    except Exception as exc:
        row["plan_output_error"] = _first_line(exc)
    try:
        row["parse_seconds"], summary = _best(lambda: _core.graph_summary(text), opts.core_repeat)
        row["forward_nodes"] = summary.get("forward_nodes")
    except Exception as exc:
        row["parse_error"] = _first_line(exc)
    for mode in opts.core_modes:
        try:
            seconds, plan = best_plan(text, mode, opts.core_repeat)
            row[f"{mode}_seconds"] = seconds
            stats = plan.get("stats", {})
            row[f"{mode}_duplicated"] = stats.get("nodes_duplicated")
            solve = _solve_seconds(plan)
            if solve is not None:
                row[f"{mode}_mincut_seconds"] = solve
            del plan
        except Exception as exc:
            row[f"{mode}_error"] = _first_line(exc)
            log(f"  core {mode} on {n} nodes: {row[f'{mode}_error']}")
    try:
        timings = cli_timings(text, "auto", opts.core_repeat)
    except Exception as exc:  # the CLI is optional
        timings = None
        row["cli_error"] = _first_line(exc)
    if timings:
        row.update({f"cli_{k}_seconds": v for k, v in timings.items()})
    if row.get("cli_total_seconds") is not None and row.get("json_loads_seconds"):
        # The issue-13 target: the CLI's load + plan from the bytes against json.loads of them.
        row["cli_load_plus_plan_vs_json_loads"] = (row["cli_load_seconds"] + row["cli_total_seconds"]) / row["json_loads_seconds"]
    for mode in ("selective", "auto"):
        if row.get(f"{mode}_seconds") is not None and row.get("parse_seconds") is not None:
            row[f"{mode}_minus_parse_seconds"] = row[f"{mode}_seconds"] - row["parse_seconds"]
    rows.append(row)
    log(f"  loading at {n} nodes: fast {row.get('load_fast_seconds', float('nan')):.2f} s, reference "
        f"{row.get('load_reference_seconds', float('nan')):.2f} s, json.loads {row.get('json_loads_seconds', float('nan')):.2f} s")
    log(f"  core at {n} nodes: parse {row.get('parse_seconds', float('nan')):.2f} s, "
        f"auto plan {row.get('auto_seconds', float('nan')):.2f} s, selective {row.get('selective_seconds', float('nan')):.2f} s")
    return rows


