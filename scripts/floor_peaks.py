"""The floor under Inductor (issue 24, docs/floor.md): stock ``torch.compile`` against per-layer
``checkpoint_wrapper`` (non-reentrant) + whole-model Inductor and hyper_ac ``full`` + Inductor.

    python scripts/floor_peaks.py [transformer,gpt2,llama,mixtral,bert] [stock,wrapper,full]

Bench sizes (benchmarks.common.ModelSpec: 4 layers, hidden 128, seq 128, batch 4, fp32). Per model
and system: the measured step's peak (``hyper_ac.memory.track()`` after a warm-up step, parameters
and inputs excluded, gradients included, as benchmarks/step.py measures it), its ratio to stock's,
and what the step holds when the forward ends. The step is ``benchmarks.frontier.floor_step``,
which tests/python/test_full_floor.py measures too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a package at the root

import torch

from benchmarks.frontier import FLOOR_POINTS, floor_step


def main() -> None:
    torch.set_num_threads(1)
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["transformer", "gpt2", "llama", "mixtral", "bert"]
    systems = sys.argv[2].split(",") if len(sys.argv) > 2 else list(FLOOR_POINTS)
    MiB = 2.0**20
    for name in names:
        stock = None
        for system in systems:
            peak, forward_end, _ = floor_step(name, system)
            stock = peak if system == "stock" else stock
            ratio = f"{peak / stock:6.3f}x stock" if stock else ""
            print(f"{name:12s} {system:8s} peak {peak:>10d} B {peak / MiB:8.3f} MiB {ratio}  "
                  f"forward end {forward_end / MiB:7.3f} MiB", flush=True)


if __name__ == "__main__":
    main()
