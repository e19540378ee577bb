"""The CUDA paths (issue 38): measurement, fit, random-op replay, measured op times, the Triton-compiled step.

Marked ``cuda``: ``pytest -m cuda`` runs them (``scripts/gpu_check`` does, on a
machine with a GPU). Without a CUDA device each one skips, saying so; the CPU
logic they rest on (the CUDA counter's scopes, the device checks) is tested
on every machine in ``test_memory.py``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import hyper_ac
from hyper_ac import memory, models

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no CUDA device on this machine (torch.cuda.is_available() is False): "
                              "the CUDA paths run under scripts/gpu_check on a GPU"),
]

DEVICE = "cuda"


def _llama(dropout: float = 0.0, layers: int = 2):
    model = models.build("llama", layers, hidden=128, heads=4, max_seq=128, dropout=dropout).to(DEVICE)
    batch = {k: v.to(DEVICE) for k, v in models.example_batch("llama", batch=4, seq=128).items()}
    return model, batch


def _step_grads(model, batch):
    loss = memory.loss_of(model(**batch))
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def test_measure_step_reads_the_caching_allocator():
    model, batch = _llama()
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    step = memory.measure_step(lambda: model(**batch))
    assert step.device.startswith("cuda")
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    assert step.peak_bytes > grads  # the gradients and the activations, at least
    assert step.reserved_peak_bytes is not None and step.reserved_peak_bytes >= step.peak_bytes
    with memory.track(DEVICE) as t:  # a plain allocation, counted exactly
        x = torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)
        del x
    assert t.peak_bytes >= 1 << 20 and t.current_bytes == 0


@pytest.mark.parametrize("mode", ["full", "selective", "budget"])
def test_inductor_step_matches_stock_and_stays_at_or_below_its_peak(mode):
    model, batch = _llama()
    stock_model, ours = copy.deepcopy(model), copy.deepcopy(model)
    stock = torch.compile(stock_model, fullgraph=True)
    cfg = {"ac_mode": mode, "ac_memory_budget": 0.5} if mode == "budget" else {"ac_mode": mode}
    planned = torch.compile(ours, fullgraph=True, backend=hyper_ac.backend(cfg, model=ours, compiler="inductor"))
    peaks = []
    for compiled, module in ((stock, stock_model), (planned, ours)):
        _step_grads(compiled, batch)  # compile and warm up
        for p in module.parameters():
            p.grad = None
        peaks.append(memory.measure_step(lambda: compiled(**batch)).peak_bytes)
    for a, b in zip(stock_model.parameters(), ours.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    assert peaks[1] <= peaks[0], f"{mode}: {peaks[1]} B above stock's {peaks[0]} B"


def test_fit_meets_a_cuda_target():
    model, batch = _llama(layers=4)
    for p in model.parameters():
        p.grad = None
    stock = memory.measure_step(lambda: model(**batch)).peak_bytes
    target = int(0.7 * stock)
    result = hyper_ac.fit(model, batch, target, compiler="inductor")
    assert result.measured_peak <= target, result.summary()


@pytest.mark.parametrize("mode", ["full", "selective", "auto"])
def test_dropout_replayed_bitwise_on_cuda(mode):
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        model, batch = _llama(dropout=0.2)
        reference, ours = copy.deepcopy(model), copy.deepcopy(model)
        torch.manual_seed(7)
        loss_ref, grads_ref = _step_grads(reference, batch)
        compiled = torch.compile(ours, fullgraph=True,
                                 backend=hyper_ac.backend({"ac_mode": mode}, model=ours, compiler="eager"))
        torch.manual_seed(7)
        loss, grads = _step_grads(compiled, batch)
        assert torch.equal(loss, loss_ref)
        for a, b in zip(grads_ref, grads):
            assert torch.equal(a, b)
    finally:
        torch.use_deterministic_algorithms(False)


def test_measured_op_times_on_cuda(tmp_path, monkeypatch):
    from hyper_ac.frontend import op_times
    from hyper_ac.frontend.capture import capture_joint

    monkeypatch.setenv(op_times.CACHE_ENV, str(tmp_path))
    model, batch = _llama()
    graph = json.loads(capture_joint(model, **batch).to_json(measure=True))
    timed = [n for n in graph["nodes"] if "measured_seconds" in n]
    assert timed and all(n["measured_seconds"] > 0 for n in timed)
    keys = json.loads(op_times.cache_path().read_text())["times"]
    assert all(torch.cuda.get_device_name() in key for key in keys)  # the cache is keyed by the device's name
