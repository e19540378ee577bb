"""The committed benchmark results say where they came from.

Every run under benchmarks/results (the full run at the top, topic runs in
folders) has a meta.json naming its command, commit, date and machine, and its
results.md opens with the header generated from that meta.json, so no figure
stands beside a hand-written account of how it was made.
"""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.report import provenance_header  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RUNS = sorted(p.parent for p in RESULTS.rglob("meta.json"))


def test_the_full_run_is_at_the_top():
    assert RESULTS in RUNS
    meta = json.loads((RESULTS / "meta.json").read_text())
    assert "--parts" not in meta["command"] and not meta["quick"], "the top level holds a full run"


@pytest.mark.parametrize("run", RUNS, ids=lambda p: str(p.relative_to(RESULTS)) or "full")
def test_each_run_opens_with_its_generated_header(run):
    meta = json.loads((run / "meta.json").read_text())
    for key in ("command", "commit", "date", "machine"):
        assert meta.get(key), f"{run}/meta.json has no {key}"
    page = (run / "results.md").read_text().splitlines()
    header = provenance_header(meta)
    assert page[2:2 + len(header)] == header, f"{run}/results.md does not open with the header of its meta.json"


def test_every_folder_of_results_is_a_run():
    """A folder with figures but no meta.json is a run nobody can trace."""
    for folder in (p for p in RESULTS.rglob("*") if p.is_dir()):
        if any(f.suffix in (".csv", ".md") for f in folder.iterdir()):
            assert (folder / "meta.json").exists(), f"{folder} holds results without a meta.json"


def test_rng_saved_bytes_names_its_commit():
    text = (RESULTS / "rng_saved_bytes.md").read_text()
    assert "- command: `python -m benchmarks.rng_saved_bytes`" in text and "- commit: " in text
