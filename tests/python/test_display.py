"""The Jupyter view shows what the pass left on the nodes."""

from __future__ import annotations

import pytest

from hyper_ac import display, models
from hyper_ac.capture import capture_joint
from hyper_ac.passes import ActivationCheckpointPass


def test_rewritten_graph_table_shows_policies_and_duplicates():
    model = models.build("transformer")
    cap = capture_joint(model, **models.example_batch("transformer"))
    ac = ActivationCheckpointPass({"ac_mode": "selective"})
    ac.run(cap.graph_module, model=model)
    view = display.show(cap)
    counts = view.counts()
    assert counts["duplicate"] == ac.result.stats["nodes_duplicated"]
    assert counts["MUST_SAVE"] > 0
    page = view._repr_html_()
    assert page.count("<tr") == len(view.rows) + 1
    assert "MUST_SAVE" in page and "#ead1dc" in page  # duplicates are coloured
    forward = display.show(cap, phase="forward")
    assert all(r["phase"] == "F" for r in forward.rows)
    assert "layers.0" in repr(forward)


def test_bad_arguments():
    with pytest.raises(TypeError, match="GraphModule"):
        display.show(42)
    model = models.build("mlp")
    cap = capture_joint(model, **models.example_batch("mlp"))
    with pytest.raises(ValueError, match="phase"):
        display.show(cap, phase="sideways")
    with pytest.raises(ValueError, match="limit"):
        display.show(cap, limit=0)
    view = display.show(cap, limit=3)
    assert len(view.rows) == 3 and view.truncated > 0
