"""The graph-compiler pass: the core's plan (:func:`hyper_ac.planning.passes.plan`) applied to FX.

``ActivationCheckpointPass`` is a :class:`~hyper_ac.planning.pipeline.GraphPass`:
it plans the joint graph and carries out the plan on it (:mod:`hyper_ac.lower.apply`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Optional

from torch import fx

from hyper_ac.frontend.adapters import adapter_for, adapter_hook_ran
from hyper_ac.lower.apply import apply_plan
from hyper_ac.planning.config import Config, load_config
from hyper_ac.planning.passes import PassResult, plan, _LOG
from hyper_ac.planning.pipeline import GraphPass, PassOrderError, placeholders_rewritten_by

__all__ = ["ActivationCheckpointPass"]


class ActivationCheckpointPass(GraphPass):
    """Static-graph activation checkpointing for a joint forward+backward graph.

    ``ActivationCheckpointPass(config).run(gm, model=model)`` or
    ``ActivationCheckpointPass().run(gm, config, model=model)``: the config (a
    YAML path, dict or :class:`hyper_ac.planning.config.Config`) is validated when given.
    ``model`` (the live module) lets scope discovery use its
    ``gradient_checkpointing`` blocks; without it the core finds repeated
    blocks from the module stacks. ``tag_only=True`` writes the policies and
    leaves the rewrite to PyTorch's partitioner. The last run's
    :class:`PassResult` is ``self.result``.
    """

    name = "activation_checkpoint"
    needs_unsharded_placeholders = True  # see hyper_ac.planning.pipeline: runs before sharding / stage splitting

    def __init__(self, config: Any = None, *, tag_only: bool = False) -> None:
        if not isinstance(tag_only, bool):
            raise TypeError(f"tag_only must be a bool, got {type(tag_only).__name__}")
        self.config: Optional[Config] = load_config(config) if config is not None else None
        self.tag_only = tag_only
        self.result: Optional[PassResult] = None

    def run(self, graph_module: fx.GraphModule, config: Any = None, *, model: Any = None,
            recompile: bool = True) -> fx.GraphModule:
        cfg = load_config(config) if config is not None else self.config
        if cfg is None:
            raise ValueError("ActivationCheckpointPass.run needs a config (pass one here or to the constructor)")
        if cfg.mode == "off":
            self.result = PassResult("off", {})
            return graph_module
        rewritten = placeholders_rewritten_by(graph_module)
        if rewritten:
            raise PassOrderError(
                f"activation checkpointing runs on a graph whose placeholders {', '.join(map(repr, rewritten))} "
                "already rewrote (sharded parameters or split stages); run ActivationCheckpointPass before that "
                "pass (docs/architecture.md, 'Passes and their order')")
        if model is not None and not adapter_hook_ran(model):
            policy = adapter_for(model)
            raise ValueError(
                f"the model adapter of {type(model).__name__} has an on_applied hook that has not run, so this graph "
                f"was traced without its effect (hook {getattr(policy.on_applied, '__qualname__', policy.on_applied)!r}); "
                "call hyper_ac.prepare_activation_checkpoint(model, config) before tracing "
                "(hyper_ac.frontend.capture.capture_joint and hyper_ac.backend do)")
        result = plan(graph_module, cfg, model)
        t0 = time.perf_counter()
        apply_plan(graph_module, result.plan, tag_only=self.tag_only, recompile=recompile)
        result.apply_seconds = time.perf_counter() - t0
        result.report()
        if _LOG.isEnabledFor(logging.DEBUG):  # a large plan is not rendered for nothing
            _LOG.debug("plan: %s", json.dumps(result.plan, indent=1))
        self.result = result
        return graph_module

    __call__ = run
