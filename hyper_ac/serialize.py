"""Serialise a joint FX graph to the core's graph JSON (docs/graph-format.md, version 1).

Every fact is computed from torch, never guessed:

* ``outputs``: from ``node.meta["val"]`` (fake tensors): ``bytes = numel *
  element_size``, dtype, concrete shape (symbolic sizes replaced by their
  hints via ``symbolic_shapes.optimization_hint``).
* ``mutated_inputs`` / ``aliased_inputs`` / ``view``: from the OpOverload's
  schema alias annotations, mapped to positions in the node's ``inputs``
  (= ``node.all_input_nodes``); ``operator.getitem`` aliases its producer.
* ``rng``: ``torch.Tag.nondeterministic_seeded`` (plus the RNG higher-order ops).
* ``symint``: ``meta["val"]`` is a ``SymInt``/``SymFloat``/``SymBool``.
* ``collective``: the operator's namespace is a communication namespace.
* ``flops``: ``torch.utils.flop_counter``'s per-op formula registry (0 without one).
* ``module_stack`` / ``phase`` / ``role``: from the annotations
  :func:`hyper_ac.capture.annotate_joint` wrote.

Schema analysis is cached per target, so the cost is linear in the graph.
"""

from __future__ import annotations

import gc
import json
import operator
from typing import Any, Iterable

import torch
import torch.fx as fx
import torch.nn as nn

from hyper_ac import _core

__all__ = [
    "FORMAT",
    "VERSION",
    "COLLECTIVE_NAMESPACES",
    "serialize_graph",
    "to_json",
    "discover_units",
    "target_name",
    "dtype_name",
    "OpFacts",
    "op_facts",
]

FORMAT = "hyper_ac.graph"
VERSION = 1

#: Operator namespaces whose ops are communication collectives.
COLLECTIVE_NAMESPACES = frozenset(
    {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor", "symm_mem"}
)

#: Higher-order ops that run RNG (no schema tags to read).
_RNG_HOPS = frozenset(
    {"run_and_save_rng_state", "run_with_rng_state", "graphsafe_run_with_rng_state"}
)

#: Default size used for an unbacked SymInt with no hint (Inductor's
#: ``unbacked_symint_fallback`` default).
UNBACKED_FALLBACK = 8192

_POLICIES = ("MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE")
_KINDS = ("placeholder", "call_function", "get_attr", "output")


# --------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"``."""
    return str(dtype).rsplit(".", 1)[-1]


def target_name(node: fx.Node) -> str:
    """The format's ``target`` string for a node."""
    if node.op in ("placeholder", "get_attr"):
        return str(node.target)
    if node.op == "output":
        return ""
    return _callable_name(node.target)


_NAME_CACHE: dict[Any, str] = {}


def _callable_name(target: Any) -> str:
    try:
        cached = _NAME_CACHE.get(target)
    except TypeError:  # unhashable
        cached = None
    if cached is not None:
        return cached
    if isinstance(target, torch._ops.OpOverload):
        name = f"{target._schema.name}.{target._overloadname}"
    elif isinstance(target, torch._ops.OpOverloadPacket):
        name = target._qualified_op_name
    elif isinstance(target, torch._ops.HigherOrderOperator):
        name = f"higher_order::{target.name()}"
    elif target is operator.getitem:
        name = "operator.getitem"
    else:
        module = getattr(target, "__module__", None) or "builtins"
        if module == "_operator":
            module = "operator"
        qual = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
        name = f"{module}.{qual}"
    try:
        _NAME_CACHE[target] = name
    except TypeError:
        pass
    return name


# --------------------------------------------------------------------------
# per-target schema facts (cached)
# --------------------------------------------------------------------------


class OpFacts:
    """What an operator's schema says, independent of one call.

    ``mutated`` / ``aliased``: schema argument indices written in place /
    whose storage some output may share. ``view``: an output aliases a
    non-written argument.
    """

    __slots__ = ("arg_names", "mutated", "aliased", "view", "rng", "collective", "flop_formula")

    def __init__(self) -> None:
        self.arg_names: list[str] = []
        self.mutated: tuple[int, ...] = ()
        self.aliased: tuple[int, ...] = ()
        self.view = False
        self.rng = False
        self.collective = False
        self.flop_formula: Any = None


_FACTS_CACHE: dict[Any, OpFacts] = {}


def _flop_registry() -> dict:
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def op_facts(target: Any) -> OpFacts:
    """Schema facts of a call_function target (cached per target)."""
    try:
        return _FACTS_CACHE[target]
    except (KeyError, TypeError):
        pass
    facts = OpFacts()
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        facts.arg_names = [a.name for a in schema.arguments]
        facts.rng = torch.Tag.nondeterministic_seeded in target.tags
        facts.collective = target.namespace in COLLECTIVE_NAMESPACES
        facts.flop_formula = _flop_registry().get(target.overloadpacket)

        ret_sets: set[str] = set()
        ret_wild = False
        for r in schema.returns:
            info = r.alias_info
            if info is not None:
                ret_sets |= set(info.before_set) | set(info.after_set)
        ret_wild = "*" in ret_sets
        mutated, aliased = [], []
        view = False
        for i, a in enumerate(schema.arguments):
            info = a.alias_info
            if info is None:
                continue
            if info.is_write:
                mutated.append(i)
            arg_sets = set(info.before_set)
            # `Tensor(a -> *)`: the argument enters the wildcard set, i.e. the
            # (list) outputs alias it (split, chunk, unbind, ...).
            enters_wildcard = "*" in info.after_set and "*" not in info.before_set
            shares = bool(arg_sets & ret_sets) or enters_wildcard or (ret_wild and bool(arg_sets))
            if shares:
                aliased.append(i)
                if not info.is_write:
                    view = True
        facts.mutated = tuple(mutated)
        facts.aliased = tuple(aliased)
        facts.view = view
    elif isinstance(target, torch._ops.HigherOrderOperator):
        facts.rng = target.name() in _RNG_HOPS
        facts.flop_formula = _flop_registry().get(target)
    try:
        _FACTS_CACHE[target] = facts
    except TypeError:
        pass
    return facts


def _arg_value(node: fx.Node, facts: OpFacts, i: int) -> Any:
    if i < len(node.args):
        return node.args[i]
    if i < len(facts.arg_names):
        return node.kwargs.get(facts.arg_names[i])
    return None


def _nodes_in(value: Any) -> Iterable[fx.Node]:
    if isinstance(value, fx.Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _nodes_in(v)


def _positions(node: fx.Node, facts: OpFacts, arg_indices: tuple[int, ...], pos_of: dict[fx.Node, int]) -> list[int]:
    out: set[int] = set()
    for i in arg_indices:
        for n in _nodes_in(_arg_value(node, facts, i)):
            p = pos_of.get(n)
            if p is not None:
                out.add(p)
    return sorted(out)


# --------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------

_PY_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _hint(x: Any, fallback: int) -> int:
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        return int(optimization_hint(x, fallback=fallback))
    return int(x)


_ELEMENT_SIZE: dict[torch.dtype, int] = {}


def _element_size(dtype: torch.dtype) -> int:
    size = _ELEMENT_SIZE.get(dtype)
    if size is None:
        size = torch.empty((), dtype=dtype, device="meta").element_size()
        _ELEMENT_SIZE[dtype] = size
    return size


def _shape(t: torch.Tensor, fallback: int) -> tuple[int, ...]:
    shape = tuple(t.shape)
    for s in shape:
        if type(s) is not int:
            return tuple(_hint(x, fallback) for x in shape)
    return shape


def _tensor_fact(t: torch.Tensor, fallback: int) -> dict:
    shape = list(_shape(t, fallback))
    numel = 1
    for s in shape:
        numel *= s
    return {"bytes": numel * _element_size(t.dtype), "dtype": dtype_name(t.dtype), "shape": shape}


def _output_facts(val: Any, fallback: int) -> list[dict]:
    if isinstance(val, torch.Tensor):
        return [_tensor_fact(val, fallback)]
    if isinstance(val, (list, tuple)):
        return [_tensor_fact(v, fallback) for v in val if isinstance(v, torch.Tensor)]
    return []


def _with_hinted_shapes(value: Any, fallback: int) -> Any:
    """Replace symbolic-shaped tensors by meta tensors of the hinted shape (for flop formulas)."""
    if isinstance(value, torch.Tensor):
        if any(type(s) is not int for s in value.shape):
            return torch.empty(_shape(value, fallback), dtype=value.dtype, device="meta")
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_with_hinted_shapes(v, fallback) for v in value)
    if isinstance(value, torch.SymInt):
        return _hint(value, fallback)
    return value


def _node_val(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return a.meta.get("val")
    if isinstance(a, (list, tuple)):
        return type(a)(_node_val(v) for v in a)
    if isinstance(a, dict):
        return {k: _node_val(v) for k, v in a.items()}
    return a


_FLOPS_CACHE: dict[tuple, float] = {}


class _Unhashable(Exception):
    pass


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _signature(value: Any, fallback: int) -> Any:
    """A hashable stand-in for a flop formula's argument (tensors → shape, dtype)."""
    if isinstance(value, fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return (_shape(value, fallback), value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple([_signature(v, fallback) for v in value])
    if isinstance(value, torch.SymInt):
        return _hint(value, fallback)
    if isinstance(value, _PLAIN):
        return value
    raise _Unhashable


def _flops(node: fx.Node, facts: OpFacts, fallback: int) -> float:
    formula = facts.flop_formula
    if formula is None:
        return 0.0
    # shape_wrapper formulas depend on shapes and plain values only: cache them
    # per (target, signature) — transformer graphs repeat the same few matmuls.
    key = None
    if getattr(formula, "__wrapped__", None) is not None:  # shape_wrapper(f) (functools.wraps)
        try:
            key = (
                node.target,
                _signature(node.args, fallback),
                tuple(sorted((k, _signature(v, fallback)) for k, v in node.kwargs.items())),
                _signature(node.meta.get("val"), fallback),
            )
        except _Unhashable:
            key = None
        if key is not None:
            hit = _FLOPS_CACHE.get(key)
            if hit is not None:
                return hit
    try:
        args = _with_hinted_shapes(_node_val(node.args), fallback)
        kwargs = {k: _with_hinted_shapes(v, fallback) for k, v in _node_val(dict(node.kwargs)).items()}
        out = _with_hinted_shapes(node.meta.get("val"), fallback)
        value = formula(*args, **kwargs, out_val=out)
        if isinstance(value, torch.SymInt):
            value = _hint(value, fallback)
        value = float(value)
    except Exception:  # a formula that cannot run on these values: no estimate
        value = 0.0
    value = value if value >= 0 else 0.0
    if key is not None:
        if len(_FLOPS_CACHE) > 65536:
            _FLOPS_CACHE.clear()
        _FLOPS_CACHE[key] = value
    return value


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


def _phase_of(node: fx.Node, backward_nodes: set[fx.Node]) -> bool:
    flag = node.meta.get("autograd_backward")
    if flag is not None:
        return bool(flag)
    tag = node.meta.get("partitioner_tag")
    if tag in ("is_backward", "must_be_in_backward"):
        return True
    if tag in ("is_forward", "must_be_in_forward"):
        return False
    if node.op == "output":
        return True
    # not annotated: backward iff it reads a backward value
    return any(i in backward_nodes for i in node.all_input_nodes)


def _policy_name(value: Any) -> str | None:
    if value is None:
        return None
    name = getattr(value, "name", value)
    if isinstance(name, str) and name in _POLICIES:
        return name
    raise ValueError(
        f"meta['recompute'] holds {value!r}; graph format v1 accepts only the CheckpointPolicy values "
        f"{', '.join(_POLICIES)} (CPU-offload policies are not supported)"
    )


def _role_of(node: fx.Node) -> str:
    if node.op != "placeholder":
        return "activation"
    role = node.meta.get("ac_role")
    if role is not None:
        return role
    return "tangent" if str(node.target).startswith("tangents") else "input"


def _module_stack(node: fx.Node) -> list[dict]:
    stack = node.meta.get("ac_module_stack")
    if not stack:
        return []
    return [{"fqn": fqn, "type": typ} for fqn, typ in stack]


def serialize_graph(
    gm: fx.GraphModule | fx.Graph,
    model: nn.Module | None = None,
    *,
    unbacked_fallback: int = UNBACKED_FALLBACK,
    with_flops: bool = True,
) -> dict:
    """The graph document (a JSON-ready dict) of an annotated joint graph.

    ``gm`` should carry :func:`hyper_ac.capture.annotate_joint`'s meta; a
    node without ``meta["autograd_backward"]`` gets its phase from
    ``partitioner_tag``, else backward iff one of its inputs is backward.
    ``model``: the live module, for the ``model`` section.
    """
    # Millions of small dicts/lists: the cyclic GC would rescan them over and
    # over (quadratic-looking pauses on 100k-node graphs). Nothing here makes cycles.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _serialize(gm, model, unbacked_fallback, with_flops)
    finally:
        if gc_was_enabled:
            gc.enable()


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
            return [d.mutated_input for d in node.meta.get("desc") or () if isinstance(d, InputMutationAOTOutput)]
    return []


def _serialize(gm: fx.GraphModule | fx.Graph, model: nn.Module | None, unbacked_fallback: int,
               with_flops: bool) -> dict:
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    owner = gm if isinstance(gm, fx.GraphModule) else getattr(graph, "owning_module", None)
    ids: dict[fx.Node, int] = {}
    backward_nodes: set[fx.Node] = set()
    out_nodes: list[dict] = []
    mutated_descs = _input_mutation_descs(graph)
    for i, node in enumerate(graph.nodes):
        ids[node] = i
        op = node.op
        if op not in _KINDS:
            raise ValueError(
                f"node {node.name!r}: kind {op!r} is not in graph format v1 (expected a joint aten graph "
                "with only placeholder / call_function / get_attr / output nodes)"
            )
        inputs = node.all_input_nodes
        input_ids = [ids[n] for n in inputs]
        is_bwd = _phase_of(node, backward_nodes)
        if is_bwd:
            backward_nodes.add(node)
        val = node.meta.get("val")
        entry: dict[str, Any] = {
            "id": i,
            "name": node.name,
            "kind": op,
            "target": target_name(node),
            "inputs": input_ids,
            "phase": "backward" if is_bwd else "forward",
            "outputs": _output_facts(val, unbacked_fallback) if op != "output" else [],
            "flops": 0.0,
            "module_stack": _module_stack(node),
            "rng": False,
            "symint": isinstance(val, _PY_SYM_TYPES),
            "collective": False,
            "view": False,
            "mutated_inputs": [],
            "aliased_inputs": [],
            "role": _role_of(node),
            "subgraph": False,
            "mutated": op == "placeholder" and node.meta.get("desc") in mutated_descs,
            "policy": _policy_name(node.meta.get("recompute")),
            "recomputed_from": None,
        }
        src = node.meta.get("ac_recomputed_from")
        if src is not None:
            entry["recomputed_from"] = src.name if isinstance(src, fx.Node) else str(src)
        if op == "call_function":
            target = node.target
            if target is operator.getitem:
                if inputs:
                    entry["aliased_inputs"] = [0]  # the producer's element (same storage)
            else:
                facts = op_facts(target)
                entry["rng"] = facts.rng
                entry["collective"] = facts.collective
                if facts.mutated or facts.aliased:
                    pos_of = {n: p for p, n in enumerate(inputs)}
                    entry["mutated_inputs"] = _positions(node, facts, facts.mutated, pos_of)
                    entry["aliased_inputs"] = _positions(node, facts, facts.aliased, pos_of)
                    entry["view"] = facts.view and bool(entry["aliased_inputs"])
                if with_flops and facts.flop_formula is not None:
                    entry["flops"] = _flops(node, facts, unbacked_fallback)
        elif op == "get_attr" and owner is not None:
            try:
                attr = owner
                for part in str(node.target).split("."):
                    attr = getattr(attr, part)
                entry["subgraph"] = isinstance(attr, fx.GraphModule)
            except AttributeError:
                pass
        out_nodes.append(entry)
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if model is not None:
        doc["model"] = model_facts(getattr(model, "_orig_mod", model))
    doc["nodes"] = out_nodes
    return doc


# Fields the wire form leaves out when they hold their default (docs/graph-format.md).
_DEFAULT_FALSE = ("rng", "symint", "collective", "view", "subgraph", "mutated")
_DEFAULT_EMPTY = ("outputs", "mutated_inputs", "aliased_inputs")
_DEFAULT_NONE = ("policy", "recomputed_from")


def compact(doc: dict) -> dict:
    """The wire form of a graph document: module stacks interned in a top-level
    ``module_stacks`` table (nodes name theirs by ``stack`` index) and fields
    holding their default left out. Loads to the same graph; about a third of
    the size, so the core parses it that much faster."""
    table: list[list[dict]] = []
    index: dict[tuple, int] = {}
    nodes = []
    for node in doc["nodes"]:
        out = dict(node)
        stack = out.pop("module_stack", None)
        if stack:
            key = tuple((f["fqn"], f["type"]) for f in stack)
            at = index.get(key)
            if at is None:
                at = index[key] = len(table)
                table.append(stack)
            out["stack"] = at
        for field in _DEFAULT_FALSE:
            if out.get(field) is False:
                del out[field]
        for field in _DEFAULT_EMPTY:
            if out.get(field) == []:
                del out[field]
        for field in _DEFAULT_NONE:
            if field in out and out[field] is None:
                del out[field]
        if out.get("flops") == 0:
            del out["flops"]
        if out.get("role") == "activation":
            del out["role"]
        nodes.append(out)
    wire = {k: v for k, v in doc.items() if k != "nodes"}
    wire["module_stacks"] = table
    wire["nodes"] = nodes
    return wire


def to_json(gm: fx.GraphModule | fx.Graph, model: nn.Module | None = None, *, indent: int | None = None,
            full: bool = False, **kwargs: Any) -> str:
    """:func:`serialize_graph` as a JSON string: the compact wire form
    (:func:`compact`) unless ``full``; one line unless ``indent``."""
    doc = serialize_graph(gm, model, **kwargs)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if not full:
            doc = compact(doc)
        if indent is None:
            return json.dumps(doc, separators=(",", ":"))
        return json.dumps(doc, indent=indent)
    finally:
        if gc_was_enabled:
            gc.enable()
