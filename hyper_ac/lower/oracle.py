"""Inductor's own account of a plan's step peak: the dry run (``PlanOptions::peak_oracle``).

The core's simulation ranks candidate plans but cannot see what Inductor does
after the partition (fusion across a replay and the backward, buffer reuse,
allocations inside extern kernels). Inductor's generated code can: compiled
with its C++ kernels replaced by no-ops, the wrapper still allocates, reuses
and frees exactly as the real one does, and the extern aten kernels (matmuls,
attention) still run. One forward and backward of that code under the counting
allocator gives the step's peak to the byte (research note: 7 of 7
configurations equal to the real step's; ``tests/python/test_oracle.py``).

:class:`InductorDryRun` is what ``hyper_ac.backend(compiler="inductor")`` passes
to the core for one joint graph: given a candidate's plan document, it
partitions a copy of the same joint graph with the backend's own partition
(``hyper_ac.lower.backends.partition_as_planned``, handed in), compiles both modules with the kernels
stubbed, runs them once on zero-filled inputs and returns the bytes held at
the peak beyond the inputs; -1 where it cannot (a non-CPU or symbolic-shape
graph, opaque inputs such as a DTensor's mesh, a failure of the dry run, which
is warned about once). The core decides what the figure means; nothing here
chooses a plan.

A dry run compiles each module as the real compile will (:class:`RealCompile`:
the same arguments to Inductor, the same donated buffers and user-visible
outputs), so its work lands in Inductor's FX graph cache under the real
compile's key: the candidate the core keeps is then compiled for real from the
cache (its lowering and code generation done once; only the C++ kernels, stubbed
here, are built). What the cache does not key on (the donated buffers, the
outputs' strides kept) is set as the real compile sets it, so a hit loads what
the real compile would have generated.

Each figure is remembered for the rest of the process under what it depends on
(:func:`measurement_key`: the joint graph, its inputs and tags, the candidate's
decisions, the Inductor and functorch settings): a graph compiled again (a
second model of the same shape, a recompile after ``torch._dynamo.reset()``) is
planned without compiling its candidates again.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import time
import types
import warnings
from typing import Any, Callable, Iterator, Optional

import torch
import torch.fx as fx

from hyper_ac import fx_meta
from hyper_ac._fx import copy_graph_module
from hyper_ac.planning import plan_doc

__all__ = ["InductorDryRun", "RealCompile", "dry_run_peak", "dry_running", "forget_measured", "forward_outputs_bytes",
           "graph_key", "measurement_key", "stubbed_kernels"]

_MEASURING: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("hyper_ac_dry_run", default=None)


def dry_running() -> Optional[str]:
    """The route of the candidate a dry run is compiling right now (``"rewrite"`` / ``"stock"``), else None:
    for whoever watches Inductor's compiles and must tell a measurement from the real one."""
    return _MEASURING.get()


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


@functools.cache
def _kernel_builder() -> concurrent.futures.ThreadPoolExecutor:
    """One thread that builds, behind the dry runs, the C++ kernels they stub: one build at a
    time, so that with the lowering on the main thread a dry run keeps to two cores."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hyper_ac-kernel-build")


@contextlib.contextmanager
def stubbed_kernels(graph_cache: bool = False) -> Iterator[None]:
    """Inductor's C++ kernels compiled as no-ops for as long as the block runs; its FX graph cache
    off unless ``graph_cache`` (the compile is keyed as the real one: :class:`RealCompile`). The
    cache keeps the generated wrapper, whose kernels are built when it is loaded: a stubbed
    kernel never reaches it.

    With ``graph_cache`` and Inductor allowed more than one compile thread, each stubbed kernel
    is also built for real in the background (:func:`_kernel_builder`) into Inductor's kernel
    cache, which the real compile of the plan kept then finds built or being built: the real
    compile's wait on its kernels overlaps the later dry runs instead of following them. The
    dry run itself still runs the no-ops. Without a spare thread (``compile_threads`` 1) the
    builds would be serial work the dry run does not need, and are left to the real compile.

    Afterwards the loaded-module cache is cleared: it is keyed by the wrapper's
    source, and a real compile of the same source would get the stubbed module back."""
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads
    from torch._inductor.codecache import CppCodeCache, CppPythonBindingsCodeCache, PyCodeCache

    saved = AsyncCompile.cpp, AsyncCompile.cpp_pybinding
    if graph_cache and get_compile_threads() > 1:  # read before the patch below sets it to 1
        submit = _kernel_builder().submit

        def build_behind(self, source_code):
            CppCodeCache.load_async(source_code, submit_fn=submit)
            return _noop

        def build_binding_behind(self, argtypes, source_code):
            CppPythonBindingsCodeCache.load_pybinding_async(argtypes, source_code, submit_fn=submit)
            return _noop

        AsyncCompile.cpp, AsyncCompile.cpp_pybinding = build_behind, build_binding_behind
    else:
        AsyncCompile.cpp = lambda self, source_code: _noop
        AsyncCompile.cpp_pybinding = lambda self, argtypes, source_code: _noop
    try:
        with torch._inductor.config.patch(compile_threads=1, **({} if graph_cache else {"fx_graph_cache": False})):
            yield
    finally:
        AsyncCompile.cpp, AsyncCompile.cpp_pybinding = saved
        PyCodeCache.modules_no_attr.clear()


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [node for node in gm.graph.nodes if node.op == "placeholder"]


def _concrete(sizes) -> Optional[tuple]:
    """Sizes as ints: a SymInt by its hint (backed by the example the graph was traced with); None without one."""
    out = []
    for size in sizes:
        if isinstance(size, torch.SymInt):
            size = size.node.hint
        if not isinstance(size, int):
            return None
        out.append(size)
    return tuple(out)


def _zeros_like(value: Any) -> Any:
    """A real input for a placeholder: zeros, or for a CPU generator's state (a replayed random
    op's), the generator's current one (an all-zero state is refused by the generator); a size
    (a dynamic shape's SymInt) is its hint."""
    if isinstance(value, (int, torch.SymInt)):
        return _concrete([value])[0]
    state = torch.get_rng_state()
    if value.dtype == torch.uint8 and _concrete(value.shape) == tuple(state.shape) and value.device.type == "cpu":
        return state
    return torch.empty_strided(_concrete(value.shape), _concrete(value.stride()), dtype=value.dtype,
                               device=value.device).zero_()


def _restrided(backward: fx.GraphModule, output_names: list, strides: Optional[list]) -> list:
    """The backward's example inputs with each saved value laid out as the compiled forward
    returns it (Inductor may choose other strides than the partition's), as aot_autograd
    restrides them before compiling the backward."""
    position = {name: k for k, name in enumerate(output_names) if name is not None}
    inputs = []
    for node in _placeholders(backward):
        value = fx_meta.val(node)
        k = position.get(node.name)
        real = strides[k] if strides is not None and k is not None and k < len(strides) else None
        if isinstance(value, torch.Tensor) and real is not None and tuple(value.stride()) != tuple(real):
            value = value.as_strided(value.size(), tuple(real))
        inputs.append(value)
    return inputs


def _as_laid_out(value: Any, expected: Any) -> Any:
    """A saved value as the backward was compiled to read it; one laid out otherwise (not
    expected after :func:`_restrided`) is replaced by a fresh buffer of the expected layout (its
    contents are garbage either way), the forward's freed first: the same bytes."""
    if not isinstance(value, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return value
    if (tuple(value.shape), tuple(value.stride())) == (_concrete(expected.shape), _concrete(expected.stride())):
        return value
    del value
    return _zeros_like(expected)


def why_not_measurable(*modules: fx.GraphModule) -> Optional[str]:
    """Why a dry run cannot measure these modules (None: it can)."""
    for gm in modules:
        for node in _placeholders(gm):
            value = fx_meta.val(node)
            if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
                if _concrete([value]) is None:
                    return f"input {node.name!r} is a size without a hint (data-dependent)"
                continue  # a dynamic size: run at its hint, the example the graph was traced with
            if not isinstance(value, torch.Tensor):
                return f"input {node.name!r} is not a tensor ({type(value).__name__})"
            if value.device.type != "cpu":
                return f"input {node.name!r} is on {value.device} (the counting allocator counts CPU memory)"
            if _concrete(value.shape) is None or _concrete(value.stride()) is None:
                return f"input {node.name!r} has a shape without a hint (data-dependent)"
    return None


def _storage_key(value: torch.Tensor) -> Optional[int]:
    try:
        return id(value.untyped_storage())
    except (NotImplementedError, RuntimeError):  # a tensor without a plain storage: no claim made
        return None


def forward_outputs_bytes(forward: fx.GraphModule) -> int:
    """Bytes the forward's outputs hold together, a lower bound on a dry run's peak: every
    output (the saved values and the user's) is alive when the forward returns. Outputs that
    share a storage (views) count once, at the largest of them; a storage of an input is
    not counted (allocated before the step), nor a broadcast dimension (stride 0). Inductor
    does not make distinct outputs alias one another or an input (``remove_noop_ops``)."""
    inputs = {_storage_key(value) for node in _placeholders(forward)
              if isinstance(value := fx_meta.val(node), torch.Tensor)}
    largest: dict[int, int] = {}
    for arg in forward.graph.find_nodes(op="output")[0].args[0]:
        value = fx_meta.val(arg) if isinstance(arg, fx.Node) else None
        if not isinstance(value, torch.Tensor) or (key := _storage_key(value)) is None or key in inputs:
            continue
        sizes, strides = _concrete(value.shape), _concrete(value.stride())
        if sizes is None or strides is None:
            continue
        dense = value.element_size()
        for size, stride in zip(sizes, strides):
            dense *= size if stride != 0 else 1
        largest[key] = max(largest.get(key, 0), dense)
    return sum(largest.values())


@dataclasses.dataclass(frozen=True)
class RealCompile:
    """What Inductor's real compile of a joint graph's modules is told beyond the modules
    (``compile_fx``'s forward and backward compilers, aot_autograd's metadata); a dry run
    told the same compiles to the real compile's FX graph cache key and code."""

    dynamo_graph: fx.GraphModule  # the graph compile_fx was called with: its outputs are the user's
    num_example_inputs: int  # its inputs
    static_input_indices: tuple  # the partition's static_lifetime_input_indices (parameters, buffers)
    num_fwd_outputs: int  # the forward's outputs before the saved values (the partition's num_fwd_outputs)
    num_mutated_inputs: int  # of those, the leading updated inputs aot_autograd returns

    @classmethod
    def of(cls, joint: fx.GraphModule, dynamo_graph: Optional[fx.GraphModule], num_example_inputs: int,
           partition_kwargs: dict) -> Optional["RealCompile"]:
        """The real compile of ``joint`` (the partition step's graph and arguments); None where
        it cannot be told (no dynamo graph, a joint output without aot_autograd's descriptors)."""
        from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput

        descs = fx_meta.desc(joint.graph.find_nodes(op="output")[0])
        if dynamo_graph is None or descs is None:
            return None
        mutated = 0
        while mutated < len(descs) and isinstance(descs[mutated], InputMutationAOTOutput):
            mutated += 1
        return cls(dynamo_graph, num_example_inputs, tuple(partition_kwargs.get("static_lifetime_input_indices") or ()),
                   partition_kwargs["num_fwd_outputs"], mutated)


def _saved_values(forward: fx.GraphModule, num_fwd_outputs: int) -> list:
    """What the forward saves for the backward (its outputs after the user's), as values."""
    return [fx_meta.val(arg) if isinstance(arg, fx.Node) else arg
            for arg in forward.graph.find_nodes(op="output")[0].args[0][num_fwd_outputs:]]


def _donated_backward_inputs(forward: fx.GraphModule, backward: fx.GraphModule, num_fwd_outputs: int) -> Optional[list]:
    """The backward inputs Inductor may reuse as buffers (saved values nothing else holds), as
    aot_autograd finds them for the real backward (``collect_bw_donated_buffer_idxs``)."""
    import torch._functorch.config as functorch_config
    from torch._functorch._aot_autograd.graph_compile import collect_bw_donated_buffer_idxs

    if not functorch_config.donated_buffer:
        return None
    saved = _saved_values(forward, num_fwd_outputs)
    # Saved tensors first, then opaque objects and symints (the partition's order).
    num_tensors = next((k for k, value in enumerate(saved) if not isinstance(value, torch.Tensor)), len(saved))
    metadata = types.SimpleNamespace(
        num_forward=num_fwd_outputs, num_symints_saved_for_bw=sum(isinstance(v, torch.SymInt) for v in saved),
        tensors_saved_for_backwards_slice=slice(num_fwd_outputs, num_fwd_outputs + num_tensors))
    return collect_bw_donated_buffer_idxs(forward, backward, metadata)


def _compile(forward: fx.GraphModule, backward: fx.GraphModule, forward_inputs: list, output_names: list,
             patches: Callable[[bool], dict], real: Optional[RealCompile]) -> tuple:
    """(forward, backward, the backward's example inputs) compiled by Inductor with stubbed kernels."""
    import torch._inductor.compile_fx as compile_fx_module
    from torch._guards import TracingContext, detect_fake_mode, tracing

    # A context of its own: Inductor reports the forward's output strides into it, as into
    # aot_autograd's, and nothing of the real compile's context is touched.
    context = TracingContext(detect_fake_mode(forward_inputs))
    # compile_fx_inner looked up at each call, as compile_fx's own inner compile (and a spy) sees it.
    inner: Callable = lambda *args, **kwargs: compile_fx_module.compile_fx_inner(*args, **kwargs)  # noqa: E731
    if real is None:  # Inductor's defaults, the cache off
        compile_forward = inner
        compile_backward = functools.partial(inner, is_backward=True)
        backward_config: dict = {}
    else:  # as compile_fx compiles them: its forward and backward compilers, aot_autograd's metadata in the context
        context.fw_metadata = types.SimpleNamespace(
            static_input_indices=list(real.static_input_indices), num_mutated_inp_runtime_indices=real.num_mutated_inputs,
            bw_donated_idxs=_donated_backward_inputs(forward, backward, real.num_fwd_outputs))
        extra = compile_fx_module.create_compiler_config_extra(real.dynamo_graph)
        inner = functools.partial(inner, get_decomp_fn=compile_fx_module.select_decomp_table)
        compile_forward = functools.partial(
            compile_fx_module.compile_fx_forward, compiler_config_extra=extra, inner_compile=inner,
            num_orig_model_outputs=compile_fx_module.get_num_model_outputs(real.dynamo_graph),
            num_example_inputs=real.num_example_inputs)
        compile_backward = functools.partial(compile_fx_module.compile_fx_backward, compiler_config_extra=extra,
                                             inner_compile=inner)
        # aot_autograd lowers a backward without saved symints lazily, at its first call: outside the
        # backend's partition step, hence without its custom_partitioner_fn in the config.
        lazy = not any(isinstance(value, torch.SymInt) for value in _saved_values(forward, real.num_fwd_outputs))
        backward_config = {"custom_partitioner_fn": None} if lazy else {}
    with stubbed_kernels(graph_cache=real is not None), tracing(context):
        with torch._inductor.config.patch(patches(False)), TracingContext.report_output_strides() as strides:
            run_forward = compile_forward(forward, forward_inputs)
        backward_inputs = _restrided(backward, output_names, strides)
        with torch._inductor.config.patch({**patches(True), **backward_config}):
            run_backward = compile_backward(backward, backward_inputs)
    return run_forward, run_backward, backward_inputs


def dry_run_peak(forward: fx.GraphModule, backward: fx.GraphModule,
                 patches: Callable[[bool], dict] = lambda is_backward: {}, real: Optional[RealCompile] = None) -> int:
    """The bytes a step of these partitioned modules holds at its peak beyond its inputs:
    both compiled by Inductor with stubbed kernels, run once on zero-filled inputs (the
    forward's user outputs and the gradients kept to the end, as a training loop that keeps
    ``outputs`` through ``outputs.loss.backward()`` holds them: what ``memory.measure_step``
    measures and the core's simulation assumes). ``patches(is_backward)``: the Inductor config each
    module compiles under, as the real compile's. ``real``: the real compile's arguments,
    with which the dry run compiles as it will (and leaves its work in the FX graph cache);
    None compiles with Inductor's defaults, the cache off."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from hyper_ac import memory

    forward_inputs = [fx_meta.val(node) for node in _placeholders(forward)]
    output_names = [arg.name if isinstance(arg, fx.Node) else None
                    for arg in forward.graph.find_nodes(op="output")[0].args[0]]
    run_forward, run_backward, backward_inputs = _compile(forward, backward, forward_inputs, output_names, patches, real)
    with unset_fake_temporarily():
        args = [_zeros_like(value) for value in forward_inputs]
        saved_names = {node.name for node in _placeholders(backward)}
        with memory.track() as tracked:
            outputs = run_forward(args)  # boxed: takes the list and frees what it no longer needs
            produced = dict(zip(output_names, outputs))
            # The user's outputs stay alive through the backward: the forward's first num_fwd_outputs
            # (the real compile's), else those the backward does not take.
            user = (outputs[:real.num_fwd_outputs] if real is not None
                    else [value for name, value in zip(output_names, outputs) if name not in saved_names])
            del outputs
            backward_args = [_as_laid_out(produced.pop(node.name), expected) if node.name in produced
                             else _zeros_like(expected)
                             for node, expected in zip(_placeholders(backward), backward_inputs)]
            del produced
            gradients = run_backward(backward_args)
            peak = tracked.peak_bytes
        del gradients, user
    return peak


# Dry-run peaks measured in this process, by measurement_key; least recently used out first.
_MEASURED: "collections.OrderedDict[str, int]" = collections.OrderedDict()
_MEASURED_LIMIT = 4096
# Plan document keys that do not change what is compiled: figures and notes about the decisions.
_NOT_DECISIONS = frozenset({"stats", "diagnostics", "mode", "route_reason"})


def forget_measured() -> None:
    """Forget every figure measured in this process: the next plan of any graph runs its dry runs."""
    _MEASURED.clear()


def _remembered(key: str) -> Optional[int]:
    if key not in _MEASURED:
        return None
    _MEASURED.move_to_end(key)
    return _MEASURED[key]


def _remember(key: str, figure: int) -> None:
    _MEASURED[key] = figure
    while len(_MEASURED) > _MEASURED_LIMIT:
        _MEASURED.popitem(last=False)


def _size_key(size: Any) -> str:
    """A size in a measurement's key: a symbolic one with its hint (``s0=128``)."""
    return f"{size}={size.node.hint}" if isinstance(size, torch.SymInt) else str(size)


def _value_key(value: Any) -> tuple:
    """What a placeholder's example value contributes to a measurement's key: a tensor's layout
    (symbolic sizes by their expressions and hints: a dry run measures at the hints), a number
    itself, anything else its type."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(map(_size_key, value.shape)), tuple(map(_size_key, value.stride())),
                str(value.dtype), str(value.device), value.requires_grad)
    if isinstance(value, (bool, int, float, str, torch.SymInt, torch.SymFloat)):
        return (type(value).__name__, _size_key(value))
    return (type(value).__name__,)


def graph_key(joint: fx.GraphModule, real: Optional[RealCompile]) -> str:
    """What a joint graph contributes to its candidates' measurement keys: its code, its inputs'
    layouts, every node's checkpoint tags (the partition honours them), and the real compile's
    arguments; the torch build."""
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(joint.code.encode())
    for node in joint.graph.nodes:
        if node.op == "placeholder":
            digest.update(repr((node.name, _value_key(fx_meta.val(node)))).encode())
        if fx_meta.user_tagged(node):
            digest.update(repr((node.name, str(fx_meta.policy(node)), fx_meta.graph_id(node))).encode())
    if real is not None:
        digest.update(real.dynamo_graph.code.encode())
        digest.update(repr((real.num_example_inputs, real.static_input_indices, real.num_fwd_outputs,
                            real.num_mutated_inputs)).encode())
    return digest.hexdigest()


def measurement_key(graph: str, plan: dict, patches: Callable[[bool], dict]) -> str:
    """The key a dry-run figure is remembered by: the graph's (:func:`graph_key`), the candidate's
    decisions (its plan document less figures and notes), the Inductor settings the two modules
    compile under (the backend's patches over the global config) and functorch's."""
    import torch._functorch.config as functorch_config

    digest = hashlib.sha256(graph.encode())
    digest.update(json.dumps({k: v for k, v in plan.items() if k not in _NOT_DECISIONS}, sort_keys=True).encode())
    digest.update(repr((sorted(patches(False).items()), sorted(patches(True).items()))).encode())
    digest.update(torch._inductor.config.get_hash() + functorch_config.get_hash())
    return digest.hexdigest()


class InductorDryRun:
    """``PlanOptions::peak_oracle`` for one joint graph under ``hyper_ac.backend(compiler="inductor")``.

    ``joint``: the graph the partition step was called with; ``partition(gm, plan)``:
    the backend's partition of a copy of it under a candidate's plan document, into
    (forward, backward) modules; ``patches(is_backward, stock_route=...)``: the Inductor config the
    backend compiles a graph of that route under (``hyper_ac.lower.backends.inductor_patches``: a candidate
    routed to stock as mode off compiles it). Called with a candidate plan's
    JSON text, it returns the dry run's peak bytes (or -1). ``calls``: (route, bytes,
    seconds) per measurement."""

    def __init__(self, joint: fx.GraphModule, partition: Callable[[fx.GraphModule, dict], tuple],
                 patches: Callable[..., dict] = lambda is_backward, stock_route=False: {},
                 real: Optional[RealCompile] = None) -> None:
        self._partition, self._patches, self._real = partition, patches, real
        # Inputs a dry run cannot make (a DTensor's mesh, a device tensor) rule the graph out before any work.
        self._unmeasurable = why_not_measurable(joint)
        self._joint = None if self._unmeasurable else copy_graph_module(joint)  # before any plan touches it
        self.calls: list[tuple[str, int, float]] = []  # the dry runs this graph's planning ran
        self._graph_key = None if self._unmeasurable else graph_key(joint, real)
        self._warned = False
        self._partitioned: dict[str, tuple] = {}  # plan text -> modules, from lower_bound for __call__

    def _modules(self, plan_text: str, plan: dict) -> tuple:
        if plan_text in self._partitioned:
            return self._partitioned.pop(plan_text)
        return self._partition(copy_graph_module(self._joint), plan)

    def lower_bound(self, plan_text: str) -> int:
        """``PlanOptions::peak_lower_bound``: the bytes a candidate's dry run cannot measure
        under (:func:`forward_outputs_bytes` of its partition), found without compiling; -1
        where the dry run could not measure it either. The partition is kept for a
        measurement of the same candidate."""
        plan = json.loads(plan_text)
        if self._unmeasurable:
            return -1
        key = "lower bound " + measurement_key(self._graph_key, plan, lambda is_backward: {})
        if (known := _remembered(key)) is not None:
            return known
        try:
            forward, backward = self._partition(copy_graph_module(self._joint), plan)
        except Exception:  # the dry run says why, should the core ask it
            return -1
        if why_not_measurable(forward, backward) is not None:
            return -1
        self._partitioned[plan_text] = (forward, backward)
        bound = forward_outputs_bytes(forward)
        _remember(key, bound)
        return bound

    def __call__(self, plan_text: str) -> int:
        started = time.perf_counter()
        plan = json.loads(plan_text)
        if self._unmeasurable:
            return self._cannot(plan, f"not measurable: {self._unmeasurable}", started)
        patches = functools.partial(self._patches, stock_route=plan_doc.route(plan) == "stock")  # as the real compile
        key = measurement_key(self._graph_key, plan, patches)
        if (known := _remembered(key)) is not None:
            self._partitioned.pop(plan_text, None)
            return known
        forward, backward = self._modules(plan_text, plan)
        reason = why_not_measurable(forward, backward)
        if reason is not None:
            return self._cannot(plan, f"not measurable: {reason}", started)
        token = _MEASURING.set(plan_doc.route(plan))
        try:
            peak = dry_run_peak(forward, backward, patches, self._real)
        except Exception as error:  # the simulation stands; say why once
            return self._cannot(plan, f"the dry run failed: {type(error).__name__}: {error}", started)
        finally:
            _MEASURING.reset(token)
        self.calls.append((plan_doc.route(plan), peak, time.perf_counter() - started))
        _remember(key, peak)
        return peak

    def _cannot(self, plan: dict, why: str, started: float) -> int:
        if not self._warned:
            warnings.warn(f"hyper_ac: Inductor's dry run cannot measure this graph's plans ({why}); the core's "
                          "simulation stands (peak_oracle: off skips the attempt)", stacklevel=2)
            self._warned = True
        self.calls.append((plan_doc.route(plan), -1, time.perf_counter() - started))
        return -1
