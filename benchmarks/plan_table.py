"""Per model and mode: nodes duplicated and saved-activation bytes before -> after.

    python -m benchmarks.plan_table [--batch 4] [--seq 32]

Captures each built-in model's joint graph once and asks the core for a plan in
every mode (no training step; see `python -m benchmarks` for measurements).
"""

from __future__ import annotations

import argparse
import time
import warnings

import hyper_ac
from hyper_ac import models
from hyper_ac.frontend.capture import capture_joint
from hyper_ac.planning.config import mode_config

MODES = ("full", "selective", "auto", "budget")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama", "mixtral", "bert", "transformer"])
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print("| model | nodes | capture s | serialize s | mode | duplicated | saved before -> after | "
          "simulated peak before -> after | plan ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = models.build(name)
        t0 = time.perf_counter()
        captured = capture_joint(model, **models.example_batch(name, batch=args.batch, seq=args.seq))
        t1 = time.perf_counter()
        graph_json = captured.to_json()
        t2 = time.perf_counter()
        for mode in MODES:
            result = hyper_ac.plan(graph_json, mode_config(mode), model)
            stats = result.plan["stats"]
            met = "" if stats["budget_met"] else " (budget not met)"
            print(f"| {name} | {captured.num_nodes} | {t1 - t0:.2f} | {t2 - t1:.3f} | {mode} | "
                  f"{stats['nodes_duplicated']} | {stats['saved_bytes_before'] / 1024:.0f} KiB -> "
                  f"{stats['saved_bytes_after'] / 1024:.0f} KiB | {stats['simulated_peak_before'] / 1024:.0f} -> "
                  f"{stats['simulated_peak_after'] / 1024:.0f} KiB{met} | {result.plan_seconds * 1e3:.1f} |")


if __name__ == "__main__":
    main()
