"""``hyper_ac.fit``: a byte budget met by the measured step, not only the simulated one.

``budget`` mode meets its byte target on the core's *simulated* peak, which
counts parameters and inputs and walks hyper_ac's own schedule; the compiled
step (Inductor's buffers, its schedule, PyTorch's partition of the tagged
graph) peaks elsewhere. :func:`fit` closes that gap by measurement, as
torchtitan's auto-tuning does: it compiles the model with ``budget`` at a byte
figure, measures one training step's exact peak (:func:`hyper_ac.memory.measure_step`),
corrects the figure by the measured/simulated ratio and repeats, a bounded
number of times. Every save/recompute choice stays the core's ``budget``
mode; this module only chooses the number it is handed (docs/config.md, "Fitting a
budget to the measured peak").
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Mapping, Optional

import torch

from hyper_ac.planning.config import Config, ConfigError, byte_size, load_config

__all__ = ["FitResult", "FitStep", "fit"]

# Two byte figures closer than this fraction of the target are the same try.
_SAME_BUDGET = 1e-3


@dataclasses.dataclass(frozen=True)
class FitStep:
    """One compiled and measured try. ``budget_bytes``: the figure handed to ``budget``
    mode (None for the ``full`` try); ``measured_peak``: the step's exact peak;
    ``simulated_peak``: the core's simulated peak of the rewritten step without
    resident values (parameters, inputs), the figure comparable with the measured one;
    ``simulated_peak_with_resident``: the one the byte budget is compared with;
    ``budget_met``: the core met ``budget_bytes`` on its simulation."""

    config: Config
    budget_bytes: Optional[int]
    measured_peak: int
    simulated_peak: Optional[int]
    simulated_peak_with_resident: Optional[int]
    budget_met: bool


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What :func:`fit` chose. ``config``: the core's canonical config, usable as-is with
    ``hyper_ac.backend(config, model=model, compiler=...)``; ``met``: the measured peak is
    at or below ``target``; ``iterations``: every try in order (target -> measured)."""

    config: Config
    target: int
    measured_peak: int
    simulated_peak: Optional[int]
    met: bool
    iterations: tuple

    def summary(self) -> str:
        tries = ", ".join(f"{'full' if s.budget_bytes is None else s.budget_bytes} -> {s.measured_peak}"
                          for s in self.iterations)
        return (f"hyper_ac.fit: target {self.target} B, measured {self.measured_peak} B "
                f"({self.measured_peak / self.target:.4f}x), {'met' if self.met else 'NOT met'}; tries: {tries}")


def _target_bytes(target: Any) -> int:
    """The target in bytes (``"6GiB"``, ``"512MB"``, ``1.5e9``; never a fraction: the measured peak is fitted in bytes)."""
    if isinstance(target, bool) or not isinstance(target, (int, float, str)):
        raise TypeError(f"hyper_ac.fit: target must be a byte count or a size string such as \"6GiB\", "
                        f"got {type(target).__name__}")
    return byte_size(target, "hyper_ac.fit: target")


def _call(fn: Any, batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return fn(**batch)
    if isinstance(batch, (tuple, list)):
        return fn(*batch)
    return fn(batch)


def _measure(model: torch.nn.Module, batch: Any, config: Config, compiler: str, seed: int) -> tuple:
    """Compile ``model`` under ``config`` afresh, run a warm-up step, then measure one
    step: (measured peak, the plan's stats)."""
    import torch._dynamo

    from hyper_ac import memory
    from hyper_ac.lower.backends import backend

    torch._dynamo.reset()  # a fresh compile: dynamo would reuse the previous try's graphs
    results: list = []
    step = torch.compile(model, fullgraph=True,
                         backend=backend(config, model=model, compiler=compiler, on_result=results.append))
    for _ in range(2):  # warm-up (compiles the forward and, at its first call, the backward), then measured
        for param in model.parameters():
            param.grad = None  # the measured step allocates its gradients, as every step after a zero_grad(None)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            measured = memory.measure_step(lambda: _call(step, batch))
    stats = results[-1].stats if results else {}
    return measured.peak_bytes, stats


def _try(model, batch, config: Config, compiler: str, budget: Optional[int], seed: int) -> FitStep:
    peak, stats = _measure(model, batch, config, compiler, seed)
    return FitStep(config, budget, peak, stats.get("simulated_activation_peak_after"),
                   stats.get("simulated_peak_after"), bool(stats.get("budget_met", True)))


def _next_budget(steps: list, target: int) -> Optional[int]:
    """The next byte figure: the last try's figure corrected by its measured/simulated ratio
    (``target x simulated / measured``, both with the resident bytes the budget counts), kept
    strictly between the largest figure that measured within the target and the smallest that
    did not (else their midpoint); None when that bracket is closed."""
    tried = [s for s in steps if s.budget_bytes is not None]
    last = tried[-1]
    resident = (last.simulated_peak_with_resident or 0) - (last.simulated_peak or 0)
    proposal = int(round(resident + target * (last.simulated_peak or last.measured_peak) / last.measured_peak))
    below = [s.budget_bytes for s in tried if s.measured_peak <= target]
    above = [s.budget_bytes for s in tried if s.measured_peak > target]
    lo = max(below) if below else None
    hi = min(above) if above else None
    gap = _SAME_BUDGET * target

    def inside(b: int) -> bool:
        return (lo is None or b > lo + gap) and (hi is None or b < hi - gap) and \
            all(abs(b - s.budget_bytes) > gap for s in tried)

    if inside(proposal):
        return proposal
    if lo is not None and hi is not None:
        mid = (lo + hi) // 2
        return mid if inside(mid) else None
    # One side only: step past the nearest try by the measured miss.
    step = max(abs(target - last.measured_peak), int(2 * gap) + 1)
    guess = (lo + step) if hi is None else (hi - step)
    return guess if guess > 0 and inside(guess) else None


def fit(model: torch.nn.Module, batch: Any, target: Any, *, compiler: str = "inductor", config: Any = None,
        max_iterations: int = 6, tolerance: float = 0.01, seed: int = 0) -> FitResult:
    """Fit ``budget`` mode to a **measured** peak: the config whose compiled training step peaks
    at or below ``target`` (bytes or a size string such as ``"6GiB"``) and within ``tolerance``
    (1%) of it.

    Each try compiles ``model`` with ``hyper_ac.backend(config, compiler=compiler)`` in
    ``budget`` mode at a byte figure (first ``target`` plus the parameters', buffers' and
    batch's bytes, which the simulated peak counts and the measured one does not), runs a warm-up step and
    measures one step's exact peak (``hyper_ac.memory.measure_step``: what the step allocates,
    its gradients included, not the parameters or the batch). The next figure is corrected by
    the measured/simulated ratio; at most ``max_iterations`` budget tries. A target below what
    budget plans reach also tries ``full`` and returns the least *measured* peak among the tries,
    with a warning naming that floor. ``batch``: keyword arguments (a mapping), positional ones
    (tuple/list) or one input; the model's output is its loss or carries ``.loss``.
    ``config``: the other settings (hardware, regions, ...; its mode and budget are replaced).
    ``seed``: every measured step draws the same random numbers (dropout).

    It resets dynamo's caches before each compile (``torch._dynamo.reset()``), leaves every
    ``.grad`` as it found it and changes no parameter. Cost: one compile and two steps per try.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"hyper_ac.fit: model must be a torch.nn.Module, got {type(model).__name__}")
    goal = _target_bytes(target)
    if not (isinstance(max_iterations, int) and max_iterations >= 1):
        raise ValueError(f"hyper_ac.fit: max_iterations must be a positive int, got {max_iterations!r}")
    if not (0 < tolerance < 1):
        raise ValueError(f"hyper_ac.fit: tolerance must be in (0, 1), got {tolerance!r}")
    try:
        base = load_config(config if config is not None else {"ac_mode": "budget", "ac_memory_budget": goal})
        base = base.with_compiler(compiler).with_options(mode="budget", memory_budget=float(goal))
    except ConfigError as error:
        raise ConfigError(f"hyper_ac.fit: {error}") from None
    if not base.facts["budget_bounds_step_peak"]:
        # unit_graph: its budget bounds the bytes each compiled block saves, not the step's peak that fit measures.
        raise ConfigError("hyper_ac.fit: config scope 'unit_graph' scores the bytes each compiled block saves, not "
                          "the step's peak that fit calibrates; fit the whole model (scope auto, units or "
                          "whole_graph), or give per-block compile a budget fraction (docs/config.md, scope)")
    grads = {param: param.grad for param in model.parameters()}
    try:
        steps = _search(model, batch, base, compiler, goal, max_iterations, tolerance, seed)
    finally:
        for param, grad in grads.items():
            param.grad = grad
    return _choose(steps, goal)


def _resident_bytes(model: torch.nn.Module, batch: Any) -> int:
    """Parameters, buffers and batch tensors: what the core's simulated peak counts and the
    measured step does not (it existed before the step). Only the first figure's offset."""
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else [batch]
    tensors = [*model.parameters(), *model.buffers(), *(v for v in values if isinstance(v, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


def _search(model, batch, base: Config, compiler: str, goal: int, max_iterations: int, tolerance: float,
            seed: int) -> list:
    steps: list = []
    budget: Optional[int] = goal + _resident_bytes(model, batch)
    while budget is not None and len(steps) < max_iterations:
        cfg = base.with_options(mode="budget", memory_budget=float(budget))
        steps.append(_try(model, batch, cfg, compiler, budget, seed))
        last = steps[-1]
        if (1 - tolerance) * goal <= last.measured_peak <= goal:
            return steps
        if not last.budget_met and last.measured_peak > goal:
            break  # below the simulated floor: a smaller figure gives the same plan
        budget = _next_budget(steps, goal)
    if not any(s.measured_peak <= goal for s in steps):
        steps.append(_try(model, batch, base.with_options(mode="full"), compiler, None, seed))
    return steps


def _choose(steps: list, goal: int) -> FitResult:
    within = [s for s in steps if s.measured_peak <= goal]
    if within:
        best = max(within, key=lambda s: s.measured_peak)  # the least recompute that fits: closest to the target
    else:
        best = min(steps, key=lambda s: s.measured_peak)
        what = "full" if best.budget_bytes is None else f"budget {best.budget_bytes} B"
        warnings.warn(f"hyper_ac.fit: target {goal} B is below the least measured peak of the plans tried "
                      f"({best.measured_peak} B, {what}): using that plan", stacklevel=3)
    return FitResult(best.config, goal, best.measured_peak, best.simulated_peak, bool(within), tuple(steps))
