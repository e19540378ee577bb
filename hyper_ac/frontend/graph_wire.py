"""The graph document's wire text: one encoder, its defaults from the core's field table.

The core declares every field of the graph document once (``core/src/graph_fields.h``,
exported as ``_core.graph_fields()``: name, JSON kind, required or default).
Here that table gives:

* :func:`node_text`: the encoder of one node's wire text. A field at the
  table's default is left out; the rest are written in :data:`WIRE_ORDER`
  (the order of the bytes the serialiser has always written). It is generated
  once from the table, so the per-node cost is that of hand-written code.
* :func:`expand`: the full form of a wire document (every field the core's
  ``graph_to_json`` writes at its default filled in, module stacks inline).
* :func:`compact`: the wire form of a full document.

``json.dumps(compact(expand(json.loads(text))), separators=(",", ":")) == text``
for every text the serialiser writes.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from hyper_ac import _core

__all__ = ["FIELDS", "NODE_DEFAULTS", "WIRE_ORDER", "node_text", "expand", "compact", "json_str"]

#: Every field of the graph document (docs/graph-format.md, "Field table").
FIELDS: list[dict] = _core.graph_fields()

_NODE = {f["name"]: f for f in FIELDS if f["section"] == "node"}


def _default(field: dict) -> Any:
    value = json.loads(field["default_json"])
    # flops: the serialiser's 0.0; measured_seconds: null (absent)
    return float(value) if field["kind"] == "number" and value is not None else value


#: A node field's value when the document leaves it out.
NODE_DEFAULTS: dict[str, Any] = {name: _default(f) for name, f in _NODE.items() if not f["required"]}

#: The wire text's node keys, in its byte order; the module stack is interned
#: (``stack``, an index into the top-level ``module_stacks``), never inline.
WIRE_ORDER = ("id", "name", "kind", "target", "inputs", "phase", "outputs", "flops", "rng", "symint", "collective",
              "view", "mutated_inputs", "aliased_inputs", "role", "subgraph", "mutated", "policy", "ac_graph_id",
              "recomputed_from", "rng_state_bytes", "fusible", "copy", "stack", "measured_seconds", "opaque",
              "backward_output", "autograd_node")

# json.dumps's own string encoder for its default ``ensure_ascii=True``: the
# wire text writes every string byte for byte as json.dumps would.
json_str = json.encoder.encode_basestring_ascii


def _json_number(value: float | int) -> str:
    """A number as json.dumps writes it (``repr``; non-finite floats spelled its way)."""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    return repr(value)


def _json_ints(values: list[int]) -> str:
    return "[" + ",".join(map(str, values)) + "]"


# How a value given to node_text is written, by the table's JSON kind. Two
# arrive already encoded: `inputs` (a list of id texts) and `outputs` (its
# JSON text, "" for none: the serialiser caches it per shape).
_WRITE = {
    "integer": "str({})",
    "integer (index)": "str({})",
    "number": "_json_number({})",
    "boolean": "'true'",
    "string": "json_str({})",
    "string (a name)": "json_str({})",
    "array of input positions": "_json_ints({})",
    "array of node ids": "'[' + ','.join({}) + ']'",
    "array of tensor facts": "{}",
}


def _generate() -> Callable[..., str]:
    """``node_text(id, name, ...)`` (arguments in WIRE_ORDER) as straight-line code."""
    lines, first = [], True
    for name in WIRE_ORDER:
        field = _NODE[name]
        write = _WRITE[field["kind"]].format(name)
        key = json.dumps(name)
        if field["required"]:
            lines.append(f"    t {'=' if first else '+='} '{'{' if first else ','}{key}:' + {write}")
            first = False
            continue
        default = NODE_DEFAULTS[name]
        if default is None:
            test = f"{name} is not None"
        elif default in (False, 0, []) and not isinstance(default, str):  # false, 0, 0.0 and [] (or "") are falsy
            test = name
        else:
            test = f"{name} != {default!r}"
        lines.append(f"    if {test}:\n        t += ',{key}:' + {write}")
    source = f"def node_text({', '.join(WIRE_ORDER)}):\n" + "\n".join(lines) + "\n    return t + '}'\n"
    scope = {"json_str": json_str, "_json_number": _json_number, "_json_ints": _json_ints}
    exec(compile(source, "<hyper_ac.frontend.graph_wire.node_text>", "exec"), scope)
    return scope["node_text"]


node_text = _generate()
node_text.__doc__ = """One node's wire text; arguments in WIRE_ORDER, a field at its table default left out."""


def expand(wire: dict) -> dict:
    """The full form of a wire document (a fresh tree): each node with every field
    the core's canonical form writes at its default, the module stack inline."""
    table = wire.get("module_stacks") or []
    full_order = [n for n in WIRE_ORDER if n != "stack"]
    full_order.insert(full_order.index("flops") + 1, "module_stack")
    nodes = []
    for node in wire["nodes"]:
        out = {}
        for name in full_order:
            if name == "module_stack":
                at = node.get("stack")
                out[name] = [dict(f) for f in table[at]] if at is not None else []
            elif name in node:
                out[name] = node[name]
            elif _NODE[name]["always"]:
                out[name] = NODE_DEFAULTS[name]
        nodes.append(out)
    doc = {k: v for k, v in wire.items() if k not in ("module_stacks", "nodes")}
    doc["nodes"] = nodes
    return doc


def compact(doc: dict) -> dict:
    """The wire form of a graph document: module stacks interned in a top-level
    ``module_stacks`` table (nodes name theirs by ``stack`` index) and fields at
    their table default left out. Loads to the same graph; about a third of the
    size, so the core parses it that much faster."""
    table: list[list[dict]] = []
    index: dict[tuple, int] = {}
    nodes = []
    wire_keys = set(WIRE_ORDER)
    for node in doc["nodes"]:
        out = {}
        # in WIRE_ORDER, so that compact(doc) is the serialiser's wire text byte for byte
        for name in WIRE_ORDER:
            if name == "stack":
                stack = node.get("module_stack")
                if stack:
                    key = tuple((f["fqn"], f["type"]) for f in stack)
                    at = index.get(key)
                    if at is None:
                        at = index[key] = len(table)
                        table.append(stack)
                    out["stack"] = at
            elif name in node and not (name in NODE_DEFAULTS and _at_default(node[name], NODE_DEFAULTS[name])):
                out[name] = node[name]
        # a key the table does not know is kept, for the core's loader to name
        out.update((name, value) for name, value in node.items() if name not in wire_keys and name != "module_stack")
        nodes.append(out)
    wire = {k: v for k, v in doc.items() if k != "nodes"}
    wire["module_stacks"] = table
    wire["nodes"] = nodes
    return wire


def _at_default(value: Any, default: Any) -> bool:
    # by kind, not ==: True == 1 and 0 == False in Python
    return type(value) is type(default) and value == default or (
        isinstance(default, float) and type(value) is int and value == default)
