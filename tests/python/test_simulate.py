"""The core's memory simulator against the counting allocator (hyper_ac.memory)."""

from __future__ import annotations

import json

import pytest
import torch

from hyper_ac import _core, fx_meta, memory, models
from hyper_ac.frontend.capture import capture_joint
from hyper_ac.planning.config import load_config, op_policy_json
from hyper_ac.lower.checkpoint_pass import ActivationCheckpointPass

pytestmark = pytest.mark.skipif(not memory.is_available(), reason="hyper_ac._memory was not built")


def _joint_inputs(gm: torch.fx.GraphModule, example_inputs):
    """Primals from the captured example inputs, ones for the tangent of the loss."""
    primals = iter(example_inputs)
    args = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        if fx_meta.role(node) == "tangent":
            val = fx_meta.val(node)
            args.append(torch.ones(val.shape, dtype=val.dtype))
        else:
            args.append(next(primals))
    return args


@pytest.mark.parametrize("name", ["transformer", "gpt2", "llama"])
@pytest.mark.parametrize("mode", ["off", "full", "selective", "budget"])
def test_simulated_peak_matches_measured_within_10_percent(name, mode):
    model = models.build(name)
    batch = models.example_batch(name, batch=4, seq=32)
    captured = capture_joint(model, **batch)
    gm = captured.graph_module
    args = _joint_inputs(gm, captured.example_inputs)
    cfg = {"ac_mode": mode, "ac_memory_budget": 0.5} if mode == "budget" else {"ac_mode": mode}
    if mode == "off":
        graph_json = captured.to_json()
        stats = json.loads(_core.plan(graph_json, load_config({"ac_mode": "full"}).to_json(), op_policy_json()))["stats"]
        simulated = stats["simulated_activation_peak_before"]
    else:
        ac = ActivationCheckpointPass(cfg)
        with _quiet():  # an unmet budget warns; the figure compared is the plan's own
            ac.run(gm, model=model)
        simulated = ac.result.stats["simulated_activation_peak_after"]
    with torch.no_grad():
        _, tracker = memory.run_graph(gm, *args)
    measured = tracker.peak_bytes
    assert measured > 0 and simulated > 0
    assert abs(measured - simulated) <= 0.10 * measured, (
        f"{name}/{mode}: simulated {simulated} B vs measured {measured} B")


class _quiet:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)
