"""hyper_ac.frontend.capture and hyper_ac.models: the joint graph is the training step."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from hyper_ac import fx_meta, models
from hyper_ac.frontend import annotate
from hyper_ac.frontend import capture
from hyper_ac.frontend import module_path
from hyper_ac.frontend.annotate import annotate_joint
from hyper_ac.frontend.capture import CaptureError, capture_joint
from hyper_ac.frontend.module_path import normalize_module_path


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def run_joint(cg: capture.CapturedGraph):
    """Execute the joint graph on the real inputs (tangent = 1) → flat outputs."""
    vals = []
    for n in cg.graph.nodes:
        if n.op != "placeholder":
            continue
        if fx_meta.role(n) == "tangent":
            v = fx_meta.val(n)
            vals.append(torch.ones(v.shape, dtype=v.dtype))
        else:
            vals.append(cg.example_inputs[fx_meta.desc(n).idx])
    with torch.no_grad():
        out = fx.Interpreter(cg.graph_module).run(*vals)
    return torch.utils._pytree.tree_leaves(out, is_leaf=lambda x: x is None)


def primals(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder" and fx_meta.role(n) != "tangent"]


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_models_are_deterministic_and_return_a_loss(name):
    a, b = models.build(name), models.build(name)
    batch = models.example_batch(name)
    for (ka, pa), (kb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert ka == kb and torch.equal(pa, pb)
    out = a(**batch)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert torch.equal(models.example_batch(name)[next(iter(batch))], batch[next(iter(batch))])
    assert a.training


def test_tiny_transformer_structure():
    m = models.TinyTransformer(num_layers=3)
    assert m.gradient_checkpointing is False
    assert isinstance(m.layers, nn.ModuleList) and len(m.layers) == 3
    blk = m.layers[0]
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert isinstance(getattr(blk.self_attn, proj), nn.Linear)
    ids = torch.randint(0, 128, (2, 8))
    assert m(ids).shape == (2, 8, 128)
    sdpa = models.TinyTransformer(num_layers=3, use_sdpa=True)
    sdpa.load_state_dict(m.state_dict())
    torch.testing.assert_close(sdpa(ids, ids), m(ids, ids))


def test_hf_model_tiny_config():
    m = models.hf_model("llama", num_layers=3)
    assert m.config.use_cache is False and m.config.num_hidden_layers == 3
    assert m.config.hidden_size == 64 and m.config.num_attention_heads == 4
    with pytest.raises(ValueError, match="unknown HF model"):
        models.hf_model("bart")


# --------------------------------------------------------------------------
# capture: the joint graph is the training step
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "transformer", "llama", "t5"])
def test_joint_graph_computes_loss_and_gradients(captured, name):
    c = captured(name)
    cg = c.captured
    model = models.build(name)  # fresh copy (same seed) for the eager reference
    out = model(**c.batch)
    ref = out if isinstance(out, torch.Tensor) else out.loss
    ref.backward()
    flat = run_joint(cg)
    torch.testing.assert_close(flat[0], ref.detach())
    torch.testing.assert_close(cg.loss, ref.detach())
    grads = flat[cg.num_fwd_outputs:]
    ps = primals(cg.graph_module)
    assert len(grads) == len(ps)
    checked = 0
    for node, g in zip(ps, grads):
        if node.meta["ac_role"] == "parameter":
            torch.testing.assert_close(g, model.get_parameter(node.meta["ac_source"]).grad)
            checked += 1
        else:
            assert g is None
    assert checked == sum(1 for _ in model.parameters())


def test_capture_does_not_touch_grads():
    m = models.build("mlp")
    capture_joint(m, **models.example_batch("mlp"))
    assert all(p.grad is None for p in m.parameters())


def test_capture_result_fields(captured):
    cg = captured("mlp").captured
    assert cg.tracer == "compile" and cg.num_fwd_outputs == 1
    assert cg.num_nodes == len(cg.graph.nodes) > 10
    assert isinstance(cg.dynamo_graph, fx.GraphModule)
    assert cg.capture_seconds > 0
    out = next(n for n in cg.graph.nodes if n.op == "output")
    assert len(torch.utils._pytree.arg_tree_leaves(*out.args)) == 1 + len(primals(cg.graph_module))
    assert cg.annotation.num_forward + cg.annotation.num_backward == cg.num_nodes
    assert cg.annotation.role_method == "example_inputs"


def test_loss_fn_and_tensor_outputs():
    m = models.build("mlp")
    x = models.example_batch("mlp")["x"]
    cg = capture_joint(m, x, loss_fn=lambda out: out.pow(2).mean())
    torch.testing.assert_close(cg.loss, m(x).pow(2).mean().detach())
    cg2 = capture_joint(m, x)  # tensor output: .sum()
    torch.testing.assert_close(cg2.loss, m(x).sum().detach())
    assert "pow" in {str(n.target).split(".")[1] for n in cg.graph.nodes if n.op == "call_function" and "aten" in str(n.target)}


def test_graph_break_is_a_clear_error():
    class Breaks(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            if y.sum().item() > 0:  # data-dependent control flow: dynamo must break here
                y = y * 2
            return y

    with pytest.raises(CaptureError, match="graph break while capturing Breaks") as info:
        capture_joint(Breaks(), torch.randn(2, 4))
    assert "item" in str(info.value) or "data-dependent" in str(info.value)


def test_no_grad_model_is_an_error():
    m = models.build("mlp").requires_grad_(False)
    with pytest.raises(CaptureError, match="inference path"):
        capture_joint(m, **models.example_batch("mlp"))


def test_output_without_loss_is_an_error():
    m = models.build("llama")
    batch = models.example_batch("llama")
    del batch["labels"]
    with pytest.raises(CaptureError, match="cannot reduce"):
        capture_joint(m, **batch)


def test_unknown_tracer():
    with pytest.raises(ValueError, match="unknown tracer 'nope'"):
        capture_joint(models.build("mlp"), torch.randn(2, 32), tracer="nope")


def test_old_route_keyword_names_the_tracer():
    # capture_joint's keyword was 'route' until the plan's route (rewrite / stock) needed the word.
    with pytest.raises(TypeError, match="'route' is now called 'tracer': pass tracer='export'"):
        capture_joint(models.build("mlp"), torch.randn(2, 32), route="export")


# --------------------------------------------------------------------------
# annotation: phase
# --------------------------------------------------------------------------


def test_phase_matches_torch_partitioner_tags(any_model):
    """AOTAutograd tags every traced node is_forward / is_backward; we must agree."""
    gm = any_model.gm
    checked = 0
    for n in gm.graph.nodes:
        tag = n.meta.get("partitioner_tag")
        if tag in ("is_forward", "is_backward"):
            assert n.meta["autograd_backward"] == (tag == "is_backward"), n.name
            checked += 1
    assert checked > 0.9 * len(gm.graph.nodes)


def test_phase_dataflow_invariants(any_model):
    gm = any_model.gm
    cg = any_model.captured
    nodes = list(gm.graph.nodes)
    out = nodes[-1]
    fwd_outs = torch.utils._pytree.arg_tree_leaves(*out.args)[: cg.num_fwd_outputs]
    # everything the forward outputs need is forward
    stack, seen = list(fwd_outs), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        assert n.meta["autograd_backward"] is False, n.name
        stack.extend(n.all_input_nodes)
    # everything reachable from a tangent is backward; the output node too
    tangents = [n for n in nodes if n.op == "placeholder" and n.meta["ac_role"] == "tangent"]
    assert tangents
    stack, seen = list(tangents), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        assert n.meta["autograd_backward"] is True, n.name
        stack.extend(n.users)
    # forward nodes come before backward ones (one contiguous forward section)
    phases = [n.meta["autograd_backward"] for n in nodes if n.op == "call_function"]
    first_bwd = phases.index(True)
    assert all(phases[first_bwd:]) and not any(phases[:first_bwd])


def test_annotate_joint_without_partitioner_tags(captured):
    """Phase from dataflow + position alone (graphs from other pipelines carry no tags)."""
    c = captured("transformer")
    gm = copy.deepcopy(c.gm)  # the fixture is shared: work on a copy
    want = {n.name: n.meta["autograd_backward"] for n in gm.graph.nodes}
    for n in gm.graph.nodes:
        n.meta.pop("partitioner_tag", None)
        n.meta.pop("autograd_backward", None)
    annotate_joint(gm, c.captured.num_fwd_outputs, model=c.model)
    assert {n.name: n.meta["autograd_backward"] for n in gm.graph.nodes} == want


# --------------------------------------------------------------------------
# annotation: module stacks
# --------------------------------------------------------------------------


def test_module_stacks_are_live_fqns(any_model):
    mods = dict(any_model.model.named_modules())
    gm = any_model.gm
    with_stack = 0
    for n in gm.graph.nodes:
        stack = n.meta["ac_module_stack"]
        if n.op == "call_function" and stack:
            with_stack += 1
        for fqn, typ in stack:
            assert fqn in mods and fqn != "", (n.name, fqn)
            assert type(mods[fqn]).__name__ == typ
        # innermost first: each frame lies inside the next one
        for inner, outer in zip(stack, stack[1:]):
            assert inner[0].startswith(outer[0] + "."), (n.name, stack)
    call = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    assert with_stack > 0.7 * call


def test_backward_nodes_inherit_forward_module_stack(captured):
    gm = captured("transformer").gm
    fwd_by_seq = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and not n.meta["autograd_backward"] and "seq_nr" in n.meta:
            fwd_by_seq.setdefault(n.meta["seq_nr"], n)
    bwd_in_layers = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.meta["autograd_backward"] and not n.meta.get("is_gradient_acc"):
            src = fwd_by_seq.get(n.meta.get("seq_nr"))
            if src is not None:
                assert n.meta["ac_module_stack"] == src.meta["ac_module_stack"], n.name
                bwd_in_layers += any(f.startswith("layers.") for f, _ in n.meta["ac_module_stack"])
    assert bwd_in_layers > 50
    # a concrete one: the weight gradient of layers.1.mlp.down_proj
    names = {f for n in gm.graph.nodes if n.meta["autograd_backward"] for f, _ in n.meta["ac_module_stack"]}
    assert "layers.1.mlp.down_proj" in names and "layers.0.self_attn.q_proj" in names


@pytest.mark.parametrize(
    "path, want",
    [
        ("L['self'].model.layers[3].mlp", ["model", "layers", "3", "mlp"]),
        ("L['model'].model.layers.0.self_attn", ["model", "layers", "0", "self_attn"]),
        ("L['self']._modules['model']._modules['layers']['3']", ["model", "layers", "3"]),
        ("getattr(L['self'].h, '1').attn", ["h", "1", "attn"]),
        ("G['m'].layers.1", ["layers", "1"]),
        ("L['self']", []),
        ("layers.3.mlp", ["layers", "3", "mlp"]),
        ("L['self'].experts['gate']", ["experts", "gate"]),
    ],
)
def test_normalize_module_path(path, want):
    assert normalize_module_path(path) == want


def test_mangled_and_wrapper_paths_resolve_against_model():
    model = models.build("transformer")
    resolver = module_path._ModulePathResolver(model, "", [])
    # legacy mangled dynamo names
    assert resolver.resolve("L__self___layers_0_self_attn", "L__self___layers_0_self_attn", "SelfAttention") == "layers.0.self_attn"
    # an unknown wrapper prefix in front of a real path
    assert resolver.resolve("k", "L['self'].wrapped.inner.layers[1].mlp", "FeedForward") == "layers.1.mlp"
    # numeric keys are module ids: exact even when the path is unhelpful
    mod = model.layers[1].mlp
    assert resolver.resolve(str(id(mod)), "???", "FeedForward") == "layers.1.mlp"


# --------------------------------------------------------------------------
# annotation: placeholder roles
# --------------------------------------------------------------------------


def test_roles_identify_parameters_buffers_inputs(any_model):
    model = any_model.model
    cg = any_model.captured
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    counts = collections.Counter(cg.roles.values())
    assert counts["tangent"] == 1
    for n in cg.graph.nodes:
        if n.op != "placeholder":
            continue
        role = n.meta["ac_role"]
        if role == "parameter":
            assert n.meta["ac_source"] in params
            assert tuple(params[n.meta["ac_source"]].shape) == tuple(n.meta["val"].shape)
        elif role == "buffer":
            assert n.meta["ac_source"] in buffers
        elif role == "input":
            assert "ac_source" not in n.meta
    # every parameter the step uses is a primal exactly once (tied weights: once)
    sources = [n.meta["ac_source"] for n in cg.graph.nodes if n.meta.get("ac_role") == "parameter"]
    assert len(sources) == len(set(sources))
    assert counts["input"] == len(any_model.batch)


def test_llama_roles_exact(captured):
    c = captured("llama")
    cg = c.captured
    srcs = {n.meta["ac_source"]: n.meta["ac_role"] for n in cg.graph.nodes if "ac_source" in n.meta}
    assert srcs["model.rotary_emb.inv_freq"] == "buffer"
    assert srcs["model.layers.1.mlp.down_proj.weight"] == "parameter"
    assert set(k for k, v in srcs.items() if v == "parameter") == {k for k, _ in c.model.named_parameters()}


def test_annotate_joint_inside_a_partition_fn():
    """What a compile backend does: annotate the joint graph its partition_fn receives."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    model = models.build("transformer")
    batch = models.example_batch("transformer")
    seen = {}

    def backend(gm, example_inputs):
        def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
            seen["precise"] = annotate_joint(joint, num_fwd_outputs, example_inputs=example_inputs)
            seen["bare"] = collections.Counter(annotate_joint(joint, num_fwd_outputs).roles.values())
            seen["stack"] = {f for n in joint.graph.nodes for f, _ in n.meta["ac_module_stack"]}
            return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)

        return aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g, partition_fn=partition)(
            gm, example_inputs
        )

    torch._dynamo.reset()
    try:
        torch.compile(lambda **kw: model(**kw), backend=backend, fullgraph=True)(**batch)
    finally:
        torch._dynamo.reset()
    precise = collections.Counter(seen["precise"].roles.values())
    n_params = sum(1 for _ in model.parameters())
    assert precise == {"parameter": n_params, "buffer": 1, "input": 2, "tangent": 1}
    assert seen["precise"].role_method == "example_inputs"
    # without example inputs: parameters via "has a gradient", buffer indistinguishable from input
    assert seen["bare"] == {"parameter": n_params, "input": 3, "tangent": 1}
    # model=None: paths are still plain FQNs (dynamo traced model.forward, root = L['self'] / closure)
    assert "layers.0.mlp.up_proj" in seen["stack"]


def test_input_roles_override():
    c = capture_joint(models.build("mlp"), **models.example_batch("mlp"))
    gm = c.graph_module
    n = len(primals(gm))
    ann = annotate_joint(gm, 1, input_roles=["input"] * n)
    assert collections.Counter(ann.roles.values()) == {"input": n, "tangent": 1}
    with pytest.raises(ValueError, match="entries"):
        annotate_joint(gm, 1, input_roles=["input"])


# --------------------------------------------------------------------------
# export tracer
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["transformer", "llama"])
def test_export_tracer_matches_compile_tracer(captured, name):
    comp, exp = captured(name), captured(name, "export")
    assert exp.captured.tracer == "export"
    assert exp.captured.annotation.role_method == "descriptors"

    def ops(gm):
        return collections.Counter(
            (str(n.target), n.meta["autograd_backward"]) for n in gm.graph.nodes if n.op == "call_function"
        )

    assert ops(comp.gm) == ops(exp.gm)
    pc = {n.meta["ac_source"] for n in comp.gm.graph.nodes if n.meta.get("ac_role") == "parameter"}
    pe = {n.meta["ac_source"] for n in exp.gm.graph.nodes if n.meta.get("ac_role") == "parameter"}
    assert pc == pe
    stacks_c = collections.Counter(tuple(n.meta["ac_module_stack"]) for n in comp.gm.graph.nodes if n.op == "call_function")
    stacks_e = collections.Counter(tuple(n.meta["ac_module_stack"]) for n in exp.gm.graph.nodes if n.op == "call_function")
    assert stacks_c == stacks_e


# --------------------------------------------------------------------------
# buffers, mutations, RNG, data-dependent shapes
# --------------------------------------------------------------------------


class _BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.lin(x)).pow(2).mean()


@pytest.mark.parametrize("tracer", ["compile", "export"])
def test_buffer_mutation_is_a_forward_output_and_model_is_restored(tracer):
    torch.manual_seed(0)
    model = _BatchNormNet()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cg = capture_joint(model, torch.randn(4, 8), tracer=tracer)
    # running_mean, running_var, num_batches_tracked written back + the loss
    assert cg.num_fwd_outputs == 4
    assert annotate.num_forward_outputs_from_descs(cg.graph_module) == 4
    sources = {v: cg.roles[k] for k, v in cg.annotation.sources.items()}
    assert sources == {
        "lin.weight": "parameter", "lin.bias": "parameter", "bn.weight": "parameter", "bn.bias": "parameter",
        "bn.running_mean": "buffer", "bn.running_var": "buffer", "bn.num_batches_tracked": "buffer",
    }
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k  # capturing changed nothing
    out = next(n for n in cg.graph.nodes if n.op == "output")
    for o in torch.utils._pytree.arg_tree_leaves(*out.args)[:4]:
        assert o.meta["autograd_backward"] is False


def test_rng_state_is_restored():
    model = models.build("transformer", dropout=0.2)
    before = torch.get_rng_state()
    cg = capture_joint(model, **models.example_batch("transformer"))
    assert torch.equal(torch.get_rng_state(), before)
    assert any(n.target == torch.ops.aten.native_dropout.default for n in cg.graph.nodes)


class _MaskedSum(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y[y > 0].sum()  # data-dependent output shape (nonzero)


def test_data_dependent_shapes_compile_tracer_only():
    from hyper_ac.frontend.serialize import serialize_graph

    torch.manual_seed(0)
    cg = capture_joint(_MaskedSum(), torch.randn(4, 8))
    doc = serialize_graph(cg.graph_module)
    index = next(n for n in doc["nodes"] if n["target"] == "aten::index.Tensor")
    assert len(index["outputs"]) == 1 and index["outputs"][0]["shape"][0] <= 32  # unbacked size → hint
    assert any(n["symint"] for n in doc["nodes"])
    with pytest.raises(CaptureError, match="the export tracer cannot trace _MaskedSum.*tracer='compile'"):
        capture_joint(_MaskedSum(), torch.randn(4, 8), tracer="export")


class _ConvBNStack(nn.Module):
    """Residual conv/batch-norm blocks: training-mode batch norm updates its running stats in place."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.GELU())
                                     for _ in range(3)])

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return x.pow(2).mean()


def test_inductor_buffer_update_epilogue_does_not_pull_the_backward_forward(monkeypatch):
    # Inductor keeps the running-stat updates in the joint graph as `copy_` nodes
    # tagged must_be_in_forward and placed after the backward. They are forward,
    # but the tangent-free nodes of the decomposed batch-norm backward before them
    # (x - mean, ...) stay backward: otherwise every block value they read looks
    # read by a forward node outside its unit and `full` replays nothing.
    import hyper_ac
    from hyper_ac.frontend import annotate as annotate_module

    joints, results = [], []
    real = annotate_module.annotate_joint

    def keep(gm, *args, **kwargs):
        out = real(gm, *args, **kwargs)
        joints.append(gm)
        return out

    monkeypatch.setattr(annotate_module, "annotate_joint", keep)
    torch.manual_seed(0)
    model, x = _ConvBNStack(), torch.randn(2, 3, 16, 16)
    stock, ours = copy.deepcopy(model), copy.deepcopy(model)
    torch._dynamo.reset()
    try:
        torch.compile(stock, backend="inductor")(x).backward()
        backend = hyper_ac.backend({"ac_mode": "full"}, model=ours, compiler="inductor", on_result=results.append)
        torch.compile(ours, backend=backend)(x).backward()
    finally:
        torch._dynamo.reset()
    gm = joints[0]
    epilogue = [n for n in gm.graph.nodes if n.meta.get("partitioner_tag") == "must_be_in_forward"]
    assert epilogue and all(n.meta["autograd_backward"] is False for n in epilogue)
    first_tangent_user = min(i for i, n in enumerate(gm.graph.nodes)
                             if any(a.op == "placeholder" and a.meta.get("ac_role") == "tangent" for a in n.all_input_nodes))
    assert all(i > first_tangent_user for i, n in enumerate(gm.graph.nodes) if n in epilogue)
    for n in gm.graph.nodes:
        tag = n.meta.get("partitioner_tag")
        if tag in ("is_forward", "is_backward"):
            assert n.meta["autograd_backward"] == (tag == "is_backward"), n.name
    assert results[0].stats["nodes_duplicated"] > 0
    for a, b in zip(stock.parameters(), ours.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    for a, b in zip(stock.buffers(), ours.buffers()):
        torch.testing.assert_close(a, b)
