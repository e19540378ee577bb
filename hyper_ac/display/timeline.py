"""Memory over time for a plan, and the frontier, as inline figures.

``memory(captured, config)`` plans the captured graph (left as it is) and
shows live activation bytes per step before vs after the rewrite, next to the
plan's stats. The figures are the core's simulated timeline
(``hyper_ac.plan(..., timeline=True)``: ``SimulateOptions::record_timeline``
over the original and the rewritten schedule). ``measure=True`` instead
rewrites a copy and runs both graphs once on CPU under :mod:`hyper_ac.memory`,
plotting the measured live bytes per node: the check that the simulation is
exact (tests/python/test_display.py). Decides nothing: every figure comes from
the core's plan or from a measurement.
"""

from __future__ import annotations

import copy
import html
import io
import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import fx

from hyper_ac import fx_meta

__all__ = ["Frontier", "MemoryTimeline", "frontier", "memory"]

def _unit(peak: float) -> tuple[float, str]:
    """A divisor and its name so the largest figure reads between 1 and 1024."""
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if peak >= scale:
            return scale, name
    return 1, "bytes"


def _fmt(n: Any) -> str:
    from hyper_ac import _core

    return _core.format_bytes(int(n))


def _figure_svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: smaller, searchable
        fig.savefig(buf, format="svg", bbox_inches="tight")
    svg = buf.getvalue()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _new_figure(width: float, height: float) -> Any:
    # matplotlib.figure.Figure needs no pyplot backend, so the user's backend choice stays untouched.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


class MemoryTimeline:
    """Live activation bytes per step before and after a plan, with the plan's stats.

    ``before``/``after``: bytes per step; ``boundary_before``/``boundary_after``:
    index of the last forward step; ``source``: where the figures come from.
    """

    def __init__(self, before: Sequence[int], after: Sequence[int], *, mode: str, stats: Mapping[str, Any],
                 source: str, boundary_before: int = -1, boundary_after: int = -1) -> None:
        self.before = list(before)
        self.after = list(after)
        self.mode = mode
        self.stats = dict(stats)
        self.source = source
        self.boundary_before = boundary_before
        self.boundary_after = boundary_after

    @property
    def peak_before(self) -> int:
        return max(self.before, default=0)

    @property
    def peak_after(self) -> int:
        return max(self.after, default=0)

    def figure(self) -> Any:
        """A matplotlib Figure: one line before, one line after, forward/backward boundaries dotted."""
        fig = _new_figure(8, 3.6)
        ax = fig.add_subplot()
        scale, unit = _unit(max(self.peak_before, self.peak_after))
        for values, boundary, label, colour in (
            (self.before, self.boundary_before, "before (no checkpointing)", "#b2182b"),
            (self.after, self.boundary_after, f"after ({self.mode})", "#2166ac"),
        ):
            ax.plot(range(len(values)), [v / scale for v in values], color=colour, linewidth=1.4,
                    label=f"{label}: peak {_fmt(max(values, default=0))}")
            if boundary >= 0:
                ax.axvline(boundary, color=colour, linestyle=":", linewidth=1)
        ax.set_xlabel("step (node in schedule order; dotted: last forward step)")
        ax.set_ylabel(f"live activations ({unit})")
        ax.set_title(f"Memory over the training step — {self.mode}", fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=9)
        fig.tight_layout()
        return fig

    def rows(self) -> list[tuple[str, str, str]]:
        s = self.stats
        how = "simulated by the core" if self.source.startswith("simulated") else "measured"
        out = [(f"live activations, peak ({how})", _fmt(self.peak_before), _fmt(self.peak_after))]
        if "simulated_activation_peak_before" in s:
            out.append(("live activations, peak (simulated by the core)", _fmt(s["simulated_activation_peak_before"]),
                        _fmt(s["simulated_activation_peak_after"])))
        if "saved_bytes_before" in s:
            out.append(("saved for backward", _fmt(s["saved_bytes_before"]), _fmt(s["saved_bytes_after"])))
            out.append(("values saved for backward", str(s["saved_values_before"]), str(s["saved_values_after"])))
            out.append(("nodes recomputed (duplicated)", "0", str(s["nodes_duplicated"])))
            out.append(("recompute cost (roofline estimate)", "-",
                        f"{s['recompute_seconds'] * 1e6:.3g} µs ({s['recompute_flops']:.3g} FLOPs)"))
        return out

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><td style='text-align:left'>{html.escape(a)}</td><td>{html.escape(b)}</td>"
                       f"<td>{html.escape(c)}</td></tr>" for a, b, c in self.rows())
        table = (f"<table><tr><th></th><th>before</th><th>after ({html.escape(self.mode)})</th></tr>{body}</table>"
                 f"<p style='font-size:smaller'>Timeline: {html.escape(self.source)}</p>")
        return f"<div>{_figure_svg(self.figure())}{table}</div>"

    def __repr__(self) -> str:
        return "\n".join(f"{a:<48} {b:>12} -> {c}" for a, b, c in self.rows())


def _synthesize(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        shape = [int(d) for d in val.shape]
        if val.dtype.is_floating_point or val.dtype.is_complex:
            return torch.randn(shape, dtype=val.dtype)
        return torch.zeros(shape, dtype=val.dtype)
    if isinstance(val, torch.SymInt):
        return int(val)
    return val


def _inputs_for(gm: fx.GraphModule, captured: Any) -> list[Any]:
    given = getattr(captured, "example_inputs", None)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if given is not None and len(given) == len(placeholders):
        return list(given)
    out = []
    for node in placeholders:
        if fx_meta.VAL not in node.meta:
            raise ValueError(f"placeholder '{node.name}' has no meta[{fx_meta.VAL!r}] to build an input from; "
                             "pass inputs=[...] to hyper_ac.display.memory")
        out.append(_synthesize(node.meta[fx_meta.VAL]))
    return out


def _boundary(gm: fx.GraphModule) -> int:
    last = -1
    for i, node in enumerate(n for n in gm.graph.nodes if n.op != "placeholder"):
        if not fx_meta.is_backward(node):
            last = i
    return last


def _measure(gm: fx.GraphModule, inputs: list[Any]) -> list[int]:
    from hyper_ac import memory as hmem

    if not hmem.is_available():
        raise RuntimeError("hyper_ac.memory is not built, so the timeline cannot be measured; "
                           "rebuild hyper_ac against torch (pip install -e .)")
    with torch.no_grad():
        _, tracker = hmem.run_graph(gm, *inputs)
    return [rec.node_peak_bytes for rec in tracker.timeline if rec.op != "placeholder"]


def memory(captured: Any, config: Any, *, model: Any = None, inputs: Optional[list] = None,
           measure: bool = False) -> MemoryTimeline:
    """Plan ``config`` for ``captured`` (a CapturedGraph or an annotated joint GraphModule, left as it is)
    and return its memory timeline before vs after, with the plan's stats: the core's simulation, or with
    ``measure=True`` both graphs run once on CPU (``inputs``: their inputs, else synthesised)."""
    import hyper_ac  # the public names, which stay put when modules move

    gm = getattr(captured, "graph_module", captured)
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"memory() needs a CapturedGraph or a torch.fx.GraphModule, got {type(gm).__name__}")
    if model is None:
        model = getattr(captured, "model", None)
    cfg = hyper_ac.load_config(config)
    if any(fx_meta.is_duplicate(n) for n in gm.graph.nodes):
        raise ValueError("memory() needs the graph before the pass, but this one was already rewritten "
                         "(it has recomputed copies); pass the freshly captured graph")
    if not measure:
        from hyper_ac.planning import plan_doc

        result = hyper_ac.plan(gm, cfg, model, timeline=True)
        tl = plan_doc.timeline(result.plan)
        return MemoryTimeline(tl["before"], tl["after"], mode=cfg.mode, stats=result.stats,
                              source="simulated by the core (live activation bytes while each schedule step runs)",
                              boundary_before=tl["boundary_before"], boundary_after=tl["boundary_after"])
    from hyper_ac.lower.apply import apply_elided_copies

    with warnings.catch_warnings():  # torch's own deprecation noise from copying pytree specs
        warnings.simplefilter("ignore", FutureWarning)
        after = fx.GraphModule(gm, copy.deepcopy(gm.graph))
        unchanged = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    ac = hyper_ac.ActivationCheckpointPass(cfg)
    ac.run(after, model=model)
    # "Before" is the graph the core planned: no checkpointing, exact copies elided (docs/graph-format.md).
    if apply_elided_copies(unchanged, ac.result.plan):
        unchanged.recompile()
    args = list(inputs) if inputs is not None else _inputs_for(gm, captured)
    before = _measure(unchanged, args)
    after_values = _measure(after, args)
    return MemoryTimeline(before, after_values, mode=cfg.mode, stats=ac.result.stats,
                          source="measured: each graph run once on CPU under hyper_ac.memory (bytes alive "
                                 "while each node runs)",
                          boundary_before=_boundary(unchanged), boundary_after=_boundary(after))


class Frontier(list):
    """``hyper_ac.frontier``'s points (a list of dicts) that plot themselves in Jupyter.

    ``Frontier(points)`` wraps a list of such points (e.g. read back from JSON)."""

    def __init__(self, points: Sequence[Mapping[str, Any]] = ()):
        if not isinstance(points, (list, tuple)) or any(not isinstance(p, Mapping) for p in points):
            raise TypeError("Frontier() needs the list of points hyper_ac.frontier(...) returns")
        missing = [k for k in ("lambda", "recompute_seconds", "simulated_peak_bytes") if points and k not in points[0]]
        if missing:
            raise ValueError(f"Frontier() points lack {missing}; pass what hyper_ac.frontier(...) returns")
        super().__init__(points)

    def figure(self) -> Any:
        """A matplotlib Figure: saved-for-backward bytes and simulated peak against recompute cost."""
        fig = _new_figure(7, 3.8)
        ax = fig.add_subplot()
        scale, unit = _unit(max((p["simulated_peak_bytes"] for p in self), default=0))
        xs = [p["recompute_seconds"] * 1e6 for p in self]
        ax.plot(xs, [p["saved_bytes"] / scale for p in self], marker="o", color="#b2182b",
                label="saved for backward")
        ax.plot(xs, [p["simulated_peak_bytes"] / scale for p in self], marker="s", color="#2166ac",
                label="simulated peak (whole step)")
        for p, x in ((self[0], xs[0]), (self[-1], xs[-1])) if self else ():
            ax.annotate(f"λ={p['lambda']:.3g}", (x, p["saved_bytes"] / scale), textcoords="offset points",
                        xytext=(6, -12), ha="left", fontsize=8)
        ax.set_xlabel("recompute cost (µs, roofline estimate)")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title("Memory vs recompute cost across λ (frontier)", fontsize=11)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=9)
        fig.tight_layout()
        return fig

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{p['lambda']:.3g}</td><td>{html.escape(_fmt(p['saved_bytes']))}</td>"
            f"<td>{p['nodes_duplicated']}</td><td>{p['recompute_seconds'] * 1e6:.3g}</td>"
            f"<td>{html.escape(_fmt(p['simulated_peak_bytes']))}</td></tr>" for p in self)
        table = ("<table><tr><th>λ</th><th>saved for backward</th><th>nodes recomputed</th>"
                 f"<th>recompute (µs)</th><th>simulated peak</th></tr>{rows}</table>")
        return f"<div>{_figure_svg(self.figure())}{table}</div>"


def frontier(graph: Union[fx.GraphModule, str, Mapping[str, Any]], config: Any = None, *, model: Any = None,
             plot: Optional[str] = None) -> Frontier:
    """The saved-bytes / recompute-cost frontier across λ (min-cut modes); ``graph`` as for :func:`plan`.

    Returns a :class:`Frontier`: the list of points (dicts), which draws
    itself inline in Jupyter. ``plot``: also write it to this image file."""
    from hyper_ac.planning.passes import frontier_points

    if isinstance(graph, (list, tuple)):
        raise TypeError("hyper_ac.frontier(graph, config) plans a graph; to plot a list of points it returned, "
                        "wrap it: hyper_ac.display.Frontier(points)")
    points = frontier_points(graph, config, model=model)
    if plot:
        _plot_frontier(points, plot)
    return Frontier(points)


def _plot_frontier(points: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    xs = [p["recompute_seconds"] * 1e3 for p in points]
    ys = [p["simulated_peak_bytes"] / 2**20 for p in points]
    ax.plot(xs, ys, marker="o")
    ax.set_xlabel("recompute cost (ms, roofline)")
    ax.set_ylabel("simulated peak (MiB)")
    ax.set_title("hyper_ac frontier")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
