"""The README's quick start is true: its Python blocks run in order, its shell block runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _quick_start_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("## Modes")]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


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
