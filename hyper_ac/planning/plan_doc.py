"""Reading the core's plan document (docs/graph-format.md, "Plan document").

The core writes one plan in two forms of the same format version: the
compact form (the default: what a caller needs to apply it, per-node facts as
lists grouped by value) and the full form (``detail=True``: every tagged
node's policy, region id and reason keyed by name). Both carry the same
decisions; these accessors read either, so ``hyper_ac.lower.apply`` and the backend
apply them alike. A document of another format or version is refused: there
is no reader for older plans.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from hyper_ac import _core

__all__ = ["FORMAT", "VERSION", "check", "diagnostics", "duplicates", "elided_copies", "erase", "graph_ids",
           "is_compact", "kept", "pinned", "policies", "redirects", "rng_replays", "route", "route_reason", "saved",
           "stats", "timeline", "without_elided_copies"]

FORMAT = "hyper_ac.plan"
#: The plan format version this build reads and writes (``kPlanFormatVersion``).
VERSION: int = _core.PLAN_FORMAT_VERSION


def check(plan: Mapping[str, Any]) -> None:
    """``ValueError`` unless ``plan`` is a plan document of this build's version."""
    if plan.get("format") != FORMAT or plan.get("version") != VERSION:
        raise ValueError(f"not a {FORMAT} document of version {VERSION} (format {plan.get('format')!r}, version "
                         f"{plan.get('version')!r}); plan the graph again with this build")


def is_compact(plan: Mapping[str, Any]) -> bool:
    """The compact form (``"form": "compact"``); else the full one."""
    return plan.get("form") == "compact"


def policies(plan: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(node name, policy) for every tagged node."""
    if is_compact(plan):
        for policy, names in plan["policies"].items():
            for name in names:
                yield name, policy
    else:
        yield from plan["policies"].items()


def graph_ids(plan: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """(node name, region id: ``meta["ac_graph_id"]``) for every tagged node that has one."""
    if is_compact(plan):
        for graph_id, names in plan["graph_ids"].items():
            gid = int(graph_id)  # a JSON key is a string
            for name in names:
                yield name, gid
    else:
        yield from plan["graph_ids"].items()


def pinned(plan: Mapping[str, Any]) -> set[str]:
    """The nodes the core pins for correctness (in-place, rng, collective): a stock partition keeps them saved."""
    if is_compact(plan):
        return set(plan["pinned"])
    correctness = set(_core.correctness_reasons())
    return {name for name, reason in plan["reasons"].items() if reason in correctness}


# The other top-level keys, the same in both forms. Every module outside this one reads a
# plan document through these (tests/python/test_plan_doc.py scans for literal keys).


def route(plan: Mapping[str, Any]) -> str:
    """``"rewrite"`` (carry the plan out) or ``"stock"`` (hand the graph unchanged to the stock partition). Always present."""
    return plan["route"]


def route_reason(plan: Mapping[str, Any]) -> str:
    """Why the core chose :func:`route`, one stable word (``off``, ``no_units``, ``stock_not_worse``,
    ``nothing_recomputed``; ``recomputes``, ``user_tagged``). Always present."""
    return plan["route_reason"]


def duplicates(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"of", "before", "private_get_attrs"}]`` in schedule order: each duplicates node ``of``, inserted
    in front of node ``before``. Always present (empty when nothing is recomputed)."""
    return plan["duplicates"]


def redirects(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"node", "input", "duplicate"}]``: backward node ``node`` reads duplicate #``duplicate`` of ``input``
    (-1: the latest made before ``node``). Always present."""
    return plan["redirects"]


def erase(plan: Mapping[str, Any]) -> list[str]:
    """Originals left with no reader once the redirects are applied, safe to erase in list order. Always present."""
    return plan["erase"]


def kept(plan: Mapping[str, Any]) -> list[str]:
    """The call_function values of :func:`saved` the plan decided (what the tag lowering tags
    ``MUST_SAVE``), graph order. Always present."""
    return plan["kept"]


def saved(plan: Mapping[str, Any]) -> list[str]:
    """Forward values the rewritten backward reads, graph order, then the replay states.
    Always present in a plan; empty for the empty plan of mode ``off`` (``PassResult("off", {})``)."""
    return plan.get("saved", [])


def rng_replays(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"of", "state", "state_bytes"}]``, one per duplicated random op, graph order.
    Optional: present only when non-empty, so an absent key reads as ``[]``."""
    return plan.get("rng_replays", [])


def elided_copies(plan: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[{"node", "source"}]``, the exact copies the core's loader removed, graph order.
    Optional: present only when non-empty, so an absent key reads as ``[]``."""
    return plan.get("elided_copies", [])


def without_elided_copies(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``plan`` without :func:`elided_copies` (for a graph they were already applied to)."""
    return {key: value for key, value in plan.items() if key != "elided_copies"}


def stats(plan: Mapping[str, Any]) -> Mapping[str, Any]:
    """The core's statistics (``{name: number}``; the names are the core's).
    Always present in a plan; empty for the empty plan of mode ``off``."""
    return plan.get("stats", {})


def diagnostics(plan: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[{"level", "message"}]``, the core's warnings and notes.
    Always present in a plan; empty for the empty plan of mode ``off``."""
    return plan.get("diagnostics", [])


def timeline(plan: Mapping[str, Any]) -> Mapping[str, Any]:
    """``{"before", "after", "boundary_before", "boundary_after", "units"}``, the simulated live activation
    bytes per schedule step. Optional: present only when asked for (``hyper_ac.plan(..., timeline=True)``);
    ``KeyError`` otherwise."""
    return plan["timeline"]
