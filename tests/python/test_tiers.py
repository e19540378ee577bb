"""Imports run with the flow (issue 39; docs/architecture.md, "Layout").

Inside ``hyper_ac/`` the tiers are frontend → planning → lower → display: a
module imports from its own tier or an earlier one. The modules at the
package's top (``fx_meta``, ``_fx``, ``_gc``, ``memory``, ``models``) sit below
every tier and import none of them. Every import counts: at module level,
inside functions, relative ones.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Optional

PACKAGE = Path(__file__).resolve().parents[2] / "hyper_ac"
TIERS = ("frontend", "planning", "lower", "display")
# The package's entry points import whatever they expose; the eager runtime stands beside the tiers.
UNCHECKED = {"__init__", "__main__", "eager"}


def _tier_of(module: str) -> Optional[str]:
    """``frontend``..``display`` for a module of a tier, ``base`` for one at the package's top, None outside."""
    parts = module.split(".")
    if parts[0] != "hyper_ac" or len(parts) < 2:
        return None
    if parts[1] in TIERS:
        return parts[1]
    if parts[1] in UNCHECKED or parts[1].startswith("_core") or parts[1] == "_memory":
        return None
    return "base"


def _rank(tier: str) -> int:
    return -1 if tier == "base" else TIERS.index(tier)


def _imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``source``, ``module`` being its dotted name."""
    package = module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from hyper_ac import display` imports the module hyper_ac.display
            out += [(node.lineno, f"{target}.{alias.name}" if _tier_of(f"{target}.{alias.name}") not in (None, "base")
                     and _tier_of(target) is None else target) for alias in node.names]
    return out


def violations(source: str, module: str) -> list[str]:
    tier = _tier_of(module)
    if tier is None:
        return []
    found = []
    for line, imported in _imports(source, module):
        other = _tier_of(imported)
        if other is None or other == tier:
            continue
        if _rank(other) > _rank(tier):
            found.append(f"{module.replace('.', '/')}.py:{line}: imports {imported} ({tier} may not import from {other})")
    return found


def test_no_import_runs_against_the_tiers():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("hyper_ac", *path.relative_to(PACKAGE).with_suffix("").parts))
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")] + ".__init__"
        found += violations(path.read_text(), module)
    assert not found, "imports against the tier order:\n" + "\n".join(found)


def test_the_check_sees_every_kind_of_import():
    inside_a_function = "def f():\n    from hyper_ac.lower.apply import apply_plan\n"
    assert violations(inside_a_function, "hyper_ac.planning.passes") == [
        "hyper_ac/planning/passes.py:2: imports hyper_ac.lower.apply (planning may not import from lower)"]
    relative = "from ..display import timeline\n"
    assert len(violations(relative, "hyper_ac.lower.backends")) == 1
    a_tier_by_name = "from hyper_ac import display\n"
    assert len(violations(a_tier_by_name, "hyper_ac.frontend.capture")) == 1
    from_the_base = "import hyper_ac.frontend.capture\n"
    assert len(violations(from_the_base, "hyper_ac.memory")) == 1
    with_the_flow = "from hyper_ac.frontend.capture import capture_joint\nfrom hyper_ac import fx_meta, _fx\n"
    assert violations(with_the_flow, "hyper_ac.lower.whatif") == []


# --------------------------------------------------------------------------
# the C++ core: includes in stage order
# --------------------------------------------------------------------------

CORE = PACKAGE.parent / "core"
# The pipeline's order (docs/architecture.md, "Data flow"); a file belongs to the stage its name starts with.
# The graph stage holds the foundations every stage reads (loading, the node index, diagnostics, the alias rule).
STAGES = ("graph", "scope", "config", "tagging", "cost", "mincut", "remat", "simulate", "split", "plan")
_FOUNDATIONS = ("graph", "json_reader", "string_ids", "node_index", "diagnostic", "saturate", "alias")
_LATER_STAGE_FILES = {"schedule": "remat"}  # the rewritten step as flat arrays: remat's
MAX_CORE_INCLUDES_AGAINST_ORDER = 3


def _stage_of(filename: str) -> Optional[str]:
    stem = Path(filename).stem
    for prefix, stage in _LATER_STAGE_FILES.items():
        if stem.startswith(prefix):
            return stage
    if stem.startswith(_FOUNDATIONS):
        return "graph"
    for stage in STAGES:
        if stem.startswith(stage):
            return stage
    return None


def core_includes_against_order(files: dict) -> list[str]:
    """``files``: name -> text. Each ``#include "..."`` of a later stage's header, as 'file -> header'."""
    found = []
    for name, text in sorted(files.items()):
        own = _stage_of(name)
        if own is None:
            continue
        for header in re.findall(r'#include "(?:hyper_ac/)?([^"]+)"', text):
            other = _stage_of(header)
            if other is not None and STAGES.index(other) > STAGES.index(own):
                found.append(f"{name} -> {header} ({own} includes {other})")
    return found


def test_core_includes_follow_the_stage_order():
    files = {p.name: p.read_text() for p in CORE.rglob("*") if p.suffix in (".h", ".cc")}
    assert not any(name == "indexed_stages.h" for name in files), "a header that includes every stage"
    against = core_includes_against_order(files)
    assert len(against) <= MAX_CORE_INCLUDES_AGAINST_ORDER, "includes against the stage order:\n" + "\n".join(against)
    # The check sees one: a stage that includes a later stage's header.
    assert core_includes_against_order({"scope.cc": '#include "hyper_ac/plan.h"\n#include "node_index.h"\n'}) == [
        "scope.cc -> plan.h (scope includes plan)"]
