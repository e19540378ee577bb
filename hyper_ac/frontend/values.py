"""Per-node values the graph document records: hinted shapes, output facts (bytes,
dtype, shape) and the FLOPs of one call, from a node's ``meta["val"]`` and its
operator's facts (:mod:`hyper_ac.frontend.op_facts`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from hyper_ac import fx_meta
from hyper_ac.frontend.op_facts import _PY_SYM_TYPES, OpFacts, dtype_name



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
        return fx_meta.val(a)
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
        value = fx_meta.val(value)
    if isinstance(value, torch.Tensor):
        shape = value.shape
        for s in shape:
            if type(s) is not int:  # symbolic: the hinted sizes
                return (_shape(value, fallback), value.dtype)
        return (shape, value.dtype)  # a torch.Size is a tuple: no copy (_shape's) needed
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
                _signature(fx_meta.val(node), fallback),
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
        out = _with_hinted_shapes(fx_meta.val(node), fallback)
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
