"""Every torch API docs/torch-compat.md lists, checked directly against torch.

These tests do not go through hyper_ac (except where noted): when a torch
upgrade changes one of them, the failing test names the API.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import operator

import pytest
import torch
import torch.fx as fx
import torch.nn as nn


def test_torch_version_is_the_pinned_one():
    assert torch.__version__.split("+")[0] == "2.13.0", "docs/torch-compat.md was written for torch 2.13.0"


# --------------------------------------------------------------------------
# one raw aot_autograd compile, recorded without hyper_ac
# --------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.gradient_checkpointing = False
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.norm = nn.LayerNorm(8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return (self.norm(x) * self.scale).sum()


@pytest.fixture(scope="module")
def raw():
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition
    import torch._functorch.config as functorch_config

    torch.manual_seed(0)
    model = _Net()
    x = torch.randn(4, 8)
    rec = {}

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
        rec["joint"] = copy.deepcopy(joint)
        rec["num_fwd_outputs"] = num_fwd_outputs
        rec["kw"] = kw
        rec["joint_inputs"] = joint_inputs
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)

    aot = aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g, partition_fn=partition)

    def backend(gm, example_inputs):
        rec["example_inputs"] = list(example_inputs)
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    try:
        with functorch_config.patch(enable_autograd_cache=False):
            torch.compile(lambda m, x: m(x), backend=backend, fullgraph=True)(model, x)
    finally:
        torch._dynamo.reset()
    rec["model"] = model
    return rec


def test_aot_autograd_partition_fn_convention(raw):
    """partition_fn(joint_module, joint_inputs, *, num_fwd_outputs, static_lifetime_input_indices)."""
    assert isinstance(raw["joint"], fx.GraphModule)
    assert raw["num_fwd_outputs"] == 1
    assert set(raw["kw"]) == {"static_lifetime_input_indices"}
    sig = inspect.signature(__import__("torch._functorch.partitioners", fromlist=["x"]).default_partition)
    assert "num_fwd_outputs" in sig.parameters and sig.parameters["num_fwd_outputs"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "static_lifetime_input_indices" in sig.parameters


def test_enable_autograd_cache_flag_exists():
    import torch._functorch.config as functorch_config

    assert isinstance(functorch_config.enable_autograd_cache, bool)


def test_joint_placeholder_names_and_descriptors(raw):
    from torch._functorch._aot_autograd.descriptors import PlainAOTInput, TangentAOTInput

    ph = [n for n in raw["joint"].graph.nodes if n.op == "placeholder"]
    primals = [n for n in ph if n.target.startswith("primals_")]
    tangents = [n for n in ph if n.target.startswith("tangents_")]
    assert len(primals) + len(tangents) == len(ph) and len(tangents) == 1
    assert all(isinstance(n.meta["desc"], PlainAOTInput) for n in primals)
    assert isinstance(tangents[0].meta["desc"], TangentAOTInput)
    # PlainAOTInput.idx indexes dynamo's flat backend inputs
    assert sorted(n.meta["desc"].idx for n in primals) == list(range(len(raw["example_inputs"])))


def test_backend_example_inputs_are_the_live_parameters(raw):
    model = raw["model"]
    params = {id(p) for p in model.parameters()}
    buffers = {id(b) for b in model.buffers()}
    ex = raw["example_inputs"]
    assert sum(id(e) in params for e in ex) == len(params)
    assert sum(id(e) in buffers for e in ex) == len(buffers)
    for e in ex:
        static = getattr(e, "_dynamo_static_input_type", None)
        if id(e) in params or id(e) in buffers:
            assert static is not None
        else:
            assert static is None and not isinstance(e, nn.Parameter)


def test_joint_output_layout(raw):
    from torch._functorch._aot_autograd.descriptors import GradAOTOutput, PlainAOTOutput

    joint = raw["joint"]
    out = next(n for n in joint.graph.nodes if n.op == "output")
    flat = torch.utils._pytree.arg_tree_leaves(*out.args)
    primals = [n for n in joint.graph.nodes if n.op == "placeholder" and n.target.startswith("primals_")]
    assert len(flat) == raw["num_fwd_outputs"] + len(primals)
    descs = out.meta["desc"]
    assert isinstance(descs[0], PlainAOTOutput)
    for p, slot, d in zip(primals, flat[1:], descs[1:]):
        example = raw["example_inputs"][p.meta["desc"].idx]
        if isinstance(example, nn.Parameter):
            assert slot is not None and isinstance(d, GradAOTOutput) and d.grad_of == p.meta["desc"]
        else:
            assert slot is None and d is None


def test_partitioner_tags(raw):
    nodes = list(raw["joint"].graph.nodes)
    tags = {n.meta.get("partitioner_tag") for n in nodes if n.op != "output"}
    assert tags == {"is_forward", "is_backward"}
    tangent = next(n for n in nodes if n.op == "placeholder" and n.target.startswith("tangents"))
    assert tangent.meta["partitioner_tag"] == "is_backward"
    # the forward section is contiguous: all is_forward call_functions precede all is_backward ones
    seq = [n.meta["partitioner_tag"] for n in nodes if n.op == "call_function"]
    assert seq == sorted(seq, key=lambda t: t == "is_backward")
    from torch._functorch import partitioners

    for name in ("_has_tag_is_backward", "_has_tag_is_forward", "_must_be_in_backward", "_extract_fwd_bwd_outputs",
                 "classify_nodes", "_is_tangent", "_is_primal"):
        assert callable(getattr(partitioners, name)), name


def test_nn_module_stack_format(raw):
    model = raw["model"]
    by_id = {id(m): f for f, m in model.named_modules()}
    seen = set()
    for n in raw["joint"].graph.nodes:
        stack = n.meta.get("nn_module_stack")
        if not stack or n.meta.get("partitioner_tag") != "is_forward":
            continue
        entries = list(stack.items())
        for key, value in entries:
            path, typ = value
            assert isinstance(path, str) and isinstance(typ, type)
            assert key.split("@")[0].isdigit(), key  # str(id(module)) in 2.13
            fqn = by_id[int(key.split("@")[0])]
            assert type(model.get_submodule(fqn)).__name__ == typ.__name__
            # the path is a dynamo source string rooted at the traced argument
            assert path.startswith("L['m']"), path
            assert path == "L['m']" + "".join("." + p for p in fqn.split(".") if fqn), (path, fqn)
            seen.add(fqn)
        # outermost first
        paths = [v[0] for _, v in entries]
        assert all(inner.startswith(outer) for outer, inner in zip(paths, paths[1:]))
    assert {"", "layers.0", "layers.1", "norm"} <= seen


def test_seq_nr_links_backward_to_forward(raw):
    nodes = list(raw["joint"].graph.nodes)
    fwd_seq = {n.meta["seq_nr"]: n for n in reversed(nodes) if n.meta.get("partitioner_tag") == "is_forward" and "seq_nr" in n.meta}
    bwd = [n for n in nodes if n.meta.get("partitioner_tag") == "is_backward" and n.op == "call_function"]
    assert bwd and all("seq_nr" in n.meta for n in bwd)
    linked = [n for n in bwd if n.meta["seq_nr"] in fwd_seq and not n.meta.get("is_gradient_acc")]
    assert len(linked) > 0.8 * len(bwd)
    # AOTAutograd copies the forward stack to fwd_nn_module_stack using the same mapping
    assert all("fwd_nn_module_stack" in n.meta for n in linked)
    assert any(n.meta.get("autograd_backward") is True for n in bwd)


def test_meta_val_is_fake(raw):
    from torch._subclasses.fake_tensor import FakeTensor

    for n in raw["joint"].graph.nodes:
        if n.op in ("placeholder", "call_function") and isinstance(n.meta.get("val"), torch.Tensor):
            assert isinstance(n.meta["val"], FakeTensor)


def test_dynamo_exceptions():
    import torch._dynamo.exc as exc

    assert issubclass(exc.Unsupported, Exception) and issubclass(exc.UserError, Exception)
    assert "inner_exception" in inspect.signature(exc.BackendCompilerFailed.__init__).parameters

    def f(x):
        if x.sum().item() > 0:
            return x * 2
        return x

    torch._dynamo.reset()
    try:
        # a data-dependent branch is a UserError in 2.13 (other breaks are Unsupported)
        with pytest.raises((exc.Unsupported, exc.UserError)):
            torch.compile(f, backend="eager", fullgraph=True)(torch.randn(3))
    finally:
        torch._dynamo.reset()


def test_export_route_apis():
    from torch._dynamo.functional_export import dynamo_graph_capture_for_export
    from torch._functorch._aot_autograd.descriptors import BufferAOTInput, ParamAOTInput
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    assert list(inspect.signature(aot_export_joint_with_descriptors).parameters)[:4] == ["stack", "mod", "args", "kwargs"]
    model = _Net()
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    try:
        traced = dynamo_graph_capture_for_export(model)(x)
        with contextlib.ExitStack() as stack:
            joint = aot_export_joint_with_descriptors(stack, traced, (x,), {}).graph_module
    finally:
        torch._dynamo.reset()
    descs = [n.meta["desc"] for n in joint.graph.nodes if n.op == "placeholder"]
    assert {d.target for d in descs if isinstance(d, ParamAOTInput)} == {k for k, _ in model.named_parameters()}
    assert {d.target for d in descs if isinstance(d, BufferAOTInput)} == {"scale"}
    assert any(n.meta.get("nn_module_stack") for n in joint.graph.nodes)


# --------------------------------------------------------------------------
# serialize
# --------------------------------------------------------------------------


def test_opoverload_schema_fields():
    op = torch.ops.aten.add_.Tensor
    assert op._schema.name == "aten::add_" and op._overloadname == "Tensor" and op.namespace == "aten"
    assert op.overloadpacket is torch.ops.aten.add_
    self_arg = op._schema.arguments[0]
    assert self_arg.name == "self" and self_arg.alias_info.is_write
    assert set(self_arg.alias_info.before_set) == {"a"} and set(self_arg.alias_info.after_set) == {"a"}
    assert set(op._schema.returns[0].alias_info.before_set) == {"a"}
    assert torch.ops.aten.mm.default._overloadname == "default"


def test_wildcard_alias_of_multi_output_views():
    arg = torch.ops.aten.split.Tensor._schema.arguments[0]
    assert set(arg.alias_info.before_set) == {"a"} and set(arg.alias_info.after_set) == {"*"}
    assert not arg.alias_info.is_write
    assert torch.ops.aten.split.Tensor.is_view and torch.ops.aten.view.default.is_view
    assert not torch.ops.aten.add_.Tensor.is_view


def test_rng_tag():
    assert torch.Tag.nondeterministic_seeded in torch.ops.aten.native_dropout.default.tags
    assert torch.Tag.nondeterministic_seeded in torch.ops.aten.rand.default.tags
    assert torch.Tag.nondeterministic_seeded not in torch.ops.aten.mm.default.tags


def test_higher_order_operator_name():
    hop = torch.ops.higher_order.tag_activation_checkpoint
    assert isinstance(hop, torch._ops.HigherOrderOperator) and hop.name() == "tag_activation_checkpoint"
    for name in ("run_and_save_rng_state", "run_with_rng_state"):
        assert getattr(torch.ops.higher_order, name).name() == name


def test_rng_replay_kernels_and_their_dispatch_mode_gap():
    # hyper_ac.lower.runtime calls the replay ops' BackendSelect kernels as plain
    # functions; called as higher-order ops they fail under a plain dispatch mode.
    from torch._C import DispatchKey
    from torch._prims import rng_prims
    from torch.utils._python_dispatch import TorchDispatchMode

    import hyper_ac.lower.runtime as runtime

    for hop in (rng_prims.run_and_save_rng_state, rng_prims.run_with_rng_state,
                rng_prims.graphsafe_run_with_rng_state):
        assert DispatchKey.BackendSelect in hop.py_kernels, hop.name()

    class DoNothing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.ones(64)
    state, drawn = runtime.run_and_save_rng_state(torch.ops.aten.rand_like.default, x)
    with DoNothing():
        with pytest.raises(NotImplementedError, match="no rule registered for HigherOrderOperator"):
            rng_prims.run_with_rng_state(state, torch.ops.aten.rand_like.default, x)
        before = torch.get_rng_state()
        again = runtime.run_with_rng_state(state, torch.ops.aten.rand_like.default, x)
    assert torch.equal(again, drawn) and torch.equal(torch.get_rng_state(), before)


def test_flop_registry():
    from torch.utils.flop_counter import flop_registry

    mm = flop_registry[torch.ops.aten.mm]
    assert hasattr(mm, "__wrapped__")  # shape_wrapper(functools.wraps)
    a, b = torch.empty(4, 3, device="meta"), torch.empty(3, 5, device="meta")
    assert mm(a, b, out_val=torch.empty(4, 5, device="meta")) == 2 * 4 * 3 * 5
    assert torch.ops.aten.relu not in flop_registry
    for packet in (torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm, torch.ops.aten.convolution,
                   torch.ops.aten._scaled_dot_product_efficient_attention):
        assert packet in flop_registry, packet


def test_optimization_hint():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    gm = make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(3, 5))
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    s0 = x.meta["val"].shape[0]
    assert isinstance(s0, torch.SymInt)
    assert optimization_hint(s0, fallback=8192) == 3
    assert optimization_hint(7) == 7
    assert "fallback" in inspect.signature(optimization_hint).parameters


def test_sym_types_and_checkpoint_policy():
    from torch.utils.checkpoint import CheckpointPolicy

    names = {p.name for p in CheckpointPolicy}
    assert {"MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE"} <= names
    # 2.13 also has CPU-offload policies, which graph format v1 cannot express
    assert names - {"MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE"} == {"MUST_CPU_OFFLOAD", "PREFER_CPU_OFFLOAD"}
    assert all(isinstance(t, type) for t in (torch.SymInt, torch.SymFloat, torch.SymBool))
    from torch.fx.experimental.symbolic_shapes import is_symbolic  # noqa: F401  (used by torch's is_sym_node)


def test_all_input_nodes_order():
    g = fx.Graph()
    a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
    n = g.call_function(torch.ops.aten.add.out, (b, a), {"out": c})
    m = g.call_function(torch.ops.aten.cat.default, ([c, a, c],))
    assert n.all_input_nodes == [b, a, c]
    assert m.all_input_nodes == [c, a]  # distinct, first use first


def test_collective_namespace():
    op = torch.ops._c10d_functional.all_reduce.default
    assert op.namespace == "_c10d_functional"
    assert torch.ops._c10d_functional.wait_tensor.default.namespace == "_c10d_functional"
    from torch._functorch.partitioners import is_not_collective

    g = fx.Graph()
    x = g.placeholder("x")
    assert not is_not_collective(g.call_function(op, (x, "sum", "0")))


def test_input_mutations_are_described_on_the_output_node():
    from torch import nn
    from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput

    from hyper_ac.frontend.capture import capture_joint

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x):
            self.scale.add_(1.0)
            return (self.proj(x) * self.scale).sum()

    gm = capture_joint(Scaled(), torch.randn(2, 4)).graph_module
    out = [n for n in gm.graph.nodes if n.op == "output"][0]
    mutations = [d for d in out.meta["desc"] if isinstance(d, InputMutationAOTOutput)]
    assert len(mutations) == 1
    placeholders = {n.meta.get("desc"): n for n in gm.graph.nodes if n.op == "placeholder"}
    assert mutations[0].mutated_input in placeholders


def test_pass_and_backend_apis():
    from torch._functorch import partitioners
    from torch.fx.graph import _BoxedCodeGen
    from torch._inductor.compile_fx import _CompileFxKwargs, compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.utils.checkpoint import CheckpointPolicy

    assert {p.name for p in CheckpointPolicy} >= {"MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE"}
    assert callable(torch.fx.Graph.find_nodes) and callable(torch.fx.Node.append)
    params = inspect.signature(partitioners._extract_fwd_bwd_modules).parameters
    for name in ("joint_module", "saved_values", "saved_sym_nodes", "num_fwd_outputs", "static_lifetime_input_nodes"):
        assert name in params
    assert callable(partitioners.is_sym_node)
    assert "num_fwd_outputs" in inspect.signature(partitioners.min_cut_rematerialization_partition).parameters
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()
    args = [torch.ones(2)]
    assert torch.equal(gm.forward(args), torch.ones(2)) and args == []  # the boxed code clears its inputs
    assert callable(compile_fx_inner) and "is_backward" in _CompileFxKwargs.__annotations__
    # The backward without horizontal fusion (docs/floor.md): the C++ backend's group size knob.
    assert isinstance(torch._inductor.config.cpp.max_horizontal_fusion_size, int)
    with torch._inductor.config.patch({"cpp.max_horizontal_fusion_size": 1}):
        assert torch._inductor.config.cpp.max_horizontal_fusion_size == 1
    assert isinstance(select_decomp_table(), dict)


def test_graph_internals_emit_node_uses():
    """hyper_ac._fx.emit_node builds nodes as create_node does, from these internals."""
    from torch.fx._lazy_graph_module import _LazyGraphModule, _make_graph_module, _use_lazy_graph_module

    from hyper_ac import _fx

    assert _fx.internals_present(), "fx.Graph internals changed: emit_node falls back to create_node"
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    assert callable(graph._graph_namespace.create_name) and callable(graph._graph_namespace.associate_name_with_obj)
    assert callable(graph._find_nodes_lookup_table.insert) and graph._len == 1
    assert x.meta == {} and callable(x._prepend)
    with _use_lazy_graph_module(True):
        assert isinstance(_make_graph_module(torch.nn.Module(), graph), _LazyGraphModule)


def test_graph_internals_backward_in_place_uses():
    """hyper_ac._fx.erase_node / to_placeholder / reset_graph (the native split's backward,
    built in place from the joint graph) rely on these internals."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from hyper_ac import _fx

    gm = make_fx(lambda xs: [xs[0].sin() * 2])([torch.randn(3)])  # inputs as a pytree
    graph = gm.graph
    assert type(graph._codegen).__name__ == "_PyTreeCodeGen"
    x, sin, mul = [n for n in graph.nodes if n.op != "output"]
    namespace = graph._graph_namespace
    assert isinstance(namespace._obj_to_name, dict) and isinstance(namespace._used_names, set)
    # A node turned into a placeholder is re-filed in the lookup table and keeps its name and readers.
    _fx.to_placeholder(sin)
    assert sin.op == "placeholder" and sin.target == sin.name and sin.args == () and sin.users == {mul: None}
    assert graph.find_nodes(op="placeholder") == [x, sin] and not graph.find_nodes(op="call_function",
                                                                                  target=torch.ops.aten.sin.default)
    graph._root.append(sin)
    assert graph.find_nodes(op="placeholder") == [sin, x]  # sorted by graph order
    _fx.erase_node(graph, x)
    assert x.name not in namespace._used_names and x not in namespace._obj_to_name
    assert graph.placeholder(x.name).name == x.name  # the name is free again
    _fx.reset_graph(graph)
    assert type(graph._codegen) is torch.fx.graph.CodeGen and graph._tracer_cls is None
    assert set(vars(torch.fx.Graph())) - set(vars(graph)) == set()
    graph.lint()
