"""Serialise a joint FX graph to the core's graph JSON (docs/graph-format.md, version 1).

Every fact is computed from torch, never guessed:

* ``outputs``: from ``node.meta["val"]`` (fake tensors): ``bytes = numel *
  element_size``, dtype, concrete shape (symbolic sizes replaced by their
  hints via ``symbolic_shapes.optimization_hint``).
* ``mutated_inputs`` / ``aliased_inputs`` / ``view``: from the OpOverload's
  schema alias annotations, mapped to positions in the node's ``inputs``
  (= ``node.all_input_nodes``); ``operator.getitem`` aliases its producer.
* ``rng``: ``torch.Tag.nondeterministic_seeded`` (plus the RNG higher-order ops), except a
  call that draws nothing (attention with ``dropout_p`` 0: :func:`hyper_ac.frontend.op_facts.draws_random`).
* ``rng_state_bytes``: on a random op that can be replayed from a saved
  generator state (:func:`hyper_ac.frontend.op_facts.rng_state_bytes`), that state's size.
* ``symint``: ``meta["val"]`` is a ``SymInt``/``SymFloat``/``SymBool``.
* ``collective``: the operator's namespace is a communication namespace.
* ``flops``: ``torch.utils.flop_counter``'s per-op formula registry (0 without one).
* ``measured_seconds`` (only with ``measure=True``, which ``hardware: measured``
  asks for): one run of the node's op timed on this machine
  (:mod:`hyper_ac.frontend.op_times`, cached on disk).
* ``module_stack`` / ``phase`` / ``role``: from the annotations
  :func:`hyper_ac.frontend.annotate.annotate_joint` wrote (the phase through
  :func:`hyper_ac.frontend.annotate.phase_of`).

The operator facts come from :mod:`hyper_ac.frontend.op_facts` (schema analysis cached
per target, so the cost is linear in the graph).
"""

from __future__ import annotations

import json
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from hyper_ac import _core, fx_meta
from hyper_ac._gc import paused_gc
from hyper_ac.frontend.annotate import phase_of
from hyper_ac.frontend.graph_wire import compact, expand, node_text
from hyper_ac.frontend.op_times import OpTimer
from hyper_ac.frontend.op_facts import (_PY_SYM_TYPES, _positions, draws_random, is_exact_copy, may_be_exact_copy, op_facts,
                                        rng_state_bytes, target_name)
from hyper_ac.frontend.values import _flops, _output_facts

__all__ = [
    "FORMAT",
    "VERSION",
    "serialize_graph",
    "to_json",
    "compact",
    "discover_units",
]

FORMAT = "hyper_ac.graph"
VERSION = 1

#: Default size used for an unbacked SymInt with no hint (Inductor's
#: ``unbacked_symint_fallback`` default).
UNBACKED_FALLBACK = 8192

_POLICIES = ("MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE")
_KINDS = ("placeholder", "call_function", "get_attr", "output")


# --------------------------------------------------------------------------
# scope facts from the live model
# --------------------------------------------------------------------------

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def discover_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Repeated blocks ("units") of a model, as ``[(fqn, module), ...]``.

    The rule is the core's (``scope.h``: ``units_from_model``): every module
    carrying a ``gradient_checkpointing`` attribute (the HuggingFace marker)
    contributes the direct children of its non-empty ``ModuleList`` /
    ``ModuleDict`` / ``Sequential`` children, searched deeper for e.g.
    ``BertModel``. This only serialises :func:`model_facts` and asks the core.
    """
    doc = {"format": FORMAT, "version": VERSION, "model": model_facts(model), "nodes": []}
    fqns = _core.discover_units(json.dumps(doc, separators=(",", ":")))
    return [(fqn, model.get_submodule(fqn)) for fqn in fqns]


def _has_marker(mod: nn.Module) -> bool:
    try:
        getattr(mod, "gradient_checkpointing")
    except AttributeError:
        return False
    return True


def model_facts(model: nn.Module) -> dict:
    """The ``model`` section (docs/graph-format.md): the module tree as facts.

    ``modules`` lists ``named_modules(remove_duplicate=False)`` (root excluded),
    each ``{"fqn", "type"}`` plus, only when true or set: ``container`` (a
    ModuleList / ModuleDict / Sequential), ``marked`` (has the
    ``gradient_checkpointing`` marker) and ``same_as`` (FQN of the first listing
    of the same module object). The root's marker is the top-level ``marked``.
    The core derives the units from these facts.
    """
    section: dict[str, Any] = {"type": type(model).__name__}
    if _has_marker(model):
        section["marked"] = True
    first: dict[int, str] = {}
    modules = []
    for fqn, mod in model.named_modules(remove_duplicate=False):
        if not fqn:
            continue
        entry: dict[str, Any] = {"fqn": fqn, "type": type(mod).__name__}
        if isinstance(mod, _CONTAINERS):
            entry["container"] = True
        if _has_marker(mod):
            entry["marked"] = True
        if id(mod) in first:
            entry["same_as"] = first[id(mod)]
        else:
            first[id(mod)] = fqn
        modules.append(entry)
    section["modules"] = modules
    return section


# --------------------------------------------------------------------------
# graph
# --------------------------------------------------------------------------



def _policy_name(value: Any) -> str | None:
    if value is None:
        return None
    name = getattr(value, "name", value)
    if isinstance(name, str) and name in _POLICIES:
        return name
    raise ValueError(
        f"meta[{fx_meta.RECOMPUTE!r}] holds {value!r}; graph format v1 accepts only the CheckpointPolicy values "
        f"{', '.join(_POLICIES)} (CPU-offload policies are not supported)"
    )


def _autograd_node(seq_nr: Any, numbering: dict[int, int]) -> int | None:
    """A backward op's ``meta["seq_nr"]`` as the document's ``autograd_node`` (None: unknown).

    seq_nr is a process-wide counter, so a second capture of the same model
    gets other numbers; the document numbers the graph's autograd nodes 0, 1, …
    in order of first appearance, keeping the text deterministic."""
    if type(seq_nr) is not int or seq_nr < 0:
        return None
    return numbering.setdefault(seq_nr, len(numbering))


def _role_of(node: fx.Node) -> str:
    if node.op != "placeholder":
        return "activation"
    role = fx_meta.role(node)
    if role is not None:
        return role
    return "tangent" if str(node.target).startswith("tangents") else "input"


def serialize_graph(
    gm: fx.GraphModule | fx.Graph,
    model: nn.Module | None = None,
    *,
    unbacked_fallback: int = UNBACKED_FALLBACK,
    with_flops: bool = True,
    measure: bool = False,
) -> dict:
    """The graph document (a JSON-ready dict) of an annotated joint graph.

    ``gm`` should carry :func:`hyper_ac.frontend.annotate.annotate_joint`'s meta; a
    node without ``meta["autograd_backward"]`` gets its phase from
    ``partitioner_tag``, else backward iff one of its inputs is backward.
    ``model``: the live module, for the ``model`` section.
    ``measure``: time each replayable op on this machine (``measured_seconds``;
    ``hardware: measured``).
    """
    # Millions of small dicts/lists: the cyclic GC would rescan them over and
    # over (quadratic-looking pauses on 100k-node graphs). Nothing here makes cycles.
    with paused_gc():
        return expand(json.loads(_serialize(gm, model, unbacked_fallback, with_flops, measure)))


def _input_mutation_descs(graph: fx.Graph) -> list:
    """Descriptors of the inputs the step writes (AOTAutograd input mutations).

    Their new values are forward outputs copied into the inputs after the
    forward, so a backward replay of a reader would see the written value.
    """
    try:
        from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput
    except ImportError:  # checked by tests/python/test_torch_compat.py
        return []
    for node in reversed(graph.nodes):
        if node.op == "output":
            return [d.mutated_input for d in fx_meta.desc(node) or () if isinstance(d, InputMutationAOTOutput)]
    return []


def _serialize(gm: fx.GraphModule | fx.Graph, model: nn.Module | None, unbacked_fallback: int,
               with_flops: bool, measure: bool = False) -> str:
    """The graph document's wire text (``json.dumps(compact(doc), separators=(",", ":"))``
    byte for byte), written node by node by :func:`hyper_ac.frontend.graph_wire.node_text`.

    Linear in the graph, with as little Python per node as possible: the facts
    of a target (its name, schema facts, whether it may be an exact copy) are
    looked up once per target, an output fact's JSON text once per (shape,
    dtype) and a module stack's index once per stack."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    owner = gm if isinstance(gm, fx.GraphModule) else getattr(graph, "owning_module", None)
    ids: dict[fx.Node, str] = {}  # node -> its id, as text
    backward_nodes: set[fx.Node] = set()
    out_nodes: list[str] = []  # the nodes' JSON texts
    stack_table: list[list[dict]] = []  # the interned module stacks
    stack_index: dict[tuple, int] = {}  # a stack's ((fqn, type), ...) -> its index in stack_table
    # id(target) -> (target name, OpFacts or None for getitem, may be an exact copy,
    # aliases its first argument only (no writes)); targets outlive the loop
    target_facts: dict[int, tuple[str, Any, bool, bool]] = {}
    # (shape, dtype) -> the JSON text of its output facts (static shapes only); the same for
    # the ((shape, dtype), ...) of a list/tuple value's tensors
    fact_cache: dict[tuple, str] = {}
    seq_fact_cache: dict[tuple, str] = {}
    mutated_descs = _input_mutation_descs(graph)
    getitem = operator.getitem
    node_type = fx.Node
    tensor_type = torch.Tensor
    sym_types = _PY_SYM_TYPES
    timer = OpTimer() if measure else None
    is_opaque = fx_meta.is_opaque
    backward_output_key = fx_meta.BACKWARD_OUTPUT
    seq_nr_key = fx_meta.SEQ_NR
    autograd_numbering: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        ids[node] = str(i)
        op = node.op
        if op not in _KINDS:
            raise ValueError(
                f"node {node.name!r}: kind {op!r} is not in graph format v1 (expected a joint aten graph "
                "with only placeholder / call_function / get_attr / output nodes)"
            )
        meta = node.meta
        inputs = node.all_input_nodes
        flag = meta.get(fx_meta.BACKWARD)  # phase_of, inlined: None = not annotated
        is_bwd = bool(flag) if flag is not None else phase_of(node, backward_nodes)
        if is_bwd:
            backward_nodes.add(node)
        val = meta.get(fx_meta.VAL)
        flops = 0.0
        rng = collective = view = subgraph = fusible = copy = False
        state_bytes = 0
        mutated_inputs: list[int] = []
        aliased_inputs: list[int] = []
        recomputed_from = fx_meta.recomputed_from(node)
        seconds = None
        if op == "call_function":
            target = node.target
            known = target_facts.get(id(target))
            if known is None:
                tname = target_name(node)
                if target is getitem:
                    known = (tname, None, False, False)
                else:
                    facts = op_facts(target)
                    known = (tname, facts, may_be_exact_copy(target), not facts.mutated and facts.aliased == (0,))
                target_facts[id(target)] = known
            tname, facts, copy_candidate, aliases_first = known
            if facts is None:  # operator.getitem
                if inputs:
                    aliased_inputs = [0]  # the producer's element (same storage)
                fusible = True
            else:
                rng = draws_random(node, facts)
                if rng:
                    state_bytes = rng_state_bytes(node)
                collective = facts.collective
                fusible = facts.fusible
                copy = copy_candidate and is_exact_copy(node)
                if aliases_first and node.args and type(node.args[0]) is node_type:
                    # the common view (view, t, expand, ...): its first argument is a node,
                    # so the first of all_input_nodes (_positions' answer without its dict)
                    aliased_inputs = [0]
                    view = facts.view
                elif facts.mutated or facts.aliased:
                    pos_of = {n: p for p, n in enumerate(inputs)}
                    mutated_inputs = _positions(node, facts, facts.mutated, pos_of)
                    aliased_inputs = _positions(node, facts, facts.aliased, pos_of)
                    view = facts.view and bool(aliased_inputs)
                if with_flops and facts.flop_formula is not None:
                    flops = _flops(node, facts, unbacked_fallback)
                if timer is not None:
                    seconds = timer.seconds(node, tname, facts, rng)
        else:
            tname = target_name(node)
            if op == "get_attr" and owner is not None:
                try:
                    attr = owner
                    for part in str(node.target).split("."):
                        attr = getattr(attr, part)
                    subgraph = isinstance(attr, fx.GraphModule)
                except AttributeError:
                    pass
        outputs = ""
        if op != "output" and isinstance(val, (tensor_type, list, tuple)):
            # a tensor's (shape, dtype), or those of a list/tuple's tensors (_output_facts' rule)
            if isinstance(val, tensor_type):
                key = (val.shape, val.dtype)
                cache = fact_cache
            else:
                key = tuple([(v.shape, v.dtype) for v in val if isinstance(v, tensor_type)])
                cache = seq_fact_cache
            try:
                outputs = cache.get(key)
            except TypeError:  # a symbolic size is not hashable
                key = outputs = None
            if outputs is None:
                facts_list = _output_facts(val, unbacked_fallback)
                outputs = json.dumps(facts_list, separators=(",", ":")) if facts_list else ""
                if key is not None:
                    cache[key] = outputs
        # (a SymInt, a number, ...: no tensor output)
        if op == "placeholder":
            role = _role_of(node)
            mutated = meta.get(fx_meta.DESC) in mutated_descs
        else:
            role = "activation"
            mutated = False
        recompute = meta.get(fx_meta.RECOMPUTE)
        if recompute is None:
            policy = graph_id = None
        else:
            policy = _policy_name(recompute)
            graph_id = fx_meta.graph_id(node)
        stack = meta.get(fx_meta.MODULE_STACK)
        at = None
        if stack:
            # by value: annotate_joint gives every node its own list of (fqn, type) tuples
            key = tuple(stack)
            try:
                at = stack_index.get(key)
            except TypeError:  # (fqn, type) lists
                key = tuple((fqn, typ) for fqn, typ in stack)
                at = stack_index.get(key)
            if at is None:
                at = stack_index[key] = len(stack_table)
                stack_table.append([{"fqn": fqn, "type": typ} for fqn, typ in stack])
        out_nodes.append(node_text(
            i, node.name, op, tname, [ids[n] for n in inputs], "backward" if is_bwd else "forward", outputs,
            flops, rng, isinstance(val, sym_types), collective, view, mutated_inputs, aliased_inputs, role,
            subgraph, mutated, policy, graph_id, recomputed_from, state_bytes, fusible, copy, at, seconds,
            val is not None and op != "output" and not isinstance(val, tensor_type) and is_opaque(node),
            meta.get(backward_output_key, False),
            # the eager autograd node a backward op runs in (the core's autograd_lifetimes)
            _autograd_node(meta.get(seq_nr_key), autograd_numbering) if is_bwd and op == "call_function" else None))
    if timer is not None:
        timer.close()
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if model is not None:
        doc["model"] = model_facts(getattr(model, "_orig_mod", model))
    doc["module_stacks"] = stack_table
    doc["nodes"] = []
    head = json.dumps(doc, separators=(",", ":"), check_circular=False)
    assert head.endswith('"nodes":[]}')
    return head[:-2] + ",".join(out_nodes) + "]}"


def to_json(gm: fx.GraphModule | fx.Graph, model: nn.Module | None = None, *, indent: int | None = None,
            full: bool = False, **kwargs: Any) -> str:
    """:func:`serialize_graph` as a JSON string: the compact wire form
    (:func:`compact`) unless ``full``; one line unless ``indent``."""
    with paused_gc():
        if indent is not None:  # for people: the same document, spaced out
            doc = serialize_graph(gm, model, **kwargs)
            text = json.dumps(doc if full else compact(doc), indent=indent)
            # Free the document while the collector is still off: re-enabled with it
            # alive, the first allocation's young-generation pass walks every one of
            # its dicts and lists for nothing.
            del doc
        elif full:
            doc = serialize_graph(gm, model, **kwargs)
            text = json.dumps(doc, separators=(",", ":"), check_circular=False)  # a fresh tree: no cycles
            del doc  # as above
        else:  # json.dumps(compact(serialize_graph(...))), written in one pass
            text = _serialize(gm, model, kwargs.pop("unbacked_fallback", UNBACKED_FALLBACK),
                              kwargs.pop("with_flops", True), kwargs.pop("measure", False), **kwargs)
    return text
