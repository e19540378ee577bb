"""Which forward ops a partition replays in the backward, under Inductor (a diagnostic).

Compiles one step of a bench model (benchmarks.common) with stock ``torch.compile``
at a PyTorch ``activation_memory_budget``, or with hyper_ac (``auto``, or ``budget F``:
F × stock's measured peak plus the resident bytes, as benchmarks.frontier sets byte
budgets), records the forward/backward modules the partition returns, and prints the
bytes the backward receives from the forward (its non-tangent tensor inputs) and a
count, per aten op, of the backward's call_functions that carry a forward node's name.
The partition copies a replayed node under its forward name, so that count is the
replay; an op the backward happens to name like a forward op would be counted too.

Used to compare PyTorch's 0.5 budget with hyper_ac's neighbouring points on the
realistic Llama (issue 37; stock's peak there: benchmarks/results/realistic/results.md):

    python scripts/replayed_ops.py llama --torch-budget 0.5
    python scripts/replayed_ops.py llama --budget 0.6 --stock-peak-mib 296.81
    python scripts/replayed_ops.py llama --auto
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
import torch._inductor.compile_fx as compile_fx  # noqa: E402

import hyper_ac  # noqa: E402
from hyper_ac import fx_meta  # noqa: E402
from benchmarks.common import ModelSpec, build_batch, build_model  # noqa: E402
from benchmarks.frontier import _resident_bytes  # noqa: E402
from hyper_ac.lower import backends  # noqa: E402


def _recording(partition, store):
    def record(*args, **kwargs):
        fw, bw = partition(*args, **kwargs)
        store.append((fw, bw))
        return fw, bw
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a benchmarks.common model name (llama, gpt2, mixtral, ...)")
    point = parser.add_mutually_exclusive_group(required=True)
    point.add_argument("--torch-budget", type=float, help="stock torch.compile at this activation_memory_budget")
    point.add_argument("--budget", type=float, help="hyper_ac budget: this fraction of --stock-peak-mib")
    point.add_argument("--auto", action="store_true", help="hyper_ac auto")
    parser.add_argument("--stock-peak-mib", type=float, help="stock's measured step peak (MiB), for --budget")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    if args.budget is not None and args.stock_peak_mib is None:
        parser.error("--budget needs --stock-peak-mib (stock's measured peak of the same step)")

    torch.set_num_threads(1)
    spec = ModelSpec(layers=args.layers, hidden=args.hidden, seq=args.seq, batch=args.batch)
    model, batch = build_model(args.model, spec), build_batch(args.model, spec)
    store: list = []
    patch = {"enable_autograd_cache": False}
    if args.torch_budget is not None:
        patch["activation_memory_budget"] = args.torch_budget
        compile_fx.min_cut_rematerialization_partition = _recording(
            compile_fx.min_cut_rematerialization_partition, store)
        step = torch.compile(model)
        label = f"torch budget {args.torch_budget}"
    else:
        partition = backends._PartitionStep.__call__
        backends._PartitionStep.__call__ = lambda self, *a, **k: _recording(partition, store)(self, *a, **k)
        if args.auto:
            config, label = {"ac_mode": "auto"}, "auto"
        else:
            target = _resident_bytes(model, batch) + args.budget * args.stock_peak_mib * 2**20
            config, label = {"ac_mode": "budget", "ac_memory_budget": int(target)}, f"budget {args.budget}"
        step = torch.compile(model, backend=hyper_ac.backend(config, model=model, compiler="inductor"))
    with functorch_config.patch(**patch):
        step(**batch)
    if not store:
        sys.exit("no partition was recorded: the step compiled without a joint graph")

    fw, bw = store[-1]
    forward_names = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    replayed = collections.Counter(
        str(n.target).replace("aten.", "") for n in bw.graph.nodes
        if n.op == "call_function" and n.name in forward_names)
    received = sum(
        v.numel() * v.element_size() for n in bw.graph.nodes
        if n.op == "placeholder" and not n.name.startswith("tangents")
        and isinstance(v := fx_meta.val(n), torch.Tensor))
    print(json.dumps({"model": args.model, "point": label, "saved_MiB": round(received / 2**20, 2),
                      "replayed": dict(replayed.most_common())}))


if __name__ == "__main__":
    main()
