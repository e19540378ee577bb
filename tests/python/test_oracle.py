"""Plans judged on what Inductor runs (hyper_ac.lower.oracle, PlanOptions::peak_oracle; docs/mincut.md,
"Measured peaks"): the dry run's figure equals the real step's measured peak; budget plans are checked
and continued on it; a plan measured above stock is left to stock; ``peak_oracle: off`` measures nothing."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import hyper_ac
from hyper_ac import memory, models

# The real step holds a few bytes the dry run does not (the loss's tangent, made by .backward()).
SLACK_BYTES = 64


def _model(layers=2, seq=128):
    """A Llama whose activations set the step's peak (at the default test size they do not)."""
    model = models.hf_model("llama", layers, hidden=128, heads=8, vocab=2048, max_seq=seq, attn_implementation="sdpa",
                            intermediate_size=344)
    return model, models.example_batch("llama", batch=1, seq=seq, vocab=2048)


def _step(config, dynamic=None, **shape):
    """(measured peak of the second step, outputs kept through its backward; the plans) of a fresh model
    compiled with Inductor (``dynamic`` as torch.compile takes it); config None: stock."""
    import torch._functorch.config as functorch_config

    torch._dynamo.reset()
    model, batch = _model(**shape)
    plans: list = []
    if config is None:
        run = torch.compile(model, dynamic=dynamic)
    else:
        run = torch.compile(model, dynamic=dynamic,
                            backend=hyper_ac.backend(config, model=model, compiler="inductor",
                                                     on_result=lambda r: plans.append(r.plan)))
    with functorch_config.patch(enable_autograd_cache=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(**batch).loss.backward()
        model.zero_grad(set_to_none=True)
        # The outputs kept through the backward, as a training loop keeps them (and the dry run).
        measured = memory.measure_step(lambda: run(**batch))
        model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    return measured.peak_bytes, plans


@pytest.fixture(scope="module")
def stock_peak():
    return _step(None)[0]


# Budget 0.3: at this size 0.5 of the all-saved activations is above stock's measured peak (the logits
# and their tangent weigh), so stock's partition meets it and the plan is left to stock.
@pytest.mark.parametrize("config", [{"ac_mode": "selective"}, {"ac_mode": "budget", "ac_memory_budget": 0.3}])
def test_dry_run_equals_the_real_step(config, stock_peak):
    peak, plans = _step(config)
    assert len(plans) == 1
    stats = plans[0]["stats"]
    assert stats["oracle_calls"] >= 2  # the plan and stock at least
    assert abs(stats["measured_peak_after"] - peak) <= SLACK_BYTES, (stats, peak)
    assert abs(stats["measured_stock_peak"] - stock_peak) <= SLACK_BYTES, (stats, stock_peak)
    # Above what stock's forward returns, so stock was measured; the bound is under its figure.
    assert stats["measured_peak_after"] > stats["measured_stock_lower_bound"] > 0
    assert stats["measured_stock_lower_bound"] <= stats["measured_stock_peak"]
    assert peak < stock_peak


def test_a_dynamic_shape_graph_is_measured_at_its_hint():
    """torch.compile(dynamic=True): the sizes are inputs of the graph (SymInt placeholders); the dry
    run runs them at their hints, the shape the graph was traced with, and measures the real step
    at that shape (before, such a graph was not measurable and kept the simulation)."""
    stock, _ = _step(None, dynamic=True)
    peak, plans = _step({"ac_mode": "selective"}, dynamic=True)
    assert len(plans) == 1
    graph = plans[0]
    stats = graph["stats"]
    assert stats["oracle_calls"] >= 2, stats
    assert abs(stats["measured_peak_after"] - peak) <= SLACK_BYTES, (stats, peak)
    assert abs(stats["measured_stock_peak"] - stock) <= SLACK_BYTES, (stats, stock)
    assert peak < stock


def test_a_plan_under_stocks_lower_bound_spares_the_stock_compile():
    """full measures under the bytes stock's forward returns (all alive when it ends): under
    stock's peak, so stock is not compiled for the guard. The bound is under stock's real peak.
    Four layers at seq 256, where the activations stock saves stack up past full's peak."""
    shape = {"layers": 4, "seq": 256}
    stock_peak, _ = _step(None, **shape)
    import torch._inductor.compile_fx as compile_fx_module

    from hyper_ac.lower.oracle import dry_running

    routes: list = []
    real = compile_fx_module.compile_fx_inner

    def spy(*args, **kwargs):
        routes.append(dry_running())
        return real(*args, **kwargs)

    compile_fx_module.compile_fx_inner = spy
    try:
        peak, plans = _step({"ac_mode": "full"}, **shape)
    finally:
        compile_fx_module.compile_fx_inner = real
    stats = plans[0]["stats"]
    assert stats["oracle_calls"] == 1 and stats["measured_stock_peak"] == -1, stats
    assert abs(stats["measured_peak_after"] - peak) <= SLACK_BYTES, (stats, peak)
    assert stats["measured_peak_after"] <= stats["measured_stock_lower_bound"] <= stock_peak, (stats, stock_peak)
    assert "stock" not in routes and routes.count("rewrite") == 2, routes  # the plan's forward and backward


def test_budget_floor_is_full_on_the_measured_peak(stock_peak):
    """An unreachable budget ends at the least measured plan of the frontier: no higher than full's."""
    full, _ = _step({"ac_mode": "full"})
    floor, plans = _step({"ac_mode": "budget", "ac_memory_budget": 0.01})
    stats = plans[0]["stats"]
    assert not stats["budget_met"]
    assert floor <= 1.01 * full, (floor, full, stats)
    assert floor < stock_peak


def test_peak_oracle_off_measures_nothing():
    _, plans = _step({"ac_mode": "selective", "ac_peak_oracle": "off"})
    assert "oracle_calls" not in plans[0]["stats"]


def test_a_plan_measured_above_stock_goes_to_stock(captured):
    """The core's guard, fed a figure: route stock, reason measured_above_stock, both figures named."""
    gm = captured("llama").gm
    seen: list = []

    def oracle(text: str) -> int:
        plan = json.loads(text)
        seen.append(plan["route"])
        return 1_000 if plan["route"] == "stock" else 2_000_000

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = hyper_ac.plan(gm, "full", peak_oracle=oracle)
        result.report()
    assert result.plan["route"] == "stock" and result.plan["route_reason"] == "measured_above_stock"
    assert result.plan["stats"]["measured_fallback"] is True
    assert sorted(seen) == ["rewrite", "stock"]
    assert any("above the stock partition's" in str(w.message) and "1000 B" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]


def test_oracle_errors_reach_the_caller(captured):
    """An oracle that raises is not swallowed by the core: the error reaches plan()'s caller."""
    def oracle(text: str) -> int:
        raise RuntimeError("oracle broke")

    with pytest.raises(RuntimeError, match="oracle broke"):
        hyper_ac.plan(captured("llama").gm, "full", peak_oracle=oracle)


def test_dry_runs_compile_as_the_real_step_does():
    """A candidate that rewrites is compiled under the backend's own Inductor settings (no buffer reuse,
    no horizontal fusion in a planned backward); one routed to stock as stock torch.compile compiles it."""
    import torch._inductor.compile_fx as compile_fx_module

    from hyper_ac.lower.oracle import dry_running

    seen: list = []
    real = compile_fx_module.compile_fx_inner

    def spy(*args, **kwargs):
        seen.append((dry_running(), bool(kwargs.get("is_backward")), torch._inductor.config.allow_buffer_reuse,
                     torch._inductor.config.cpp.max_horizontal_fusion_size))
        return real(*args, **kwargs)

    compile_fx_module.compile_fx_inner = spy
    try:
        _step({"ac_mode": "selective"})
    finally:
        compile_fx_module.compile_fx_inner = real
    stock_size = torch._inductor.config.cpp.max_horizontal_fusion_size
    measured = {(route, backward): (reuse, size) for route, backward, reuse, size in seen if route is not None}
    real_compiles = {(backward): (reuse, size) for route, backward, reuse, size in seen if route is None}
    assert measured == {("rewrite", False): (False, stock_size), ("rewrite", True): (False, 1),
                        ("stock", False): (True, stock_size), ("stock", True): (True, stock_size)}, seen
    assert real_compiles == {False: (False, stock_size), True: (False, 1)}, seen


def test_output_recompute_measures_no_higher_than_full(stock_peak):
    """output_recompute exists to lower the peak below full's; where the dry run says it does not,
    the core refuses it for the graph (with a warning) and plans full without it."""
    full, _ = _step({"ac_mode": "full"})
    with_it, plans = _step({"activation_checkpoint": {"mode": "full", "regions": {"output_recompute": True}}})
    stats = plans[0]["stats"]
    assert with_it <= full + SLACK_BYTES, (with_it, full, stats)
    assert with_it < stock_peak
    assert stats["measured_peak_after"] >= 0 and "output_recompute_refused" in stats


def test_the_real_compile_loads_the_kept_dry_run_from_the_cache():
    """Each dry run compiles as the real compile will (RealCompile): with an empty Inductor cache, every
    dry-run module is a miss and the real forward and backward both hit (the kept candidate's), and the
    modules loaded from the cache run real kernels: the step's loss and gradients are eager's."""
    import copy

    import torch._functorch.config as functorch_config
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    model, batch = _model()
    reference = copy.deepcopy(model)
    plans: list = []
    run = torch.compile(model, backend=hyper_ac.backend({"ac_mode": "full"}, model=model, compiler="inductor",
                                                        on_result=lambda r: plans.append(r.plan)))
    counters.clear()
    with fresh_cache(), functorch_config.patch(enable_autograd_cache=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = run(**batch).loss
        loss.backward()
    torch._dynamo.reset()
    dry_runs = plans[0]["stats"]["oracle_calls"]
    assert dry_runs >= 1
    assert counters["inductor"]["fxgraph_cache_hit"] == 2, dict(counters["inductor"])
    assert counters["inductor"]["fxgraph_cache_miss"] == 2 * dry_runs, dict(counters["inductor"])
    expected = reference(**batch).loss
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("compile_threads", [1, 2])
def test_the_kept_plans_kernels_are_built_behind_the_dry_runs(compile_threads):
    """With a compile thread to spare, each dry run's stubbed C++ kernels are built for real in the
    background (oracle._kernel_builder): the real compile of the kept plan then loads every kernel it
    asks for from Inductor's kernel cache. With one compile thread nothing is built behind: the real
    compile starts its kernels' builds itself."""
    import torch._functorch.config as functorch_config
    from torch._inductor.codecache import CppCodeCache
    from torch._inductor.utils import fresh_cache

    from hyper_ac.lower.oracle import dry_running

    loads: list = []
    real_load = CppCodeCache.load_async.__func__

    def spy(cls, *args, **kwargs):
        before = len(cls.cache)
        result = real_load(cls, *args, **kwargs)
        loads.append((dry_running(), len(cls.cache) - before))
        return result

    torch._dynamo.reset()
    model, batch = _model()
    run = torch.compile(model, backend=hyper_ac.backend({"ac_mode": "full"}, model=model, compiler="inductor"))
    CppCodeCache.load_async = classmethod(spy)
    try:
        with fresh_cache(), torch._inductor.config.patch(compile_threads=compile_threads), \
                functorch_config.patch(enable_autograd_cache=False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run(**batch).loss.backward()
    finally:
        CppCodeCache.load_async = classmethod(real_load)
        torch._dynamo.reset()
    built_behind = [new for route, new in loads if route is not None]
    real_builds = [new for route, new in loads if route is None]
    assert real_builds, loads
    if compile_threads > 1:
        assert sum(built_behind) > 0 and sum(real_builds) == 0, loads
    else:
        assert not built_behind and sum(real_builds) > 0, loads


def test_a_graph_compiled_again_is_planned_from_the_figures_measured_before():
    """Each dry-run figure is remembered for the process under the graph, the candidate's decisions
    and the Inductor settings (oracle.measurement_key): a second model of the same shape, compiled after
    torch._dynamo.reset(), gets the same plan and the same measured figures without a dry run. Other
    Inductor settings are another key: measured afresh."""
    import torch._inductor.compile_fx as compile_fx_module

    from hyper_ac.lower.oracle import dry_running

    routes: list = []
    real = compile_fx_module.compile_fx_inner

    def spy(*args, **kwargs):
        routes.append(dry_running())
        return real(*args, **kwargs)

    config = {"ac_mode": "budget", "ac_memory_budget": 0.5}
    compile_fx_module.compile_fx_inner = spy
    try:
        first_peak, first = _step(config)
        first_dry = sum(route is not None for route in routes)
        routes.clear()
        again_peak, again = _step(config)
        again_dry = sum(route is not None for route in routes)
        routes.clear()
        with torch._inductor.config.patch(max_fusion_size=32):
            _, other = _step(config)
        other_dry = sum(route is not None for route in routes)
    finally:
        compile_fx_module.compile_fx_inner = real
    assert first_dry >= 2 and again_dry == 0 and other_dry >= 2, (first_dry, again_dry, other_dry)
    assert again[0]["saved"] == first[0]["saved"] and again[0]["route"] == first[0]["route"]
    for key in ("measured_peak_after", "oracle_calls", "measured_stock_lower_bound", "recompute_seconds"):
        assert again[0]["stats"][key] == first[0]["stats"][key], key
    assert abs(again_peak - first_peak) <= SLACK_BYTES


def test_a_dynamic_size_is_keyed_and_run_at_its_hint_and_an_unbacked_one_is_not_measurable():
    """Two graphs alike but for a size's hint are two measurements; a size without a hint
    (data-dependent) cannot be run, so the graph keeps the simulation."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from hyper_ac.lower import oracle

    def size(hint):
        env = ShapeEnv()
        symbol = env.create_symbol(hint, source=ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC)
        return env.create_symintnode(symbol, hint=hint)

    assert oracle._value_key(size(128)) != oracle._value_key(size(64))
    assert oracle._zeros_like(size(128)) == 128
    graph = torch.fx.Graph()
    node = graph.placeholder("n")
    node.meta["val"] = ShapeEnv().create_unbacked_symint()
    graph.output(node)
    unbacked = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert oracle.why_not_measurable(unbacked) == "input 'n' is a size without a hint (data-dependent)"
    node.meta["val"] = size(32)
    assert oracle.why_not_measurable(unbacked) is None
