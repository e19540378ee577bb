"""FX graph edits the split and ``apply_plan`` make on large graphs, at less cost than ``fx.Graph``'s own.

``emit_node``: emit a node of one FX graph into another without ``Graph.create_node``'s per-call overhead.

``Graph.node_copy`` → ``create_node`` walks every argument with pytree to warn
about raw SymInts (a third of the time of building a 50k-node module), and
assigning ``node.meta`` goes through ``Node.__setattr__``, which re-files the
node in the graph's lookup table. A node copied from a graph that already
holds it needs neither: :func:`emit_node` does the rest of ``create_node``
(a unique name, the node, the create-node hooks, the insertion, the lookup
table, the length), with the same result. The graph internals it touches are
checked against torch in tests/python/test_torch_compat.py; where one is
missing, it falls back to ``node_copy``.

``erase_node``, ``to_placeholder`` and ``reset_graph`` turn a joint graph into
its backward in place (``hyper_ac.lower.partition.build_modules``): erase the forward
(freeing its names), make each saved value an input, and give the graph a fresh
graph's code generation.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import fx
from torch.fx.immutable_collections import immutable_dict

__all__ = ["emit_node", "copy_graph_module", "placeholder", "erase_node", "to_placeholder", "reset_graph"]

_Node = fx.Node
_GRAPH_ATTRS = ("_graph_namespace", "_insert", "_find_nodes_lookup_table", "_len")


def internals_present() -> bool:
    """Whether this torch's ``fx.Graph`` has the internals :func:`emit_node` uses."""
    graph = fx.Graph()
    return all(hasattr(graph, a) for a in _GRAPH_ATTRS) and hasattr(_Node, "_prepend")


_FAST = internals_present()


def emit_node(graph: fx.Graph, node: fx.Node, args: tuple, kwargs: dict, *,
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


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` that a partitioner may edit: every node copied (same names,
    meta dicts copied shallowly), the module's attributes (parameters, tensor
    constants, subgraphs) shared. ``copy.deepcopy`` would also copy tensor
    constants and fake values, which fails inside a partition step (a constant
    made under a fake mode cannot be cloned there)."""
    graph = fx.Graph()
    env: dict = {}
    get = env.__getitem__
    for node in gm.graph.nodes:
        env[node] = emit_node(graph, node, fx.map_arg(node.args, get), fx.map_arg(node.kwargs, get))
    return fx.GraphModule(gm, graph)


def placeholder(graph: fx.Graph, name: str, meta: dict) -> fx.Node:
    """``node = graph.placeholder(name); node.meta = meta`` (the same dict), without
    ``Node.__setattr__`` re-filing the node for its meta."""
    if not _FAST or graph.owning_module is not None:  # pragma: no cover - hooks, or no internals
        node = graph.placeholder(name)
        node.meta = meta
        return node
    unique = graph._graph_namespace.create_name(graph._target_to_str(name), None)
    node = _Node(graph, unique, "placeholder", name, (), immutable_dict(), None)
    graph._graph_namespace.associate_name_with_obj(unique, node)
    graph._insert(node)
    graph._find_nodes_lookup_table.insert(node)
    graph._len += 1
    _set(node, "meta", meta)
    return node


def erase_node(graph: fx.Graph, node: fx.Node) -> None:
    """``graph.erase_node(node)`` (without its per-node attribute hooks where no erase
    hook is registered), and its name freed for a later node: a graph that gives up
    most of its nodes, as the joint graph becoming the backward, keeps a namespace of
    the names it holds, as a fresh graph of them would."""
    if node.users:
        raise RuntimeError(f"Tried to erase Node {node} but it still had {len(node.users)} users in the graph: "
                           f"{node.users}!")
    module = graph.owning_module
    if not _FAST or node.graph is not graph or node._erased or (
            module is not None and getattr(module, "_erase_node_hooks", None)):
        graph.erase_node(node)
    else:  # what erase_node does, bar the hooks and Node.__setattr__'s lookup-table probe
        graph._find_nodes_lookup_table.remove(node)
        node._remove_from_list()
        _set(node, "_erased", True)
        graph._len -= 1
        node._update_args_kwargs(_map_arg(node._args, _none), _map_arg(node._kwargs, _none))
    namespace = getattr(graph, "_graph_namespace", None)
    names, used = getattr(namespace, "_obj_to_name", None), getattr(namespace, "_used_names", None)
    if isinstance(names, dict) and isinstance(used, set) and names.get(node) == node.name:
        del names[node]
        used.discard(node.name)


_set = object.__setattr__
_map_arg = fx.node.map_arg


def _none(_: fx.Node) -> None:
    return None


def to_placeholder(node: fx.Node) -> None:
    """Turn ``node`` into an input of its graph in place, as ``Graph.placeholder(node.name)``
    makes it (target its name, no arguments, no type), keeping its name, meta and readers.
    It stays where it is: the caller moves it among the inputs."""
    node._update_args_kwargs((), {})
    if not _FAST:  # pragma: no cover - Node.__setattr__ re-files it in the graph's lookup table
        node.op, node.target, node.type = "placeholder", node.name, None
        return
    table = node.graph._find_nodes_lookup_table  # filed by (op, target): out, changed, back in
    table.remove(node)
    _set(node, "op", "placeholder")
    _set(node, "target", node.name)
    _set(node, "type", None)
    table.insert(node)


#: What a graph built node by node in a fresh ``fx.Graph`` has: its nodes, names and lookup table.
_NODE_STATE = frozenset({"_root", "_insert", "_len", "_graph_namespace", "_find_nodes_lookup_table",
                         "_owning_module"})


def reset_graph(graph: fx.Graph) -> None:
    """Everything of ``graph`` but its nodes as in a fresh ``fx.Graph()``: the default code
    generation (a ``make_fx`` graph takes its inputs as a pytree), no tracer, no code fields."""
    fresh = fx.Graph()
    for key, value in vars(fresh).items():
        if key not in _NODE_STATE:
            setattr(graph, key, value)
