"""``hyper_ac.eager.checkpoint``: non-reentrant activation checkpointing."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._pytree import tree_leaves

from . import _frame, _session

__all__ = ["checkpoint"]


def _is_tracing() -> bool:
    """True under torch.compile (Dynamo) or an FX proxy trace (AOTAutograd)."""
    if torch.compiler.is_compiling():
        return True
    proxy_key = getattr(torch._C._TorchDispatchModeKey, "PROXY", None)
    return proxy_key is not None and torch._C._get_dispatch_mode(proxy_key) is not None


def _device_type(args: tuple) -> str:
    types = [t.device.type for t in tree_leaves(args)
             if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta")]
    if not types:
        return torch_checkpoint.DefaultDeviceType.get_device_type()
    return "cuda" if "cuda" in types else types[0]


def _device_ids(args: tuple, device_type: str) -> list[int]:
    ids: list[int] = []
    for t in tree_leaves(args):
        if isinstance(t, torch.Tensor) and t.device.type == device_type:
            index = t.get_device()
            if index not in ids:
                ids.append(index)
    return ids


def _autocast_state(device_type: str) -> dict[str, Any]:
    return {
        "enabled": torch.is_autocast_enabled(device_type),
        "dtype": torch.get_autocast_dtype(device_type),
        "cache_enabled": torch.is_autocast_cache_enabled(),
    }


def _device_context():
    """The ``torch.device(...)`` context active now, if any (replayed too)."""
    try:
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._device import DeviceContext
    except ImportError:  # pragma: no cover - older torch
        return contextlib.nullcontext()
    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return mode
    return contextlib.nullcontext()


def _resolve_early_stop(early_stop: bool | None) -> bool:
    """PyTorch's rule: ``set_checkpoint_early_stop``, while active, overrides ``early_stop``
    (a checkpoint nested in another's replay included); otherwise the per-call value, default True."""
    global_value = getattr(torch_checkpoint, "_enable_checkpoint_early_stop", None)
    if global_value is not None:
        return bool(global_value)
    return True if early_stop is None else early_stop


def _resolve_debug(debug: bool) -> bool:
    """PyTorch's rule: ``set_checkpoint_debug_enabled`` (when not None) overrides ``debug``."""
    global_value = getattr(torch_checkpoint, "_checkpoint_debug_enabled", None)
    return debug if global_value is None else bool(global_value)


def checkpoint(
    fn: Callable[..., Any],
    *args: Any,
    early_stop: bool | None = None,
    context_fn: Callable[[], tuple[ContextManager, ContextManager]] | None = None,
    determinism_check: str = "default",
    debug: bool = False,
    preserve_rng_state: bool = True,
    use_reentrant: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` without keeping its activations.

    Semantics follow ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``:
    the forward hands autograd placeholders instead of saved tensors; the
    first unpack in a backward pass replays ``fn`` (with the forward's CPU and
    device RNG state, autocast state and ``torch.device`` context) and serves
    the replayed tensors.  Every backward pass replays once, and nested
    checkpoints work as in PyTorch.  A frame prefired for a recompute session
    (see ``recompute_handle``) is replayed once for all backward passes of
    that session instead.

    Args:
        early_stop: stop the replay as soon as every saved tensor exists.
            As in PyTorch, ``torch.utils.checkpoint.set_checkpoint_early_stop``,
            when active during this forward, overrides it; outside that
            context the value passed here applies (``None``, the default: ``True``).
        context_fn: returns ``(forward_ctx, replay_ctx)``; e.g.
            ``functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts, policy)``.
        determinism_check: ``"default"`` compares shape, dtype and device of
            every replayed tensor with the forward; ``"none"`` skips it.
        debug: as in PyTorch: record the operators (with stack traces) of the
            forward and of each replay, and on a checkpoint error raise a
            ``CheckpointError`` that prints both logs.
            ``torch.utils.checkpoint.set_checkpoint_debug_enabled`` overrides
            it when set. Cannot be combined with ``context_fn``.
        preserve_rng_state: stash and restore RNG state for the replay.
        use_reentrant: accepted for drop-in use; only ``None`` or ``False``
            (this is the non-reentrant variant).

    Errors about the replay are ``torch.utils.checkpoint.CheckpointError``
    (a ``RuntimeError``) with PyTorch's wording.

    Under ``torch.compile`` this defers to ``torch.utils.checkpoint``; such
    calls are not collected by ``recompute_handle_collector_ctx``.
    """
    if use_reentrant is not None and use_reentrant is not False:
        raise ValueError(
            "hyper_ac.eager.checkpoint implements the non-reentrant checkpoint only: "
            f"use_reentrant must be False or left out, got {use_reentrant!r}; use "
            "torch.utils.checkpoint.checkpoint(..., use_reentrant=True) for the reentrant variant")
    if early_stop is not None and not isinstance(early_stop, bool):
        raise ValueError(
            f"early_stop must be a bool or None, got {type(early_stop).__name__}: {early_stop!r}")
    if not isinstance(debug, bool):
        raise ValueError(f"debug must be a bool, got {type(debug).__name__}: {debug!r}")
    if not isinstance(preserve_rng_state, bool):
        raise ValueError(
            f"preserve_rng_state must be a bool, got {type(preserve_rng_state).__name__}")
    if determinism_check not in _frame.METADATA_FNS:
        raise ValueError(
            f"determinism_check should be one of {list(_frame.METADATA_FNS)}, "
            f"but got {determinism_check}")
    if context_fn is not None and not callable(context_fn):
        raise ValueError("context_fn must be callable or None")
    if context_fn is torch_checkpoint.noop_context_fn:
        context_fn = None  # PyTorch's default, passed explicitly
    early_stop = _resolve_early_stop(early_stop)
    debug = _resolve_debug(debug)
    if debug and context_fn is not None:
        raise ValueError("debug=True is incompatible with non-default context_fn")

    if _is_tracing():
        # Only pass what differs from PyTorch's defaults: Dynamo's handling of
        # checkpoint inspects some of these arguments.
        options: dict[str, Any] = {}
        if context_fn is not None:
            options["context_fn"] = context_fn
        if determinism_check != "default":
            options["determinism_check"] = determinism_check
        if not early_stop:
            options["early_stop"] = early_stop
        if debug:
            options["debug"] = debug
        if not preserve_rng_state:
            options["preserve_rng_state"] = preserve_rng_state
        return torch_checkpoint.checkpoint(fn, *args, use_reentrant=False, **options, **kwargs)

    if _frame.scheduled_replay_depth():
        raise RuntimeError(
            "hyper_ac.eager.checkpoint: a nested checkpoint was created while a "
            "scheduled replay (recompute_handle) was running; prefiring a "
            "checkpoint that contains nested checkpoints is not supported. "
            "Prefire the inner checkpoints instead, or let the backward pass "
            "replay the outer one.")

    in_replay = _frame.replay_in_progress()  # replays are not collected

    unpack_error_cb = None
    if debug:
        # PyTorch's own debug machinery: operator logs with stack traces of the
        # forward and of the replay, printed when a checkpoint error is raised.
        debug_context_fn, unpack_error_cb = torch_checkpoint._get_debug_context_and_cb()
        forward_ctx, replay_ctx = debug_context_fn()
    elif context_fn is not None:
        forward_ctx, replay_ctx = context_fn()
    else:
        forward_ctx, replay_ctx = contextlib.nullcontext(), contextlib.nullcontext()

    if not torch.is_grad_enabled():
        if not in_replay:
            _session.collect(None)
        return fn(*args, **kwargs)

    device_type = _device_type(args)
    device_module = torch.get_device_module(device_type) if device_type != "meta" else None
    device_autocast = (
        _autocast_state(device_type)
        if device_type != "cpu" and torch.amp.is_autocast_available(device_type) else None)
    cpu_autocast = _autocast_state("cpu")
    had_device = bool(getattr(device_module, "_initialized", False))
    devices: list[int] = _device_ids(args, device_type) if had_device else []
    if preserve_rng_state:
        cpu_rng = torch.get_rng_state()
        device_rng = []
        if devices:
            for index in devices:
                with device_module.device(index):
                    device_rng.append(device_module.get_rng_state())
    device_ctx = _device_context()

    def run_replay(*replay_args: Any) -> None:
        with torch.random.fork_rng(devices=devices, enabled=preserve_rng_state,
                                   device_type=device_type):
            if preserve_rng_state:
                torch.set_rng_state(cpu_rng)
                for index, state in zip(devices, device_rng):
                    with device_module.device(index):
                        device_module.set_rng_state(state)
            device_autocast_ctx = (torch.autocast(device_type, **device_autocast)
                                   if device_autocast is not None else contextlib.nullcontext())
            with device_autocast_ctx, torch.autocast("cpu", **cpu_autocast), \
                    replay_ctx, device_ctx:
                fn(*replay_args, **kwargs)

    frame = _frame.Frame(run_replay, early_stop, _frame.METADATA_FNS[determinism_check],
                         has_context_fn=context_fn is not None)
    frame.unpack_error_cb = unpack_error_cb
    frame.preserve_rng_state = preserve_rng_state
    frame.device_type = device_type
    frame.rng_devices = devices
    if not in_replay:
        _session.collect(frame)
    frame.save_inputs(args)

    stack = _frame.invocation_stack()
    inv = _frame.Invocation(frame, replaying=False)
    stack.append(inv)
    suppressed = True
    try:
        with _frame.ForwardHooks(frame), forward_ctx:
            out = fn(*args, **kwargs)
            suppressed = False
    finally:
        stack.pop()
    if suppressed:
        raise RuntimeError(
            "hyper_ac.eager.checkpoint: the forward context provided by context_fn "
            "suppressed an exception raised during the checkpointed forward. This is "
            "not supported because checkpoint cannot return a value for a failed forward.")
    frame.forward_completed = True
    if preserve_rng_state and not had_device and getattr(device_module, "_initialized", False):
        raise RuntimeError(
            f"hyper_ac.eager.checkpoint: PyTorch's device state was initialized in the "
            f"forward pass of a Checkpoint, which is not allowed (the {device_type} device "
            "was initialised inside the checkpointed function, so its RNG state could "
            "not be saved for the replay); initialise it before the checkpoint")
    return out
