"""The frontier part's figures: ratios to stock, dominance, hyper_ac's frontier line,
the Markdown page, the CSV and one plot per model (pure but for the plot and the files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks.common import MiB
from benchmarks.frontier import HAC_SYSTEMS, byte_budget_fraction
from benchmarks.report import _md_table, _mib, _write_csv, provenance_header, save_plot

#: A point is weakly dominated by a hyper_ac point with peak <= PEAK_TOL x its peak and step <= STEP_TOL x its step.
PEAK_TOL = 1.01
STEP_TOL = 1.03
NOT_DOMINATED = "not dominated"
#: A byte budget is met when its measured peak lies within [1 - BUDGET_SLACK, 1] x its target
#: (the core's kBudgetMeasuredSlack); under the least peak any hyper_ac point measured it is unreachable.
BUDGET_SLACK = 0.01

#: The frontier table's columns, in order, with the type a run gives each value (read_frontier reads them back so).
FRONTIER_COLUMN_TYPES = {
    "model": str, "tier": str, "system": str, "point": str, "status": str, "error": str, "peak_bytes": int, "peak_ratio": float,
    "step_ratio": float, "paired_step_ratio_q1": float, "paired_step_ratio_q3": float, "paired_step_seconds": float,
    "paired_stock_step_seconds": float, "paired_rounds": int, "dominated_by": str, "grads_allclose": bool,
    "max_grad_diff": float, "compile_seconds": float, "wall_seconds": float, "nearest_over_bytes": int,
}
FRONTIER_COLUMNS = list(FRONTIER_COLUMN_TYPES)


def section(row: dict) -> str:
    """The page section a row belongs to: its model, or ``tier/model`` on a page of several
    tiers (``--tiers``), whose stock, ratios, dominance and budgets are each tier's own."""
    return f"{row['tier']}/{row['model']}" if row.get("tier") else row["model"]


def section_title(name: str) -> str:
    """A section's heading: the model, with its tier where it has one."""
    tier, _, model = name.rpartition("/")
    return f"{model} ({tier} tier)" if tier else model


def label(row: dict) -> str:
    return f"{row['system']} {row['point']}"


def _ok(row: dict) -> bool:
    return row.get("status") == "ok" and row.get("peak_ratio") is not None and row.get("step_ratio") is not None


def add_ratios(rows: list[dict]) -> None:
    """Per model: peak / stock's peak (stock = the first ``stock whole compile`` row) and the
    step ratio (the paired median of per-round ratios to stock)."""
    stock = {section(r): r for r in rows if r["system"] == "stock" and r["point"] == "whole compile"
             and r.get("status") == "ok"}
    for r in rows:
        base = stock.get(section(r))
        if r.get("status") != "ok" or base is None or not base.get("peak_bytes"):
            continue
        r["peak_ratio"] = r["peak_bytes"] / base["peak_bytes"]
        r["step_ratio"] = r.get("paired_step_ratio")


def dominates(hac: dict, other: dict, peak_tol: float = PEAK_TOL, step_tol: float = STEP_TOL) -> bool:
    """Weak dominance with tolerances: hyper_ac's peak <= peak_tol x and step <= step_tol x the other's."""
    return hac["peak_ratio"] <= peak_tol * other["peak_ratio"] and hac["step_ratio"] <= step_tol * other["step_ratio"]


def add_dominance(rows: list[dict]) -> None:
    """``dominated_by`` of every measured non-hyper_ac row: the dominating hyper_ac point of the
    same model with the least peak (ties: the faster), or ``not dominated``."""
    for r in rows:
        if r["system"] in HAC_SYSTEMS or not _ok(r):
            continue
        hac = [h for h in rows if section(h) == section(r) and h["system"] in HAC_SYSTEMS and _ok(h)
               and dominates(h, r)]
        best = min(hac, key=lambda h: (h["peak_ratio"], h["step_ratio"]), default=None)
        r["dominated_by"] = NOT_DOMINATED if best is None else label(best)


def frontier_line(rows: list[dict]) -> list[dict]:
    """The non-dominated points among ``rows`` (no other is at least as good on both peak and
    step and better on one), ordered by step ratio: hyper_ac's frontier."""
    pts = [r for r in rows if _ok(r)]

    def beaten(r: dict) -> bool:
        return any(o["peak_ratio"] <= r["peak_ratio"] and o["step_ratio"] <= r["step_ratio"]
                   and (o["peak_ratio"], o["step_ratio"]) != (r["peak_ratio"], r["step_ratio"]) for o in pts)

    line = [r for r in pts if not beaten(r)]
    unique = {(r["peak_ratio"], r["step_ratio"]): r for r in line}  # equal points: one stands for them
    return sorted(unique.values(), key=lambda r: (r["step_ratio"], r["peak_ratio"]))


def _least(rows: list[dict]) -> Optional[dict]:
    return min((r for r in rows if _ok(r)), key=lambda r: (r["peak_ratio"], r["step_ratio"]), default=None)


def least_memory_line(model: str, rows: list[dict]) -> str:
    """hyper_ac's least-memory point against every other system's least-memory point."""
    mine = [r for r in rows if section(r) == model]
    hac = _least([r for r in mine if r["system"] in HAC_SYSTEMS])
    if hac is None:
        peaks = [r for r in mine if r["system"] in HAC_SYSTEMS and r.get("status") == "ok"
                 and r.get("peak_ratio") is not None]
        if not peaks:
            return f"- {section_title(model)}: no hyper_ac point measured."
        least = min(peaks, key=lambda r: r["peak_ratio"])
        return (f"- {section_title(model)}: peaks only (no step timed: `--paired-rounds 0`); hyper_ac's least peak is "
                f"{label(least)}, {least['peak_ratio']:.3f}× stock's.")
    parts, below_all = [], True
    for system in dict.fromkeys(r["system"] for r in mine if r["system"] not in HAC_SYSTEMS):
        other = _least([r for r in mine if r["system"] == system])
        if other is None:
            continue
        below_all &= hac["peak_ratio"] <= other["peak_ratio"]
        parts.append(f"{label(other)} {other['peak_ratio']:.3f}× at {other['step_ratio']:.2f}× step")
    verdict = "at or below every other system's" if below_all else "**above** at least one other system's"
    return (f"- {section_title(model)}: hyper_ac's least memory, {label(hac)}, {hac['peak_ratio']:.3f}× stock's peak at "
            f"{hac['step_ratio']:.2f}× its step, is {verdict} least-memory point: " + "; ".join(parts) + ".")


def budget_rows(model: str, rows: list[dict]) -> list[dict]:
    """The model's whole-model byte budgets, highest fraction first, each with ``fraction``,
    ``of_target`` (measured peak / target), ``nearest_over_of_target`` (the least peak the budget's
    search measured over the target, / target; None: none recorded) and ``verdict``: ``met``
    (within BUDGET_SLACK under), ``under``, ``over`` or ``unreachable`` (target under the least
    peak any whole-model hyper_ac point measured, that peak within BUDGET_SLACK of it: the floor)."""
    mine = [r for r in rows if section(r) == model and r["system"] == "hyper_ac" and r.get("status") == "ok"
            and r.get("peak_ratio") is not None]
    if not mine:
        return []
    floor = min(r["peak_ratio"] for r in mine)
    out = []
    for r in mine:
        fraction = byte_budget_fraction(r["point"])
        if fraction is None:
            continue
        of_target = r["peak_ratio"] / fraction
        nearest = r.get("nearest_over_bytes")
        nearest_of_target = (None if nearest is None or not r.get("peak_bytes")
                             else nearest / (fraction * r["peak_bytes"] / r["peak_ratio"]))
        if fraction < floor and r["peak_ratio"] <= floor * (1.0 + BUDGET_SLACK):
            verdict = "unreachable"
        elif of_target > 1.0:
            verdict = "over"
        elif of_target >= 1.0 - BUDGET_SLACK:
            verdict = "met"
        else:
            verdict = "under"
        out.append({**r, "fraction": fraction, "of_target": of_target, "nearest_over_of_target": nearest_of_target,
                    "verdict": verdict})
    return sorted(out, key=lambda r: -r["fraction"])


def budget_section(model: str, rows: list[dict]) -> list[str]:
    """The byte budgets against their targets: a line (met, monotone, the floor against ``full``)
    and a table; nothing when the model has no byte-budget point."""
    budgets = budget_rows(model, rows)
    if not budgets:
        return []
    met = sum(b["verdict"] in ("met", "unreachable") for b in budgets)
    monotone = all(later["peak_ratio"] <= earlier["peak_ratio"] for earlier, later in zip(budgets, budgets[1:]))
    full = next((r for r in rows if section(r) == model and r["system"] == "hyper_ac" and r["point"] == "full"
                 and r.get("status") == "ok" and r.get("peak_ratio") is not None), None)
    least = min(b["peak_ratio"] for b in budgets)
    against_full = ("" if full is None else
                    f"; the least budget peak is {least / full['peak_ratio']:.3f}× `full`'s ({full['peak_ratio']:.3f}×)")
    line = (f"Byte budgets against their targets: {met} of {len(budgets)} met within {BUDGET_SLACK:.0%} under "
            f"their target or at the floor where unreachable; peaks {'monotone' if monotone else '**not monotone**'} "
            f"in the fraction{against_full}. Nearest plan over: the least peak the budget's search measured "
            f"over its target (the plan's `measured_nearest_over`); a miss with one a hair over is a step of the "
            f"plans.")
    table = _md_table(["budget", "peak ×stock", "peak ÷ target", "nearest plan over ÷ target", "verdict"],
                      [[r["point"], _ratio(r["peak_ratio"]), f"{r['of_target']:.3f}",
                        "–" if r["nearest_over_of_target"] is None else f"{r['nearest_over_of_target']:.4f}",
                        r["verdict"] if r["verdict"] in ("met", "unreachable") else f"**{r['verdict']}**"]
                       for r in budgets])
    return [line, "", table, ""]


def _ratio(x: Any, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}×"


def _step_cell(r: dict) -> str:
    if r.get("step_ratio") is None:
        return "–"
    q1, q3 = r.get("paired_step_ratio_q1"), r.get("paired_step_ratio_q3")
    return f"{r['step_ratio']:.3f}×" + ("" if q1 is None or q3 is None else f" [{q1:.2f}–{q3:.2f}]")


def model_table(model: str, rows: list[dict]) -> str:
    header = ["system", "point", "peak MiB", "peak ×stock", "step ×stock (paired) [q1–q3]", "dominated by",
              "grads allclose"]
    body = []
    for r in (r for r in rows if section(r) == model):
        if r.get("status") != "ok":
            body.append([r["system"], r["point"], f"error: {r.get('error', '')}".replace("|", "\\|"), "", "", "", ""])
            continue
        dominated = "–" if r["system"] in HAC_SYSTEMS else r.get("dominated_by") or "–"  # None: read back unset
        close = r.get("grads_allclose")
        body.append([r["system"], r["point"], _mib(r.get("peak_bytes")), _ratio(r.get("peak_ratio")), _step_cell(r),
                     dominated, "–" if close is None else ("yes" if close else f"**NO** (max diff {r.get('max_grad_diff', 0):.2g})")])
    return _md_table(header, body)


INTRO = (
    "Each point is one training step under Inductor (CPU): peak = exact tensor bytes allocated during the "
    "measured step (`hyper_ac.memory.track()`; parameters and inputs excluded, gradients included); step = "
    "the median over paired rounds of (point's step time / stock `torch.compile`'s in the same round), "
    "stock compiled afresh beside the point, order alternating. Systems: `stock` (`torch.compile`, whole model "
    "or each block compiled on its own); `torch_budget` (`torch._functorch.config.activation_memory_budget`, "
    "patched while compiling); `checkpoint_wrapper` (torchtitan's full AC: each block under "
    "`checkpoint_wrapper`, non-reentrant) and `sac` (torchtitan's op save-list via "
    "`create_selective_checkpoint_contexts`: mm/addmm/bmm, SDPA, flex attention, max, collectives saved, every "
    "second mm recomputed), each with whole-model or per-block compile; `hf_ckpt` "
    "(`gradient_checkpointing_enable(use_reentrant=False)`, whole compile); `hyper_ac` "
    "(`hyper_ac.backend(config, compiler=\"inductor\")`, whole model: byte budgets = f × stock's measured peak "
    "plus the parameter/input bytes the config's budget counts, `auto`, `auto (measured)` (`auto` under "
    "`hardware: measured`), `full`, `output_recompute`); "
    "`hyper_ac_block` (each block compiled with that backend under `ac_scope: unit_graph`; budgets are the "
    "config's fraction of the activation bytes the all-saved block keeps). Dominated by: the hyper_ac point (least peak first) with peak ≤ "
    f"{PEAK_TOL}× and step ≤ {STEP_TOL}× the row's. Gradients: allclose (rtol 1e-4, atol 1e-5) to stock "
    "(reported, not asserted).")


def plot_file(name: str) -> str:
    """The plot of one section (``frontier_<model>.png``, ``frontier_<tier>_<model>.png``)."""
    return f"frontier_{name.replace('/', '_')}.png"


def shape_line(meta: dict) -> str:
    """The shapes measured: one line, or one per tier on a page of several tiers."""
    def shape(spec: dict) -> str:
        return (f"{spec.get('layers')} layers, hidden {spec.get('hidden')}, seq {spec.get('seq')}, batch "
                f"{spec.get('batch')}, dropout {spec.get('dropout', 0.0)}")

    tail = (f"fp32, {meta.get('threads', '?')} torch thread(s), {meta.get('paired_rounds', '?')} paired rounds per "
            f"point. Models measured: {', '.join(meta.get('models_done', meta.get('models', [])))} (of "
            f"{', '.join(meta.get('models', []))} asked).")
    tiers = meta.get("tiers")
    if not tiers:
        return f"Models at {shape(meta.get('spec', {}))}, {tail}"
    return ("Tiers, one run: " + "; ".join(f"{name} ({', '.join(tier['models'])}) at {shape(tier['spec'])}"
                                           for name, tier in tiers.items()) + f"; {tail}")


def render_frontier_markdown(meta: dict, rows: list[dict]) -> str:
    out = ["# The memory/time frontier under Inductor", ""]
    out += provenance_header(meta) + [""]
    out += [shape_line(meta), "", INTRO, ""]
    models = list(dict.fromkeys(section(r) for r in rows))
    out += ["## Least memory per system", ""] + [least_memory_line(m, rows) for m in models] + [""]
    for m in models:
        mine = [r for r in rows if section(r) == m]
        others = [r for r in mine if r["system"] not in HAC_SYSTEMS and _ok(r)]
        beaten = sum(r.get("dominated_by") not in (None, NOT_DOMINATED) for r in others)
        line = frontier_line([r for r in mine if r["system"] in HAC_SYSTEMS])
        if not line:  # no step timed (--paired-rounds 0): no dominance, no frontier, no plot
            out += [f"## {section_title(m)}", "", "Peaks only: no point's step was timed.", "", model_table(m, rows), ""]
            out += budget_section(m, rows)
            continue
        plot = f" Plot: `{plot_file(m)}`." if plot_file(m) in meta.get("plots", []) else ""
        out += [f"## {section_title(m)}", "", f"{beaten} of {len(others)} other points dominated by a hyper_ac point. "
                f"hyper_ac's frontier: " + ", ".join(f"{label(r)} ({r['peak_ratio']:.3f}×, {r['step_ratio']:.3f}×)"
                                                     for r in line) + f".{plot}", "",
                model_table(m, rows), ""]
        out += budget_section(m, rows)
    return "\n".join(out)


def _short_name(point: str) -> str:
    return point.replace(" compile", "").replace("× stock peak", "×")


def plot_labels(rows: list[dict], to_points: Callable[[float, float], tuple]) -> list[tuple]:
    """Labels for one model's plot, as (x, y, text, (dx, dy) offset in points). Points of one
    system that land on one spot (within 2 points of each other: several budgets at the floor,
    say) share one label, their names joined by "/". Each label takes the first place whose text
    box (6-point text: about 3.3 points a character, 7 high) overlaps no earlier label: right of
    its point, else left, on its own line, else a line lower or higher at a time.
    ``to_points(x, y)`` maps data to the axes' points."""
    groups: list[list[dict]] = []
    for r in rows:
        px, py = to_points(r["step_ratio"], r["peak_bytes"] / MiB)
        for g in groups:
            gx, gy = to_points(g[0]["step_ratio"], g[0]["peak_bytes"] / MiB)
            if g[0]["system"] == r["system"] and abs(gx - px) <= 2 and abs(gy - py) <= 2:
                g.append(r)
                break
        else:
            groups.append([r])
    boxes: list[tuple] = []
    labels: list[tuple] = []
    rises = [2] + [2 + sign * 8 * k for k in range(1, 6) for sign in (-1, 1)]
    for g in groups:
        x, y = g[0]["step_ratio"], g[0]["peak_bytes"] / MiB
        text = " / ".join(dict.fromkeys(_short_name(r["point"]) for r in g))
        px, py = to_points(x, y)
        width = 3.3 * len(text)
        candidates = [(dx, dy) for dy in rises for dx in (3, -3 - width)]  # right of the point, else left
        for dx, dy in candidates:
            box = (px + dx, py + dy, px + dx + width, py + dy + 7)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in boxes):
                break
        else:
            dx, dy = candidates[0]
            box = (px + dx, py + dy, px + dx + width, py + dy + 7)
        boxes.append(box)
        labels.append((x, y, text, (dx, dy)))
    return labels


def render_frontier_plots(out_dir: Path, rows: list[dict], log: Callable[[str], None]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover
        log(f"  plots skipped: {exc}")
        return []
    markers = {"stock": "o", "torch_budget": "s", "checkpoint_wrapper": "^", "sac": "v", "hf_ckpt": "D",
               "hyper_ac": "*", "hyper_ac_block": "P"}
    written = []
    for m in dict.fromkeys(section(r) for r in rows):
        mine = [r for r in rows if section(r) == m and _ok(r)]
        if not mine:
            continue
        fig, ax = plt.subplots(figsize=(8, 5.5))
        for system in dict.fromkeys(r["system"] for r in mine):
            pts = [r for r in mine if r["system"] == system]
            ax.scatter([r["step_ratio"] for r in pts], [r["peak_bytes"] / MiB for r in pts], label=system,
                       marker=markers.get(system, "o"), s=90 if system in HAC_SYSTEMS else 50, zorder=3)
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()  # autoscaled to the points
        box = ax.get_window_extent()
        width, height = box.width / fig.dpi * 72, box.height / fig.dpi * 72

        def to_points(x: float, y: float, x0=x0, x1=x1, y0=y0, y1=y1, width=width, height=height) -> tuple:
            return (x - x0) / ((x1 - x0) or 1.0) * width, (y - y0) / ((y1 - y0) or 1.0) * height

        for x, y, text, offset in plot_labels(mine, to_points):
            ax.annotate(text, (x, y), fontsize=6, xytext=offset, textcoords="offset points")
        line = frontier_line([r for r in mine if r["system"] in HAC_SYSTEMS])
        ax.plot([r["step_ratio"] for r in line], [r["peak_bytes"] / MiB for r in line], "-", color="black", lw=1.2,
                label="hyper_ac frontier", zorder=2)
        ax.set_xlabel("step time / stock torch.compile (paired median)")
        ax.set_ylabel("peak memory of one step (MiB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"{section_title(m)}: memory vs step time under Inductor")
        save_plot(fig, out_dir / plot_file(m), written)
    return written


def write_frontier(out_dir: Path, meta: dict, rows: list[dict], plots: bool, log: Callable[[str], None]) -> None:
    """frontier.csv, the plots, results.md (header from ``meta``) and meta.json under ``out_dir``."""
    import json

    add_ratios(rows)
    add_dominance(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(out_dir / "frontier.csv", rows, FRONTIER_COLUMNS)
    meta["plots"] = render_frontier_plots(out_dir, rows, log) if plots else []
    (out_dir / "results.md").write_text(render_frontier_markdown(meta, rows))
    with open(out_dir / "meta.json", "w") as f:
        json.dump(meta, f, indent=1, default=str)


# --------------------------------------------------------------------------
# merging a run of some systems into an earlier page
# --------------------------------------------------------------------------

def read_frontier(out_dir: Path) -> tuple[dict, list[dict]]:
    """An earlier run's (meta, rows) from its frontier.csv and meta.json, typed as a run makes them."""
    import csv
    import json

    rows = []
    with open(out_dir / "frontier.csv", newline="") as f:
        for record in csv.DictReader(f):
            row: dict = dict.fromkeys(FRONTIER_COLUMNS)  # a column an older page lacks (tier) reads as unset
            for key, text in record.items():
                kind = FRONTIER_COLUMN_TYPES.get(key, str)
                if text == "":
                    row[key] = None
                elif kind is int:
                    row[key] = int(float(text))
                elif kind is bool:
                    row[key] = text in ("True", "true", "1")
                else:
                    row[key] = kind(text)
            row["paired_step_ratio"] = row.get("step_ratio")
            rows.append(row)
    with open(out_dir / "meta.json") as f:
        return json.load(f), rows


def merge_frontier(base_meta: dict, base_rows: list[dict], meta: dict, rows: list[dict]) -> tuple[dict, list[dict]]:
    """The earlier page with this run's non-stock rows in place of the same (model, system, point),
    new points after the last earlier row of their system (else at the end of their model). Stock's
    rows stay the earlier run's: each row's step is paired with its own stock compile, and peaks are
    exact, so rows of the two runs compare. A model without stock rows on the earlier page takes
    this run's. The meta names both commands."""
    key = lambda r: (section(r), r["system"], r["point"])  # noqa: E731
    # A model without stock rows on the earlier page takes this run's: its ratios are to them.
    known = {section(r) for r in base_rows if r["system"] == "stock"}
    fresh = {key(r): r for r in rows if r["system"] != "stock" or section(r) not in known}
    merged = [dict(fresh.pop(key(r), r)) for r in base_rows]
    for r in rows:
        if key(r) not in fresh:
            continue
        same = [i for i, m in enumerate(merged) if section(m) == section(r) and m["system"] == r["system"]]
        model = [i for i, m in enumerate(merged) if section(m) == section(r)]
        at = (same or model or [len(merged) - 1])[-1] + 1
        merged.insert(at, dict(fresh.pop(key(r))))
    out = dict(base_meta)
    out["command"] = f"{base_meta['command']}`, then `{meta['command']}"
    out["commit"] = f"{base_meta.get('commit', '?')}, then {meta.get('commit', '?')}"
    out["date"] = base_meta["date"] if base_meta["date"] == meta["date"] else f"{base_meta['date']}, then {meta['date']}"
    ordinal = base_meta["command"].count("`, then `") + 2
    out["load"] = (f"{base_meta.get('load', 'load not recorded')}; then command {ordinal}'s rows "
                   f"({', '.join(meta.get('systems', []))}) replace the same points ({meta.get('load', '')})")
    out["total_seconds"] = base_meta.get("total_seconds", 0.0) + meta.get("total_seconds", 0.0)
    out["systems"] = list(dict.fromkeys([*base_meta.get("systems", []), *meta.get("systems", [])]))
    return out, merged
