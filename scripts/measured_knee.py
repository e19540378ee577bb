"""`auto` under `hardware: measured` against `auto` under the cpu roofline, both under Inductor.

Per model (benchmarks.common.ModelSpec: 4 layers, hidden 128, seq 128, batch 4
unless overridden): stock torch.compile, hyper_ac `auto` (cpu roofline) and
hyper_ac `auto` with `hardware: measured`, each compiled with Inductor. Each
row: the measured peak of one step (hyper_ac.memory.track, after warm-up), its
ratio to stock's, and the step time paired with stock (benchmarks.step.paired_times:
interleaved rounds, median of the per-round ratios); for hyper_ac also the plan's
chosen point (simulated peak, recompute seconds, and under measured the step's
base seconds). Short runs: the machine is shared.

Two compiles of the same plan can differ by a few percent in step time on this
machine (memory placement, not the plan), which more rounds on one compile do
not average out: ``--instances N`` compiles every strategy N times afresh, pairs
each instance with its own stock compile, and reports the median of the
instances' ratios with each instance's ratio beside it.

    python scripts/measured_knee.py --models llama gpt2 --rounds 10 --instances 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STRATEGIES = {
    "stock": None,
    "auto_cpu": {"ac_mode": "auto", "ac_compiler": "inductor"},
    "auto_measured": {"ac_mode": "auto", "ac_compiler": "inductor", "ac_hardware": "measured"},
}


def _step_fn(name: str, spec, config):
    import torch

    import hyper_ac
    from benchmarks.common import _loss_of, build_batch, build_model

    model = build_model(name, spec)
    batch = build_batch(name, spec)
    results: list = []
    torch._dynamo.reset()
    if config is None:
        compiled = torch.compile(model, fullgraph=True)
    else:
        compiled = torch.compile(model, fullgraph=True, backend=hyper_ac.backend(
            config, model=model, compiler="inductor", on_result=results.append))

    def step():
        for p in model.parameters():
            p.grad = None
        out = compiled(**batch)
        _loss_of(out).backward()
        del out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step()  # compiles (forward, then backward at its first call)
        step()
    return step, results


def main() -> None:
    import torch
    import torch._functorch.config as functorch_config

    from benchmarks.common import ModelSpec
    from benchmarks.step import paired_times
    from hyper_ac import memory
    from hyper_ac.frontend import op_times

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "gpt2"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--instances", type=int, default=1, help="fresh compiles per strategy (each paired with its own stock)")
    args = parser.parse_args()
    if args.instances < 1 or args.rounds < 1:
        parser.error("--instances and --rounds must be >= 1")
    torch.set_num_threads(args.threads)
    spec = ModelSpec()
    print(f"spec {spec}; threads {args.threads}; op time cache {op_times.cache_path()}")
    print("| model | strategy | peak MiB | peak / stock | step / stock (paired; median over instances) "
          "[each instance] | plan: simulated peak MiB, recompute s, step s |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        ratios: dict = {s: [] for s in STRATEGIES if s != "stock"}
        peaks, plans = {}, {}
        for instance in range(args.instances):
            with functorch_config.patch(enable_autograd_cache=False):
                steps = {s: _step_fn(name, spec, c) for s, c in STRATEGIES.items()}
            if instance == 0:
                for strategy, (step, results) in steps.items():
                    with memory.track() as tracked:
                        step()
                    peaks[strategy] = tracked.peak_bytes
                    plans[strategy] = results
            stock_step = steps["stock"][0]
            for strategy in ratios:
                stock, own = paired_times(stock_step, steps[strategy][0], args.rounds)
                ratios[strategy].append(statistics.median(o / s for o, s in zip(own, stock)))
                print(f"<!-- {name} {strategy} instance {instance}: stock step median {statistics.median(stock):.4f} s, "
                      f"ratio {ratios[strategy][-1]:.3f} -->", flush=True)
        for strategy in STRATEGIES:
            cell = "1.000"
            if strategy in ratios:
                each = ", ".join(f"{r:.3f}" for r in ratios[strategy])
                cell = f"{statistics.median(ratios[strategy]):.3f} [{each}]"
            plan = ""
            results = plans[strategy]
            if results:
                st = results[0].stats
                plan = (f"{st['simulated_peak_after'] / 2**20:.2f}, {st['recompute_seconds']:.3g}, "
                        f"{st.get('step_seconds', float('nan')):.3g}; route {results[0].plan.get('route', '?')}")
            print(f"| {name} | {strategy} | {peaks[strategy] / 2**20:.2f} | {peaks[strategy] / peaks['stock']:.3f} | "
                  f"{cell} | {plan} |", flush=True)
    print(f"op times: measured {op_times.STATS.measured}, cached {op_times.STATS.cached}, "
          f"skipped {op_times.STATS.skipped}")


if __name__ == "__main__":
    main()
