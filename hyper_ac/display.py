"""Tagged graphs in Jupyter: ``hyper_ac.display.show(gm)`` renders a table.

Reads what the pass left on the nodes (``meta["recompute"]``,
``meta["ac_recomputed_from"]``, ``meta["ac_module_stack"]``); decides nothing.
"""

from __future__ import annotations

import html
from typing import Any, Optional

from torch import fx

__all__ = ["TaggedGraph", "show"]

_COLOURS = {
    "MUST_SAVE": "#f4cccc",
    "PREFER_SAVE": "#fce5cd",
    "MUST_RECOMPUTE": "#c9daf8",
    "PREFER_RECOMPUTE": "#d9ead3",
    "duplicate": "#ead1dc",
}


def _bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
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

    def __init__(self, gm: fx.GraphModule, *, phase: Optional[str] = None, limit: int = 2000) -> None:
        if phase not in (None, "forward", "backward"):
            raise ValueError(f"phase must be 'forward', 'backward' or None, got {phase!r}")
        if not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        self.rows = []
        for node in gm.graph.nodes:
            backward = bool(node.meta.get("autograd_backward", False))
            if phase == "forward" and backward or phase == "backward" and not backward:
                continue
            policy = node.meta.get("recompute")
            stack = node.meta.get("ac_module_stack") or []
            self.rows.append({
                "phase": "B" if backward else "F",
                "name": node.name,
                "op": node.op if node.op != "call_function" else str(getattr(node.target, "__name__", node.target)),
                "module": stack[0][0] if stack else "",
                "policy": getattr(policy, "name", "") if policy is not None else "",
                "duplicate_of": node.meta.get("ac_recomputed_from", ""),
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
            style = f' style="background:{_COLOURS[key]}"' if key in _COLOURS else ""
            cells = (r["phase"], r["name"], r["op"], r["module"], r["policy"], r["duplicate_of"], f"{r['bytes']:,}")
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        summary = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts().items()))
        more = f"<p>... {self.truncated} more nodes</p>" if self.truncated else ""
        return (f"<p><b>hyper_ac</b> — {html.escape(summary)}</p><table><tr>{head}</tr>"
                + "".join(body) + f"</table>{more}")


def show(gm: Any, *, phase: Optional[str] = None, limit: int = 2000) -> TaggedGraph:
    """A displayable view of a (tagged or rewritten) GraphModule or CapturedGraph."""
    gm = getattr(gm, "graph_module", gm)
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"show() needs a torch.fx.GraphModule or a CapturedGraph, got {type(gm).__name__}")
    return TaggedGraph(gm, phase=phase, limit=limit)
