"""Annotate a joint forward+backward FX graph: phase, module stacks, placeholder roles.

The one home of phase classification: :func:`annotate_joint` decides the
forward/backward phase of every node of an AOTAutograd joint graph, and
:func:`phase_of` reads it back (with the fallback for a graph annotated by
someone else) for the serialiser. Module paths are parsed by
:mod:`hyper_ac.frontend.module_path`.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from hyper_ac import fx_meta
from hyper_ac.fx_meta import ROLES
from hyper_ac.frontend.module_path import _ModulePathResolver

__all__ = [
    "CaptureError",
    "JointAnnotation",
    "annotate_joint",
    "num_forward_outputs_from_descs",
    "phase_of",
]


class CaptureError(RuntimeError):
    """The training step could not be captured as one joint graph."""



@dataclasses.dataclass
class JointAnnotation:
    """What :func:`annotate_joint` found (the facts themselves live in node.meta)."""

    num_fwd_outputs: int
    num_forward: int  # nodes with autograd_backward == False
    num_backward: int
    roles: dict[str, str]  # placeholder name -> role
    sources: dict[str, str]  # placeholder name -> parameter / buffer FQN (when known)
    role_method: str  # how roles were decided: input_roles | descriptors | example_inputs | heuristic



def num_forward_outputs_from_descs(joint: fx.GraphModule) -> int | None:
    """Count the leading joint outputs that are not gradients (from ``meta["desc"]``)."""
    from torch._functorch._aot_autograd.descriptors import GradAOTOutput

    out = _output_node(joint.graph)
    descs = fx_meta.desc(out)
    if descs is None:
        return None
    n = 0
    for d in descs:
        if d is None or isinstance(d, GradAOTOutput):
            break
        n += 1
    return n


# --------------------------------------------------------------------------
# annotation
# --------------------------------------------------------------------------


def _output_node(graph: fx.Graph) -> fx.Node:
    for node in reversed(graph.nodes):
        if node.op == "output":
            return node
    raise CaptureError("joint graph has no output node")


def _flat_outputs(out: fx.Node) -> list[Any]:
    return list(torch.utils._pytree.arg_tree_leaves(*out.args))


def _desc_name(desc: Any) -> str:
    """The descriptor's kind; a component of a tensor subclass input (a DTensor tangent's
    local tensor or mesh: ``SubclassGetAttrAOTInput``) has the kind of the input it is part of."""
    while type(desc).__name__.startswith("Subclass") and hasattr(desc, "base"):
        desc = desc.base
    return type(desc).__name__ if desc is not None else ""


_BACKWARD_PLACEHOLDER_DESCS = {
    "TangentAOTInput",
    "PhiloxBackwardSeedAOTInput",
    "PhiloxBackwardBaseOffsetAOTInput",
    "BackwardTokenAOTInput",
}


def _is_tangent(node: fx.Node) -> bool:
    desc = fx_meta.desc(node)
    if desc is not None:
        return _desc_name(desc) == "TangentAOTInput"
    return isinstance(node.target, str) and node.target.startswith("tangents")


def _is_backward_placeholder(node: fx.Node) -> bool:
    desc = fx_meta.desc(node)
    if desc is not None:
        return _desc_name(desc) in _BACKWARD_PLACEHOLDER_DESCS
    t = node.target if isinstance(node.target, str) else ""
    return t.startswith("tangents") or t.startswith("bwd_seed") or t.startswith("bwd_base_offset")


def annotate_joint(
    joint_gm: fx.GraphModule,
    num_fwd_outputs: int,
    *,
    model: nn.Module | None = None,
    example_inputs: Sequence[Any] | None = None,
    input_roles: Sequence[str] | dict[str, str] | None = None,
    root_prefix: str | None = None,
) -> JointAnnotation:
    """Annotate every node of an AOTAutograd joint graph in place.

    Sets, on every node:

    * ``meta["autograd_backward"]``: ``False`` for forward nodes, ``True`` for
      backward ones. Forward = not reachable from a tangent (or a node
      partitioner-tagged ``must_be_in_backward``) AND placed no later than the
      last node the forward outputs (or a ``must_be_in_forward`` node) depend
      on / the last node tagged ``is_forward``; a ``must_be_in_forward`` node
      (the ``copy_`` of an input mutation, placed after the backward) is
      forward wherever it sits. That is torch's ``default_partition`` placement
      ("non-tangent nodes up to the last forward node") intersected with the
      complement of ``classify_nodes``' tangent closure; the ``output`` node is
      backward, and an ``operator.getitem`` has its producer's phase (a
      tuple element is produced with the tuple).
    * ``meta["ac_module_stack"]``: ``[(fqn, type_name), ...]`` innermost first,
      FQNs plain dotted paths matching ``dict(model.named_modules())`` keys,
      the root module left out. Forward nodes: from ``nn_module_stack``;
      backward nodes: from the first forward node with the same ``seq_nr``
      (what AOTAutograd's ``copy_fwd_metadata_to_bw_nodes`` does), else
      ``fwd_nn_module_stack``, else ``[]``.

    and on placeholders ``meta["ac_role"]`` (``parameter`` / ``buffer`` /
    ``input`` / ``tangent``), plus ``meta["ac_source"]`` (the parameter or
    buffer FQN) where known. Roles come, most precise first, from
    ``input_roles`` (per primal, in placeholder order, or a name→role dict);
    ``ParamAOTInput``/``BufferAOTInput`` descriptors (export tracer);
    ``PlainAOTInput(idx)`` descriptors → ``example_inputs[idx]`` (the flat
    inputs a dynamo backend receives: parameters and buffers are the live
    objects, matched by identity against ``model``; without a model, an
    ``nn.Parameter`` is a parameter and a dynamo-static non-parameter a
    buffer); last, a heuristic (a primal with a gradient output is a
    parameter, else an input).

    ``root_prefix``: path of ``model`` inside the traced root (``"model"`` on
    the export tracer, where a loss wrapper holds it as ``.model``); by
    default found from module identities / the outermost stack entry.
    """
    graph = joint_gm.graph
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    out_node = _output_node(graph)
    outputs = _flat_outputs(out_node)
    fwd_outputs = [o for o in outputs[:num_fwd_outputs] if isinstance(o, fx.Node)]

    # ---- phase ------------------------------------------------------------
    # Nodes the forward must run wherever they sit: the input-mutation epilogue
    # (``copy_`` into a buffer, tagged ``must_be_in_forward``) comes after the
    # backward in the joint. They and their inputs are forward, but their
    # position must not stretch the boundary over the backward, or every
    # tangent-free backward node (a decomposed batch-norm backward's x - mean)
    # would count as forward.
    pinned_forward = [n for n in nodes if fx_meta.partitioner_tag(n) == "must_be_in_forward" and n.op != "placeholder"]
    # Forward dependency cone of the forward outputs and of those nodes' inputs.
    fwd_required: set[fx.Node] = set()
    stack = list(fwd_outputs) + [i for n in pinned_forward for i in n.all_input_nodes]
    while stack:
        n = stack.pop()
        if n in fwd_required:
            continue
        fwd_required.add(n)
        stack.extend(n.all_input_nodes)
    boundary = -1
    for n in fwd_required:
        boundary = max(boundary, index[n])
    for n in nodes:
        if fx_meta.partitioner_tag(n) == "is_forward" and n.op != "placeholder":
            boundary = max(boundary, index[n])
    pinned = set(pinned_forward)
    # Tangent closure (classify_nodes' required_bw_nodes before adding outputs).
    backward: set[fx.Node] = set()
    for n in nodes:
        if n.op == "output":
            backward.add(n)
            continue
        if n.op == "placeholder":
            if _is_backward_placeholder(n):
                backward.add(n)
            continue
        if n.target is operator.getitem and n.args and isinstance(n.args[0], fx.Node):
            # a tuple element is produced with its tuple (native_layer_norm's
            # mean/rstd, nll_loss_forward's total_weight): same phase
            if n.args[0] in backward:
                backward.add(n)
            continue
        if (
            (index[n] > boundary and n not in pinned)
            or fx_meta.partitioner_tag(n) == "must_be_in_backward"
            or any(i in backward for i in n.all_input_nodes)
        ):
            backward.add(n)
    for n in nodes:
        fx_meta.set_backward(n, n in backward)
    # A gradient output that is a forward value itself (a DTensor gradient's mesh is the
    # forward's mesh placeholder): the backward returns it, so the forward must hand it over.
    returned = {o for o in outputs[num_fwd_outputs:] if isinstance(o, fx.Node) and o not in backward}
    for n in nodes:
        fx_meta.set_backward_output(n, n in returned)

    # ---- module stacks ----------------------------------------------------
    resolver = _ModulePathResolver(model, root_prefix, nodes)
    fwd_by_seq: dict[Any, fx.Node] = {}
    for n in nodes:
        if n in backward or fx_meta.SEQ_NR not in n.meta or n.op != "call_function":
            continue
        fwd_by_seq.setdefault(n.meta[fx_meta.SEQ_NR], n)
    for n in nodes:
        raw = None
        if n.op == "call_function":
            if n not in backward:
                raw = n.meta.get(fx_meta.NN_MODULE_STACK)
            elif not fx_meta.is_gradient_acc(n):
                src = fwd_by_seq.get(n.meta.get(fx_meta.SEQ_NR))
                raw = src.meta.get(fx_meta.NN_MODULE_STACK) if src is not None else None
                if raw is None:
                    raw = n.meta.get(fx_meta.FWD_NN_MODULE_STACK)
        fx_meta.set_module_stack(n, resolver.stack(raw) if raw else [])

    # ---- placeholder roles -----------------------------------------------
    placeholders = [n for n in nodes if n.op == "placeholder"]
    roles, sources, method = _placeholder_roles(
        placeholders, outputs, num_fwd_outputs, model, example_inputs, input_roles, resolver
    )
    for n in placeholders:
        fx_meta.set_role(n, roles[n.name], sources.get(n.name))

    return JointAnnotation(
        num_fwd_outputs=num_fwd_outputs,
        num_forward=len(nodes) - len(backward),
        num_backward=len(backward),
        roles=roles,
        sources=sources,
        role_method=method,
    )


def _placeholder_roles(
    placeholders: list[fx.Node],
    outputs: list[Any],
    num_fwd_outputs: int,
    model: nn.Module | None,
    example_inputs: Sequence[Any] | None,
    input_roles: Sequence[str] | dict[str, str] | None,
    resolver: "_ModulePathResolver",
) -> tuple[dict[str, str], dict[str, str], str]:
    roles: dict[str, str] = {}
    sources: dict[str, str] = {}
    primals = [n for n in placeholders if not _is_backward_placeholder(n)]
    for n in placeholders:
        if _is_tangent(n):
            roles[n.name] = "tangent"
        elif _is_backward_placeholder(n):
            roles[n.name] = "input"  # backward RNG seeds / tokens

    if input_roles is not None:
        given = dict(input_roles) if isinstance(input_roles, dict) else dict(zip([p.name for p in primals], input_roles))
        if not isinstance(input_roles, dict) and len(input_roles) != len(primals):
            raise ValueError(f"input_roles has {len(input_roles)} entries for {len(primals)} primal inputs")
        for p in primals:
            role = given.get(p.name, "input")
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r} for {p.name}")
            roles[p.name] = role
        return roles, sources, "input_roles"

    from torch._functorch._aot_autograd.descriptors import BufferAOTInput, ParamAOTInput, PlainAOTInput

    param_by_id: dict[int, str] = {}
    buffer_by_id: dict[int, str] = {}
    if model is not None:
        param_by_id, buffer_by_id = _tensor_names(model)

    # Heuristic fallback: the joint returns one gradient slot per primal, in
    # primal order (None where the primal needs no gradient).
    bwd_outputs = outputs[num_fwd_outputs:]
    has_grad = {i for i, o in enumerate(bwd_outputs) if o is not None}

    # Descriptor mode (export tracer): parameters and buffers carry their own
    # descriptors, so every PlainAOTInput is a user input.
    descriptor_mode = any(isinstance(fx_meta.desc(p), (ParamAOTInput, BufferAOTInput)) for p in primals)

    used: set[str] = set()
    for pos, p in enumerate(primals):
        d = fx_meta.desc(p)
        role = None
        if isinstance(d, ParamAOTInput):
            role, how = "parameter", "descriptors"
            sources[p.name] = resolver.strip_root(d.target)
        elif isinstance(d, BufferAOTInput):
            role, how = "buffer", "descriptors"
            sources[p.name] = resolver.strip_root(d.target)
        elif descriptor_mode and isinstance(d, PlainAOTInput):
            role, how = "input", "descriptors"
        elif example_inputs is not None:
            idx = d.idx if isinstance(d, PlainAOTInput) else (pos if d is None else None)
            if idx is not None and 0 <= idx < len(example_inputs):
                role = _classify_one(example_inputs[idx], param_by_id, buffer_by_id, sources, p.name)
                how = "example_inputs"
        if role is None:
            role, how = ("parameter" if pos in has_grad else "input"), "heuristic"
        used.add(how)
        roles[p.name] = role
    method = next((m for m in ("heuristic", "example_inputs", "descriptors") if m in used), "descriptors")
    return roles, sources, method


def _classify_one(value: Any, param_by_id: dict[int, str], buffer_by_id: dict[int, str],
                  sources: dict[str, str], name: str) -> str:
    if id(value) in param_by_id:
        sources[name] = param_by_id[id(value)]
        return "parameter"
    if id(value) in buffer_by_id:
        sources[name] = buffer_by_id[id(value)]
        return "buffer"
    if isinstance(value, nn.Parameter):
        return "parameter"
    if isinstance(value, torch.Tensor) and getattr(value, "_dynamo_static_input_type", None) is not None:
        return "buffer"
    return "input"


def _tensor_names(model: nn.Module) -> tuple[dict[int, str], dict[int, str]]:
    """id → FQN of parameters and buffers; a tied tensor gets its first name
    (the key ``named_parameters()`` keeps)."""
    params: dict[int, str] = {}
    buffers: dict[int, str] = {}
    for k, p in model.named_parameters(remove_duplicate=False):
        params.setdefault(id(p), k)
    for k, b in model.named_buffers(remove_duplicate=False):
        buffers.setdefault(id(b), k)
    return params, buffers


def phase_of(node: fx.Node, backward_nodes: set[fx.Node]) -> bool:
    """The phase of one node: ``True`` for backward.

    :func:`annotate_joint`'s ``meta["autograd_backward"]`` when present; for a
    graph annotated by someone else, the partitioner's ``partitioner_tag``,
    else backward iff one of its inputs is (``backward_nodes``: the backward
    nodes seen so far, in graph order); the ``output`` node is backward.
    """
    if fx_meta.has_phase(node):
        return fx_meta.is_backward(node)
    tag = fx_meta.partitioner_tag(node)
    if tag in ("is_backward", "must_be_in_backward"):
        return True
    if tag in ("is_forward", "must_be_in_forward"):
        return False
    if node.op == "output":
        return True
    # not annotated: backward iff it reads a backward value
    return any(i in backward_nodes for i in node.all_input_nodes)
