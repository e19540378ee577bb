"""Shared pieces of the benchmark: strategy names, model sizes, small helpers, FX FLOPs, scaling options and the C++ CLI's stage timings."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence


STRATEGIES = (
    "none",          # aot_autograd + default_partition: save everything the backward reads
    "torch_mincut",  # aot_autograd + min_cut_rematerialization_partition (defaults)
    "torch_budget",  # the same with torch._functorch.config.activation_memory_budget = budget_fraction()
    "eager",         # plain eager step (reference for the eager checkpoint)
    "eager_ckpt",    # eager torch.utils.checkpoint(use_reentrant=False) per layer
    "full",          # hyper_ac modes through torch.compile(backend=hyper_ac.backend(...))
    "selective",
    "auto",
    "budget",
    "output_recompute",    # full with regions.output_recompute: adjacent units share one saved boundary
    "inductor",            # stock torch.compile (Inductor, its own min-cut partitioner)
    "inductor_off",        # hyper_ac.backend(config with compiler: inductor, compiler="inductor"), each mode
    "inductor_full",
    "inductor_selective",
    "inductor_auto",
    "inductor_budget",
    "ckpt_aot_eager",      # the model's own per-layer torch.utils.checkpoint(use_reentrant=False), stock aot_eager
    "ckpt_off",            # the same model under hyper_ac.backend (eager compiler), off / auto
    "ckpt_auto",
)
HAC_MODES = ("full", "selective", "auto", "budget")
# hyper_ac through the eager compiler (FX code): the rows with plan figures and memory truth.
HAC_EAGER = (*HAC_MODES, "output_recompute")
INDUCTOR = ("inductor", "inductor_off", "inductor_full", "inductor_selective", "inductor_auto", "inductor_budget")
CKPT = ("ckpt_aot_eager", "ckpt_off", "ckpt_auto")
# Every strategy that runs hyper_ac.backend: strategy -> (mode, compiler, model checkpoints its layers).
HAC_STRATEGIES = {
    **{m: (m, "eager", False) for m in HAC_MODES},
    "output_recompute": ("output_recompute", "eager", False),
    **{f"inductor_{m}": (m, "inductor", False) for m in ("off", *HAC_MODES)},
    "ckpt_off": ("off", "eager", True),
    "ckpt_auto": ("auto", "eager", True),
}


def reference_of(strategy: str) -> str:
    """The strategy whose loss and gradients a strategy is compared with."""
    if strategy in EAGER:
        return "eager"
    if strategy in INDUCTOR:
        return "inductor"  # fusion changes rounding: compared with allclose
    return "none"
TORCH_AOT = ("none", "torch_mincut", "torch_budget")
EAGER = ("eager", "eager_ckpt")
DEFAULT_MODELS = ("transformer", "gpt2", "llama", "mixtral", "bert")
QUICK_MODELS = ("transformer",)
QUICK_STRATEGIES = ("none", "torch_mincut", "eager", "eager_ckpt", "full", "selective", "auto")
MEMORY_TRUTH_MODELS = ("transformer", "gpt2", "llama")

MiB = 2.0**20


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def _progress(iterable: Iterable, **kwargs: Any) -> Iterable:
    """tqdm when installed (progress on stderr), the plain iterable otherwise."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is optional
        return iterable
    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, **kwargs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, value = math.inf, None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def _ratio(a: Any, b: Any) -> Optional[float]:
    try:
        if a is None or b is None or b == 0 or (isinstance(a, float) and math.isnan(a)):
            return None
        return float(a) / float(b)
    except (TypeError, ValueError):
        return None


def _quiet() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    seq: int = 128
    batch: int = 4
    dropout: float = 0.0  # every dropout of the model (HF's default is 0.1); replayed under rng: replay


@dataclasses.dataclass(frozen=True)
class Tier:
    """One shape of the frontier part and the models measured at it (``--tiers``)."""
    spec: ModelSpec
    models: tuple


#: The frontier's tiers: the bench models at the default shape, where logits, parameters and
#: gradients set much of the peak, and the realistic tier (issue 37), where activations do.
TIERS = {
    "bench": Tier(ModelSpec(), ("llama", "gpt2", "mixtral", "bert", "transformer")),
    "realistic": Tier(ModelSpec(layers=8, hidden=512, seq=512, batch=2), ("llama", "gpt2", "mixtral")),
}


def build_model(name: str, spec: ModelSpec):
    from hyper_ac import models

    if name == "transformer":
        return models.build("transformer", spec.layers, dim=spec.hidden, heads=spec.heads, max_seq=spec.seq,
                            dropout=spec.dropout)
    return models.build(name, spec.layers, hidden=spec.hidden, heads=spec.heads, max_seq=spec.seq,
                        dropout=spec.dropout)


def build_batch(name: str, spec: ModelSpec) -> dict:
    from hyper_ac import models

    return models.example_batch(name, batch=spec.batch, seq=spec.seq)


def _loss_of(out: Any):
    """The loss of a model's output (hyper_ac.memory.loss_of, the one owner)."""
    from hyper_ac.memory import loss_of

    return loss_of(out)


# --------------------------------------------------------------------------
# FLOPs of FX graphs (torch.utils.flop_counter's registry, as the serialiser)
# --------------------------------------------------------------------------


def graph_flops(gm) -> float:
    """Sum of flop_counter-registry FLOPs over the call_function nodes of ``gm``."""
    import torch

    from hyper_ac.frontend import op_facts, serialize, values

    total = 0.0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        facts = op_facts.op_facts(node.target)
        if facts.flop_formula is not None:
            total += values._flops(node, facts, serialize.UNBACKED_FALLBACK)
    return total


def _val_bytes(val: Any) -> int:
    import torch

    if isinstance(val, torch.Tensor):
        return val.numel() * val.element_size()
    if isinstance(val, (list, tuple)):
        return sum(_val_bytes(v) for v in val)
    return 0


def _int_bytes(val: Any) -> int:
    try:
        return int(_val_bytes(val))
    except Exception:  # symbolic sizes: not needed for the figures here
        return 0




# --------------------------------------------------------------------------
# scaling options and the C++ CLI's stage timings (read by scaling and flow)
# --------------------------------------------------------------------------


@dataclasses.dataclass
class ScalingOptions:
    captured_layers: Sequence[int] = (4, 16, 64)
    synthetic_layers: Sequence[int] = (288, 576)
    template_layers: int = 3
    validate_layers: int = 16
    dim: int = 64
    seq: int = 32
    torch_limit_seconds: float = 240.0  # skip PyTorch's partitioner beyond the first size slower than this
    core_nodes: int = 1_000_000
    core_repeat: int = 2  # best of n for the parse and each plan at ~1M nodes
    core_modes: Sequence[str] = ("auto",)
    flow_layers: Sequence[int] = (64, 288, 576)
    networkx_limit_seconds: float = 120.0
    repeat: int = 1
    best_of_small: int = 3  # best of n below 20k nodes
    # GraphModule code generation while timing both sides: "lazy" (deferred, as inside torch.compile),
    # "eager" (at construction); one row per graph and mode (benchmarks.scaling.CODEGEN_MODES)
    codegen: Sequence[str] = ("lazy",)



_TIMINGS_RE = re.compile(
    r"timings: load (?P<load>\S+) s, scope (?P<scope>\S+) s, tag (?P<tag>\S+) s, min-cut (?P<mincut>\S+) s, "
    r"remat (?P<remat>\S+) s, simulate (?P<simulate>\S+) s, plan total (?P<total>\S+) s")


def plan_cli() -> Optional[str]:
    """The core's command-line planner (``hyper-ac-plan``), if built: it reports per-stage wall times."""
    import shutil

    candidates = [os.environ.get("HYPER_AC_PLAN_CLI"),
                  str(Path(__file__).resolve().parent.parent / "build" / "py" / "hyper-ac-plan"),
                  shutil.which("hyper-ac-plan")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def cli_timings(text: str, mode: str, repeat: int = 1) -> Optional[dict]:
    """Stage timings of ``hyper-ac-plan GRAPH --config ... --timings`` (best of ``repeat`` per stage).

    Keys: load (JSON read + parse + validate), scope, tag, mincut, remat,
    simulate, total (the plan after the load). None when the CLI is not
    built or prints no timings line.
    """
    import subprocess
    import tempfile

    from hyper_ac.planning.config import load_config, op_policy_json

    cli = plan_cli()
    if cli is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        graph, cfg, table = (os.path.join(tmp, n) for n in ("graph.json", "config.json", "op_policy.json"))
        with open(graph, "w") as f:
            f.write(text)
        with open(cfg, "w") as f:
            f.write(load_config(hac_config(mode)).json_for(None))
        with open(table, "w") as f:
            f.write(op_policy_json())
        best: Optional[dict] = None
        for _ in range(max(1, repeat)):
            run = subprocess.run([cli, graph, "--config", cfg, "--op-policy", table, "--timings"],
                                 capture_output=True, text=True)
            m = _TIMINGS_RE.search(run.stderr + run.stdout)
            if run.returncode != 0 or m is None:
                return None
            got = {k: float(v) for k, v in m.groupdict().items()}
            best = got if best is None else {k: min(best[k], got[k]) for k in got}
    return best


def _solve_seconds(plan: dict) -> Optional[float]:
    """The core's own max-flow time, if a plan reports it (not in plan format v1 yet)."""
    for where in (plan.get("stats", {}), plan.get("timings", {}) or {}):
        for key in ("mincut_seconds", "solve_seconds", "max_flow_seconds"):
            if isinstance(where.get(key), (int, float)):
                return float(where[key])
    return None




def hac_config(mode: str) -> dict:
    """The config of one hyper_ac mode (the budget from the ``budget`` preset)."""
    from hyper_ac.planning.config import mode_config

    if mode == "output_recompute":
        return {"activation_checkpoint": {"mode": "full", "regions": {"output_recompute": True}}}
    return mode_config(mode)


def hac_strategy_config(strategy: str, buffer_reuse: Optional[str] = None) -> Any:
    """The validated config of a hyper_ac strategy, with its compiler set (and
    ``buffer_reuse``, the config key, when given)."""
    from hyper_ac.planning.config import load_config

    mode, compiler, _ = HAC_STRATEGIES[strategy]
    config = load_config(hac_config(mode)).with_compiler(compiler)
    if buffer_reuse is None:
        return config
    section = {**config.data["activation_checkpoint"], "buffer_reuse": buffer_reuse}  # the canonical form is nested
    return load_config({**config.data, "activation_checkpoint": section})


def budget_fraction() -> float:
    """The activation-memory fraction of ``budget`` (hyper_ac) and ``torch_budget`` (PyTorch)."""
    return float(hac_config("budget")["ac_memory_budget"])


def best_plan(graph: Any, mode: str, repeat: int) -> tuple[float, dict]:
    """``hyper_ac.plan`` on a graph (JSON text or annotated GraphModule), best of
    ``repeat``: (seconds in the core's plan call, the plan)."""
    import hyper_ac

    best = None
    for _ in range(max(1, repeat)):
        result = hyper_ac.plan(graph, hac_config(mode))
        if best is None or result.plan_seconds < best.plan_seconds:
            best = result
    return best.plan_seconds, best.plan


