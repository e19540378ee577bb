"""The README is true: its usage runs, docs/usage.md's blocks run in order, every ratio, size and time it quotes is
in the committed results, and it stays a front door (the commands, a usage and the mode chooser on its first screen)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _quick_start_blocks(language: str) -> list[str]:
    """The blocks of docs/usage.md, the README's usage in full."""
    text = (ROOT / "docs" / "usage.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"## {title}"):]
    return section[:section.index("\n## ", 1)]


def test_readme_usage_runs(monkeypatch):
    (block,) = re.findall(r"```python\n(.*?)```", _readme_section("Usage"), flags=re.S)
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "readme"}
    exec(compile(block, "README.md usage", "exec"), namespace)
    assert all(p.grad is not None for p in namespace["model"].parameters() if p.requires_grad)


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the narrative belongs in docs/results.md"
    first = "\n".join(lines[:60])
    for needed in ("make demo", "make test", "## Usage", "compiled(**batch)", "## Which mode", "| `full` |",
                   "| `budget`", "| `auto` |", "| `selective` |"):
        assert needed in first, f"{needed!r} is not on the README's first 60 lines"


_RATIO = re.compile(r"(?<![\w.])(\d+\.\d+)(?:–(\d+\.\d+))?×")


def _ratios(text: str) -> set[str]:
    return {x for match in _RATIO.findall(text) for x in match if x}


def _committed_ratios() -> set[float]:
    """Every ratio on a committed run's page: N.NN× anywhere, and a table cell that is one number (a × stock column)."""
    found: set[float] = set()
    for path in (ROOT / "benchmarks" / "results").rglob("*.md"):
        text = path.read_text()
        found.update(float(x) for x in _ratios(text))
        found.update(float(x) for x in re.findall(r"\|\s*(\d+\.\d+)\s*(?=\|)", text))
    return found


def _unbacked(readme: str, found: set[float]) -> list[str]:
    missing = []
    for figure in sorted(_ratios(readme)):
        places = len(figure.split(".")[1])
        if not any(abs(round(value, places) - float(figure)) < 1e-9 for value in found):
            missing.append(figure)
    return missing


def test_every_ratio_the_readme_quotes_is_in_the_committed_results():
    """A ratio (N.NN×, or a range N.NN–M.MM×) in the README is a figure of some committed run's page, to its precision."""
    found = _committed_ratios()
    readme = (ROOT / "README.md").read_text()
    assert len(_ratios(readme)) >= 20, "the README's ratios were not found: the pattern is stale"
    assert not _unbacked(readme, found), f"README.md quotes ratios no committed result holds: {_unbacked(readme, found)}"
    # The check fails where it should: a made-up figure, a range with one made-up end.
    assert _unbacked("`full` 9.871× stock", found) == ["9.871"]
    assert _unbacked("0.377–9.87× stock", found) == ["9.87"]


# An amount with its unit after a space: "34.6 GiB", "21 s" (a config literal such as "6GiB" has none).
_AMOUNT = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) (GiB|MiB|s)\b")


def _committed_amounts() -> set[tuple[float, str]]:
    found: set[tuple[float, str]] = set()
    for path in (ROOT / "benchmarks" / "results").rglob("*.md"):
        found.update((float(value), unit) for value, unit in _AMOUNT.findall(path.read_text()))
    return found


def _unbacked_amounts(readme: str, found: set[tuple[float, str]]) -> list[str]:
    missing = []
    for figure, unit in sorted(set(_AMOUNT.findall(readme))):
        places = len(figure.split(".")[1]) if "." in figure else 0
        if not any(u == unit and abs(round(value, places) - float(figure)) < 1e-9 for value, u in found):
            missing.append(f"{figure} {unit}")
    return missing


def test_every_size_and_time_the_readme_quotes_is_in_the_committed_results():
    """A size or time (N.N GiB / MiB / s) in the README is a figure of some committed run's page, to its precision."""
    found = _committed_amounts()
    readme = (ROOT / "README.md").read_text()
    assert len(set(_AMOUNT.findall(readme))) >= 5, "the README's sizes were not found: the pattern is stale"
    assert not _unbacked_amounts(readme, found), \
        f"README.md quotes sizes or times no committed result holds: {_unbacked_amounts(readme, found)}"
    assert _unbacked_amounts("`full` 987.6 GiB in 123 s", found) == ["123 s", "987.6 GiB"]


def test_quick_start_python_blocks_run(monkeypatch, capsys):
    import shutil

    import matplotlib

    matplotlib.use("Agg")
    blocks = _quick_start_blocks("python")
    assert len(blocks) >= 4, "the quick start shows the backend, the pass, the pipeline and Jupyter"
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        if "display.draw" in block and shutil.which("dot") is None:
            pytest.fail("Graphviz `dot` is missing (scripts/install-deps.sh installs it)")
        exec(compile(block, f"README.md quick-start block {i}", "exec"), namespace)
    assert "count_nodes" in capsys.readouterr().out  # the pipeline ran its second pass
    assert namespace["ac"].result.stats["nodes_duplicated"] > 0


def test_quick_start_shell_block_runs(tmp_path):
    (blocks,) = _quick_start_blocks("bash")
    (tmp_path / "build").symlink_to(ROOT / "build")  # the C++ CLI as the checkout's build leaves it
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for line in blocks.strip().splitlines():
        run = subprocess.run(line.replace("python -m", f"{sys.executable} -m"), shell=True, cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, f"{line}\n{run.stderr}"
    assert (tmp_path / "graph.json").stat().st_size > 0
    assert "duplicated" in run.stdout


def test_sharded_example_runs():
    """The README's sharded example (torchrun, 2 gloo ranks: TP x FSDP2) trains from the checkout."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Sharded training"):]
    section = section[:section.index("\n## ", 1)]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    (line,) = [ln for ln in block.strip().splitlines() if ln.strip() and not ln.startswith("#")]
    line = line.split("#")[0].strip()
    assert line.startswith("torchrun ")
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    run = subprocess.run(torchrun + line.split()[1:], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    steps = re.findall(r"step (\d+): loss ([0-9.]+)", run.stdout)
    assert len(steps) == 3, run.stdout
    assert float(steps[-1][1]) < float(steps[0][1]), f"the loss did not fall: {steps}"
