"""The step harness: a probe per (model, strategy) that instruments the aot_autograd backend (planning time, saved values, FLOPs) and builds each strategy's step function."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import time
from typing import Any, Callable, Iterable, Optional

from benchmarks.common import (CKPT, EAGER, HAC_MODES, HAC_STRATEGIES, INDUCTOR, _int_bytes, _quiet, budget_fraction,
                               graph_flops, hac_strategy_config)

# --------------------------------------------------------------------------
# instrumentation: one probe per (model, strategy)
# --------------------------------------------------------------------------


@dataclasses.dataclass
class _Probe:
    recording: bool = False
    num_fwd_outputs: Optional[int] = None
    plan_seconds: float = 0.0
    partitions: int = 0
    joint_nodes: int = 0
    resident_bytes: int = 0
    fw_flops: float = 0.0
    bw_flops: float = 0.0
    saved_values_graph: int = 0
    saved_bytes_graph: int = 0
    exclude: set = dataclasses.field(default_factory=set)
    saved: dict = dataclasses.field(default_factory=dict)
    results: list = dataclasses.field(default_factory=list)
    joint: Any = None
    joint_graph: Any = None
    example_inputs: Optional[list] = None

    def record(self, values: Iterable[Any]) -> None:
        """Remember the storages of tensors the backward holds (not parameters or inputs)."""
        import torch

        for t in values:
            if not isinstance(t, torch.Tensor):
                continue
            try:
                storage = t.untyped_storage()
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
            except Exception:  # tensor subclasses without a plain storage
                continue
            if ptr and ptr not in self.exclude:
                self.saved[ptr] = nbytes

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved.values())


def _storage_ptrs(tensors: Iterable[Any]) -> set:
    import torch

    out = set()
    for t in tensors:
        if isinstance(t, torch.Tensor):
            try:
                out.add(t.untyped_storage().data_ptr())
            except Exception:
                pass
    return out


def _instrument(aot_backend: Any, probe: _Probe, *, snapshot: bool = False, budget: Optional[float] = None,
                runner: str = "boxed") -> None:
    """Wrap the partition_fn and fw_compiler of a dynamo aot_autograd backend.

    partition_fn: wall time (the planning time), FLOPs of the forward and
    backward modules it returns, the saved values (forward outputs beyond
    ``num_fwd_outputs``) and, with ``snapshot``, a copy of the joint graph.
    fw_compiler: at run time, while ``probe.recording``, the storages of the
    saved tensors the forward hands the backward.
    """
    import torch._functorch.config as functorch_config

    from hyper_ac import fx_meta

    kwargs = _find_aot_backend(aot_backend).kwargs
    if runner == "boxed":
        from hyper_ac.lower.backends import boxed_fx_compiler

        kwargs["fw_compiler"] = kwargs["bw_compiler"] = boxed_fx_compiler
    inner_partition = kwargs["partition_fn"]
    inner_fw = kwargs["fw_compiler"]

    def partition_fn(joint, joint_inputs, *, num_fwd_outputs: int, **rest: Any):
        probe.joint_nodes = len(joint.graph.nodes)
        probe.joint_graph = joint  # rewritten in place by hyper_ac's pass: what the simulator simulated
        probe.resident_bytes = sum(_int_bytes(fx_meta.val(n)) for n in joint.graph.nodes if n.op == "placeholder")
        if snapshot:
            try:
                with _quiet():
                    probe.joint = (copy.deepcopy(joint), num_fwd_outputs)
            except RuntimeError:
                # Some graphs' meta cannot be deep-copied (T5: a fake tensor on "meta" with a cpu
                # storage); the snapshot only feeds the diagnostic columns (joint run, frontier points).
                probe.joint = None
        patch = (functorch_config.patch(activation_memory_budget=budget) if budget is not None
                 else contextlib.nullcontext())
        t0 = time.perf_counter()
        with patch:
            fw, bw = inner_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **rest)
        probe.plan_seconds += time.perf_counter() - t0
        probe.partitions += 1
        probe.num_fwd_outputs = num_fwd_outputs
        probe.fw_flops = graph_flops(fw)
        probe.bw_flops = graph_flops(bw)
        out = next(n for n in reversed(fw.graph.nodes) if n.op == "output")
        saved = [a for a in out.args[0][num_fwd_outputs:] if hasattr(a, "op")]
        probe.saved_values_graph = len(saved)
        probe.saved_bytes_graph = sum(_int_bytes(fx_meta.val(a)) for a in saved if a.op != "placeholder")
        return fw, bw

    def fw_compiler(gm, example_inputs):
        compiled = inner_fw(gm, example_inputs)
        boxed = getattr(compiled, "_boxed_call", False)

        def run(args):
            outs = compiled(args) if boxed else compiled(*args)
            if probe.recording and probe.num_fwd_outputs is not None:
                probe.record(list(outs)[probe.num_fwd_outputs:])
            return outs

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    kwargs["partition_fn"] = partition_fn
    kwargs["fw_compiler"] = fw_compiler


def _find_aot_backend(backend: Any) -> Any:
    """The dynamo ``aot_autograd`` backend object (``.kwargs`` with a ``partition_fn``).

    Torch's own strategies pass it directly; ``hyper_ac.backend`` exposes the
    one it wraps as ``.aot_backend``.
    """
    backend = getattr(backend, "aot_backend", backend)
    kwargs = getattr(backend, "kwargs", None)
    if not (isinstance(kwargs, dict) and "partition_fn" in kwargs):
        raise TypeError(f"no aot_autograd backend found inside {backend!r}")
    return backend


def _make_step_fn(strategy: str, model: Any, probe: _Probe, runner: str = "boxed",
                  buffer_reuse: Optional[str] = None) -> Callable:
    """A callable ``fn(**batch)`` running the model's forward under ``strategy``
    (``buffer_reuse``: the hyper_ac config key, None for its default)."""
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import partitioners
    from torch._functorch.aot_autograd import make_boxed_func

    if strategy in EAGER:
        if strategy == "eager_ckpt":
            _enable_eager_checkpoint(model, probe)
        return model

    if strategy in CKPT:
        checkpoint_layers(model)
    if strategy == "inductor":
        return torch.compile(model, fullgraph=True)  # stock: Inductor with its own partitioner
    if strategy == "ckpt_aot_eager":
        return torch.compile(model, backend="aot_eager", fullgraph=True)
    if strategy in HAC_STRATEGIES:
        import hyper_ac

        _, compiler, _ = HAC_STRATEGIES[strategy]
        backend = hyper_ac.backend(hac_strategy_config(strategy, buffer_reuse), model=model, compiler=compiler,
                                   on_result=probe.results.append)
        if strategy in INDUCTOR or strategy in CKPT:
            # Measured as a user runs it: peak, step time, gradients and the plan
            # (on_result); the backend's own compilers are kept.
            return torch.compile(model, backend=backend, fullgraph=True)
    else:
        def run_as_fx(gm, _example_inputs):
            return make_boxed_func(gm.forward)

        partition = partitioners.default_partition if strategy == "none" else \
            partitioners.min_cut_rematerialization_partition
        backend = aot_autograd(fw_compiler=run_as_fx, bw_compiler=run_as_fx, partition_fn=partition)
    _instrument(backend, probe, snapshot=(strategy == "none"),
                budget=budget_fraction() if strategy == "torch_budget" else None, runner=runner)

    def recording_backend(gm, example_inputs):
        probe.example_inputs = list(example_inputs)  # the real tensors dynamo passes (parameters included)
        return backend(gm, example_inputs)

    return torch.compile(model, backend=recording_backend, fullgraph=True)


def joint_run_peak(probe: _Probe) -> Optional[int]:
    """Peak of the (rewritten) joint graph run node by node with the step's real inputs.

    The schedule the simulator walks, executed for real under
    hyper_ac.memory's TrackingInterpreter: primals are dynamo's inputs, the
    tangent of the loss is ones.
    """
    import torch

    from hyper_ac import fx_meta, memory

    gm = probe.joint[0] if probe.joint is not None else probe.joint_graph
    if gm is None or probe.example_inputs is None or not memory.is_available():
        return None
    primals = iter(probe.example_inputs)
    args = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        if fx_meta.role(node) == "tangent" or str(node.target).startswith("tangents"):
            val = fx_meta.val(node)
            args.append(torch.ones(tuple(int(d) for d in val.shape), dtype=val.dtype))
        else:
            args.append(next(primals))
    with torch.no_grad():
        _, tracker = memory.run_graph(gm, *args)
    return tracker.peak_bytes


def checkpoint_layers(model: Any) -> None:
    """The model's own per-layer torch.utils.checkpoint(use_reentrant=False), as a user turns it on
    (HF: gradient checkpointing; TinyTransformer: each block's forward wrapped). Traceable by dynamo."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        return
    if hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    layers = getattr(model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise RuntimeError(f"{type(model).__name__}: no `layers` ModuleList to checkpoint")
    for block in layers:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def _enable_eager_checkpoint(model: Any, probe: _Probe) -> None:
    """Per-layer torch.utils.checkpoint(use_reentrant=False), recording what each checkpoint keeps."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def keep(values: Iterable[Any]) -> None:
        if probe.recording:
            probe.record(values)

    def recorded(ckpt: Callable) -> Callable:
        def call(function, *args, **kwargs):
            # What a non-reentrant checkpoint keeps is its inputs (held by the
            # recompute closure), not what its pack hooks see.
            bound = getattr(function, "keywords", None) or {}
            keep([*args, *kwargs.values(), *bound.values()])
            return ckpt(function, *args, **kwargs)

        return call

    if hasattr(model, "activation_checkpointing_enable") or hasattr(model, "gradient_checkpointing_enable"):
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        wrapped = 0
        for module in model.modules():
            func = getattr(module, "_gradient_checkpointing_func", None)
            if func is not None and getattr(module, "gradient_checkpointing", False):
                module._gradient_checkpointing_func = recorded(func)
                wrapped += 1
        if not wrapped:
            raise RuntimeError(f"{type(model).__name__}: gradient checkpointing enabled no layer")
        return
    layers = getattr(model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise RuntimeError(f"{type(model).__name__}: no `layers` ModuleList to checkpoint")
    ckpt = recorded(functools.partial(checkpoint, use_reentrant=False))
    for block in layers:
        block.forward = functools.partial(ckpt, block.forward)


