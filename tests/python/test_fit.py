"""hyper_ac.fit: budget mode fitted to the measured peak of the compiled step (docs/config.md).

Small models (2 units, hidden 64, seq 32, batch 2). A reachable target is
built from a plan's own measured peak (+0.3%), so a point within 1% exists at
this granularity (a few dozen distinct plans); the fit must find one.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import hyper_ac  # noqa: E402
from hyper_ac import memory, models  # noqa: E402
from hyper_ac.planning.config import ConfigError  # noqa: E402

pytestmark = pytest.mark.skipif(not memory.is_available(), reason="hyper_ac._memory not built")

SEQ = 32


def _model(name):
    return models.build(name, 2, hidden=64, heads=2, max_seq=SEQ), models.example_batch(name, batch=2, seq=SEQ)


def _step(model, batch, config, compiler):
    """(measured peak, loss, grads) of one step after a warm-up, compiled under ``config``
    (None: stock torch.compile with that compiler's stock backend)."""
    import torch._dynamo

    torch._dynamo.reset()
    backend = ({"eager": "aot_eager", "inductor": "inductor"}[compiler] if config is None
               else hyper_ac.backend(config, model=model, compiler=compiler))
    fn = torch.compile(model, backend=backend, fullgraph=True)
    for _ in range(2):
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(0)
        measured = memory.measure_step(lambda: fn(**batch))
    return measured.peak_bytes, measured.loss, [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _check_grads(model, batch, config, compiler):
    _, loss, grads = _step(copy.deepcopy(model), batch, config, compiler)
    _, ref_loss, ref = _step(copy.deepcopy(model), batch, None, compiler)
    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert [g is None for g in grads] == [g is None for g in ref]
    for a, b in zip(grads, ref):
        assert a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_fit_meets_a_reachable_target_within_one_percent_eager(name):
    model, batch = _model(name)
    # A point the plans reach: a budget plan's own measured peak, plus 0.3%.
    reached, _, _ = _step(copy.deepcopy(model), batch, {"ac_mode": "budget", "ac_memory_budget": 0.7}, "eager")
    target = int(reached * 1.003)
    sentinel = [torch.full_like(p, 7.0) for p in model.parameters()]
    for p, g in zip(model.parameters(), sentinel):
        p.grad = g
    result = hyper_ac.fit(model, batch, target, compiler="eager")
    assert all(p.grad is g for p, g in zip(model.parameters(), sentinel))  # .grad left as found
    assert result.met and result.target == target
    assert 0.99 * target <= result.measured_peak <= target, result.summary()
    assert result.config.mode == "budget"
    assert result.measured_peak in [s.measured_peak for s in result.iterations]
    # The chosen config, compiled afresh, measures what fit measured, with the stock gradients.
    again, _, _ = _step(copy.deepcopy(model), batch, result.config, "eager")
    assert again == result.measured_peak
    _check_grads(model, batch, result.config, "eager")


def test_fit_below_the_floor_gives_the_least_measured_peak():
    model, batch = _model("bert")
    with pytest.warns(UserWarning, match=r"below the least measured peak"):
        result = hyper_ac.fit(model, batch, "100KiB", compiler="eager")
    assert not result.met
    assert result.target == 100 * 1024
    peaks = [s.measured_peak for s in result.iterations]
    assert result.measured_peak == min(peaks)
    assert any(s.budget_bytes is None and s.config.mode == "full" for s in result.iterations)  # full was tried
    assert result.measured_peak > result.target


@pytest.mark.slow
def test_fit_inductor_meets_target_with_stock_gradients():
    model, batch = _model("bert")
    stock, _, _ = _step(copy.deepcopy(model), batch, None, "inductor")
    target = int(0.85 * stock)
    result = hyper_ac.fit(model, batch, target, compiler="inductor")
    assert result.met, result.summary()
    # Measured on this CPU: 0.9982x after 3 tries (the simulator's gap under Inductor is corrected).
    assert 0.99 * target <= result.measured_peak <= target, result.summary()
    assert result.config.compiler == "inductor"
    _check_grads(model, batch, result.config, "inductor")


@pytest.mark.parametrize("target, error, match", [
    ("six gigs", ConfigError, "cannot read 'six gigs' as a byte size"),
    (0, ConfigError, "positive"),
    (-5, ConfigError, "positive"),
    (0.5, ConfigError, "not a byte size"),
    (True, TypeError, "byte count or a size string"),
    ([1], TypeError, "byte count or a size string"),
])
def test_fit_rejects_bad_targets(target, error, match):
    model, batch = _model("llama")
    with pytest.raises(error, match=match):
        hyper_ac.fit(model, batch, target, compiler="eager")


def test_fit_rejects_bad_arguments():
    model, batch = _model("llama")
    with pytest.raises(ConfigError, match="compiler"):
        hyper_ac.fit(model, batch, "1MiB", compiler="tpu")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        hyper_ac.fit(lambda **kw: None, batch, "1MiB")
    with pytest.raises(ValueError, match="max_iterations"):
        hyper_ac.fit(model, batch, "1MiB", max_iterations=0)
    with pytest.raises(ValueError, match="tolerance"):
        hyper_ac.fit(model, batch, "1MiB", tolerance=1.5)
    with pytest.raises(ConfigError, match="scope 'unit_graph' scores the bytes each compiled block saves"):
        hyper_ac.fit(model, batch, "1MiB", config={"ac_mode": "full", "ac_scope": "unit_graph"})
