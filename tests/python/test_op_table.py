"""The shipped operator table (hyper_ac/configs/op_policy.yaml) names operators as the serialiser writes them.

An entry in any other spelling never matches a target and its rule never fires
(``higher_order.flex_attention`` did just that: flex attention was recomputed in
``selective``). Each entry is resolved to the torch object it names and named back
with the serialiser's own function; then a model that uses flex attention is
planned and trained through hyper_ac's normal route.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
import yaml
from torch import nn

import hyper_ac
from hyper_ac.frontend import op_facts
from hyper_ac.frontend.capture import capture_joint
from hyper_ac.planning.config import DEFAULT_OP_POLICY

#: Custom-op namespaces other packages register (transformers' MoE fallback, DeepEP, HybridEP):
#: not loaded here, so their entries cannot be resolved.
_OUT_OF_TREE = frozenset({"transformers", "deepep", "hybridep"})


def _resolve(entry: str):
    """The torch object a table entry names: ``ns::op`` (every overload), ``ns::op.overload``,
    or a Python callable ``module.qualname``."""
    if "::" in entry:
        namespace, name = entry.split("::", 1)
        op, _, overload = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload) if overload else packet
    module, _, qualname = entry.partition(".")
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def test_every_entry_is_a_serialiser_spelling():
    table = yaml.safe_load(DEFAULT_OP_POLICY.read_text())
    wrong = []
    for category, entries in table.items():
        for entry in entries or []:
            if entry.split("::")[0] in _OUT_OF_TREE and "::" in entry:
                continue
            try:
                name = op_facts._callable_name(_resolve(entry))
            except (AttributeError, ImportError, RuntimeError) as error:
                name = f"<does not resolve: {type(error).__name__}>"
            if name != entry:
                wrong.append(f"{category}: {entry!r} (the serialiser writes {name})")
    assert not wrong, "op table entries no target can match:\n" + "\n".join(wrong)


def test_higher_order_ops_have_one_spelling():
    hop = torch.ops.higher_order.flex_attention
    assert op_facts._callable_name(hop) == f"{op_facts.HIGHER_ORDER_NAMESPACE}::flex_attention"
    assert _resolve("higher_order::flex_attention") is hop


# --------------------------------------------------------------------------
# flex attention, end to end
# --------------------------------------------------------------------------


def _causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


class FlexAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        from torch.nn.attention.flex_attention import flex_attention

        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = flex_attention(q, k, v, score_mod=_causal)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.attn = FlexAttention(dim, heads=2)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class FlexModel(nn.Module):
    def __init__(self, dim: int = 16, depth: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).mean()


@pytest.fixture
def flex_on_cpu(monkeypatch):
    """torch 2.13 refuses flex attention with gradients on CPU at its public entry
    (``_validate_device``: Inductor has no CPU backward kernel). The higher-order
    op itself differentiates on any device through its dense reference, which is
    what dynamo traces into the joint graph and what hyper_ac's eager compiler
    (and the eager reference) run; only the entry check is lifted, for this test."""
    import torch.nn.attention.flex_attention as flex

    monkeypatch.setattr(flex, "_validate_device", lambda *args: None)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_selective_saves_flex_attention(flex_on_cpu):
    torch.manual_seed(0)
    model, x = FlexModel(), torch.randn(2, 8, 16)
    gm = capture_joint(model, x).graph_module
    flex = [n for n in gm.graph.nodes if n.op == "call_function"
            and op_facts.target_name(n) == "higher_order::flex_attention"]
    assert len(flex) == 2  # one per block, in the joint graph the pass plans

    plan = hyper_ac.plan(gm, {"ac_mode": "selective"}, model=model, detail=True).plan  # reasons: full form
    recomputed = {d["of"] for d in plan["duplicates"]}
    for node in flex:
        assert (plan["policies"][node.name], plan["reasons"].get(node.name)) == ("MUST_SAVE", "op-table")
        assert node.name not in recomputed
        # the attention output (the op's first result, a getitem of its tuple) is what the backward reads
        out = [u for u in node.users if u.args[1] == 0]
        assert out and all(u.name in plan["saved"] and u.name not in recomputed for u in out)
    assert recomputed  # the MLPs' activations are replayed: selective did plan the blocks

    reference = copy.deepcopy(model)
    reference(x).backward()
    trained = copy.deepcopy(model)
    results = []
    step = torch.compile(trained, fullgraph=True,
                         backend=hyper_ac.backend({"ac_mode": "selective"}, model=trained, on_result=results.append))
    step(x).backward()
    assert results and results[0].plan["duplicates"]  # the rewritten graph ran, not stock's
    for (name, want), got in zip(reference.named_parameters(), trained.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0, msg=f"gradient of {name}")
