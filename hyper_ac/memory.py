"""Exact CPU tensor-memory measurement through c10's allocator.

``hyper_ac._memory`` (C++, links only LibTorch's c10) installs a counting
wrapper around torch's CPU allocator.  While a :class:`track` block is open it
counts the bytes every ``allocate(n)`` request received and, through its own
deleter, the bytes given back when that memory is freed.  Memory allocated
before a block (or while no block is open) is never counted, also not when it
is freed inside a block, so the figures cannot go negative or drift.

Typical use::

    from hyper_ac import memory

    with memory.track() as t:
        loss = model(x).sum()
        loss.backward()
    print(t.peak_bytes, t.current_bytes)

    # per-node timeline of an FX graph
    with memory.track() as t:
        out = t.run_graph(gm, x)
    for rec in t.timeline:
        print(rec.name, rec.current_bytes, rec.peak_bytes)

See docs/memory.md for how it works and what it does not see.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch  # loads libc10 before the extension needs it
import torch.fx

try:
    from hyper_ac import _memory as _C
except ImportError as exc:  # built without torch, or not built at all
    _C = None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

__all__ = [
    "NodeMemory",
    "StepMemory",
    "TrackingInterpreter",
    "is_available",
    "loss_of",
    "measure_step",
    "require_countable",
    "run_graph",
    "track",
]


def is_available() -> bool:
    """True when the ``hyper_ac._memory`` extension is built and importable."""
    return _C is not None


def _require() -> Any:
    if _C is None:
        raise RuntimeError(
            "hyper_ac._memory is not available (the package was built without "
            f"torch's c10, or not built): {_IMPORT_ERROR}"
        )
    return _C


class NodeMemory(NamedTuple):
    """Memory after one FX node, in bytes relative to the start of the block.

    ``current_bytes``: live tracked bytes once the node ran and the interpreter
    dropped the values it no longer needs.  ``peak_bytes``: the block's peak so
    far.  ``node_peak_bytes``: the highest live figure while the node ran (its
    inputs plus everything it allocated, temporaries included).
    """

    name: str
    op: str
    target: str
    current_bytes: int
    peak_bytes: int
    node_peak_bytes: int


class track:
    """Context manager measuring tensor memory allocated inside the block.

    ``current_bytes``: bytes allocated inside the block through torch's CPU
    allocator and not yet freed.  ``peak_bytes``: the maximum of that figure
    during the block.  Both are live while the block is open and frozen when
    it closes.  Blocks nest (each sees its own figures; an inner block does not
    disturb the outer one) and an object can be entered again, which starts
    from zero and clears ``timeline``.  Counting is process-wide: allocations
    from every thread count.
    """

    def __init__(self) -> None:
        self._scope: int | None = None
        self._current = 0
        self._peak = 0
        self.timeline: list[NodeMemory] = []

    def __enter__(self) -> track:
        mod = _require()
        if self._scope is not None:
            raise RuntimeError("this track() block is already open")
        self._current = 0
        self._peak = 0
        self.timeline = []
        self._scope = mod.push_scope()
        return self

    def __exit__(self, *exc_info: object) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            self._current, self._peak = _C.pop_scope(scope)

    @property
    def active(self) -> bool:
        return self._scope is not None

    def _stats(self) -> tuple[int, int]:
        if self._scope is None:
            return self._current, self._peak
        return _C.scope_stats(self._scope)

    @property
    def current_bytes(self) -> int:
        return self._stats()[0]

    @property
    def peak_bytes(self) -> int:
        return self._stats()[1]

    def reset_peak(self) -> None:
        """Lower the peak to the current figure (block must be open)."""
        if self._scope is None:
            raise RuntimeError("reset_peak() needs an open track() block")
        _C.reset_peak(self._scope)

    def run_graph(self, gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        """Run ``gm`` node by node, appending a :class:`NodeMemory` per node
        to ``self.timeline``.  Opens the block for the run if it is not open."""
        if self._scope is None:
            with self:
                return self.run_graph(gm, *args, **kwargs)
        return TrackingInterpreter(gm, tracker=self).run(*args, **kwargs)

    def __repr__(self) -> str:
        state = "open" if self.active else "closed"
        return (
            f"<track {state} current_bytes={self.current_bytes} "
            f"peak_bytes={self.peak_bytes} nodes={len(self.timeline)}>"
        )


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    try:
        return torch.fx.node._get_qualified_name(target)
    except Exception:  # builtins, partials, ... : best effort for display
        return getattr(target, "__name__", repr(target))


class TrackingInterpreter(torch.fx.Interpreter):
    """``torch.fx.Interpreter`` that records a :class:`NodeMemory` per node.

    Records go to ``self.timeline`` (the latest run) and are appended to
    ``tracker.timeline`` (every run inside the block).  Figures are
    relative to the ``tracker`` block; without a tracker (or with a closed
    one) ``run`` opens a block of its own for the run.  A node's figures are
    taken after the interpreter freed the values whose last use it was, so
    ``current_bytes`` is the memory live between this node and the next.
    """

    def __init__(
        self,
        module: torch.fx.GraphModule,
        tracker: track | None = None,
        garbage_collect_values: bool = True,
        graph: torch.fx.Graph | None = None,
    ) -> None:
        _require()
        super().__init__(module, garbage_collect_values=garbage_collect_values, graph=graph)
        self.tracker = tracker if tracker is not None else track()
        self.timeline: list[NodeMemory] = []
        self._pending: tuple[torch.fx.Node, int] | None = None

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if not self.tracker.active:
            with self.tracker:
                return self.run(*args, **kwargs)
        self._pending = None
        self.timeline = []
        try:
            return super().run(*args, **kwargs)
        finally:
            self._flush()

    def run_node(self, n: torch.fx.Node) -> Any:
        # The previous node's record is completed here, after the base loop
        # dropped the values that node used last.
        self._flush()
        before = self.tracker.current_bytes
        scope = _C.push_scope()
        try:
            result = super().run_node(n)
        finally:
            _, node_peak = _C.pop_scope(scope)
        self._pending = (n, before + node_peak)
        return result

    def _flush(self) -> None:
        if self._pending is None:
            return
        node, node_peak = self._pending
        self._pending = None
        current, peak = self.tracker._stats()
        rec = NodeMemory(
            name=node.name,
            op=node.op,
            target=_target_name(node.target),
            current_bytes=current,
            peak_bytes=peak,
            node_peak_bytes=max(node_peak, current),
        )
        self.timeline.append(rec)
        if self.tracker.timeline is not self.timeline:
            self.tracker.timeline.append(rec)


def run_graph(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> tuple[Any, track]:
    """Run ``gm`` under a fresh :class:`track` block; returns (outputs, tracker)."""
    t = track()
    out = t.run_graph(gm, *args, **kwargs)
    return out, t


#: The devices whose allocations :class:`track` counts.
COUNTED_DEVICES = ("cpu",)


def require_countable(device: Any, caller: str) -> None:
    """Raise ``ValueError`` unless :class:`track` counts ``device``'s allocations (the CPU's only)."""
    device = torch.device(device)
    if device.type not in COUNTED_DEVICES:
        raise ValueError(
            f"hyper_ac.memory.{caller}: the step runs on device {str(device)!r}, whose allocations hyper_ac's counting "
            f"allocator does not see (it counts {', '.join(COUNTED_DEVICES)} memory only), so its peak would read "
            "about zero; measure the step on the CPU, or read that device's own allocator statistics "
            "(for CUDA, torch.cuda.max_memory_allocated)")


def loss_of(out: Any) -> torch.Tensor:
    """The loss of a model's output: the tensor itself, or its ``loss`` attribute / key (HF outputs)."""
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None:
        raise ValueError(f"model output {type(out).__name__} carries no loss")
    return loss


class StepMemory(NamedTuple):
    """One measured training step (:func:`measure_step`), bytes relative to the step's start.

    ``peak_bytes``: the step's peak. ``forward_bytes``: live when the forward
    returned (what it keeps for the backward, its outputs included).
    ``loss``: the step's loss, detached.
    """

    peak_bytes: int
    forward_bytes: int
    loss: torch.Tensor


def measure_step(forward: Callable[[], Any]) -> StepMemory:
    """Run one training step, ``out = forward()`` then ``loss_of(out).backward()``, under :class:`track`.

    The output stays alive through the backward (as a loop that keeps ``outputs``
    does, and as the joint graph's simulation assumes). What existed before the
    step (parameters, the batch, gradients already allocated) is not counted:
    clear ``.grad`` first to count the gradients the step allocates.

    The counting allocator is the CPU's: a step whose loss lives on another
    device (CUDA, the meta device) would measure about zero, so it raises
    ``ValueError`` naming the device instead.
    """
    with track() as t:
        out = forward()
        loss = loss_of(out)
        require_countable(loss.device, "measure_step")
        forward_bytes = t.current_bytes
        loss.backward()
        del out
    return StepMemory(t.peak_bytes, forward_bytes, loss.detach())
