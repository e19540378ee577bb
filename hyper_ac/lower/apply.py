"""Apply the core's plan to a joint FX graph: elided copies, tags, duplicates, redirects, erasures.

The plan says what to do (``hyper_ac.plan``); this module only does it:
``node_copy`` each duplicate before its insertion point, redirect the backward
consumers, turn the plan's random-op replays into
``run_and_save_rng_state`` / ``run_with_rng_state`` pairs, erase dead
originals, then check the graph (a full lint, or where the partition
follows, a check of what changed) and recompile.
"""

from __future__ import annotations

import operator
from typing import Any, Mapping, Optional

import torch
from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from hyper_ac import fx_meta
from hyper_ac.planning import plan_doc
from hyper_ac._fx import emit_node
from hyper_ac._gc import paused_gc

__all__ = ["apply_elided_copies", "apply_plan"]


def _private_get_attr(gm: fx.GraphModule, original: fx.Node, before: fx.Node, index: int) -> fx.Node:
    """A fresh get_attr for duplicate #index, so each region owns its HOP subgraph reference."""
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(original.target)
    node.meta.update(original.meta)
    fx_meta.set_duplicate_index(node, index)
    return node


def apply_plan(gm: fx.GraphModule, plan: Mapping[str, Any], *, tag_only: bool = False,
               recompile: bool = True) -> fx.GraphModule:
    """Apply a core plan to ``gm`` in place: tags, duplicates, redirects, erasures.

    ``tag_only`` writes the policies (``meta["recompute"]``, ``meta["ac_graph_id"]``)
    and stops, for PyTorch's own partitioner or Inductor to act on.
    ``recompile=False`` leaves ``gm``'s generated code stale, for callers that
    build new modules from the graph anyway (the backend's partition step):
    code generation is the slowest part of applying a plan to a large graph.
    It also checks only the nodes it made or rewired (each reads nodes defined
    before it; ``ValueError`` naming the node) instead of linting the whole graph.
    """
    with paused_gc():  # thousands of new nodes: no full-heap collections midway (hyper_ac._gc)
        return _apply_plan(gm, plan, tag_only, recompile)


def _apply_plan(gm: fx.GraphModule, plan: Mapping[str, Any], tag_only: bool, recompile: bool) -> fx.GraphModule:
    plan_doc.check(plan)  # either form of this build's version; no reader for older plans
    graph = gm.graph
    map_arg = fx.node.map_arg
    by_name = {node.name: node for node in graph.nodes}

    def node_named(name: str, what: str) -> fx.Node:
        try:
            return by_name[name]
        except KeyError:
            raise ValueError(f"plan {what} names node '{name}', which is not in the graph") from None

    # What the checks below (in place of a full lint) look at: every node this function
    # creates or makes read another node.
    changed: list[fx.Node] = []
    # First, so every name below refers to the graph the core planned.
    for name in _elide_copies(gm, plan, by_name, changed):
        del by_name[name]
    for name, policy in plan_doc.policies(plan):
        fx_meta.set_policy(node_named(name, "policy"), CheckpointPolicy[policy])
    for name, graph_id in plan_doc.graph_ids(plan):
        fx_meta.set_graph_id(node_named(name, "graph id"), graph_id)
    if tag_only:
        return gm

    # Duplicates come in schedule order; a node may be duplicated once per replay
    # segment. A duplicate reads the latest duplicate of each input made before it.
    duplicate_of: dict[fx.Node, fx.Node] = {}
    duplicates: list[fx.Node] = []
    for index, entry in enumerate(plan_doc.duplicates(plan)):
        original = node_named(entry["of"], "duplicate")
        before = node_named(entry["before"], "insertion point")
        private = {
            by_name[n]: _private_get_attr(gm, by_name[n], before, index) for n in entry["private_get_attrs"]
        }

        def remap(arg: fx.Node, private: dict = private) -> fx.Node:
            return private.get(arg) or duplicate_of.get(arg, arg)

        duplicate = emit_node(graph, original, map_arg(original.args, remap), map_arg(original.kwargs, remap),
                           before=before)
        fx_meta.mark_duplicate(duplicate, original.name, index)  # its index: the split names it so
        duplicate_of[original] = duplicate
        duplicates.append(duplicate)
    changed += duplicates

    for entry in plan_doc.redirects(plan):
        consumer = node_named(entry["node"], "redirect")
        original = node_named(entry["input"], "redirect")
        if original not in duplicate_of:
            raise ValueError(f"plan redirects '{consumer.name}' to a duplicate of '{original.name}', which was not made")
        index = entry["duplicate"]
        if index < 0:
            duplicate = duplicate_of[original]
        elif index >= len(duplicates) or fx_meta.recomputed_from(duplicates[index]) != original.name:
            raise ValueError(f"plan redirects '{consumer.name}' to duplicate #{index}, which is not a duplicate of "
                             f"'{original.name}'")
        else:
            duplicate = duplicates[index]
        consumer.replace_input_with(original, duplicate)
        changed.append(consumer)

    duplicates_of: dict[str, list[fx.Node]] = {}
    for duplicate in duplicates:
        duplicates_of.setdefault(fx_meta.recomputed_from(duplicate), []).append(duplicate)
    for entry in plan_doc.rng_replays(plan):  # present only when non-empty
        changed += _replay_random_op(gm, entry, node_named, duplicates_of)

    for name in plan_doc.erase(plan):
        node = node_named(name, "erase")
        if node.users:
            raise ValueError(f"plan erases '{name}', which is still read by {[u.name for u in node.users]}")
        graph.erase_node(node)

    _flatten_getitems(gm)
    if recompile or not _ORDERED:
        graph.lint()
        if recompile:
            gm.recompile()
    else:
        # The partition follows: a full lint (a fifth of a second at 50k nodes) would only
        # re-check a graph aot_autograd made; what could be out of order is what changed here.
        _check_order(changed)
    return gm


#: Whether fx nodes carry their position (``Node._sort_key``, compared by ``<``).
_ORDERED = hasattr(fx.Node, "_sort_key")


def _check_order(changed: list[fx.Node]) -> None:
    """What ``graph.lint()`` checks, for the nodes ``apply_plan`` made or rewired: each
    reads only nodes defined before it (a plan's insertion point before an input of its
    duplicate, or a redirect to a duplicate made after its reader, would break this)."""
    for node in changed:
        for arg in node._input_nodes:
            if not arg < node:
                what = f"duplicate of '{fx_meta.recomputed_from(node)}'" if fx_meta.is_duplicate(node) else "node"
                raise ValueError(f"plan leaves {what} '{node.name}' reading '{arg.name}', which comes after it "
                                 "in the graph (an insertion point or redirect out of order)")


def apply_elided_copies(gm: fx.GraphModule, plan: Mapping[str, Any]) -> list[str]:
    """The plan's ``elided_copies`` (exact clones the core removed at load): every
    reader of the copy reads its source, and the copy is erased. Returns the
    erased names. ``apply_plan`` does this first; a caller that partitions with
    PyTorch's partitioner instead (the backend's stock route) calls it alone."""
    if not plan:  # mode off: nothing was planned (PassResult("off", {}))
        return []
    plan_doc.check(plan)
    return _elide_copies(gm, plan, None, [])


def _elide_copies(gm: fx.GraphModule, plan: Mapping[str, Any], by_name: Optional[dict[str, fx.Node]],
                  readers: list[fx.Node]) -> list[str]:
    """``apply_elided_copies`` with the graph's nodes by name (made here if None); appends
    every node that now reads a source to ``readers``."""
    if by_name is None:
        by_name = {node.name: node for node in gm.graph.nodes}
    erased = []
    for entry in plan_doc.elided_copies(plan):  # present only when non-empty
        copy, source = by_name.get(entry["node"]), by_name.get(entry["source"])
        if copy is None or source is None:
            missing = entry["node"] if copy is None else entry["source"]
            raise ValueError(f"plan elides copy '{entry['node']}' of '{entry['source']}', but '{missing}' is not in "
                             "the graph (was the plan made for another graph, or applied twice?)")
        readers += copy.replace_all_uses_with(source)
        gm.graph.erase_node(copy)
        erased.append(copy.name)
    return erased


def _replay_random_op(gm: fx.GraphModule, entry: Mapping[str, Any], node_named: Any,
                      duplicates_of: dict[str, list[fx.Node]]) -> list[fx.Node]:
    """One plan ``rng_replays`` entry: the forward random op ``of`` runs under
    ``run_and_save_rng_state`` (same draw, same generator advance) and keeps its
    state as ``state``; each of its duplicates (one per replay segment) becomes
    ``run_with_rng_state(state, ...)``, which draws the same numbers and restores
    the generator afterwards. Returns the nodes it made or rewired."""
    from torch._guards import detect_fake_mode
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    graph = gm.graph
    original = node_named(entry["of"], "rng replay")
    duplicates = duplicates_of.get(original.name, [])
    if not duplicates:
        raise ValueError(f"plan replays random op '{original.name}', which has no duplicate")
    # The op's meta, less its value and its tag: these nodes run in the forward.
    meta = {k: v for k, v in original.meta.items() if k not in (*fx_meta.VALUE_KEYS, fx_meta.RECOMPUTE)}
    with graph.inserting_before(original):
        wrapped = graph.call_function(run_and_save_rng_state, (original.target, *original.args), dict(original.kwargs))
        state = graph.create_node("call_function", operator.getitem, (wrapped, 0), name=entry["state"])
        output = graph.call_function(operator.getitem, (wrapped, 1))
    # The state is a host byte tensor on every device (static size: a symbolic
    # one would make the saved size a fresh symbol).
    state_val = torch.empty(int(entry["state_bytes"]), dtype=torch.uint8)
    value = fx_meta.val(original)
    fake_mode = detect_fake_mode([value])
    if fake_mode is not None:
        state_val = fake_mode.from_tensor(state_val, static_shapes=True)
    for node in (wrapped, state, output):
        node.meta.update(meta)
        fx_meta.set_backward(node, False)
        fx_meta.set_rng_replay_of(node, original.name)  # the split puts these nodes where the core put the op
    wrapped.meta[fx_meta.VAL] = (state_val, value)
    state.meta[fx_meta.VAL] = state_val
    output.meta[fx_meta.VAL] = value  # the op's value is now the output getitem's
    if fx_meta.TENSOR_META in original.meta:
        output.meta[fx_meta.TENSOR_META] = original.meta[fx_meta.TENSOR_META]
    readers = original.replace_all_uses_with(output)
    graph.erase_node(original)

    for duplicate in duplicates:
        duplicate.target = run_with_rng_state
        duplicate.args = (state, original.target, *duplicate.args)
        fx_meta.mark_rng_replay(duplicate)
    return [wrapped, state, output, *readers]


def _flatten_getitems(gm: fx.GraphModule) -> None:
    """Move tuple projections next to their producer so each output is freed on its own.

    What ``torch._functorch.compile_utils.raise_getitems`` does, without its
    recompile: the caller recompiles once (or not at all before a partition).
    """
    getitems = list(gm.graph.find_nodes(op="call_function", target=operator.getitem))
    for node in reversed(getitems):  # reversed keeps their relative order
        producer = node.all_input_nodes
        if len(producer) == 1:
            producer[0].append(node)
