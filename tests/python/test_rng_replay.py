"""Random ops replayed from a saved generator state (issue 16).

Under ``rng: replay`` (the default) a random op inside a region is a recompute
candidate: the forward runs it under ``run_and_save_rng_state`` and its backward
duplicate under ``run_with_rng_state``. Every check compares against the
uncheckpointed eager step bit for bit: loss, gradients, and the user's CPU
generator after the forward and after the backward (the replay must neither
change the forward's draws nor advance the generator in the backward).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hyper_ac
from hyper_ac import models
from hyper_ac.frontend.capture import capture_joint

MODES = ["off", "full", "selective", "auto", "budget"]
SEED = 123


class RandomBlock(nn.Module):
    """Several random ops per block: SDPA dropout, nn.Dropout (native_dropout),
    bernoulli, rand_like, rand and randn used directly."""

    def __init__(self, dim: int = 32, heads: int = 2, p: float = 0.2):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(p)
        self.heads, self.p = heads, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        y = self.drop(torch.tanh(self.up(x)))
        y = y * torch.bernoulli(torch.sigmoid(y))
        y = y * (torch.rand_like(y) > 0.2)
        y = y + 0.1 * torch.rand(y.shape) * y
        y = y + 0.1 * torch.randn(y.shape) * y
        return x + self.down(y)


class RandomNet(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.gradient_checkpointing = True
        self.layers = nn.ModuleList([RandomBlock() for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return (x * x).mean()


def _model(name: str):
    """(model, batch): random-op outputs larger than the CPU state (5056 B), so they are replayed."""
    if name == "random_ops":
        torch.manual_seed(0)
        return RandomNet().train(), {"x": torch.randn(4, 32, 32)}
    model = models.build(name, dropout=0.1, max_seq=32)
    return model, models.example_batch(name, batch=4, seq=32)


def _loss(out):
    return out.loss if hasattr(out, "loss") else out


def _step(model, batch):
    """Seeded step: loss, grads, generator after the forward and after the backward."""
    torch.manual_seed(SEED)
    loss = _loss(model(**batch))
    after_forward = torch.get_rng_state()
    loss.backward()
    after_backward = torch.get_rng_state()
    inner = getattr(model, "_orig_mod", model)
    grads = {n: p.grad.clone() for n, p in inner.named_parameters() if p.grad is not None}
    return loss.detach(), grads, after_forward, after_backward


def _compiled(model, config, **kwargs):
    results: list = []
    compiled = torch.compile(model, backend=hyper_ac.backend(config, model=model, on_result=results.append, **kwargs),
                             fullgraph=True)
    return compiled, results


def _config(mode: str, rng: str) -> dict:
    config = {"ac_mode": mode, "ac_rng": rng}
    if mode == "budget":
        config["ac_memory_budget"] = 0.5
    return config


def _assert_same(reference, got):
    ref_loss, ref_grads, ref_fwd, ref_bwd = reference
    loss, grads, fwd, bwd = got
    assert torch.equal(ref_loss, loss), f"loss {loss.item()} != {ref_loss.item()}"
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert torch.equal(ref_grads[name], grads[name]), f"gradient of {name} differs"
    assert torch.equal(ref_fwd, fwd), "the forward drew differently from eager"
    assert torch.equal(ref_bwd, bwd), "the user's generator after the step differs from eager"
    assert torch.equal(fwd, bwd), "the backward advanced the user's generator"


_REFERENCES: dict = {}


def _reference(name):
    if name not in _REFERENCES:
        model, batch = _model(name)
        _REFERENCES[name] = (model, batch, _step(copy.deepcopy(model), batch))
    return _REFERENCES[name]


def _saved_random_outputs(result) -> list:
    return [s for s in result.saved if s.startswith(("native_dropout", "bernoulli", "rand"))
            and not s.endswith("_rng_state")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["random_ops", "gpt2", "bert", "t5"])
def test_replay_is_bitwise_and_keeps_the_generator(name, mode):
    model, batch, reference = _reference(name)
    trained = copy.deepcopy(model)
    compiled, results = _compiled(trained, _config(mode, "replay"))
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unmet budget warns; figures are checked elsewhere
        got = _step(compiled, batch)
    torch._dynamo.reset()
    _assert_same(reference, got)
    if mode in ("full", "selective"):
        stats = results[0].stats
        assert stats["rng_replayed"] > 0, stats
        assert stats["saved_rng"] == 0, "every random op here is larger than its state: none should be saved"
        assert not _saved_random_outputs(results[0]), results[0].saved
        replays = results[0].plan["rng_replays"]
        assert len(replays) == stats["rng_replayed"]
        assert all(r["state"] in results[0].saved for r in replays)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_rng_save_keeps_outputs_and_the_generator(mode):
    model, batch, reference = _reference("random_ops")
    compiled, results = _compiled(copy.deepcopy(model), _config(mode, "save"))
    torch._dynamo.reset()
    got = _step(compiled, batch)
    torch._dynamo.reset()
    _assert_same(reference, got)
    stats = results[0].stats
    assert stats["saved_rng"] > 0
    assert "rng_replays" not in results[0].plan and "rng_replayed" not in stats


def test_small_random_op_is_saved_not_replayed():
    # A dropout whose output (4x8 floats + mask) is smaller than the CPU
    # generator state costs less saved than replayed.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.2)

        def forward(self, x):
            return x + self.drop(torch.relu(self.proj(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gradient_checkpointing = True
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.sum()

    model = Net().train()
    cap = capture_joint(model, torch.randn(4, 8))
    result = hyper_ac.plan(cap.graph_module, {"ac_mode": "full"}, model=model, detail=True)
    reasons = result.plan["reasons"]
    dropouts = [n for n in reasons if n.startswith("native_dropout")]
    assert len(dropouts) == 2
    assert all((result.plan["policies"][n], reasons[n]) == ("MUST_SAVE", "rng") for n in dropouts)
    assert "rng_replays" not in result.plan and "rng-replay" not in reasons.values()


def test_state_bytes_in_graph_and_plan():
    model, batch = _model("random_ops")
    cap = capture_joint(model, **batch)
    doc = hyper_ac.frontend.serialize.serialize_graph(cap.graph_module)
    doc = doc if isinstance(doc, dict) else __import__("json").loads(doc)
    random_nodes = [n for n in doc["nodes"] if n.get("rng")]
    assert random_nodes
    state = torch.get_rng_state().numel()
    assert all(n.get("rng_state_bytes") == state for n in random_nodes), random_nodes
    replay = hyper_ac.plan(cap.graph_module, {"ac_mode": "full"}, model=model)
    save = hyper_ac.plan(cap.graph_module, {"ac_mode": "full", "ac_rng": "save"}, model=model)
    assert replay.stats["rng_state_bytes"] == state * replay.stats["rng_replayed"]
    assert replay.stats["rng_replayed"] == len(random_nodes)
    # Replaying saves the states instead of the outputs: far less.
    assert replay.stats["saved_bytes_after"] < save.stats["saved_bytes_after"]
    assert {r["of"] for r in replay.plan["rng_replays"]} == {n["name"] for n in random_nodes}


def test_explicit_generator_is_not_replayable():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gradient_checkpointing = True
            self.layers = nn.ModuleList([nn.Linear(64, 64) for _ in range(2)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x) * torch.rand(x.shape, generator=None)
            return x.sum()

    from hyper_ac.frontend.op_facts import rng_state_bytes

    gen = torch.Generator()
    g = torch.fx.Graph()
    node = g.call_function(torch.ops.aten.rand.generator, ([4, 4],), {"generator": gen, "device": torch.device("cpu")})
    assert rng_state_bytes(node) == 0
    node = g.call_function(torch.ops.aten.rand.default, ([4, 4],), {"device": torch.device("cpu")})
    assert rng_state_bytes(node) == torch.get_rng_state().numel()
    node = g.call_function(torch.ops.aten.rand.default, ([4, 4],), {})
    assert rng_state_bytes(node) == 0, "no device to read the state from"


def test_partition_leaves_no_stray_random_op_in_the_backward():
    # With random outputs saved (rng: save), the backward must hold no random
    # op: the extraction could carry a forward one over (its input is saved
    # for another reader), and DCE keeps random ops, so it would draw from the
    # user's generator on every backward.
    from hyper_ac.lower.partition import partition_joint
    from hyper_ac.lower.checkpoint_pass import ActivationCheckpointPass

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 64)
            self.drop = nn.Dropout(0.3)

        def forward(self, x):
            y = torch.relu(self.proj(x))
            return x + self.drop(y) * y  # y is read by the backward, and it is the dropout's input

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gradient_checkpointing = True
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.sum()

    torch.manual_seed(0)
    model = Net().train()
    for rng in ("save", "replay"):
        cap = capture_joint(model, torch.randn(8, 64))
        gm = cap.graph_module
        ActivationCheckpointPass({"ac_mode": "selective", "ac_rng": rng}).run(gm, model=model, recompile=False)
        _, bw = partition_joint(gm, None, num_fwd_outputs=cap.num_fwd_outputs)
        drawing = [n.name for n in bw.graph.nodes if n.op == "call_function"
                   and isinstance(n.target, torch._ops.OpOverload)
                   and torch.Tag.nondeterministic_seeded in n.target.tags]
        assert drawing == [], f"rng: {rng}: the backward draws random numbers in {drawing}"


def test_inductor_fallback_random_replays_the_forward_draws():
    # With fallback_random=True Inductor keeps aten random ops (run as eager
    # fallbacks), so the forward draws what eager draws and the replay draws
    # the same again: the generator matches eager's after each phase, and the
    # gradients match rng: save's (Inductor's float math differs from eager's,
    # so against eager only to rounding).
    import torch._inductor.config as inductor_config

    model, batch, reference = _reference("random_ops")
    got = {}
    with inductor_config.patch(fallback_random=True):
        for rng in ("replay", "save"):
            compiled, results = _compiled(copy.deepcopy(model), _config("full", rng), compiler="inductor")
            torch._dynamo.reset()
            got[rng] = _step(compiled, batch)
            torch._dynamo.reset()
            if rng == "replay":
                assert results[0].stats["rng_replayed"] > 0
    for rng, (loss, grads, fwd, bwd) in got.items():
        assert torch.equal(fwd, reference[2]), f"rng: {rng}: the forward drew differently from eager"
        assert torch.equal(bwd, reference[3]), f"rng: {rng}: the backward advanced the user's generator"
        torch.testing.assert_close(loss, reference[0], rtol=1e-5, atol=1e-6)
        for name in reference[1]:
            torch.testing.assert_close(grads[name], reference[1][name], rtol=1e-4, atol=1e-5)
    for name in got["save"][1]:
        torch.testing.assert_close(got["replay"][1][name], got["save"][1][name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["random_ops", "gpt2"])
def test_output_recompute_replays_every_copy_bitwise(name):
    # Chained replays may copy a random op once per replay segment: every copy
    # replays the one saved state, so the draws and the generator stay eager's.
    model, batch, reference = _reference(name)
    config = {"activation_checkpoint": {"mode": "full", "regions": {"output_recompute": True}}}
    compiled, results = _compiled(copy.deepcopy(model), config)
    torch._dynamo.reset()
    got = _step(compiled, batch)
    torch._dynamo.reset()
    _assert_same(reference, got)
    plan = results[0].plan
    replayed = [r["of"] for r in plan["rng_replays"]]
    assert replayed and len(replayed) == len(set(replayed)), "one saved state per random op"
    assert results[0].stats["rng_state_bytes"] == sum(r["state_bytes"] for r in plan["rng_replays"])
