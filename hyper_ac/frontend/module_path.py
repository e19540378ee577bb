"""Dynamo module paths → plain dotted FQNs (``dict(model.named_modules())`` keys).

``nn_module_stack`` entries name modules by the source path dynamo traced
(``L['self'].layers[0]``, ``getattr(L['self'].h, '0')``, mangled keys);
:func:`normalize_module_path` parses one and ``_ModulePathResolver``
resolves it against the live model.
"""

from __future__ import annotations

import re
from typing import Any

import torch.fx as fx
import torch.nn as nn

from hyper_ac import fx_meta

__all__ = ["normalize_module_path"]


_BASE_RE = re.compile(r"""^(?:[LG]\[(?:'[^']*'|"[^"]*")\]|self)""")
_TOKEN_RE = re.compile(
    r"""\.(?:_modules|_parameters|_buffers)\[(?:'([^']*)'|"([^"]*)")\]"""  # ._modules['x']
    r"""|\[(?:'([^']*)'|"([^"]*)")\]"""  # ['x']
    r"""|\[(-?\d+)\]"""  # [3]
    r"""|\.([A-Za-z_][A-Za-z0-9_]*|\d+)"""  # .x / .3
)
_GETATTR_RE = re.compile(r"""getattr\(\s*(.*?)\s*,\s*(?:'([^']*)'|"([^"]*)")\s*\)""")


def normalize_module_path(path: str) -> list[str]:
    """Dynamo source path → list of attribute names below the traced root.

    ``L['self'].model.layers[3].mlp`` → ``['model', 'layers', '3', 'mlp']``;
    ``L['model']._modules['h']['0']`` → ``['h', '0']``; ``getattr(L['m'].x, '0')``
    → ``['x', '0']``. A plain dotted FQN (``layers.3.mlp``) passes through
    split. Mangled names (``L__self___layers_3``) are returned as one token
    (resolve them against a live model, see ``_ModulePathResolver``).
    """
    s = path.strip()
    # unwrap getattr(X, 'a') → X.a (innermost first, repeatedly)
    while True:
        m = _GETATTR_RE.search(s)
        if not m:
            break
        attr = m.group(2) if m.group(2) is not None else m.group(3)
        s = s[: m.start()] + f"{m.group(1)}.{attr}" + s[m.end():]
    m = _BASE_RE.match(s)
    if m:
        s = s[m.end():]
    elif s and not s.startswith((".", "[")):
        s = "." + s
    tokens: list[str] = []
    pos = 0
    while pos < len(s):
        m = _TOKEN_RE.match(s, pos)
        if not m:
            # unparseable tail: keep it as one opaque token
            tokens.append(s[pos:].lstrip("."))
            break
        tokens.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    return [t for t in tokens if t != ""]


def _mangle(fqn: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", fqn)


class _ModulePathResolver:
    """Turns ``nn_module_stack`` entries into ``(fqn, type_name)`` of the live model."""

    def __init__(self, model: nn.Module | None, root_prefix: str | None, nodes: list[fx.Node]):
        self.model = model
        self.cache: dict[tuple[str, str], str | None] = {}
        self.fqn_by_id: dict[int, str] = {}
        self.fqns: set[str] = set()
        self.by_mangled: dict[str, str] = {}
        if model is not None:
            for fqn, mod in model.named_modules(remove_duplicate=False):
                self.fqn_by_id.setdefault(id(mod), fqn)
                self.fqns.add(fqn)
                self.by_mangled.setdefault(_mangle(fqn), fqn)
        self.prefix: list[str] = normalize_module_path(root_prefix) if root_prefix else []
        if root_prefix is None:
            self.prefix = self._infer_prefix(nodes)

    def _infer_prefix(self, nodes: list[fx.Node]) -> list[str]:
        # With a model: the path of the stack entry that IS the model (keys are
        # module ids). Without: the outermost entry dynamo recorded (the module
        # it was called on). Path resolution tolerates a wrong guess with a model.
        if self.model is None:
            # The outermost entry is the root only if every forward op sits
            # inside it: an op of the root's own forward outside every entry
            # (torch.compile's stacks start below the root) means no prefix;
            # else the entries' common prefix when it is an entry itself
            # (never one block's path, as the first node's entry could be).
            common: list[str] | None = None
            firsts: set[tuple[str, ...]] = set()
            for n in nodes:
                if n.op != "call_function" or fx_meta.is_backward(n):
                    continue
                stack = n.meta.get(fx_meta.NN_MODULE_STACK)
                if not stack:
                    return []
                first = normalize_module_path(next(iter(stack.values()))[0])
                firsts.add(tuple(first))
                if common is None:
                    common = first
                else:
                    k = 0
                    while k < min(len(common), len(first)) and common[k] == first[k]:
                        k += 1
                    common = common[:k]
            # Only a prefix that is itself an entry (the root module) is stripped.
            return common if common and tuple(common) in firsts else []
        for n in nodes:
            stack = n.meta.get(fx_meta.NN_MODULE_STACK)
            if not stack:
                continue
            for key, value in stack.items():
                if self._id_of_key(str(key)) == id(self.model):
                    return normalize_module_path(value[0])
        return []

    @staticmethod
    def _id_of_key(key: str) -> int | None:
        head = key.split("@", 1)[0]
        return int(head) if head.isdigit() else None

    def strip_root(self, fqn: str) -> str:
        toks = fqn.split(".") if fqn else []
        if self.prefix and toks[: len(self.prefix)] == self.prefix:
            toks = toks[len(self.prefix):]
        return ".".join(toks)

    def resolve(self, key: str, path: str, type_name: str) -> str | None:
        ck = (key, path)
        if ck in self.cache:
            return self.cache[ck]
        fqn: str | None = None
        if self.model is not None:
            mid = self._id_of_key(key)
            if mid is not None and mid in self.fqn_by_id:
                cand = self.fqn_by_id[mid]
                mod = self.model.get_submodule(cand) if cand else self.model
                if type(mod).__name__ == type_name:
                    fqn = cand
        if fqn is None:
            toks = normalize_module_path(path)
            if self.prefix and toks[: len(self.prefix)] == self.prefix:
                toks = toks[len(self.prefix):]
            cand = ".".join(toks)
            if self.model is None or cand in self.fqns:
                fqn = cand
            elif len(toks) == 1 and self._demangle(toks[0]) is not None:
                fqn = self._demangle(toks[0])
            elif self.model is not None:
                # tolerate an unknown wrapper prefix: the longest suffix naming a module
                for cut in range(1, len(toks)):
                    if ".".join(toks[cut:]) in self.fqns:
                        fqn = ".".join(toks[cut:])
                        break
                if fqn is None:
                    fqn = cand
        self.cache[ck] = fqn
        return fqn

    def _demangle(self, token: str) -> str | None:
        # `L__self___layers_0_mlp`: the longest `_`-delimited suffix that is a
        # mangled FQN of the live model.
        for i in range(len(token)):
            if i == 0 or token[i - 1] == "_":
                hit = self.by_mangled.get(token[i:])
                if hit:
                    return hit
        return None

    def stack(self, raw: dict[str, tuple[str, Any]]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for key, value in raw.items():
            path, typ = value[0], value[1]
            type_name = typ.__name__ if isinstance(typ, type) else str(typ).rsplit(".", 1)[-1]
            fqn = self.resolve(str(key), str(path), type_name)
            if not fqn:  # the root module itself
                continue
            out.append((fqn, type_name))
        out.reverse()  # nn_module_stack is outermost first
        return out
