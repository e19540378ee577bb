"""Smoke test of the benchmark suite: ``python -m benchmarks --quick`` (< 60 s).

The suite is the checkout's ``benchmarks`` package, not part of ``hyper_ac``.
"""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)  # `benchmarks` lives beside the package; appended, so an installed hyper_ac still wins


def core_module():
    try:
        import hyper_ac._core as core  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the build
        pytest.skip(f"hyper_ac._core not built: {exc}")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    core_module()
    from benchmarks.cli import main

    out = tmp_path_factory.mktemp("bench")
    rc = main(["--quick", "--out", str(out)])
    return rc, out


def test_quick_table_has_rows(quick_run):
    rc, out = quick_run
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert rows, "results.csv has no rows"
    ok = [r for r in rows if r["status"] == "ok"]
    ran = {r["strategy"] for r in ok}
    errors = {r["strategy"]: r["error"] for r in rows if r["status"] != "ok"}
    # the references and the long-wired strategies must run; newer modes may record an error
    for strategy in ("none", "torch_mincut", "eager", "eager_ckpt", "full"):
        assert strategy in ran, f"{strategy} did not run: {errors.get(strategy)}"
    table = (out / "results.md").read_text()
    assert "## One training step" in table
    assert sum(1 for line in table.splitlines() if line.startswith("| transformer |")) >= len(rows)
    assert rc == 0


def test_quick_gradients_equal_for_every_strategy_that_ran(quick_run):
    _, out = quick_run
    rows = [r for r in csv.DictReader(open(out / "results.csv")) if r["status"] == "ok"]
    for r in rows:
        assert r["loss_equal"] == "True", f"{r['model']}/{r['strategy']}: loss differs from {r['reference']}"
        assert r["grads_equal"] == "True", (
            f"{r['model']}/{r['strategy']}: gradients differ from {r['reference']} (max diff {r['max_grad_diff']})")


def test_quick_measures_memory_and_saved_bytes(quick_run):
    _, out = quick_run
    from hyper_ac import memory

    rows = {r["strategy"]: r for r in csv.DictReader(open(out / "results.csv")) if r["status"] == "ok"}
    if memory.is_available():
        assert float(rows["none"]["peak_bytes"]) > 0
    if "full" in rows:
        # full recompute keeps fewer activation bytes than saving everything
        assert float(rows["full"]["saved_bytes"]) < float(rows["none"]["saved_bytes"])
        # what the run measured is what the plan said the backward reads
        assert abs(float(rows["full"]["saved_bytes"]) - float(rows["full"]["hac_saved_bytes_after"])) <= 64


def test_quick_scaling_ran(quick_run):
    _, out = quick_run
    meta = json.loads((out / "meta.json").read_text())
    assert "error" not in meta["notes"], meta["notes"].get("error")
    match = meta["notes"].get("synthetic_matches_captured")
    assert match and match["same_structure"], "replicated layers do not reproduce a captured graph"
    scaling = list(csv.DictReader(open(out / "scaling.csv")))
    assert scaling and all(float(r["nodes"]) > 0 for r in scaling)
    # both sides timed with lazy module code generation by default, as inside torch.compile
    assert {r["codegen"] for r in scaling} == {"lazy"} and meta["notes"]["codegen"] == ["lazy"]


def test_quick_never_writes_the_committed_results_unless_told(tmp_path):
    from benchmarks import cli

    committed = cli.RESULTS_DIR.resolve()
    quick = cli.output_dir(cli._parse(["--quick"]))
    assert quick.resolve() != committed and committed not in quick.resolve().parents
    assert cli.output_dir(cli._parse([])).resolve() == committed
    assert cli.output_dir(cli._parse(["--quick", "--out", str(tmp_path)])) == tmp_path
    assert cli.output_dir(cli._parse(["--quick", "--out", str(committed)])).resolve() == committed


def test_the_package_never_imports_the_benchmark():
    import subprocess

    code = ("import sys, hyper_ac, hyper_ac.__main__, hyper_ac.planning.passes, hyper_ac.lower.backends, hyper_ac.frontend.capture, "
            "hyper_ac.frontend.serialize, hyper_ac.memory, hyper_ac.display, hyper_ac.eager; "
            "hyper_ac.__main__.main(['op-policy']); "
            "assert not any(m == 'benchmarks' or m.startswith('benchmarks.') for m in sys.modules), 'imported'")
    run = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_quick_flow_comparison_runs_on_the_cores_own_network(quick_run):
    pytest.importorskip("networkx")
    _, out = quick_run
    rows = list(csv.DictReader(open(out / "flow.csv")))
    assert rows and all(not r.get("error") for r in rows), [r.get("error") for r in rows]
    for r in rows:
        # networkx on the exported DIMACS finds the core's flow and the core's cut
        assert r["same_flow"] == "True", r
        assert r["same_cut"] == "True", r


def test_checkpointed_model_rows(tmp_path):
    """The model's own per-layer checkpoints under stock aot_eager and hyper_ac off: both run, gradients match."""
    core_module()
    from benchmarks.cli import main

    rc = main(["--parts", "step", "--models", "transformer", "--strategies", "none", "ckpt_aot_eager", "ckpt_off",
               "--layers", "2", "--hidden", "32", "--seq", "16", "--batch", "2", "--steps", "1", "--no-plots",
               "--out", str(tmp_path)])
    assert rc == 0
    rows = {r["strategy"]: r for r in csv.DictReader(open(tmp_path / "results.csv"))}
    for strategy in ("ckpt_aot_eager", "ckpt_off"):
        assert rows[strategy]["status"] == "ok", rows[strategy]["error"]
        assert rows[strategy]["reference"] == "none"
        assert rows[strategy]["grads_allclose"] == "True"
    assert "### Inductor and models that checkpoint themselves" in (tmp_path / "results.md").read_text()


def test_loading_rss_is_the_cli_own_not_this_process():
    """The loader's peak RSS is the CLI's: a CLI forked straight from a process holding
    gigabytes would report that process's peak (Linux keeps the forked copy's high-water
    mark), which is what the 1M-node figure once showed."""
    from benchmarks.common import plan_cli
    from benchmarks.loading import measure_loading

    if plan_cli() is None:
        pytest.skip("hyper-ac-plan not built")
    held = bytearray(600 * 2**20)
    held[::4096] = b"\x01" * len(held[::4096])  # touched: 600 MiB resident in this process
    row = measure_loading(os.path.join(_ROOT, "tests", "data", "tiny_mlp.json"))
    assert 0 < row["load_fast_rss_mib"] < 200, row
    assert 0 < row["load_reference_rss_mib"] < 200, row
    del held
