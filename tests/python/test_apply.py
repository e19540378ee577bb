"""apply_plan on real models: elided copies (docs/graph-format.md, "Elided copies").

A decomposed attention clones its probabilities (dropout with p = 0), where
eager PyTorch aliases them; the core elides such exact copies at load and the
plan tells apply to do the same to the FX graph. Checked against the
uncheckpointed run (bitwise) and against eager per-layer checkpointing
(measured peak), which never makes that copy.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import hyper_ac
import hyper_ac.memory
from hyper_ac import models


class _Checkpointed(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def _step(model, batch):
    out = model(**batch)
    loss = out.loss if hasattr(out, "loss") else out
    loss.backward()
    return loss.detach()


def _grads(model):
    return {n.replace(".inner.", "."): p.grad for n, p in model.named_parameters() if p.grad is not None}


def _measured(model, batch, backend=None):
    """(peak bytes of the second step, loss, gradients); compiled when ``backend`` is given."""
    torch._dynamo.reset()
    run = torch.compile(model, backend=backend, fullgraph=True) if backend is not None else model
    _step(run, batch)  # compile and warm up
    model.zero_grad(set_to_none=True)
    with hyper_ac.memory.track() as tracked:
        loss = _step(run, batch)
    torch._dynamo.reset()
    return tracked.peak_bytes, loss, _grads(model)


@pytest.mark.parametrize("name", ["transformer", "gpt2"])
def test_elided_copies_are_applied_and_gradients_stay_bitwise(name):
    model = models.build(name, 2)
    batch = models.example_batch(name, batch=2, seq=16)
    reference = copy.deepcopy(model)
    ref_loss = _step(reference, batch)
    results: list = []
    backend = hyper_ac.backend({"ac_mode": "full"}, model=model, on_result=results.append)
    torch._dynamo.reset()
    loss = _step(torch.compile(model, backend=backend, fullgraph=True), batch)
    torch._dynamo.reset()
    assert torch.equal(loss, ref_loss)
    for n, p in reference.named_parameters():
        assert torch.equal(model.get_parameter(n).grad, p.grad), n
    # One dropout(p = 0) clone of the attention probabilities per layer.
    elided = [e for r in results for e in r.plan.get("elided_copies", [])]
    assert len(elided) >= 2, elided


def test_apply_plan_erases_elided_copies_and_their_readers_read_the_source():
    from hyper_ac.lower.apply import apply_plan
    from hyper_ac.frontend.capture import capture_joint

    model = models.build("transformer", 2)
    ids = models.example_batch("transformer", batch=2, seq=16)["input_ids"]
    gm = capture_joint(model, ids, ids).graph_module
    result = hyper_ac.plan(gm, {"ac_mode": "full"}, model)
    # Per layer: the attention probabilities' and the feed-forward output's dropout (p = 0).
    elided = result.plan.get("elided_copies", [])
    assert len(elided) == 4, elided
    by_name = {n.name: n for n in gm.graph.nodes}
    readers = {e["node"]: {u.name for u in by_name[e["node"]].users} for e in elided}
    for e in elided:
        assert by_name[e["node"]].target is torch.ops.aten.clone.default
    apply_plan(gm, result.plan)
    by_name = {n.name: n for n in gm.graph.nodes}
    for e in elided:
        assert e["node"] not in by_name, f"{e['node']} is still in the rewritten graph"
        source = by_name[e["source"]]
        for reader in readers[e["node"]] & by_name.keys():
            assert source in by_name[reader].all_input_nodes, f"{reader} does not read {e['source']}"
    # Applying the same plan twice names what is missing.
    with pytest.raises(ValueError, match="elides copy .* applied twice"):
        apply_plan(gm, result.plan)


@pytest.mark.skipif(not hyper_ac.memory.is_available(), reason="memory tracking extension not built")
def test_full_peak_is_no_more_than_eager_per_layer_checkpointing():
    """Issue 12: with the clone elided, a replayed layer holds what eager's replay holds."""
    model = models.build("transformer", 3, dim=64, heads=4)
    batch = models.example_batch("transformer", batch=4, seq=64)
    wrapped = copy.deepcopy(model)
    for i, layer in enumerate(wrapped.layers):
        wrapped.layers[i] = _Checkpointed(layer)
    eager_peak, eager_loss, eager_grads = _measured(wrapped, batch)
    full = copy.deepcopy(model)
    peak, loss, grads = _measured(full, batch, hyper_ac.backend({"ac_mode": "full"}, model=full))
    assert torch.equal(loss, eager_loss)
    assert grads.keys() == eager_grads.keys()
    for n in grads:
        assert torch.equal(grads[n], eager_grads[n]), n
    assert peak <= eager_peak * 1.01, f"full {peak} B vs eager per-layer checkpoint {eager_peak} B"


@pytest.mark.parametrize("what", ["insertion point", "redirect"])
def test_apply_plan_rejects_a_plan_out_of_order(what):
    """A duplicate placed before one of its inputs, or a redirect to a copy made after its
    reader, is refused: by the full lint when apply recompiles, and by apply's check of the
    nodes it changed when the partition follows (``recompile=False``), naming the node."""
    import copy as copy_module

    from hyper_ac.lower.apply import apply_plan
    from hyper_ac.frontend.capture import capture_joint

    model = models.build("transformer", 2)
    ids = models.example_batch("transformer", batch=2, seq=16)["input_ids"]
    gm = capture_joint(model, ids, ids).graph_module
    plan = copy_module.deepcopy(dict(hyper_ac.plan(gm, {"ac_mode": "full"}, model).plan))
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    by_name = {n.name: n for n in gm.graph.nodes}
    if what == "insertion point":
        # The first duplicate with an input node, now inserted right before that input.
        entry = next(e for e in plan["duplicates"] if by_name[e["of"]].all_input_nodes
                     and by_name[e["of"]].all_input_nodes[0].op != "placeholder")
        entry["before"] = by_name[entry["of"]].all_input_nodes[0].name
        expected = f"duplicate of '{entry['of']}'"
    else:
        # A redirect whose reader comes before the copy's insertion point, made to read that copy.
        redirect = plan["redirects"][0]
        copy_index = redirect.get("duplicate", -1)
        if copy_index is None or copy_index < 0:  # the latest copy of the input
            copy_index = max(i for i, e in enumerate(plan["duplicates"]) if e["of"] == redirect["input"])
        entry = plan["duplicates"][copy_index]
        original = by_name[redirect["input"]]
        reader = min((n for n in by_name.values() if n.meta.get("autograd_backward") and n.op == "call_function"
                      and original not in n.all_input_nodes
                      and order[original.name] < order[n.name] < order[entry["before"]]),
                     key=lambda n: order[n.name], default=None)
        assert reader is not None
        # Give the reader an input it can be redirected from: the redirected input itself.
        reader.args = (*reader.args, original)
        plan["redirects"] = [*plan["redirects"], {**redirect, "node": reader.name, "duplicate": copy_index}]
        expected = f"'{reader.name}'"
    for recompile in (True, False):
        g = copy_module.deepcopy(gm) if recompile else gm
        if recompile:
            with pytest.raises(RuntimeError, match="used before it has been defined"):
                apply_plan(g, plan)
        else:
            with pytest.raises(ValueError, match=f"plan leaves .*{expected}.*comes after it"):
                apply_plan(g, plan, recompile=False)
