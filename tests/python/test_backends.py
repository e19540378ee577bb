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


def _inductor_step(model, batch, config):
    """One compiled step; returns (loss, grads, [(is_backward, allow_buffer_reuse, cpp horizontal fusion size)
    per compiled graph], peak). The compiles of the core's peak oracle (hyper_ac.lower.oracle's dry
    runs) are left out: test_oracle.py checks those."""
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
    try:
        compiled = torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler="inductor"),
                                 fullgraph=True)
        with memory.track() as tracked:
            loss = compiled(**batch)
            loss.backward()
    finally:
        compile_fx_module.compile_fx_inner = real
        torch._dynamo.reset()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, seen, tracked.peak_bytes


@pytest.fixture(scope="module")
def model_and_batch():
    return models.build("transformer", 2), models.example_batch("transformer", batch=2, seq=16)


@pytest.mark.parametrize("config, reuse", [
    ({"ac_mode": "off"}, True),  # off is stock: Inductor's own reuse
    ({"ac_mode": "auto"}, False),
    ({"ac_mode": "selective"}, False),
    ({"ac_mode": "selective", "ac_buffer_reuse": "inductor"}, True),
    ({"ac_mode": "off", "ac_buffer_reuse": "none"}, False),
])
def test_buffer_reuse_reaches_forward_and_backward(model_and_batch, config, reuse):
    model, batch = model_and_batch
    ref = copy.deepcopy(model)
    ref_loss = ref(**batch)
    ref_loss.backward()
    loss, grads, seen, _ = _inductor_step(copy.deepcopy(model), batch, config)
    assert sorted({backward for backward, _, _ in seen}) == [False, True], f"expected a forward and a backward: {seen}"
    assert all(allowed is reuse for _, allowed, _ in seen), seen
    # Horizontal fusion (core's inductor_backward_horizontal_fusion): stock's in mode off and in
    # every forward; none in a planned backward, where it would hoist one unit's replay into the
    # backward of the next (docs/floor.md).
    stock_size = torch._inductor.config.cpp.max_horizontal_fusion_size
    for backward, _, size in seen:
        planned_backward = backward and config["ac_mode"] != "off"
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
