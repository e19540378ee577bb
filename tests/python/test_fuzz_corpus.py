"""The fuzz corpus reaches the planner (docs/testing.md, "Fuzzing").

Every seed in ``tests/fuzz/corpus`` (graph JSON, NUL, config JSON) must load
and plan under its own config with the fuzz target's operator table
(``tests/fuzz/op_policy.json``), and the stages its config asks for must have
run: the remat plan and the memory simulation in every mode but ``off``,
the min-cut in ``auto`` and ``budget``. A seed the loader rejects fails here:
it would only exercise the loader's refusal path. Seeds kept on purpose for
that path live in ``tests/fuzz/corpus/rejected/`` and must be rejected by the
loader itself (a ``GraphError``, not a config or scope error). Together the
seeds must reach every mode and the rules the fuzzer is meant to drive
(duplicates, RNG replay, collectives, in-place, SymInt, user tags, excluded
modules, budget misses), and ``tests/fuzz/json.dict`` must name every key they
use. Regenerate both with ``python scripts/make_fuzz_corpus.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import core_module

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
CORPUS = FUZZ / "corpus"
REJECTED = CORPUS / "rejected"
MINCUT_MODES = ("auto", "budget")


def _seeds(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*") if p.is_file() and not p.name.startswith("."))


def _split(path: Path) -> tuple[str, str]:
    """The fuzz input format: graph, NUL, config (no NUL: config ``{"ac_mode": "auto"}``)."""
    graph, nul, config = path.read_bytes().partition(b"\0")
    return graph.decode("utf-8", "replace"), config.decode("utf-8", "replace") if nul else '{"ac_mode": "auto"}'


def _mode(config: dict) -> str:
    section = config.get("activation_checkpoint", {})
    return section.get("mode", config.get("ac_mode", "off")) if isinstance(section, dict) else "off"


_PLANS: dict[str, dict] = {}


def _plan(path: Path) -> dict:
    if path.name not in _PLANS:
        core = core_module()
        graph, config = _split(path)
        try:
            core.load_graph_summary(graph)
        except core.GraphError as error:
            pytest.fail(f"{path.name}: the loader rejects this seed (move it to rejected/ if that is the point): "
                        f"{error}", pytrace=False)
        plan = json.loads(core.plan(graph, config, (FUZZ / "op_policy.json").read_text(), timings=True))
        plan["mode"] = _mode(json.loads(config))
        _PLANS[path.name] = plan
    return _PLANS[path.name]


SEEDS = _seeds(CORPUS)


def test_the_corpus_is_not_trivial():
    assert len(SEEDS) >= 100, "the corpus shrank: regenerate it with scripts/make_fuzz_corpus.py"
    assert _seeds(REJECTED), "rejected/ keeps the loader's refusal path in the corpus"


@pytest.mark.parametrize("path", SEEDS, ids=[p.name for p in SEEDS])
def test_seed_loads_and_plans(path):
    plan = _plan(path)
    stats, timings = plan["stats"], plan["timings"]
    assert plan["mode"] in ("off", "full", "selective", "auto", "budget")
    if plan["mode"] == "off":  # the graph is left as it is: no stage runs
        assert stats["nodes_duplicated"] == 0 and not plan["duplicates"]
        return
    assert timings["simulate_seconds"] > 0 and stats["simulated_peak_before"] > 0, "the simulation did not run"
    assert timings["remat_seconds"] > 0 and stats["saved_bytes_before"] > 0, "the remat plan did not run"
    if plan["mode"] in MINCUT_MODES:
        assert timings["mincut_seconds"] > 0, "the min-cut did not run"


@pytest.mark.parametrize("path", _seeds(REJECTED), ids=[p.name for p in _seeds(REJECTED)])
def test_rejected_seed_is_rejected_by_the_loader(path):
    core = core_module()
    graph, _ = _split(path)
    with pytest.raises(core.GraphError):
        core.load_graph_summary(graph)


def test_the_corpus_reaches_every_mode_and_rule():
    plans = [_plan(p) for p in SEEDS]
    assert {p["mode"] for p in plans} == {"off", "full", "selective", "auto", "budget"}

    def some(what: str, test) -> None:
        assert any(test(p) for p in plans), f"no seed reaches: {what}"

    stat = lambda key: (lambda p: p["stats"].get(key, 0) > 0)  # noqa: E731
    for mode in ("full", "selective", "auto", "budget"):
        some(f"a duplicate in {mode}", lambda p, mode=mode: p["mode"] == mode and p["stats"]["nodes_duplicated"] > 0)
    some("an RNG replay", stat("rng_replayed"))
    some("a saved random op", stat("saved_rng"))
    some("a saved collective", stat("saved_collective"))
    some("a value saved for an in-place write", stat("saved_inplace"))
    some("a saved SymInt", stat("saved_symint"))
    some("a cross-unit save", stat("saved_cross_unit"))
    some("user checkpoint tags", stat("user_tagged"))
    some("an excluded module", lambda p: bool(p["excluded"]))
    some("an exclude input rebuilt", stat("rebuilt_for_exclude"))
    some("the whole-graph scope", lambda p: p["stats"]["scope"] == "whole_graph")
    some("a met unit-graph budget", lambda p: p["stats"]["scope"] == "unit_graph" and p["mode"] == "budget"
         and p["stats"]["budget_met"] and p["stats"]["nodes_duplicated"] > 0)
    some("a met budget", lambda p: p["mode"] == "budget" and p["stats"]["budget_met"])
    some("a missed budget", lambda p: p["mode"] == "budget" and not p["stats"]["budget_met"])


def test_the_dictionary_names_every_key_the_seeds_use():
    words = set()
    for line in (FUZZ / "json.dict").read_text().splitlines():
        if line.startswith('"'):
            words.add(line[1:-1].replace('\\"', '"'))
    keys: set = set()

    def walk(value):
        if isinstance(value, dict):
            keys.update(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for path in SEEDS:
        graph, config = _split(path)
        walk(json.loads(graph))
        walk(json.loads(config))
    missing = sorted(k for k in keys if f'"{k}"' not in words)
    assert not missing, f"json.dict lacks {missing}: regenerate it with scripts/make_fuzz_corpus.py --dict-only"
