"""Graph loading: the core's loaders against Python's ``json.loads`` of the same bytes.

``python -m benchmarks.loading GRAPH.json ...`` prints, per file: the CLI's
load time with the simdjson fast path and with the reference loader
(``hyper-ac-plan GRAPH --timings [--reference-loader]``: read + parse +
validate, in the CLI's own clock), each CLI run's peak RSS, and ``json.loads``
of the same bytes timed in this process in the same run (best of ``--repeat``
each). The scaling part (``python -m benchmarks --parts scaling``) runs
:func:`measure_loading` on its core-only graph.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Optional

from benchmarks.common import plan_cli

_LOAD_RE = re.compile(r"timings: load (?P<load>\S+) s \((?P<path>\w+) loader\)")


# A child's ru_maxrss counts the memory of the process it was forked from (Linux
# records the forked copy's high-water mark at exec), so a CLI started straight
# from this process would report this process's peak, gigabytes once a 1M-node
# graph is held here. A small launcher forks the CLI and prints the CLI's own
# peak; it can only err upwards by the launcher's size at the fork (~15 MiB).
_RSS_LAUNCHER = ("import os, subprocess, sys\n"
                 "proc = subprocess.Popen(sys.argv[1:])\n"
                 "_, status, usage = os.wait4(proc.pid, 0)\n"
                 "sys.stderr.write(f'\\nmaxrss_kib {usage.ru_maxrss}\\n')\n"
                 "sys.exit(os.waitstatus_to_exitcode(status))\n")
_RSS_RE = re.compile(r"^maxrss_kib (?P<kib>\d+)$", re.MULTILINE)


def _cli_load(cli: str, path: str, reference: bool) -> Optional[tuple[float, str, float]]:
    """(load seconds, loader that read it, peak RSS in MiB) of one CLI run without a config."""
    cmd = [sys.executable, "-c", _RSS_LAUNCHER, cli, path, "--timings"] + (["--reference-loader"] if reference else [])
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    m, rss = _LOAD_RE.search(proc.stderr), _RSS_RE.search(proc.stderr)
    if proc.returncode != 0 or m is None or rss is None:
        return None
    return float(m["load"]), m["path"], int(rss["kib"]) / 1024.0


def _json_loads_seconds(data: bytes, repeat: int) -> float:
    best = float("inf")
    for _ in range(max(1, repeat)):
        gc.collect()
        t0 = time.perf_counter()
        doc = json.loads(data)
        best = min(best, time.perf_counter() - t0)
        del doc
    return best


def measure_loading(path: str, repeat: int = 1) -> dict:
    """Loader figures for the graph file ``path`` (keys documented in benchmarks/README.md)."""
    row: dict = {"json_mb": os.path.getsize(path) / 1e6}
    cli = plan_cli()
    if cli is None:
        row["cli_error"] = "hyper-ac-plan not built"
    else:
        for name, reference in (("fast", False), ("reference", True)):
            runs = [_cli_load(cli, path, reference) for _ in range(max(1, repeat))]
            if any(r is None for r in runs):
                row[f"load_{name}_error"] = "the CLI failed or printed no load timing"
                continue
            row[f"load_{name}_seconds"] = min(r[0] for r in runs)
            row[f"load_{name}_loader"] = runs[0][1]
            row[f"load_{name}_rss_mib"] = min(r[2] for r in runs)
    with open(path, "rb") as f:
        data = f.read()
    row["json_loads_seconds"] = _json_loads_seconds(data, repeat)
    del data
    for name in ("fast", "reference"):
        if row.get(f"load_{name}_seconds") is not None:
            row[f"load_{name}_vs_json_loads"] = row[f"load_{name}_seconds"] / row["json_loads_seconds"]
    return row


def measure_loading_text(text: str, repeat: int = 1) -> dict:
    """:func:`measure_loading` on a document held in memory (written to a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.json")
        with open(path, "w") as f:
            f.write(text)
        return measure_loading(path, repeat)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loading", description=__doc__.splitlines()[0])
    parser.add_argument("graphs", nargs="+", help="graph JSON files (docs/graph-format.md)")
    parser.add_argument("--repeat", type=int, default=1, help="best of N for every figure (default 1)")
    args = parser.parse_args(argv)
    print("| graph | MB | fast load s | reference load s | json.loads s | fast / json.loads | reference / json.loads "
          "| fast peak RSS MiB | reference peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in args.graphs:
        r = measure_loading(path, args.repeat)

        def f(key: str, fmt: str = "{:.3f}") -> str:
            return fmt.format(r[key]) if r.get(key) is not None else "–"

        print(f"| {os.path.basename(path)} | {r['json_mb']:.1f} | {f('load_fast_seconds')} | "
              f"{f('load_reference_seconds')} | {f('json_loads_seconds')} | {f('load_fast_vs_json_loads', '{:.3f}×')} | "
              f"{f('load_reference_vs_json_loads', '{:.3f}×')} | {f('load_fast_rss_mib', '{:.0f}')} | "
              f"{f('load_reference_rss_mib', '{:.0f}')} |")
        if r.get("load_fast_loader") not in (None, "fast"):
            print(f"  note: the fast path declined {path} (the reference loader read it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
