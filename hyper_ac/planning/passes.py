"""The bridge to the core: serialise → core plan.

Every save/recompute decision is the core's (``hyper_ac._core.plan``);
:func:`plan` hands the graph over and returns the plan
(:class:`hyper_ac.lower.checkpoint_pass.ActivationCheckpointPass` applies it),
:func:`frontier_points` asks the core for the saved-bytes / recompute-cost frontier.
:func:`prepare_activation_checkpoint` is the step every entry point takes before
it traces: the adapter hook, then the model-dependent config checks
(:func:`validate_for_model`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import warnings
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from torch import fx

from hyper_ac import _core, fx_meta
from hyper_ac._gc import paused_gc
from hyper_ac.frontend.adapters import apply_adapter_hook
from hyper_ac.planning import plan_doc
from hyper_ac.planning.config import Config, load_config, op_policy_json

_LOG = logging.getLogger("hyper_ac")

__all__ = ["PassResult", "Prepared", "plan", "frontier_points", "prepare_activation_checkpoint", "validate_for_model"]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What :func:`prepare_activation_checkpoint` resolved before any trace.

    ``scope_checked``: the units come from the live model (the
    ``gradient_checkpointing`` marker), so layer selection and region patterns
    were checked and ``units`` / ``regions`` are the core's; otherwise the units
    are read off the module stacks once a graph exists and both lists are empty.
    """

    config: Config
    scope_checked: bool = False
    units: tuple = ()
    regions: tuple = ()


def validate_for_model(config: Any, model: Any) -> Prepared:
    """Every check of ``config`` that needs only the live ``model``, done now rather than at the first trace.

    The core runs the same scope checks as :func:`plan` on the model's facts
    (``hyper_ac.frontend.serialize.model_facts``, no graph nodes): an adapter source
    without an adapter, layer indices or counts beyond the model's units, region
    and exclude patterns that match no module inside the selection. Raises the
    same ``ConfigError`` / ``ScopeError`` (``ValueError``) the plan would.
    """
    cfg = load_config(config)
    if model is None or cfg.mode == "off":
        return Prepared(cfg)
    from hyper_ac.frontend.serialize import FORMAT, VERSION, model_facts

    doc = {"format": FORMAT, "version": VERSION, "model": model_facts(getattr(model, "_orig_mod", model)), "nodes": []}
    found = _core.check_scope(json.dumps(doc, separators=(",", ":")), cfg.json_for(model))
    if not found["checked"]:
        return Prepared(cfg)
    return Prepared(cfg, True, tuple(found["units"]), tuple(found["regions"]))


def prepare_activation_checkpoint(model: Any, config: Any) -> Prepared:
    """Get ``model`` ready for activation checkpointing, before anything traces it.

    Runs the model adapter's ``on_applied(model)`` (once per model) and then
    :func:`validate_for_model`, so the trace sees the hook's effect and a config
    that cannot fit the model fails here with the core's message. Every entry point
    calls it: ``hyper_ac.backend(config, model=...)`` when it is created,
    ``hyper_ac.frontend.capture.capture_joint`` (the hook) before it traces; call it
    yourself before tracing a graph any other way.
    """
    cfg = load_config(config)
    if model is not None:
        apply_adapter_hook(model)
    return validate_for_model(cfg, model)


@dataclasses.dataclass
class PassResult:
    """What one run of the pass did (``plan`` is the core's plan document, in the form asked
    for: docs/graph-format.md, "Plan document"; :mod:`hyper_ac.planning.plan_doc` reads either form)."""

    mode: str
    plan: Mapping[str, Any]
    plan_seconds: float = 0.0
    serialize_seconds: float = 0.0
    apply_seconds: float = 0.0
    #: The core's forward/backward split of the rewritten graph (``plan(..., with_split=True)``;
    #: docs/graph-format.md "Split document"), for ``partition_joint(..., split=...)``; else None.
    split: Optional[Mapping[str, Any]] = None

    @property
    def stats(self) -> Mapping[str, Any]:
        return plan_doc.stats(self.plan)

    @property
    def diagnostics(self) -> list:
        return plan_doc.diagnostics(self.plan)

    @property
    def saved(self) -> list[str]:
        return list(plan_doc.saved(self.plan))

    def summary(self) -> str:
        s = self.stats
        if not s:
            return f"hyper_ac: mode={self.mode}: graph unchanged"
        return (
            f"hyper_ac: mode={self.mode}: duplicated {s['nodes_duplicated']} node(s), "
            f"saved for backward {_core.format_bytes(s['saved_bytes_before'])} -> {_core.format_bytes(s['saved_bytes_after'])}, "
            f"recompute {s['recompute_flops']:.3g} FLOPs"
        )

    def report(self) -> None:
        """The plan's warnings as Python warnings (attributed to the caller's caller), the rest and the summary to the log.

        Each warning names hyper_ac: under ``torch.compile`` the caller's caller is a frame inside
        torch's AOT partitioner, so the message is all that tells a user where it comes from.
        """
        for diagnostic in self.diagnostics:
            if diagnostic["level"] == "warning":
                warnings.warn(f"hyper_ac: {diagnostic['message']}", stacklevel=3)
            else:
                _LOG.info("%s", diagnostic["message"])
        _LOG.info("%s", self.summary())


def _require_annotated(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if not fx_meta.has_phase(node):
            raise ValueError(
                f"node '{node.name}' has no meta[{fx_meta.BACKWARD!r}]: the pass needs a joint graph annotated "
                "with forward/backward phases (capture it with hyper_ac.frontend.capture.capture_joint, or call "
                "hyper_ac.frontend.annotate.annotate_joint(gm, num_fwd_outputs) first)"
            )


def _graph_json(graph: Union[fx.GraphModule, str, bytes, Mapping[str, Any]], model: Any,
                caller: str, cfg: Optional[Config] = None) -> Union[str, bytes]:
    if isinstance(graph, fx.GraphModule):
        from hyper_ac.frontend.serialize import to_json
        from hyper_ac.frontend.sharding import check_supported

        _require_annotated(graph)
        check_supported(graph.graph, cfg.compiler if cfg is not None else "eager", stage=caller)
        # hardware: measured (the core's config facts say so): time each op (hyper_ac.frontend.op_times)
        return to_json(graph, model, measure=cfg is not None and cfg.facts["measure_op_times"])
    if isinstance(graph, (str, bytes)):  # the core reads either in place
        return graph
    if isinstance(graph, Mapping):
        return json.dumps(graph, separators=(",", ":"))
    raise TypeError(f"hyper_ac.{caller}: graph must be an fx.GraphModule, graph JSON text (str or bytes) or its dict, "
                    f"got {type(graph).__name__}")


def plan(graph: Union[fx.GraphModule, str, bytes, Mapping[str, Any]], config: Any, model: Any = None, *,
         timeline: bool = False, with_split: bool = False,
         stock_recomputed: Optional[Sequence[str]] = None, detail: bool = False,
         unitless_to_stock: bool = False, peak_oracle: Optional[Callable[[str], int]] = None,
         peak_lower_bound: Optional[Callable[[str], int]] = None) -> PassResult:
    """The core's plan for a joint graph, without changing it: the one entry
    the pass, the CLI and the benchmark call.

    ``graph``: an annotated joint ``fx.GraphModule`` (serialised here), or a
    graph document already serialised (JSON text, ``str`` or ``bytes``, or its dict).
    ``config``: a preset name, YAML path, dict or :class:`Config`.
    ``model``: the live module, for its ``model`` section and its adapter's
    region patterns.
    ``timeline=True``: the plan also carries the core's simulated live
    activation bytes per schedule step, ``plan["timeline"] = {"before": [...],
    "after": [...], "boundary_before": i, "boundary_after": j}`` (the last
    forward step of each schedule); without it the plan is unchanged.
    ``with_split=True``: the result also carries the core's forward/backward split
    of the rewritten graph (``result.split``: the nodes each module runs, the
    saved values in order), what ``partition_joint(..., split=result.split)``
    builds the two modules from; the plan itself is unchanged.
    ``stock_recomputed``: the forward node names the stock partition
    recomputes on this graph (:func:`hyper_ac.lower.backends.stock_recomputed`, a
    fact measured with torch); ``auto`` then rewrites nothing unless its
    simulated peak is below that plan's (the core decides: docs/mincut.md,
    "Never worse than stock"). ``None`` (default): no comparison.
    ``detail``: the plan document's form (docs/graph-format.md, "Plan document"):
    ``False`` (default) the compact form, what applying it needs and the
    cheapest to read; ``True`` the full form, every tagged node's policy,
    region id and reason keyed by name. Both carry the same decisions
    (:mod:`hyper_ac.planning.plan_doc` reads either).
    ``unitless_to_stock``: a graph in which no unit can be found gets a plan that changes
    nothing, routed to stock (``route_reason`` ``no_units``) with a warning, instead of
    ``NoUnitsError`` (what the backend asks: graph breaks may leave a piece without a block).
    ``peak_oracle``: the compiler's own account of a candidate's step peak (a candidate
    plan document's JSON text -> bytes beyond the step's inputs, or -1), which the core
    checks the budget's search and the never-above-stock guard against
    (:class:`hyper_ac.lower.oracle.InductorDryRun`; docs/mincut.md, "Measured peaks").
    ``peak_lower_bound``: with ``peak_oracle``, the bytes a candidate's measured peak cannot be
    below, found without compiling (JSON text -> bytes, or -1); the core asks it for the stock
    partition, so that a plan measured under it passes the guard without measuring stock
    (:meth:`hyper_ac.lower.oracle.InductorDryRun.lower_bound`).
    """
    if not isinstance(timeline, bool):
        raise TypeError(f"hyper_ac.plan: timeline must be a bool, got {type(timeline).__name__}")
    if not isinstance(with_split, bool):
        raise TypeError(f"hyper_ac.plan: with_split must be a bool, got {type(with_split).__name__}")
    if not isinstance(detail, bool):
        raise TypeError(f"hyper_ac.plan: detail must be a bool, got {type(detail).__name__}")
    if not isinstance(unitless_to_stock, bool):
        raise TypeError(f"hyper_ac.plan: unitless_to_stock must be a bool, got {type(unitless_to_stock).__name__}")
    if stock_recomputed is not None:
        if isinstance(stock_recomputed, str) or not all(isinstance(n, str) for n in stock_recomputed):
            raise TypeError("hyper_ac.plan: stock_recomputed must be a sequence of node names (str) or None")
        stock_recomputed = list(stock_recomputed)
    cfg = load_config(config)
    with paused_gc():  # large documents both ways (hyper_ac._gc)
        t0 = time.perf_counter()
        graph_json = _graph_json(graph, model, "plan", cfg)
        t1 = time.perf_counter()
        split_doc = None
        if with_split:
            plan_text, split_text = _core.plan_split(graph_json, cfg.json_for(model), op_policy_json(),
                                                     timeline=timeline, stock_recomputed=stock_recomputed,
                                                     detail=detail, unitless_to_stock=unitless_to_stock,
                                                     peak_oracle=peak_oracle, peak_lower_bound=peak_lower_bound)
            split_doc = json.loads(split_text)
        else:
            plan_text = _core.plan(graph_json, cfg.json_for(model), op_policy_json(), timeline=timeline,
                                   stock_recomputed=stock_recomputed, detail=detail,
                                   unitless_to_stock=unitless_to_stock, peak_oracle=peak_oracle,
                                   peak_lower_bound=peak_lower_bound)
        t2 = time.perf_counter()
        return PassResult(cfg.mode, json.loads(plan_text), plan_seconds=t2 - t1, serialize_seconds=t1 - t0,
                          split=split_doc)


def frontier_points(graph: Union[fx.GraphModule, str, Mapping[str, Any]], config: Any = None, *, model: Any = None
                    ) -> list:
    """The saved-bytes / recompute-cost frontier across λ (min-cut modes), the core's points as dicts;
    ``graph`` as for :func:`plan`. ``hyper_ac.frontier`` (:func:`hyper_ac.display.timeline.frontier`) wraps them
    in a list that plots itself."""
    cfg = load_config(config if config is not None else {"ac_mode": "auto"})
    return json.loads(_core.frontier(_graph_json(graph, model, "frontier", cfg), cfg.json_for(model), op_policy_json()))
