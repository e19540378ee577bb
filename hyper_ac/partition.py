"""Split a rewritten joint graph into forward and backward modules.

After the pass, the backward already holds every recomputed duplicate, so the
split only has to save what the rewritten backward reads: no second optimiser
runs, and the plan's saved set is exactly the partition's.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import fx
from torch._functorch import partitioners as _partitioners

__all__ = ["saved_values", "partition_joint"]


def _is_backward(node: fx.Node) -> bool:
    return bool(node.meta.get("autograd_backward", False))


def saved_values(gm: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node]]:
    """(tensors, symbolic scalars) of the forward that the backward reads, in graph order."""
    tensors: list[fx.Node] = []
    symbolic: list[fx.Node] = []
    for node in gm.graph.nodes:
        if _is_backward(node) or node.op == "output":
            continue
        readers = [u for u in node.users if _is_backward(u) and u.op != "output"]
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
    val = node.meta.get("val")
    return isinstance(val, (tuple, list)) and node.op == "call_function"


def _drop_stray_random_ops(bw_module: fx.GraphModule, joint_module: fx.GraphModule) -> None:
    """Erase forward random ops the extraction copied into the backward with no reader.

    ``_extract_fwd_bwd_modules`` can carry a forward random op over (with the
    recomputation feeding it) although no backward node reads it; a random op
    is impure, so dead-code elimination keeps it, and it would draw from the
    user's generator on every backward. Backward random ops of the joint itself
    are left alone.
    """
    joint_backward = {n.name for n in joint_module.graph.nodes if _is_backward(n)}
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
    **_: Any,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The partition_fn contract of aot_autograd, for an already rewritten joint graph."""
    tensors, symbolic = saved_values(joint_module)
    static_nodes = None
    if static_lifetime_input_indices:
        placeholders = [n for n in joint_module.graph.nodes if n.op == "placeholder"]
        from torch.utils._ordered_set import OrderedSet

        static_nodes = OrderedSet(placeholders[i] for i in static_lifetime_input_indices)
    fw_module, bw_module = _partitioners._extract_fwd_bwd_modules(
        joint_module,
        tensors,
        saved_sym_nodes=symbolic,
        num_fwd_outputs=num_fwd_outputs,
        static_lifetime_input_nodes=static_nodes,
    )
    _drop_stray_random_ops(bw_module, joint_module)
    fw_module.graph.eliminate_dead_code()
    bw_module.graph.eliminate_dead_code()
    fw_module.recompile()
    bw_module.recompile()
    return fw_module, bw_module
