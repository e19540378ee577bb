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
    """One compiled step; returns (loss, grads, [(is_backward, allow_buffer_reuse) per compiled graph], peak)."""
    import torch._inductor.compile_fx as compile_fx_module

    seen: list = []
    real = compile_fx_module.compile_fx_inner

    def spy(*args, **kwargs):
        seen.append((bool(kwargs.get("is_backward")), torch._inductor.config.allow_buffer_reuse))
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
    assert sorted({backward for backward, _ in seen}) == [False, True], f"expected a forward and a backward: {seen}"
    assert all(allowed is reuse for _, allowed in seen), seen
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
