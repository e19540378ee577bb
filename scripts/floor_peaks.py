"""The floor under Inductor (issue 24, docs/floor.md): stock ``torch.compile`` against per-layer
``checkpoint_wrapper`` (non-reentrant) + whole-model Inductor and hyper_ac ``full`` + Inductor.

    python scripts/floor_peaks.py [transformer,gpt2,llama,mixtral,bert] [stock,wrapper,full]

Bench sizes (benchmarks.common.ModelSpec: 4 layers, hidden 128, seq 128, batch 4, fp32). Per model
and system: the measured step's peak (``hyper_ac.memory.track()`` after a warm-up step, parameters
and inputs excluded, gradients included, as benchmarks/step.py measures it), its ratio to stock's,
and what the step holds when the forward ends.
"""

from __future__ import annotations

import gc
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a package at the root

import torch
import torch._dynamo
import torch._functorch.config as functorch_config

from benchmarks.common import ModelSpec, _loss_of, build_batch, build_model, hac_strategy_config
from hyper_ac import memory


def layers_of(model: torch.nn.Module) -> torch.nn.ModuleList:
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "layer"):
            return module
    raise RuntimeError(f"{type(model).__name__}: no layer list")


def build(name: str, system: str, spec: ModelSpec = ModelSpec()):
    torch._dynamo.reset()
    model, batch = build_model(name, spec), build_batch(name, spec)
    if system == "wrapper":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

        layers = layers_of(model)
        for i in range(len(layers)):
            layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    if system in ("stock", "wrapper"):
        return model, batch, torch.compile(model, fullgraph=True)
    import hyper_ac

    config = hac_strategy_config(f"inductor_{system}")
    return model, batch, torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler="inductor"),
                                       fullgraph=True)


def measure(name: str, system: str) -> tuple[int, int]:
    """(peak bytes, bytes live when the forward returns) of one measured step."""
    model, batch, step = build(name, system)
    with warnings.catch_warnings(), functorch_config.patch(enable_autograd_cache=False):
        warnings.simplefilter("ignore")
        _loss_of(step(**batch)).backward()  # compiles both graphs
        model.zero_grad(set_to_none=True)
        gc.collect()
        torch.manual_seed(0)
        measured = memory.measure_step(lambda: step(**batch))
    return measured.peak_bytes, measured.forward_bytes


def main() -> None:
    torch.set_num_threads(1)
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["transformer", "gpt2", "llama", "mixtral", "bert"]
    systems = sys.argv[2].split(",") if len(sys.argv) > 2 else ["stock", "wrapper", "full"]
    MiB = 2.0**20
    for name in names:
        stock = None
        for system in systems:
            peak, forward_end = measure(name, system)
            stock = peak if system == "stock" else stock
            ratio = f"{peak / stock:6.3f}x stock" if stock else ""
            print(f"{name:12s} {system:8s} peak {peak:>10d} B {peak / MiB:8.3f} MiB {ratio}  "
                  f"forward end {forward_end / MiB:7.3f} MiB", flush=True)


if __name__ == "__main__":
    main()
