"""The memory/time frontier under Inductor (``python -m benchmarks --parts frontier``, issue 24).

Per model, every knob a ``torch.compile`` user reaches for when out of
memory, each one point = (measured peak of one training step, step time
paired with stock ``torch.compile``): stock Inductor (whole-model and
per-block compile); PyTorch's ``activation_memory_budget`` at 1.0 … 0.0;
torchtitan's per-block ``checkpoint_wrapper`` (full AC) and its op save-list
selective AC, each with whole-model and per-block compile; HF
``gradient_checkpointing_enable()``; hyper_ac through
``hyper_ac.backend(config, compiler="inductor")`` (byte budgets, ``auto``,
``full``, ``output_recompute``), whole-model and per-block. Rendering and
dominance: :mod:`benchmarks.frontier_report`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import os
import time
import traceback
from typing import Any, Callable, Optional, Sequence

from benchmarks.common import _first_line, _loss_of, _quiet, build_batch, build_model, hac_config
from benchmarks.harness import checkpoint_layers
from benchmarks.step import (_MEASURED_STEP_SEED, StepOptions, _clear_grads, _close, _grads, _max_diff,
                             _paired_with_stock)

TORCH_BUDGETS = (1.0, 0.9, 0.7, 0.5, 0.3, 0.1, 0.0)
# hyper_ac byte budgets as fractions of stock's measured peak (whole-model compile)
HAC_BYTE_FRACTIONS = (0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3)
# hyper_ac under per-block compile (ac_scope: unit_graph): the config's fraction budget, of the
# activation bytes each block saves when it saves everything
HAC_BLOCK_FRACTIONS = (0.9, 0.7, 0.5, 0.4, 0.3, 0.1)
# hyper_ac modes, by point name: (ac_mode, hardware or None for the config's own). "auto (measured)":
# auto under `hardware: measured`, priced by measured op times; both aim at the knee "least peak at
# <= 1.05x step time" under Inductor's dry run (docs/config.md, "auto's aim")
HAC_MODES = {"auto": ("auto", None), "auto (measured)": ("auto", "measured"), "full": ("full", None),
             "output_recompute": ("output_recompute", None)}
SYSTEMS = ("stock", "torch_budget", "checkpoint_wrapper", "sac", "hf_ckpt", "hyper_ac", "hyper_ac_block")
HAC_SYSTEMS = ("hyper_ac", "hyper_ac_block")


@dataclasses.dataclass(frozen=True)
class Point:
    system: str  # one of SYSTEMS
    point: str   # the setting within the system, as the table shows it
    # builds the step callable from (model, batch, stock_peak_bytes): fn(**batch) -> output
    make: Callable[[Any, dict, Optional[int]], Callable] = dataclasses.field(compare=False, repr=False)
    # config patch active while the point compiles (its warm-up step)
    patch: Callable[[], Any] = dataclasses.field(default=contextlib.nullcontext, compare=False, repr=False)


# --------------------------------------------------------------------------
# the model's blocks, and the compositions over them
# --------------------------------------------------------------------------


def block_list(model: Any) -> Any:
    """The repeated blocks: the shallowest ``nn.ModuleList`` (>1 entries) of a single class
    (TinyTransformer ``layers``, GPT-2 ``transformer.h``, Llama/Mixtral ``model.layers``,
    BERT ``bert.encoder.layer``)."""
    import torch

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 1 and len({type(m) for m in mod}) == 1:
            depth = name.count(".") if name else -1
            if best is None or depth < best[0]:
                best = (depth, mod)
    if best is None:
        raise RuntimeError(f"{type(model).__name__}: no list of repeated blocks")
    return best[1]


def _wrap_blocks(model: Any, context_fn: Optional[Callable] = None) -> None:
    """torchtitan's per-block activation checkpointing: each block under
    ``checkpoint_wrapper`` (non-reentrant), with an SAC ``context_fn`` when given."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    blocks = block_list(model)
    for i, block in enumerate(blocks):
        kwargs = {} if context_fn is None else {"context_fn": context_fn, "preserve_rng_state": False}
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs)


def _compile_blocks(model: Any, backend: Any = "inductor") -> Any:
    """torchtitan's per-block compile: each block compiled on its own (``Module.compile``,
    fullgraph), the rest of the model eager. ``backend``: one for every block (identical blocks then
    share one compiled graph, as under torchtitan)."""
    for block in block_list(model):
        block.compile(backend=backend, fullgraph=True)
    return model


def _whole(model: Any, backend: Any = None) -> Any:
    """Whole-model compile; by default Inductor as ``compile_fx`` itself: what
    ``backend="inductor"`` runs, but a backend object dynamo does not take for stock's. Stock's
    paired copy (a new instance of the same class) would otherwise reuse this point's graph."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    return torch.compile(model, backend=compile_fx if backend is None else backend, fullgraph=True)


# The floor (docs/floor.md): stock, torchtitan's per-layer checkpoint_wrapper and hyper_ac full,
# each under whole-model Inductor, as the frontier's points of those names.
FLOOR_POINTS = {"stock": ("stock", "whole compile"), "wrapper": ("checkpoint_wrapper", "whole compile"),
                "full": ("hyper_ac", "full")}


def measure_named(name: str, system: str, point: str, spec: Any = None,
                  stock_peak: Optional[int] = None) -> tuple[dict, list]:
    """One frontier point by its system and name (as the table shows them), measured as the
    frontier measures it but without timing: (row, the parameters' gradients). ``stock_peak``
    sizes hyper_ac's byte budgets."""
    from benchmarks.common import ModelSpec

    opts = StepOptions(spec=ModelSpec() if spec is None else spec, paired_rounds=0)
    found = [p for p in points(name, build_model(name, opts.spec)) if (p.system, p.point) == (system, point)]
    if not found:
        raise ValueError(f"{name}: no frontier point {system!r} {point!r}")
    row, (_, grads) = measure_point(name, found[0], opts, stock_peak, None)
    return row, grads


def floor_step(name: str, system: str, spec: Any = None) -> tuple:
    """One floor system (``FLOOR_POINTS``): (peak bytes, bytes live when the forward returns,
    the parameters' gradients)."""
    if system not in FLOOR_POINTS:
        raise ValueError(f"floor system {system!r}: expected one of {', '.join(FLOOR_POINTS)}")
    row, grads = measure_named(name, *FLOOR_POINTS[system], spec=spec)
    return row["peak_bytes"], row["forward_bytes"], grads


def sac_save_list() -> set:
    """torchtitan's op save-list (the ops present in this torch): matmuls, SDPA, flex
    attention, ``max`` and the collectives."""
    import torch

    aten = torch.ops.aten
    names = [(aten, "mm"), (aten, "addmm"), (aten, "bmm"), (aten, "max"),
             (aten, "_scaled_dot_product_flash_attention"), (aten, "_scaled_dot_product_flash_attention_for_cpu"),
             (aten, "_scaled_dot_product_efficient_attention"), (aten, "_scaled_dot_product_cudnn_attention"),
             (aten, "_scaled_dot_product_attention_math")]
    comm = getattr(torch.ops, "_c10d_functional", None)
    if comm is not None:
        names += [(comm, "reduce_scatter_tensor"), (comm, "all_reduce"), (comm, "all_gather_into_tensor")]
    out: set = set()
    for ns, name in names:
        packet = getattr(ns, name, None)
        if packet is not None and hasattr(packet, "default"):
            out.add(packet.default)
    flex = getattr(torch._higher_order_ops, "flex_attention", None)
    if flex is not None:
        out.add(flex)
    return out


def sac_context_fn() -> Callable:
    """A ``context_fn`` for ``checkpoint``: save the listed ops, but recompute every second
    ``mm`` (counted separately in the forward and in the recompute, as torchtitan does)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = sac_save_list()
    mm = torch.ops.aten.mm.default

    def make() -> Any:
        counts: dict = collections.Counter()

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            phase = "replay" if ctx.is_recompute else "forward"  # counted apart
            if func is mm:
                counts[phase] += 1
            keep = func in save and not (func is mm and counts[phase] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return make


def _resident_bytes(model: Any, batch: dict) -> int:
    """Parameters, buffers and inputs: counted by the config's byte budget (the simulated
    peak includes them), not by the measured peak (allocated before the step)."""
    import torch

    tensors = [*model.parameters(), *model.buffers(), *(v for v in batch.values() if isinstance(v, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


# The plans the hyper_ac backend made while the current point compiled (measure_point clears it).
_PLANNED: list = []


def _hac(config_of: Callable[[Any, dict, Optional[int]], Any], per_block: bool) -> Callable:
    import hyper_ac

    def make(model: Any, batch: dict, stock_peak: Optional[int]) -> Callable:
        config = config_of(model, batch, stock_peak)
        if per_block:
            # Each compiled graph is one block of the model (docs/config.md, ac_scope: unit_graph).
            config = hyper_ac.load_config(config).with_option("scope", "unit_graph")
            return _compile_blocks(model, hyper_ac.backend(config, compiler="inductor", on_result=_PLANNED.append))
        return _whole(model, hyper_ac.backend(config, model=model, compiler="inductor", on_result=_PLANNED.append))

    return make


def planned_columns(results: Sequence[Any]) -> dict:
    """What the core's plans say beside the measured step: ``nearest_over_bytes``, the least
    peak its budget search measured over the target (stats ``measured_nearest_over``), where
    one graph was planned and its search measured one; nothing otherwise."""
    if len(results) != 1:
        return {}
    nearest = results[0].stats.get("measured_nearest_over", -1)
    return {"nearest_over_bytes": nearest} if nearest is not None and nearest >= 0 else {}


def byte_budget_point(fraction: float) -> str:
    """The point name of hyper_ac's whole-model byte budget at ``fraction`` x stock's peak."""
    return f"budget {fraction:g}× stock peak"


def byte_budget_fraction(point: str) -> Optional[float]:
    """The fraction of a :func:`byte_budget_point` name; None for any other point."""
    head, _, rest = point.partition(" ")
    number, _, tail = rest.partition("×")
    if head != "budget" or tail != " stock peak":
        return None
    try:
        return float(number)
    except ValueError:
        return None


def _byte_budget(fraction: float) -> Callable:
    def config(model: Any, batch: dict, stock_peak: Optional[int]) -> dict:
        if stock_peak is None:
            raise RuntimeError("no stock peak to size the budget from")
        return {"ac_mode": "budget", "ac_memory_budget": int(_resident_bytes(model, batch) + fraction * stock_peak)}

    return config


def points(model_name: str, model: Any) -> list[Point]:
    """Every point of one model (``model``: a built instance, to see what it supports)."""
    import torch._functorch.config as functorch_config

    out = [Point("stock", "whole compile", lambda m, b, p: _whole(m, "inductor")),
           Point("stock", "per-block compile", lambda m, b, p: _compile_blocks(m))]
    out += [Point("torch_budget", f"{f:.1f}", lambda m, b, p: _whole(m),
                  functools.partial(functorch_config.patch, activation_memory_budget=f)) for f in TORCH_BUDGETS]
    for system, context in (("checkpoint_wrapper", None), ("sac", "sac")):
        def wrapped(m: Any, compile_: Callable, context: Optional[str] = context) -> Any:
            _wrap_blocks(m, sac_context_fn() if context else None)
            return compile_(m)

        out += [Point(system, "whole compile", lambda m, b, p, w=wrapped: w(m, _whole)),
                Point(system, "per-block compile", lambda m, b, p, w=wrapped: w(m, _compile_blocks))]
    if getattr(model, "supports_gradient_checkpointing", False):
        out.append(Point("hf_ckpt", "whole compile", lambda m, b, p: (checkpoint_layers(m), _whole(m))[1]))
    out += [Point("hyper_ac", byte_budget_point(f), _hac(_byte_budget(f), False)) for f in HAC_BYTE_FRACTIONS]
    out += [Point("hyper_ac_block", f"budget {f:.1f}", _hac(lambda m, b, p, f=f: {"ac_mode": "budget", "ac_memory_budget": f},
                                                          True)) for f in HAC_BLOCK_FRACTIONS]
    for mode in HAC_MODES:
        out += [Point("hyper_ac", mode, _hac(lambda m, b, p, mode=mode: _mode_config(mode), False)),
                Point("hyper_ac_block", mode, _hac(lambda m, b, p, mode=mode: _mode_config(mode), True))]
    return sorted(out, key=_priority)  # stable: each system keeps its own order


def _mode_config(point_name: str) -> Any:
    """The config of one HAC_MODES point."""
    import hyper_ac

    mode, hardware = HAC_MODES[point_name]
    return hac_config(mode) if hardware is None else hyper_ac.load_config(hac_config(mode)).with_option("hardware", hardware)


def _priority(point: Point) -> int:
    """Measuring order, most telling first (a run cut short keeps those): stock, hyper_ac's modes,
    torchtitan's and HF's checkpointing, hyper_ac's budgets, PyTorch's budgets, then per-block hyper_ac."""
    order = [("stock", "whole compile"), ("hyper_ac", "full"), ("hyper_ac", "auto"), ("hyper_ac", "auto (measured)"),
             ("checkpoint_wrapper", None),
             ("sac", None), ("hf_ckpt", None), ("hyper_ac", "output_recompute"), ("hyper_ac_block", "full"),
             ("hyper_ac_block", "auto"), ("hyper_ac_block", "auto (measured)"), ("hyper_ac", None), ("torch_budget", None), ("stock", None),
             ("hyper_ac_block", None)]
    return next(i for i, (system, name) in enumerate(order) if point.system == system and name in (None, point.point))


# --------------------------------------------------------------------------
# measuring one point
# --------------------------------------------------------------------------


def measure_point(name: str, point: Point, opts: StepOptions, stock_peak: Optional[int],
                  reference: Optional[tuple]) -> tuple[dict, tuple]:
    """Compile the point afresh, one warm-up step (under its patch), one measured step
    (exact peak), then paired rounds with a freshly compiled stock model.
    Returns (row, (loss, grads))."""
    import torch
    import torch._dynamo
    import torch._functorch.config as functorch_config

    from hyper_ac import memory

    torch._dynamo.reset()
    row: dict = {"model": name, "system": point.system, "point": point.point, "status": "ok", "error": ""}
    model = build_model(name, opts.spec)
    batch = build_batch(name, opts.spec)
    _PLANNED.clear()
    with _quiet(), functorch_config.patch(enable_autograd_cache=False):
        fn = point.make(model, batch, stock_peak)

        def step() -> Any:
            out = fn(**batch)
            loss = _loss_of(out)
            loss.backward()
            del out
            return loss.detach()

        t0 = time.perf_counter()
        with point.patch():
            step()  # compiles (the backward too): the patch must be active here
        row["compile_seconds"] = time.perf_counter() - t0
        row.update(planned_columns(_PLANNED))
        _clear_grads(model)
        gc.collect()
        torch.manual_seed(_MEASURED_STEP_SEED)
        measured = memory.measure_step(lambda: fn(**batch))
        loss = measured.loss
        row["peak_bytes"] = measured.peak_bytes
        row["forward_bytes"] = measured.forward_bytes
        grads = _grads(model)
        if reference is not None:
            row["grads_allclose"] = bool(len(grads) == len(reference[1])
                                         and all(_close(a, b) for a, b in zip(grads, reference[1])))
            row["max_grad_diff"] = _max_diff(grads, reference[1])
        _clear_grads(model)
        if opts.paired_rounds > 0:
            row.update(_paired_with_stock(name, opts, model, step))
        _clear_grads(model)
    return row, (loss, grads)


def run_frontier(models: Sequence[str], opts: StepOptions, log: Callable[[str], None],
                 systems: Optional[Sequence[str]] = None,
                 on_model: Optional[Callable[[list], None]] = None,
                 point_names: Optional[Sequence[str]] = None, tier: Optional[str] = None) -> list[dict]:
    """Every point of every model; a failing point records its error and the run goes on;
    ``on_model(rows so far)`` after each point (so a run cut short keeps what it measured).
    ``tier``: the name of the tier (``benchmarks.common.TIERS``) the rows are marked with, for a
    page of several tiers.
    The first point (stock, whole compile) is the reference: its peak sizes hyper_ac's
    byte budgets, its gradients are the allclose reference; it is measured whatever ``systems``
    and ``point_names`` (point names as the table shows them) choose."""
    rows: list[dict] = []
    for name in models:
        every = points(name, build_model(name, opts.spec))
        unknown = sorted(set(point_names or ()) - {p.point for p in every})
        if unknown:
            raise ValueError(f"{name}: no frontier point named {', '.join(map(repr, unknown))}; the points are "
                             f"{', '.join(sorted({repr(p.point) for p in every}))}")
        chosen = [p for p in every if (p.system, p.point) == ("stock", "whole compile")
                  or ((p.system == "stock" or systems is None or p.system in systems)
                      and (point_names is None or p.point in point_names))]
        stock_peak, reference = None, None
        for i, point in enumerate(chosen):
            t0 = time.perf_counter()
            try:
                row, result = measure_point(name, point, opts, stock_peak, reference)
            except Exception as exc:  # record and move on
                row, result = {"model": name, "system": point.system, "point": point.point, "status": "error",
                               "error": _first_line(exc)}, None
                if os.environ.get("HYPER_AC_BENCH_TRACEBACK"):
                    traceback.print_exc()
            row["wall_seconds"] = time.perf_counter() - t0
            if tier is not None:
                row["tier"] = tier
            if i == 0 and result is not None:
                stock_peak, reference = row["peak_bytes"], result
                row["grads_allclose"], row["max_grad_diff"] = True, 0.0
            rows.append(row)
            log(f"  {name} {point.system} {point.point}: "
                + (f"peak {row['peak_bytes'] / 2**20:.2f} MiB, step ×{row.get('paired_step_ratio', float('nan')):.3f}, "
                   f"{row['wall_seconds']:.0f} s" if row["status"] == "ok" else row["error"]))
            if on_model is not None:
                on_model(rows)
    return rows
