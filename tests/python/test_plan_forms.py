"""The plan's two forms (docs/graph-format.md, "Plan document"): the compact
form (default) and the full form (``detail=True``) carry the same decisions.

Each captured test model is planned under every mode and the rewritten graph
from each form is compared node by node (names, ops, targets, arguments and
the meta the plan writes); the decisions read through ``hyper_ac.planning.plan_doc``
agree too. A plan of another format version is refused.
"""

from __future__ import annotations

import json

import pytest

from conftest import ALL_MODELS, get_captured

MODES = ("full", "selective", "auto", "budget")
META = ("recompute", "ac_graph_id", "autograd_backward", "ac_recomputed", "ac_recomputed_from", "ac_duplicate",
        "ac_rng_replay_of")


def _config(mode: str) -> dict:
    return {"ac_mode": mode, "ac_memory_budget": 0.5} if mode == "budget" else {"ac_mode": mode}


def _form(graph) -> list:
    """The rewritten graph as plain data: every node, its inputs and the meta the plan writes."""
    def arg(a):
        return f"%{a.name}" if hasattr(a, "op") and hasattr(a, "name") else repr(a)

    out = []
    for node in graph.nodes:
        args = [arg(a) for a in node.args] if isinstance(node.args, tuple) else repr(node.args)
        meta = {k: str(node.meta[k]) for k in META if k in node.meta}
        out.append((node.name, node.op, str(node.target), repr(args),
                    sorted((k, arg(v)) for k, v in node.kwargs.items()), sorted(meta.items())))
    return out


def _apply(c, plan):
    from hyper_ac._fx import copy_graph_module
    from hyper_ac.lower.apply import apply_plan

    gm = copy_graph_module(c.gm)
    apply_plan(gm, plan, recompile=False)
    return _form(gm.graph)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_both_forms_apply_identically(name):
    import hyper_ac
    from hyper_ac.planning import plan_doc

    c = get_captured(name)
    applied = 0
    for mode in MODES:
        try:
            compact = hyper_ac.plan(c.gm, _config(mode), c.model)
        except ValueError:  # a config this model cannot take (no units): both forms alike
            with pytest.raises(ValueError):
                hyper_ac.plan(c.gm, _config(mode), c.model, detail=True)
            continue
        full = hyper_ac.plan(c.gm, _config(mode), c.model, detail=True)
        assert plan_doc.is_compact(compact.plan) and not plan_doc.is_compact(full.plan)
        assert dict(plan_doc.policies(compact.plan)) == full.plan["policies"]
        assert dict(plan_doc.graph_ids(compact.plan)) == full.plan["graph_ids"]
        assert plan_doc.pinned(compact.plan) == plan_doc.pinned(full.plan)
        for key in ("duplicates", "redirects", "erase", "saved", "kept", "stats", "diagnostics", "mode", "regions",
                    "excluded", "rng_replays", "elided_copies"):
            assert compact.plan.get(key) == full.plan.get(key), key
        assert _apply(c, compact.plan) == _apply(c, full.plan), f"{name} × {mode}"
        applied += 1
    assert applied, f"no mode planned {name}"


def test_compact_is_smaller_and_sorted():
    """The compact text is shorter than the full one and, like it, in canonical byte order."""
    from hyper_ac import _core
    from hyper_ac.planning.config import load_config, op_policy_json

    c = get_captured("transformer")
    cfg = load_config({"ac_mode": "selective"}).json_for(c.model)
    compact = _core.plan(c.json(), cfg, op_policy_json())
    full = _core.plan(c.json(), cfg, op_policy_json(), detail=True)
    assert len(compact) < len(full)
    def sorted_keys(pairs):
        keys = [k for k, _ in pairs]
        assert keys == sorted(keys, key=lambda k: k.encode()), keys
        return dict(pairs)

    for text in (compact, full):
        json.loads(text, object_pairs_hook=sorted_keys)


def test_other_versions_are_refused():
    import hyper_ac
    from hyper_ac.planning import plan_doc
    from hyper_ac.lower.apply import apply_plan

    c = get_captured("mlp")
    plan = dict(hyper_ac.plan(c.gm, {"ac_mode": "auto"}, c.model).plan)
    plan["version"] = plan_doc.VERSION - 1
    from hyper_ac._fx import copy_graph_module

    with pytest.raises(ValueError, match="version"):
        apply_plan(copy_graph_module(c.gm), plan)
