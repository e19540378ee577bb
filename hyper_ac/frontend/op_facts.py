"""Operator facts: what torch can tell about one call_function node.

Per target (cached): the schema's aliasing and mutation (``mutated`` /
``aliased`` argument indices, ``view``), the RNG tag
(``torch.Tag.nondeterministic_seeded`` and the RNG higher-order ops), the
collective namespace and the FLOP formula (``torch.utils.flop_counter``'s
registry). Per node: the argument positions the schema facts name (output
facts and FLOPs: :mod:`hyper_ac.frontend.values`). :mod:`hyper_ac.frontend.serialize`
writes them into the graph document.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Iterable

import torch
import torch.fx as fx

from hyper_ac import fx_meta

__all__ = ["COLLECTIVE_NAMESPACES", "HIGHER_ORDER_NAMESPACE", "OpFacts", "dtype_name", "op_facts", "target_name"]

#: Operator namespaces whose ops are communication collectives.
COLLECTIVE_NAMESPACES = frozenset(
    {"_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor", "symm_mem"}
)

#: The namespace of a higher-order op's target name, ``higher_order::<name>``
#: (``torch.ops.higher_order.<name>``): one spelling, with ``::`` as every
#: operator's, so an op table names ``higher_order::flex_attention``.
HIGHER_ORDER_NAMESPACE = "higher_order"

_PY_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)

#: Higher-order ops that run RNG (no schema tags to read).
_RNG_HOPS = frozenset(
    {"run_and_save_rng_state", "run_with_rng_state", "graphsafe_run_with_rng_state"}
)



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
        name = f"{HIGHER_ORDER_NAMESPACE}::{target.name()}"
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

    __slots__ = ("arg_names", "mutated", "aliased", "view", "rng", "collective", "fusible", "flop_formula")

    def __init__(self) -> None:
        self.arg_names: list[str] = []
        self.mutated: tuple[int, ...] = ()
        self.aliased: tuple[int, ...] = ()
        self.view = False
        self.rng = False
        self.collective = False
        self.fusible = False
        self.flop_formula: Any = None


_FACTS_CACHE: dict[Any, OpFacts] = {}

#: Non-pointwise ops Inductor still fuses into a neighbouring kernel (the
#: ``fusible`` fact, besides every ``torch.Tag.pointwise`` op and every view):
#: reductions, factories, converts and copies. ``namespace::name`` of the overload packet.
FUSIBLE_OPS = frozenset({
    # reductions
    "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::var_mean", "aten::var", "aten::std",
    "aten::std_mean", "aten::prod", "aten::argmax", "aten::argmin", "aten::logsumexp", "aten::any", "aten::all",
    "aten::max", "aten::min", "aten::norm", "aten::linalg_vector_norm",
    "prims::sum", "prims::var", "prims::amax", "prims::amin", "prims::prod", "prims::xor_sum",
    # factories
    "aten::full", "aten::full_like", "aten::zeros", "aten::zeros_like", "aten::ones", "aten::ones_like",
    "aten::arange", "aten::scalar_tensor", "aten::empty_like", "prims::iota", "prims::full", "prims::full_like",
    # converts, copies, broadcasts
    "aten::_to_copy", "aten::clone", "aten::copy", "aten::expand_copy", "aten::lift_fresh_copy",
    "prims::convert_element_type", "prims::broadcast_in_dim",
})


def _flop_registry() -> dict:
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def _grouped_mm_flops(a_shape, b_shape, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """Grouped matmul: each row of ``a`` meets one group's matrix, so 2 · numel(a) · N
    (N = the output's last dimension) in every layout of ``torch._grouped_mm``
    (2D×3D, 3D×3D, 3D×2D, and 2D×2D with groups along K)."""
    return 2 * math.prod(a_shape) * out_shape[-1]


@functools.cache
def _own_flop_formulas() -> dict:
    """FLOP formulas for ops ``torch.utils.flop_counter`` has none for, by ``ns::name``:
    without one the core prices a replay by bytes only (its ``compute_unknown``
    diagnostic), which makes a grouped expert matmul look nearly free to replay."""
    from torch.utils.flop_counter import shape_wrapper

    grouped = shape_wrapper(_grouped_mm_flops)
    return {"aten::_grouped_mm": grouped, "transformers::grouped_mm_fallback": grouped}


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
        packet = f"{target.namespace}::{target._schema.name.split('::')[-1]}"
        fusible = torch.Tag.pointwise in target.tags or packet in FUSIBLE_OPS
        facts.flop_formula = _flop_registry().get(target.overloadpacket) or _own_flop_formulas().get(packet)

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
        # What Inductor fuses into one kernel: pointwise ops, views/broadcasts,
        # reductions, factories, converts (never RNG, collectives or mutation).
        facts.fusible = (fusible or view) and not facts.rng and not facts.collective and not mutated
    elif isinstance(target, torch._ops.HigherOrderOperator):
        facts.rng = target.name() in _RNG_HOPS
        facts.flop_formula = _flop_registry().get(target)
    try:
        _FACTS_CACHE[target] = facts
    except TypeError:
        pass
    return facts


# Bytes of the generator state run_and_save_rng_state returns, per device
# type: CPU's mt19937 state (torch.get_rng_state()); CUDA/XPU's seed + philox
# offset (a host byte tensor). Other devices: not replayable.
_STATE_BYTES = {"cuda": 16, "xpu": 16}


def _cpu_state_bytes() -> int:
    if "cpu" not in _STATE_BYTES:
        _STATE_BYTES["cpu"] = int(torch.get_rng_state().numel())
    return _STATE_BYTES["cpu"]


def draws_random(node: fx.Node, facts: OpFacts) -> bool:
    """Whether this call of a random op (``facts.rng``) draws: an attention op
    whose ``dropout_p`` is 0 (given as 0 or left at its default) draws nothing
    and leaves the generator where it was, so it is as deterministic as a
    matmul (replaying it needs no saved state)."""
    if not facts.rng:
        return False
    if "dropout_p" in facts.arg_names:
        p = _arg_value(node, facts, facts.arg_names.index("dropout_p"))
        if p is None or (isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0):
            return False
    return True


def rng_state_bytes(node: fx.Node) -> int:
    """Bytes of the generator state a replay of random op ``node`` keeps; 0 = not replayable.

    Replayable: an aten operator tagged ``nondeterministic_seeded`` drawing from
    its device's default generator (no ``generator=``), on a device whose state
    ``run_and_save_rng_state`` can save (cpu, cuda, xpu), read from a tensor
    argument or the ``device=`` keyword.
    """
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return 0
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return 0
    facts = op_facts(target)
    if "generator" in facts.arg_names:
        if _arg_value(node, facts, facts.arg_names.index("generator")) is not None:
            return 0
    device = node.kwargs.get("device")
    if device is None:
        for arg in node.all_input_nodes:
            val = fx_meta.val(arg)
            if isinstance(val, torch.Tensor):
                device = val.device
                break
    if device is None:
        return 0
    kind = torch.device(device).type
    if kind == "cpu":
        return _cpu_state_bytes()
    return _STATE_BYTES.get(kind, 0)


_COPY_TARGETS = frozenset({"aten::clone"})


def may_be_exact_copy(target: Any) -> bool:
    """Whether a node calling ``target`` can be an exact copy at all (:func:`is_exact_copy`'s target test)."""
    return isinstance(target, torch._ops.OpOverload) and target.name() in _COPY_TARGETS


def is_exact_copy(node: fx.Node) -> bool:
    """``node`` returns its one tensor input bit for bit in the same layout (a clone
    whose output has the input's dtype, device, shape and strides, all static), so
    a reader of the copy may read the input instead (the core decides: ``copy``
    in docs/graph-format.md)."""
    if not may_be_exact_copy(node.target):
        return False
    inputs = node.all_input_nodes
    if len(inputs) != 1 or node.args[:1] != (inputs[0],):
        return False
    out, src = fx_meta.val(node), fx_meta.val(inputs[0])
    if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    if out.dtype != src.dtype or out.device != src.device or out.layout != torch.strided or src.layout != torch.strided:
        return False
    dims = (*out.shape, *out.stride(), *src.shape, *src.stride())
    for d in dims:  # a plain loop: this runs for every clone of a large graph
        if type(d) is not int and isinstance(d, _PY_SYM_TYPES):
            return False
    return tuple(out.shape) == tuple(src.shape) and tuple(out.stride()) == tuple(src.stride())


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
    if not arg_indices:
        return []
    args = node.args
    out: set[int] = set()
    for i in arg_indices:
        value = args[i] if i < len(args) else _arg_value(node, facts, i)
        if isinstance(value, fx.Node):  # the common case: one tensor argument
            p = pos_of.get(value)
            if p is not None:
                out.add(p)
            continue
        for n in _nodes_in(value):
            p = pos_of.get(n)
            if p is not None:
                out.add(p)
    return sorted(out)
