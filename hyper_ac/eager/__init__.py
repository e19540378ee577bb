"""Eager activation checkpointing with prefire and recompute sessions.

``checkpoint`` follows ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``
and adds the primitives a pipeline scheduler needs: collect a handle for each
checkpoint call, replay ("prefire") it ahead of the backward pass, and let
several backward passes (input gradients, then weight gradients) share that
one replay through a recompute session.  ``checkpoint_exclude_wrapper`` marks
a module that a checkpoint runs once and never replays.  See docs/eager.md.
"""

from ._checkpoint import checkpoint
from ._exclude import CheckpointExcludeWrapper, checkpoint_exclude_wrapper
from ._session import (
    RecomputeHandle,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
)

__all__ = [
    "checkpoint",
    "checkpoint_exclude_wrapper",
    "CheckpointExcludeWrapper",
    "RecomputeHandle",
    "recompute_handle_collector_ctx",
    "recompute_handle",
    "recompute_session_ctx",
    "clear_recompute_session",
]
