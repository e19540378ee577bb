"""The FX-meta contract (hyper_ac/fx_meta.py): one module spells the keys, each accessor has one default."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from hyper_ac import fx_meta

ROOT = Path(__file__).resolve().parents[2]
#: Where no module but fx_meta may spell a key: the package, the benchmarks and the scripts.
SCANNED = ("hyper_ac", "benchmarks", "scripts")
KEYS = frozenset(getattr(fx_meta, name) for name in fx_meta.__all__
                 if name.isupper() and isinstance(getattr(fx_meta, name), str))
#: Keys that are also field names of the graph document (serialize.py writes them as JSON
#: fields): a literal is a meta key only where it indexes a meta dict.
FORMAT_FIELDS = frozenset({fx_meta.AC_GRAPH_ID})
_META_METHODS = frozenset({"get", "pop", "setdefault", "__contains__", "__getitem__", "__setitem__"})


def _is_meta(expr: ast.AST) -> bool:
    """``x.meta`` or a local named ``meta`` (``meta = node.meta``)."""
    return (isinstance(expr, ast.Attribute) and expr.attr == "meta") or (isinstance(expr, ast.Name) and expr.id == "meta")


def _indexes_meta(const: ast.Constant, parent: ast.AST) -> bool:
    if isinstance(parent, ast.Subscript):
        return parent.slice is const and _is_meta(parent.value)
    if isinstance(parent, ast.Call):
        func = parent.func
        return (isinstance(func, ast.Attribute) and func.attr in _META_METHODS and _is_meta(func.value)
                and bool(parent.args) and parent.args[0] is const)
    if isinstance(parent, ast.Compare):
        return (parent.left is const and all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
                and any(_is_meta(c) for c in parent.comparators))
    return False


def key_spellings(source: str) -> list[tuple[int, str]]:
    """(line, key) of every FX-meta key spelled as a literal in ``source``."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KEYS:
            if node.value not in FORMAT_FIELDS or _indexes_meta(node, parents.get(node)):
                hits.append((node.lineno, node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and _is_meta(node.func.value):
            hits += [(node.lineno, kw.arg) for kw in node.keywords if kw.arg in KEYS]  # meta.update(val=...)
    return sorted(hits)


def test_scanner_finds_every_spelling():
    """The scan below can fail: each way of spelling a key is found, a JSON field of the same name is not."""
    source = '\n'.join([
        'a = node.meta["autograd_backward"]',
        'b = meta.get("ac_module_stack", [])',
        'c = "val" in n.meta',
        'node.meta.pop("ac_graph_id", None)',
        'node.meta.update(ac_role="input")',
        'KEY = "ac_recomputed_from"',
        'doc["ac_graph_id"] = 3',  # the graph document's field: not a meta key
        'text = f"meta[{fx_meta.RECOMPUTE!r}]"',
    ])
    assert key_spellings(source) == [(1, "autograd_backward"), (2, "ac_module_stack"), (3, "val"),
                                     (4, "ac_graph_id"), (5, "ac_role"), (6, "ac_recomputed_from")]


def test_scanner_finds_the_spellings_before_fx_meta():
    """On the sources as they were before fx_meta (a sample kept here), the scan fails."""
    old_partition = 'def _is_backward(node):\n    return bool(node.meta.get("autograd_backward", False))\n'
    old_backends = 'u = node.meta.get("recompute") is not None and node.meta.get("ac_graph_id") is not None\n'
    assert key_spellings(old_partition) == [(2, "autograd_backward")]
    assert key_spellings(old_backends) == [(1, "ac_graph_id"), (1, "recompute")]


def test_no_module_but_fx_meta_spells_a_key():
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "hyper_ac" / "fx_meta.py":
                continue
            for line, key in key_spellings(path.read_text()):
                found.append(f"{path.relative_to(ROOT)}:{line}: {key!r}")
    assert not found, "FX meta keys spelled outside hyper_ac/fx_meta.py (use its constants or accessors):\n" + \
        "\n".join(found)


# --------------------------------------------------------------------------
# accessors: one default each
# --------------------------------------------------------------------------


def _node(**meta) -> fx.Node:
    graph = fx.Graph()
    node = graph.call_function(torch.relu, (graph.placeholder("x"),))
    node.meta.update({getattr(fx_meta, key): value for key, value in meta.items()})
    return node


def test_defaults_of_a_node_without_keys():
    node = _node()
    assert node.meta == {}
    assert fx_meta.is_backward(node) is False  # forward, as torch's readers take it
    assert fx_meta.has_phase(node) is False
    assert fx_meta.policy(node) is None
    assert fx_meta.user_tagged(node) is False
    assert fx_meta.graph_id(node) is None
    assert fx_meta.module_stack(node) == []
    assert fx_meta.role(node) is None and fx_meta.source(node) is None
    assert fx_meta.is_duplicate(node) is False
    assert fx_meta.recomputed_from(node) is None and fx_meta.duplicate_index(node) is None
    assert fx_meta.is_rng_replay(node) is False and fx_meta.rng_replay_of(node) is None
    assert fx_meta.val(node) is None and fx_meta.desc(node) is None
    assert fx_meta.partitioner_tag(node) is None and fx_meta.is_gradient_acc(node) is False
    assert node.meta == {}  # reading writes nothing


def test_phase():
    assert fx_meta.is_backward(_node(BACKWARD=True)) and fx_meta.has_phase(_node(BACKWARD=False))
    assert not fx_meta.is_backward(_node(BACKWARD=False))
    assert not fx_meta.has_phase(_node(BACKWARD=None))
    node = _node()
    fx_meta.set_backward(node, 1)
    assert node.meta == {"autograd_backward": True}


def test_tags_and_user_tagged():
    """One definition of the model's own tag: a policy on the node, with or without a region."""
    tagged = _node(RECOMPUTE=CheckpointPolicy.MUST_RECOMPUTE)
    assert fx_meta.user_tagged(tagged) and fx_meta.graph_id(tagged) is None
    with_region = _node(RECOMPUTE=CheckpointPolicy.PREFER_RECOMPUTE, AC_GRAPH_ID=2)
    assert fx_meta.user_tagged(with_region) and fx_meta.graph_id(with_region) == 2
    # a region without a tag is no tag; a negative or non-int region is none
    assert not fx_meta.user_tagged(_node(AC_GRAPH_ID=0)) and fx_meta.graph_id(_node(AC_GRAPH_ID=0)) is None
    assert fx_meta.graph_id(_node(RECOMPUTE=CheckpointPolicy.MUST_SAVE, AC_GRAPH_ID=-1)) is None
    assert fx_meta.graph_id(_node(RECOMPUTE=CheckpointPolicy.MUST_SAVE, AC_GRAPH_ID="1")) is None
    node = _node()
    fx_meta.set_policy(node, "MUST_SAVE")
    fx_meta.set_graph_id(node, 4)
    assert node.meta == {"recompute": CheckpointPolicy.MUST_SAVE, "ac_graph_id": 4}
    fx_meta.set_policy(node, None)
    fx_meta.set_graph_id(node, None)
    assert node.meta == {}


def test_roles():
    node = _node(SOURCE="layers.0.weight")
    fx_meta.set_role(node, "input")
    assert fx_meta.role(node) == "input" and fx_meta.source(node) is None  # a stale source goes
    fx_meta.set_role(node, "parameter", "w")
    assert node.meta == {"ac_role": "parameter", "ac_source": "w"}
    with pytest.raises(ValueError, match="unknown role 'weight'"):
        fx_meta.set_role(node, "weight")
    assert fx_meta.module_stack(_node(MODULE_STACK=[("layers.0", "Block")])) == [("layers.0", "Block")]


def test_duplicates():
    original = _node(RECOMPUTE=CheckpointPolicy.PREFER_RECOMPUTE, BACKWARD=False)
    copy = _node(RECOMPUTE=CheckpointPolicy.PREFER_RECOMPUTE, BACKWARD=False)
    fx_meta.mark_duplicate(copy, original.name, 3)
    assert copy.meta == {"autograd_backward": True, "ac_recomputed": True, "ac_recomputed_from": original.name,
                         "ac_duplicate": 3}
    assert fx_meta.is_duplicate(copy) and not fx_meta.user_tagged(copy)
    assert fx_meta.recomputed_from(_node(RECOMPUTED_FROM=original)) == original.name  # a node is read as its name
    attr = _node()
    fx_meta.set_duplicate_index(attr, 1)
    assert fx_meta.duplicate_index(attr) == 1 and fx_meta.is_backward(attr) and not fx_meta.is_duplicate(attr)
    fx_meta.mark_rng_replay(copy)
    fx_meta.set_rng_replay_of(attr, "native_dropout")
    assert fx_meta.is_rng_replay(copy) and fx_meta.rng_replay_of(attr) == "native_dropout"


def test_every_key_has_one_constant():
    names = [name for name in fx_meta.__all__ if name.isupper() and isinstance(getattr(fx_meta, name), str)]
    values = [getattr(fx_meta, name) for name in names]
    assert len(set(values)) == len(values)
    assert {"autograd_backward", "recompute", "ac_graph_id", "ac_module_stack", "ac_role", "ac_recomputed",
            "ac_recomputed_from"} <= set(values)
    assert os.path.basename(fx_meta.__file__) == "fx_meta.py"
