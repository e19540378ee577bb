"""hyper_ac.backend under Inductor: the ``buffer_reuse`` key reaches every graph it compiles.

Inductor compiles the backward lazily, at its first call, outside the
``compile_fx`` call the backend wraps; these tests watch ``compile_fx_inner``
itself, so a setting that only reached the forward would fail them.
"""
from __future__ import annotations

import copy

import pytest
import torch

import hyper_ac
from hyper_ac import memory, models


def _inductor_step(model, batch, config, warm=False):
    """One compiled step; returns (loss, grads, [(is_backward, allow_buffer_reuse, cpp horizontal fusion size)
    per compiled graph], peak, the core's routes). The compiles of the core's peak oracle
    (hyper_ac.lower.oracle's dry runs) are left out: test_oracle.py checks those. ``warm``: the
    peak is a second step's, without the first call's compile (whose dry runs allocate as a step does)."""
    import torch._inductor.compile_fx as compile_fx_module

    from hyper_ac.lower.oracle import dry_running

    seen: list = []
    real = compile_fx_module.compile_fx_inner

    def spy(*args, **kwargs):
        if dry_running() is None:
            seen.append((bool(kwargs.get("is_backward")), torch._inductor.config.allow_buffer_reuse,
                         torch._inductor.config.cpp.max_horizontal_fusion_size))
        return real(*args, **kwargs)

    torch._dynamo.reset()
    compile_fx_module.compile_fx_inner = spy
    results: list = []
    try:
        compiled = torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler="inductor",
                                                                 on_result=results.append), fullgraph=True)
        if warm:
            memory.loss_of(compiled(**batch)).backward()
            model.zero_grad(set_to_none=True)
        with memory.track() as tracked:
            loss = memory.loss_of(compiled(**batch))  # an HF model's output holds its loss
            loss.backward()
    finally:
        compile_fx_module.compile_fx_inner = real
        torch._dynamo.reset()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    routes = [result.plan["route"] for result in results] or ["stock"]  # mode off plans nothing: stock
    return loss.detach(), grads, seen, tracked.peak_bytes, routes


@pytest.fixture(scope="module")
def model_and_batch():
    return models.build("transformer", 2), models.example_batch("transformer", batch=2, seq=16)


# (config, sequence length, the route the core gives the tiny transformer's graph, Inductor's buffer
# reuse there). At sequence 16 full's plan measures above stock (route measured_above_stock); at 64
# every planning mode rewrites.
@pytest.mark.parametrize("config, seq, route, reuse", [
    ({"ac_mode": "off"}, 16, "stock", True),  # off is stock: Inductor's own reuse
    ({"ac_mode": "full"}, 16, "stock", True),  # left to stock: compiled as stock
    ({"ac_mode": "auto"}, 64, "rewrite", False),
    ({"ac_mode": "full"}, 64, "rewrite", False),
    ({"ac_mode": "selective"}, 64, "rewrite", False),
    ({"ac_mode": "selective", "ac_buffer_reuse": "inductor"}, 64, "rewrite", True),
    ({"ac_mode": "off", "ac_buffer_reuse": "none"}, 16, "stock", False),
])
def test_buffer_reuse_reaches_forward_and_backward(model_and_batch, config, seq, route, reuse):
    model, _ = model_and_batch
    batch = models.example_batch("transformer", batch=2, seq=seq)
    ref = copy.deepcopy(model)
    ref_loss = ref(**batch)
    ref_loss.backward()
    loss, grads, seen, _, routes = _inductor_step(copy.deepcopy(model), batch, config)
    assert routes == [route], routes
    assert sorted({backward for backward, _, _ in seen}) == [False, True], f"expected a forward and a backward: {seen}"
    assert all(allowed is reuse for _, allowed, _ in seen), seen
    # Horizontal fusion (core's inductor_backward_horizontal_fusion): stock's in mode off, in a
    # graph routed to stock and in every forward; none in a rewritten backward, where it would
    # hoist one unit's replay into the backward of the next (docs/floor.md).
    stock_size = torch._inductor.config.cpp.max_horizontal_fusion_size
    for backward, _, size in seen:
        planned_backward = backward and route == "rewrite"
        assert size == (1 if planned_backward else stock_size), seen
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6)


def test_no_reuse_never_raises_the_measured_peak(model_and_batch):
    # A reused buffer stays allocated from its last use to its new owner's birth;
    # without reuse it is freed at its last use, so the tracked peak cannot rise.
    model, batch = model_and_batch
    peaks = {reuse: _inductor_step(copy.deepcopy(model), batch, {"ac_mode": "auto", "ac_buffer_reuse": reuse})[3]
             for reuse in ("inductor", "none")}
    assert 0 < peaks["none"] <= peaks["inductor"], peaks


def test_buffer_reuse_with_the_eager_compiler_warns():
    with pytest.warns(UserWarning, match="buffer_reuse: none applies to compiler='inductor' only"):
        hyper_ac.backend({"ac_mode": "auto", "ac_buffer_reuse": "none"})


def test_write_decisions_tags_only_what_the_plan_decided():
    # The tag lowering (compiler="inductor"): a duplicated value is MUST_RECOMPUTE, a value the
    # plan keeps MUST_SAVE, and a saved value outside every recompute region (not kept: a
    # causal mask, rotary tables) is left untagged for PyTorch's min-cut. The kept set is the
    # core's (plan "kept"), not derived here.
    from torch.utils.checkpoint import CheckpointPolicy

    from hyper_ac import fx_meta
    from hyper_ac.lower.backends import write_decisions

    def step(x, w, m):
        return torch.mul(torch.relu(torch.mm(x, w)), torch.tril(m))

    joint = torch.fx.symbolic_trace(step)
    plan = {"form": "compact", "policies": {"MUST_SAVE": ["mm"], "PREFER_RECOMPUTE": ["relu"]},
            "saved": ["mm", "tril"], "kept": ["mm"],
            "duplicates": [{"before": "mul", "of": "relu", "private_get_attrs": []}]}
    write_decisions(joint, plan)
    tags = {node.name: fx_meta.policy(node) for node in joint.graph.nodes if node.op == "call_function"}
    assert tags == {"mm": CheckpointPolicy.MUST_SAVE, "relu": CheckpointPolicy.MUST_RECOMPUTE,
                    "tril": None, "mul": None}, tags


def _per_block_step(config):
    """One step of a 2-layer GPT-2 (hidden 128, seq 128: its blocks' stock partition recomputes
    enough to matter) with each block compiled on its own (torchtitan's recipe) under Inductor,
    stock's or hyper_ac's with ``config`` under ``ac_scope: unit_graph``; returns (loss, grads, peak,
    [plan results])."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = models.build("gpt2", 2, hidden=128, heads=4, max_seq=128)
    batch = models.example_batch("gpt2", batch=2, seq=128)
    results: list = []
    backend = "inductor" if config is None else hyper_ac.backend(
        hyper_ac.load_config(config).with_option("scope", "unit_graph"), compiler="inductor", on_result=results.append)
    for block in model.transformer.h:
        block.compile(backend=backend, fullgraph=True)
    try:
        memory.loss_of(model(**batch)).backward()  # compiles: the measured step is the second
        model.zero_grad(set_to_none=True)
        with memory.track() as tracked:
            loss = memory.loss_of(model(**batch))
            loss.backward()
    finally:
        torch._dynamo.reset()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, tracked.peak_bytes, results


@pytest.mark.skipif(not memory.is_available(), reason="hyper_ac._memory not built")
def test_no_per_block_budget_saves_more_than_stock():
    """Under ``unit_graph`` a block's plan that saves more than stock's partition is left to stock
    (keep_unit_under_stock): budget 0.9 keeps 0.9 of the all-saved block, more than stock Inductor's
    own partition saves (a GPT-2 block: about 60% of it), so each block goes to stock with a
    warning and the step measures at most stock's peak; budget 0.2 saves less than stock and is
    kept, below stock's peak."""
    loss, grads, stock_peak, _ = _per_block_step(None)
    for fraction, to_stock in ((0.9, True), (0.2, False)):
        got_loss, got_grads, peak, results = _per_block_step({"ac_mode": "budget", "ac_memory_budget": fraction})
        assert results, fraction
        for result in results:
            plan = result.plan
            assert plan["stats"]["scope"] == "unit_graph"
            if to_stock:
                assert (plan["route"], plan["route_reason"]) == ("stock", "stock_not_worse"), plan["stats"]
                assert plan["stats"]["stock_fallback"]
                assert any("stack up over the model's blocks" in d["message"] for d in plan["diagnostics"])
            else:
                assert plan["route"] == "rewrite" and not plan["stats"].get("stock_fallback"), plan["stats"]
        if to_stock:
            assert peak <= stock_peak, (fraction, peak, stock_peak)  # left to stock: compiled as stock
        else:
            assert peak < stock_peak, (fraction, peak, stock_peak)
        torch.testing.assert_close(got_loss, loss)
        for name, want in grads.items():
            torch.testing.assert_close(got_grads[name], want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


# transformers families hyper_ac.models does not build, as a user brings them: each its own
# attention, norm, MLP and position code, built from a small config (no weights downloaded).
_SEQ, _VOCAB = 64, 256
_FAMILIES = {
    "phi": ("PhiForCausalLM", "PhiConfig", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                                 resid_pdrop=0.0, embd_pdrop=0.0)),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(hidden_size=64, intermediate_size=128,
                                                             num_attention_heads=4)),
    "falcon": ("FalconForCausalLM", "FalconConfig", dict(hidden_size=64, num_attention_heads=4, hidden_dropout=0.0,
                                                         attention_dropout=0.0)),
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(hidden_size=64, n_head=4, hidden_dropout=0.0,
                                                      attention_dropout=0.0)),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=16)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=16)),
}


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_transformers_families_outside_the_model_zoo_train_as_stock_does(family):
    tf = pytest.importorskip("transformers")
    model_cls, config_cls, fields = _FAMILIES[family]
    config = getattr(tf, config_cls)(vocab_size=_VOCAB, num_hidden_layers=2, max_position_embeddings=2 * _SEQ,
                                     use_cache=False, **fields)
    torch.manual_seed(0)
    model = getattr(tf, model_cls)(config).train()
    ids = torch.randint(0, _VOCAB, (2, _SEQ), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids.clone()}
    # Gradients against the uncheckpointed eager step; the peak against stock torch.compile's. (On
    # Falcon, stock Inductor's own embedding gradient is 5e-4 off eager's; hyper_ac's full plan is not.)
    ref = copy.deepcopy(model)
    ref_loss = ref(**batch).loss
    ref_loss.backward()
    *_, stock_peak, _ = _inductor_step(copy.deepcopy(model), batch, {"ac_mode": "off"}, warm=True)
    loss, grads, _, peak, routes = _inductor_step(copy.deepcopy(model), batch, {"ac_mode": "full"}, warm=True)
    assert routes == ["rewrite"], f"{family}: full left the graph to stock ({routes})"
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    ref_grads = {name: p.grad for name, p in ref.named_parameters()}
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m: f"{family} {name}: {m}")
    # The guarantee (docs/mincut.md): no plan's step measures above stock's; replaying every block
    # lowers it on each of these families.
    assert 0 < peak < stock_peak, (family, peak, stock_peak)
