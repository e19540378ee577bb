"""What the eager compiler's generated code calls for a random-op replay: torch's kernels, dispatch-mode safe.

A replayed random op is written into the graph with torch's higher-order ops
``run_and_save_rng_state`` / ``run_with_rng_state`` (:mod:`hyper_ac.lower.apply`;
stock's partition writes the same for a random op the model's own checkpoint
tags recompute), which every torch tool reads: Inductor lowers them, the
serializer and the core see them as random ops.

Called as a higher-order op, though, each goes through the dispatcher's Python
key whenever a ``TorchDispatchMode`` is active (``FlopCounterMode``, memory
trackers, debug modes, profilers built on modes), and there torch looks up a
rule for that mode's exact type. These two ops have rules for
``ProxyTorchDispatchMode`` and fake tensors only, so under any other mode the
call raises ``NotImplementedError`` (a mode without
``supports_higher_order_operators``) or returns the ``NotImplemented`` of the
mode's ``__torch_dispatch__`` (``FlopCounterMode``), which the generated code
then indexes: ``TypeError: 'NotImplementedType' object is not subscriptable``.

Run as FX code, the ops need not be dispatched as higher-order ops at all:
:func:`use_mode_safe_rng_ops` points each node at the op's own per-device
kernel (the one its ``BackendSelect`` rule runs when no mode is active: read or
set the generator state, call the wrapped op, restore the state). The wrapped
op (``native_dropout``, ``rand``, ...) is then dispatched as an ordinary op,
so a mode sees it as it would in stock, and the numbers are those the
higher-order op computes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch._C import DispatchKey
from torch._prims import rng_prims

__all__ = ["run_and_save_rng_state", "run_with_rng_state", "graphsafe_run_with_rng_state", "use_mode_safe_rng_ops",
           "MODE_SAFE_RNG_OPS"]


def _kernel(hop: Any):
    kernel = hop.py_kernels.get(DispatchKey.BackendSelect)
    if kernel is None:
        raise RuntimeError(f"hyper_ac: torch {torch.__version__} has no BackendSelect kernel for "
                           f"{hop.name()}; the eager compiler needs it to replay random ops "
                           "(use ac_rng: save, or the torch version hyper_ac pins)")
    return kernel


_SAVE_KERNEL = _kernel(rng_prims.run_and_save_rng_state)
_REPLAY_KERNEL = _kernel(rng_prims.run_with_rng_state)
_GRAPHSAFE_KERNEL = _kernel(rng_prims.graphsafe_run_with_rng_state)


def run_and_save_rng_state(op: Any, *args: Any, **kwargs: Any):
    """``(generator state before, op(*args, **kwargs))`` on the op's device; ``op`` is dispatched as usual."""
    return _SAVE_KERNEL(op, *args, **kwargs)


def run_with_rng_state(rng_state: torch.Tensor, op: Any, *args: Any, **kwargs: Any):
    """``op(*args, **kwargs)`` drawn from ``rng_state``; the device's generator is restored afterwards."""
    return _REPLAY_KERNEL(rng_state, op, *args, **kwargs)


def graphsafe_run_with_rng_state(op: Any, *args: Any, rng_state: Any = None, **kwargs: Any):
    """Stock's CUDA-graph-safe replay (its partition writes it for a recomputed random op on CUDA)."""
    return _GRAPHSAFE_KERNEL(op, *args, rng_state=rng_state, **kwargs)


#: torch's random-op replay higher-order op -> the plain function here that stands for it.
MODE_SAFE_RNG_OPS = {
    rng_prims.run_and_save_rng_state: run_and_save_rng_state,
    rng_prims.run_with_rng_state: run_with_rng_state,
    rng_prims.graphsafe_run_with_rng_state: graphsafe_run_with_rng_state,
}


def use_mode_safe_rng_ops(gm: fx.GraphModule) -> int:
    """Point every random-op replay node (``run_and_save_rng_state``, ``run_with_rng_state``,
    ``graphsafe_run_with_rng_state``) of a module that runs as FX code at the
    function of the same name here; returns the count. The caller recompiles."""
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in MODE_SAFE_RNG_OPS:
            node.target = MODE_SAFE_RNG_OPS[node.target]
            count += 1
    return count
