"""The native forward/backward split (issue 13) against PyTorch's split.

The backend's partition step is wrapped so that, for every graph it plans,
the rewritten joint graph is split twice: by the core's split (``split:
native``, what the step returns) and by PyTorch's ``_extract_fwd_bwd_modules``
on an identical copy (``split: torch``). The two must agree exactly: the same
node multiset per module (by op and target), the same placeholders in the same
order (saved SymInts, saved tensors, tangents) and the same forward outputs in
the same order (its outputs, then the saved values). The trained step with the
native split must match the uncheckpointed eager step bit for bit.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter

import pytest
import torch
from torch import fx, nn

import hyper_ac
import hyper_ac.lower.partition as partition
from hyper_ac import _core, models
from hyper_ac.frontend.capture import capture_joint
from hyper_ac.frontend.op_facts import HIGHER_ORDER_NAMESPACE, target_name
from hyper_ac.lower.runtime import MODE_SAFE_RNG_OPS


def _twin(gm: fx.GraphModule) -> fx.GraphModule:
    """An identical copy to split the other way (names, meta and the output's descriptors kept)."""
    graph = fx.Graph()
    out = graph.output(graph.graph_copy(gm.graph, {}))
    out.meta = dict(next(iter(gm.graph.find_nodes(op="output"))).meta)
    twin = fx.GraphModule(gm, graph)
    assert [n.name for n in twin.graph.nodes] == [n.name for n in gm.graph.nodes]
    return twin


# Once the eager compiler has compiled a module, its random-op replays call
# hyper_ac.lower.runtime's plain functions instead of torch's higher-order ops
# (a later step than the split): count them as the op they stand for.
_HOP_OF = {plain: hop for hop, plain in MODE_SAFE_RNG_OPS.items()}


def _target(n: fx.Node) -> str:
    hop = _HOP_OF.get(n.target)
    return f"{HIGHER_ORDER_NAMESPACE}::{hop.name()}" if hop is not None else target_name(n)


def _multiset(gm: fx.GraphModule) -> Counter:
    return Counter((n.op, _target(n)) for n in gm.graph.nodes if n.op not in ("placeholder", "output"))


def _placeholders(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.find_nodes(op="placeholder")]


def _outputs(gm: fx.GraphModule) -> list:
    out = next(iter(gm.graph.find_nodes(op="output")))
    return [a.name if isinstance(a, fx.Node) else a for a in out.args[0]]


def assert_same_split(native: tuple, stock: tuple, num_fwd_outputs: int) -> None:
    (fw, bw), (fw_ref, bw_ref) = native, stock
    assert _multiset(fw) == _multiset(fw_ref), (
        f"forward modules differ: native has {_multiset(fw) - _multiset(fw_ref)}, torch {_multiset(fw_ref) - _multiset(fw)}")
    assert _multiset(bw) == _multiset(bw_ref), (
        f"backward modules differ: native has {_multiset(bw) - _multiset(bw_ref)}, torch {_multiset(bw_ref) - _multiset(bw)}")
    assert _placeholders(fw) == _placeholders(fw_ref)
    assert _placeholders(bw) == _placeholders(bw_ref), "saved values (or their order) differ"
    assert _outputs(fw) == _outputs(fw_ref), "forward outputs (saved values, in order) differ"
    # Every saved value is a backward input (the convention: forward returns tensors then
    # SymInts, the backward takes SymInts then tensors, then the tangents).
    saved = _outputs(fw)[num_fwd_outputs:]
    assert sorted(saved) == sorted(_placeholders(bw)[:len(saved)])
    assert _outputs(bw) == _outputs(bw_ref)
    fw.graph.lint()
    bw.graph.lint()


@pytest.fixture
def compared(monkeypatch):
    """Every native split the backend makes, with PyTorch's split of the same rewritten graph."""
    record: list = []
    real = partition.partition_joint

    def both(joint, joint_inputs=None, *, num_fwd_outputs, split=None, **kwargs):
        assert split is not None, "the backend's default split is native"
        stock = real(_twin(joint), joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        native = real(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, split=split, **kwargs)
        record.append((native, stock, num_fwd_outputs, split))
        return native

    monkeypatch.setattr(partition, "partition_joint", both)
    return record


def _eager_step(model: nn.Module, batch: dict):
    loss = model(**batch)
    loss = loss.loss if hasattr(loss, "loss") else loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compiled_step(model: nn.Module, batch: dict, config, *, dynamic: bool = False):
    results: list = []
    compiled = torch.compile(model, backend=hyper_ac.backend(config, model=model, on_result=results.append),
                             fullgraph=True, dynamic=dynamic)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss, _ = _eager_step(compiled, batch)
    torch._dynamo.reset()
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, results


def _check(model: nn.Module, batch: dict, config: dict, compared: list, *, seed: int | None = None, dynamic=False):
    if seed is not None:
        torch.manual_seed(seed)
    ref_loss, ref_grads = _eager_step(copy.deepcopy(model), batch)
    if seed is not None:
        torch.manual_seed(seed)
    loss, grads, results = _compiled_step(copy.deepcopy(model), batch, config, dynamic=dynamic)
    if results[0].stats["nodes_duplicated"]:
        assert compared, "the backend did not split with the native split"
    else:  # a plan that changes nothing is partitioned as stock does it
        assert not compared
    for native, stock, nfo, _ in compared:
        assert_same_split(native, stock, nfo)
    assert torch.equal(ref_loss, loss), f"loss {loss.item()} != {ref_loss.item()}"
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert torch.equal(ref_grads[name], grads[name]), f"gradient of {name} differs"
    return results


@pytest.mark.parametrize("mode", ["full", "auto"])
@pytest.mark.parametrize("name", ["mlp", "transformer", "gpt2", "llama", "mixtral", "bert", "t5"])
def test_native_split_matches_torch(compared, name, mode):
    model = models.build(name)
    results = _check(model, models.example_batch(name), {"ac_mode": mode}, compared)
    if mode == "full":
        assert results[0].stats["nodes_duplicated"] > 0


@pytest.mark.parametrize("mode", ["selective", "budget"])
def test_native_split_matches_torch_other_modes(compared, mode):
    config = {"ac_mode": mode, **({"ac_memory_budget": 0.5} if mode == "budget" else {})}
    _check(models.build("llama"), models.example_batch("llama"), config, compared)


def test_native_split_with_replayed_dropout(compared):
    """Random ops replayed from a saved generator state: the state is a saved value at its op's place."""
    model = models.build("transformer", dropout=0.2)
    results = _check(model, models.example_batch("transformer"), {"ac_mode": "full"}, compared, seed=7)
    assert results[0].stats["rng_replayed"] > 0
    split = compared[0][3]
    assert any(name.endswith("_rng_state") for name in split["saved"])


def test_native_split_dynamic_shapes(compared):
    """Saved SymInts follow aot_autograd's convention (symbol bindings first)."""
    results = _check(models.build("transformer"), models.example_batch("transformer"), {"ac_mode": "selective"},
                     compared, dynamic=True)
    assert results[0].stats["saved_symint"] > 0
    assert compared[0][3]["saved_symints"]


@pytest.mark.parametrize("mode", ["full", "auto"])
def test_native_split_cnn_with_batchnorm(compared, mode, small_resnet):
    torch.manual_seed(0)
    model = small_resnet()
    batch = {"x": torch.randn(4, 3, 16, 16), "y": torch.randint(0, 10, (4,))}
    _check(model, batch, {"ac_mode": mode}, compared)


class _UnitLess(nn.Module):
    """No repeated block: auto plans it as one region over the whole forward."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x, y):
        h = torch.sin(self.a(x)).cos() * torch.tanh(self.a(x))
        return ((self.b(h).sigmoid() - y) ** 2).mean()


def test_native_split_unit_less_graph(compared):
    torch.manual_seed(0)
    model = _UnitLess()
    batch = {"x": torch.randn(4, 16), "y": torch.randn(4, 16)}
    results = _check(model, batch, {"ac_mode": "auto"}, compared)
    assert results[0].stats["scope"] == "whole_graph"


def test_split_torch_option_uses_torchs_split(monkeypatch):
    """``split: torch`` partitions with PyTorch's _extract_fwd_bwd_modules, handing it the saved set of the
    core's split (the plan's, not one rebuilt in Python), bitwise too."""
    calls: list = []
    extracted: list = []
    real = partition.partition_joint
    real_extract = partition._partitioners._extract_fwd_bwd_modules

    def spy(joint, joint_inputs=None, *, num_fwd_outputs, split=None, method="native", **kwargs):
        calls.append((split, method))
        return real(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, split=split, method=method, **kwargs)

    def extract_spy(joint, saved_values, *, saved_sym_nodes, **kwargs):
        extracted.append(([n.name for n in saved_values], [n.name for n in saved_sym_nodes]))
        return real_extract(joint, saved_values, saved_sym_nodes=saved_sym_nodes, **kwargs)

    def no_python_saved_set(_gm):
        raise AssertionError("split: torch rebuilt the saved set in Python")

    monkeypatch.setattr(partition, "partition_joint", spy)
    monkeypatch.setattr(partition._partitioners, "_extract_fwd_bwd_modules", extract_spy)
    monkeypatch.setattr(partition, "saved_values", no_python_saved_set)
    model = models.build("transformer")
    batch = models.example_batch("transformer")
    ref_loss, ref_grads = _eager_step(copy.deepcopy(model), batch)
    loss, grads, _ = _compiled_step(copy.deepcopy(model), batch, {"ac_mode": "full", "ac_split": "torch"})
    assert len(calls) == 1 and calls[0][1] == "torch"
    split = calls[0][0]
    assert split is not None and split["saved"]
    assert extracted == [(list(split["saved"]), list(split["saved_symints"]))]
    assert torch.equal(ref_loss, loss)
    assert all(torch.equal(ref_grads[n], grads[n]) for n in ref_grads)


def test_split_config_key():
    cfg = hyper_ac.planning.config.load_config({"activation_checkpoint": {"mode": "full", "split": "torch"}})
    assert cfg.split_method == "torch"
    assert hyper_ac.planning.config.load_config({"ac_mode": "full"}).split_method == "native"
    # The canonical form writes the default out (the core's option table; issue 23).
    assert hyper_ac.planning.config.load_config({"ac_mode": "full"}).data["activation_checkpoint"]["split"] == "native"
    with pytest.raises(ValueError, match="unknown split 'fast'"):
        hyper_ac.planning.config.load_config({"ac_mode": "full", "ac_split": "fast"})


def test_plan_split_leaves_the_plan_unchanged():
    model = models.build("transformer")
    cap = capture_joint(model, **models.example_batch("transformer"))
    graph_json = cap.to_json()
    cfg = hyper_ac.planning.config.load_config({"ac_mode": "full"}).json_for(model)
    plan_text, split_text = _core.plan_split(graph_json, cfg, hyper_ac.planning.config.op_policy_json())
    assert plan_text == _core.plan(graph_json, cfg, hyper_ac.planning.config.op_policy_json())
    import json

    plan, split = json.loads(plan_text), json.loads(split_text)
    assert sorted(split["saved"] + split["saved_symints"]) == sorted(plan["saved"])
    assert split["backward_duplicates"] == list(range(len(plan["duplicates"])))
    assert not set(split["forward"]) & set(plan["erase"])
    assert split["stats"]["backward_duplicates"] == len(plan["duplicates"])


@pytest.mark.parametrize("split_kind", ["native", "torch"])
def test_split_honours_lazy_codegen(split_kind):
    """Under ``_use_lazy_graph_module(True)`` (torch.compile's default) the split's modules defer
    their code generation to the first call; without it they generate it when built. Both
    generate the same code."""
    from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module

    from hyper_ac.lower.apply import apply_plan

    model = models.build("transformer")
    cap = capture_joint(model, **models.example_batch("transformer"))
    built = {}
    for lazy in (True, False):
        gm = _twin(cap.graph_module)
        result = hyper_ac.plan(gm, {"ac_mode": "full"}, with_split=True)
        apply_plan(gm, result.plan, recompile=False)
        with _use_lazy_graph_module(lazy):
            built[lazy] = partition.partition_joint(gm, None, num_fwd_outputs=cap.num_fwd_outputs,
                                                    split=result.split if split_kind == "native" else None)
    for module in built[True]:
        assert isinstance(module, _LazyGraphModule) and module._needs_recompile()
    for module in built[False]:
        assert not isinstance(module, _LazyGraphModule)
    for lazy_module, eager_module in zip(built[True], built[False]):
        assert lazy_module.code == eager_module.code  # generated now, on first access
        assert not lazy_module._needs_recompile()
