#!/usr/bin/env python3
"""Mutation testing of the core rules (issue 14).

Each mutation breaks one rule on purpose in a temporary copy of the tree
(`git ls-files` + untracked files, no build dirs), rebuilds there (one -O0
build of the Catch2 tests, then only the mutated file per mutation) and runs
the test subset meant to catch it; the file is restored afterwards. A mutation the tests do not catch ("SURVIVED")
is a hole in the suite. Mutations are (file, exact old snippet, new snippet):
when the core moves, update the snippets here; a snippet that is not found
exactly once is reported as STALE, never silently skipped.

    python scripts/mutate.py                 # every mutation
    python scripts/mutate.py budget_first    # the named ones
    python scripts/mutate.py --list

C++ mutations rebuild the Catch2 tests only (cmake, no Python modules); the
Python mutation (apply, in hyper_ac/lower/apply.py) runs pytest from the copy's
source tree against the installed `hyper_ac._core` (PYTHON, default the
running interpreter).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Mutation:
    name: str
    what: str
    path: str
    old: str
    new: str
    # ("ctest", Catch2 test spec) or ("pytest", [pytest args])
    catch: tuple


MUTATIONS = [
    Mutation(
        "cross_unit_first_user",
        "cross-unit check looks only at a value's first forward user",
        "core/src/tagging.cc",
        """          if (scope.node_unit[u] != unit) {
            crosses = true;
            break;
          }""",
        """          crosses = scope.node_unit[u] != unit;
          stack.clear();
          break;""",
        ("ctest", "[tagging]"),
    ),
    Mutation(
        "cross_unit_no_projection",
        "cross-unit check does not walk through getitem / wait_tensor",
        "core/src/tagging.cc",
        "if (user.kind == NodeKind::CallFunction && transparent(user) && result.policies[u] == policy) {",
        "if (false && user.kind == NodeKind::CallFunction && transparent(user) && result.policies[u] == policy) {",
        ("ctest", "[tagging]"),
    ),
    Mutation(
        "no_capacity_scaling",
        "min-cut capacities are never scaled (unit always 1)",
        "core/src/mincut.cc",
        "const double unit = total_bytes > kMaxTotalUnits ? std::nextafter(total_bytes / kMaxTotalUnits, HUGE_VAL) : 1.0;",
        "const double unit = 1.0 + 0.0 * total_bytes;",
        ("ctest", "[mincut]"),
    ),
    Mutation(
        "budget_first_point",
        "budget mode takes the first frontier point whether it fits or not",
        "core/src/plan_budget.cc",
        "    if (scored_bytes(evaluation, scope) <= target) {",
        "    if (true) {",
        ("ctest", "[plan],[tagging]"),
    ),
    Mutation(
        "budget_no_descent",
        "budget mode keeps the first fitting frontier point (no descent towards the cheapest fitting set)",
        "core/src/plan_budget.cc",
        "  if (met) {",
        "  if (false && met) {",
        ("ctest", "[plan],[tagging]"),
    ),
    Mutation(
        "budget_f_not_1_minus_f",
        "budget fraction f keeps 1 - f of the activations instead of f",
        "core/src/plan_budget.cc",
        "(1.0 - fraction) * activations",
        "fraction * activations",
        ("ctest", "[plan],[tagging]"),
    ),
    Mutation(
        "duplicates_at_backward_start",
        "apply inserts every duplicate before the earliest insertion point (the start of the backward)",
        "hyper_ac/lower/apply.py",
        """        before = node_named(entry["before"], "insertion point")""",
        """        before = min((node_named(e["before"], "insertion point") for e in plan["duplicates"]),
                     key=lambda n, _o={x: k for k, x in enumerate(graph.nodes)}: _o[n])""",
        ("pytest", ["tests/python/test_rule_checks.py", "tests/python/test_passes.py", "-k",
                    "duplicate or gradients_bitwise"]),
    ),
]


# Runs pytest with `hyper_ac` imported from the copy (argv[1]); exit 3 when
# that cannot be arranged.
PYTEST_FROM_COPY = """
import os, sys
root = sys.argv.pop(1)
sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__
                    and not type(f).__module__.startswith("_editable")]
import hyper_ac, hyper_ac.lower.apply
if not os.path.abspath(hyper_ac.lower.apply.__file__).startswith(os.path.abspath(root) + os.sep):
    print("hyper_ac imports from " + hyper_ac.lower.apply.__file__ + ", not from the mutated copy " + root)
    sys.exit(3)
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def copy_tree(dest: str) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue
        os.makedirs(os.path.dirname(os.path.join(dest, rel)) or dest, exist_ok=True)
        shutil.copy2(src, os.path.join(dest, rel))


def run(cmd, cwd, env=None, log=None) -> int:
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log is not None:
        log.append(f"$ {' '.join(cmd)}\n{proc.stdout[-4000:]}")
    return proc.returncode


class Workspace:
    """One copy of the tree and one C++ build (-O0: fast to compile), reused by
    every mutation: each rebuild recompiles only the mutated file."""

    def __init__(self, root: str, jobs: str, python: str):
        self.root, self.jobs, self.python = root, jobs, python
        self.build = os.path.join(root, "build", "mutate")
        self.built = False
        self.baseline: dict[str, int] = {}

    def ensure_build(self, log: list) -> bool:
        if self.built:
            return True
        if run(["cmake", "-S", self.root, "-B", self.build, "-DCMAKE_BUILD_TYPE=Debug",
                "-DCMAKE_CXX_FLAGS_DEBUG=-O0"], self.root, log=log) != 0:
            return False
        self.built = run(["cmake", "--build", self.build, "-j", self.jobs, "--target", "hyper_ac_tests"],
                         self.root, log=log) == 0
        return self.built


def try_mutation(m: Mutation, ws: Workspace) -> tuple[str, str]:
    log: list[str] = []
    path = os.path.join(ws.root, m.path)
    original = open(path).read()
    if original.count(m.old) != 1:
        return "STALE", f"old snippet found {original.count(m.old)} times in {m.path}"
    kind, spec = m.catch
    if kind == "ctest" and not ws.ensure_build(log):
        return "BUILD-FAILED", "the unmutated tree does not build: " + log[-1][-300:]
    # The subset must pass unmutated, or a failure says nothing about the mutation.
    if kind == "ctest":
        if spec not in ws.baseline:
            ws.baseline[spec] = run([os.path.join(ws.build, "hyper_ac_tests"), spec], ws.root, log=log)
        if ws.baseline[spec] != 0:
            return "BASELINE-FAILS", f"{spec} fails without the mutation"
    try:
        open(path, "w").write(original.replace(m.old, m.new))
        if kind == "ctest":
            if run(["cmake", "--build", ws.build, "-j", ws.jobs, "--target", "hyper_ac_tests"], ws.root, log=log) != 0:
                return "KILLED", "does not compile"
            rc = run([os.path.join(ws.build, "hyper_ac_tests"), spec], ws.root, log=log)
        else:
            env = dict(os.environ)
            # The copy's Python sources, the installed extension modules.
            import importlib.util

            installed = os.path.dirname(importlib.util.find_spec("hyper_ac._core").origin)
            for so in os.listdir(installed):
                if so.endswith(".so"):
                    shutil.copy2(os.path.join(installed, so), os.path.join(ws.root, "hyper_ac", so))
            env["PYTHONPATH"] = ws.root
            # An editable install (scikit-build-core) puts a finder on
            # sys.meta_path that maps `hyper_ac` to the worktree whatever
            # PYTHONPATH says: without dropping it the tests would import the
            # unmutated package and every Python mutation would "survive".
            rc = run([ws.python, "-c", PYTEST_FROM_COPY, ws.root, "-x", "-q", "-p", "no:cacheprovider", *spec],
                     ws.root, env=env, log=log)
            if rc == 3:
                return "HARNESS", log[-1].strip().splitlines()[-1][:160]
    finally:
        open(path, "w").write(original)
        os.utime(path)
    if rc == 0:
        return "SURVIVED", "the tests passed with the rule broken"
    lines = log[-1].splitlines()
    failed = [line for line in lines if line.startswith("FAILED") or "FAILED:" in line or " failed" in line]
    where = [line for line in lines if "TEST_CASE" in line or line.endswith("...") or "test cases" in line]
    return "KILLED", ((failed or where or lines[-1:])[0])[:160]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree")
    parser.add_argument("--workdir", help="reuse this copy (and its build/mutate) across runs")
    parser.add_argument("--jobs", default=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    if args.list or not chosen:
        for m in MUTATIONS:
            print(f"{m.name:30s} {m.path:22s} {m.what}")
        return 0 if chosen or args.list else 2
    python = os.environ.get("PYTHON", sys.executable)
    root = args.workdir or tempfile.mkdtemp(prefix="hyper_ac-mutate-")
    if not os.path.exists(os.path.join(root, "CMakeLists.txt")) or not args.workdir:
        copy_tree(root)
    ws = Workspace(root, args.jobs, python)
    survived = 0
    print(f"{'mutation':30s} {'result':10s} {'seconds':>7s}  detail", flush=True)
    try:
        for m in chosen:
            t0 = time.time()
            result, detail = try_mutation(m, ws)
            survived += result != "KILLED"
            print(f"{m.name:30s} {result:10s} {time.time() - t0:7.0f}  {detail}", flush=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
