"""Model adapters: what a model type contributes to its plans, registered by class.

``ModelAdapter`` supplies a model type's recompute regions and exclusions
(fnmatch patterns over module FQNs, handed to the core with the config) and an
``on_applied(model)`` hook that runs once per model before it is traced. The
capture runs the hook; the config reads the patterns.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Optional, Sequence

__all__ = ["ModelAdapter", "adapter_for", "adapter_hook_ran", "apply_adapter_hook", "register_adapter",
           "unregister_adapter"]


@dataclasses.dataclass(frozen=True)
class ModelAdapter:
    """A model adapter's recompute regions.

    ``region_patterns``: fnmatch patterns over module FQNs; the outermost
    matches inside the selected units become the regions.
    ``exclude_patterns``: FQNs whose nodes are never recomputed.
    ``on_applied(model)``: runs exactly once per model, before capture.
    """

    region_patterns: Sequence[str]
    exclude_patterns: Sequence[str] = ()
    on_applied: Optional[Callable[[Any], None]] = None

    def __post_init__(self) -> None:
        for name in ("region_patterns", "exclude_patterns"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(p, str) and p for p in value):
                raise TypeError(f"ModelAdapter.{name} must be a list of non-empty strings, got {value!r}")
        if self.on_applied is not None and not callable(self.on_applied):
            raise TypeError("ModelAdapter.on_applied must be callable or None")


_ADAPTERS: dict[type, ModelAdapter] = {}
# Models whose hook ran but that take no attribute (frozen / slotted): by id, for as long as they live.
_HOOKED: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register_adapter(model_type: type, adapter: ModelAdapter) -> None:
    """Register ``adapter`` for ``model_type`` (and its subclasses)."""
    if not isinstance(model_type, type):
        raise TypeError(f"register_adapter needs a class, got {model_type!r}")
    if not isinstance(adapter, ModelAdapter):
        raise TypeError(f"register_adapter needs a ModelAdapter, got {type(adapter).__name__}")
    _ADAPTERS[model_type] = adapter


def unregister_adapter(model_type: type) -> None:
    _ADAPTERS.pop(model_type, None)


def adapter_for(model: Any) -> Optional[ModelAdapter]:
    """The adapter registered for the model's type (nearest class in its MRO)."""
    if model is None:
        return None
    for cls in type(model).__mro__:
        if cls in _ADAPTERS:
            return _ADAPTERS[cls]
    return None


def adapter_hook_ran(model: Any) -> bool:
    """Whether the model's adapter hook has run (true when there is no hook to run)."""
    policy = adapter_for(model)
    if policy is None or policy.on_applied is None:
        return True
    return bool(getattr(model, "_hyper_ac_adapter_applied", False)) or _hooked(model)


def _hooked(model: Any) -> bool:
    try:
        return model in _HOOKED
    except TypeError:  # not weak-referenceable
        return False


def apply_adapter_hook(model: Any) -> None:
    """Run the adapter's ``on_applied(model)`` once per model instance."""
    policy = adapter_for(model)
    if policy is None or policy.on_applied is None:
        return
    if getattr(model, "_hyper_ac_adapter_applied", False) or _hooked(model):
        return
    policy.on_applied(model)
    try:
        object.__setattr__(model, "_hyper_ac_adapter_applied", True)
    except Exception:  # a frozen / slotted model: remembered weakly instead
        try:
            _HOOKED.add(model)
        except TypeError:  # neither: run-once is then per call
            pass
