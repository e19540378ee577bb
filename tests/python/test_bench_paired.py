"""The paired (interleaved) step-time ratio of the Inductor strategies: its arithmetic, the
interleaving order, how the step part picks it and how the results page shows it. No timing
is asserted; the clock is replaced where a test needs times."""

from __future__ import annotations

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)  # `benchmarks` lives beside the package

from benchmarks import step as bench_step  # noqa: E402
from benchmarks.report import render_markdown, step_ratio_cell  # noqa: E402


def test_paired_summary_is_the_median_of_per_round_ratios():
    # A slow spell (rounds 2 and 3) hits both sides of its rounds: the per-round ratio cancels it,
    # the ratio of the two medians does not (2.0 / 1.0 here would say 2x).
    stock = [1.0, 1.0, 4.0, 4.0, 1.0]
    strat = [1.1, 1.2, 4.4, 4.8, 1.0]
    out = bench_step.paired_summary(stock, strat)
    assert out["paired_rounds"] == 5
    assert out["paired_step_ratio"] == pytest.approx(1.1)  # ratios 1.1, 1.2, 1.1, 1.2, 1.0
    assert out["paired_step_ratio_q1"] == pytest.approx(1.1)
    assert out["paired_step_ratio_q3"] == pytest.approx(1.2)
    assert out["paired_step_seconds"] == pytest.approx(1.2)
    assert out["paired_stock_step_seconds"] == pytest.approx(1.0)
    assert out["paired_step_ratio"] != pytest.approx(out["paired_step_seconds"] / out["paired_stock_step_seconds"])


def test_paired_summary_quartiles_interpolate():
    out = bench_step.paired_summary([1.0] * 4, [1.0, 2.0, 3.0, 4.0])
    assert out["paired_step_ratio"] == pytest.approx(2.5)
    assert out["paired_step_ratio_q1"] == pytest.approx(1.75)
    assert out["paired_step_ratio_q3"] == pytest.approx(3.25)


def test_paired_summary_rejects_unpaired_or_empty_times():
    with pytest.raises(ValueError, match="3 stock times but 2 strategy times"):
        bench_step.paired_summary([1.0, 1.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="not positive"):
        bench_step.paired_summary([0.0], [1.0])
    assert bench_step.paired_summary([], []) == {}


def test_paired_times_interleaves_and_alternates_the_order(monkeypatch):
    calls: list[str] = []
    clock = iter(range(1000))
    monkeypatch.setattr(bench_step.time, "perf_counter", lambda: float(next(clock)))
    stock, strat = bench_step.paired_times(lambda: calls.append("stock"), lambda: calls.append("strategy"), 3)
    assert calls == ["stock", "strategy", "strategy", "stock", "stock", "strategy"]
    assert len(stock) == len(strat) == 3
    assert stock == strat == [1.0, 1.0, 1.0]  # each step timed on its own: two clock reads per step


def _rows(paired: bool) -> list[dict]:
    ref = {"model": "m", "strategy": "inductor", "status": "ok", "peak_bytes": 100, "step_seconds": 0.10}
    auto = {"model": "m", "strategy": "inductor_auto", "status": "ok", "peak_bytes": 80, "step_seconds": 0.13,
            "hac_nodes_duplicated": 7, "grads_allclose": True}
    if paired:
        auto.update(bench_step.paired_summary([0.10, 0.20, 0.10], [0.102, 0.204, 0.101]))
    return [ref, auto]


def test_inductor_rows_report_the_paired_ratio_when_it_ran():
    rows = _rows(paired=True)
    bench_step._add_ratios(rows)
    ref, auto = rows
    assert (ref["step_ratio_vs_inductor"], ref["step_ratio_method"]) == (1.0, "reference")
    assert auto["step_ratio_method"] == "paired"
    assert auto["step_ratio_vs_inductor"] == pytest.approx(1.02)
    assert auto["step_seconds_vs_inductor"] == pytest.approx(1.3)  # the sequential ratio stays in its own column
    cell = step_ratio_cell(auto)
    assert cell.startswith("1.02× [1.01–1.02]") and "paired, 3 rounds" in cell


def test_inductor_rows_fall_back_to_the_sequential_ratio_marked_as_such():
    rows = _rows(paired=False)
    bench_step._add_ratios(rows)
    auto = rows[1]
    assert auto["step_ratio_method"] == "sequential"
    assert auto["step_ratio_vs_inductor"] == pytest.approx(1.3)
    assert step_ratio_cell(auto) == "1.30× (sequential)"
    assert step_ratio_cell({}) == "–"


def test_results_page_shows_the_paired_figures():
    rows = _rows(paired=True)
    bench_step._add_ratios(rows)
    meta = {"command": "python -m benchmarks", "date": "today", "machine": "test", "torch": "x",
            "total_seconds": 1.0, "spec": {"layers": 1, "hidden": 8, "heads": 1, "seq": 4, "batch": 1}}
    page = render_markdown(meta, rows, {}, [], [], [], {})
    line = next(line for line in page.splitlines() if line.startswith("| m | inductor_auto | 0.00 | 0.80× |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4:7] == ["102.0", "100.0", "1.02× [1.01–1.02] (paired, 3 rounds)"]
    assert "median of the per-round ratios" in page
