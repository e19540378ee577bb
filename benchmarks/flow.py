"""Part 2c: the core's max-flow against ``networkx.minimum_cut`` on the same flow network (the core's own export,
``_core.flow_network``, so the benchmark restates none of the core's rules)."""

from __future__ import annotations

import json
import os
import time
import traceback
from typing import Callable, Sequence

from benchmarks.common import (ScalingOptions, _best, _first_line, _progress, _ratio, _solve_seconds, best_plan,
                               cli_timings, hac_strategy_config)

# --------------------------------------------------------------------------
# part 2c: the core's max-flow vs networkx on the same network
# --------------------------------------------------------------------------

_LAMBDA = 1.0e10


def parse_dimacs(text: str):
    """The core's exported network (``_core.flow_network``, docs/mincut.md) as a networkx DiGraph.

    Returns ``(graph, source, sink, info)``: capacities as the core's solver
    uses them (infinite arcs carry the written INF value), ``info`` with the
    vertex counts, the ``c vertex`` names (``vin``/``vout``: node name -> vertex)
    and the core's ``c max_flow``.
    """
    import networkx as nx

    g = nx.DiGraph()
    vin: dict = {}
    vout: dict = {}
    max_flow = None
    source = sink = None
    vertices = arcs = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "p":
            vertices, arcs = int(parts[2]), int(parts[3])
            g.add_nodes_from(range(1, vertices + 1))
        elif parts[0] == "n":
            if parts[2] == "s":
                source = int(parts[1])
            else:
                sink = int(parts[1])
        elif parts[0] == "a":
            u, v, cap = int(parts[1]), int(parts[2]), int(parts[3])
            if g.has_edge(u, v):  # parallel arcs add up
                g[u][v]["capacity"] += cap
            else:
                g.add_edge(u, v, capacity=cap)
        elif parts[:2] == ["c", "vertex"]:
            (vin if parts[4] == "in" else vout)[parts[3]] = int(parts[2])
        elif parts[:2] == ["c", "max_flow"]:
            max_flow = int(parts[2])
    if source is None or sink is None:
        raise ValueError("flow network text without 'n V s' / 'n V t' lines")
    info = {"vertices": vertices, "edges": arcs, "candidates": len(vin), "vin": vin, "vout": vout,
            "core_max_flow": max_flow}
    return g, source, sink, info


def recomputed_by_cut(info: dict, source_side: set, source: int) -> set:
    """Names of the nodes a cut recomputes: in-vertex on the sink side (the source is never there)."""
    return {name for name, v in info["vin"].items() if v != source and v not in source_side}


def saved_bytes_of_cut(info: dict, source_side: set, nbytes: dict) -> int:
    """Bytes a cut saves: nodes with the in-vertex on the source side and a distinct out-vertex on the sink side."""
    total = 0
    for name, a in info["vin"].items():
        b = info["vout"][name]
        if a != b and a in source_side and b not in source_side:
            total += nbytes.get(name, 0)
    return total


def run_flow_comparison(graphs: list, opts: ScalingOptions, log: Callable[[str], None]) -> list[dict]:
    """networkx.minimum_cut vs the core on the same min-cut network, per graph.

    The core's solve time alone is not in plan format v1, so three figures
    bound it: the whole ``_core.plan`` (auto), the same minus JSON parsing
    (``_core.graph_summary``: everything the core does after the parse,
    min-cut included — an upper bound on the solve), and the solve itself
    when a plan reports one (``stats.mincut_seconds``).
    """
    import networkx as nx

    from hyper_ac import _core
    from hyper_ac.planning.config import op_policy_json
    from hyper_ac.frontend.serialize import serialize_graph, to_json

    config_json = hac_strategy_config("auto").to_json()
    policy_json = op_policy_json()
    rows = []
    for source, layers, gm, _nfo in _progress(graphs, desc="max-flow", unit="graph"):
        row: dict = {"source": source, "layers": layers, "nodes": len(gm.graph.nodes)}
        try:
            doc = serialize_graph(gm)  # full form: output bytes by node name
            text = to_json(gm)  # the wire form hyper_ac sends the core (same node ids)
            reps = 5 if row["nodes"] < 20_000 else 3
            row["core_parse_seconds"], _ = _best(lambda: _core.graph_summary(text), reps)
            row["core_plan_seconds"], plan = best_plan(text, "auto", reps)
            row["core_after_parse_seconds"] = max(row["core_plan_seconds"] - row["core_parse_seconds"], 1e-6)
            row["core_solve_seconds"] = _solve_seconds(plan)
            timings = cli_timings(text, "auto", reps)
            if timings:
                row.update({f"cli_{k}_seconds": v for k, v in timings.items()})
                if row["core_solve_seconds"] is None:
                    row["core_solve_seconds"] = timings["mincut"]
                    row["core_solve_source"] = "hyper-ac-plan --timings (min-cut stage)"
            row["core_saved_bytes"] = plan.get("stats", {}).get("saved_bytes_after")
            row["lambda"] = plan.get("stats", {}).get("lambda") or _LAMBDA
            t0 = time.perf_counter()
            g, s, t, info = parse_dimacs(_core.flow_network(text, config_json, policy_json))
            row["network_build_seconds"] = time.perf_counter() - t0  # the core's export + parsing the text
            row.update({f"network_{k}": info[k] for k in ("vertices", "edges", "candidates")})
            t0 = time.perf_counter()
            cut_value, (reach, _) = nx.minimum_cut(g, s, t)
            row["networkx_seconds"] = time.perf_counter() - t0
            row["networkx_cut_value"] = cut_value
            row["core_max_flow"] = info["core_max_flow"]
            row["same_flow"] = cut_value == info["core_max_flow"]
            nbytes = {n["name"]: sum(o["bytes"] for o in n.get("outputs", [])) for n in doc["nodes"]}
            row["networkx_saved_bytes"] = saved_bytes_of_cut(info, set(reach), nbytes)
            core_recomputed = {d["of"] for d in plan.get("duplicates", [])}
            nx_recomputed = recomputed_by_cut(info, set(reach), s)
            row["core_recomputed"] = len(core_recomputed)
            row["networkx_recomputed"] = len(nx_recomputed)
            row["same_cut"] = core_recomputed == nx_recomputed
            row["networkx_vs_core_solve"] = _ratio(row["networkx_seconds"], row["core_solve_seconds"])
            row["networkx_vs_core_after_parse"] = _ratio(row["networkx_seconds"], row["core_after_parse_seconds"])
            row["networkx_vs_core_plan"] = _ratio(row["networkx_seconds"], row["core_plan_seconds"])
            log(f"  max-flow on {info['vertices']} vertices: networkx {row['networkx_seconds']:.3f} s; core plan "
                f"{row['core_plan_seconds'] * 1e3:.0f} ms, after parse {row['core_after_parse_seconds'] * 1e3:.0f} ms, "
                f"min-cut {row['core_solve_seconds'] * 1e3 if row['core_solve_seconds'] else float('nan'):.2f} ms")
        except Exception as exc:
            row["error"] = _first_line(exc)
            log(f"  flow comparison on {row['nodes']} nodes: {row['error']}")
            if os.environ.get("HYPER_AC_BENCH_TRACEBACK"):
                traceback.print_exc()
        rows.append(row)
        if row.get("networkx_seconds", 0) > opts.networkx_limit_seconds:
            break
    return rows


