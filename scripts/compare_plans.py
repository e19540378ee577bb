"""Do two builds of the core plan alike? A before/after check for a restructure of core/.

    python3 scripts/compare_plans.py BEFORE/_core*.so AFTER/_core*.so

Every graph JSON the repository holds (tests/data, the fuzz corpus and its
regressions, the graph part of each input) is planned under every config it holds
(the modes as tests/python/test_plan_identity.py writes them, every preset in
configs/, and each distinct config of the fuzz corpus), each pair in several
forms: the full and the compact plan document, with a stock partition to compare
against, with unitless graphs routed to stock, with two deterministic peak oracles
(the candidates the oracle is shown are part of the record), the split, and the
frontier. Each build runs in a process of its own (two `_core` modules cannot share
one). The record is sha256 per (graph, config, form); an error counts as its type
and message. Exit status 1 when any differs.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def mode_configs() -> dict:
    """test_plan_identity's MODE_CONFIGS, read from its source (importing the test would load the installed core)."""
    tree = ast.parse((ROOT / "tests" / "python" / "test_plan_identity.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MODE_CONFIGS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError("tests/python/test_plan_identity.py defines no MODE_CONFIGS")


def _sha(text) -> str:
    return hashlib.sha256(text if isinstance(text, bytes) else text.encode()).hexdigest()


def inputs() -> tuple[dict, dict]:
    """(graph name -> graph JSON bytes, config name -> config JSON text), each graph and config once."""
    graphs, configs = {}, {}
    for path in sorted((ROOT / "tests" / "data").glob("*.json")):
        text = path.read_bytes()
        if b'"hyper_ac.graph"' in text[:200]:
            graphs[f"data:{path.stem}"] = text
    seen = {_sha(g) for g in graphs.values()}
    fuzz_configs = set()
    for path in sorted((ROOT / "tests" / "fuzz").rglob("*")):
        if not path.is_file() or path.name.startswith(".") or path.suffix in (".cc", ".dict", ".json", ".md"):
            continue
        graph, nul, config = path.read_bytes().partition(b"\0")
        if _sha(graph) not in seen:
            seen.add(_sha(graph))
            graphs[f"fuzz:{path.stem.split('__')[0]}:{_sha(graph)[:8]}"] = graph
        if nul and config:
            fuzz_configs.add(config.decode())
    configs.update({name: json.dumps(c) for name, c in mode_configs().items()})
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.stem != "op_policy":
            configs[f"preset:{path.stem}"] = json.dumps(yaml.safe_load(path.read_text()))
    configs.update({f"fuzz:{_sha(c)[:8]}": c for c in sorted(fuzz_configs)})
    return graphs, configs


def _forward_names(graph: bytes) -> list:
    try:
        nodes = json.loads(graph).get("nodes", [])
    except (ValueError, AttributeError):
        return []
    names = [n.get("name") for n in nodes if isinstance(n, dict) and n.get("phase") == "forward"
             and n.get("kind") == "call_function"]
    return [n for n in names if isinstance(n, str)][::2]


def _oracle(factor: float, calls: list):
    def measure(plan_json: str) -> int:
        calls.append(_sha(plan_json))
        stats = json.loads(plan_json).get("stats", {})
        return int(stats.get("simulated_peak_after", stats.get("simulated_peak_before", 1 << 20)) * factor)
    return measure


def dump(core_path: str, out: str) -> None:
    spec = importlib.util.spec_from_file_location("_core", core_path)
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    graphs, configs = inputs()
    record = {"default_op_policy": _sha(core.DEFAULT_OP_POLICY)}

    def run(key, call):
        try:
            result = call()
        except Exception as error:  # an outcome like any other: compared, not hidden
            result = f"{type(error).__name__}: {error}"
        record[key] = _sha(json.dumps(result) if not isinstance(result, str) else result)

    for cname, config in configs.items():
        run(f"validate_config | {cname}", lambda: core.validate_config(config))
    for gname, graph in graphs.items():
        stock = _forward_names(graph)
        for cname, config in configs.items():
            key = f"{gname} | {cname}"
            run(f"{key} | full", lambda: core.plan(graph, config, detail=True, timeline=True))
            run(f"{key} | compact", lambda: core.plan(graph, config))
            run(f"{key} | stock", lambda: core.plan(graph, config, detail=True, stock_recomputed=stock))
            run(f"{key} | unitless", lambda: core.plan(graph, config, detail=True, unitless_to_stock=True))
            for factor in (0.6, 1.4):
                calls: list = []
                run(f"{key} | oracle x{factor}",
                    lambda: [core.plan(graph, config, detail=True, peak_oracle=_oracle(factor, calls)), calls])
            run(f"{key} | split", lambda: list(core.plan_split(graph, config, detail=True)))
            run(f"{key} | frontier", lambda: core.frontier(graph.decode(), config))
    Path(out).write_text(json.dumps({"graphs": len(graphs), "configs": len(configs), "record": record}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cores", nargs="*", help="BEFORE and AFTER _core*.so")
    parser.add_argument("--dump", nargs=2, metavar=("CORE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump:
        dump(*args.dump)
        return 0
    if len(args.cores) != 2:
        parser.error("give two _core modules: before and after")
    with tempfile.TemporaryDirectory() as tmp:
        outs = [f"{tmp}/before.json", f"{tmp}/after.json"]
        procs = [subprocess.Popen([sys.executable, __file__, "--dump", core, out]) for core, out in zip(args.cores, outs)]
        if any(p.wait() for p in procs):
            print("a dump failed", file=sys.stderr)
            return 2
        before, after = (json.loads(Path(o).read_text()) for o in outs)
    differ = sorted(k for k in before["record"].keys() | after["record"].keys()
                    if before["record"].get(k) != after["record"].get(k))
    pairs = before["graphs"] * before["configs"]
    print(f"{before['graphs']} graphs x {before['configs']} configs = {pairs} (graph, config) pairs, "
          f"{len(before['record'])} outputs compared: {len(differ)} differ")
    for key in differ[:50]:
        print("  differs:", key)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
