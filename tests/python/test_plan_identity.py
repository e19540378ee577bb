"""Plan identity: the core's plan is the same across restructures.

For every graph the Python tests use (the captured models of ``conftest`` at
their test sizes, and each valid JSON graph in ``tests/data``) under every
mode and every preset in ``configs/``, the sha256 of the plan JSON the core
returns (its full form, ``detail=True``) is recorded in ``tests/data/plan_hashes.json``: the whole document
but the wording of its diagnostics (each keeps its level and node), so a
reworded message changes no hash. Only the plan is
hashed, never the graph document (its ``model`` section may change shape
without changing a decision). A config the core rejects for a graph (no
units, say) records the error's type instead, so a change of outcome fails
too. Each captured model is planned twice: serialised with its live model
(the ``model`` section: unit discovery from the module tree) and without
(units from the module stacks alone).

Regenerate with ``HYPER_AC_UPDATE_GOLDEN=1 pytest tests/python/test_plan_identity.py``
and justify every changed hash in the commit message.

The decisions (``tests/data/plan_decisions.json``) are checked on their own,
part by part: per-node policies, duplicates with their insertion points,
redirects, erasures, the saved set, the replayed random ops, the route
(rewrite or hand the graph to stock) and, per graph and config, the
saved-bytes / recompute frontier (``_core.frontier``). A restructure that
changes the plan document (a new field, a reworded message) regenerates the
hashes above, never this fixture: it is what proves no decision changed.
Regenerate it (``HYPER_AC_UPDATE_DECISIONS=1``) only for a change that is
meant to change decisions, and say which in the commit message.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from pathlib import Path

import pytest

from conftest import ALL_MODELS, core_module, get_captured

DATA = Path(__file__).resolve().parents[1] / "data"
HASHES = DATA / "plan_hashes.json"
DECISIONS = DATA / "plan_decisions.json"
UPDATE = os.environ.get("HYPER_AC_UPDATE_GOLDEN") == "1"
UPDATE_DECISIONS = os.environ.get("HYPER_AC_UPDATE_DECISIONS") == "1"

# Each mode on its own (the budget as the tests write it), then every preset file.
MODE_CONFIGS = {
    "mode:off": {"ac_mode": "off"},
    "mode:full": {"ac_mode": "full"},
    "mode:selective": {"ac_mode": "selective"},
    "mode:auto": {"ac_mode": "auto"},
    "mode:budget": {"ac_mode": "budget", "ac_memory_budget": 0.5},
}
PRESETS = ("auto", "budget", "flat", "full", "layers", "moe", "selective")
JSON_GRAPHS = ("tiny_mlp",)  # tests/data/bad_dangling.json is invalid on purpose


def _configs() -> dict:
    from hyper_ac.planning.config import CONFIG_DIR as CONFIGS

    out = dict(MODE_CONFIGS)
    for name in PRESETS:
        out[f"preset:{name}"] = str(CONFIGS / f"{name}.yaml")
    return out


def _graphs():
    """(label, graph JSON text, live model or None) for every graph."""
    from hyper_ac.frontend.serialize import serialize_graph

    for name in ALL_MODELS:
        c = get_captured(name)
        yield f"model:{name}", c.json(), c.model
        bare = json.dumps(serialize_graph(c.gm), separators=(",", ":"))
        yield f"model:{name}:no-live-model", bare, None
    for name in JSON_GRAPHS:
        yield f"json:{name}", (DATA / f"{name}.json").read_text(), None


@functools.lru_cache(maxsize=None)
def _plans() -> dict:
    """``{graph label: {config key: (full plan, graph, config JSON) or "error:<type>"}}``, planned once for
    both fixtures (the type only of an error: messages may be reworded)."""
    from hyper_ac.planning.config import ConfigError, load_config, op_policy_json

    core = core_module()
    out: dict = {}
    for label, graph, model in _graphs():
        out[label] = {}
        for key, config in _configs().items():
            try:
                cfg_json = load_config(config).json_for(model)
                plan = json.loads(core.plan(graph, cfg_json, op_policy_json(), detail=True))  # the full form
            except (ValueError, RuntimeError, ConfigError) as error:
                out[label][key] = f"error:{type(error).__name__}"
                continue
            out[label][key] = (plan, graph, cfg_json)
    return out


def _plan_hash(planned) -> str:
    if isinstance(planned, str):
        return planned
    plan = copy.deepcopy(planned[0])
    for diagnostic in plan["diagnostics"]:
        diagnostic.pop("message")  # the decisions, not their wording
    return hashlib.sha256(json.dumps(plan, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _compute() -> dict:
    return {label: {key: _plan_hash(planned) for key, planned in by_cfg.items()}
            for label, by_cfg in _plans().items()}


def _leaves(tree: dict, prefix: tuple = ()):
    """``("graph × config[ × part]", value)`` for every leaf of a fixture."""
    for key, value in sorted(tree.items()):
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield " × ".join((*prefix, key)), value


def _check_fixture(path: Path, actual: dict, update: bool, env: str, what: str) -> bool:
    """Rewrite ``path`` from ``actual`` when updating (returns True); else fail naming every
    graph × config (× part) whose value differs from the recorded one."""
    if update:
        path.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
        return True
    if not path.exists():
        pytest.fail(f"{path} is missing: run with {env}=1 to create it", pytrace=False)
    expected = json.loads(path.read_text())
    assert set(actual) == set(expected), "the graph list changed"
    want, got = dict(_leaves(expected)), dict(_leaves(actual))
    changed = [f"{label}: {want.get(label)} -> {got.get(label)}" for label in sorted(set(want) | set(got))
               if want.get(label) != got.get(label)]
    assert not changed, f"{what} changed ({env}=1 rewrites {path.name}):\n" + "\n".join(changed)
    return False


def test_plans_are_byte_identical():
    actual = _compute()
    if _check_fixture(HASHES, actual, UPDATE, "HYPER_AC_UPDATE_GOLDEN", "plans"):
        return
    # Not vacuous: most pairs plan; an all-error table would hide nothing.
    planned = sum(not v.startswith("error:") for by_cfg in actual.values() for v in by_cfg.values())
    assert planned >= len(actual) * len(MODE_CONFIGS)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _decisions(core, planned) -> dict:
    """The plan's decisions, part by part (each as a short digest), and its frontier's."""
    from hyper_ac.planning import plan_doc
    from hyper_ac.planning.config import ConfigError, op_policy_json

    if isinstance(planned, str):
        return {"error": planned.removeprefix("error:")}
    plan, graph, cfg_json = planned
    policies = dict(plan_doc.policies(plan))  # {name: POLICY} whichever form the plan is in
    parts = {
        "policies": policies,
        "duplicates": [[d["of"], d["before"]] for d in plan["duplicates"]],
        "redirects": [[r["node"], r["input"], r["duplicate"]] for r in plan["redirects"]],
        "erase": plan["erase"],
        "saved": plan["saved"],
        "rng_replays": [r["of"] for r in plan.get("rng_replays", [])],
    }
    out = {key: _digest(value) for key, value in parts.items()}
    out["route"] = plan["route"]  # the core's (recorded before it was: the backend's rule, no stock comparison)
    out["counts"] = [len(policies), len(plan["duplicates"]), len(plan["saved"])]
    try:
        out["frontier"] = _digest(json.loads(core.frontier(graph, cfg_json, op_policy_json())))
    except (ValueError, RuntimeError, ConfigError) as error:
        out["frontier"] = f"error:{type(error).__name__}"
    return out


def test_plan_decisions_are_unchanged():
    """Every decision of every plan (model × config) is the one recorded from the code before a restructure."""
    core = core_module()
    actual = {label: {key: _decisions(core, planned) for key, planned in by_cfg.items()}
              for label, by_cfg in _plans().items()}
    if _check_fixture(DECISIONS, actual, UPDATE_DECISIONS, "HYPER_AC_UPDATE_DECISIONS", "plan decisions"):
        return
    # Not vacuous: both routes occur, and most pairs plan and duplicate something.
    routes = {parts.get("route") for by_cfg in actual.values() for parts in by_cfg.values()}
    assert {"rewrite", "stock"} <= routes
    rewritten = sum(parts.get("route") == "rewrite" for by_cfg in actual.values() for parts in by_cfg.values())
    assert rewritten >= len(actual) * 2


def test_timeline_is_opt_in_and_adds_only_itself():
    core = core_module()
    from hyper_ac.planning.config import load_config, op_policy_json

    c = get_captured("transformer")
    for mode in ("off", "selective", "auto"):
        cfg = load_config({"ac_mode": mode}).json_for(c.model)
        plain = core.plan(c.json(), cfg, op_policy_json(), detail=True)
        assert plain == core.plan(c.json(), cfg, op_policy_json(), timeline=False, detail=True)
        with_timeline = json.loads(core.plan(c.json(), cfg, op_policy_json(), timeline=True, detail=True))
        timeline = with_timeline.pop("timeline")
        assert with_timeline == json.loads(plain)
        stats = with_timeline["stats"]
        assert set(timeline) == {"before", "after", "boundary_before", "boundary_after", "units"}
        assert 0 <= timeline["boundary_before"] < len(timeline["before"])
        assert 0 <= timeline["boundary_after"] < len(timeline["after"])
        if mode == "off":
            assert timeline["before"] == timeline["after"]
        else:  # the same simulation as the stats' peaks
            assert max(timeline["before"]) == stats["simulated_activation_peak_before"]
            assert max(timeline["after"]) == stats["simulated_activation_peak_after"]
            assert len(timeline["after"]) == len(timeline["before"]) + stats["nodes_duplicated"] - stats["nodes_erased"]
            # Per unit: the highest live bytes in its backward, never above the step's peak.
            units = timeline["units"]
            assert [u["fqn"] for u in units] == [f"layers.{i}" for i in range(len(units))] and units
            for unit in units:
                assert 0 < unit["backward_peak_before"] <= stats["simulated_activation_peak_before"]
                assert 0 < unit["backward_peak_after"] <= stats["simulated_activation_peak_after"]
