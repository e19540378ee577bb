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
# `hyper_ac.capture`, `hyper_ac.serialize`, `hyper_ac.memory` and
# `hyper_ac.eager` are modules, imported as usual.
_LAZY = {
    "ActivationCheckpointPass": ("hyper_ac.passes", "ActivationCheckpointPass"),
    "backend": ("hyper_ac.backends", "backend"),
    "GraphPass": ("hyper_ac.pipeline", "GraphPass"),
    "PassOrderError": ("hyper_ac.pipeline", "PassOrderError"),
    "PassPipeline": ("hyper_ac.pipeline", "PassPipeline"),
    "prepare_activation_checkpoint": ("hyper_ac.passes", "prepare_activation_checkpoint"),
    "validate_for_model": ("hyper_ac.passes", "validate_for_model"),
    "load_config": ("hyper_ac.config", "load_config"),
    "pareto": ("hyper_ac.passes", "pareto"),
    "plan": ("hyper_ac.passes", "plan"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        return getattr(importlib.import_module(module_name), attr)
    raise AttributeError(f"module 'hyper_ac' has no attribute {name!r}")


# torch.compile(backend="hyper_ac"): an installed hyper_ac is found by its entry
# point; with torch already loaded, register the name now (a source checkout has
# no entry point). Without torch loaded, `import hyper_ac` stays torch-free.
from hyper_ac.dynamo_backend import register_if_torch_loaded as _register_if_torch_loaded  # noqa: E402

_register_if_torch_loaded()
