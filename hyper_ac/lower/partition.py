"""Split a rewritten joint graph into forward and backward modules.

After the pass, the backward already holds every recomputed duplicate, so the
split only has to save what the rewritten backward reads: no second optimiser
runs, and the plan's saved set is exactly the partition's.

Two ways to split (config key ``split``, docs/config.md):

- ``native`` (default): the core's split (``hyper_ac.plan(..., with_split=True)``,
  ``core/include/hyper_ac/split.h``) names the nodes each module runs and the
  values the forward saves, in order; :func:`build_modules` copies the forward
  nodes of the rewritten graph into a new forward module and turns the graph
  itself into the backward module (the joint graph is consumed).
- ``torch``: PyTorch's ``_extract_fwd_bwd_modules`` with the same core split's
  saved values (the plan's saved set, in order), for comparison.

:func:`saved_values` reads the saved set off the rewritten graph instead; it is
what :func:`partition_joint` uses when given no split (a joint rewritten
outside :func:`hyper_ac.plan`), and what the tests check the plan's against.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from torch import fx
from torch._functorch import partitioners as _partitioners

from hyper_ac import fx_meta
from hyper_ac._fx import emit_node, erase_node, placeholder, reset_graph, to_placeholder
from hyper_ac._gc import paused_gc

__all__ = ["saved_values", "partition_joint", "build_modules", "opaque_after_saved_tensors"]


def saved_values(gm: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node]]:
    """(tensors, symbolic scalars) of the forward that the backward reads, in graph order."""
    tensors: list[fx.Node] = []
    symbolic: list[fx.Node] = []
    for node in gm.graph.nodes:
        if fx_meta.is_backward(node) or node.op == "output":
            continue
        readers = [u for u in node.users if fx_meta.is_backward(u) and u.op != "output"]
        if not readers:
            continue
        if _partitioners.is_sym_node(node):
            symbolic.append(node)
        elif _is_multi_output(node):
            # A tuple is never saved whole: its getitem projections are.
            raise ValueError(
                f"backward node '{readers[0].name}' reads the tuple produced by '{node.name}' directly; "
                "expected it to read getitem projections"
            )
        else:
            tensors.append(node)
    return tensors, symbolic


def _is_multi_output(node: fx.Node) -> bool:
    val = fx_meta.val(node)
    return isinstance(val, (tuple, list)) and node.op == "call_function"


def _drop_stray_random_ops(bw_module: fx.GraphModule, joint_module: fx.GraphModule) -> None:
    """Erase forward random ops the extraction copied into the backward with no reader.

    ``_extract_fwd_bwd_modules`` can carry a forward random op over (with the
    recomputation feeding it) although no backward node reads it; a random op
    is impure, so dead-code elimination keeps it, and it would draw from the
    user's generator on every backward. Backward random ops of the joint itself
    are left alone.
    """
    joint_backward = {n.name for n in joint_module.graph.nodes if fx_meta.is_backward(n)}
    for node in reversed(list(bw_module.graph.nodes)):
        if (node.op == "call_function" and not node.users and node.name not in joint_backward
                and isinstance(node.target, torch._ops.OpOverload)
                and torch.Tag.nondeterministic_seeded in node.target.tags):
            bw_module.graph.erase_node(node)


def partition_joint(
    joint_module: fx.GraphModule,
    _joint_inputs: Any = None,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: Optional[Sequence[int]] = None,
    split: Optional[Mapping[str, Any]] = None,
    method: str = "native",
    **_: Any,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The partition_fn contract of aot_autograd, for an already rewritten joint graph.

    ``split``: the core's split of this graph (``hyper_ac.plan(..., with_split=True).split``).
    ``method`` (config ``split``): ``native`` builds the modules from it (:func:`build_modules`),
    which consumes ``joint_module`` (its graph becomes the backward's); ``torch`` hands its saved
    values (``split["saved"]``, ``split["saved_symints"]``) to PyTorch's ``_extract_fwd_bwd_modules``
    and leaves ``joint_module`` as it is. ``split=None``: PyTorch's extraction with the values the
    rewritten backward reads (:func:`saved_values`).
    """
    if method not in ("native", "torch"):
        raise ValueError(f"partition_joint: method must be 'native' or 'torch', got {method!r}")
    if split is not None and method == "native":
        return build_modules(joint_module, split, num_fwd_outputs=num_fwd_outputs)
    if split is not None:
        by_name = {node.name: node for node in joint_module.graph.nodes}
        try:
            tensors = [by_name[name] for name in split["saved"]]
            symbolic = [by_name[name] for name in split["saved_symints"]]
            opaque = [by_name[name] for name in split["saved_opaque"]]
        except KeyError as error:
            raise ValueError(f"the core's split saves {error.args[0]!r}, which the rewritten graph lacks") from None
    else:
        tensors, symbolic = saved_values(joint_module)
        opaque = [node for node in tensors if fx_meta.is_opaque(node)]
        tensors = [node for node in tensors if node not in opaque]
    static_nodes = None
    if static_lifetime_input_indices:
        placeholders = [n for n in joint_module.graph.nodes if n.op == "placeholder"]
        from torch.utils._ordered_set import OrderedSet

        static_nodes = OrderedSet(placeholders[i] for i in static_lifetime_input_indices)
    fw_module, bw_module = _partitioners._extract_fwd_bwd_modules(
        joint_module,
        tensors,
        saved_sym_nodes=symbolic,
        saved_opaque_nodes=opaque,
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=static_nodes,
    )
    _drop_stray_random_ops(bw_module, joint_module)
    fw_module.graph.eliminate_dead_code()
    bw_module.graph.eliminate_dead_code()
    fw_module.recompile()
    bw_module.recompile()
    return fw_module, bw_module


def opaque_after_saved_tensors(fw_module: fx.GraphModule, bw_module: fx.GraphModule, num_fwd_outputs: int) -> bool:
    """Put the saved opaque objects (a DTensor's mesh) after every saved tensor, in the forward's
    outputs and the backward's inputs alike, where PyTorch's min-cut left tensors behind them.

    aot_autograd's runtime slices the forward's outputs as (outputs, tensors, opaque objects,
    SymInts). The min-cut's ``functionalize_rng_ops`` (a random op tagged ``MUST_RECOMPUTE``: SDPA
    carries the tag even without dropout) inserts its generator states just before the SymInts,
    that is after the opaque objects, and into the backward just before the tangents; the
    runtime then hands a mesh to ``save_for_backward`` ("expected all tensors_saved_with_vc_check
    to be Tensors"), stock's own checkpointing of a DTensor model included. Moving the opaque
    block past those tensors on both sides restores the convention. True when it moved anything."""
    out_node = next(iter(fw_module.graph.find_nodes(op="output")))
    outputs = list(out_node.args[0])
    saved = outputs[num_fwd_outputs:]
    symbolic = 0
    while symbolic < len(saved) and _partitioners.is_sym_node(saved[len(saved) - 1 - symbolic]):
        symbolic += 1
    head = saved[:len(saved) - symbolic]
    opaque = [x for x in head if isinstance(x, fx.Node) and fx_meta.is_opaque(x)]
    if not opaque:
        return False
    first = head.index(opaque[0])
    trailing = [x for x in head[first:] if x not in opaque]  # tensors after the opaque block
    if not trailing:
        return False
    if head[first:first + len(opaque)] != opaque:
        raise ValueError("the forward's saved opaque objects are not one block; cannot order them")
    order = list(range(num_fwd_outputs)) + [num_fwd_outputs + i for i in range(first)]
    order += [num_fwd_outputs + first + len(opaque) + i for i in range(len(trailing))]
    order += [num_fwd_outputs + first + i for i in range(len(opaque))]
    order += list(range(num_fwd_outputs + len(head), len(outputs)))
    out_node.args = (tuple(outputs[i] for i in order),)
    descs = out_node.meta.get(fx_meta.DESC)
    if descs is not None and len(descs) == len(outputs):
        out_node.meta[fx_meta.DESC] = [descs[i] for i in order]
    traces = out_node.meta.get(fx_meta.OUTPUT_STACK_TRACES)
    if traces is not None and len(traces) == len(outputs):
        out_node.meta[fx_meta.OUTPUT_STACK_TRACES] = [traces[i] for i in order]
    # The backward takes them in the same order: the opaque block, then the same number of tensors.
    placeholders = list(bw_module.graph.find_nodes(op="placeholder"))
    names = [p.name for p in placeholders]
    start = names.index(opaque[0].name)
    block = placeholders[start:start + len(opaque)]
    after = placeholders[start + len(opaque) + len(trailing) - 1]
    for node in block:
        after.append(node)
        after = node
    fw_module.recompile()
    bw_module.recompile()
    return True


_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _maybe_symbolic(val: Any) -> bool:
    """Whether ``val`` may hold a free symbol: ``bool(free_symbols(val))`` or a false alarm,
    without walking every static size and stride as sympy expressions (3,000 inputs
    at 50k nodes)."""
    if isinstance(val, torch.Tensor):
        sym = _SYM_TYPES
        return (any(isinstance(d, sym) for d in val.shape) or any(isinstance(d, sym) for d in val.stride())
                or isinstance(val.storage_offset(), sym))
    if val is None or isinstance(val, (bool, int, float)):
        return False
    return bool(_partitioners.free_symbols(val))


def _symbol_convention(joint_graph: fx.Graph, saved: list[fx.Node], symints: list[fx.Node],
                       tangents: list[fx.Node]) -> list[fx.Node]:
    """The saved SymInts in aot_autograd's calling convention (what ``_extract_fwd_bwd_modules`` does):
    the nodes that bind a symbol first, then the derived ones, and a binding node for every
    symbol of a saved value's or tangent's shape not bound yet (needed to size the backward's
    inputs). Only graphs with symbolic shapes get here."""
    from torch.fx.experimental.symbolic_shapes import (find_symbol_binding_fx_nodes, free_symbols,
                                                       is_symbol_binding_fx_node)

    bound: set = set()
    binding: list[fx.Node] = []
    derived: list[fx.Node] = []
    for node in symints:
        symbol = is_symbol_binding_fx_node(node)
        if symbol:
            bound.add(symbol)
            binding.append(node)
        else:
            derived.append(node)
    bindings = None
    for node in [*derived, *saved, *tangents]:
        if fx_meta.VAL not in node.meta:
            continue
        new = free_symbols(node.meta[fx_meta.VAL]) - bound
        if not new:
            continue
        if bindings is None:
            bindings = find_symbol_binding_fx_nodes(joint_graph)
        for symbol in sorted(new, key=lambda s: s.name):
            if symbol in bindings:
                binding.append(bindings[symbol])
        bound |= new
    return binding + derived


def build_modules(joint_module: fx.GraphModule, split: Mapping[str, Any], *,
                  num_fwd_outputs: int) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward modules of a rewritten joint graph, from the core's split.

    Each node goes to the module the core put it in (``split["forward"]`` /
    ``split["backward"]`` by name, duplicates by their index in the plan's
    ``duplicates``, which ``apply_plan`` writes as ``meta["ac_duplicate"]``; a
    random op's replay nodes follow the op). The calling convention is
    ``_extract_fwd_bwd_modules``'s: the forward takes the primals (and forward
    seed/offset inputs) and returns its outputs, the saved tensors
    (``split["saved"]``, in order), the saved opaque objects (``split["saved_opaque"]``:
    a DTensor's mesh), then the saved SymInts; the backward takes
    the saved SymInts, the saved tensors, the saved opaque objects, the tangents (and backward seed/offset
    and backward-state inputs) and returns the gradients.

    ``joint_module`` is consumed: one pass copies the forward nodes into a new
    graph, then the joint graph itself becomes the backward's (its forward nodes
    erased, each saved value turned into a backward input of the same name and
    meta), which saves copying the larger half of the graph. Afterwards
    ``joint_module.graph`` is the backward module's graph: do not run or reuse
    ``joint_module``; split a copy to keep the joint. The nodes, names and meta of
    both modules are those a copy of each node into a fresh graph would have.
    """
    # Tens of thousands of new nodes: the cyclic GC would rescan them over and over
    # (as in hyper_ac.frontend.serialize); nothing here needs collecting until the modules exist.
    with paused_gc():
        return _build_modules(joint_module, split, num_fwd_outputs)


def _build_modules(joint_module: fx.GraphModule, split: Mapping[str, Any],
                   num_fwd_outputs: int) -> tuple[fx.GraphModule, fx.GraphModule]:
    from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
    from torch._functorch._aot_autograd.utils import (_is_bwd_seed_offset, _is_fwd_seed_offset, _is_primal,
                                                      _is_tangent)

    graph = joint_module.graph
    forward_names = set(split["forward"])
    backward_names = set(split["backward"])
    duplicates = set(split["backward_duplicates"])
    saved_names: list[str] = list(split["saved"])
    symint_names: list[str] = list(split["saved_symints"])
    opaque_names: list[str] = list(split["saved_opaque"])
    fwd_outputs, bwd_outputs, fwd_descs, bwd_descs = _partitioners._extract_fwd_bwd_outputs(
        joint_module, num_fwd_outputs=num_fwd_outputs)

    placeholders = list(graph.find_nodes(op="placeholder"))
    primals = [n for n in placeholders if _is_primal(n)]
    fwd_seeds = [n for n in placeholders if _is_fwd_seed_offset(n)]
    tangents = [n for n in placeholders if _is_tangent(n)]
    bwd_seeds = [n for n in placeholders if _is_bwd_seed_offset(n)]
    backward_states = [n for n in placeholders if _partitioners._is_backward_state(n)]

    if symint_names or any(_maybe_symbolic(fx_meta.val(n)) for n in placeholders):
        # Symbolic shapes: the SymInts follow aot_autograd's convention, which reads the nodes' values.
        by_name = {n.name: n for n in graph.nodes}
        symint_nodes = _symbol_convention(graph, [by_name[name] for name in saved_names],
                                          [by_name[name] for name in symint_names], tangents)
        symint_names = [n.name for n in symint_nodes]

    fwd = fx.Graph()
    env_f: dict[fx.Node, fx.Node] = {}
    # The backward's inputs from the forward, by name (the saved SymInts, the saved tensors, then the
    # saved opaque objects: aot_autograd's order).
    from_forward: dict[str, int] = {name: i for i, name in enumerate(symint_names)}
    for name in saved_names + opaque_names:
        if name in from_forward:
            raise ValueError(f"the core's split saves '{name}' twice")
        from_forward[name] = len(from_forward)
    saved_nodes: list[Optional[fx.Node]] = [None] * len(from_forward)  # the joint's nodes, in that order
    saved_in_forward: dict[str, fx.Node] = {}  # name -> the forward module's node
    forward_nodes: list[fx.Node] = []  # the joint's nodes that go to the forward module, in graph order
    for node in primals + fwd_seeds:
        new = placeholder(fwd, node.name, node.meta)
        env_f[node] = new
        forward_nodes.append(node)
        position = from_forward.get(node.name)
        if position is not None:
            saved_nodes[position] = node
            saved_in_forward[node.name] = new

    get_f = env_f.__getitem__
    map_arg = fx.node.map_arg
    for node in graph.nodes:
        op = node.op
        if op == "placeholder" or op == "output":
            continue
        name = node.name
        if name in forward_names:
            where = "forward"
        elif name in backward_names:
            continue
        else:
            index = fx_meta.duplicate_index(node)  # apply_plan's copies (and their private get_attrs)
            if index is not None:
                if index not in duplicates:
                    raise ValueError(f"node '{name}' is duplicate #{index} of the plan, which the core's split "
                                     "leaves out")
                continue
            # a random op's replay nodes (apply_plan) go where the op went
            owner = fx_meta.rng_replay_of(node)
            if owner in backward_names:
                continue
            if owner not in forward_names:
                raise ValueError(f"node '{name}' of the rewritten graph is in neither module of the core's split "
                                 "(was the graph changed after apply_plan?)")
        try:
            new = env_f[node] = emit_node(fwd, node, map_arg(node.args, get_f), map_arg(node.kwargs, get_f))
        except KeyError as error:
            raise ValueError(f"forward node '{name}' reads '{error.args[0]}', which the core's split does not "
                             "put in the forward module") from None
        forward_nodes.append(node)
        position = from_forward.get(name)
        if position is not None:
            saved_nodes[position] = node
            saved_in_forward[name] = new
    missing = [name for name in from_forward if name not in saved_in_forward]
    if missing:
        raise ValueError(f"the core's split saves {missing[:5]}, which the rewritten graph's forward does not compute")

    def forward_value(x: Any) -> Any:
        if not isinstance(x, fx.Node):
            return x
        try:
            return env_f[x]
        except KeyError:
            raise ValueError(f"forward output '{x.name}' is not computed by the forward module of the core's "
                             "split") from None

    fwd_values = [forward_value(x) for x in fwd_outputs]
    # aot_autograd's order: the saved tensors, the saved opaque objects, the saved SymInts.
    fwd_values += [saved_in_forward[name] for name in saved_names + opaque_names + symint_names]
    n_saved = len(saved_names) + len(opaque_names) + len(symint_names)
    _output(fwd, fwd_values, list(fwd_descs) + [SavedForBackwardsAOTOutput(i) for i in range(n_saved)])
    make = fx._lazy_graph_module._make_graph_module
    fw_module = make(joint_module, fwd)

    # The backward: the joint graph itself, less its forward (the forward nodes
    # it reads become its inputs). Nothing above changed the joint graph.
    in_forward = set(forward_nodes)
    for x in bwd_outputs:
        if isinstance(x, fx.Node) and x in in_forward and x.name not in from_forward:
            raise ValueError(f"backward output '{x.name}' is not computed by the backward module of the core's "
                             "split")
    erase_node(graph, next(iter(reversed(graph.nodes))))  # the joint's output node
    saved = set(saved_nodes)
    for node in reversed(forward_nodes):  # readers first
        if node in saved:
            to_placeholder(node)
        elif node.users:
            reader = next(iter(node.users))
            raise ValueError(f"backward node '{reader.name}' reads forward value '{node.name}', which the core's "
                             "split does not save")
        else:
            erase_node(graph, node)
    inputs = saved_nodes + tangents + bwd_seeds + backward_states
    taken = set(inputs)
    for node in graph.find_nodes(op="placeholder"):
        if node not in taken:  # a joint input neither module takes (none in aot_autograd's joint)
            if node.users:
                raise ValueError(f"backward node '{next(iter(node.users)).name}' reads input '{node.name}', "
                                 "which is neither a tangent nor a backward seed or state")
            erase_node(graph, node)
    previous = graph._root
    for node in inputs:  # the calling convention's order, first in the graph
        if node.target != node.name or node.args or node.kwargs or node.type is not None:
            to_placeholder(node)  # as a fresh ``Graph.placeholder(name)``
        previous.append(node)
        previous = node
    reset_graph(graph)  # a fresh graph's code generation (the joint's takes its inputs as a pytree)
    _output(graph, list(bwd_outputs), list(bwd_descs))
    return fw_module, make(joint_module, graph)


def _output(graph: fx.Graph, values: list, descs: list) -> None:
    """The output node as ``_extract_graph_with_inputs_outputs`` writes it."""
    out = graph.output(tuple(values))
    out.meta[fx_meta.DESC] = descs
    out.meta[fx_meta.OUTPUT_STACK_TRACES] = [v.meta.get(fx_meta.STACK_TRACE) if isinstance(v, fx.Node) else None
                                       for v in values]
