"""hyper_ac._fx.emit_node against torch's Graph.node_copy: the same graph, node for node."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from hyper_ac import models
from hyper_ac._fx import emit_node
from hyper_ac.frontend.capture import capture_joint


@pytest.fixture(scope="module")
def joint() -> fx.GraphModule:
    model = models.build("transformer")
    return capture_joint(model, **models.example_batch("transformer")).graph_module


def _described(graph: fx.Graph) -> list:
    return [(n.name, n.op, n.target, repr(n.args), repr(n.kwargs), n.type, sorted(n.meta), sorted(u.name for u in n.users))
            for n in graph.nodes]


def _copy_all(joint: fx.GraphModule, fast: bool) -> fx.Graph:
    graph = fx.Graph()
    env: dict = {}
    get = env.__getitem__
    for node in joint.graph.nodes:
        if fast:
            env[node] = emit_node(graph, node, fx.node.map_arg(node.args, get), fx.node.map_arg(node.kwargs, get))
        else:
            env[node] = graph.node_copy(node, get)
    return graph


def test_emit_node_builds_what_node_copy_builds(joint):
    fast, ref = _copy_all(joint, True), _copy_all(joint, False)
    assert _described(fast) == _described(ref)
    assert len(fast.nodes) == len(ref.nodes) == len(joint.graph.nodes)
    for node in fast.nodes:  # the lookup table knows every node
        found = fast.find_nodes(op=node.op, target=node.target if node.op == "call_function" else None)
        assert node in found
    for a, b in zip(fast.nodes, ref.nodes):
        assert a.meta == b.meta and a.meta is not b.meta
    fast.lint()
    assert fx.GraphModule(joint, fast).code == fx.GraphModule(joint, ref).code


def test_emit_node_before_a_node_and_a_taken_name():
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.relu, (x,))
    graph.output(y)
    copy = emit_node(graph, y, (x,), {}, before=y, meta={"k": 1})
    assert [n.name for n in graph.nodes] == ["x", "relu_1", "relu", "output"]  # a fresh name, before y
    assert copy.meta == {"k": 1} and copy in graph.find_nodes(op="call_function", target=torch.relu)
    assert len(graph.nodes) == 4
    graph.lint()


def test_emit_node_runs_the_create_node_hooks():
    gm = fx.symbolic_trace(torch.nn.ReLU())
    seen: list = []

    def hook(node):
        seen.append(node.name)
        node.meta["by_hook"] = True

    gm._register_create_node_hook(hook)
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    copy = emit_node(gm.graph, relu, relu.args, {}, before=relu)
    assert seen == [copy.name]
    assert "by_hook" not in copy.meta  # as node_copy: the copied meta replaces what a hook wrote
