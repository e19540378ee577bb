"""Budgets on the measured peak under Inductor (issue 24), on two bench models.

Whole-model compile: hyper_ac ``budget`` at byte targets f × stock's measured peak (plus the
parameter and input bytes the config's budget counts; the frontier's ``budget f× stock peak``
points). The measured peak must never rise as the target falls; every target at or above the
floor (the least of ``full``'s and the budgets' measured peaks) must be met by the measured step
within 1%; a target below the floor must give the floor (within 1%).

Per-block compile (``ac_scope: unit_graph``, the frontier's ``hyper_ac_block budget f`` points):
the measured peak must never rise as the fraction falls, never be above stock's own per-block
compile (a block that would save more than stock's partition is left to stock), and the fraction
must matter (the smallest measures below the largest).

Each point is the frontier's own measurement (``benchmarks.frontier.measure_named``, no timing)
at the benchmark's sizes: about 12 CPU-minutes in all.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hyper_ac import memory

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is a package at the root
from benchmarks.frontier import HAC_BLOCK_FRACTIONS, HAC_BYTE_FRACTIONS, byte_budget_point, measure_named  # noqa: E402

pytestmark = [pytest.mark.slow,  # a dozen Inductor compiles per model: `make test-slow`
              pytest.mark.skipif(not memory.is_available(), reason="hyper_ac._memory not built")]

TOLERANCE = 1.01


def _peak(name: str, system: str, point: str, stock_peak=None) -> int:
    row, _ = measure_named(name, system, point, stock_peak=stock_peak)
    assert row["status"] == "ok", row
    return row["peak_bytes"]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_whole_model_byte_budget_is_met_on_the_measured_peak(name):
    stock = _peak(name, "stock", "whole compile")
    full = _peak(name, "hyper_ac", "full")
    measured = {f: _peak(name, "hyper_ac", byte_budget_point(f), stock) for f in HAC_BYTE_FRACTIONS}
    floor = min(full, *measured.values())
    print(f"{name}: stock {stock} B, full {full} B ({full / stock:.3f}x), budgets "
          + ", ".join(f"{f}: {peak / stock:.3f}x" for f, peak in measured.items()))
    fractions = sorted(measured, reverse=True)
    for higher, lower in zip(fractions, fractions[1:]):
        assert measured[lower] <= measured[higher], (
            f"{name}: budget {lower} x stock measures {measured[lower]} B, above budget {higher}'s {measured[higher]} B")
    for f, peak in measured.items():
        target = f * stock
        if target >= floor:
            assert peak <= TOLERANCE * target, f"{name}: budget {f} x stock ({target:.0f} B) measures {peak} B"
        else:  # below the floor: the least measured peak
            assert peak <= TOLERANCE * floor, f"{name}: budget {f} x stock is below the floor {floor} B, measures {peak} B"


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_per_block_budget_falls_with_the_fraction(name):
    stock = _peak(name, "stock", "per-block compile")
    measured = {f: _peak(name, "hyper_ac_block", f"budget {f:.1f}") for f in HAC_BLOCK_FRACTIONS}
    print(f"{name}: stock per-block {stock} B, per-block budgets " + ", ".join(f"{f}: {p} B" for f, p in measured.items()))
    for f, peak in measured.items():
        assert peak <= stock, f"{name}: per-block budget {f} measures {peak} B, above stock's per-block compile ({stock} B)"
    fractions = sorted(measured, reverse=True)
    for higher, lower in zip(fractions, fractions[1:]):
        assert measured[lower] <= measured[higher], (
            f"{name}: per-block budget {lower} measures {measured[lower]} B, above budget {higher}'s {measured[higher]} B")
    assert measured[fractions[-1]] < measured[fractions[0]], f"{name}: the per-block budget fraction changes nothing"
