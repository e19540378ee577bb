"""Pictures of tagged graphs: Graphviz ``dot`` source built from the FX nodes, rendered to SVG.

Reads what the pass left on the nodes (``meta["recompute"]``,
``meta["ac_recomputed_from"]``, ``meta["ac_module_stack"]``,
``meta["autograd_backward"]``); decides nothing. Two views:

* a **unit** (``unit="layers.0"``): every node whose module stack names that
  module or one below it, one box per node, forward and backward side by side;
* the **whole graph collapsed per unit**: one box per (top-level module, phase)
  with its node counts per policy, for graphs too large to draw node by node.

A *saved edge* is a forward value read by a backward node (what the forward
hands the backward); it is drawn thick and red, and its producer gets a double
border. A *duplicate* (a recomputed copy made by the rewrite) is purple with a
dashed border and names its original.
"""

from __future__ import annotations

import html
import shutil
import subprocess
from collections import Counter, defaultdict
from typing import Optional

from torch import fx

from hyper_ac import fx_meta
__all__ = ["COLOURS", "POLICIES", "GraphPicture", "draw", "unit_of", "units"]

# One palette for the table, the pictures and the legends: reds save, blues
# recompute; MUST is the strong shade, PREFER the light one.
POLICIES = ("MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE")
COLOURS = {
    "MUST_SAVE": "#e8836b",
    "PREFER_SAVE": "#fbd3c0",
    "MUST_RECOMPUTE": "#5b9bd5",
    "PREFER_RECOMPUTE": "#cfe2f3",
    "untagged": "#f2f2f2",
    "duplicate": "#c9a7d8",
}
SAVED_EDGE = "#b2182b"
_EXTERNAL = "#9e9e9e"


def _dot_binary() -> str:
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError(
            "Graphviz 'dot' was not found on PATH; the graph picture needs it. Install Graphviz "
            "(Debian/Ubuntu: apt-get install graphviz; scripts/install-deps.sh does this; macOS: brew install "
            "graphviz), or use hyper_ac.display.show(..., picture=False) for the table alone."
        )
    return dot


def render_svg(dot_source: str, *, timeout: float = 60.0) -> str:
    """Run ``dot -Tsvg`` on ``dot_source``; the SVG text (without the XML prologue)."""
    proc = subprocess.run([_dot_binary(), "-Tsvg"], input=dot_source.encode(), capture_output=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"Graphviz 'dot' failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace').strip()}")
    svg = proc.stdout.decode()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def policy_key(node: fx.Node) -> str:
    """``duplicate``, a policy name, or ``untagged``."""
    if fx_meta.is_duplicate(node):
        return "duplicate"
    policy = fx_meta.policy(node)
    return getattr(policy, "name", None) or "untagged"


def unit_of(node: fx.Node) -> str:
    """The top-level module a node belongs to (outermost entry of its module stack), or ``""``."""
    stack = fx_meta.module_stack(node)
    return stack[-1][0] if stack else ""


def _in_unit(node: fx.Node, unit: str) -> bool:
    for fqn, _type in fx_meta.module_stack(node):
        if fqn == unit or fqn.startswith(unit + "."):
            return True
    return False


def _is_saved_edge(producer: fx.Node, consumer: fx.Node) -> bool:
    return not fx_meta.is_backward(producer) and fx_meta.is_backward(consumer) and producer.op not in ("placeholder", "get_attr")


def _op_label(node: fx.Node) -> str:
    if node.op == "call_function":
        name = str(getattr(node.target, "__name__", node.target))
        return name.replace(".default", "")
    if node.op in ("placeholder", "output", "get_attr"):
        return node.op
    return f"{node.op} {node.target}"


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _legend(counts: Counter, *, saved_values: int) -> str:
    rows = []
    for key in (*POLICIES, "untagged", "duplicate"):
        style = ' STYLE="dashed"' if key == "duplicate" else ""
        rows.append(f'<TR><TD BGCOLOR="{COLOURS[key]}" WIDTH="18"{style}></TD>'
                    f'<TD ALIGN="LEFT">{key.lower().replace("_", " ")} ({counts.get(key, 0)})</TD></TR>')
    rows.append(f'<TR><TD><FONT COLOR="{SAVED_EDGE}"><B>&#8594;</B></FONT></TD>'
                f'<TD ALIGN="LEFT">saved: forward value read by the backward ({saved_values} values)</TD></TR>')
    return ('legend [shape=plaintext, style="", label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">'
            '<TR><TD COLSPAN="2"><B>hyper_ac policy</B></TD></TR>' + "".join(rows) + "</TABLE>>];")


class GraphPicture:
    """A drawing of a tagged graph: ``.dot`` (Graphviz source), ``.svg`` (rendered on first use)."""

    def __init__(self, dot: str, *, title: str, counts: Counter, saved_edges: int, nodes: int) -> None:
        self.dot = dot
        self.title = title
        self.counts = counts
        self.saved_edges = saved_edges
        self.nodes = nodes
        self._svg: Optional[str] = None

    @property
    def svg(self) -> str:
        if self._svg is None:
            self._svg = render_svg(self.dot)
        return self._svg

    def save(self, path: str) -> None:
        """Write the SVG to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            f.write('<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + self.svg)

    def _repr_svg_(self) -> str:
        return self.svg

    def _repr_html_(self) -> str:
        return (f'<div style="max-width:100%;overflow:auto;max-height:1400px"><p><b>{html.escape(self.title)}</b></p>'
                f"{self.svg}</div>")

    def __repr__(self) -> str:
        return f"<GraphPicture {self.title!r}: {self.nodes} boxes, {self.saved_edges} saved edges>"


def _graph_header(title: str) -> list[str]:
    return [
        "digraph hyper_ac {",
        f"  graph [rankdir=TB, fontname=Helvetica, fontsize=12, labelloc=t, label={_q(title)}, "
        "nodesep=0.15, ranksep=0.3, newrank=true];",
        '  node [fontname=Helvetica, fontsize=9, shape=box, style="filled,rounded", height=0.25, margin="0.06,0.03"];',
        '  edge [color="#777777", arrowsize=0.5];',
    ]


def draw_unit(gm: fx.GraphModule, unit: str, *, phase: Optional[str] = None, max_nodes: int = 400) -> GraphPicture:
    nodes = [n for n in gm.graph.nodes if _in_unit(n, unit)
             and (phase is None or (phase == "backward") == fx_meta.is_backward(n))]
    if not nodes:
        units = sorted({unit_of(n) for n in gm.graph.nodes} - {""})
        raise ValueError(f"no node belongs to unit {unit!r}; units in this graph: {units}")
    if len(nodes) > max_nodes:
        raise ValueError(f"unit {unit!r} has {len(nodes)} nodes, more than max_nodes={max_nodes}; "
                         "pick a smaller unit (e.g. a submodule), a phase, or raise max_nodes")
    inside = set(nodes)
    counts = Counter(policy_key(n) for n in nodes)
    lines = _graph_header(f"unit {unit} — {len(nodes)} nodes")
    saved = 0
    externals: dict[fx.Node, None] = {}
    for label, backward in (("forward", False), ("backward (recomputed copies in purple)", True)):
        members = [n for n in nodes if fx_meta.is_backward(n) == backward]
        if not members:
            continue
        lines.append(f"  subgraph cluster_{'bwd' if backward else 'fwd'} {{ label={_q(label)}; "
                     'style="rounded,dashed"; color="#bbbbbb"; fontsize=11;')
        for n in members:
            key = policy_key(n)
            op = _op_label(n)
            text = n.name if n.name.rstrip("0123456789").rstrip("_") == op.split(".")[0] else f"{n.name}\n{op}"
            attrs = [f"fillcolor={_q(COLOURS[key])}"]
            if key == "duplicate":
                text += f"\n(copy of {fx_meta.recomputed_from(n)})"
                attrs.append('style="filled,dashed"')
                attrs.append("penwidth=1.5")
            if any(_is_saved_edge(n, u) for u in n.users):
                attrs.append("peripheries=2")
                attrs.append(f"color={_q(SAVED_EDGE)}")
            attrs.append(f"tooltip={_q(f'{n.name}: {key}')}")
            lines.append(f"    {_q(n.name)} [label={_q(text)}, {', '.join(attrs)}];")
        lines.append("  }")
    edges = []
    for n in nodes:
        for arg in n.all_input_nodes:
            if arg not in inside:
                externals[arg] = None  # drawn as a grey name: a value from outside the unit
            if _is_saved_edge(arg, n):
                saved += 1
                edges.append(f"  {_q(arg.name)} -> {_q(n.name)} [color={_q(SAVED_EDGE)}, penwidth=2];")
            else:
                edges.append(f"  {_q(arg.name)} -> {_q(n.name)};")
    for ext in externals:
        lines.append(f"  {_q(ext.name)} [label={_q(ext.name)}, shape=plaintext, style=\"\", fontcolor={_q(_EXTERNAL)}, "
                     "fontsize=8];")
    lines.extend(edges)
    saved_values = {n for n in nodes if not fx_meta.is_backward(n) and any(_is_saved_edge(n, u) for u in n.users)}
    saved_values |= {a for n in nodes for a in n.all_input_nodes if _is_saved_edge(a, n)}
    lines.append("  " + _legend(counts, saved_values=len(saved_values)))
    lines.append("}")
    return GraphPicture("\n".join(lines), title=f"unit {unit}", counts=counts, saved_edges=saved, nodes=len(nodes))


def _count_cells(counts: Counter) -> str:
    cells = []
    for key in (*POLICIES, "duplicate", "untagged"):
        if counts.get(key):
            cells.append(f'<TD BGCOLOR="{COLOURS[key]}">{counts[key]}</TD>')
    return "".join(cells) or "<TD>-</TD>"


def draw_collapsed(gm: fx.GraphModule, *, phase: Optional[str] = None) -> GraphPicture:
    """One box per (top-level module, phase) with counts per policy; edges carry how many values cross."""
    group: dict[fx.Node, tuple[str, bool]] = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        if phase is not None and (phase == "backward") != fx_meta.is_backward(n):
            continue
        group[n] = (unit_of(n) or "(no module)", fx_meta.is_backward(n))
    members: dict[tuple[str, bool], list[fx.Node]] = defaultdict(list)
    for n, key in group.items():
        members[key].append(n)
    counts = Counter(policy_key(n) for n in group)
    flows: Counter = Counter()
    saved_flows: Counter = Counter()
    for n, dst in group.items():
        for arg in n.all_input_nodes:
            src = group.get(arg)
            if src is None or src == dst:
                continue
            if _is_saved_edge(arg, n):
                saved_flows[(src, dst)] += 1
            else:
                flows[(src, dst)] += 1
    ids = {key: f"g{i}" for i, key in enumerate(members)}
    names = {key: key[0] if key[0] != "(no module)" else "outside modules (loss, glue)" for key in members}
    lines = _graph_header(f"whole graph, collapsed per top-level module — {len(group)} nodes")
    for label, backward in (("forward", False), ("backward", True)):
        keys = [k for k in members if k[1] == backward]
        if not keys:
            continue
        lines.append(f"  subgraph cluster_{'bwd' if backward else 'fwd'} {{ label={_q(label)}; "
                     'style="rounded,dashed"; color="#bbbbbb"; fontsize=11;')
        for key in keys:
            c = Counter(policy_key(n) for n in members[key])
            saves = any(_is_saved_edge(n, u) for n in members[key] for u in n.users)
            border = f' COLOR="{SAVED_EDGE}"' if saves else ""
            label_html = (f'<<TABLE BORDER="{2 if saves else 1}" CELLBORDER="0" CELLSPACING="2"{border}>'
                          f'<TR><TD COLSPAN="6"><B>{html.escape(names[key])}</B> ({len(members[key])} nodes)</TD></TR>'
                          f"<TR>{_count_cells(c)}</TR></TABLE>>")
            lines.append(f"    {ids[key]} [shape=plaintext, style=\"\", label={label_html}];")
        lines.append("  }")
    saved = 0
    for (src, dst), k in sorted(saved_flows.items(), key=lambda kv: (ids[kv[0][0]], ids[kv[0][1]])):
        saved += k
        lines.append(f"  {ids[src]} -> {ids[dst]} [color={_q(SAVED_EDGE)}, penwidth=2, label={_q(str(k))}, "
                     f"fontcolor={_q(SAVED_EDGE)}, fontsize=9, constraint=false];")
    for (src, dst), k in sorted(flows.items(), key=lambda kv: (ids[kv[0][0]], ids[kv[0][1]])):
        # forward edges set the ranks (top to bottom); backward ones run back up beside them
        lines.append(f"  {ids[src]} -> {ids[dst]}{' [constraint=false]' if src[1] or dst[1] else ''};")
    for name in {key[0] for key in members}:  # a module's backward box level with its forward box
        pair = [ids[k] for k in ((name, False), (name, True)) if k in members]
        if len(pair) == 2:
            lines.append(f"  {{ rank=same; {pair[0]}; {pair[1]}; }}")
    saved_values = {a for n in group for a in n.all_input_nodes if a in group and _is_saved_edge(a, n)}
    lines.append("  " + _legend(counts, saved_values=len(saved_values)))
    lines.append("}")
    return GraphPicture("\n".join(lines), title="whole graph (collapsed)", counts=counts, saved_edges=saved,
                        nodes=len(members))


def draw(gm: fx.GraphModule, unit: Optional[str] = None, *, phase: Optional[str] = None,
         max_nodes: int = 400) -> GraphPicture:
    """``unit`` given: that unit node by node; otherwise the whole graph collapsed per top-level module."""
    if phase not in (None, "forward", "backward"):
        raise ValueError(f"phase must be 'forward', 'backward' or None, got {phase!r}")
    if unit is not None:
        if not isinstance(unit, str) or not unit:
            raise ValueError(f"unit must be a module path such as 'layers.0', got {unit!r}")
        return draw_unit(gm, unit, phase=phase, max_nodes=max_nodes)
    return draw_collapsed(gm, phase=phase)


def units(gm: fx.GraphModule) -> list[str]:
    """Top-level modules present in the graph, in first-appearance order."""
    seen: dict[str, None] = {}
    for n in gm.graph.nodes:
        u = unit_of(n)
        if u:
            seen[u] = None
    return list(seen)

