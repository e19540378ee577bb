"""Set-ups a training script uses, compiled with hyper_ac (issue 25).

Each runs one step compiled with ``hyper_ac.backend`` (eager compiler) in a
mode that recomputes, and compares the loss and every gradient with the same
step compiled with stock ``aot_eager`` (``dynamic=True``: the uncompiled step),
bit for bit: ``dynamic=True`` over two
sequence lengths, bf16 autocast, per-block compile (torchtitan's recipe), a
graph break in every block, and compiled autograd.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
from torch import nn

import hyper_ac
from hyper_ac import models


def _model():
    torch.manual_seed(0)
    return models.TinyTransformer(num_layers=2)


def _tokens(seq: int):
    return torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(seq))


def _step(model, run, tokens, context=None):
    model.zero_grad(set_to_none=True)
    with context or contextlib.nullcontext():
        loss = run(tokens, tokens)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _assert_same(got, want, what):
    assert torch.equal(got[0], want[0]), f"{what}: the loss differs from stock"
    for g, w in zip(got[1], want[1]):
        assert torch.equal(g, w), f"{what}: a gradient differs from stock"


def _backend(model, results, mode="full"):
    return hyper_ac.backend({"ac_mode": mode}, model=model, on_result=results.append)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # recompute-cost notes on a tiny model
        yield
    torch._dynamo.reset()


def test_dynamic_shapes_over_two_sequence_lengths():
    # Against the uncompiled step (aot_eager's gradients are eager's; a second
    # dynamic compile for stock would double the test's time).
    model = _model()
    results: list = []
    ours_model = copy.deepcopy(model)
    ours = torch.compile(ours_model, backend=_backend(ours_model, results), dynamic=True)
    for seq in (16, 24):
        _assert_same(_step(ours_model, ours, _tokens(seq)), _step(model, model, _tokens(seq)), f"seq {seq}")
    assert len(results) == 1, "one dynamic graph serves both lengths"
    assert results[0].plan.get("duplicates")


def test_bf16_autocast():
    model = _model()
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    results: list = []
    stock_model, ours_model = copy.deepcopy(model), copy.deepcopy(model)
    want = _step(stock_model, torch.compile(stock_model, backend="aot_eager"), _tokens(16), autocast())
    got = _step(ours_model, torch.compile(ours_model, backend=_backend(ours_model, results)), _tokens(16),
                autocast())
    _assert_same(got, want, "bf16 autocast")
    assert results[0].plan.get("duplicates")


def test_per_block_compile():
    # torchtitan compiles each block on its own: every block's graph is planned
    # (a whole-graph region: the block is its only unit).
    model = _model()
    stock_model, ours_model = copy.deepcopy(model), copy.deepcopy(model)
    results: list = []
    for layer in stock_model.layers:
        layer.compile(backend="aot_eager")
    for layer in ours_model.layers:
        layer.compile(backend=_backend(layer, results, mode="auto"))
    want = _step(stock_model, stock_model, _tokens(16))
    got = _step(ours_model, ours_model, _tokens(16))
    _assert_same(got, want, "per-block compile")
    assert results


def test_graph_break_in_every_block():
    class Breaking(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            torch._dynamo.graph_break()
            return self.block(x)

    model = _model()
    model.layers = nn.ModuleList(Breaking(layer) for layer in model.layers)
    stock_model, ours_model = copy.deepcopy(model), copy.deepcopy(model)
    results: list = []
    want = _step(stock_model, torch.compile(stock_model, backend="aot_eager"), _tokens(16))
    got = _step(ours_model, torch.compile(ours_model, backend=_backend(ours_model, results, mode="auto")),
                _tokens(16))
    _assert_same(got, want, "graph breaks")
    assert results


def test_compiled_autograd():
    model = _model()
    stock_model, ours_model = copy.deepcopy(model), copy.deepcopy(model)
    results: list = []
    import torch._dynamo.compiled_autograd as compiled_autograd

    def run(m, backend):
        compiled = torch.compile(m, backend=backend)
        with compiled_autograd._enable(torch.compile(backend="aot_eager")):
            return _step(m, compiled, _tokens(16))

    want = run(stock_model, "aot_eager")
    torch._dynamo.reset()
    got = run(ours_model, _backend(ours_model, results))
    _assert_same(got, want, "compiled autograd")
    assert results[0].plan.get("duplicates")
