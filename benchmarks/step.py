"""Part 1: one training step per (model, strategy), and the frontier of the captured graphs."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import time
import traceback
from typing import Any, Callable, Optional, Sequence

from benchmarks.common import EAGER, HAC_EAGER, HAC_STRATEGIES, hac_config, INDUCTOR, ModelSpec, reference_of, _first_line, _loss_of, _median, _progress, _quiet, _ratio, build_batch, build_model
from benchmarks.harness import _Probe, _make_step_fn, _storage_ptrs, joint_run_peak

# --------------------------------------------------------------------------
# part 1: one training step per (model, strategy)
# --------------------------------------------------------------------------


_MEASURED_STEP_SEED = 1234


@dataclasses.dataclass
class StepOptions:
    spec: ModelSpec
    timed_steps: int = 3
    runner: str = "boxed"  # how compiled strategies run their fw/bw modules: "boxed" or "plain" (see hyper_ac.lower.backends.boxed_fx_compiler)
    paired_rounds: int = 10  # inductor_* cells: rounds of interleaved stock/strategy steps (0: sequential ratio only)
    buffer_reuse: Optional[str] = None  # hyper_ac strategies: config key buffer_reuse (None: the config's default)


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (q in [0, 1]) of a non-empty sequence."""
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


def paired_summary(stock_seconds: Sequence[float], strategy_seconds: Sequence[float]) -> dict:
    """The paired step-time figures from interleaved rounds (one stock and one strategy step each).

    The ratio is taken per round (strategy / stock of the same round), so a
    slow spell of a shared machine that hits both steps of a round cancels;
    the reported ratio is the median of those per-round ratios, with its
    quartiles as the spread. Also the median of each side's times.
    """
    if len(stock_seconds) != len(strategy_seconds):
        raise ValueError(f"paired_summary: {len(stock_seconds)} stock times but {len(strategy_seconds)} strategy times")
    if not stock_seconds:
        return {}
    if any(t <= 0 for t in stock_seconds):
        raise ValueError("paired_summary: a stock step time is not positive")
    ratios = [b / a for a, b in zip(stock_seconds, strategy_seconds)]
    return {
        "paired_rounds": len(ratios),
        "paired_step_seconds": _median(strategy_seconds),
        "paired_stock_step_seconds": _median(stock_seconds),
        "paired_step_ratio": _median(ratios),
        "paired_step_ratio_q1": _quantile(ratios, 0.25),
        "paired_step_ratio_q3": _quantile(ratios, 0.75),
    }


def paired_times(stock_step: Callable[[], Any], step: Callable[[], Any], rounds: int) -> tuple[list, list]:
    """Time ``rounds`` interleaved rounds, one stock and one strategy step each, the
    order alternating (ABBA...) so neither side always runs on the other's warm cache."""
    stock, strat = [], []
    for i in range(rounds):
        pair = ((stock_step, stock), (step, strat))
        for fn, out in (pair if i % 2 == 0 else pair[::-1]):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return stock, strat


def _grads(model: Any) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _clear_grads(model: Any) -> None:
    for p in model.parameters():
        p.grad = None


def _equal(a: Any, b: Any) -> bool:
    import torch

    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b)


def _close(a: Any, b: Any) -> bool:
    import torch

    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _max_diff(xs: list, ys: list) -> float:
    worst = 0.0
    for a, b in zip(xs, ys):
        if a is None or b is None or a.shape != b.shape:
            if (a is None) != (b is None) or (a is not None and a.shape != b.shape):
                return math.inf
            continue
        worst = max(worst, float((a.double() - b.double()).abs().max()) if a.numel() else 0.0)
    return worst


def run_strategy(name: str, strategy: str, opts: StepOptions) -> tuple[dict, Optional[tuple]]:
    """One (model, strategy) cell: returns (row, (loss, grads, probe, model))."""
    import torch
    import torch._dynamo
    import torch._functorch.config as functorch_config

    from hyper_ac import memory

    torch._dynamo.reset()
    row: dict = {"model": name, "strategy": strategy, "status": "ok", "error": ""}
    model = build_model(name, opts.spec)
    batch = build_batch(name, opts.spec)
    probe = _Probe()
    probe.exclude = _storage_ptrs([*model.parameters(), *model.buffers(), *batch.values()])
    with _quiet(), functorch_config.patch(enable_autograd_cache=False):
        fn = _make_step_fn(strategy, model, probe, opts.runner, opts.buffer_reuse)

        def step() -> Any:
            out = fn(**batch)  # held until backward() returns, as a loop that keeps `outputs` does
            loss = _loss_of(out)
            loss.backward()
            del out
            return loss.detach()

        # warm-up / compile step: compile-time allocations never reach the measured step
        t0 = time.perf_counter()
        step()
        row["compile_seconds"] = time.perf_counter() - t0
        _clear_grads(model)
        gc.collect()

        # measured step: peak memory and what the forward keeps for the backward
        hooks = (torch.autograd.graph.saved_tensors_hooks(lambda t: (probe.record([t]), t)[1], lambda t: t)
                 if strategy in EAGER else contextlib.nullcontext())
        probe.saved.clear()

        def forward() -> Any:
            probe.recording = True
            with hooks:
                out = fn(**batch)
            probe.recording = False
            return out

        # Every strategy's measured step draws the same random numbers (models with dropout).
        torch.manual_seed(_MEASURED_STEP_SEED)
        if memory.is_available():
            # The model's outputs (logits) stay alive through the backward, as the
            # joint graph returns them and the core's simulator assumes (hyper_ac.memory.measure_step).
            measured = memory.measure_step(forward)
            loss, row["peak_bytes"], row["fwd_retained_bytes"] = measured.loss, measured.peak_bytes, measured.forward_bytes
        else:
            out = forward()
            loss = _loss_of(out)
            loss.backward()
            del out
            loss = loss.detach()
            row["peak_bytes"] = row["fwd_retained_bytes"] = None
        grads = _grads(model)
        row["saved_bytes"] = probe.saved_bytes
        row["saved_tensors"] = len(probe.saved)

        # step time: median of timed steps
        times = []
        for _ in range(opts.timed_steps):
            _clear_grads(model)
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        row["step_seconds"] = _median(times)
        row["step_seconds_min"] = min(times) if times else None

        # inductor_*: step time against stock torch.compile, interleaved step by step
        if strategy in INDUCTOR and strategy != "inductor" and opts.paired_rounds > 0:
            row.update(_paired_with_stock(name, opts, model, step))

        # FLOPs
        if probe.partitions == 0 and strategy not in EAGER:
            pass  # not instrumented (Inductor, the checkpointed-model rows): no graph FLOPs
        elif strategy in EAGER:
            from torch.utils.flop_counter import FlopCounterMode

            _clear_grads(model)
            counter = FlopCounterMode(display=False)
            with counter:
                step()
            row["step_flops"] = float(counter.get_total_flops())
        else:
            row["step_flops"] = probe.fw_flops + probe.bw_flops
            row["saved_values_graph"] = probe.saved_values_graph
            row["saved_bytes_graph"] = probe.saved_bytes_graph
            row["joint_nodes"] = probe.joint_nodes
            row["resident_bytes"] = probe.resident_bytes
            row["plan_seconds"] = probe.plan_seconds
        _clear_grads(model)

    if strategy == "none" or strategy in HAC_EAGER:
        try:
            with _quiet():
                row["joint_run_peak_bytes"] = joint_run_peak(probe)
        except Exception as exc:  # a diagnostic column: never fail the cell for it
            row["joint_run_error"] = _first_line(exc)
    probe.joint_graph = None
    if strategy in HAC_STRATEGIES and HAC_STRATEGIES[strategy][0] != "off":
        if not probe.results:
            raise RuntimeError("hyper_ac backend reported no plan")
        result = probe.results[-1]
        stats = dict(result.stats)
        row["serialize_seconds"] = result.serialize_seconds
        row["core_seconds"] = result.plan_seconds
        row["apply_seconds"] = result.apply_seconds
        for key in ("recompute_flops", "recompute_seconds", "saved_bytes_before", "saved_bytes_after",
                    "nodes_duplicated", "simulated_peak_before", "simulated_peak_after",
                    "simulated_activation_peak_before", "simulated_activation_peak_after", "lambda",
                    "budget_bytes", "budget_met"):
            if key in stats:
                row[f"hac_{key}"] = stats[key]
        warnings_ = [d["message"] for d in result.diagnostics if d.get("level") == "warning"]
        if warnings_:
            row["hac_warnings"] = " | ".join(warnings_)[:300]
    return row, (loss, grads, probe, model)


def _paired_with_stock(name: str, opts: StepOptions, model: Any, step: Callable[[], Any]) -> dict:
    """Stock ``torch.compile`` of a fresh copy of the model beside the strategy's step,
    warmed up, then :func:`paired_times` over ``opts.paired_rounds`` rounds."""
    import torch

    stock_model = build_model(name, opts.spec)
    stock_batch = build_batch(name, opts.spec)
    stock_fn = torch.compile(stock_model, fullgraph=True)

    def stock_step() -> None:
        _clear_grads(stock_model)
        out = stock_fn(**stock_batch)
        _loss_of(out).backward()
        del out

    def strategy_step() -> None:
        _clear_grads(model)
        step()

    for _ in range(2):  # compile, then one step each with warm caches
        stock_step()
        strategy_step()
    stock, strat = paired_times(stock_step, strategy_step, opts.paired_rounds)
    _clear_grads(model)
    return paired_summary(stock, strat)


def run_step_benchmark(models: Sequence[str], strategies: Sequence[str], opts: StepOptions,
                       log: Callable[[str], None]) -> tuple[list[dict], dict]:
    """Every (model, strategy) cell; a failing cell records its error and the run goes on."""
    rows: list[dict] = []
    extras: dict = {"joint": {}}
    cells = [(m, s) for m in models for s in strategies]
    refs: dict = {}
    for name, strategy in _progress(cells, desc="step", unit="cell"):
        t0 = time.perf_counter()
        try:
            row, (loss, grads, probe, model) = run_strategy(name, strategy, opts)
        except Exception as exc:  # record and move on
            row = {"model": name, "strategy": strategy, "status": "error", "error": _first_line(exc)}
            log(f"  {name}/{strategy}: {row['error']}")
            if os.environ.get("HYPER_AC_BENCH_TRACEBACK"):
                traceback.print_exc()
            rows.append(row)
            continue
        row["wall_seconds"] = time.perf_counter() - t0
        family = reference_of(strategy)
        if strategy == family:
            refs[(name, family)] = (loss, grads)
            if strategy == "none" and probe.joint is not None:
                extras["joint"][name] = (probe.joint, model)
        ref = refs.get((name, family))
        row["reference"] = family
        if ref is not None:
            row["loss_equal"] = bool(_equal(loss, ref[0]))
            row["grads_equal"] = bool(len(grads) == len(ref[1]) and all(_equal(a, b) for a, b in zip(grads, ref[1])))
            row["max_grad_diff"] = _max_diff(grads, ref[1])
            row["grads_allclose"] = bool(len(grads) == len(ref[1]) and all(_close(a, b) for a, b in zip(grads, ref[1])))
        rows.append(row)
    _add_ratios(rows)
    return rows, extras


def _add_ratios(rows: list[dict]) -> None:
    by_key = {(r["model"], r["strategy"]): r for r in rows if r.get("status") == "ok"}
    for r in rows:
        if r.get("status") != "ok":
            continue
        base = by_key.get((r["model"], "none"))
        inductor = by_key.get((r["model"], "inductor"))
        if inductor is not None and r["strategy"] in INDUCTOR:
            for key in ("peak_bytes", "step_seconds"):
                r[f"{key}_vs_inductor"] = _ratio(r.get(key), inductor.get(key))
        if r["strategy"] in INDUCTOR:
            # The paired figure (interleaved rounds) when it ran, else the ratio of two sequential medians.
            if r.get("paired_step_ratio") is not None:
                r["step_ratio_vs_inductor"], r["step_ratio_method"] = r["paired_step_ratio"], "paired"
            elif r["strategy"] == "inductor":
                r["step_ratio_vs_inductor"], r["step_ratio_method"] = 1.0, "reference"
            elif r.get("step_seconds_vs_inductor") is not None:
                r["step_ratio_vs_inductor"], r["step_ratio_method"] = r["step_seconds_vs_inductor"], "sequential"
        ckpt = by_key.get((r["model"], "ckpt_aot_eager"))
        if ckpt is not None and r["strategy"].startswith("ckpt_"):
            for key in ("peak_bytes", "step_seconds"):
                r[f"{key}_vs_ckpt_aot_eager"] = _ratio(r.get(key), ckpt.get(key))
        eager = by_key.get((r["model"], "eager"))
        mincut = by_key.get((r["model"], "torch_mincut"))
        family_base = eager if r["strategy"] in EAGER else base
        if family_base is not None and "step_flops" in r:
            extra = r.get("step_flops", 0) - family_base.get("step_flops", 0)
            r["recompute_flops"] = max(0.0, extra)
        for key in ("peak_bytes", "saved_bytes", "step_seconds"):
            if base is not None:
                r[f"{key}_vs_none"] = _ratio(r.get(key), base.get(key))
            if mincut is not None:
                r[f"{key}_vs_mincut"] = _ratio(r.get(key), mincut.get(key))
        if mincut is not None and r.get("plan_seconds") is not None:
            r["plan_seconds_vs_mincut"] = _ratio(r.get("plan_seconds"), mincut.get("plan_seconds"))
        if mincut is not None and r.get("recompute_flops") is not None:
            r["recompute_flops_vs_mincut"] = _ratio(r["recompute_flops"], mincut.get("recompute_flops"))
        # memory truth: simulated activation peak (core) vs measured peak (track())
        if r["strategy"] in HAC_EAGER:
            sim_act = r.get("hac_simulated_activation_peak_after")
            sim = r.get("hac_simulated_peak_after")
        elif r["strategy"] == "none":
            donor = next((x for x in rows if x["model"] == r["model"] and x.get("hac_simulated_peak_before") is not None),
                         {})
            sim_act = donor.get("hac_simulated_activation_peak_before")
            sim = donor.get("hac_simulated_peak_before")
        else:
            sim_act = sim = None
        if sim_act is None and sim is not None and r.get("resident_bytes") is not None:
            sim_act = sim - r["resident_bytes"]  # plan stats without the activation-only figure
        if sim_act is not None and r.get("peak_bytes"):
            r["simulated_activation_peak"] = sim_act
            r["simulated_vs_measured_pct"] = 100.0 * (sim_act - r["peak_bytes"]) / r["peak_bytes"]
        if sim_act is not None and r.get("joint_run_peak_bytes"):
            r["simulated_vs_joint_run_pct"] = 100.0 * (sim_act - r["joint_run_peak_bytes"]) / r["joint_run_peak_bytes"]


UNIT_TIMELINE_STRATEGIES = ("full", "output_recompute")


def run_frontier_points(extras: dict, log: Callable[[str], None]) -> dict:
    """hyper_ac.frontier on each model's joint graph (snapshot taken by the `none` run),
    and the per-unit timeline of ``full`` and ``output_recompute`` on it."""
    import hyper_ac
    from hyper_ac.frontend.annotate import annotate_joint

    out: dict = {}
    for name, ((joint, num_fwd_outputs), model) in extras.get("joint", {}).items():
        try:
            with _quiet():
                annotate_joint(joint, num_fwd_outputs, model=model)
                t0 = time.perf_counter()
                points = hyper_ac.frontier(joint, {"ac_mode": "auto"}, model=model)
                seconds = time.perf_counter() - t0
                # Per-unit backward peaks (simulated) of the replay schedule, before vs after.
                timelines = {strategy: hyper_ac.plan(joint, hac_config(strategy), model=model,
                                                     timeline=True).plan["timeline"]["units"]
                             for strategy in UNIT_TIMELINE_STRATEGIES}
            out[name] = {"points": list(points), "seconds": seconds, "unit_timelines": timelines}
        except Exception as exc:
            out[name] = {"error": _first_line(exc)}
            log(f"  frontier {name}: {out[name]['error']}")
    return out


