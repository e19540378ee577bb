"""Capture the joint forward+backward FX graph of one training step.

Two tracers, same result (an ``fx.GraphModule`` joint graph whose nodes carry
``meta["autograd_backward"]``, ``meta["ac_module_stack"]`` and, on
placeholders, ``meta["ac_role"]``):

* ``tracer="compile"`` (default): ``torch.compile(step, backend=aot_autograd(...),
  fullgraph=True)``; our ``partition_fn`` records a copy of the joint graph
  AOTAutograd hands to the partitioner, then lets ``default_partition`` finish
  so compilation completes. This is exactly the graph a ``torch.compile``
  partitioner (and therefore ``hyper_ac``'s backend) sees.
* ``tracer="export"``: ``dynamo_graph_capture_for_export`` +
  ``aot_export_joint_with_descriptors`` (the torchtitan / autoparallel path):
  no compilation, inputs described by ``ParamAOTInput`` / ``BufferAOTInput``
  descriptors.

Both tracers end in :func:`hyper_ac.frontend.annotate.annotate_joint`, the reusable
part: a compile backend's ``partition_fn`` calls it on the joint graph it
receives.

See ``docs/torch-compat.md`` for every torch internal this relies on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn

from hyper_ac import fx_meta
from hyper_ac._fx import copy_graph_module
from hyper_ac.frontend.annotate import CaptureError, JointAnnotation, annotate_joint, num_forward_outputs_from_descs
from hyper_ac.frontend.adapters import apply_adapter_hook

__all__ = [
    "CaptureError",
    "CapturedGraph",
    "capture_joint",
    "reduce_to_loss",
]


# --------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------



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
    tracer: str  # "compile" or "export": which capture_joint tracer made it
    annotation: JointAnnotation
    capture_seconds: float
    loss: torch.Tensor | None = None  # the loss computed while capturing (compile tracer)
    example_inputs: list[Any] | None = None  # dynamo's flat graph inputs (compile tracer)
    dynamo_graph: fx.GraphModule | None = None  # the forward graph dynamo traced (compile tracer)

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
        return [n for n in self.graph_module.graph.nodes if fx_meta.is_backward(n) == backward]

    def to_json(self, **kwargs: Any) -> str:
        from hyper_ac.frontend.serialize import to_json

        return to_json(self.graph_module, self.model, **kwargs)

    def serialize(self, **kwargs: Any) -> dict:
        from hyper_ac.frontend.serialize import serialize_graph

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
    """Root module of the export tracer: ``self.model`` + the loss reduction."""

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


# capture_joint's ``tracer`` keyword was called this until the plan's route
# (rewrite / stock) needed the word; a call that still uses it is told the new name.
_TRACER_OLD_NAME = "route"


def capture_joint(
    model: nn.Module,
    *example_args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    tracer: str = "compile",
    decompositions: Any = None,
    keep_outputs: bool = False,
    **example_kwargs: Any,
) -> CapturedGraph:
    """Capture ``model(*example_args, **example_kwargs)`` → loss → backward as one joint graph.

    The loss is ``reduce_to_loss(output, loss_fn)``. ``tracer`` is
    ``"compile"`` (torch.compile + aot_autograd, default) or ``"export"``
    (dynamo export + aot_export_joint_with_descriptors). A registered model
    adapter's ``on_applied`` hook runs first (once per model), so the trace
    has its effect. A graph break raises
    :class:`CaptureError` naming dynamo's reason. The model is left as it
    was: no backward runs (``.grad`` untouched), and the compile tracer, which
    runs the forward once, restores the buffers (e.g. BatchNorm statistics)
    and the RNG state afterwards. ``decompositions`` (compile tracer): an
    AOTAutograd decomposition table, e.g. Inductor's
    ``torch._inductor.decomposition.select_decomp_table()``, to capture the
    joint graph Inductor's partitioner sees. ``keep_outputs`` (compile tracer):
    the step also returns the model's other tensor outputs (an HF model's
    logits, ...) after the loss, as ``torch.compile(model)`` does; a loop that
    keeps them through the backward holds them at the step's peak.
    """
    old_keyword = example_kwargs.get(_TRACER_OLD_NAME)
    if old_keyword in ("compile", "export"):  # the keyword's old name, not a model input
        raise TypeError(f"capture_joint: '{_TRACER_OLD_NAME}' is now called 'tracer': pass tracer={old_keyword!r}")
    model = _unwrap(model)
    # The model adapter's on_applied hook changes the model: it runs before the trace, so the graph has its effect.
    apply_adapter_hook(model)
    if tracer == "compile":
        return _capture_compile(model, example_args, example_kwargs, loss_fn, decompositions, keep_outputs)
    if decompositions is not None or keep_outputs:
        raise ValueError("capture_joint: decompositions and keep_outputs are supported with tracer='compile' only")
    if tracer == "export":
        return _capture_export(model, example_args, example_kwargs, loss_fn)
    raise ValueError(f"capture_joint: unknown tracer {tracer!r}; use tracer='compile' or tracer='export'")


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


def _other_outputs(out: Any) -> list[torch.Tensor]:
    """The tensors of a model's output besides its loss, in order (an HF output's fields, a tuple's items)."""
    if isinstance(out, torch.Tensor):
        return []
    if isinstance(out, dict):  # HF ModelOutput is an OrderedDict of its non-None fields
        items = [v for k, v in out.items() if k != "loss"]
    elif isinstance(out, (tuple, list)):
        items = list(out[1:])
    else:
        items = []
    return [v for v in items if isinstance(v, torch.Tensor)]


def _capture_compile(model: nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None,
                     decompositions: Any = None, keep_outputs: bool = False) -> CapturedGraph:
    import torch._dynamo
    import torch._functorch.config as functorch_config
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    rec: dict[str, Any] = {}

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kw: Any):
        if "joint" not in rec:  # first graph only (fullgraph gives exactly one)
            rec["joint"] = copy_graph_module(joint)  # default_partition below edits the joint
            rec["num_fwd_outputs"] = num_fwd_outputs
            rec["static_lifetime_input_indices"] = list(kw.get("static_lifetime_input_indices") or [])
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)

    def identity_compiler(gm: fx.GraphModule, _example_inputs: Any) -> fx.GraphModule:
        return gm

    aot_backend = aot_autograd(fw_compiler=identity_compiler, bw_compiler=identity_compiler, partition_fn=partition,
                               decompositions=decompositions)

    def backend(gm: fx.GraphModule, example_inputs: list[Any]):
        rec["dynamo_graph"] = gm
        rec["example_inputs"] = list(example_inputs)
        return aot_backend(gm, example_inputs)

    def step(m: nn.Module, a: tuple, k: dict) -> Any:
        out = m(*a, **k)
        loss = reduce_to_loss(out, loss_fn)
        return (loss, *_other_outputs(out)) if keep_outputs else loss

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
                if keep_outputs:
                    loss = loss[0]
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
        tracer="compile",
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
                        f"the export tracer cannot trace {type(model).__name__}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0]} (data-dependent values or output shapes); "
                        "tracer='compile' handles these as unbacked SymInts"
                    ) from exc
                joint = joint_desc.graph_module
    finally:
        torch._dynamo.reset()
    num_fwd = num_forward_outputs_from_descs(joint)
    if num_fwd is None:
        raise CaptureError("export tracer: the joint graph's output node carries no descriptors")
    ann = annotate_joint(joint, num_fwd, model=model, root_prefix="model")
    return CapturedGraph(
        graph_module=joint,
        num_fwd_outputs=num_fwd,
        model=model,
        tracer="export",
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
