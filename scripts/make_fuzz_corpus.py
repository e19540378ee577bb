"""Writes the fuzz corpus (tests/fuzz/corpus) and dictionary (tests/fuzz/json.dict).

Every seed is one fuzz input (docs/testing.md, "Fuzzing"): a graph in today's
format, one NUL byte, the core's canonical config JSON for it. The graphs are
the captured joint graphs of every built-in model (``hyper_ac.models``, two
units each at the smallest sizes) and of small block models with in-place
writes, random ops, collectives, an MoE all-to-all, SymInts, a mutated buffer
and user checkpoint tags; ``tests/data``'s valid JSON graphs are added as they
are. Every graph is paired with every mode and preset config, the small ones
also with the budget / lambda / option configs that reach the rest of the
planner. A pair is written only when the core plans it: a seed the loader
rejects belongs in ``tests/fuzz/corpus/rejected/`` (kept by hand, never
touched here). ``tests/python/test_fuzz_corpus.py`` checks the result.

    python scripts/make_fuzz_corpus.py            # corpus + dictionary
    python scripts/make_fuzz_corpus.py --dict-only

Deterministic for a given torch / transformers: models are seeded.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "tests" / "fuzz"
CORPUS = FUZZ / "corpus"
DICT = FUZZ / "json.dict"
OP_POLICY = FUZZ / "op_policy.json"  # the table fuzz_plan plans with

sys.path.insert(0, str(ROOT))

# Each mode alone (budget as the tests write it); then every preset file (by name).
MODE_CONFIGS: dict[str, Any] = {
    "off": {"ac_mode": "off"},
    "full": {"ac_mode": "full"},
    "selective": {"ac_mode": "selective"},
    "auto": {"ac_mode": "auto"},
    "budget": {"ac_mode": "budget", "ac_memory_budget": 0.5},
}
# The rest of the planner: budget points along the frontier, lambda / hardware /
# compiler variants (the min-cut's cost model), and the scope and tag options.
# Paired with the small graphs only (SMALL_GRAPH_BYTES).
EXTRA_CONFIGS: dict[str, Any] = {
    "budget_0.05": {"ac_mode": "budget", "ac_memory_budget": 0.05},
    "budget_0.95": {"ac_mode": "budget", "ac_memory_budget": 0.95},
    "budget_bytes": {"activation_checkpoint": {"mode": "budget", "memory_budget": "16KiB", "hardware": "a100"}},
    "budget_no_limit": {"ac_mode": "budget", "ac_memory_budget": 1e19},
    "budget_inductor": {"ac_mode": "budget", "ac_memory_budget": 0.3, "ac_compiler": "inductor"},
    "auto_lambda_0": {"ac_mode": "auto", "ac_lambda": 0},
    "auto_lambda_1e15": {"ac_mode": "auto", "ac_lambda": 1e15},
    "auto_inductor": {"activation_checkpoint": {"mode": "auto", "compiler": "inductor", "hardware": "h200"}},
    "auto_custom_hw": {"activation_checkpoint": {"mode": "auto",
                                                 "hardware": {"peak_flops": 1e12, "memory_bandwidth": 1e9}}},
    "auto_measured": {"ac_mode": "auto", "ac_hardware": "measured"},
    "budget_measured_inductor": {"activation_checkpoint": {"mode": "budget", "memory_budget": 0.4,
                                                           "hardware": "measured", "compiler": "inductor"}},
    "auto_whole_graph": {"ac_mode": "auto", "ac_scope": "whole_graph"},
    "full_whole_graph": {"ac_mode": "full", "ac_scope": "whole_graph"},
    "budget_unit_graph": {"ac_mode": "budget", "ac_memory_budget": 0.5, "ac_scope": "unit_graph"},
    "auto_unit_graph": {"ac_mode": "auto", "ac_scope": "unit_graph"},
    "full_last_unit": {"ac_mode": "full", "ac_layer_indices": [1]},
    "full_output_recompute": {"activation_checkpoint": {"mode": "full",
                                                        "regions": {"output_recompute": True}}},
    "auto_output_recompute": {"activation_checkpoint": {"mode": "auto",
                                                        "regions": {"output_recompute": True}}},
    "selective_rng_save": {"ac_mode": "selective", "ac_rng": "save", "ac_save_forward_all_gather": True},
    "selective_op_policy": {"activation_checkpoint": {"mode": "selective", "split": "torch",
                                                      "op_policy": {"must_save": ["aten::relu"],
                                                                    "must_recompute": ["aten::mm"]}}},
}
# Tried on every graph, written where the core plans it: the experts of the MoE
# graphs excluded (the moe preset's patterns name transformers' older Mixtral).
EXCLUDE_CONFIGS: dict[str, Any] = {
    "selective_exclude_experts": {"activation_checkpoint": {"mode": "selective",
                                                            "regions": {"exclude": ["*.experts"]}}},
}
# A graph document (compact wire form) at most this large gets the modes and
# EXTRA_CONFIGS too; a larger one (the transformers: 90-290 KB) the presets
# only, to keep the corpus near 10 MB and the fuzz run's first pass short.
SMALL_GRAPH_BYTES = 64 * 1024
# Graphs also written with measured op times (``measured_seconds``), with the
# `hardware: measured` configs only. The times are synthesised from each
# node's FLOPs and bytes (not timed), so the corpus stays reproducible.
MEASURED_FORM = ("mlp", "transformer")
# Graphs also written in the full (non-compact) form, with these configs.
FULL_FORM = {"mlp": ("mode_auto", "mode_budget"), "collectives": ("mode_selective",), "user_tagged": ("mode_auto",)}


# --------------------------------------------------------------------------
# graphs
# --------------------------------------------------------------------------


def _small_model(name: str):
    """``name`` at two units and the smallest widths its config allows, and its batch."""
    from hyper_ac import models

    if name == "mlp":
        kwargs: dict[str, Any] = {"dim": 8, "hidden": 8}
    elif name == "transformer":
        kwargs = {"vocab": 16, "dim": 16, "heads": 2, "hidden": 16, "max_seq": 8}
    else:
        kwargs = {"hidden": 16, "heads": 2, "vocab": 16, "max_seq": 8}
    return models.build(name, 2, **kwargs), models.example_batch(name, batch=1, seq=4, vocab=16, dim=8)


def _golden_blocks():
    """The block models of tests/python/test_tagging_golden.py (one definition each)."""
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import test_tagging_golden as golden

    return golden


def _fake_group():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    return dist.group.WORLD


def _blocks_graph(make_block: Callable[[], Any], x_shape: tuple, dynamic: bool = False):
    import torch

    from hyper_ac.frontend import capture

    g = _golden_blocks()
    model = g.seeded(lambda: g.Blocks([make_block() for _ in range(2)]))
    x = g.seeded(lambda: torch.randn(*x_shape))
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    return model, capture.capture_joint(model, x, loss_fn=lambda y: y.sum()).graph_module


def _user_tagged_graph():
    """Two blocks the model itself wraps in torch.utils.checkpoint (user tags on the nodes)."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    from hyper_ac.frontend import capture

    class Tagged(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return x + checkpoint(lambda h: torch.tanh(self.proj(h)).relu(), x, use_reentrant=False)

    g = _golden_blocks()
    model = g.seeded(lambda: g.Blocks([Tagged() for _ in range(2)]))
    x = g.seeded(lambda: torch.randn(4, 8))
    return model, capture.capture_joint(model, x, loss_fn=lambda y: y.sum()).graph_module


def special_graphs() -> dict[str, Callable[[], tuple]]:
    """Graphs with the facts the built-in models lack: (model, joint GraphModule) makers."""
    g = _golden_blocks()
    return {
        "inplace_views": g._inplace_joint,  # in-place writes through views (make_fx, not functionalized)
        "dropout": lambda: _blocks_graph(lambda: g.DropoutBlock(64), (32, 64)),  # rng replay (8 KiB > state)
        "dropout_small": lambda: _blocks_graph(lambda: g.DropoutBlock(8), (4, 8)),  # rng kept (tiny output)
        "collectives": lambda: _blocks_graph(lambda: g.CommBlock(8, _fake_group()), (4, 8)),
        "moe_all_to_all": lambda: _blocks_graph(lambda: g.MoEBlock(8, _fake_group()), (4, 8)),
        "symint": lambda: _blocks_graph(lambda: g.FlattenBlock(4), (2, 3, 4), dynamic=True),
        "mutated_buffer": lambda: _blocks_graph(lambda: g.CounterBlock(4), (2, 4)),
        "user_tagged": _user_tagged_graph,
    }


def _with_measured_times(text: str) -> str:
    """The wire document with a synthetic ``measured_seconds`` on every call_function node
    but every third (those keep the roofline): 1 us + FLOPs / 1e10 + output bytes / 1e9."""
    doc = json.loads(text)
    for i, node in enumerate(doc["nodes"]):
        if node.get("kind") == "call_function" and i % 3:
            out = sum(o.get("bytes", 0) for o in node.get("outputs", []))
            node["measured_seconds"] = round(1e-6 + node.get("flops", 0) / 1e10 + out / 1e9, 12)
    return json.dumps(doc, separators=(",", ":"))


def graphs() -> Iterator[tuple[str, str, Any]]:
    """(label, graph JSON in the wire form, live model or None) for every graph."""
    import torch

    from hyper_ac import models
    from hyper_ac.frontend import capture
    from hyper_ac.frontend import serialize

    def forms(label: str, gm, model):
        yield label, serialize.to_json(gm, model), model
        if label in MEASURED_FORM:
            yield f"{label}_measured", _with_measured_times(serialize.to_json(gm, model)), model
        if label in FULL_FORM:
            yield f"{label}_full_form", serialize.to_json(gm, model, full=True), model

    for name in models.MODEL_NAMES:
        model, batch = _small_model(name)
        yield from forms(name, capture.capture_joint(model, **batch).graph_module, model)
        if name == "transformer":  # the same model with dropout: random ops in attention and MLP
            model = models.build(name, 2, vocab=16, dim=16, heads=2, hidden=16, max_seq=8, dropout=0.1)
            yield from forms("transformer_dropout", capture.capture_joint(model, **batch).graph_module, model)
    for label, make in special_graphs().items():
        model, gm = make()
        yield from forms(label, gm, model)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for path in sorted((ROOT / "tests" / "data").glob("*.json")):
        text = path.read_text()  # graph documents only; bad_*.json: invalid on purpose (in rejected/)
        if json.loads(text).get("format") == "hyper_ac.graph" and not path.name.startswith("bad_"):
            yield f"data_{path.stem}", text, None


# --------------------------------------------------------------------------
# seeds
# --------------------------------------------------------------------------


def configs() -> dict[str, Any]:
    from hyper_ac.planning.config import preset_names

    out = {f"mode_{k}": v for k, v in MODE_CONFIGS.items()}
    out.update({f"preset_{name}": name for name in preset_names()})
    return out


def seeds(log=print) -> Iterator[tuple[str, str, str]]:
    """(file name, graph JSON, canonical config JSON) of every pair the core plans."""
    from hyper_ac import _core
    from hyper_ac.planning.config import ConfigError, load_config

    table = OP_POLICY.read_text()
    base = configs()
    extra = {f"x_{k}": v for k, v in EXTRA_CONFIGS.items()}
    large = {k: v for k, v in base.items() if k.startswith("preset_")}
    large.update({f"x_{k}": v for k, v in EXCLUDE_CONFIGS.items()})
    for label, graph, model in graphs():
        chosen = dict(base, **large, **extra) if len(graph) <= SMALL_GRAPH_BYTES else large
        if label.endswith("_measured"):
            chosen = {k: v for k, v in extra.items() if "measured" in k}
        if label.endswith("_full_form"):
            chosen = {k: v for k, v in chosen.items() if k in FULL_FORM[label[: -len("_full_form")]]}
        seen: set[str] = set()
        for name, source in chosen.items():
            try:
                config = load_config(source).json_for(model)
                _core.plan(graph, config, table)
            except _core.GraphError:  # every graph written here must load: a bug in the serialiser or the core
                raise
            except (ConfigError, ValueError) as error:  # a config that does not fit this graph (no such module, ...)
                log(f"  skip {label} x {name}: {type(error).__name__}: {str(error)[:120]}")
                continue
            if config in seen:  # the same canonical config under another name
                continue
            seen.add(config)
            yield f"{label}__{name}", graph, config
        log(f"{label}: {len(graph)} bytes, {len(seen)} configs")


def write_corpus(log=print) -> list[tuple[str, str, str]]:
    written = list(seeds(log))
    for stale in CORPUS.iterdir():
        if stale.is_file():
            stale.unlink()
    for name, graph, config in written:
        (CORPUS / name).write_bytes(graph.encode() + b"\0" + config.encode())
    return written


# --------------------------------------------------------------------------
# dictionary
# --------------------------------------------------------------------------

# JSON syntax, the NUL that separates graph and config, numbers at the edges
# of the ranges the loaders and the config check.
DICT_HEADER = ['{', '}', '[', ']', ':', ',', '\\x00', 'null', 'true', 'false', '1e308', '1e-300', '1e309',
               '-1', '-0', '0', '0.5', '9223372036854775807', '4611686018427387904', '2147483648', 'NaN']
# Enumerated string values of these graph fields and config keys go in too.
GRAPH_VALUE_FIELDS = ("kind", "phase", "role", "dtype", "policy", "format", "type")


def read_seed(path: Path) -> tuple[str, str]:
    data = path.read_bytes()
    graph, _, config = data.partition(b"\0")
    return graph.decode(), config.decode() or '{"ac_mode": "auto"}'


def _walk(value: Any, keys: set, values: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            keys.add(k)
            if isinstance(v, str) and len(v) <= 40:
                values.setdefault(k, set()).add(v)
            _walk(v, keys, values)
    elif isinstance(value, list):
        for v in value:
            _walk(v, keys, values)


def _doc_table_names(path: Path) -> set[str]:
    """The backticked names in the first column of the tables of a docs page
    (``modules[].same_as`` and ``.type`` give ``same_as`` and ``type``)."""
    names: set[str] = set()
    for line in path.read_text().splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
                names.add(name.split(".")[-1].replace("[]", ""))
    return {n for n in names if re.fullmatch(r"[a-z_]+", n)}


def graph_field_names(docs: list[dict]) -> set[str]:
    """Every key of the graph format. ONE place to repoint: the core exports no
    field table today, so the names come from docs/graph-format.md's field
    tables and the keys the seeds carry; ``_core.graph_fields()``, once it
    exists, is read too (entries: names, or dicts with a ``name``)."""
    keys = _doc_table_names(ROOT / "docs" / "graph-format.md")
    for doc in docs:
        _walk(doc, keys, {})
    from hyper_ac import _core

    table = getattr(_core, "graph_fields", None)
    if table is not None:
        for field in table():
            keys.add(field if isinstance(field, str) else field["name"])
    return keys


def config_option_names(configs: list[dict]) -> set[str]:
    """Every config key and enumerated value. ONE place to repoint: the core's
    option table (core/src/config.cc) is not exported, so the names come from
    docs/config.md (the key table, the flat-form list, the ``a | b`` choices
    of its example) and the keys the seeds' configs carry."""
    page = ROOT / "docs" / "config.md"
    keys = _doc_table_names(page)
    text = page.read_text()
    flat = text[text.index("## Flat form"):]
    keys |= set(re.findall(r"`(ac_[a-z_]+)`", flat[: flat.index("##", 3)]))
    for choices in re.findall(r"#\s*([a-z_]+(?:\s*\|\s*[a-z_0-9]+)+)", text):
        keys |= {c.strip() for c in choices.split("|")}
    for config in configs:
        _walk(config, keys, {})
    return keys


def dictionary_entries() -> list[str]:
    docs, configs_, values = [], [], {}
    for path in sorted(CORPUS.rglob("*")):
        if path.is_file():
            graph, config = read_seed(path)
            try:
                docs.append(json.loads(graph))
                configs_.append(json.loads(config))
            except ValueError:
                continue  # rejected seeds may not be JSON
    configs_ += [v for v in MODE_CONFIGS.values()] + list(EXTRA_CONFIGS.values())
    from hyper_ac.planning.config import CONFIG_DIR, _read_yaml, preset_names

    configs_ += [_read_yaml(CONFIG_DIR / f"{name}.yaml") for name in preset_names()]
    for doc in docs:
        for node in doc.get("nodes", []):
            for field in GRAPH_VALUE_FIELDS:
                if isinstance(node.get(field), str):
                    values.setdefault(field, set()).add(node[field])
            for fact in node.get("outputs", []):
                if isinstance(fact, dict) and isinstance(fact.get("dtype"), str):
                    values.setdefault("dtype", set()).add(fact["dtype"])
    words = graph_field_names(docs) | config_option_names(configs_)
    for config in configs_:
        _walk(config, set(), values)
    for group in values.values():
        words |= group
    # The default operator table's categories (op_policy keys) and the operator names it treats specially.
    table = json.loads(OP_POLICY.read_text())
    words |= set(table)
    for names in table.values():
        words |= set(names)
    return sorted(words)


def write_dictionary() -> int:
    entries = dictionary_entries()
    lines = ["# libFuzzer dictionary, generated by scripts/make_fuzz_corpus.py (do not edit):",
             "# JSON syntax, edge numbers, then every graph field, config key, enumerated value",
             "# and specially treated operator name the corpus and the configs use."]
    lines += [f'"{token}"' for token in DICT_HEADER]  # libFuzzer's escapes, as written
    lines += [json.dumps(json.dumps(word)) for word in entries]
    DICT.write_text("\n".join(lines) + "\n")
    return len(entries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dict-only", action="store_true", help="rewrite json.dict from the corpus only")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if not args.dict_only:
        written = write_corpus()
        size = sum(len(g) + len(c) + 1 for _, g, c in written)
        print(f"{len(written)} seeds, {size / 1e6:.2f} MB, largest {max(len(g) + len(c) + 1 for _, g, c in written)} bytes")
    print(f"{write_dictionary()} dictionary words")


if __name__ == "__main__":
    main()
