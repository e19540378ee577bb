"""hyper_ac.frontend.serialize: the graph JSON is docs/graph-format.md v1 and every fact is right."""

from __future__ import annotations

import json
import math
import operator
import re

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

import hyper_ac
from hyper_ac import _core, models
from hyper_ac.frontend import capture
from hyper_ac.frontend import op_facts
from hyper_ac.frontend import serialize
from hyper_ac.frontend.serialize import discover_units, serialize_graph, to_json

# --------------------------------------------------------------------------
# a schema checker written from docs/graph-format.md
# --------------------------------------------------------------------------

NODE_FIELDS = {
    # field: (required, type check)
    "id": (True, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "name": (True, lambda v: isinstance(v, str) and v != ""),
    "kind": (True, lambda v: v in ("placeholder", "call_function", "get_attr", "output")),
    "target": (True, lambda v: isinstance(v, str)),
    "inputs": (True, lambda v: isinstance(v, list) and all(isinstance(i, int) for i in v)),
    "phase": (True, lambda v: v in ("forward", "backward")),
    "outputs": (False, lambda v: isinstance(v, list)),
    "flops": (False, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0),
    "module_stack": (False, lambda v: isinstance(v, list)),
    "rng": (False, lambda v: isinstance(v, bool)),
    "rng_state_bytes": (False, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "symint": (False, lambda v: isinstance(v, bool)),
    "collective": (False, lambda v: isinstance(v, bool)),
    "view": (False, lambda v: isinstance(v, bool)),
    "fusible": (False, lambda v: v is True),  # written only when true
    "copy": (False, lambda v: v is True),  # written only when true
    "mutated_inputs": (False, lambda v: isinstance(v, list)),
    "aliased_inputs": (False, lambda v: isinstance(v, list)),
    "role": (False, lambda v: v in ("activation", "parameter", "buffer", "input", "tangent")),
    "subgraph": (False, lambda v: isinstance(v, bool)),
    "mutated": (False, lambda v: isinstance(v, bool)),
    "policy": (False, lambda v: v is None or v in ("MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE")),
    "recomputed_from": (False, lambda v: v is None or isinstance(v, str)),
    "ac_graph_id": (False, lambda v: v is None or (isinstance(v, int) and v >= 0)),
    "autograd_node": (False, lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)),
}


def check_doc(doc: dict) -> None:
    """Raise AssertionError on anything docs/graph-format.md v1 forbids."""
    assert doc["format"] == "hyper_ac.graph" and doc["version"] == 1
    assert set(doc) <= {"format", "version", "model", "nodes"}
    seen_ids: dict[int, int] = {}
    names = set()
    for i, node in enumerate(doc["nodes"]):
        where = f"node {i} ({node.get('name')})"
        assert set(node) <= set(NODE_FIELDS), f"{where}: unknown fields {set(node) - set(NODE_FIELDS)}"
        for field, (required, ok) in NODE_FIELDS.items():
            if field in node:
                assert ok(node[field]), f"{where}: bad {field}={node[field]!r}"
            else:
                assert not required, f"{where}: missing {field}"
        assert node["id"] not in seen_ids, f"{where}: duplicate id"
        assert node["name"] not in names, f"{where}: duplicate name"
        for inp in node["inputs"]:
            assert inp in seen_ids, f"{where}: input {inp} is not an earlier node"
        assert len(set(node["inputs"])) == len(node["inputs"]), f"{where}: repeated input"
        n_in = len(node["inputs"])
        for field in ("mutated_inputs", "aliased_inputs"):
            for p in node.get(field, []):
                assert isinstance(p, int) and 0 <= p < n_in, f"{where}: {field} position {p} out of range"
        for fact in node.get("outputs", []):
            assert set(fact) == {"bytes", "dtype", "shape"}
            assert all(isinstance(s, int) and s >= 0 for s in fact["shape"])
            itemsize = torch.empty((), dtype=getattr(torch, fact["dtype"])).element_size()
            assert fact["bytes"] == math.prod(fact["shape"]) * itemsize, where
        if node.get("rng_state_bytes"):
            assert node.get("rng") is True, f"{where}: rng_state_bytes on a node that is not rng"
        for frame in node.get("module_stack", []):
            assert set(frame) == {"fqn", "type"} and frame["fqn"] and frame["type"], where
        if node["kind"] == "placeholder":
            assert node["inputs"] == [] and node.get("role", "activation") != "activation", where
        else:
            assert node.get("role", "activation") == "activation", where
        if node["kind"] == "output":
            assert node["target"] == ""
        seen_ids[node["id"]] = i
        names.add(node["name"])
    if "model" in doc:
        model = doc["model"]
        assert isinstance(model["type"], str)
        assert set(model) <= {"type", "marked", "modules"} and model.get("marked", True) is True
        listed = set()
        for frame in model["modules"]:
            assert {"fqn", "type"} <= set(frame) <= {"fqn", "type", "container", "marked", "same_as"} and frame["fqn"]
            assert all(frame[flag] is True for flag in ("container", "marked") if flag in frame)  # compact: only true
            assert "same_as" not in frame or frame["same_as"] in listed
            listed.add(frame["fqn"])


def by_name(doc: dict) -> dict[str, dict]:
    return {n["name"]: n for n in doc["nodes"]}


# --------------------------------------------------------------------------
# captured models
# --------------------------------------------------------------------------


def test_captured_graphs_follow_the_format(any_model):
    doc = any_model.doc
    check_doc(doc)
    gm = any_model.gm
    nodes = list(gm.graph.nodes)
    assert [n["name"] for n in doc["nodes"]] == [n.name for n in nodes]
    ids = {n["name"]: n["id"] for n in doc["nodes"]}
    for fx_node, node in zip(nodes, doc["nodes"]):
        assert node["inputs"] == [ids[i.name] for i in fx_node.all_input_nodes]
        assert node["phase"] == ("backward" if fx_node.meta["autograd_backward"] else "forward")
        assert [(f["fqn"], f["type"]) for f in node["module_stack"]] == list(fx_node.meta["ac_module_stack"])
    # forward first, then backward; both present
    phases = [n["phase"] for n in doc["nodes"] if n["kind"] == "call_function"]
    assert "forward" in phases and "backward" in phases
    # json round trip is lossless and deterministic
    text = any_model.json()
    assert json.loads(text) == doc
    assert to_json(gm, any_model.model, full=True) == text
    # the compact wire form loads to the same graph in the core
    from hyper_ac import _core

    wire = to_json(gm, any_model.model)
    assert len(wire) < len(text)
    # built in one pass, it is compact() of the full document byte for byte
    assert wire == json.dumps(serialize.compact(doc), separators=(",", ":"))
    assert _core.roundtrip(wire) == _core.roundtrip(text)


def test_backward_ops_name_their_autograd_node(any_model):
    # The eager autograd node (seq_nr) of each backward op: what the core's eager-lifetime simulation groups by.
    # seq_nr is a process-wide counter: the document numbers them 0, 1, ... by first appearance.
    numbering: dict[int, int] = {}
    for fx_node, node in zip(any_model.gm.graph.nodes, any_model.doc["nodes"]):
        seq_nr = fx_node.meta.get("seq_nr")
        if node["phase"] == "backward" and node["kind"] == "call_function" and isinstance(seq_nr, int):
            assert node.get("autograd_node") == numbering.setdefault(seq_nr, len(numbering)), node["name"]
        else:
            assert node.get("autograd_node") is None, node["name"]
    assert len(numbering) > 1
    stats = hyper_ac.plan(any_model.json(), {"ac_mode": "full", "ac_peak_oracle": "off"}, any_model.model).stats
    # holding inputs to the end of their autograd node never frees anything earlier
    assert stats["simulated_activation_peak_autograd"] >= stats["simulated_activation_peak_before"]


def test_roles_and_model_section(any_model):
    doc = any_model.doc
    model = any_model.model
    roles = {n["name"]: n["role"] for n in doc["nodes"] if n["kind"] == "placeholder"}
    assert roles == any_model.captured.roles
    # the parameters in the graph are exactly those an eager backward reaches
    out = model(**any_model.batch)
    (out if isinstance(out, torch.Tensor) else out.loss).backward()
    try:
        with_grad = {id(p) for p in model.parameters() if p.grad is not None}
    finally:
        model.zero_grad(set_to_none=True)
    in_graph = [n for n in any_model.gm.graph.nodes if n.meta.get("ac_role") == "parameter"]
    assert len(in_graph) == sum(1 for n in doc["nodes"] if n["role"] == "parameter")
    assert {id(model.get_parameter(n.meta["ac_source"])) for n in in_graph} == with_grad
    assert len(in_graph) == len(with_grad)
    assert sum(1 for r in roles.values() if r == "tangent") == 1
    section = doc["model"]
    assert section["type"] == type(model).__name__
    assert [m["fqn"] for m in section["modules"]] == [f for f, _ in model.named_modules(remove_duplicate=False) if f]
    assert [m["fqn"] for m in section["modules"] if "same_as" not in m] == [f for f, _ in model.named_modules() if f]
    assert section.get("marked", False) == hasattr(model, "gradient_checkpointing")
    # with the marker, the core's units for the whole graph are the ones its marker rule finds in these facts
    from_facts = [f for f, _ in discover_units(model)]
    if from_facts:
        assert _core.discover_units(json.dumps(doc)) == from_facts


def test_flops_of_matmuls_are_2mnk(captured):
    doc = captured("mlp").doc
    gm = captured("mlp").gm
    total = 0
    for fx_node, node in zip(gm.graph.nodes, doc["nodes"]):
        if fx_node.target == torch.ops.aten.mm.default:
            (m, k), (k2, n) = (a.meta["val"].shape for a in fx_node.args)
            assert k == k2 and node["flops"] == 2 * m * n * k
            total += 1
        elif fx_node.target == torch.ops.aten.addmm.default:
            (m, k), (_, n) = fx_node.args[1].meta["val"].shape, fx_node.args[2].meta["val"].shape
            assert node["flops"] == 2 * m * n * k
            total += 1
        elif fx_node.op == "call_function" and fx_node.target not in (torch.ops.aten.bmm.default,):
            assert node["flops"] == 0, node["target"]
    assert total == 3 + 5  # 3 forward addmm; 5 backward mm (weight grads ×3, input grads ×2)
    # batch of 2, 32 → 64 → 64 → 32: forward flops of the three linears
    fwd = sum(n["flops"] for n in doc["nodes"] if n["phase"] == "forward")
    assert fwd == 2 * 2 * (32 * 64 + 64 * 64 + 64 * 32)


def test_grouped_matmul_flops_count_every_row_once(captured):
    """torch._grouped_mm and transformers' CPU fallback of it carry no torch FLOP
    formula; without ours auto would price an expert matmul replay by bytes only."""
    def experts(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs)

    x, w = torch.randn(6, 16, dtype=torch.bfloat16), torch.randn(3, 16, 8, dtype=torch.bfloat16)
    offs = torch.tensor([2, 4, 6], dtype=torch.int32)
    doc = serialize_graph(make_fx(experts)(x, w, offs))
    (node,) = [n for n in doc["nodes"] if n["target"].startswith("aten::_grouped_mm")]
    assert node["flops"] == 2 * 6 * 16 * 8  # 6 rows, each (1, 16) @ (16, 8)
    cap = captured("mixtral")
    nodes = cap.doc["nodes"]
    fallback = [n for n in nodes if n["target"] == "transformers::grouped_mm_fallback.default"]
    assert fallback
    for node in fallback:
        rows = math.prod(nodes[node["inputs"][0]]["outputs"][0]["shape"])
        assert node["flops"] == 2 * rows * node["outputs"][0]["shape"][-1] > 0


def test_attention_and_lm_graph_facts(captured):
    doc = captured("llama").doc
    targets = {n["target"] for n in doc["nodes"]}
    assert {"aten::mm.default", "aten::bmm.default", "operator.getitem", "aten::view.default"} <= targets
    for n in doc["nodes"]:
        if n["target"] in ("aten::view.default", "aten::t.default", "aten::transpose.int", "aten::expand.default"):
            assert n["view"] and n["aliased_inputs"] == [0] and n["mutated_inputs"] == []
        if n["target"] == "operator.getitem":
            assert n["aliased_inputs"] == [0] and not n["view"]
        if n["target"] == "aten::mm.default":
            assert n["flops"] > 0 and not n["view"]
    # functionalised joint graph: nothing mutates, nothing is random here
    assert not any(n["mutated_inputs"] for n in doc["nodes"])
    assert not any(n["rng"] for n in doc["nodes"])


def test_dropout_is_rng():
    model = models.build("transformer", dropout=0.1)
    cg = capture.capture_joint(model, **models.example_batch("transformer"))
    doc = serialize_graph(cg.graph_module, model)
    check_doc(doc)
    drop = [n for n in doc["nodes"] if n["target"] == "aten::native_dropout.default"]
    assert drop and all(n["rng"] and n["phase"] == "forward" for n in drop)
    assert all(len(n["outputs"]) == 2 for n in drop)  # output and mask
    assert drop[0]["outputs"][1]["dtype"] == "bool"
    back = [n for n in doc["nodes"] if n["target"] == "aten::native_dropout_backward.default"]
    assert back and not any(n["rng"] for n in back)
    rng_targets = {n["target"] for n in doc["nodes"] if n["rng"]}
    assert rng_targets == {"aten::native_dropout.default"}


def test_attention_without_dropout_draws_nothing():
    # The CPU flash kernel's schema is nondeterministic_seeded (its dropout_p), but at dropout_p 0 it
    # draws nothing and leaves the generator alone: replaying it needs no saved state.
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    q = torch.randn(1, 2, 8, 4)
    before = torch.get_rng_state()
    op(q, q, q, 0.0)
    assert torch.equal(before, torch.get_rng_state())
    g = fx.Graph()
    x = g.placeholder("x")
    defaulted, zero = g.call_function(op, (x, x, x)), g.call_function(op, (x, x, x, 0.0))
    dropping = g.call_function(op, (x, x, x), {"dropout_p": 0.1})
    dropout = g.call_function(torch.ops.aten.native_dropout.default, (x, 0.0, True))  # no dropout_p: stays random
    facts = op_facts.op_facts(op)
    assert facts.rng
    assert not op_facts.draws_random(defaulted, facts) and not op_facts.draws_random(zero, facts)
    assert op_facts.draws_random(dropping, facts)
    assert op_facts.draws_random(dropout, op_facts.op_facts(torch.ops.aten.native_dropout.default))
    # ... and in a captured graph: TinyTransformer (SDPA) at dropout 0 runs that kernel, not marked rng
    model = models.build("transformer", use_sdpa=True)
    doc = serialize_graph(capture.capture_joint(model, **models.example_batch("transformer")).graph_module, model)
    flash = [n for n in doc["nodes"] if n["target"] == "aten::_scaled_dot_product_flash_attention_for_cpu.default"]
    assert flash and not any(n["rng"] or "rng_state_bytes" in n for n in flash)


# --------------------------------------------------------------------------
# small known ops (traced without functionalisation, so in-place ops survive)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_doc():
    def f(x, y, z):
        a = x.view(-1)
        b = a.add_(1)
        s = torch.split(y, 2)
        torch.add(s[0], s[1], out=z)
        torch._foreach_add_([x, z], [z, x])
        m = torch.mm(y, x.t())
        return b, s[0], z, m

    gm = make_fx(f, tracing_mode="fake")(torch.randn(2, 3), torch.randn(4, 3), torch.randn(2, 3))
    doc = serialize_graph(gm)
    check_doc(doc)
    return gm, doc


def test_view_fact(small_doc):
    _, doc = small_doc
    v = by_name(doc)["view"]
    assert v["target"] == "aten::view.default"
    assert v["view"] and v["aliased_inputs"] == [0] and v["mutated_inputs"] == []
    assert v["outputs"] == [{"bytes": 24, "dtype": "float32", "shape": [6]}]


def test_inplace_add_fact(small_doc):
    _, doc = small_doc
    nodes = by_name(doc)
    a = nodes["add_"]
    assert a["target"] == "aten::add_.Tensor"
    assert a["inputs"] == [nodes["view"]["id"]]
    assert a["mutated_inputs"] == [0] and a["aliased_inputs"] == [0] and not a["view"]


def test_out_variant_writes_the_out_argument(small_doc):
    _, doc = small_doc
    nodes = by_name(doc)
    add = nodes["add"]
    assert add["target"] == "aten::add.out"
    # inputs are (getitem, getitem_1, z_1): `out=` is position 2, a kwarg in FX
    assert add["inputs"] == [nodes["getitem"]["id"], nodes["getitem_1"]["id"], nodes["z_1"]["id"]]
    assert add["mutated_inputs"] == [2] and add["aliased_inputs"] == [2]


def test_foreach_inplace_mutates_every_list_element(small_doc):
    _, doc = small_doc
    nodes = by_name(doc)
    fe = nodes["_foreach_add_"]
    assert fe["inputs"] == [nodes["x_1"]["id"], nodes["add"]["id"]]
    assert fe["mutated_inputs"] == [0, 1] and fe["aliased_inputs"] == [] and fe["outputs"] == []


def test_split_and_getitem_facts(small_doc):
    _, doc = small_doc
    nodes = by_name(doc)
    sp = nodes["split"]
    assert sp["view"] and sp["aliased_inputs"] == [0]
    assert [o["shape"] for o in sp["outputs"]] == [[2, 3], [2, 3]]
    for g in ("getitem", "getitem_1"):
        assert nodes[g]["target"] == "operator.getitem"
        assert nodes[g]["inputs"] == [sp["id"]] and nodes[g]["aliased_inputs"] == [0] and not nodes[g]["view"]


def test_mm_flops_small(small_doc):
    _, doc = small_doc
    mm = by_name(doc)["mm"]
    assert mm["flops"] == 2 * 4 * 2 * 3  # (4,3) @ (3,2)
    assert by_name(doc)["t"]["view"]


@pytest.mark.parametrize(
    "op, mutated, aliased, view",
    [
        (torch.ops.aten.view.default, (), (0,), True),
        (torch.ops.aten.add_.Tensor, (0,), (0,), False),
        (torch.ops.aten.copy_.default, (0,), (0,), False),
        (torch.ops.aten.split.Tensor, (), (0,), True),
        (torch.ops.aten.unbind.int, (), (0,), True),
        (torch.ops.aten.chunk.default, (), (0,), True),
        (torch.ops.aten.transpose_.default, (0,), (0,), False),
        (torch.ops.aten.native_dropout.default, (), (), False),
        (torch.ops.aten.mm.default, (), (), False),
        (torch.ops.aten.index_put_.default, (0,), (0,), False),
        (torch.ops.aten._foreach_add_.List, (0,), (), False),
    ],
)
def test_op_facts_from_schema(op, mutated, aliased, view):
    f = op_facts.op_facts(op)
    assert f.mutated == mutated and f.aliased == aliased and f.view == view


def test_view_flag_agrees_with_torch_for_every_aten_tensor_op():
    """Our schema reading and OpOverload.is_view agree on every aten overload returning tensors."""
    disagree = []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if not any(str(r.type) in ("Tensor", "List[Tensor]", "Optional[Tensor]") for r in op._schema.returns):
                continue
            if op_facts.op_facts(op).view != op.is_view:
                disagree.append(str(op))
    assert disagree == []


def test_symint_nodes_and_hinted_shapes():
    def h(x):
        return (x.view(x.shape[0] * x.shape[1]) * 2).sum()

    gm = make_fx(h, tracing_mode="symbolic")(torch.randn(3, 5))
    doc = serialize_graph(gm)
    check_doc(doc)
    nodes = by_name(doc)
    syms = [n for n in doc["nodes"] if n["symint"]]
    assert {n["target"] for n in syms} == {"aten::sym_size.int", "operator.mul"}
    assert all(n["outputs"] == [] for n in syms)
    assert nodes["x_1"]["outputs"] == [{"bytes": 60, "dtype": "float32", "shape": [3, 5]}]
    assert nodes["view"]["outputs"][0]["shape"] == [15]
    assert nodes["view"]["inputs"] == [nodes["x_1"]["id"], nodes["mul"]["id"]]
    assert nodes["view"]["aliased_inputs"] == [0]
    # the input shape really is symbolic in FX
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert not isinstance(x.meta["val"].shape[0], int)


def _manual_graph():
    """A graph built by hand: collectives, a subgraph get_attr, python callables, tags."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t = torch.empty(4, 8)
    root = nn.Module()
    body = fx.GraphModule(nn.Module(), fx.Graph())
    body.graph.output(None)
    root.body = body
    g = fx.Graph()
    x = g.placeholder("primals_1")
    x.meta.update(val=t, ac_role="input", autograd_backward=False)
    ar = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"), name="all_reduce")
    ar.meta.update(val=t, autograd_backward=False)
    wt = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (ar,), name="wait_tensor")
    wt.meta.update(val=t, autograd_backward=False)
    sub = g.get_attr("body")
    sub.meta["autograd_backward"] = False
    relu = g.call_function(torch.ops.aten.relu.default, (wt,), name="relu")
    from torch.utils.checkpoint import CheckpointPolicy

    relu.meta.update(val=t, autograd_backward=False, recompute=CheckpointPolicy.PREFER_RECOMPUTE)
    dup = g.call_function(torch.ops.aten.relu.default, (wt,), name="relu_1")
    dup.meta.update(val=t, autograd_backward=True, ac_recomputed_from=relu)
    mul = g.call_function(operator.mul, (2, 3))
    mul.meta.update(val=6)
    g.output((relu, dup))
    return fx.GraphModule(root, g)


def test_manual_graph_facts():
    gm = _manual_graph()
    doc = serialize_graph(gm)
    check_doc(doc)
    nodes = by_name(doc)
    assert nodes["all_reduce"]["target"] == "_c10d_functional::all_reduce.default"
    assert nodes["all_reduce"]["collective"] and nodes["wait_tensor"]["collective"]
    assert not nodes["relu"]["collective"]
    assert nodes["body"]["kind"] == "get_attr" and nodes["body"]["subgraph"] and nodes["body"]["target"] == "body"
    assert nodes["relu"]["policy"] == "PREFER_RECOMPUTE" and nodes["relu"]["recomputed_from"] is None
    assert nodes["relu_1"]["recomputed_from"] == "relu" and nodes["relu_1"]["phase"] == "backward"
    assert nodes["mul"]["target"] == "operator.mul" and not nodes["mul"]["symint"]
    assert nodes["mul"]["phase"] == "forward"  # no annotation, reads nothing backward
    assert nodes["output"]["phase"] == "backward" and nodes["output"]["target"] == ""
    assert nodes["primals_1"]["role"] == "input"


def test_target_names():
    g = fx.Graph()
    x = g.placeholder("x")
    nodes = [
        g.call_function(torch.ops.aten.mm.default, (x, x)),
        g.call_function(torch.ops.aten.add.Tensor, (x, x)),
        g.call_function(operator.getitem, (x, 0)),
        g.call_function(math.ceil, (x,)),
        g.call_function(torch.sym_max, (x, x)),
        g.call_function(torch.ops.higher_order.tag_activation_checkpoint, (x,)),
    ]
    names = [op_facts.target_name(n) for n in nodes]
    assert names[:3] == ["aten::mm.default", "aten::add.Tensor", "operator.getitem"]
    assert names[3] == "math.ceil"
    assert names[4] == "torch.sym_max"
    assert names[5] == "higher_order::tag_activation_checkpoint"


def test_call_module_is_rejected():
    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="call_module"):
        serialize_graph(gm)


def test_bad_recompute_tag_is_rejected():
    gm = _manual_graph()
    relu = next(n for n in gm.graph.nodes if n.name == "relu")
    relu.meta["recompute"] = "sometimes"
    with pytest.raises(ValueError, match="CheckpointPolicy"):
        serialize_graph(gm)
    from torch.utils.checkpoint import CheckpointPolicy

    relu.meta["recompute"] = CheckpointPolicy.MUST_CPU_OFFLOAD
    with pytest.raises(ValueError, match="CPU-offload"):
        serialize_graph(gm)


# --------------------------------------------------------------------------
# units
# --------------------------------------------------------------------------


def test_discover_units_builtin_and_hf():
    assert [f for f, _ in discover_units(models.build("transformer", num_layers=3))] == ["layers.0", "layers.1", "layers.2"]
    assert discover_units(models.build("mlp")) == []  # no marker
    assert [f for f, _ in discover_units(models.build("gpt2"))] == ["transformer.h.0", "transformer.h.1"]
    assert [f for f, _ in discover_units(models.build("llama"))] == ["model.layers.0", "model.layers.1"]
    assert [f for f, _ in discover_units(models.build("mixtral"))] == ["model.layers.0", "model.layers.1"]
    # BertModel carries the marker, its layers sit at encoder.layer (the descend extension)
    assert [f for f, _ in discover_units(models.build("bert"))] == ["bert.encoder.layer.0", "bert.encoder.layer.1"]


def test_discover_units_rule_details():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

    class MoEBlock(nn.Module):
        gradient_checkpointing = False  # a marked layer, like HF's GradientCheckpointingLayer

        def __init__(self):
            super().__init__()
            self.mlp = nn.Module()
            self.mlp.experts = nn.ModuleList([Block(), Block()])

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gradient_checkpointing = False
            shared = Block()
            self.layers = nn.ModuleList([Block(), shared, MoEBlock()])
            self.extra = nn.ModuleDict({"enc": Block(), "dec": shared})  # `dec` is a duplicate by identity
            self.empty = nn.ModuleList()
            self.head = nn.Sequential(nn.Linear(2, 2))

    units = [f for f, _ in discover_units(Net())]
    # flattened in discovery order; ModuleDict keys kept; shared module once;
    # the marked MoE layer's experts are inside a unit, so not units themselves
    assert units == ["layers.0", "layers.1", "layers.2", "extra.enc", "head.0"]


# --------------------------------------------------------------------------
# speed
# --------------------------------------------------------------------------


def test_large_graph_serialises():
    # Its speed is measured in benchmarks/ (scaling), never asserted in a test.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        act, w = torch.empty(64, 64), torch.empty(64, 64)
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta.update(val=act, ac_role="input")
    wn = g.placeholder("w")
    wn.meta.update(val=w, ac_role="parameter")
    ops = [
        (torch.ops.aten.mm.default, lambda c: (c, wn)),
        (torch.ops.aten.relu.default, lambda c: (c,)),
        (torch.ops.aten.view.default, lambda c: (c, [64, 64])),
        (torch.ops.aten.add.Tensor, lambda c: (c, x)),
    ]
    cur = x
    n_nodes = 100_000
    for i in range(n_nodes):
        op, args = ops[i % 4]
        cur = g.call_function(op, args(cur))
        cur.meta["val"] = act
        cur.meta["autograd_backward"] = i >= n_nodes // 2
        cur.meta["ac_module_stack"] = [(f"layers.{i // 1000}", "Block")]
    g.output(cur)
    doc = json.loads(to_json(g))
    assert len(doc["nodes"]) == n_nodes + 3
    assert doc["nodes"][2]["flops"] == 2 * 64 * 64 * 64
    assert doc["nodes"][-2]["phase"] == "backward" and doc["nodes"][3]["phase"] == "forward"


# --------------------------------------------------------------------------
# through the C++ core (hyper_ac._core): FX → JSON → core → text
# --------------------------------------------------------------------------

ROUNDTRIP_MODELS = ("mlp", "transformer", "gpt2", "llama", "mixtral")


@pytest.mark.parametrize("name", ROUNDTRIP_MODELS)
def test_core_roundtrip_is_lossless_and_prints_every_node(captured, name):
    from conftest import core_module

    core = core_module()
    c = captured(name)
    text = c.json()
    # the core re-emits exactly what we wrote (we write every field, in canonical form)
    again = core.roundtrip(text)
    assert json.loads(again) == c.doc
    # the printer: one line per node, in order, with phase and innermost module
    printed = core.print_graph(text)
    lines = printed.splitlines()
    assert len(lines) == len(c.doc["nodes"])
    for line, node in zip(lines, c.doc["nodes"]):
        phase, name_ = line.split(" ", 2)[:2]
        assert phase == ("F" if node["phase"] == "forward" else "B") and name_ == node["name"], line
        if node["kind"] == "call_function":
            assert node["target"] in line
        if node["module_stack"]:
            assert "@" + node["module_stack"][0]["fqn"] in line
    # stable: printing the re-emitted document gives the same text
    assert core.print_graph(again) == printed
    # The summary is of the graph the core plans: exact copies elided at load
    # (docs/graph-format.md), every one a forward clone marked `copy`.
    summary = core.load_graph_summary(text)
    m = re.search(r"^elided copies: (\d+) ", summary, re.M)
    elided = int(m.group(1)) if m else 0
    assert elided <= sum(1 for n in c.doc["nodes"] if n.get("copy"))
    n_fwd = sum(1 for n in c.doc["nodes"] if n["phase"] == "forward") - elided
    n_all = len(c.doc["nodes"]) - elided
    assert f"nodes: {n_all} (forward {n_fwd}, backward {n_all - n_fwd})" in summary


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_capture_and_serialize_are_deterministic(captured, name):
    """A fresh build + capture + serialise gives byte-identical JSON and text."""
    from conftest import Captured, core_module

    first = captured(name)
    second = Captured(name)
    assert second.json() == first.json()
    core = core_module()
    assert core.print_graph(second.json()) == core.print_graph(first.json())


def test_core_rejects_broken_documents(captured):
    from conftest import core_module

    core = core_module()
    doc = json.loads(captured("mlp").json())
    bad = json.loads(json.dumps(doc))
    bad["nodes"][10]["inputs"].append(bad["nodes"][20]["id"])  # forward reference
    with pytest.raises(ValueError, match="forward reference"):
        core.load_graph_summary(json.dumps(bad))
    bad = json.loads(json.dumps(doc))
    bad["nodes"][10]["aliased_inputs"] = [5]  # position out of range
    with pytest.raises(ValueError):
        core.roundtrip(json.dumps(bad))


def test_input_mutation_marks_the_written_placeholder():
    import torch
    from torch import nn

    from hyper_ac.frontend.capture import capture_joint
    from hyper_ac.frontend.serialize import serialize_graph

    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.register_buffer("steps", torch.zeros(4))

        def forward(self, x):
            self.steps.add_(1.0)
            return (self.proj(x) + self.steps).sum()

    model = Counter()
    doc = serialize_graph(capture_joint(model, torch.randn(2, 4)).graph_module, model)
    check_doc(doc)
    mutated = [n for n in doc["nodes"] if n["mutated"]]
    assert [n["role"] for n in mutated] == ["buffer"]
    assert all(n["kind"] == "placeholder" for n in mutated)
