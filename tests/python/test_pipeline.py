"""GraphPass / PassPipeline and the ordering contract, with a toy parameter-sharding pass.

The contract (docs/architecture.md, "Passes and their order"): activation
checkpointing runs before any pass that shards parameters or splits stages,
so its replays read the unsharded placeholders and the sharding pass then
rewrites the reads of originals and replays alike.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as pytree
from torch import fx

import hyper_ac
from hyper_ac import models
from hyper_ac.frontend.capture import capture_joint
from hyper_ac.planning.pipeline import GraphPass, PassOrderError, PassPipeline, mark_placeholders_rewritten


class ToyShardPass(GraphPass):
    """Pretends each 2-d+ parameter is sharded in two along dim 0: every read
    goes through an all_gather-like ``cat(slice, slice)`` placed right before the
    reader, in the reader's phase (a backward read gathers again, as FSDP does)."""

    name = "toy_shard"
    shards_parameters = True

    def run(self, gm: fx.GraphModule, config=None, **kwargs) -> fx.GraphModule:
        graph = gm.graph
        params = [n for n in graph.nodes if n.op == "placeholder" and n.meta.get("ac_role") == "parameter"]
        for p in params:
            val = p.meta.get("val")
            if val is None or val.dim() < 2 or val.shape[0] < 2:
                continue
            p.meta["sharded"] = True
            rows = int(val.shape[0])
            for user in [u for u in p.users if u.op != "output"]:
                with graph.inserting_before(user):
                    lo = graph.call_function(torch.ops.aten.slice.Tensor, (p, 0, 0, rows // 2))
                    hi = graph.call_function(torch.ops.aten.slice.Tensor, (p, 0, rows // 2, rows))
                    gathered = graph.call_function(torch.ops.aten.cat.default, ([lo, hi], 0))
                for n in (lo, hi, gathered):
                    n.meta["autograd_backward"] = user.meta.get("autograd_backward", False)
                    n.meta["toy_gather"] = True
                user.replace_input_with(p, gathered)
        graph.lint()
        gm.recompile()
        mark_placeholders_rewritten(gm, self.name)
        return gm


class CountNodes(GraphPass):
    """A pass that changes nothing: fits anywhere in a pipeline."""

    name = "count_nodes"

    def __init__(self):
        self.seen = []

    def run(self, gm, config=None, **kwargs):
        self.seen.append(len(gm.graph.nodes))
        return gm


@pytest.fixture(scope="module")
def captured():
    model = models.build("transformer")
    return capture_joint(model, **models.example_batch("transformer"))


def _inputs(gm: fx.GraphModule) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta["val"]
        shape = [int(d) for d in val.shape]
        out.append(torch.randn(shape, generator=g, dtype=val.dtype) if val.dtype.is_floating_point
                   else torch.zeros(shape, dtype=val.dtype))
    return out


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))


def test_checkpointing_then_sharding_gives_the_same_loss_and_gradients(captured):
    reference = _copy(captured.graph_module)
    gm = _copy(captured.graph_module)
    ac, count = hyper_ac.ActivationCheckpointPass({"ac_mode": "full"}), CountNodes()
    pipeline = PassPipeline([count, ac, ToyShardPass(), count])
    assert isinstance(ac, hyper_ac.GraphPass) and ac.needs_unsharded_placeholders
    out = pipeline.run(gm, model=captured.model)
    assert out is gm and ac.result.stats["nodes_duplicated"] > 0
    assert count.seen[1] > count.seen[0]  # the pipeline handed each pass the previous one's module
    # replays were inserted before the gathers existed, and now gather again in the backward
    replays = [n for n in gm.graph.nodes if n.meta.get("ac_recomputed")]
    assert any(i.meta.get("toy_gather") and i.meta["autograd_backward"] for n in replays for i in n.all_input_nodes)
    assert not any(n.meta.get("ac_recomputed") for n in gm.graph.nodes if n.meta.get("toy_gather"))
    args = _inputs(reference)
    with torch.no_grad():
        want = pytree.tree_leaves(fx.Interpreter(reference).run(*args))
        got = pytree.tree_leaves(fx.Interpreter(gm).run(*args))
    assert len(want) == len(got) > 1  # the loss and the gradients
    assert sum(isinstance(a, torch.Tensor) for a in want) > 1
    for a, b in zip(want, got):
        assert (a is None and b is None) or torch.equal(a, b)


def test_checkpointing_after_sharding_is_rejected(captured):
    with pytest.raises(PassOrderError, match=r"'activation_checkpoint'.*after 'toy_shard', which shards parameters"):
        PassPipeline([ToyShardPass(), CountNodes(), hyper_ac.ActivationCheckpointPass({"ac_mode": "full"})])

    class SplitStages(GraphPass):
        name = "split_stages"
        splits_stages = True

    with pytest.raises(PassOrderError, match="splits pipeline stages"):
        PassPipeline([SplitStages(), hyper_ac.ActivationCheckpointPass({"ac_mode": "full"})])
    # a nested pipeline carries its passes' declarations
    inner = PassPipeline([ToyShardPass()])
    with pytest.raises(PassOrderError, match="after 'pipeline'"):
        PassPipeline([inner, hyper_ac.ActivationCheckpointPass({"ac_mode": "full"})])
    # outside a pipeline, the graph itself records that a sharding pass ran
    gm = ToyShardPass().run(_copy(captured.graph_module))
    with pytest.raises(PassOrderError, match="'toy_shard'"):
        hyper_ac.ActivationCheckpointPass({"ac_mode": "full"}).run(gm, model=captured.model)


def test_pipeline_checks_its_passes(captured):
    with pytest.raises(TypeError, match="no run"):
        PassPipeline([object()])

    class ReturnsNothing(GraphPass):
        name = "returns_nothing"

        def run(self, gm, config=None, **kwargs):
            return None

    with pytest.raises(TypeError, match="'returns_nothing' returned NoneType"):
        PassPipeline([ReturnsNothing()]).run(_copy(captured.graph_module))
    with pytest.raises(NotImplementedError):
        GraphPass().run(_copy(captured.graph_module))
    assert "toy_shard" in repr(PassPipeline([CountNodes(), ToyShardPass()]))
