"""Handles, prefire and recompute sessions (the control plane).

A *session* lets several backward passes (graph tasks) share one replay of a
checkpoint.  A frame joins a session when it is prefired with
``recompute_handle(handle, session_id)``; from then on every unpack of that
frame -- on any thread -- is served from the session's replay, until
``clear_recompute_session`` unbinds it.  ``recompute_session_ctx`` only
decides whether those unpacks keep the tensors (``retain_on_unpack=True``) or
hand them out once.

Everything in this file runs under ``_CONTROL_LOCK``; the unpack hook never
takes it (see ``_frame``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Hashable, Iterator

from . import _frame

__all__ = [
    "RecomputeHandle",
    "recompute_handle_collector_ctx",
    "recompute_handle",
    "recompute_session_ctx",
    "clear_recompute_session",
]

_CONTROL_LOCK = threading.RLock()
_SESSIONS: dict[Hashable, "_Session"] = {}

# Control-plane context (never read by the unpack hook).
_ACTIVE_SESSION: contextvars.ContextVar["_Session | None"] = contextvars.ContextVar(
    "hyper_ac_eager_active_session", default=None)
_COLLECTORS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar(
    "hyper_ac_eager_collectors", default=())


class _Session:
    __slots__ = ("session_id", "retain", "in_context", "frames", "__weakref__")

    def __init__(self, session_id: Hashable) -> None:
        self.session_id = session_id
        self.retain = False  # read by the unpack hook of every bound frame
        self.in_context = False
        self.frames: list[_frame.Frame] = []

    def __repr__(self) -> str:
        return f"<recompute session {self.session_id!r}>"


class RecomputeHandle:
    """Opaque reference to one checkpoint call, for ``recompute_handle``.

    A handle of a checkpoint that saved nothing for backward (it ran without
    grad mode, or under ``torch.compile``) is inert: prefiring it does nothing.
    """

    __slots__ = ("_frame", "__weakref__")

    def __init__(self, frame: "_frame.Frame | None") -> None:
        self._frame = frame

    def __repr__(self) -> str:
        state = "inert" if self._frame is None else f"{len(self._frame.weak_holders)} saved"
        return f"<hyper_ac.eager.RecomputeHandle {state}>"


def _check_session_id(session_id: Any) -> None:
    if session_id is None:
        raise ValueError("recompute session id must not be None")
    try:
        hash(session_id)
    except TypeError:
        raise ValueError(
            f"recompute session id must be hashable, got {type(session_id).__name__}"
        ) from None


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {type(value).__name__}: {value!r}")


def _get_or_create(session_id: Hashable) -> _Session:
    session = _SESSIONS.get(session_id)
    if session is None:
        session = _Session(session_id)
        _SESSIONS[session_id] = session
    return session


def collect(frame: "_frame.Frame | None") -> None:
    """Called by checkpoint(): hand a handle to every active collector."""
    collectors = _COLLECTORS.get()
    if collectors:
        handle = RecomputeHandle(frame)
        for bucket in collectors:
            bucket.append(handle)


@contextlib.contextmanager
def recompute_handle_collector_ctx() -> Iterator[list]:
    """Yield a list that receives a handle for each checkpoint call inside.

    Collectors may nest; every active collector receives each handle.
    Checkpoint calls made by a replay are not collected.
    """
    bucket: list[RecomputeHandle] = []
    token = _COLLECTORS.set(_COLLECTORS.get() + (bucket,))
    try:
        yield bucket
    finally:
        _COLLECTORS.reset(token)


def recompute_handle(handle: RecomputeHandle, session_id: Hashable) -> None:
    """Replay ``handle``'s checkpoint now and keep its tensors for the session.

    The frame stays bound to the session until ``clear_recompute_session``:
    later unpacks of its saved tensors, from any backward pass on any thread,
    are served from this replay.  Prefiring a frame twice for the same
    session is a no-op; prefiring it for a second session while bound to a
    first one is an error.
    """
    if not isinstance(handle, RecomputeHandle):
        raise ValueError(
            "recompute_handle expects a handle from recompute_handle_collector_ctx(), "
            f"got {type(handle).__name__}")
    _check_session_id(session_id)
    active = _ACTIVE_SESSION.get()
    if active is not None and active.session_id != session_id:
        raise RuntimeError(
            f"recompute_handle for session {session_id!r} called inside "
            f"recompute_session_ctx({active.session_id!r})")
    frame = handle._frame
    if frame is None:
        return
    if _frame.scheduled_replay_depth():
        raise RuntimeError("recompute_handle cannot be called from inside a scheduled replay")
    with _CONTROL_LOCK:
        session = _get_or_create(session_id)
        bound = frame.active_session
        if bound is session and session in frame.replayed:
            return
        if bound is not None and bound is not session:
            raise RuntimeError(
                f"this checkpoint is already bound to recompute session "
                f"{bound.session_id!r}; clear that session before prefiring it "
                f"for {session_id!r}")
        frame.active_session = session
        if bound is None:
            session.frames.append(frame)
    try:
        frame.replay_reporting(session, scheduled=True)
    except BaseException:
        with _CONTROL_LOCK:
            _unbind(frame, session)
            if frame in session.frames:
                session.frames.remove(frame)
        raise


def _unbind(frame: "_frame.Frame", session: _Session) -> None:
    if frame.active_session is session:
        frame.active_session = None
    frame.forget(session)


@contextlib.contextmanager
def recompute_session_ctx(session_id: Hashable, retain_on_unpack: bool = False) -> Iterator[None]:
    """Run backward passes against the replays of session ``session_id``.

    Unpacks of frames prefired for the session use the session's replay.
    With ``retain_on_unpack=True`` the tensors stay in the session, so a
    later backward pass (e.g. weight gradients after input gradients) reuses
    them; the last consumer uses ``False`` and each tensor is released as it
    is handed out.  Sessions do not nest.
    """
    _check_session_id(session_id)
    _check_bool("retain_on_unpack", retain_on_unpack)
    outer = _ACTIVE_SESSION.get()
    if outer is not None:
        raise RuntimeError(
            f"recompute sessions do not nest: recompute_session_ctx({session_id!r}) "
            f"entered inside recompute_session_ctx({outer.session_id!r})")
    with _CONTROL_LOCK:
        session = _get_or_create(session_id)
        if session.in_context:
            raise RuntimeError(
                f"recompute session {session_id!r} is already active in another thread")
        session.in_context = True
        session.retain = retain_on_unpack
    token = _ACTIVE_SESSION.set(session)
    try:
        yield
    finally:
        _ACTIVE_SESSION.reset(token)
        with _CONTROL_LOCK:
            session.in_context = False
            session.retain = False


def clear_recompute_session(session_id: Hashable) -> None:
    """Free everything session ``session_id`` holds and unbind its frames.

    Idempotent; the id can be used again afterwards.  Call it in a
    ``finally`` even after the last consumer ran: it also releases tensors of
    a partial backward and of saved tensors nobody unpacked.
    """
    _check_session_id(session_id)
    with _CONTROL_LOCK:
        session = _SESSIONS.pop(session_id, None)
        if session is None:
            return
        frames, session.frames = session.frames, []
        for frame in frames:
            _unbind(frame, session)


def live_session_ids() -> list[Hashable]:
    """Ids of the sessions that hold state (for tests and debugging)."""
    with _CONTROL_LOCK:
        return list(_SESSIONS)


def active_session_id() -> Hashable | None:
    """Session id of the enclosing ``recompute_session_ctx`` in this context."""
    session = _ACTIVE_SESSION.get()
    return None if session is None else session.session_id
