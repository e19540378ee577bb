"""Sharded constructs hyper_ac does not plan yet, refused by name before the core sees the graph.

Supported (docs/sharded.md): tensor and sequence parallelism (DTensor), FSDP2,
FSDP2 × TP, and pipeline parallelism with a compiled stage module per rank
(``torch.distributed.pipelining`` GPipe / 1F1B; zero-bubble schedules refuse
compiled stages themselves). Refused here, with what to do instead:

* context parallelism: CP's DTensor dispatcher (ring attention for SDPA) is on
  while the step is planned, or the graph holds flex-attention CP's ops
  (``cplib::``). Its collectives sit inside attention kernels the core cannot
  see, and their replay has never been checked against ``off``.
* async tensor parallelism under Inductor (``torch._inductor.config._micro_pipeline_tp``):
  Inductor fuses all-gathers into matmuls after the partition, so the core's
  decision about a forward all-gather would be made on a graph that is not the
  one that runs.

Mode ``off`` is never refused: it is stock's partition.
"""

from __future__ import annotations

import sys
from typing import Iterable, Optional

import torch.fx as fx

__all__ = ["UnsupportedShardingError", "CONTEXT_PARALLEL_NAMESPACES", "check_supported"]

#: Operator namespaces of context parallelism's own ops (flex attention CP's all-gathers).
CONTEXT_PARALLEL_NAMESPACES = frozenset({"cplib"})

_WHAT_TO_DO = ("plan the step without it, or compile it with ac_mode off (stock's partition) and "
               "checkpoint with torch.utils.checkpoint")


class UnsupportedShardingError(ValueError):
    """A sharded construct hyper_ac does not plan yet (which one, and what to do, in the message)."""


def _context_parallel_dispatcher_on() -> bool:
    """CP's DTensor op handlers (``_enable_context_parallel_dispatcher`` / ``context_parallel``) are installed."""
    if "torch.distributed.tensor" not in sys.modules:  # nothing sharded was ever built: no import cost
        return False
    from torch.distributed.tensor import DTensor

    handlers = getattr(DTensor._op_dispatcher, "_custom_op_handlers", {}) or {}
    return any(getattr(h, "__module__", "").startswith("torch.distributed.tensor.experimental._context_parallel")
               for h in handlers.values())


def _namespace(target) -> Optional[str]:
    return getattr(target, "namespace", None)


def check_supported(graph: fx.Graph, compiler: str, *, stage: str = "plan") -> None:
    """Raise :class:`UnsupportedShardingError` for a construct hyper_ac does not plan.

    ``graph``: the joint graph about to be planned; ``compiler``: the one that will
    run it (``eager`` | ``inductor``); ``stage``: named in the message."""
    if _context_parallel_dispatcher_on():
        raise UnsupportedShardingError(
            f"hyper_ac {stage}: context parallelism is not supported yet (CP's DTensor dispatcher for "
            f"scaled_dot_product_attention is enabled: context_parallel() or _enable_context_parallel_dispatcher()); "
            f"{_WHAT_TO_DO} (docs/sharded.md)")
    for node in _call_nodes(graph.nodes):
        if _namespace(node.target) in CONTEXT_PARALLEL_NAMESPACES:
            raise UnsupportedShardingError(
                f"hyper_ac {stage}: node {node.name!r} ({node.target}) is context parallelism's op; context "
                f"parallelism is not supported yet: {_WHAT_TO_DO} (docs/sharded.md)")
    if compiler == "inductor":
        import torch._inductor.config as inductor_config

        if getattr(inductor_config, "_micro_pipeline_tp", False):
            raise UnsupportedShardingError(
                f"hyper_ac {stage}: async tensor parallelism (torch._inductor.config._micro_pipeline_tp=True) is "
                "not supported yet: Inductor fuses all-gathers into matmuls after hyper_ac's partition. Set it "
                f"False, or {_WHAT_TO_DO} (docs/sharded.md)")


def _call_nodes(nodes: Iterable[fx.Node]) -> Iterable[fx.Node]:
    # One visit per distinct target: a million-node graph has a few hundred.
    seen: set = set()
    for node in nodes:
        if node.op == "call_function":
            key = id(node.target)
            if key not in seen:
                seen.add(key)
                yield node
