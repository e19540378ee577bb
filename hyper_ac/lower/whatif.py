"""Plans for a model that does not fit this machine: every mode, from the model's config alone.

``python -m hyper_ac plan --hf-config config.json --seq 8192 ...`` and
:func:`plan_from_config`: the joint graph is captured on fake tensors
(:func:`hyper_ac.frontend.fake.capture_from_config`), then the core plans it
once per mode with the same config otherwise. Each row is the core's own
account of its plan: the simulated peak of the step (parameters, gradients,
inputs and activations; not the optimizer's state), the bytes saved for the
backward, and the estimated recompute time on the configured hardware
profile. ``budget`` at the device's memory is the core's answer to "what fits
with the least recompute". Nothing is run. What the simulation cannot see is
in docs/fake-planning.md.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Optional, Sequence

from hyper_ac.planning.config import Config, byte_size, load_config

__all__ = ["ModeRow", "WhatIf", "plan_from_config", "MODES"]

#: The modes planned, in the table's order.
MODES = ("off", "selective", "auto", "full")


@dataclasses.dataclass(frozen=True)
class ModeRow:
    """One mode's plan: its config (the ``activation_checkpoint`` section) and the core's figures for it."""

    mode: str
    section: Mapping[str, Any]
    simulated_peak_bytes: int
    saved_bytes: int
    recompute_seconds: float
    nodes_duplicated: int
    budget_met: Optional[bool] = None  # budget rows only


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """Every mode's plan for one model, batch and hardware profile; ``fit`` the budget row at the device's memory."""

    model_type: str
    layers: Optional[int]
    hidden: Optional[int]
    seq: int
    batch: int
    dtype: str
    nodes: int
    parameter_bytes: int
    capture_seconds: float
    plan_seconds: float
    hardware: Any
    compiler: str
    rows: list
    device_memory_bytes: Optional[int] = None
    reserve_bytes: int = 0
    fit: Optional[ModeRow] = None

    @property
    def fits(self) -> bool:
        """Whether some plan's simulated peak fits the device's memory less the reserve."""
        return self.fit is not None and bool(self.fit.budget_met)


def _row(mode: str, cfg: Config, stats: Mapping[str, Any], before: bool = False) -> ModeRow:
    tense = "before" if before else "after"
    return ModeRow(
        mode=mode,
        section=dict(cfg.data["activation_checkpoint"]) if not before else {"mode": "off"},
        simulated_peak_bytes=int(stats[f"simulated_peak_{tense}"]),
        saved_bytes=int(stats[f"saved_bytes_{tense}"]),
        recompute_seconds=0.0 if before else float(stats.get("recompute_seconds", 0.0)),
        nodes_duplicated=0 if before else int(stats.get("nodes_duplicated", 0)),
        budget_met=bool(stats["budget_met"]) if not before and cfg.mode == "budget" else None,
    )


def plan_from_config(hf_config: Any, *, seq: int, batch: int = 1, dtype: str = "bf16",
                     config: Any = None, hardware: Any = None, compiler: Optional[str] = None,
                     device_memory: Any = None, reserve: Any = 0,
                     modes: Sequence[str] = MODES) -> WhatIf:
    """Plan one training step of the model ``hf_config`` describes in every mode of ``modes``.

    ``hf_config``: a ``config.json`` path, its dict or a ``transformers`` config.
    ``config``: the base hyper_ac config (preset name, YAML path, dict; its
    layers, regions and op policy are kept; default: ``full``'s preset);
    ``hardware`` / ``compiler``: override its ``hardware`` and ``compiler``
    (``measured`` is refused: nothing runs here to time). ``device_memory``:
    bytes or a size string (``"80GiB"``); with it, a ``budget`` row at
    ``device_memory − reserve`` is planned and returned as ``fit``.
    """
    from hyper_ac.frontend.fake import capture_from_config
    from hyper_ac.planning.passes import plan

    base = load_config(config if config is not None else "full")
    if hardware is not None:
        base = base.with_option("hardware", hardware)
    if compiler is not None:
        base = base.with_option("compiler", compiler)
    profile = base.data["activation_checkpoint"].get("hardware", "cpu")
    if profile == "measured" or isinstance(profile, Mapping) and profile.get("name") == "measured":
        raise ValueError("hardware: measured times each op on this machine's tensors; a model planned from its "
                         "config has none. Name a profile (cpu, a100, h100, h200) or {peak_flops, memory_bandwidth}")
    limit = None
    if device_memory is not None:
        limit = byte_size(device_memory, "device_memory")
    reserve_bytes = byte_size(reserve, "reserve", allow_zero=True) if reserve else 0
    if limit is not None and reserve_bytes >= limit:
        raise ValueError(f"reserve {reserve_bytes} B leaves nothing of the device memory {limit} B to plan in")

    captured = capture_from_config(hf_config, seq=seq, batch=batch, dtype=dtype)
    graph_json = captured.to_json()

    def planned(**keys: Any) -> Config:
        return base.with_options(**keys, peak_oracle="off")  # nothing is run: no oracle

    rows: list[ModeRow] = []
    t0 = time.perf_counter()
    stats_full = None
    for mode in modes:
        if mode == "off":
            continue
        cfg = planned(mode=mode)
        stats = plan(graph_json, cfg).stats
        if mode == "full":
            stats_full = stats
        rows.append(_row(mode, cfg, stats))
    if "off" in modes:  # off plans nothing: its figures are any plan's "before" (everything saved)
        stats_off = stats_full if stats_full is not None else plan(graph_json, planned(mode="full")).stats
        rows.insert(0, _row("off", base, stats_off, before=True))
    fit = None
    if limit is not None:
        cfg = planned(mode="budget", memory_budget=float(limit - reserve_bytes))
        fit = _row("budget", cfg, plan(graph_json, cfg).stats)
        rows.append(fit)
    plan_seconds = time.perf_counter() - t0
    model = captured.model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    hf = model.config
    return WhatIf(
        model_type=hf.model_type, layers=getattr(hf, "num_hidden_layers", None),
        hidden=getattr(hf, "hidden_size", None), seq=seq, batch=batch, dtype=dtype,
        nodes=len(captured.graph_module.graph.nodes), parameter_bytes=params,
        capture_seconds=captured.capture_seconds, plan_seconds=plan_seconds,
        hardware=base.data["activation_checkpoint"].get("hardware", "cpu"), compiler=base.compiler,
        rows=rows, device_memory_bytes=limit, reserve_bytes=reserve_bytes, fit=fit)
