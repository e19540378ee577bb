"""The frontier part's pure figures (benchmarks/frontier_report.py): ratios, dominance with
tolerances, hyper_ac's frontier line and the rendered table. Nothing here compiles."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import frontier_report as fr  # noqa: E402

MiB = 2**20


def row(system, point, peak_mib, step, model="m", **extra):
    return {"model": model, "system": system, "point": point, "status": "ok", "error": "",
            "peak_bytes": int(peak_mib * MiB), "paired_step_ratio": step, **extra}


def rows():
    return [
        row("stock", "whole compile", 100, 1.00, grads_allclose=True),
        row("torch_budget", "0.5", 65, 1.20),
        row("torch_budget", "0.0", 111, 1.40),
        row("checkpoint_wrapper", "whole compile", 47, 1.10),
        row("hyper_ac", "auto", 60, 1.00),
        row("hyper_ac", "full", 49, 1.12),
        row("hyper_ac", "budget 0.9× stock peak", 60, 1.00),   # equal to auto: one stands for both on the line
        row("hyper_ac_block", "budget 0.5", 70, 1.30),          # dominated by auto: not on the line
        {"model": "m", "system": "sac", "point": "per-block compile", "status": "error", "error": "boom | x"},
    ]


def measured():
    rs = rows()
    fr.add_ratios(rs)
    fr.add_dominance(rs)
    return {fr.label(r): r for r in rs}


def test_ratios_are_to_stock_whole_compile():
    rs = measured()
    assert rs["torch_budget 0.5"]["peak_ratio"] == 0.65
    assert rs["stock whole compile"]["peak_ratio"] == 1.0
    assert rs["hyper_ac full"]["step_ratio"] == 1.12
    assert "peak_ratio" not in rs["sac per-block compile"]


def test_dominance_with_tolerances_names_the_least_memory_dominator():
    rs = measured()
    # 65 MiB / 1.20: auto (60, 1.00) and full (49, 1.12) both dominate; full has the least peak
    assert rs["torch_budget 0.5"]["dominated_by"] == "hyper_ac full"
    # 47 MiB / 1.10: full is 49/47 = 1.043x the peak, beyond 1.01: not dominated
    assert rs["checkpoint_wrapper whole compile"]["dominated_by"] == fr.NOT_DOMINATED
    # the stock point itself: auto at 0.60x peak and 1.00x step
    assert rs["stock whole compile"]["dominated_by"] == "hyper_ac auto"
    assert "dominated_by" not in rs["hyper_ac full"] and "dominated_by" not in rs["sac per-block compile"]


def test_dominance_tolerances_are_inclusive_and_bounded():
    other = {"peak_ratio": 0.5, "step_ratio": 1.0}
    assert fr.dominates({"peak_ratio": 0.505, "step_ratio": 1.03}, other)
    assert not fr.dominates({"peak_ratio": 0.5051, "step_ratio": 1.0}, other)
    assert not fr.dominates({"peak_ratio": 0.4, "step_ratio": 1.031}, other)


def test_frontier_line_keeps_the_non_dominated_hyper_ac_points():
    rs = measured()
    line = fr.frontier_line([r for r in rs.values() if r["system"] in fr.HAC_SYSTEMS])
    assert [(r["peak_ratio"], r["step_ratio"]) for r in line] == [(0.60, 1.00), (0.49, 1.12)]


def test_least_memory_line_says_when_hyper_ac_is_above_another_system():
    rs = list(measured().values())
    line = fr.least_memory_line("m", rs)
    assert "hyper_ac full, 0.490×" in line and "**above**" in line
    assert "checkpoint_wrapper whole compile 0.470×" in line
    better = [r for r in rs if r["system"] != "checkpoint_wrapper"]
    assert "at or below every other" in fr.least_memory_line("m", better)


def test_table_renders_every_row_errors_escaped():
    rs = list(measured().values())
    table = fr.model_table("m", rs).splitlines()
    assert table[0].startswith("| system | point | peak MiB | peak ×stock |")
    assert len(table) == 2 + len(rs)
    assert "| torch_budget | 0.5 | 65.00 | 0.650× | 1.200× | hyper_ac full | – |" in table
    assert any("error: boom \\| x" in line for line in table)
    page = fr.render_frontier_markdown({"command": "python -m benchmarks --parts frontier", "commit": "abc",
                                        "date": "2026-12-01", "machine": "x"}, rs)
    assert "3 of 4 other points dominated" in page and "## m" in page


def _meta(command, systems, seconds):
    return {"command": command, "commit": "c", "date": "2026-12-02", "machine": "x", "load": "idle",
            "systems": systems, "total_seconds": seconds, "spec": {}}


def test_merge_replaces_the_same_points_keeps_stock_and_inserts_new_ones(tmp_path):
    base = rows()[:-1]  # the error row has no numbers: not written back typed the same
    fr.write_frontier(tmp_path, _meta("python -m benchmarks A", ["hyper_ac", "torch_budget"], 100.0), base,
                      plots=False, log=print)
    base_meta, base_rows = fr.read_frontier(tmp_path)
    assert [fr.label(r) for r in base_rows] == [fr.label(r) for r in base]
    assert base_rows[0]["peak_bytes"] == 100 * MiB and base_rows[1]["paired_step_ratio"] == 1.20
    assert base_rows[0]["grads_allclose"] is True

    new = [row("stock", "whole compile", 100, 0.97),                   # stock stays the earlier run's
           row("hyper_ac", "auto", 58, 0.99),                          # replaces auto in place
           row("hyper_ac", "budget 0.65× stock peak", 56, 0.99),       # new: after the last hyper_ac row
           row("stock", "whole compile", 90, 1.0, model="other"),      # a model the page lacks: at the end,
           row("hyper_ac", "auto", 40, 1.0, model="other")]            # its stock row with it
    meta, merged = fr.merge_frontier(base_meta, base_rows, _meta("python -m benchmarks B", ["hyper_ac"], 50.0), new)
    labels = [(r["model"], fr.label(r)) for r in merged]
    assert labels == ([("m", fr.label(r)) for r in base[:7]] + [("m", "hyper_ac budget 0.65× stock peak")]
                      + [("m", fr.label(r)) for r in base[7:]]
                      + [("other", "stock whole compile"), ("other", "hyper_ac auto")])
    by = {lbl: r for (m, lbl), r in zip(labels, merged) if m == "m"}
    assert by["stock whole compile"]["paired_step_ratio"] == 1.00
    assert by["hyper_ac auto"]["peak_bytes"] == 58 * MiB
    assert meta["command"] == "python -m benchmarks A`, then `python -m benchmarks B"
    assert meta["total_seconds"] == 150.0 and meta["systems"] == ["hyper_ac", "torch_budget"]
    assert meta["load"] == "idle; then command 2's rows (hyper_ac) replace the same points (idle)"
    # The merged page renders: the new point is dominated-or-not like any other.
    fr.write_frontier(tmp_path, meta, merged, plots=False, log=print)
    text = (tmp_path / "results.md").read_text()
    assert "budget 0.65× stock peak" in text and "python -m benchmarks B" in text
    assert [r["peak_ratio"] for r in merged if r["model"] == "other"] == [1.0, 40 / 90]  # against its own stock


def test_the_committed_page_reads_back_typed_by_its_columns():
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "frontier" / "measured_auto"
    _, page_rows = fr.read_frontier(page)
    assert page_rows and set(page_rows[0]) == set(fr.FRONTIER_COLUMNS) | {"paired_step_ratio"}
    for r in page_rows:
        for key, kind in fr.FRONTIER_COLUMN_TYPES.items():
            assert r[key] is None or isinstance(r[key], kind), (key, r[key])
    assert any(isinstance(r["peak_bytes"], int) and r["grads_allclose"] is True for r in page_rows)


def test_point_names_choose_points_and_an_unknown_name_is_an_error_before_anything_runs():
    import pytest

    from benchmarks.common import ModelSpec
    from benchmarks.frontier import byte_budget_point, run_frontier
    from benchmarks.step import StepOptions

    assert byte_budget_point(0.65) == "budget 0.65× stock peak" and byte_budget_point(0.7) == "budget 0.7× stock peak"
    with pytest.raises(ValueError, match=r"transformer: no frontier point named 'auto \(measurd\)'; the points are .*"
                                         r"'auto \(measured\)'"):
        run_frontier(["transformer"], StepOptions(spec=ModelSpec()), print, ["hyper_ac"], point_names=["auto (measurd)"])


def test_plot_labels_share_a_spot_and_do_not_overlap():
    # 1 data unit = 100 points on both axes.
    def to_points(x, y):
        return x * 100, y * 100

    pts = [row("hyper_ac", "budget 0.4× stock peak", 10.000, 1.20), row("hyper_ac", "budget 0.3× stock peak", 10.005, 1.2001),
           row("hyper_ac", "budget 0.45× stock peak", 10.0, 1.25), row("hyper_ac", "full", 10.0, 1.3),
           row("torch_budget", "0.5", 10.0, 1.20)]
    for r in pts:
        r["step_ratio"] = r["paired_step_ratio"]
    labels = fr.plot_labels(pts, to_points)
    texts = [text for _, _, text, _ in labels]
    assert texts == ["budget 0.4× / budget 0.3×", "budget 0.45×", "full", "0.5"]  # one spot, one system: one label
    boxes = []
    for x, y, text, (dx, dy) in labels:
        px, py = to_points(x, y)
        boxes.append((px + dx, py + dy, px + dx + 3.3 * len(text), py + dy + 7))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)


def test_byte_budget_names_read_back_to_their_fraction():
    from benchmarks.frontier import byte_budget_fraction, byte_budget_point

    for f in (0.9, 0.85, 0.3):
        assert byte_budget_fraction(byte_budget_point(f)) == f
    for other in ("budget 0.5", "auto", "budget x× stock peak", "budget 0.5× stock"):
        assert byte_budget_fraction(other) is None


def test_budget_section_judges_each_byte_budget_against_its_target():
    rs = [row("stock", "whole compile", 100, None),
          row("hyper_ac", "full", 40, None),
          row("hyper_ac", "budget 0.9× stock peak", 89.5, None),   # 0.994 of target: met
          # 0.857: under; its search measured a plan 0.1% over the target (70.07 MiB against 70)
          row("hyper_ac", "budget 0.7× stock peak", 60, None, nearest_over_bytes=int(70.07 * MiB)),
          row("hyper_ac", "budget 0.6× stock peak", 61, None),     # over, and above 0.7's: not monotone
          row("hyper_ac", "budget 0.3× stock peak", 38, None),     # under the least other peak: the floor
          row("hyper_ac_block", "budget 0.5", 20, None)]           # per-block fractions are not byte budgets
    fr.add_ratios(rs)
    judged = {r["point"]: r["verdict"] for r in fr.budget_rows("m", rs)}
    assert judged == {"budget 0.9× stock peak": "met", "budget 0.7× stock peak": "under",
                      "budget 0.6× stock peak": "over", "budget 0.3× stock peak": "unreachable"}
    line = fr.budget_section("m", rs)[0]
    assert "2 of 4 met" in line and "**not monotone**" in line and "0.950× `full`'s (0.400×)" in line
    assert fr.budget_section("other", rs) == []
    page = fr.render_frontier_markdown(_meta("python -m benchmarks", ["hyper_ac"], 1.0), rs)
    assert "Byte budgets against their targets" in page
    assert "| budget 0.7× stock peak | 0.600× | 0.857 | 1.0010 | **under** |" in page
    assert "| budget 0.9× stock peak | 0.895× | 0.994 | – | met |" in page  # no plan measured over


def test_the_plan_of_one_graph_gives_the_nearest_plan_measured_over():
    from types import SimpleNamespace

    from benchmarks.frontier import planned_columns

    def planned(**stats):
        return SimpleNamespace(stats=stats)

    assert planned_columns([planned(measured_nearest_over=1234, oracle_calls=5)]) == {"nearest_over_bytes": 1234}
    assert planned_columns([planned(measured_nearest_over=-1, oracle_calls=2)]) == {}  # none measured over
    assert planned_columns([planned(oracle_calls=0)]) == {}                            # no oracle
    # Several graphs (per-block compile, graph breaks): no one search to speak for the step.
    assert planned_columns([planned(measured_nearest_over=1), planned(measured_nearest_over=2)]) == {}
    assert planned_columns([]) == {}


def two_tiers():
    """One model at two tiers: the same point names, different stock peaks."""
    return ([dict(r, tier="bench") for r in rows()[:-1]]
            + [dict(row("stock", "whole compile", 400, 1.00, grads_allclose=True), tier="realistic"),
               dict(row("hyper_ac", "full", 160, 1.30), tier="realistic"),
               dict(row("hyper_ac", "budget 0.5× stock peak", 198, 1.10), tier="realistic"),
               dict(row("torch_budget", "0.5", 250, 1.20), tier="realistic")])


def test_a_page_of_two_tiers_judges_each_tier_against_its_own_stock(tmp_path):
    rs = two_tiers()
    meta = {**_meta("python -m benchmarks --tiers bench realistic", ["hyper_ac"], 1.0),
            "tiers": {"bench": {"spec": {"layers": 4, "hidden": 128, "seq": 128, "batch": 4}, "models": ["m"]},
                      "realistic": {"spec": {"layers": 8, "hidden": 512, "seq": 512, "batch": 2}, "models": ["m"]}}}
    fr.write_frontier(tmp_path, meta, rs, plots=False, log=print)
    by = {(r["tier"], fr.label(r)): r for r in rs}
    # ratios are to each tier's own stock: 160 / 400, not 160 / 100
    assert by[("realistic", "hyper_ac full")]["peak_ratio"] == 0.4
    assert by[("bench", "hyper_ac full")]["peak_ratio"] == 0.49
    # dominance stays within a tier: the bench tier's auto (60 MiB) does not dominate the realistic point
    assert by[("realistic", "torch_budget 0.5")]["dominated_by"] == "hyper_ac budget 0.5× stock peak"
    assert by[("bench", "torch_budget 0.5")]["dominated_by"] == "hyper_ac full"
    # the budget's verdict is against the realistic stock: 198 / (0.5 x 400) = 0.99, met
    assert [b["verdict"] for b in fr.budget_rows("realistic/m", rs)] == ["met"]
    text = (tmp_path / "results.md").read_text()
    assert "## m (bench tier)" in text and "## m (realistic tier)" in text
    assert ("Tiers, one run: bench (m) at 4 layers, hidden 128, seq 128, batch 4, dropout 0.0; realistic (m) at "
            "8 layers, hidden 512, seq 512, batch 2, dropout 0.0;") in text
    assert fr.plot_file("realistic/m") == "frontier_realistic_m.png" and fr.plot_file("m") == "frontier_m.png"
    # the page reads back with its tiers, and a merge replaces a point of one tier only
    back_meta, back = fr.read_frontier(tmp_path)
    assert [(r["tier"], fr.label(r)) for r in back] == [(r["tier"], fr.label(r)) for r in rs]
    new = [dict(row("hyper_ac", "full", 150, 1.25), tier="realistic")]
    _, merged = fr.merge_frontier(back_meta, back, _meta("python -m benchmarks C", ["hyper_ac"], 1.0), new)
    fulls = {r["tier"]: r["peak_bytes"] for r in merged if fr.label(r) == "hyper_ac full"}
    assert fulls == {"bench": 49 * MiB, "realistic": 150 * MiB}


def test_tiers_choose_shapes_and_models_and_refuse_what_contradicts_them(capsys):
    import pytest

    from benchmarks import cli
    from benchmarks.common import TIERS

    args = cli._parse(["--parts", "frontier", "--tiers", "realistic", "bench", "--models", "bert", "llama"])
    groups = cli.frontier_groups(args, None, ())
    assert [(tier, models) for tier, _, models in groups] == [("realistic", ("llama",)), ("bench", ("llama", "bert"))]
    assert groups[0][1] == TIERS["realistic"].spec and groups[0][1].hidden == 512 and groups[0][1].seq == 512
    assert groups[1][1] == TIERS["bench"].spec
    # without --tiers: the one shape given
    plain = cli._parse(["--parts", "frontier"])
    assert cli.frontier_groups(plain, "SPEC", ("gpt2",)) == [(None, "SPEC", ("gpt2",))]
    for argv, said in ((["--tiers", "bench"], "--tiers is for the frontier part alone"),
                       (["--parts", "frontier", "--tiers", "bench", "--hidden", "256"], "drop --hidden"),
                       (["--parts", "frontier", "--tiers", "realistic", "--models", "bert"],
                        "--models bert: in none of the tiers realistic"),
                       (["--parts", "frontier", "--tiers", "bench", "--frontier-merge", "x"], "drop --frontier-merge")):
        with pytest.raises(SystemExit):
            cli._parse(argv)
        assert said in capsys.readouterr().err
