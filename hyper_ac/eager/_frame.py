"""Checkpoint frames: the per-call object that owns the forward placeholders
and every replay of one ``hyper_ac.eager.checkpoint`` call.

Vocabulary used in this file:

* *holder*   -- the object the forward pack hook hands to autograd instead of
  the tensor.  Autograd keeps it alive for exactly as long as it would have
  kept the real saved tensor.
* *key*      -- identifies one replay of a frame.  Without a session it is the
  autograd graph task (or ``GraphExecGroup``) performing the unpack, exactly as
  in ``torch.utils.checkpoint``; for a frame bound to a recompute session it is
  the session object itself, so several graph tasks share one replay.
* *slot*     -- a tiny per-(holder, key) object.  The replayed tensor lives in
  ``frame.recomputed[key]`` (a weak-key dictionary keyed by slots), so dropping
  the slot (after an unpack, or when autograd frees the holder) drops the
  tensor.

Hot path rule: the unpack hook only reads attributes of the frame and of the
session bound to it.  It takes no lock and reads no ``contextvars`` value, so
an autograd worker thread that does not share the caller's context sees the
same session as the caller.
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from typing import Any, Callable

import torch
from torch._C._autograd import _make_saved_tensor
from torch.utils.checkpoint import CheckpointError

__all__: list[str] = []

# Per-thread runtime state.  Only the forward of a checkpoint, the replay and
# the exclude wrapper touch it; the unpack hook itself does not (a replay that
# an unpack starts pushes onto the stack of the thread running it).
_tls = threading.local()


def invocation_stack() -> list:
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = []
        _tls.stack = stack
    return stack


def current_invocation():
    stack = getattr(_tls, "stack", None)
    return stack[-1] if stack else None


def replay_in_progress() -> bool:
    """True while this thread runs the replay of some frame."""
    return any(inv.replaying for inv in getattr(_tls, "stack", ()))


def scheduled_replay_depth() -> int:
    return getattr(_tls, "scheduled", 0)


class _StopReplay(Exception):
    """Raised inside a replay once everything the frame needs was produced."""


class _Holder:
    __slots__ = ("slots", "__weakref__")

    def __init__(self) -> None:
        # key -> _Slot (value available) or None (already handed out)
        self.slots: dict[Any, _Slot | None] = {}


class _Slot:
    __slots__ = ("__weakref__",)


class _GraphTaskKey:
    """Key for an unpack that happens outside any backward pass."""

    __slots__ = ("__weakref__",)


_get_graph_exec_group = getattr(torch._C, "_get_graph_exec_group", None)


def _native_key():
    # Same key as torch.utils.checkpoint: the GraphExecGroup if one is active,
    # else the graph task running the unpack.
    if _get_graph_exec_group is not None:
        group = _get_graph_exec_group()
        if group is not None:
            return group
    gid = torch._C._current_graph_task_id()
    if gid == -1:
        return _GraphTaskKey()
    return gid


def _tensor_meta(x: torch.Tensor) -> dict[str, Any]:
    # The same metadata, in the same form, as torch.utils.checkpoint compares
    # (so the error text matches PyTorch's).
    return {"shape": x.shape, "dtype": x.dtype, "device": x.device}


METADATA_FNS: dict[str, Callable[[torch.Tensor], Any] | None] = {
    "default": _tensor_meta,
    "none": None,
}


class Invocation:
    """One run of a frame's function: its first forward or one replay."""

    __slots__ = ("frame", "replaying", "key", "saved", "exclude_done", "cursors")

    def __init__(self, frame: "Frame", replaying: bool, key: Any = None) -> None:
        self.frame = frame
        self.replaying = replaying
        self.key = key
        self.saved = 0  # tensors packed so far during this replay
        self.exclude_done = 0  # exclude records bound so far during this replay
        self.cursors: dict[int, int] = {}  # exclude wrapper id -> next record

    def replay_complete(self) -> bool:
        frame = self.frame
        return (
            self.saved >= len(frame.weak_holders)
            and self.exclude_done >= frame.exclude_needed
        )


class Frame:
    """State of one checkpoint call (see module docstring)."""

    def __init__(self, run_fn: Callable[..., Any], early_stop: bool,
                 metadata_fn: Callable[[torch.Tensor], Any] | None,
                 has_context_fn: bool) -> None:
        self.run_fn = run_fn
        self.early_stop = early_stop
        self.metadata_fn = metadata_fn
        self.has_context_fn = has_context_fn
        self.saved_args: list[Any] = []
        self.weak_holders: list[weakref.ReferenceType] = []
        self.metas: list[Any] = []
        self.recomputed: defaultdict[Any, weakref.WeakKeyDictionary] = defaultdict(
            weakref.WeakKeyDictionary)
        self.replayed: set[Any] = set()
        self.forward_completed = False
        self.ignore_count_mismatch = False
        # debug=True: PyTorch's callback that re-raises a CheckpointError with
        # the operator logs of the forward and the replay.
        self.unpack_error_cb: Callable[[CheckpointError], Any] | None = None
        # Written only by the session control plane (under its lock); read
        # without a lock by the unpack hook.
        self.active_session = None
        # checkpoint_exclude_wrapper state: wrapper id -> list of call records
        self.exclude_records: dict[int, list] = {}
        self.exclude_needed = 0
        # RNG bookkeeping, filled by checkpoint(): the exclude wrapper uses it
        # to fast-forward the RNG over a body that the replay skips.
        self.preserve_rng_state = False
        self.device_type = "cpu"
        self.rng_devices: list[int] = []

    # -- RNG ------------------------------------------------------------------
    def capture_rng(self):
        if not self.preserve_rng_state:
            return None
        device_states = []
        if self.rng_devices:
            module = torch.get_device_module(self.device_type)
            for device in self.rng_devices:
                with module.device(device):
                    device_states.append(module.get_rng_state())
        return torch.get_rng_state(), device_states

    def restore_rng(self, state) -> None:
        if state is None:
            return
        cpu_state, device_states = state
        torch.set_rng_state(cpu_state)
        if device_states:
            module = torch.get_device_module(self.device_type)
            for device, dev_state in zip(self.rng_devices, device_states):
                with module.device(device):
                    module.set_rng_state(dev_state)

    # -- inputs -----------------------------------------------------------
    def save_inputs(self, args: tuple) -> None:
        # A SavedTensor goes through the saved-tensor hooks active right now,
        # i.e. those of an enclosing checkpoint: the inputs of a nested
        # checkpoint are saved tensors of its parent.
        self.saved_args = [
            _make_saved_tensor(a, is_output=False) if isinstance(a, torch.Tensor) else a
            for a in args
        ]

    def inputs(self) -> list[Any]:
        return [
            a.unpack() if isinstance(a, torch._C._autograd.SavedTensor) else a
            for a in self.saved_args
        ]

    # -- forward hooks ----------------------------------------------------
    def pack(self, x: torch.Tensor) -> _Holder:
        holder = _Holder()
        self.weak_holders.append(weakref.ref(holder))
        if self.metadata_fn is not None:
            with torch.no_grad():
                self.metas.append(self.metadata_fn(x))
        return holder

    def unpack(self, holder: _Holder) -> torch.Tensor:
        if self.unpack_error_cb is None:
            return self._unpack(holder)
        try:
            return self._unpack(holder)
        except CheckpointError as error:
            self.unpack_error_cb(error)
            raise

    def _unpack(self, holder: _Holder) -> torch.Tensor:
        session = self.active_session
        key = session if session is not None else _native_key()
        if key not in self.replayed:
            self.replay(key)
        slot = holder.slots.get(key, _MISSING)
        if slot is _MISSING:
            raise RuntimeError(
                "hyper_ac.eager.checkpoint: internal error: the replay did not "
                "produce a tensor that autograd asked for")
        if slot is None:
            if session is not None:
                raise CheckpointError(
                    "hyper_ac.eager.checkpoint: Unpack is being triggered for a tensor "
                    "that was already unpacked once: a saved tensor of this checkpoint "
                    f"was already consumed in recompute session {session.session_id!r}, "
                    "which does not retain tensors on unpack. Use "
                    "recompute_session_ctx(..., retain_on_unpack=True) for every "
                    "backward pass except the last one.")
            extra = ""
            if _get_graph_exec_group is not None and _get_graph_exec_group() is not None:
                extra = (
                    "Performing two backward calls that overlap (i.e. require the same "
                    "saved activation in order to compute gradients) is not allowed while "
                    "under the torch.utils.checkpoint.GraphExecGroup context (a recompute "
                    "session with retain_on_unpack=True allows it). ")
            raise CheckpointError(
                "hyper_ac.eager.checkpoint: Unpack is being triggered for a tensor that "
                f"was already unpacked once. {extra}If you are calling ctx.saved_tensors "
                "in backward, make sure to do so only once.")
        value = self.recomputed[key][slot]
        if session is None or not session.retain:
            holder.slots[key] = None
        return value

    # -- replay -----------------------------------------------------------
    def ensure_replayed(self) -> None:
        """Replay for the key the current thread would unpack with."""
        session = self.active_session
        key = session if session is not None else _native_key()
        if key not in self.replayed:
            self.replay_reporting(key)

    def replay_reporting(self, key: Any, scheduled: bool = False) -> None:
        """``replay``, with checkpoint errors passed to the debug callback."""
        if self.unpack_error_cb is None:
            self.replay(key, scheduled)
            return
        try:
            self.replay(key, scheduled)
        except CheckpointError as error:
            self.unpack_error_cb(error)
            raise

    def replay(self, key: Any, scheduled: bool = False) -> None:
        if (self.early_stop and not self.weak_holders and self.exclude_needed == 0):
            # Nothing to produce: the replay would stop before its first op.
            self.replayed.add(key)
            return
        args = self.inputs()
        inv = Invocation(self, replaying=True, key=key)
        stack = invocation_stack()
        stack.append(inv)
        if scheduled:
            _tls.scheduled = scheduled_replay_depth() + 1
        try:
            with _ReplayHooks(self, inv), torch.enable_grad():
                self.run_fn(*args)
        except _StopReplay:
            pass
        finally:
            if scheduled:
                _tls.scheduled -= 1
            stack.pop()
        self.replayed.add(key)
        self._check_replay(key, inv)

    def forget(self, key: Any) -> None:
        """Drop everything a replay for ``key`` produced."""
        self.replayed.discard(key)
        self.recomputed.pop(key, None)
        for ref in self.weak_holders:
            holder = ref()
            if holder is not None:
                holder.slots.pop(key, None)

    def _check_replay(self, key: Any, inv: Invocation) -> None:
        if self.ignore_count_mismatch:
            return
        if inv.saved != len(self.weak_holders):
            raise CheckpointError(
                "hyper_ac.eager.checkpoint: A different number of tensors was saved "
                "during the original forward and recomputation.\n"
                f"Number of tensors saved during forward: {len(self.weak_holders)}\n"
                f"Number of tensors saved during recomputation: {inv.saved}.\n"
                "The checkpointed function must run the same operations when it is "
                "replayed; pass debug=True to see the operators of both runs.")
        if self.metadata_fn is None:
            return
        produced = self.recomputed[key]
        diffs = []
        for index, ref in enumerate(self.weak_holders):
            holder = ref()
            if holder is None:
                continue
            slot = holder.slots.get(key)
            if slot is None or slot not in produced:
                continue
            replayed_meta = self.metadata_fn(produced[slot])
            if replayed_meta != self.metas[index]:
                diffs.append(f"tensor at position {index}:\n"
                             f"saved metadata: {self.metas[index]}\n"
                             f"recomputed metadata: {replayed_meta}\n")
        if diffs:
            raise CheckpointError(
                "hyper_ac.eager.checkpoint: Recomputed values for the following tensors "
                "have different metadata than during the forward pass.\n"
                + "".join(diffs)
                + "The function is not deterministic in its shapes, or global state "
                "changed between the forward and the replay; pass debug=True to see "
                "the operators of both runs.")


_MISSING = object()


class ForwardHooks(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self, frame: Frame) -> None:
        super().__init__(frame.pack, frame.unpack)


class _ReplayHooks(torch.autograd.graph.saved_tensors_hooks):
    """Hooks active while a frame replays: route saved tensors to holders."""

    def __init__(self, frame: Frame, inv: Invocation) -> None:
        key = inv.key
        frame_ref = weakref.ref(frame)

        def pack(x: torch.Tensor) -> torch.Tensor:
            x = x.detach() if x.requires_grad else x
            target = frame_ref()
            index = inv.saved
            inv.saved += 1
            if index >= len(target.weak_holders):
                if not target.forward_completed:
                    # backward inside the checkpointed function during its own
                    # forward: more saves are expected, accept them.
                    target.ignore_count_mismatch = True
                    return x
                raise CheckpointError(
                    "hyper_ac.eager.checkpoint: trying to save more tensors during "
                    "recomputation than during the original forward pass. The "
                    "checkpointed function must run the same operations when it is "
                    "replayed; pass debug=True to see the operators of both runs.")
            holder = target.weak_holders[index]()
            if holder is not None:
                slot = _Slot()
                holder.slots[key] = slot
                target.recomputed[key][slot] = x
            if target.early_stop and inv.replay_complete():
                raise _StopReplay
            return x

        def unpack(x: torch.Tensor) -> torch.Tensor:
            # A backward through the replayed graph itself (backward inside the
            # checkpointed function) sees the real tensors.
            return x

        super().__init__(pack, unpack)
