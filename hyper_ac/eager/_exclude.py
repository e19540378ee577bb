"""``checkpoint_exclude_wrapper``: a module that a checkpoint does not replay.

Inside a hyper_ac checkpoint, the wrapped module runs only in the first
forward.  Its own saved tensors are real (an inner saved-tensor hook replaces
the checkpoint's placeholders), and its output is cached on the checkpoint
frame; the replay gets that cached output back instead of running the module
again.  Several calls of one wrapper within one checkpoint are matched in
order (first in, first out, per wrapper).

Input optimisation: an input activation that the module saves for backward
would keep the first forward's copy of that activation alive until backward,
although the replay recomputes it anyway.  Instead, a *deferred input* object
is saved for it; when the replay reaches the wrapper it binds the replayed
input to that object, and the backward reads it from there.  A pre-hook on the
autograd nodes of the module's outputs (the replay boundary) makes sure the
replay has reached the wrapper before the module's backward runs.

Not optimised (the real tensor is saved, which is always correct):
parameters, inputs that are views, inputs the module modified in place
before saving them, and anything the module saves that is not the exact
input tensor object (a view or a copy of it).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from . import _frame

__all__ = ["checkpoint_exclude_wrapper", "CheckpointExcludeWrapper"]


class _DeferredInput:
    """Saved in place of an excluded module's input; bound during the replay."""

    __slots__ = ("tensor", "used", "__weakref__")

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.used = False

    def bind(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def get(self) -> torch.Tensor:
        if self.tensor is None:
            raise RuntimeError(
                "hyper_ac.eager.checkpoint_exclude_wrapper: the backward of an "
                "excluded module needs an input that the checkpoint replay "
                "recomputes, but the replay has not reached this module yet. "
                "This happens when the module's backward is reached without going "
                "through the autograd nodes of its outputs.")
        return self.tensor


class _Record:
    """One call of a wrapper during a checkpoint's first forward."""

    __slots__ = ("output", "output_versions", "bindings", "rng_after")

    def __init__(self, output: Any, bindings: list, rng_after: Any) -> None:
        # Detached copies (same storage) that keep requires_grad, so that the
        # replay saves exactly what the forward saved downstream of the module.
        self.output = tree_map(_detached_like, output)
        self.output_versions = [t._version for t in tree_leaves(self.output)
                                if isinstance(t, torch.Tensor)]
        # [(path, weakref to _DeferredInput)]; the autograd graph owns the
        # deferred inputs, the record must not keep them (or what they bind).
        self.bindings = bindings
        self.rng_after = rng_after


def _detached_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    return value


def _same_rng(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    (cpu_a, dev_a), (cpu_b, dev_b) = a, b
    return (torch.equal(cpu_a, cpu_b) and len(dev_a) == len(dev_b)
            and all(torch.equal(x, y) for x, y in zip(dev_a, dev_b)))


# -- input paths ------------------------------------------------------------

def _iter_tensors(args: tuple, kwargs: dict) -> Iterator[tuple[tuple, torch.Tensor]]:
    def walk(value: Any, path: tuple) -> Iterator[tuple[tuple, torch.Tensor]]:
        if isinstance(value, torch.Tensor):
            yield path, value
        elif isinstance(value, (tuple, list)):
            for index, item in enumerate(value):
                yield from walk(item, path + (index,))
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from walk(item, path + (key,))

    for index, arg in enumerate(args):
        yield from walk(arg, (("args", index),))
    for name, arg in kwargs.items():
        yield from walk(arg, (("kwargs", name),))


def _resolve(args: tuple, kwargs: dict, path: tuple) -> Any:
    (root, first), rest = path[0], path[1:]
    value = args[first] if root == "args" else kwargs[first]
    for step in rest:
        value = value[step]
    return value


def _format_path(path: tuple) -> str:
    (root, first), rest = path[0], path[1:]
    text = f"args[{first}]" if root == "args" else f"kwargs[{first!r}]"
    return text + "".join(f"[{step!r}]" for step in rest)


# -- the wrapper -------------------------------------------------------------

class CheckpointExcludeWrapper(nn.Module):
    """See ``checkpoint_exclude_wrapper``."""

    def __init__(self, module: Callable[..., Any], optimize_inputs: bool = True) -> None:
        super().__init__()
        if not isinstance(optimize_inputs, bool):
            raise ValueError(f"optimize_inputs must be a bool, got {optimize_inputs!r}")
        if isinstance(module, nn.Module):
            self.module = module
        else:
            if not callable(module):
                raise ValueError("checkpoint_exclude_wrapper expects an nn.Module or a callable")
            self._fn = module
        self.optimize_inputs = optimize_inputs

    def _body(self, *args: Any, **kwargs: Any) -> Any:
        target = self.module if "module" in self._modules else self._fn
        return target(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inv = _frame.current_invocation()
        if inv is None:
            return self._body(*args, **kwargs)
        if inv.frame.has_context_fn:
            raise RuntimeError(
                "checkpoint_exclude_wrapper cannot be used inside a checkpoint with a "
                "context_fn: the selective-checkpoint policy would see the excluded "
                "module's operators in the forward but not in the replay")
        if inv.replaying:
            return self._replay(inv, args, kwargs)
        return self._first_forward(inv, args, kwargs)

    # first forward ---------------------------------------------------------
    def _first_forward(self, inv: "_frame.Invocation", args: tuple, kwargs: dict) -> Any:
        frame = inv.frame
        marks: dict[int, tuple[torch.Tensor, int, _DeferredInput]] = {}
        candidates: list[tuple[tuple, _DeferredInput]] = []
        if self.optimize_inputs and torch.is_grad_enabled():
            for path, tensor in _iter_tensors(args, kwargs):
                if (isinstance(tensor, nn.Parameter) or tensor._is_view()
                        or id(tensor) in marks):
                    continue
                deferred = _DeferredInput()
                marks[id(tensor)] = (tensor, tensor._version, deferred)
                candidates.append((path, deferred))

        def pack(x: torch.Tensor) -> Any:
            mark = marks.get(id(x))
            if mark is not None and mark[0] is x and x._version == mark[1]:
                mark[2].used = True
                return mark[2]
            return x.detach()

        def unpack(packed: Any) -> torch.Tensor:
            if type(packed) is _DeferredInput:
                return packed.get()
            return packed

        rng_before = frame.capture_rng()
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                output = self._body(*args, **kwargs)
            for tensor, version, deferred in marks.values():
                if deferred.used and tensor._version != version:
                    raise RuntimeError(
                        "checkpoint_exclude_wrapper: the excluded module modified an "
                        "input in place after saving it for backward; construct the "
                        "wrapper with optimize_inputs=False for such a module")
        finally:
            marks.clear()  # the hook closure must not keep the inputs alive

        bindings = [(path, weakref.ref(deferred)) for path, deferred in candidates
                    if deferred.used]
        rng_after = frame.capture_rng()
        if _same_rng(rng_before, rng_after):
            rng_after = None  # the body drew no random numbers: nothing to restore
        record = _Record(output, bindings, rng_after)
        frame.exclude_records.setdefault(id(self), []).append(record)
        if bindings:
            frame.exclude_needed += 1
            self._install_boundary(frame, output)
        return output

    @staticmethod
    def _install_boundary(frame: "_frame.Frame", output: Any) -> None:
        # Before autograd runs the first node of the module's backward, make
        # sure the replay for this backward pass (or session) has bound the
        # deferred inputs.  The hook holds the frame, like the unpack hooks do.
        seen: set[int] = set()

        def prehook(grad_outputs: Any) -> None:
            frame.ensure_replayed()

        for leaf in tree_leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None:
                node = leaf.grad_fn
                if id(node) not in seen:
                    seen.add(id(node))
                    node.register_prehook(prehook)

    # replay ------------------------------------------------------------------
    def _replay(self, inv: "_frame.Invocation", args: tuple, kwargs: dict) -> Any:
        frame = inv.frame
        records = frame.exclude_records.get(id(self), ())
        index = inv.cursors.get(id(self), 0)
        if index >= len(records):
            raise RuntimeError(
                "checkpoint_exclude_wrapper: the replay called this excluded module "
                f"more often ({index + 1}) than the checkpoint's forward ({len(records)})")
        inv.cursors[id(self)] = index + 1
        record = records[index]
        if [t._version for t in tree_leaves(record.output)
                if isinstance(t, torch.Tensor)] != record.output_versions:
            raise RuntimeError(
                "checkpoint_exclude_wrapper: the output of the excluded module was "
                "modified in place after it returned; the checkpoint cannot replay "
                "the code after it")
        for path, deferred_ref in record.bindings:
            deferred = deferred_ref()
            if deferred is None:  # autograd already released that saved input
                continue
            try:
                value = _resolve(args, kwargs, path)
            except (IndexError, KeyError, TypeError):
                value = None
            if not isinstance(value, torch.Tensor):
                raise RuntimeError(
                    "checkpoint_exclude_wrapper: during the replay, "
                    f"{_format_path(path)} of the excluded module is not a tensor, "
                    "but the module saved it for backward in the forward")
            deferred.bind(value.detach())
        frame.restore_rng(record.rng_after)
        if record.bindings:
            inv.exclude_done += 1
            if frame.early_stop and inv.replay_complete():
                raise _frame._StopReplay
        return record.output


def checkpoint_exclude_wrapper(module: Callable[..., Any], *,
                               optimize_inputs: bool = True) -> CheckpointExcludeWrapper:
    """Wrap ``module`` so that hyper_ac checkpoints run it once, never replay it.

    Outside a hyper_ac checkpoint the wrapper just calls the module.  Inside
    one, the module runs in the first forward and saves its own tensors for
    backward; the replay returns the cached output.  With
    ``optimize_inputs=True`` (default) input activations the module saves for
    backward are not kept from the first forward but bound to the replay's
    recomputed inputs (see the module docstring for what is not optimised).

    The wrapped module is registered as the ``module`` child, so parameter
    names gain a ``module.`` prefix.
    """
    return CheckpointExcludeWrapper(module, optimize_inputs=optimize_inputs)
