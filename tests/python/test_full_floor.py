"""The floor under Inductor (issue 24): hyper_ac ``full`` against torchtitan's composition.

torchtitan's "full" activation checkpointing is a per-layer ``checkpoint_wrapper``
(non-reentrant) with the whole model compiled by Inductor. hyper_ac ``full``
under ``hyper_ac.backend(compiler="inductor")`` should measure a step peak at or
below it. On GPT-2 it does; on Llama it does not yet: docs/floor.md has the
analysis (what each keeps at the forward's end, where the peak is, why), so
Llama's comparison is an expected failure (strict: the day it passes, the mark
must go). The gradients are allclose to stock Inductor's either way.

Sizes are small (2 layers, hidden 64, seq 64, batch 2); the time goes into
Inductor's six compiles (stock, wrapper, full, per model): about 5 CPU-minutes.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

import hyper_ac
from hyper_ac import memory, models

pytestmark = [pytest.mark.slow,  # six Inductor compiles: `make test-slow`
              pytest.mark.skipif(not memory.is_available(), reason="hyper_ac._memory not built")]

SIZES = dict(layers=2, hidden=64, heads=4, seq=64, batch=2)


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "layer"):
            return module
    raise AssertionError(f"{type(model).__name__}: no layer list")


def _step(name: str, system: str):
    """One compiled step after a warm-up: (measured peak bytes, loss, grads)."""
    import torch._dynamo
    import torch._functorch.config as functorch_config

    torch._dynamo.reset()
    model = models.build(name, SIZES["layers"], hidden=SIZES["hidden"], heads=SIZES["heads"],
                         max_seq=SIZES["seq"])
    batch = models.example_batch(name, batch=SIZES["batch"], seq=SIZES["seq"])
    if system == "wrapper":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        layers = _layers(model)
        for i in range(len(layers)):
            layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    if system == "full":
        step = torch.compile(model, backend=hyper_ac.backend({"ac_mode": "full"}, model=model, compiler="inductor"),
                             fullgraph=True)
    else:
        step = torch.compile(model, fullgraph=True)
    with warnings.catch_warnings(), functorch_config.patch(enable_autograd_cache=False):
        warnings.simplefilter("ignore")
        step(**batch).loss.backward()  # compiles both graphs
        model.zero_grad(set_to_none=True)
        gc.collect()
        measured = memory.measure_step(lambda: step(**batch))
    grads = [p.grad for p in model.parameters()]
    return measured.peak_bytes, grads


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def measured(request):
    name = request.param
    return name, {system: _step(name, system) for system in ("stock", "wrapper", "full")}


def test_full_gradients_match_stock_inductor(measured):
    _, steps = measured
    for got, want in zip(steps["full"][1], steps["stock"][1]):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# Llama: the open gap (docs/floor.md), strict so the mark goes the day it closes. GPT-2: already
# at or below the wrapper; kept so that it stays there.
FLOOR_GAP = pytest.mark.xfail(strict=True, reason="issue 24: full + Inductor keeps more than per-layer "
                                                  "checkpoint_wrapper + Inductor on Llama (docs/floor.md)")


def test_full_peak_at_or_below_per_layer_checkpoint_wrapper(measured, request):
    name, steps = measured
    if name == "llama":
        request.applymarker(FLOOR_GAP)
    full, wrapper, stock = steps["full"][0], steps["wrapper"][0], steps["stock"][0]
    print(f"{name}: stock {stock} B, wrapper {wrapper} B ({wrapper / stock:.3f}x), full {full} B ({full / stock:.3f}x)")
    assert full <= wrapper, (f"{name}: full {full} B ({full / stock:.3f}x stock) > per-layer checkpoint_wrapper "
                             f"{wrapper} B ({wrapper / stock:.3f}x stock)")
