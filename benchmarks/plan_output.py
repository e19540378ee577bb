"""From graph bytes to plan bytes: the CLI and the Python route against ``json.loads``.

``python -m benchmarks.plan_output GRAPH.json [--repeat N] [--out DIR]`` measures,
in one run on the same file:

- ``hyper-ac-plan GRAPH --config auto.json --json --out PLAN`` (load, plan,
  plan document written to a file), its wall time (the whole process) and
  peak RSS, for the compact form (the default) and the full one (``--detail``);
- the Python route, in a fresh interpreter: read the file's bytes, ``hyper_ac.plan``
  on the graph document (``_core.plan`` and ``json.loads`` of the plan it
  returns), its wall time (from the read to the plan in hand; the imports are
  not counted) and the interpreter's peak RSS (torch included);
- Python's ``json.loads`` of the same graph bytes, in this process.

Best of ``--repeat`` each (wall and RSS each their own best). The scaling
part (``python -m benchmarks --parts scaling``) runs :func:`measure_plan_output`
on its ~1M-node graph; ``--out`` writes ``results.md`` and ``results.json``
with the command, commit, date and machine in the header.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Optional

from benchmarks.common import hac_config, plan_cli
from benchmarks.loading import _json_loads_seconds

# Runs a command, then prints its wall time and peak RSS (the child's own: see loading.py's launcher).
_LAUNCHER = ("import os, subprocess, sys, time\n"
             "t0 = time.perf_counter()\n"
             "proc = subprocess.Popen(sys.argv[1:])\n"
             "_, status, usage = os.wait4(proc.pid, 0)\n"
             "sys.stderr.write(f'\\nwall_seconds {time.perf_counter() - t0}\\nmaxrss_kib {usage.ru_maxrss}\\n')\n"
             "sys.exit(os.waitstatus_to_exitcode(status))\n")
_WALL_RE = re.compile(r"^wall_seconds (?P<s>\S+)$", re.MULTILINE)
_RSS_RE = re.compile(r"^maxrss_kib (?P<kib>\d+)$", re.MULTILINE)
_ROUTE_RE = re.compile(r"^route_seconds (?P<s>\S+)$", re.MULTILINE)

# The Python route in a fresh interpreter: imports first (not timed), then file -> plan in hand.
_ROUTE = ("import sys, time\n"
          "from hyper_ac import plan  # loads hyper_ac.planning.passes and torch: imports are not the route\n"
          "from hyper_ac.planning.config import load_config\n"
          "cfg = load_config(sys.argv[2])\n"
          "t0 = time.perf_counter()\n"
          "with open(sys.argv[1], 'rb') as f:  # bytes: the core reads them in place\n"
          "    text = f.read()\n"
          "result = plan(text, cfg)\n"
          "t1 = time.perf_counter()\n"
          "assert result.plan['stats']['nodes_duplicated'] >= 0\n"
          "print(f'route_seconds {t1 - t0}', file=sys.stderr)\n")


def _launch(cmd: list[str]) -> Optional[tuple[float, float, str]]:
    """(wall seconds, peak RSS MiB, stderr) of one run of ``cmd``; None if it failed."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall, rss = _WALL_RE.search(proc.stderr), _RSS_RE.search(proc.stderr)
    if proc.returncode != 0 or wall is None or rss is None:
        sys.stderr.write(proc.stderr[-2000:])
        return None
    return float(wall["s"]), int(rss["kib"]) / 1024.0, proc.stderr


def measure_plan_output(path: str, repeat: int = 1, mode: str = "auto") -> dict:
    """The figures of this module's docstring for the graph file ``path`` (keys in benchmarks/README.md)."""
    from hyper_ac.planning.config import load_config, op_policy_json

    row: dict = {"json_mb": os.path.getsize(path) / 1e6, "mode": mode, "repeat": repeat}
    cli = plan_cli()
    with tempfile.TemporaryDirectory() as tmp:
        cfg, table, plan = (os.path.join(tmp, n) for n in ("config.json", "op_policy.json", "plan.json"))
        with open(cfg, "w") as f:
            f.write(load_config(hac_config(mode)).json_for(None))
        with open(table, "w") as f:
            f.write(op_policy_json())
        for form, extra in (("compact", []), ("full", ["--detail"])):
            if cli is None:
                row["cli_error"] = "hyper-ac-plan not built"
                break
            runs = [_launch([cli, path, "--config", cfg, "--op-policy", table, "--json", "--out", plan, *extra])
                    for _ in range(max(1, repeat))]
            if any(r is None for r in runs):
                row[f"cli_{form}_error"] = "the CLI failed"
                continue
            row[f"cli_{form}_wall_seconds"] = min(r[0] for r in runs)
            row[f"cli_{form}_rss_mib"] = min(r[1] for r in runs)
            row[f"cli_{form}_plan_mb"] = os.path.getsize(plan) / 1e6
        runs = [_launch([sys.executable, "-c", _ROUTE, path, cfg]) for _ in range(max(1, repeat))]
        if all(r is not None for r in runs):
            row["python_route_seconds"] = min(float(_ROUTE_RE.search(r[2])["s"]) for r in runs)
            row["python_route_process_seconds"] = min(r[0] for r in runs)
            row["python_route_rss_mib"] = min(r[1] for r in runs)
        else:
            row["python_route_error"] = "the Python route failed"
    with open(path, "rb") as f:
        data = f.read()
    row["json_loads_seconds"] = _json_loads_seconds(data, repeat)
    del data
    if row.get("cli_compact_wall_seconds") is not None:
        row["cli_vs_json_loads"] = row["cli_compact_wall_seconds"] / row["json_loads_seconds"]
        if row.get("python_route_seconds") is not None:
            row["python_route_vs_cli"] = row["python_route_seconds"] / row["cli_compact_wall_seconds"]
    return row


def measure_plan_output_text(text: str, repeat: int = 1, mode: str = "auto") -> dict:
    """:func:`measure_plan_output` on a document held in memory (written to a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.json")
        with open(path, "w") as f:
            f.write(text)
        return measure_plan_output(path, repeat, mode)


TARGETS = (("cli_vs_json_loads", 0.25, "CLI wall ≤ 0.25× json.loads"),
           ("cli_compact_rss_mib", 1024.0, "CLI peak RSS ≤ 1 GiB"),
           ("python_route_vs_cli", 2.0, "Python route ≤ 2× the CLI's wall"),
           ("python_route_rss_mib", 1536.0, "Python route peak RSS ≤ 1.5 GiB"))


def markdown(rows: list[dict], header: str) -> str:
    """A table per run plus the targets, under ``header``."""
    def f(r: dict, key: str, fmt: str = "{:.2f}") -> str:
        return fmt.format(r[key]) if r.get(key) is not None else "–"

    lines = [header, "",
             "| run | graph MB | json.loads s | CLI compact wall s | RSS MiB | plan MB | CLI full wall s | RSS MiB | "
             "plan MB | Python route s | (process s) | RSS MiB | CLI / json.loads | Python / CLI |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | {f(r, 'json_mb', '{:.0f}')} | {f(r, 'json_loads_seconds')} | "
                     f"{f(r, 'cli_compact_wall_seconds')} | {f(r, 'cli_compact_rss_mib', '{:.0f}')} | "
                     f"{f(r, 'cli_compact_plan_mb', '{:.1f}')} | {f(r, 'cli_full_wall_seconds')} | "
                     f"{f(r, 'cli_full_rss_mib', '{:.0f}')} | {f(r, 'cli_full_plan_mb', '{:.1f}')} | "
                     f"{f(r, 'python_route_seconds')} | {f(r, 'python_route_process_seconds')} | "
                     f"{f(r, 'python_route_rss_mib', '{:.0f}')} | "
                     f"{f(r, 'cli_vs_json_loads', '{:.3f}×')} | {f(r, 'python_route_vs_cli', '{:.2f}×')} |")
    lines.append("")
    for key, limit, what in TARGETS:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            worst = max(values)
            lines.append(f"- {what}: {'met in every run' if worst <= limit else 'NOT met in every run'} (met in "
                         f"{sum(v <= limit for v in values)} of {len(values)} runs; worst {worst:.3f})")
    return "\n".join(lines) + "\n"


def _meta(argv: list[str], path: str, conditions: str) -> dict:
    """Provenance of a run (benchmarks/provenance.py): what ran, on which code, where, when."""
    from benchmarks.provenance import code_commit, machine_load

    return {"command": "python -m benchmarks.plan_output " + " ".join(argv), "commit": code_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "load": machine_load(), "affinity": sorted(os.sched_getaffinity(0)), "conditions": conditions,
            "graph": os.path.basename(path), "graph_mb": os.path.getsize(path) / 1e6}


def _header(meta: dict) -> str:
    from benchmarks.report import provenance_header

    return "\n".join(["# Plan output at scale", "", *provenance_header(meta),
                      f"- pinned to CPUs {meta['affinity']}",
                      f"- conditions: {meta['conditions'] or 'not stated'}",
                      f"- graph: {meta['graph']} ({meta['graph_mb']:.0f} MB)", "",
                      "Columns are explained in benchmarks/README.md (\"Plan output\")."])


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_output", description=__doc__.splitlines()[0])
    parser.add_argument("graph", help="a graph JSON file (docs/graph-format.md)")
    parser.add_argument("--repeat", type=int, default=1, help="best of N within each run (default 1)")
    parser.add_argument("--runs", type=int, default=1, help="independent runs, one table row each (default 1)")
    parser.add_argument("--mode", default="auto", help="the config's mode (default auto)")
    parser.add_argument("--out", help="write results.md, results.json and meta.json to this directory")
    parser.add_argument("--conditions", default="", help="how the machine was shared, for the header")
    args = parser.parse_args(argv)
    meta = _meta(argv, args.graph, args.conditions)
    rows = [measure_plan_output(args.graph, args.repeat, args.mode) for _ in range(max(1, args.runs))]
    text = markdown(rows, _header(meta))
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
