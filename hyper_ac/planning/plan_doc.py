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

__all__ = ["FORMAT", "VERSION", "check", "graph_ids", "is_compact", "pinned", "policies"]

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
