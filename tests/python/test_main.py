"""The command lines: `python -m hyper_ac capture|plan|...` and the C++ `hyper-ac-plan`.

Every user error exits with status 2 and one line `hyper_ac: error: ...`, never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_ac import _core
from hyper_ac.__main__ import main
from hyper_ac.planning.config import op_policy_json

ROOT = Path(__file__).resolve().parents[2]


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hyper_ac", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def _one_error_line(stderr: str, *phrases: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert lines[0].startswith("hyper_ac: error: "), lines[0]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------


@pytest.mark.parametrize("model, layers, units", [("transformer", 3, 3), ("mlp", 2, 0), ("hf:qwen2", 1, 1)])
def test_capture_writes_a_graph_the_core_loads(tmp_path, capsys, model, layers, units):
    out = tmp_path / "graph.json"
    rc = main(["capture", "--model", model, "--layers", str(layers), "--batch", "3", "--seq", "8", "-o", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "nodes" in printed
    doc = json.loads(out.read_text())
    summary = _core.graph_summary(out.read_text())
    assert summary["forward_nodes"] > 0 and summary["backward_nodes"] > 0
    assert len(_core.discover_units(json.dumps({**doc, "nodes": []}))) == units  # live-model facts are in it
    inputs = [n for n in doc["nodes"] if n.get("role") == "input"]
    assert inputs and inputs[0]["outputs"][0]["shape"][0] == 3  # --batch reached the example batch


def test_captured_graph_plans_like_the_live_one(tmp_path):
    out = tmp_path / "g.json"
    assert main(["capture", "--model", "transformer", "--layers", "2", "-o", str(out)]) == 0
    cli = _run_cli("plan", str(out), "selective")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["stats"]["nodes_duplicated"] > 0


@pytest.mark.parametrize("args, phrases", [
    (["--model", "gpt5"], ["unknown model 'gpt5'", "hf:<arch>"]),
    (["--model", "hf:gpt5"], ["unknown HuggingFace architecture 'gpt5'", "llama"]),
    (["--model", "llama"], ["hf:llama"]),
    (["--model", "transformer", "--layers", "0"], ["--layers must be at least 1"]),
    (["--model", "transformer", "--seq", "1"], ["--seq must be at least 2"]),
    (["--model", "transformer", "--batch", "-2"], ["--batch must be at least 1"]),
])
def test_capture_user_errors_are_one_line(tmp_path, capsys, args, phrases):
    assert main(["capture", *args, "-o", str(tmp_path / "g.json")]) == 2
    _one_error_line(capsys.readouterr().err, *phrases)
    assert not (tmp_path / "g.json").exists()


def test_capture_bad_output_paths(tmp_path, capsys):
    assert main(["capture", "--model", "mlp", "-o", str(tmp_path / "no" / "such" / "g.json")]) == 2
    _one_error_line(capsys.readouterr().err, "does not exist")
    assert main(["capture", "--model", "mlp", "-o", str(tmp_path)]) == 2
    _one_error_line(capsys.readouterr().err, "is a directory")


def test_errors_from_a_fresh_process_have_no_traceback(tmp_path):
    for args, phrase in (
        (["capture", "--model", "resnet", "-o", str(tmp_path / "g.json")], "unknown model"),
        (["plan", str(tmp_path / "missing.json"), "selective"], "cannot read graph file"),
        (["plan", str(ROOT / "tests/data/tiny_mlp.json"), "no_such_preset"], "does not exist"),
        (["config", str(ROOT / "tests/data/tiny_mlp.json")], "activation_checkpoint"),
    ):
        run = _run_cli(*args)
        assert run.returncode == 2, (args, run.stderr)
        assert "Traceback" not in run.stderr
        _one_error_line(run.stderr, phrase)
    (tmp_path / "broken.json").write_text("{not json")
    run = _run_cli("plan", str(tmp_path / "broken.json"), "selective")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    _one_error_line(run.stderr)


# --------------------------------------------------------------------------
# hyper-ac-plan: the shipped operator table by default
# --------------------------------------------------------------------------


def _hyper_ac_plan() -> str:
    for candidate in (ROOT / "build" / "py" / "hyper-ac-plan", Path(sys.executable).parent / "hyper-ac-plan"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("hyper-ac-plan")
    assert found, "hyper-ac-plan is not built (pip install -e . builds it into build/py)"
    return found


def _node(i, name, kind, target, inputs, phase, *, stack=None, role=None, nbytes=64, **extra):
    node = {"id": i, "name": name, "kind": kind, "target": target, "inputs": inputs, "phase": phase}
    if role:
        node["role"] = role
    if kind != "output":
        node["outputs"] = [{"bytes": nbytes, "dtype": "float32", "shape": [4, 4] if nbytes == 64 else []}]
    if stack:
        node["module_stack"] = [{"fqn": stack, "type": "Block"}]
    node.update(extra)
    return node


def _mm_all_to_all_graph() -> dict:
    """Two blocks of mm -> all_to_all_single -> relu; the backward reads each of them."""
    a2a = "_c10d_functional::all_to_all_single.default"
    f, b = "forward", "backward"
    nodes = [
        _node(0, "x", "placeholder", "x", [], f, role="input"),
        _node(1, "w0", "placeholder", "w0", [], f, role="parameter"),
        _node(2, "w1", "placeholder", "w1", [], f, role="parameter"),
        _node(3, "mm0", "call_function", "aten::mm.default", [0, 1], f, stack="layers.0", flops=128),
        _node(4, "a2a0", "call_function", a2a, [3], f, stack="layers.0", collective=True),
        _node(5, "relu0", "call_function", "aten::relu.default", [4], f, stack="layers.0"),
        _node(6, "mm1", "call_function", "aten::mm.default", [5, 2], f, stack="layers.1", flops=128),
        _node(7, "a2a1", "call_function", a2a, [6], f, stack="layers.1", collective=True),
        _node(8, "relu1", "call_function", "aten::relu.default", [7], f, stack="layers.1"),
        _node(9, "sum", "call_function", "aten::sum.default", [8], f, nbytes=4),
        _node(10, "tangent", "placeholder", "tangent", [], b, role="tangent", nbytes=4),
        _node(11, "expand", "call_function", "aten::expand.default", [10], b, view=True, aliased_inputs=[0]),
        _node(12, "tb1", "call_function", "aten::threshold_backward.default", [11, 8], b),
        _node(13, "g1", "call_function", "aten::mul.Tensor", [12, 7], b),
        _node(14, "g2", "call_function", "aten::mul.Tensor", [13, 6], b),
        _node(15, "tb0", "call_function", "aten::threshold_backward.default", [14, 5], b),
        _node(16, "g3", "call_function", "aten::mul.Tensor", [15, 4], b),
        _node(17, "g4", "call_function", "aten::mul.Tensor", [16, 3], b),
        _node(18, "output", "output", "", [9, 17], b),
    ]
    return {"format": "hyper_ac.graph", "version": 1, "nodes": nodes}


def test_hyper_ac_plan_uses_the_shipped_operator_table(tmp_path):
    exe = _hyper_ac_plan()
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps(_mm_all_to_all_graph()))
    config = tmp_path / "selective.json"
    config.write_text(json.dumps({"ac_mode": "selective"}))

    # the compiled-in table is the YAML the Python side reads
    shown = subprocess.run([exe, "--print-op-policy"], capture_output=True, text=True, check=True).stdout
    assert json.loads(shown) == json.loads(op_policy_json())

    cpp = subprocess.run([exe, str(graph), "--config", str(config), "--json"], capture_output=True, text=True)
    assert cpp.returncode == 0, cpp.stderr
    py = _run_cli("plan", str(graph), "selective")
    assert py.returncode == 0, py.stderr
    cpp_plan, py_plan = json.loads(cpp.stdout), json.loads(py.stdout)
    assert cpp_plan == py_plan
    assert {"mm0", "mm1", "a2a0", "a2a1"} <= set(cpp_plan["saved"])  # matmuls and collectives saved
    duplicated = {d["of"] for d in cpp_plan["duplicates"]}
    assert not duplicated & {"mm0", "mm1", "a2a0", "a2a1"}, duplicated
    assert cpp_plan["stats"]["saved_collective"] == 2

    # --op-policy replaces the table: with no must_save entries the matmuls are recomputed
    table = json.loads(op_policy_json())
    table["must_save"] = []
    empty = tmp_path / "table.json"
    empty.write_text(json.dumps(table))
    replaced = subprocess.run([exe, str(graph), "--config", str(config), "--op-policy", str(empty), "--json"],
                              capture_output=True, text=True)
    assert replaced.returncode == 0, replaced.stderr
    replaced_plan = json.loads(replaced.stdout)
    assert not {"mm0", "mm1"} & set(replaced_plan["saved"])
    assert {"mm0", "mm1"} <= {d["of"] for d in replaced_plan["duplicates"]}
    assert {"a2a0", "a2a1"} <= set(replaced_plan["saved"])  # collectives stay saved
    bad = subprocess.run([exe, str(graph), "--config", str(config), "--op-policy", str(tmp_path / "none.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "none.json" in bad.stderr
