"""hyper_ac: activation checkpointing for PyTorch joint forward+backward graphs.

The C++ core (``hyper_ac._core``) makes every save/recompute decision; this
package captures graphs, serialises them, applies the core's plan back to FX
and plugs into ``torch.compile``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Submodules import torch; load them on first use so `import hyper_ac` is cheap.
# `hyper_ac.frontend.capture`, `hyper_ac.frontend.serialize`, `hyper_ac.memory` and
# `hyper_ac.eager` are modules, imported as usual.
_LAZY = {
    "ActivationCheckpointPass": ("hyper_ac.lower.checkpoint_pass", "ActivationCheckpointPass"),
    "backend": ("hyper_ac.lower.backends", "backend"),
    "GraphPass": ("hyper_ac.planning.pipeline", "GraphPass"),
    "PassOrderError": ("hyper_ac.planning.pipeline", "PassOrderError"),
    "PassPipeline": ("hyper_ac.planning.pipeline", "PassPipeline"),
    "prepare_activation_checkpoint": ("hyper_ac.planning.passes", "prepare_activation_checkpoint"),
    "validate_for_model": ("hyper_ac.planning.passes", "validate_for_model"),
    "fit": ("hyper_ac.lower.fit", "fit"),
    "frontier": ("hyper_ac.display.timeline", "frontier"),
    "load_config": ("hyper_ac.planning.config", "load_config"),
    "plan": ("hyper_ac.planning.passes", "plan"),
}

# Old public names: a clear error instead of a bare AttributeError.
_RENAMED = {"pareto": "frontier"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(module_name), attr)
    if name in _RENAMED:
        raise AttributeError(f"hyper_ac.{name} is now hyper_ac.{_RENAMED[name]} (one name per concept)")
    raise AttributeError(f"module 'hyper_ac' has no attribute {name!r}")


# torch.compile(backend="hyper_ac"): an installed hyper_ac is found by its entry
# point; with torch already loaded, register the name now (a source checkout has
# no entry point). Without torch loaded, `import hyper_ac` stays torch-free.
from hyper_ac.lower.dynamo_backend import register_if_torch_loaded as _register_if_torch_loaded  # noqa: E402

_register_if_torch_loaded()
