"""Sharded constructs hyper_ac refuses by name (hyper_ac.frontend.sharding, docs/sharded.md):
context parallelism and async TP raise UnsupportedShardingError naming the construct and what
to do; mode off still compiles (stock's partition); a plain step is not refused."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import hyper_ac
from hyper_ac.frontend.sharding import UnsupportedShardingError, check_supported


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))


def _compile_step(config, compiler="eager"):
    torch._dynamo.reset()
    model = _mlp()
    compiled = torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler=compiler))
    compiled(torch.randn(4, 16, requires_grad=True)).sum().backward()
    return model


@pytest.fixture
def context_parallel_dispatcher():
    attention = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._attention")
    attention._enable_context_parallel_dispatcher()
    try:
        yield
    finally:
        attention._disable_context_parallel_dispatcher()


def test_context_parallel_dispatcher_is_refused(context_parallel_dispatcher):
    with pytest.raises(Exception, match="context parallelism is not supported yet") as info:
        _compile_step({"ac_mode": "full"})
    assert "ac_mode off" in str(info.value) and "docs/sharded.md" in str(info.value)


def test_context_parallel_mode_off_is_stock(context_parallel_dispatcher):
    model = _compile_step({"ac_mode": "off"})
    assert all(p.grad is not None for p in model.parameters())


def test_context_parallel_op_is_refused_by_node():
    pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._cp_custom_ops")
    graph = fx.Graph()
    x = graph.placeholder("x")
    gathered = graph.call_function(torch.ops.cplib.flex_cp_allgather.default, (x, x, 2, "0"))
    graph.output(gathered)
    with pytest.raises(UnsupportedShardingError, match=r"node 'flex_cp_allgather_default'.*context parallelism"):
        check_supported(graph, "eager")


def test_async_tp_is_refused_under_inductor_only():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(_micro_pipeline_tp=True):
        with pytest.raises(Exception, match=r"async tensor parallelism .*_micro_pipeline_tp=True.*Set it False"):
            _compile_step({"ac_mode": "full"}, compiler="inductor")
        # the FX runner runs no Inductor pass: nothing to refuse
        model = _compile_step({"ac_mode": "full"}, compiler="eager")
    assert all(p.grad is not None for p in model.parameters())


def test_plain_step_is_not_refused():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.relu.default, (x,)))
    check_supported(graph, "inductor")  # raises nothing
    model = _compile_step({"ac_mode": "full"})
    assert all(p.grad is not None for p in model.parameters())
