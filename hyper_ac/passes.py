"""The graph-compiler pass: serialise → core plan → apply to FX.

Every save/recompute decision is the core's (``hyper_ac._core.plan``); this
module only hands the graph over and applies the edits it gets back.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import operator
import time
import warnings
from typing import Any, Mapping, Optional

import torch
from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from hyper_ac import _core
from hyper_ac.config import Config, apply_adapter_hook, load_config, op_policy_json

_LOG = logging.getLogger("hyper_ac")

__all__ = ["ActivationCheckpointPass", "PassResult", "apply_plan", "plan_graph", "pareto"]


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
                "hyper_ac.capture.annotate_joint(gm, num_fwd_outputs) first)"
            )


def plan_graph(gm: fx.GraphModule, config: Any, *, model: Any = None) -> PassResult:
    """Ask the core for a plan without changing the graph."""
    from hyper_ac.serialize import to_json

    cfg = load_config(config)
    _require_annotated(gm)
    t0 = time.perf_counter()
    graph_json = to_json(gm, model)
    t1 = time.perf_counter()
    plan_text = _core.plan(graph_json, cfg.json_for(model), op_policy_json())
    t2 = time.perf_counter()
    return PassResult(cfg.mode, json.loads(plan_text), plan_seconds=t2 - t1, serialize_seconds=t1 - t0)


def _private_get_attr(gm: fx.GraphModule, original: fx.Node, before: fx.Node) -> fx.Node:
    """A fresh get_attr for a duplicate, so each region owns its HOP subgraph reference."""
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(original.target)
    node.meta.update(original.meta)
    node.meta["autograd_backward"] = True
    return node


def apply_plan(gm: fx.GraphModule, plan: Mapping[str, Any], *, tag_only: bool = False,
               recompile: bool = True) -> fx.GraphModule:
    """Apply a core plan to ``gm`` in place: tags, duplicates, redirects, erasures.

    ``tag_only`` writes the policies (``meta["recompute"]``, ``meta["ac_graph_id"]``)
    and stops, for PyTorch's own partitioner or Inductor to act on.
    ``recompile=False`` leaves ``gm``'s generated code stale, for callers that
    build new modules from the graph anyway (the backend's partition step):
    code generation is the slowest part of applying a plan to a large graph.
    """
    graph = gm.graph
    by_name = {node.name: node for node in graph.nodes}

    def node_named(name: str, what: str) -> fx.Node:
        try:
            return by_name[name]
        except KeyError:
            raise ValueError(f"plan {what} names node '{name}', which is not in the graph") from None

    for name, policy in plan.get("policies", {}).items():
        node_named(name, "policy").meta["recompute"] = CheckpointPolicy[policy]
    for name, graph_id in plan.get("graph_ids", {}).items():
        node_named(name, "graph id").meta["ac_graph_id"] = graph_id
    if tag_only:
        return gm

    duplicate_of: dict[fx.Node, fx.Node] = {}
    for entry in plan.get("duplicates", []):
        original = node_named(entry["of"], "duplicate")
        before = node_named(entry["before"], "insertion point")
        private = {
            by_name[n]: _private_get_attr(gm, by_name[n], before) for n in entry.get("private_get_attrs", [])
        }

        def remap(arg: fx.Node, private: dict = private) -> fx.Node:
            return private.get(arg) or duplicate_of.get(arg, arg)

        with graph.inserting_before(before):
            copy = graph.node_copy(original, remap)
        copy.meta = dict(original.meta)
        copy.meta.pop("recompute", None)  # a second pass must not take a duplicate for a candidate
        copy.meta["autograd_backward"] = True
        copy.meta["ac_recomputed"] = True
        copy.meta["ac_recomputed_from"] = original.name
        duplicate_of[original] = copy

    for entry in plan.get("redirects", []):
        consumer = node_named(entry["node"], "redirect")
        original = node_named(entry["input"], "redirect")
        if original not in duplicate_of:
            raise ValueError(f"plan redirects '{consumer.name}' to a duplicate of '{original.name}', which was not made")
        consumer.replace_input_with(original, duplicate_of[original])

    for name in plan.get("erase", []):
        node = node_named(name, "erase")
        if node.users:
            raise ValueError(f"plan erases '{name}', which is still read by {[u.name for u in node.users]}")
        graph.erase_node(node)

    _flatten_getitems(gm)
    graph.lint()
    if recompile:
        gm.recompile()
    return gm


def _flatten_getitems(gm: fx.GraphModule) -> None:
    """Move tuple projections next to their producer so each output is freed on its own.

    What ``torch._functorch.compile_utils.raise_getitems`` does, without its
    recompile: the caller recompiles once (or not at all before a partition).
    """
    getitems = list(gm.graph.find_nodes(op="call_function", target=operator.getitem))
    for node in reversed(getitems):  # reversed keeps their relative order
        producer = node.all_input_nodes
        if len(producer) == 1:
            producer[0].append(node)


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
        result = plan_graph(graph_module, cfg, model=model)
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


def pareto(graph_module: fx.GraphModule, config: Any = None, *, model: Any = None, plot: Optional[str] = None):
    """The saved-bytes / recompute-cost frontier across λ (min-cut modes)."""
    from hyper_ac.serialize import to_json

    cfg = load_config(config if config is not None else {"ac_mode": "auto"})
    _require_annotated(graph_module)
    points = json.loads(_core.pareto(to_json(graph_module, model), cfg.json_for(model), op_policy_json()))
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
