"""Part 2c: the core's max-flow against ``networkx.minimum_cut`` on the same flow network (built here in Python for now)."""

from __future__ import annotations

import json
import os
import time
import traceback
from typing import Callable, Sequence

from benchmarks.common import (ScalingOptions, _best, _first_line, _progress, _ratio, _solve_seconds, best_plan,
                               cli_timings)

# --------------------------------------------------------------------------
# part 2c: the core's max-flow vs networkx on the same network
# --------------------------------------------------------------------------

_CPU_PEAK_FLOPS = 1.0e11
_CPU_BANDWIDTH = 2.0e10
_LAMBDA = 1.0e10


def build_flow_network(doc: dict, plan: dict, *, lam: float = _LAMBDA, peak_flops: float = _CPU_PEAK_FLOPS,
                       bandwidth: float = _CPU_BANDWIDTH, must_save_ops: Sequence[str] = ()):
    """The min-cut network of docs/mincut.md as a networkx DiGraph.

    Tags come from the core's auto plan (``MUST_SAVE``/untagged: never
    recomputed; ``MUST_RECOMPUTE``, eligible views: never saved); a
    ``PREFER_*`` node whose operator is in the op table's ``must_save`` list
    (tagged ``PREFER_SAVE`` under auto) pays twice for recompute. Recompute
    cost is the cpu-profile roofline times ``lam``; save cost the output
    bytes. Free nodes are left out; zero-cost single-input nodes (views,
    getitem) collapse onto their input, as the core's shrinking does.
    Returns ``(graph, source, sink, info)``; arcs without ``capacity`` are
    infinite.
    """
    import networkx as nx

    nodes = doc["nodes"]
    policies = plan.get("policies", {})
    fwd = [n["phase"] == "forward" for n in nodes]
    nbytes = [sum(o["bytes"] for o in n.get("outputs", [])) for n in nodes]
    output_reads = set()
    read_by_bwd = set()
    for n in nodes:
        if n["kind"] == "output":
            output_reads.update(n["inputs"])
        elif n["phase"] == "backward":
            read_by_bwd.update(i for i in n["inputs"] if fwd[i])

    def base_op(target: str) -> str:
        return target.rsplit(".", 1)[0] if target.count(".") >= 1 and "::" in target else target

    free = [False] * len(nodes)
    for n in nodes:
        i = n["id"]
        if not fwd[i]:
            continue
        if n["kind"] in ("placeholder", "get_attr") or i in output_reads:
            free[i] = True
        elif n.get("aliased_inputs") or n.get("view"):
            positions = n.get("aliased_inputs") or [0]
            free[i] = all(free[n["inputs"][p]] for p in positions if p < len(n["inputs"]))

    def never_recompute(n: dict) -> bool:
        tag = policies.get(n["name"])
        return tag in (None, "MUST_SAVE") or n.get("rng") or bool(n.get("recomputed_from"))

    def never_save(n: dict) -> bool:
        tag = policies.get(n["name"])
        if tag == "MUST_RECOMPUTE":
            return True
        eligible = tag is not None and not never_recompute(n)
        if eligible and n.get("view") and n["target"] != "operator.getitem":
            return True
        return eligible and not n.get("outputs") and not n.get("symint")

    def seconds(n: dict) -> float:
        if n["kind"] != "call_function" or n.get("view") or n["target"] == "operator.getitem" or n.get("symint"):
            return 0.0
        moved = nbytes[n["id"]] + sum(nbytes[i] for i in n["inputs"])
        return max(n.get("flops", 0.0) / peak_flops, moved / bandwidth)

    # candidates: what the backward reads, plus inputs of recomputable candidates
    cand = set()
    stack = [i for i in read_by_bwd if not free[i]]
    while stack:
        i = stack.pop()
        if i in cand or free[i] or not fwd[i]:
            continue
        cand.add(i)
        if not never_recompute(nodes[i]):
            stack.extend(u for u in nodes[i]["inputs"] if fwd[u] and not free[u])

    g = nx.DiGraph()
    S, T = "S", "T"
    vin: dict = {}
    vout: dict = {}
    must_save = set(must_save_ops)
    for i in sorted(cand):
        n = nodes[i]
        net_inputs = [u for u in n["inputs"] if u in cand]
        cost = seconds(n)
        if cost == 0.0 and len(net_inputs) == 1 and not never_recompute(n):
            vin[i] = vout[i] = vout[net_inputs[0]]
            continue
        nr, ns = never_recompute(n), never_save(n)
        a = S if nr else ("in", i)
        b = a if ns else ("out", i)
        vin[i], vout[i] = a, b
        if not nr:
            factor = 2.0 if base_op(n["target"]) in must_save else 1.0
            cap = lam * cost * factor
            g.add_edge(S, a, capacity=max(1, int(round(cap))) if cap > 0 else 0)
        if not ns:
            g.add_edge(a, b, capacity=1 if n.get("symint") else nbytes[i])
        for u in net_inputs:
            if not nr:
                if vout[u] != a:
                    g.add_edge(vout[u], a)  # infinite
    for i in read_by_bwd:
        if i in cand and vout[i] != S:
            g.add_edge(vout[i], T)
    g.add_node(S)
    g.add_node(T)
    info = {"vertices": g.number_of_nodes(), "edges": g.number_of_edges(), "candidates": len(cand),
            "vin": vin, "vout": vout, "bytes": nbytes}
    return g, S, T, info


def recomputed_by_cut(doc: dict, info: dict, source_side: set) -> set:
    """Names of the nodes a cut of :func:`build_flow_network`'s network recomputes (in-vertex on the sink side)."""
    nodes = doc["nodes"]
    return {nodes[i]["name"] for i, a in info["vin"].items() if a != "S" and a not in source_side}


def saved_bytes_of_cut(info: dict, source_side: set) -> int:
    """Bytes saved by a cut of :func:`build_flow_network`'s network (in-vertex on S, out-vertex on T)."""
    total = 0
    for i, a in info["vin"].items():
        b = info["vout"][i]
        if a == b:
            continue  # never saved, or collapsed onto its input
        if (a == "S" or a in source_side) and b not in source_side:
            total += info["bytes"][i]
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
    from hyper_ac.config import op_policy_json
    from hyper_ac.serialize import serialize_graph, to_json

    table = json.loads(op_policy_json())
    must_save_ops = [op.rsplit(".", 1)[0] if "." in op.split("::")[-1] else op for op in table.get("must_save", [])]
    rows = []
    for source, layers, gm, _nfo in _progress(graphs, desc="max-flow", unit="graph"):
        row: dict = {"source": source, "layers": layers, "nodes": len(gm.graph.nodes)}
        try:
            doc = serialize_graph(gm)  # full form: what build_flow_network reads
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
            t0 = time.perf_counter()
            lam = plan.get("stats", {}).get("lambda") or _LAMBDA
            row["lambda"] = lam
            g, s, t, info = build_flow_network(doc, plan, lam=lam, must_save_ops=must_save_ops)
            row["network_build_seconds"] = time.perf_counter() - t0
            row.update({f"network_{k}": info[k] for k in ("vertices", "edges", "candidates")})
            t0 = time.perf_counter()
            cut_value, (reach, _) = nx.minimum_cut(g, s, t)
            row["networkx_seconds"] = time.perf_counter() - t0
            row["networkx_cut_value"] = cut_value
            row["networkx_saved_bytes"] = saved_bytes_of_cut(info, set(reach))
            core_recomputed = {d["of"] for d in plan.get("duplicates", [])}
            nx_recomputed = recomputed_by_cut(doc, info, set(reach))
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


