"""``hardware: measured``: op times measured once, cached on disk, used by the core's plan.

The cache lives in a temporary ``$HYPER_AC_CACHE_DIR`` per test: the file is
written, a second serialisation measures nothing (counted by
``op_times.STATS``), a corrupt file gives a warning and is rebuilt. A real
model plans under ``hardware: measured`` through the backend, with gradients
bitwise equal to eager under the eager compiler.
"""
from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

import hyper_ac
from conftest import get_captured
from hyper_ac import models
from hyper_ac.frontend import op_times
from hyper_ac.frontend.serialize import serialize_graph, to_json


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(op_times.CACHE_ENV, str(tmp_path))
    op_times.STATS.reset()
    return tmp_path / "op_times.json"


def _timed(doc: dict) -> dict:
    return {n["name"]: n["measured_seconds"] for n in doc["nodes"] if n.get("measured_seconds") is not None}


def test_cache_is_written_then_reused(cache):
    gm = get_captured("mlp").gm
    assert "measured_seconds" not in to_json(gm)  # not asked for: nothing measured
    assert op_times.STATS.measured == 0 and not cache.exists()
    first = _timed(serialize_graph(gm, measure=True))
    assert op_times.STATS.measured > 0
    assert cache.exists()
    stored = json.loads(cache.read_text())
    assert stored["format"] == "hyper_ac.op_times" and len(stored["times"]) == op_times.STATS.measured
    mms = [n.name for n in gm.graph.nodes if n.op == "call_function" and "mm" in str(n.target)]
    assert mms and all(name in first and first[name] > 0 for name in mms)
    # Views, getitems and the placeholders are not timed; the skipped ones are counted.
    assert op_times.STATS.skipped.get("view", 0) > 0
    before = cache.read_bytes()

    op_times.STATS.reset()
    second = _timed(serialize_graph(gm, measure=True))  # a fresh OpTimer: reads the file
    assert op_times.STATS.measured == 0, "the second serialisation measured again"
    assert op_times.STATS.cached == len(second) > 0
    assert second == first
    assert cache.read_bytes() == before  # nothing new: not rewritten


def test_measuring_leaves_the_global_rng_alone(cache):
    gm = get_captured("mlp").gm
    state = torch.get_rng_state()
    serialize_graph(gm, measure=True)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"format": "hyper_ac.op_times", "version": 1, "times": {"k": "fast"}}),
    json.dumps({"format": "something else", "version": 1, "times": {}}),
    json.dumps([1, 2]),
])
def test_a_corrupt_cache_warns_and_is_rebuilt(cache, content):
    cache.write_text(content)
    with pytest.warns(UserWarning, match="op time cache .* is corrupt"):
        timed = _timed(serialize_graph(get_captured("mlp").gm, measure=True))
    assert timed and op_times.STATS.measured > 0
    rebuilt = json.loads(cache.read_text())
    assert rebuilt["format"] == "hyper_ac.op_times" and len(rebuilt["times"]) == op_times.STATS.measured


def test_clear_cache(cache):
    serialize_graph(get_captured("mlp").gm, measure=True)
    assert cache.exists()
    op_times.clear_cache()
    assert not cache.exists()
    op_times.clear_cache()  # nothing to clear: no error


def test_plan_reads_the_config_and_prices_by_measured_times(cache):
    c = get_captured("transformer")
    result = hyper_ac.plan(c.gm, {"ac_mode": "auto", "ac_hardware": "measured"}, c.model)
    assert op_times.STATS.measured > 0  # the config asked for measurement: plan() measured
    stats = result.stats
    assert stats["step_seconds"] > 0 and stats["knee_points"] >= 1
    assert stats["recompute_seconds"] <= 0.02 * stats["step_seconds"] + 1e-15
    assert any("chose the knee" in d["message"] for d in result.diagnostics)
    op_times.STATS.reset()
    roofline = hyper_ac.plan(c.gm, {"ac_mode": "auto"}, c.model)
    assert op_times.STATS.measured == op_times.STATS.cached == 0  # roofline: nothing measured
    assert "step_seconds" not in roofline.stats


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_real_model_plans_under_measured_with_eager_exact_gradients(cache, name):
    model = models.build(name, 2)
    batch = models.example_batch(name)
    ref = copy.deepcopy(model)
    ref(**batch).loss.backward()
    want = _grads(ref)
    results: list = []
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            backend = hyper_ac.backend({"ac_mode": "auto", "ac_hardware": "measured"}, model=model,
                                       compiler="eager", on_result=results.append)
            torch.compile(model, backend=backend, fullgraph=True)(**batch).loss.backward()
    finally:
        torch._dynamo.reset()
    assert results and results[0].stats.get("step_seconds", 0) > 0
    assert op_times.STATS.measured > 0
    got = _grads(model)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
