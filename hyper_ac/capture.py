"""Capture the joint forward+backward FX graph of one training step.

Two routes, same result (an ``fx.GraphModule`` joint graph whose nodes carry
``meta["autograd_backward"]``, ``meta["ac_module_stack"]`` and, on
placeholders, ``meta["ac_role"]``):

* ``route="compile"`` (default): ``torch.compile(step, backend=aot_autograd(...),
  fullgraph=True)``; our ``partition_fn`` records a copy of the joint graph
  AOTAutograd hands to the partitioner, then lets ``default_partition`` finish
  so compilation completes. This is exactly the graph a ``torch.compile``
  partitioner (and therefore ``hyper_ac``'s backend) sees.
* ``route="export"``: ``dynamo_graph_capture_for_export`` +
  ``aot_export_joint_with_descriptors`` (the torchtitan / autoparallel path):
  no compilation, inputs described by ``ParamAOTInput`` / ``BufferAOTInput``
  descriptors.

:func:`annotate_joint` is the reusable part: a compile backend's
``partition_fn`` calls it on the joint graph it receives.

See ``docs/torch-compat.md`` for every torch internal this relies on.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import operator
import re
import time
import warnings
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.fx as fx
import torch.nn as nn

__all__ = [
    "CaptureError",
    "CapturedGraph",
    "JointAnnotation",
    "capture_joint",
    "annotate_joint",
    "classify_example_inputs",
    "normalize_module_path",
    "reduce_to_loss",
    "ROLES",
]

ROLES = ("parameter", "buffer", "input", "tangent")


class CaptureError(RuntimeError):
    """The training step could not be captured as one joint graph."""


# --------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------


@dataclasses.dataclass
class JointAnnotation:
    """What :func:`annotate_joint` found (the facts themselves live in node.meta)."""

    num_fwd_outputs: int
    num_forward: int  # nodes with autograd_backward == False
    num_backward: int
    roles: dict[str, str]  # placeholder name -> role
    sources: dict[str, str]  # placeholder name -> parameter / buffer FQN (when known)
    role_method: str  # how roles were decided: input_roles | descriptors | example_inputs | heuristic


@dataclasses.dataclass
class CapturedGraph:
    """A captured joint forward+backward graph.

    ``graph_module``: the joint graph (annotated, see :func:`annotate_joint`);
    its outputs are ``num_fwd_outputs`` forward outputs (the loss first)
    followed by the gradients of the primal inputs (``None`` where none).
    """

    graph_module: fx.GraphModule
    num_fwd_outputs: int
    model: nn.Module
    route: str
    annotation: JointAnnotation
    capture_seconds: float
    loss: torch.Tensor | None = None  # the loss computed while capturing (compile route)
    example_inputs: list[Any] | None = None  # dynamo's flat graph inputs (compile route)
    dynamo_graph: fx.GraphModule | None = None  # the forward graph dynamo traced (compile route)

    @property
    def graph(self) -> fx.Graph:
        return self.graph_module.graph

    @property
    def num_nodes(self) -> int:
        return len(self.graph_module.graph.nodes)

    @property
    def roles(self) -> dict[str, str]:
        return self.annotation.roles

    def nodes_by_phase(self, backward: bool) -> list[fx.Node]:
        return [n for n in self.graph_module.graph.nodes if n.meta.get("autograd_backward") is backward]

    def to_json(self, **kwargs: Any) -> str:
        from hyper_ac.serialize import to_json

        return to_json(self.graph_module, self.model, **kwargs)

    def serialize(self, **kwargs: Any) -> dict:
        from hyper_ac.serialize import serialize_graph

        return serialize_graph(self.graph_module, self.model, **kwargs)


# --------------------------------------------------------------------------
# step function: model output -> scalar loss
# --------------------------------------------------------------------------


def reduce_to_loss(out: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None) -> torch.Tensor:
    """The scalar a training step differentiates.

    ``loss_fn(out)`` when given; else a HuggingFace-style ``out.loss``; else
    the first element of a tuple/list; a tensor is ``.sum()``-reduced unless
    it is already a scalar.
    """
    if loss_fn is not None:
        out = loss_fn(out)
    elif not isinstance(out, torch.Tensor):
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, dict):
            loss = out.get("loss")
        if loss is not None:
            out = loss
        elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            out = out[0]
        else:
            raise CaptureError(
                f"cannot reduce model output of type {type(out).__name__} to a loss: "
                "pass labels so the model computes .loss, or pass loss_fn="
            )
    if not isinstance(out, torch.Tensor):
        raise CaptureError(f"loss must be a tensor, got {type(out).__name__}")
    return out if out.dim() == 0 else out.sum()


class _LossWrapper(nn.Module):
    """Root module of the export route: ``self.model`` + the loss reduction."""

    def __init__(self, model: nn.Module, loss_fn: Callable | None):
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return reduce_to_loss(self.model(*args, **kwargs), self._loss_fn)


def _unwrap(model: nn.Module) -> nn.Module:
    # torch.compile'd modules: capture the original (named_modules keys match it).
    return getattr(model, "_orig_mod", model)


# --------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------


def capture_joint(
    model: nn.Module,
    *example_args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    route: str = "compile",
    **example_kwargs: Any,
) -> CapturedGraph:
    """Capture ``model(*example_args, **example_kwargs)`` → loss → backward as one joint graph.

    The loss is ``reduce_to_loss(output, loss_fn)``. ``route`` is
    ``"compile"`` (torch.compile + aot_autograd, default) or ``"export"``
    (dynamo export + aot_export_joint_with_descriptors). A graph break raises
    :class:`CaptureError` naming dynamo's reason. The model is left as it
    was: no backward runs (``.grad`` untouched), and the compile route, which
    runs the forward once, restores the buffers (e.g. BatchNorm statistics)
    and the RNG state afterwards.
    """
    model = _unwrap(model)
    if route == "compile":
        return _capture_compile(model, example_args, example_kwargs, loss_fn)
    if route == "export":
        return _capture_export(model, example_args, example_kwargs, loss_fn)
    raise ValueError(f"unknown capture route {route!r}; use 'compile' or 'export'")


def _graph_break_error(model: nn.Module, exc: BaseException) -> CaptureError:
    msg = str(exc).strip().splitlines()
    head = "\n".join(msg[:12])
    return CaptureError(
        f"graph break while capturing {type(model).__name__}: the training step must trace as ONE graph "
        f"(fullgraph=True), but dynamo stopped:\n{head}"
    )


def _dynamo_errors() -> tuple[type[BaseException], ...]:
    import torch._dynamo.exc as dexc

    return (dexc.Unsupported, dexc.UserError)


def _capture_compile(model: nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None) -> CapturedGraph:
    import torch._dynamo
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    rec: dict[str, Any] = {}

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kw: Any):
        if "joint" not in rec:  # first graph only (fullgraph gives exactly one)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # pytree LeafSpec deprecation inside deepcopy
                rec["joint"] = copy.deepcopy(joint)
            rec["num_fwd_outputs"] = num_fwd_outputs
            rec["static_lifetime_input_indices"] = list(kw.get("static_lifetime_input_indices") or [])
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)

    def identity_compiler(gm: fx.GraphModule, _example_inputs: Any) -> fx.GraphModule:
        return gm

    aot_backend = aot_autograd(fw_compiler=identity_compiler, bw_compiler=identity_compiler, partition_fn=partition)

    def backend(gm: fx.GraphModule, example_inputs: list[Any]):
        rec["dynamo_graph"] = gm
        rec["example_inputs"] = list(example_inputs)
        return aot_backend(gm, example_inputs)

    def step(m: nn.Module, a: tuple, k: dict) -> torch.Tensor:
        return reduce_to_loss(m(*a, **k), loss_fn)

    t0 = time.perf_counter()
    torch._dynamo.reset()
    try:
        # No AOTAutograd cache: a cache hit would skip the partitioner and so our recorder.
        # The forward really runs once: put buffers (BatchNorm statistics, ...) and
        # the RNG state back afterwards so capturing leaves no trace on the model.
        with functorch_config.patch(enable_autograd_cache=False), torch.enable_grad(), \
                _restore_buffers(model), torch.random.fork_rng(devices=_rng_devices()):
            compiled = torch.compile(step, backend=backend, fullgraph=True)
            try:
                loss = compiled(model, args, kwargs)
            except _dynamo_errors() as exc:
                raise _graph_break_error(model, exc) from exc
            except torch._dynamo.exc.BackendCompilerFailed as exc:
                inner = getattr(exc, "inner_exception", None) or exc.__cause__
                if isinstance(inner, CaptureError):
                    raise inner from exc
                raise
    finally:
        torch._dynamo.reset()
    if "joint" not in rec:
        raise CaptureError(
            f"no joint graph for {type(model).__name__}: AOTAutograd took the inference path. "
            "Make sure some parameter requires grad and grad mode is enabled."
        )
    joint: fx.GraphModule = rec["joint"]
    ann = annotate_joint(joint, rec["num_fwd_outputs"], model=model, example_inputs=rec["example_inputs"])
    return CapturedGraph(
        graph_module=joint,
        num_fwd_outputs=rec["num_fwd_outputs"],
        model=model,
        route="compile",
        annotation=ann,
        capture_seconds=time.perf_counter() - t0,
        loss=loss.detach(),
        example_inputs=rec["example_inputs"],
        dynamo_graph=rec.get("dynamo_graph"),
    )


def _capture_export(model: nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None) -> CapturedGraph:
    import torch._dynamo
    from torch._dynamo.functional_export import dynamo_graph_capture_for_export
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    t0 = time.perf_counter()
    wrapper = _LossWrapper(model, loss_fn)
    torch._dynamo.reset()
    try:
        with torch.enable_grad():
            try:
                traced = dynamo_graph_capture_for_export(wrapper)(*args, **kwargs)
            except _dynamo_errors() as exc:
                raise _graph_break_error(model, exc) from exc
            with contextlib.ExitStack() as stack:
                try:
                    joint_desc = aot_export_joint_with_descriptors(stack, traced, args, kwargs)
                except (
                    torch._subclasses.fake_tensor.DataDependentOutputException,
                    torch._subclasses.fake_tensor.DynamicOutputShapeException,
                ) as exc:
                    raise CaptureError(
                        f"export route cannot trace {type(model).__name__}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0]} (data-dependent values or output shapes); "
                        "route='compile' handles these as unbacked SymInts"
                    ) from exc
                joint = joint_desc.graph_module
    finally:
        torch._dynamo.reset()
    num_fwd = num_forward_outputs_from_descs(joint)
    if num_fwd is None:
        raise CaptureError("export route: the joint graph's output node carries no descriptors")
    ann = annotate_joint(joint, num_fwd, model=model, root_prefix="model")
    return CapturedGraph(
        graph_module=joint,
        num_fwd_outputs=num_fwd,
        model=model,
        route="export",
        annotation=ann,
        capture_seconds=time.perf_counter() - t0,
    )


@contextlib.contextmanager
def _restore_buffers(model: nn.Module):
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                if b.shape == v.shape:
                    b.copy_(v)


def _rng_devices() -> list[int]:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return list(range(torch.cuda.device_count()))
    return []


def num_forward_outputs_from_descs(joint: fx.GraphModule) -> int | None:
    """Count the leading joint outputs that are not gradients (from ``meta["desc"]``)."""
    from torch._functorch._aot_autograd.descriptors import GradAOTOutput

    out = _output_node(joint.graph)
    descs = out.meta.get("desc")
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
    return type(desc).__name__ if desc is not None else ""


_BACKWARD_PLACEHOLDER_DESCS = {
    "TangentAOTInput",
    "PhiloxBackwardSeedAOTInput",
    "PhiloxBackwardBaseOffsetAOTInput",
    "BackwardTokenAOTInput",
}


def _is_tangent(node: fx.Node) -> bool:
    desc = node.meta.get("desc")
    if desc is not None:
        return _desc_name(desc) == "TangentAOTInput"
    return isinstance(node.target, str) and node.target.startswith("tangents")


def _is_backward_placeholder(node: fx.Node) -> bool:
    desc = node.meta.get("desc")
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
      last node the forward outputs depend on / the last node tagged
      ``is_forward``. That is torch's ``default_partition`` placement
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
    ``ParamAOTInput``/``BufferAOTInput`` descriptors (export route);
    ``PlainAOTInput(idx)`` descriptors → ``example_inputs[idx]`` (the flat
    inputs a dynamo backend receives: parameters and buffers are the live
    objects, matched by identity against ``model``; without a model, an
    ``nn.Parameter`` is a parameter and a dynamo-static non-parameter a
    buffer); last, a heuristic (a primal with a gradient output is a
    parameter, else an input).

    ``root_prefix``: path of ``model`` inside the traced root (``"model"`` on
    the export route, where a loss wrapper holds it as ``.model``); by
    default found from module identities / the outermost stack entry.
    """
    graph = joint_gm.graph
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    out_node = _output_node(graph)
    outputs = _flat_outputs(out_node)
    fwd_outputs = [o for o in outputs[:num_fwd_outputs] if isinstance(o, fx.Node)]

    # ---- phase ------------------------------------------------------------
    # Forward dependency cone of the forward outputs.
    fwd_required: set[fx.Node] = set()
    stack = list(fwd_outputs)
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
        if n.meta.get("partitioner_tag") in ("is_forward", "must_be_in_forward") and n.op != "placeholder":
            boundary = max(boundary, index[n])
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
            index[n] > boundary
            or n.meta.get("partitioner_tag") == "must_be_in_backward"
            or any(i in backward for i in n.all_input_nodes)
        ):
            backward.add(n)
    for n in nodes:
        n.meta["autograd_backward"] = n in backward

    # ---- module stacks ----------------------------------------------------
    resolver = _ModulePathResolver(model, root_prefix, nodes)
    fwd_by_seq: dict[Any, fx.Node] = {}
    for n in nodes:
        if n in backward or "seq_nr" not in n.meta or n.op != "call_function":
            continue
        fwd_by_seq.setdefault(n.meta["seq_nr"], n)
    for n in nodes:
        raw = None
        if n.op == "call_function":
            if n not in backward:
                raw = n.meta.get("nn_module_stack")
            elif not n.meta.get("is_gradient_acc", False):
                src = fwd_by_seq.get(n.meta.get("seq_nr"))
                raw = src.meta.get("nn_module_stack") if src is not None else None
                if raw is None:
                    raw = n.meta.get("fwd_nn_module_stack")
        n.meta["ac_module_stack"] = resolver.stack(raw) if raw else []

    # ---- placeholder roles -----------------------------------------------
    placeholders = [n for n in nodes if n.op == "placeholder"]
    roles, sources, method = _placeholder_roles(
        placeholders, outputs, num_fwd_outputs, model, example_inputs, input_roles, resolver
    )
    for n in placeholders:
        n.meta["ac_role"] = roles[n.name]
        if n.name in sources:
            n.meta["ac_source"] = sources[n.name]
        else:
            n.meta.pop("ac_source", None)

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

    # Descriptor mode (export route): parameters and buffers carry their own
    # descriptors, so every PlainAOTInput is a user input.
    descriptor_mode = any(isinstance(p.meta.get("desc"), (ParamAOTInput, BufferAOTInput)) for p in primals)

    used: set[str] = set()
    for pos, p in enumerate(primals):
        d = p.meta.get("desc")
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


def classify_example_inputs(example_inputs: Iterable[Any], model: nn.Module | None = None) -> list[str]:
    """Role of each flat input a dynamo backend receives (``parameter``/``buffer``/``input``)."""
    param_by_id: dict[int, str] = {}
    buffer_by_id: dict[int, str] = {}
    if model is not None:
        param_by_id, buffer_by_id = _tensor_names(model)
    return [_classify_one(v, param_by_id, buffer_by_id, {}, "") for v in example_inputs]


# --------------------------------------------------------------------------
# module path normalisation
# --------------------------------------------------------------------------

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
        for n in nodes:
            stack = n.meta.get("nn_module_stack")
            if not stack:
                continue
            if self.model is None:
                return normalize_module_path(next(iter(stack.values()))[0])
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


def role_counts(gm: fx.GraphModule) -> Counter:
    return Counter(n.meta.get("ac_role") for n in gm.graph.nodes if n.op == "placeholder")
