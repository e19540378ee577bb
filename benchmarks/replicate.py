"""Synthetic deep joint graphs: replicate the layers of a captured graph, over FX and over graph JSON."""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Iterable, Optional


# --------------------------------------------------------------------------
# part 2a: synthetic deep joint graphs (replicating captured layers)
# --------------------------------------------------------------------------

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?=\.|$)")


def _layer_of_fqn(fqn: str) -> Optional[int]:
    m = _LAYER_RE.search(fqn)
    return int(m.group(1)) if m else None


def _rename_layer(fqn: str, new: int) -> str:
    return _LAYER_RE.sub(lambda m: m.group(0).replace(m.group(1), str(new)), fqn, count=1)


class _Splice:
    """The structural recipe for stacking more copies of a captured layer.

    Works on an abstract graph (keys in topological order). Nodes carry a
    layer index (from their module stack; gradient-accumulation nodes without
    one take the smallest layer among their inputs; a primal placeholder the
    layer of its users). Layers ``0 .. n0-1`` must be isomorphic in graph
    order (same target at the same position). Layer 1 is the template:
    ``k - n0`` copies of it are inserted between layers 1 and 2, forward
    copies before layer 2's first forward node, backward copies (deepest
    first) before layer 1's first backward node, new primal placeholders after
    the last primal. A node reading a node ``d`` layers away (|d| <= 1) reads,
    in the stacked graph, the node at the same position ``d`` layers away.
    """

    def __init__(self, keys: list, inputs: Callable, stack_layer: Callable, is_bwd: Callable,
                 kind: Callable, target: Callable, is_primal: Callable, k: int,
                 accumulates: Callable = lambda key: False):
        self.keys = keys
        self.inputs = inputs
        layer: dict = {}
        users: dict = {key: [] for key in keys}
        for key in keys:
            for u in inputs(key):
                users[u].append(key)
        for key in keys:
            j = stack_layer(key)
            if j is not None:
                layer[key] = j
            elif kind(key) == "call_function":
                layered = [layer[u] for u in inputs(key) if u in layer]
                if layered and target(key) == "operator.getitem":
                    layer[key] = layered[0]
                elif layered and is_bwd(key) and accumulates(key):
                    layer[key] = min(layered)
        for key in keys:
            if is_primal(key) and users[key]:
                ls = {layer.get(u) for u in users[key]}
                if len(ls) == 1 and None not in ls:
                    layer[key] = ls.pop()
        self.layer = layer
        n0 = 1 + max(layer.values(), default=-1)
        if n0 < 3:
            raise ValueError(f"need a graph of at least 3 layers to replicate, got {n0}")
        if k < n0:
            raise ValueError(f"cannot stack {k} layers from a {n0}-layer graph")
        self.n0, self.k, self.extra = n0, k, k - n0
        lists: list[list] = [[] for _ in range(n0)]
        for key in keys:
            if key in layer:
                lists[layer[key]].append(key)
        self.lists = lists
        self.pos = {key: p for lst in lists for p, key in enumerate(lst)}
        def signature(lst: list) -> list:
            return [(kind(x), "" if kind(x) == "placeholder" else target(x), is_bwd(x)) for x in lst]

        sig = signature(lists[1])
        for j, lst in enumerate(lists):
            if signature(lst) != sig:
                raise ValueError(f"layer {j} is not isomorphic to layer 1 (cannot replicate)")
        for key in keys:
            if key in layer:
                for u in inputs(key):
                    if u in layer and abs(layer[u] - layer[key]) > 1:
                        raise ValueError(f"node reads across {abs(layer[u] - layer[key])} layers")
        self.template = lists[1]
        self.is_bwd, self.kind, self.is_primal = is_bwd, kind, is_primal
        self.first_fwd_2 = next(x for x in lists[2] if not is_bwd(x) and kind(x) != "placeholder")
        self.first_bwd_1 = next(x for x in lists[1] if is_bwd(x))
        primals = [x for x in keys if is_primal(x)]
        self.last_primal = primals[-1]
        self.template_primals = [x for x in self.template if is_primal(x)]

    def new_layer(self, key) -> Optional[int]:
        j = self.layer.get(key)
        if j is None:
            return None
        return j if j <= 1 else j + self.extra

    def at(self, pos: int, m: int):
        """(template_key, copy_layer) or (original_key, None) for position ``pos`` of new layer ``m``."""
        if m <= 1:
            return self.lists[m][pos], None
        if m < 2 + self.extra:
            return self.template[pos], m
        return self.lists[m - self.extra][pos], None

    def resolve(self, u, consumer_orig_layer: Optional[int], consumer_new_layer: Optional[int]):
        if u not in self.layer or consumer_orig_layer is None:
            return u, None
        m = consumer_new_layer + (self.layer[u] - consumer_orig_layer)
        return self.at(self.pos[u], m)

    def schedule(self) -> Iterable[tuple]:
        """Yields ("orig", key) / ("copy", template_key, m) in emission order."""
        copies = range(2, 2 + self.extra)
        for key in self.keys:
            if key == self.first_fwd_2:
                for m in copies:
                    for t in self.template:
                        if not self.is_bwd(t) and self.kind(t) != "placeholder":
                            yield ("copy", t, m)
            if key == self.first_bwd_1:
                for m in reversed(copies):
                    for t in self.template:
                        if self.is_bwd(t):
                            yield ("copy", t, m)
            yield ("orig", key)
            if key == self.last_primal:
                for m in copies:
                    for t in self.template_primals:
                        yield ("copy", t, m)


def replicate_layers(gm, num_fwd_outputs: int, k: int):
    """A ``k``-layer joint graph built from an annotated ``n0``-layer one (n0 >= 3).

    The template is layer 1 (forward, backward, its parameter placeholders
    and their gradient outputs). Module stacks are renamed (``layers.m``) so
    scope discovery sees ``k`` blocks. Copies share the template's fake
    tensors in ``meta["val"]`` (shapes are all the planners read).
    """
    import torch.fx as fx

    from hyper_ac import fx_meta

    nodes = list(gm.graph.nodes)

    def stack_layer(n):
        for fqn, _type in fx_meta.module_stack(n):
            j = _layer_of_fqn(fqn)
            if j is not None:
                return j
        return None

    def target(n):
        from hyper_ac.frontend.op_facts import target_name

        return target_name(n) if n.op == "call_function" else str(n.target)

    splice = _Splice(
        nodes, lambda n: n.all_input_nodes, stack_layer, fx_meta.is_backward,
        lambda n: n.op, target, lambda n: n.op == "placeholder" and fx_meta.role(n) in ("parameter", "buffer")
        and str(n.target).startswith("primals"), k, accumulates=fx_meta.is_gradient_acc)
    graph = fx.Graph()
    env: dict = {}
    primal_count = sum(1 for n in nodes if n.op == "placeholder" and str(n.target).startswith("primals"))
    output_node = next(n for n in reversed(nodes) if n.op == "output")
    extra_outputs: list = []
    flat_outputs = list(output_node.args[0])
    primal_index = {n: i for i, n in enumerate(n for n in nodes if n.op == "placeholder"
                                               and str(n.target).startswith("primals"))}

    def relabel(meta: dict, m: Optional[int]) -> dict:
        meta = dict(meta)
        if m is not None:
            stack = meta.get(fx_meta.MODULE_STACK) or []
            meta[fx_meta.MODULE_STACK] = [(_rename_layer(f, m), t) for f, t in stack]
            if fx_meta.SOURCE in meta:
                meta[fx_meta.SOURCE] = _rename_layer(meta[fx_meta.SOURCE], m)
        return meta

    for op in splice.schedule():
        if op[0] == "orig":
            n = op[1]
            if n is output_node:
                continue
            j, m = splice.layer.get(n), splice.new_layer(n)
            new = graph.node_copy(n, lambda u, j=j, m=m: env[splice.resolve(u, j, m)])
            new.meta = relabel(n.meta, m if (m is not None and m != j) else None)
            env[(n, None)] = new
        else:
            _, t, m = op
            if t.op == "placeholder":
                primal_count += 1
                new = graph.placeholder(f"primals_{primal_count}")
                new.meta = relabel(t.meta, m)
                # the gradient of this parameter: the template's, at layer m
                g = flat_outputs[num_fwd_outputs + primal_index[t]]
                extra_outputs.append((g, m))
            else:
                new = graph.node_copy(t, lambda u, m=m: env[splice.resolve(u, 1, m)])
                new.meta = relabel(t.meta, m)
            env[(t, m)] = new
    outs = [env[(o, None)] if isinstance(o, fx.Node) else o for o in flat_outputs]
    for g, m in extra_outputs:
        outs.append(None if g is None else env[splice.resolve(g, 1, m)])
    new_out = graph.output(outs)
    new_out.meta = dict(output_node.meta)
    new_out.meta.pop(fx_meta.DESC, None)
    graph.lint()
    return fx.GraphModule(gm, graph)


def replicate_layers_json(doc: dict, k: int, accumulating_ids: Iterable[int] = ()) -> dict:
    """:func:`replicate_layers` on a serialised graph document (for graphs too big for FX).

    ``accumulating_ids``: ids of the gradient-accumulation nodes (FX
    ``meta["is_gradient_acc"]``, which the document does not carry).
    """
    accumulating = set(accumulating_ids)
    nodes = doc["nodes"]
    by_id = {n["id"]: n for n in nodes}
    keys = [n["id"] for n in nodes]

    def stack_layer(i):
        for entry in by_id[i].get("module_stack", []):
            j = _layer_of_fqn(entry["fqn"])
            if j is not None:
                return j
        return None

    splice = _Splice(
        keys, lambda i: by_id[i]["inputs"], stack_layer, lambda i: by_id[i]["phase"] == "backward",
        lambda i: by_id[i]["kind"], lambda i: by_id[i]["target"],
        lambda i: by_id[i]["kind"] == "placeholder" and by_id[i].get("role") in ("parameter", "buffer"), k,
        accumulates=lambda i: i in accumulating)
    out_nodes: list[dict] = []
    env: dict = {}
    output_id = next(n["id"] for n in reversed(nodes) if n["kind"] == "output")
    grads_of: dict = {}  # template primal -> template backward nodes the output reads (by position)
    out_inputs = set(by_id[output_id]["inputs"])
    template_bwd_out = [i for i in splice.template if i in out_inputs]
    extra_outputs: list = []

    def emit(src: dict, new_id: int, inputs: list, m: Optional[int], suffix: str) -> dict:
        entry = dict(src)
        entry["id"] = new_id
        entry["inputs"] = inputs
        if suffix:
            entry["name"] = f"{src['name']}{suffix}"
        if m is not None and src.get("module_stack"):
            entry["module_stack"] = [{"fqn": _rename_layer(s["fqn"], m), "type": s["type"]}
                                     for s in src["module_stack"]]
        return entry

    for op in splice.schedule():
        new_id = len(out_nodes)
        if op[0] == "orig":
            i = op[1]
            if i == output_id:
                continue
            j, m = splice.layer.get(i), splice.new_layer(i)
            inputs = [env[splice.resolve(u, j, m)] for u in by_id[i]["inputs"]]
            out_nodes.append(emit(by_id[i], new_id, inputs, m if (m is not None and m != j) else None, ""))
            env[(i, None)] = new_id
        else:
            _, t, m = op
            inputs = [env[splice.resolve(u, 1, m)] for u in by_id[t]["inputs"]]
            out_nodes.append(emit(by_id[t], new_id, inputs, m, f"__L{m}"))
            env[(t, m)] = new_id
            if by_id[t]["kind"] == "placeholder" and t == splice.template_primals[-1]:
                extra_outputs.extend((g, m) for g in template_bwd_out)
    del grads_of
    out = dict(by_id[output_id])
    out["id"] = len(out_nodes)
    out["inputs"] = [env[(u, None)] for u in by_id[output_id]["inputs"]] + \
        [env[splice.resolve(g, 1, m)] for g, m in extra_outputs]
    out_nodes.append(out)
    result = {key: value for key, value in doc.items() if key not in ("nodes", "model")}
    result["nodes"] = out_nodes
    return result


def _summary(gm) -> dict:
    """The core's graph summary (counts, activation bytes read by backward, FLOPs)."""
    from hyper_ac import _core
    from hyper_ac.frontend.serialize import to_json

    return dict(_core.graph_summary(to_json(gm)))


def same_structure(a, b) -> bool:
    """Two joint graphs with the same node count, phase split and operator multiset."""
    from hyper_ac import fx_meta
    from hyper_ac.frontend.op_facts import target_name

    def sig(gm):
        c = Counter()
        for n in gm.graph.nodes:
            c[(n.op, target_name(n) if n.op == "call_function" else "", fx_meta.is_backward(n))] += 1
        return c

    return sig(a) == sig(b)


