"""The graph-compiler pass: serialise → core plan → apply to FX.

Every save/recompute decision is the core's (``hyper_ac._core.plan``);
:func:`plan` hands the graph over, :class:`ActivationCheckpointPass` applies
the edits it gets back (:mod:`hyper_ac.apply`), :func:`pareto` asks the core
for the saved-bytes / recompute-cost frontier.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import warnings
from typing import Any, Mapping, Optional, Union

from torch import fx

from hyper_ac import _core
from hyper_ac.apply import apply_plan
from hyper_ac.config import Config, apply_adapter_hook, load_config, op_policy_json

_LOG = logging.getLogger("hyper_ac")

__all__ = ["ActivationCheckpointPass", "PassResult", "plan", "pareto"]


@dataclasses.dataclass
class PassResult:
    """What one run of the pass did (``plan`` is the core's plan document)."""

    mode: str
    plan: Mapping[str, Any]
    plan_seconds: float = 0.0
    serialize_seconds: float = 0.0
    apply_seconds: float = 0.0

    @property
    def stats(self) -> Mapping[str, Any]:
        return self.plan.get("stats", {})

    @property
    def diagnostics(self) -> list:
        return self.plan.get("diagnostics", [])

    @property
    def saved(self) -> list[str]:
        return list(self.plan.get("saved", []))

    def summary(self) -> str:
        s = self.stats
        if not s:
            return f"hyper_ac: mode={self.mode}: graph unchanged"
        return (
            f"hyper_ac: mode={self.mode}: duplicated {s['nodes_duplicated']} node(s), "
            f"saved for backward {_core.format_bytes(s['saved_bytes_before'])} -> {_core.format_bytes(s['saved_bytes_after'])}, "
            f"recompute {s['recompute_flops']:.3g} FLOPs"
        )


def _require_annotated(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if "autograd_backward" not in node.meta:
            raise ValueError(
                f"node '{node.name}' has no meta['autograd_backward']: the pass needs a joint graph annotated "
                "with forward/backward phases (capture it with hyper_ac.capture.capture_joint, or call "
                "hyper_ac.annotate.annotate_joint(gm, num_fwd_outputs) first)"
            )


def _graph_json(graph: Union[fx.GraphModule, str, Mapping[str, Any]], model: Any, caller: str) -> str:
    if isinstance(graph, fx.GraphModule):
        from hyper_ac.serialize import to_json

        _require_annotated(graph)
        return to_json(graph, model)
    if isinstance(graph, str):
        return graph
    if isinstance(graph, Mapping):
        return json.dumps(graph, separators=(",", ":"))
    raise TypeError(f"hyper_ac.{caller}: graph must be an fx.GraphModule, graph JSON text or its dict, "
                    f"got {type(graph).__name__}")


def plan(graph: Union[fx.GraphModule, str, Mapping[str, Any]], config: Any, model: Any = None) -> PassResult:
    """The core's plan for a joint graph, without changing it: the one entry
    the pass, the CLI and the benchmark call.

    ``graph``: an annotated joint ``fx.GraphModule`` (serialised here), or a
    graph document already serialised (JSON text or its dict).
    ``config``: a preset name, YAML path, dict or :class:`Config`.
    ``model``: the live module, for its ``model`` section and its adapter's
    region patterns.
    """
    cfg = load_config(config)
    t0 = time.perf_counter()
    graph_json = _graph_json(graph, model, "plan")
    t1 = time.perf_counter()
    plan_text = _core.plan(graph_json, cfg.json_for(model), op_policy_json())
    t2 = time.perf_counter()
    return PassResult(cfg.mode, json.loads(plan_text), plan_seconds=t2 - t1, serialize_seconds=t1 - t0)


class ActivationCheckpointPass:
    """Static-graph activation checkpointing for a joint forward+backward graph.

    ``ActivationCheckpointPass(config).run(gm, model=model)`` or
    ``ActivationCheckpointPass().run(gm, config, model=model)``: the config (a
    YAML path, dict or :class:`hyper_ac.config.Config`) is validated when given.
    ``model`` (the live module) lets scope discovery use its
    ``gradient_checkpointing`` blocks; without it the core finds repeated
    blocks from the module stacks. ``tag_only=True`` writes the policies and
    leaves the rewrite to PyTorch's partitioner. The last run's
    :class:`PassResult` is ``self.result``.
    """

    name = "activation_checkpoint"

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
        if model is not None:
            apply_adapter_hook(model)
        result = plan(graph_module, cfg, model)
        t0 = time.perf_counter()
        apply_plan(graph_module, result.plan, tag_only=self.tag_only, recompile=recompile)
        result.apply_seconds = time.perf_counter() - t0
        for diagnostic in result.diagnostics:
            if diagnostic["level"] == "warning":
                warnings.warn(diagnostic["message"], stacklevel=2)
            else:
                _LOG.info("%s", diagnostic["message"])
        _LOG.info("%s", result.summary())
        _LOG.debug("plan: %s", json.dumps(result.plan, indent=1))
        self.result = result
        return graph_module

    __call__ = run


def pareto(graph: Union[fx.GraphModule, str, Mapping[str, Any]], config: Any = None, *, model: Any = None,
           plot: Optional[str] = None):
    """The saved-bytes / recompute-cost frontier across λ (min-cut modes); ``graph`` as for :func:`plan`."""
    cfg = load_config(config if config is not None else {"ac_mode": "auto"})
    points = json.loads(_core.pareto(_graph_json(graph, model, "pareto"), cfg.json_for(model), op_policy_json()))
    if plot:
        _plot_pareto(points, plot)
    return points


def _plot_pareto(points: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    xs = [p["recompute_seconds"] * 1e3 for p in points]
    ys = [p["simulated_peak_bytes"] / 2**20 for p in points]
    ax.plot(xs, ys, marker="o")
    ax.set_xlabel("recompute cost (ms, roofline)")
    ax.set_ylabel("simulated peak (MiB)")
    ax.set_title("hyper_ac Pareto frontier")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
