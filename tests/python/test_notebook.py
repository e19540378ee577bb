"""examples/inspect.ipynb runs top to bottom without an error, on this interpreter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "inspect.ipynb"
KERNEL = "hyper-ac-test"


def _kernel_spec(root: Path) -> None:
    """A kernel spec that starts *this* interpreter, whatever python3 kernels Jupyter knows of."""
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hyper_ac test", "language": "python",
    }))


def test_inspect_notebook_executes(tmp_path, monkeypatch):
    _kernel_spec(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300, allow_errors=False,
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError naming the cell on any error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = "\n".join(o.get("data", {}).get("text/html", "") for o in outputs)
    # the table, the pictures (Graphviz SVG), the memory plots and the frontier all rendered
    assert "<table>" in html and "MUST_SAVE" in html
    assert html.count('class="graph"') >= 2  # dot's SVG root group: collapsed graph and one unit
    assert html.count("Memory over the training step") >= 2
    assert "Memory vs recompute cost across" in html  # the frontier's figure title
