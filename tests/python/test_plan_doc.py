"""The plan document's keys are read through ``hyper_ac.planning.plan_doc`` (issue 39).

Each accessor returns the document's value on a real plan of both forms
(compact and ``detail=True``), an optional key reads as empty when absent, and
no module under ``hyper_ac/`` other than ``plan_doc.py`` spells a plan key to
index a document (a source scan, itself checked on snippets it must flag).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import get_captured

PACKAGE = Path(__file__).resolve().parents[2] / "hyper_ac"
PLAN_DOC = PACKAGE / "planning" / "plan_doc.py"

#: Accessor name -> the plan key it reads (docs/graph-format.md, "Plan document").
ACCESSORS = {
    "route": "route", "route_reason": "route_reason", "duplicates": "duplicates", "redirects": "redirects",
    "erase": "erase", "kept": "kept", "saved": "saved", "rng_replays": "rng_replays",
    "elided_copies": "elided_copies", "stats": "stats", "diagnostics": "diagnostics", "timeline": "timeline",
}
#: Keys present only when non-empty: absent, the accessor returns [].
OPTIONAL_LISTS = ("rng_replays", "elided_copies")
#: Keys of the empty plan of mode off (``PassResult("off", {})``): absent, the accessor returns an empty value.
EMPTY_PLAN_DEFAULTS = {"saved": [], "stats": {}, "diagnostics": []}
#: Every plan key the scan looks for: the accessors' and those the form-dependent readers read.
SCANNED_KEYS = frozenset(ACCESSORS.values()) | {"policies", "graph_ids", "pinned", "reasons"}
#: (file under hyper_ac/, expression) indexing another document with a key a plan has too.
NOT_PLAN = {
    ("lower/partition.py", "split['saved']"),  # the split document (docs/graph-format.md), not the plan
}


def _plans():
    import hyper_ac

    c = get_captured("mlp")
    compact = hyper_ac.plan(c.gm, {"ac_mode": "full"}, c.model)
    full = hyper_ac.plan(c.gm, {"ac_mode": "full"}, c.model, detail=True)
    timed = hyper_ac.plan(c.gm, {"ac_mode": "full"}, c.model, timeline=True, detail=True)
    return compact, full, timed


def test_every_accessor_is_exported():
    from hyper_ac.planning import plan_doc

    for name in ACCESSORS:
        assert name in plan_doc.__all__ and callable(getattr(plan_doc, name)), name
        assert getattr(plan_doc, name).__doc__, f"plan_doc.{name} has no docstring"
    assert "without_elided_copies" in plan_doc.__all__


def test_accessors_read_both_forms():
    from hyper_ac.planning import plan_doc

    compact, full, timed = _plans()
    assert plan_doc.is_compact(compact.plan) and not plan_doc.is_compact(full.plan)
    for result in (compact, full, timed):
        plan = result.plan
        for name, key in ACCESSORS.items():
            if key == "timeline" and result is not timed:
                with pytest.raises(KeyError):
                    plan_doc.timeline(plan)  # only when asked for
                continue
            if key in OPTIONAL_LISTS and key not in plan:
                assert getattr(plan_doc, name)(plan) == [], name
                continue
            assert getattr(plan_doc, name)(plan) is plan[key], name
        assert plan_doc.without_elided_copies(plan) == {k: v for k, v in plan.items() if k != "elided_copies"}
    # The same decisions whichever form: every form-independent key reads alike.
    for name in ACCESSORS:
        if name not in ("timeline", "stats"):  # stats carry timings
            assert getattr(plan_doc, name)(compact.plan) == getattr(plan_doc, name)(full.plan), name
    assert plan_doc.route(compact.plan) == "rewrite" and plan_doc.route_reason(compact.plan) == "recomputes"
    assert plan_doc.duplicates(compact.plan) and plan_doc.redirects(compact.plan)  # mode full recomputes on mlp
    assert set(plan_doc.kept(compact.plan)) <= set(plan_doc.saved(compact.plan))
    assert plan_doc.stats(compact.plan)["nodes_duplicated"] == len(plan_doc.duplicates(compact.plan))
    assert {"before", "after", "boundary_before", "boundary_after"} <= set(plan_doc.timeline(timed.plan))
    # The PassResult properties read through the same accessors.
    assert compact.stats is plan_doc.stats(compact.plan) and compact.saved == plan_doc.saved(compact.plan)
    assert compact.diagnostics is plan_doc.diagnostics(compact.plan)


def test_optional_keys_and_the_empty_plan():
    from hyper_ac.planning import plan_doc

    compact, _, _ = _plans()
    plan = dict(compact.plan)
    replay = [{"of": "rand", "state": "rand_rng_state", "state_bytes": 16}]
    elided = [{"node": "clone", "source": "x"}]
    plan.update(rng_replays=replay, elided_copies=elided)
    assert plan_doc.rng_replays(plan) is replay and plan_doc.elided_copies(plan) is elided
    assert "elided_copies" not in plan_doc.without_elided_copies(plan)
    assert plan_doc.without_elided_copies(plan)["rng_replays"] is replay
    for key in OPTIONAL_LISTS:
        plan.pop(key)
        assert getattr(plan_doc, ACCESSORS[key])(plan) == []
    for name, empty in EMPTY_PLAN_DEFAULTS.items():
        assert getattr(plan_doc, name)({}) == empty, name


def _plan_key_reads(source: str, keys=SCANNED_KEYS) -> list[tuple[int, str]]:
    """(line, expression) for every literal plan key used to read a document: ``d["key"]``,
    ``d.get("key", ...)`` / ``pop`` / ``setdefault``, and comparisons or membership tests with the key
    (``"key" in d``, ``key != "key"``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript):
            hit = isinstance(node.slice, ast.Constant) and node.slice.value in keys
        elif isinstance(node, ast.Call):
            hit = (isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop", "setdefault")
                   and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys)
        elif isinstance(node, ast.Compare):
            hit = any(isinstance(side, ast.Constant) and side.value in keys for side in (node.left, *node.comparators))
        else:
            continue
        if hit:
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_the_scan_flags_every_way_of_spelling_a_key():
    snippet = '\n'.join([
        'a = plan["duplicates"]',
        'b = result.plan.get("rng_replays", [])',
        'c = {k: v for k, v in plan.items() if k != "elided_copies"}',
        'd = "timeline" in plan',
        'e = self.plan.pop("stats")',
        'f = plan["route"] == "stock"',
    ])
    lines = sorted({line for line, _ in _plan_key_reads(snippet)})
    assert lines == [1, 2, 3, 4, 5, 6]
    # What is not a plan key read stays unflagged.
    assert _plan_key_reads('x = plan_doc.route(plan) == "stock"\ny = row["policy"]\nz = facts.get("plans")') == []


def test_no_module_but_plan_doc_spells_a_plan_key():
    assert PLAN_DOC.is_file()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PLAN_DOC:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        found += [f"hyper_ac/{rel}:{line}: {expr}" for line, expr in _plan_key_reads(path.read_text())
                  if (rel, expr) not in NOT_PLAN]
    assert not found, "read these through hyper_ac.planning.plan_doc:\n" + "\n".join(found)
    # plan_doc.py itself spells them (the scan sees its reads).
    assert {expr for _, expr in _plan_key_reads(PLAN_DOC.read_text())} >= {"plan['duplicates']", "plan['route']"}
