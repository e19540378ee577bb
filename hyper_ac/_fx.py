"""``copy_node``: copy an FX node into a graph without ``Graph.create_node``'s per-call overhead.

``Graph.node_copy`` → ``create_node`` walks every argument with pytree to warn
about raw SymInts (a third of the time of building a 50k-node module), and
assigning ``node.meta`` goes through ``Node.__setattr__``, which re-files the
node in the graph's lookup table. A node copied from a graph that already
holds it needs neither: :func:`copy_node` does the rest of ``create_node``
(a unique name, the node, the create-node hooks, the insertion, the lookup
table, the length), with the same result. The graph internals it touches are
checked against torch in tests/python/test_torch_compat.py; where one is
missing, it falls back to ``node_copy``.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import fx

__all__ = ["copy_node"]

_Node = fx.Node
_GRAPH_ATTRS = ("_graph_namespace", "_insert", "_find_nodes_lookup_table", "_len")


def internals_present() -> bool:
    """Whether this torch's ``fx.Graph`` has the internals :func:`copy_node` uses."""
    graph = fx.Graph()
    return all(hasattr(graph, a) for a in _GRAPH_ATTRS) and hasattr(_Node, "_prepend")


_FAST = internals_present()


def copy_node(graph: fx.Graph, node: fx.Node, args: tuple, kwargs: dict, *,
              before: Optional[fx.Node] = None, meta: Optional[dict] = None) -> fx.Node:
    """A copy of ``node`` (same op, target, name when free, type) in ``graph`` with
    ``args``/``kwargs`` already mapped to ``graph``'s nodes, at ``graph``'s insert
    point or just ``before`` a node of it. Its meta: a shallow copy of ``meta``
    (default ``node.meta``)."""
    meta = node.meta if meta is None else meta
    if not _FAST:  # pragma: no cover - a torch without these internals
        if before is None:
            new = graph.create_node(node.op, node.target, args, kwargs, node.name, node.type)
        else:
            with graph.inserting_before(before):
                new = graph.create_node(node.op, node.target, args, kwargs, node.name, node.type)
        new.meta.update(meta)
        return new
    namespace = graph._graph_namespace
    name = namespace.create_name(node.name, None)
    new = _Node(graph, name, node.op, node.target, args, kwargs, node.type)
    hooks = getattr(graph.owning_module, "_create_node_hooks", None) if graph.owning_module is not None else None
    if hooks:
        for hook in hooks:
            hook(new)
        new.meta.clear()  # as node_copy: the meta is the copied one, whatever a hook wrote
    namespace.associate_name_with_obj(name, new)
    if before is None:
        graph._insert(new)
    else:
        before._prepend(new)
    graph._find_nodes_lookup_table.insert(new)
    graph._len += 1
    new.meta.update(meta)  # a fresh node's meta is an empty dict of its own
    return new
