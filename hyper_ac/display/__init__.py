"""Tagged graphs in Jupyter.

* ``show(gm)``: a picture of the graph collapsed per top-level module (or of
  one ``unit=``) coloured by policy, above a collapsible table (phase, name,
  op, module, policy, duplicate-of, bytes);
* ``draw(gm, unit="layers.0")``: the picture alone (SVG through Graphviz ``dot``);
* ``memory(captured, config)``: live bytes over the training step before vs
  after a plan, with its stats;
* ``frontier(graph, config)`` (also ``hyper_ac.frontier``): the memory / recompute
  frontier across λ as an inline plot; ``Frontier(points)`` wraps a list of its points.

Reads what the pass left on the nodes (``meta["recompute"]``,
``meta["ac_recomputed_from"]``, ``meta["ac_module_stack"]``) and the core's
plan; decides nothing.
"""

from __future__ import annotations

import html
from typing import Any, Optional

from torch import fx

from hyper_ac import fx_meta
from hyper_ac.display.svg import COLOURS, GraphPicture, draw as _draw, units
from hyper_ac.display.timeline import Frontier, MemoryTimeline, frontier, memory

__all__ = ["COLOURS", "Frontier", "GraphPicture", "MemoryTimeline", "TaggedGraph", "draw", "frontier", "memory",
           "show", "units"]


def _bytes(node: fx.Node) -> int:
    val = fx_meta.val(node)
    values = val if isinstance(val, (tuple, list)) else [val]
    total = 0
    for v in values:
        if hasattr(v, "untyped_storage") and hasattr(v, "numel"):
            try:
                total += int(v.numel()) * v.element_size()
            except Exception:  # symbolic sizes without a hint
                pass
    return total


class TaggedGraph:
    """One row per node: phase, name, op, module, policy, duplicate-of, bytes."""

    def __init__(self, gm: fx.GraphModule, *, phase: Optional[str] = None, limit: int = 2000,
                 picture: bool = True, unit: Optional[str] = None) -> None:
        if phase not in (None, "forward", "backward"):
            raise ValueError(f"phase must be 'forward', 'backward' or None, got {phase!r}")
        if not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self.graph_module = gm
        self.phase = phase
        self.picture = picture
        self.unit = unit
        if unit is not None:
            _draw(gm, unit, phase=phase)  # a bad unit fails here, not at display time
        self.rows = []
        for node in gm.graph.nodes:
            backward = fx_meta.is_backward(node)
            if phase == "forward" and backward or phase == "backward" and not backward:
                continue
            policy = fx_meta.policy(node)
            stack = fx_meta.module_stack(node)
            self.rows.append({
                "phase": "B" if backward else "F",
                "name": node.name,
                "op": node.op if node.op != "call_function" else str(getattr(node.target, "__name__", node.target)),
                "module": stack[0][0] if stack else "",
                "policy": getattr(policy, "name", "") if policy is not None else "",
                "duplicate_of": fx_meta.recomputed_from(node) or "",
                "bytes": _bytes(node),
            })
        self.truncated = max(0, len(self.rows) - limit)
        self.rows = self.rows[:limit]

    def counts(self) -> dict:
        out: dict = {}
        for row in self.rows:
            key = "duplicate" if row["duplicate_of"] else (row["policy"] or "untagged")
            out[key] = out.get(key, 0) + 1
        return out

    def __repr__(self) -> str:
        lines = [f"{r['phase']} {r['name']:<32} {r['op']:<28} {r['policy']:<17} {r['module']}"
                 + (f"  (dup of {r['duplicate_of']})" if r["duplicate_of"] else "") for r in self.rows]
        if self.truncated:
            lines.append(f"... {self.truncated} more nodes")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("", "name", "op", "module", "policy", "duplicate of", "bytes"))
        body = []
        for r in self.rows:
            key = "duplicate" if r["duplicate_of"] else r["policy"]
            style = f' style="background:{COLOURS[key]}"' if key in COLOURS else ""
            cells = (r["phase"], r["name"], r["op"], r["module"], r["policy"], r["duplicate_of"], f"{r['bytes']:,}")
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        summary = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts().items()))
        more = f"<p>... {self.truncated} more nodes</p>" if self.truncated else ""
        table = f"<table><tr>{head}</tr>" + "".join(body) + f"</table>{more}"
        return (f"<p><b>hyper_ac</b> — {html.escape(summary)}</p>{self._picture_html()}"
                f"<details><summary>table: {len(self.rows)} nodes</summary>{table}</details>")

    def draw(self) -> GraphPicture:
        """The picture: ``unit`` node by node, or the whole graph collapsed per top-level module."""
        return _draw(self.graph_module, self.unit, phase=self.phase)

    def _picture_html(self) -> str:
        if not self.picture:
            return ""
        try:
            return self.draw()._repr_html_()
        except RuntimeError as exc:  # Graphviz missing: the table still shows, with the reason
            return f"<p style='color:#b2182b'>No picture: {html.escape(str(exc))}</p>"


def _graph_module(gm: Any, what: str) -> fx.GraphModule:
    gm = getattr(gm, "graph_module", gm)
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"{what}() needs a torch.fx.GraphModule or a CapturedGraph, got {type(gm).__name__}")
    return gm


def show(gm: Any, *, phase: Optional[str] = None, limit: int = 2000, unit: Optional[str] = None,
         picture: bool = True) -> TaggedGraph:
    """A displayable view of a (tagged or rewritten) GraphModule or CapturedGraph: the picture
    (``unit`` node by node, else the whole graph collapsed per top-level module) and the table.
    ``picture=False`` shows the table alone (no Graphviz needed)."""
    return TaggedGraph(_graph_module(gm, "show"), phase=phase, limit=limit, picture=picture, unit=unit)


def draw(gm: Any, unit: Optional[str] = None, *, phase: Optional[str] = None, max_nodes: int = 400) -> GraphPicture:
    """An SVG picture of ``unit`` (e.g. ``"layers.0"``) node by node, or of the whole graph collapsed
    per top-level module, coloured by policy; saved edges red, recomputed copies dashed purple.
    Needs Graphviz ``dot``."""
    return _draw(_graph_module(gm, "draw"), unit, phase=phase, max_nodes=max_nodes)
