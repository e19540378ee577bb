"""Exact tensor-memory measurement: the CPU through c10's allocator, CUDA through its caching allocator.

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

On a CUDA device (``track("cuda")``) the figures come from the caching
allocator's own statistics instead (``torch.cuda.memory_allocated`` /
``max_memory_allocated``, bytes handed to tensors, not the segments it holds;
``reserved_peak_bytes`` reports those beside them). Any other device raises
``ValueError`` naming it: it has no counter, and its peak would read zero.

See docs/memory.md for how it works and what it does not see.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple, Optional

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


class _CpuCounter:
    """The counting allocator's scopes (``hyper_ac._memory``): exact, per block, process-wide."""

    device = torch.device("cpu")

    def push(self) -> Any:
        return _require().push_scope()

    def pop(self, handle: Any) -> tuple[int, int]:
        return _C.pop_scope(handle)

    def stats(self, handle: Any) -> tuple[int, int]:
        return _C.scope_stats(handle)

    def reset_peak(self, handle: Any) -> None:
        _C.reset_peak(handle)

    def reserved_peak(self, handle: Any) -> Optional[int]:
        return None


class _CudaScope:
    __slots__ = ("base", "peak", "closed")

    def __init__(self, base: int) -> None:
        self.base, self.peak, self.closed = base, base, False


class _CudaCounter:
    """A CUDA device's caching-allocator statistics as nested scopes.

    The device keeps one peak; a scope opened inside another resets it, so the
    open scopes fold the device's peak into their own first (their figures stay
    whole). Figures are differences of the device's totals: memory freed in a
    block that was allocated before it lowers ``current_bytes`` (which can go
    below zero, unlike the CPU's), and every stream and thread on the device counts.
    """

    _open: dict = {}  # device index -> the open scopes, outermost first

    def __init__(self, device: torch.device) -> None:
        if not torch.cuda.is_available():
            raise ValueError(f"hyper_ac.memory: device {str(device)!r} was asked for, but CUDA is not available here")
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)

    def _fold(self) -> None:
        peak = torch.cuda.max_memory_allocated(self.device)
        for scope in self._open.get(self.device.index, []):
            scope.peak = max(scope.peak, peak)

    def push(self) -> _CudaScope:
        torch.cuda.synchronize(self.device)
        self._fold()
        torch.cuda.reset_peak_memory_stats(self.device)
        scope = _CudaScope(torch.cuda.memory_allocated(self.device))
        self._open.setdefault(self.device.index, []).append(scope)
        return scope

    def stats(self, scope: _CudaScope) -> tuple[int, int]:
        if not scope.closed:
            torch.cuda.synchronize(self.device)
            scope.peak = max(scope.peak, torch.cuda.max_memory_allocated(self.device))
        return torch.cuda.memory_allocated(self.device) - scope.base, scope.peak - scope.base

    def pop(self, scope: _CudaScope) -> tuple[int, int]:
        figures = self.stats(scope)
        scope.closed = True
        scopes = self._open.get(self.device.index, [])
        if scope in scopes:
            scopes.remove(scope)
        return figures

    def reset_peak(self, scope: _CudaScope) -> None:
        torch.cuda.synchronize(self.device)
        self._fold()  # the other open scopes keep their peaks
        torch.cuda.reset_peak_memory_stats(self.device)
        scope.peak = torch.cuda.memory_allocated(self.device)

    def reserved_peak(self, scope: _CudaScope) -> Optional[int]:
        return torch.cuda.max_memory_reserved(self.device)


#: The device types whose allocations :class:`track` counts.
COUNTED_DEVICES = ("cpu", "cuda")


def _counter(device: Any) -> Any:
    device = torch.device(device)
    if device.type == "cpu":
        return _CpuCounter()
    if device.type == "cuda":
        return _CudaCounter(device)
    raise ValueError(
        f"hyper_ac.memory: device {str(device)!r} has no allocator hyper_ac can count (it counts "
        f"{', '.join(COUNTED_DEVICES)} memory), so its peak would read zero; measure the step on the CPU or a CUDA device")


class track:
    """Context manager measuring tensor memory allocated inside the block, on ``device`` (default the CPU).

    ``current_bytes``: bytes allocated inside the block through torch's CPU
    allocator and not yet freed (on CUDA: the change of the device's allocated bytes).  ``peak_bytes``: the maximum of that figure
    during the block.  Both are live while the block is open and frozen when
    it closes.  Blocks nest (each sees its own figures; an inner block does not
    disturb the outer one) and an object can be entered again, which starts
    from zero and clears ``timeline``.  Counting is process-wide: allocations
    from every thread count.
    """

    def __init__(self, device: Any = "cpu") -> None:
        self._counter = _counter(device)
        self._scope: Any = None
        self._current = 0
        self._peak = 0
        self._reserved: Optional[int] = None
        self.timeline: list[NodeMemory] = []

    @property
    def device(self) -> torch.device:
        return self._counter.device

    def __enter__(self) -> track:
        if self._scope is not None:
            raise RuntimeError("this track() block is already open")
        self._current = 0
        self._peak = 0
        self.timeline = []
        self._scope = self._counter.push()
        return self

    def __exit__(self, *exc_info: object) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            self._reserved = self._counter.reserved_peak(scope)
            self._current, self._peak = self._counter.pop(scope)

    @property
    def active(self) -> bool:
        return self._scope is not None

    def _stats(self) -> tuple[int, int]:
        if self._scope is None:
            return self._current, self._peak
        return self._counter.stats(self._scope)

    @property
    def current_bytes(self) -> int:
        return self._stats()[0]

    @property
    def peak_bytes(self) -> int:
        return self._stats()[1]

    @property
    def reserved_peak_bytes(self) -> Optional[int]:
        """CUDA: the caching allocator's peak reserved bytes (segments, cached blocks included) since the
        block opened or its peak was last reset; None on the CPU, whose counter sees tensors only."""
        if self._scope is None:
            return self._reserved
        return self._counter.reserved_peak(self._scope)

    def reset_peak(self) -> None:
        """Lower the peak to the current figure (block must be open)."""
        if self._scope is None:
            raise RuntimeError("reset_peak() needs an open track() block")
        self._counter.reset_peak(self._scope)

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
        counter = self.tracker._counter
        scope = counter.push()
        try:
            result = super().run_node(n)
        finally:
            _, node_peak = counter.pop(scope)
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


def run_graph(gm: torch.fx.GraphModule, *args: Any, device: Any = "cpu", **kwargs: Any) -> tuple[Any, track]:
    """Run ``gm`` under a fresh :class:`track` block on ``device``; returns (outputs, tracker)."""
    t = track(device)
    out = t.run_graph(gm, *args, **kwargs)
    return out, t


def require_countable(device: Any, caller: str) -> None:
    """Raise ``ValueError`` unless :class:`track` counts ``device``'s allocations (the CPU's; CUDA's where available)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return
    if device.type not in ("cpu",):
        raise ValueError(
            f"hyper_ac.memory.{caller}: the step runs on device {str(device)!r}, whose allocations hyper_ac cannot "
            f"count (it counts the CPU's and, where CUDA is available, CUDA's), so its peak would read "
            "about zero; measure the step on the CPU or a CUDA device")


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
    ``loss``: the step's loss, detached. ``device``: where it was counted.
    ``reserved_peak_bytes``: on CUDA, the caching allocator's peak reserved
    bytes over the step (what ``nvidia-smi`` sees grows with it); None on the CPU.
    """

    peak_bytes: int
    forward_bytes: int
    loss: torch.Tensor
    device: str = "cpu"
    reserved_peak_bytes: Optional[int] = None


def measure_step(forward: Callable[[], Any], device: Any = None) -> StepMemory:
    """Run one training step, ``out = forward()`` then ``loss_of(out).backward()``, under :class:`track`.

    The output stays alive through the backward (as a loop that keeps ``outputs``
    does, and as the joint graph's simulation assumes). What existed before the
    step (parameters, the batch, gradients already allocated) is not counted:
    clear ``.grad`` first to count the gradients the step allocates.

    ``device``: where to count; by default the device of the step's loss (the
    CPU, and where CUDA is initialised the current CUDA device, are counted
    from the start of the step, the loss's kept). A loss on a device neither
    counts (the meta device, a CUDA device other than the current one) raises
    ``ValueError`` naming the device.
    """
    if device is not None:
        trackers = {torch.device(device): track(device)}
    else:
        trackers = {torch.device("cpu"): track("cpu")}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            current = torch.device("cuda", torch.cuda.current_device())
            trackers[current] = track(current)
    with contextlib.ExitStack() as stack:
        for tracker in trackers.values():
            stack.enter_context(tracker)
        out = forward()
        loss = loss_of(out)
        where = loss.device if loss.device.type != "cuda" or loss.device.index is not None else torch.device(
            "cuda", torch.cuda.current_device())
        require_countable(where, "measure_step")
        chosen = trackers.get(torch.device(device) if device is not None else where)
        if chosen is None:
            raise ValueError(f"hyper_ac.memory.measure_step: the loss is on {str(where)!r}, but the step was counted "
                             f"on {', '.join(str(d) for d in trackers)}; pass device={str(where)!r} or make it current")
        forward_bytes = chosen.current_bytes
        loss.backward()
        del out
    return StepMemory(chosen.peak_bytes, forward_bytes, loss.detach(), str(chosen.device), chosen.reserved_peak_bytes)
