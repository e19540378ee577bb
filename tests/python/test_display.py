"""The Jupyter view shows what the pass left on the nodes: table, pictures, memory and frontier plots."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET

import pytest
from torch import fx

import hyper_ac
from hyper_ac import display, models
from hyper_ac.display import svg as display_svg
from hyper_ac.frontend.capture import capture_joint

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def captured():
    model = models.build("transformer")
    return capture_joint(model, **models.example_batch("transformer"))


@pytest.fixture(scope="module")
def captured_activation_heavy():
    # At the default batch the step peaks in the backward with every gradient
    # alive, which no plan lowers; here activations decide the peak.
    model = models.build("transformer")
    return capture_joint(model, **models.example_batch("transformer", batch=4, seq=32))


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))


@pytest.fixture(scope="module")
def rewritten(captured):
    gm = _copy(captured.graph_module)
    ac = hyper_ac.ActivationCheckpointPass({"ac_mode": "selective"})
    ac.run(gm, model=captured.model)
    return gm, ac.result


def _svg_nodes(svg: str) -> dict[str, dict]:
    """Graphviz SVG → {node name: {"fills": [...], "dashed": bool, "text": str}}."""
    root = ET.fromstring(svg)
    out = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "node":
            continue
        name = g.find(f"{SVG}title").text
        shapes = [e for e in g.iter() if e.tag in (f"{SVG}path", f"{SVG}polygon", f"{SVG}ellipse")]
        out[name] = {
            "fills": [e.get("fill") for e in shapes],
            "dashed": any(e.get("stroke-dasharray") for e in shapes),
            "strokes": [e.get("stroke") for e in shapes],
            "text": " ".join(t.text or "" for t in g.iter(f"{SVG}text")),
        }
    return out


def _svg_edges(svg: str) -> list[tuple[str, str, str]]:
    root = ET.fromstring(svg)
    edges = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "edge":
            src, dst = g.find(f"{SVG}title").text.split("->")
            edges.append((src, dst, next(g.iter(f"{SVG}path")).get("stroke")))
    return edges


def test_rewritten_graph_table_shows_policies_and_duplicates(rewritten):
    gm, result = rewritten
    view = display.show(gm)
    counts = view.counts()
    assert counts["duplicate"] == result.stats["nodes_duplicated"]
    assert counts["MUST_SAVE"] > 0
    page = view._repr_html_()
    assert page.count("<tr") == len(view.rows) + 1
    assert "MUST_SAVE" in page and display.COLOURS["duplicate"] in page  # duplicates are coloured
    assert "<svg" in page and "whole graph" in page  # the collapsed picture above the table
    forward = display.show(gm, phase="forward")
    assert all(r["phase"] == "F" for r in forward.rows)
    assert "layers.0" in repr(forward)


def test_unit_picture_colours_each_node_by_its_policy(rewritten):
    gm, _ = rewritten
    pic = display.draw(gm, "layers.0.mlp")
    drawn = _svg_nodes(pic.svg)
    unit = [n for n in gm.graph.nodes if any(f.startswith("layers.0.mlp") for f, _ in n.meta.get("ac_module_stack", []))]
    assert unit and pic.nodes == len(unit)
    seen = set()
    for node in unit:
        key = display_svg.policy_key(node)
        seen.add(key)
        box = drawn[node.name]
        assert display.COLOURS[key] in box["fills"], (node.name, key, box)
        if key == "duplicate":
            assert box["dashed"] and f"copy of {node.meta['ac_recomputed_from']}" in box["text"]
        else:
            assert not box["dashed"]
    assert {"MUST_SAVE", "PREFER_RECOMPUTE", "duplicate", "untagged"} <= seen
    # saved edges: exactly the forward values (not inputs) read by backward nodes of the unit, drawn red
    expected = {(a.name, n.name) for n in unit for a in n.all_input_nodes
                if not a.meta["autograd_backward"] and n.meta["autograd_backward"] and a.op != "placeholder"}
    red = {(s, d) for s, d, colour in _svg_edges(pic.svg) if colour == display_svg.SAVED_EDGE}
    assert expected and red == expected and pic.saved_edges == len(expected)
    for producer, _ in expected:  # a saved value's own box is outlined red
        assert display_svg.SAVED_EDGE in drawn[producer]["strokes"]
    assert "saved: forward value read by the backward" in pic.svg  # the legend
    # forward alone: no backward drawn, yet the legend counts the unit's values the backward reads
    forward = display.draw(gm, "layers.0.mlp", phase="forward")
    values = [n for n in unit if not n.meta["autograd_backward"] and any(u.meta["autograd_backward"] for u in n.users)]
    assert values
    assert forward.saved_edges == 0 and f"({len(values)} values)" in forward.svg
    assert all(n.meta["autograd_backward"] is False for n in unit if n.name in _svg_nodes(forward.svg))


def test_collapsed_picture_counts_per_module(rewritten):
    gm, result = rewritten
    pic = display.draw(gm)
    dups = sum(1 for n in gm.graph.nodes if n.meta.get("ac_recomputed_from") and display_svg.unit_of(n) == "layers.0")
    assert dups > 0
    text = re.sub(r"<[^>]+>", " ", pic.svg)
    assert "layers.0" in text and "layers.1" in text
    # layers.0's backward box shows its duplicate count in the duplicate colour
    assert re.search(rf'fill="{display.COLOURS["duplicate"]}".*?>\s*{dups}\s*<', pic.svg, re.S)
    inner = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    saved = sum(1 for n in inner if n.meta["autograd_backward"] for a in n.all_input_nodes
                if a in set(inner) and not a.meta["autograd_backward"])
    assert pic.saved_edges == saved > 0
    assert pic.counts["duplicate"] == result.stats["nodes_duplicated"]


def test_missing_graphviz_is_a_clear_error(rewritten, monkeypatch):
    gm, _ = rewritten
    monkeypatch.setattr(display_svg.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="apt-get install graphviz"):
        display.draw(gm, "layers.0").svg
    page = display.show(gm)._repr_html_()  # the table still shows, with the reason
    assert "No picture" in page and "<table>" in page


def test_memory_timeline_before_and_after(captured_activation_heavy):
    captured = captured_activation_heavy
    tl = display.memory(captured, {"ac_mode": "selective"})
    assert not any("recompute" in n.meta for n in captured.graph_module.graph.nodes)  # planned on a copy
    lines = [line for line in tl.figure().axes[0].get_lines() if not line.get_label().startswith("_")]
    assert len(lines) == 2
    assert lines[0].get_label().startswith("before") and lines[1].get_label().startswith("after (selective)")
    assert len(lines[1].get_xdata()) == len(tl.after) > len(tl.before)  # duplicates add steps
    assert tl.source.startswith("simulated by the core")
    assert tl.peak_before == tl.stats["simulated_activation_peak_before"]
    assert tl.peak_after == tl.stats["simulated_activation_peak_after"]
    assert tl.peak_after < tl.peak_before
    page = tl._repr_html_()
    assert "<svg" in page and "saved for backward" in page and "simulated by the core" in page


def test_simulated_timeline_matches_a_measured_run(captured):
    # The check on the core's timeline: both graphs run once on CPU under hyper_ac.memory.
    simulated = display.memory(captured, {"ac_mode": "selective"})
    measured = display.memory(captured, {"ac_mode": "selective"}, measure=True)
    assert measured.source.startswith("measured")
    assert measured.stats == simulated.stats
    assert measured.peak_before == simulated.peak_before and measured.peak_after == simulated.peak_after
    # the same steps, once the simulator's placeholder steps (nothing runs) are left out; the figures per
    # step may differ where a step runs an op torch's schema calls allocating but that returns a view
    # (aten::_unsafe_view), which the simulator counts as an allocation: the peaks above agree exactly
    placeholders = sum(n.op == "placeholder" for n in captured.graph_module.graph.nodes)
    assert simulated.before[:placeholders] == [0] * placeholders
    assert len(simulated.before) - placeholders == len(measured.before)
    assert len(simulated.after) - placeholders == len(measured.after)
    assert simulated.boundary_before - placeholders == measured.boundary_before
    assert simulated.boundary_after - placeholders == measured.boundary_after
    same = sum(a == b for a, b in zip(simulated.before[placeholders:], measured.before))
    assert same >= 0.9 * len(measured.before)


def test_memory_refuses_a_rewritten_graph(rewritten):
    with pytest.raises(ValueError, match="already rewritten"):
        display.memory(rewritten[0], {"ac_mode": "selective"})


def test_frontier_plots_inline(captured):
    points = hyper_ac.frontier(captured.graph_module, {"ac_mode": "auto"}, model=captured.model)
    assert isinstance(points, display.Frontier)  # the frontier's list plots itself inline
    assert display.frontier is hyper_ac.frontier
    assert points._repr_html_().count("<tr>") == len(points) + 1
    frontier = display.Frontier(list(points))  # points read back as a plain list plot again
    assert frontier == points
    lines = [line for line in frontier.figure().axes[0].get_lines() if not line.get_label().startswith("_")]
    assert [len(line.get_xdata()) for line in lines] == [len(points), len(points)]
    assert frontier._repr_html_().count("<tr>") == len(points) + 1
    with pytest.raises(TypeError, match="Frontier"):
        display.Frontier("points")
    with pytest.raises(ValueError, match="lack"):
        display.Frontier([{"lambda": 1.0}])
    with pytest.raises(TypeError, match=r"display\.Frontier\(points\)"):
        hyper_ac.frontier(list(points))
    with pytest.raises(AttributeError, match="hyper_ac.frontier"):
        hyper_ac.pareto  # the old name says where it went


def test_bad_arguments(rewritten):
    with pytest.raises(TypeError, match="GraphModule"):
        display.show(42)
    gm, _ = rewritten
    with pytest.raises(ValueError, match="phase"):
        display.show(gm, phase="sideways")
    with pytest.raises(ValueError, match="limit"):
        display.show(gm, limit=0)
    with pytest.raises(ValueError, match=r"no node belongs to unit 'layers\.9'.*layers\.0"):
        display.draw(gm, "layers.9")
    with pytest.raises(ValueError, match="max_nodes"):
        display.draw(gm, "layers.0", max_nodes=10)
    view = display.show(gm, limit=3, picture=False)
    assert len(view.rows) == 3 and view.truncated > 0 and "<svg" not in view._repr_html_()
