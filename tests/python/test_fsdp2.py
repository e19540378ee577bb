"""FSDP2 (``fully_shard`` per layer) on two gloo ranks (loopback), compiled with ``backend="hyper_ac"`` (issue 25).

A small decoder (two blocks, each sharded by ``fully_shard``, then the root)
is compiled whole; dynamo breaks the graph at FSDP's hooks and hyper_ac plans
each compiled piece. For the eager compiler in ``off`` / ``full`` / ``auto``
and for Inductor in ``full``, every rank checks against the same step compiled
with the stock backend (``aot_eager`` / ``inductor``): the loss and every
gradient shard equal (bitwise on the eager compiler, to rounding on Inductor),
and, for the modes that plan, the peak CPU bytes of the step
(``hyper_ac.memory.track``) not above stock's. Every wait has a timeout, so a hang fails the test.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.distributed as dist

from ranks import rank_report, run_ranks

WORLD = 2
RUNS = [("eager", "off"), ("eager", "full"), ("eager", "auto"), ("inductor", "full")]
TIMEOUT_S = 420  # whole test, on a loaded 2-core machine

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _build():
    from hyper_ac import models

    torch.manual_seed(0)
    model = models.TinyTransformer(num_layers=2)
    tokens = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))
    return model, tokens


def _shard(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _step(model, tokens, backend, options=None):
    import hyper_ac.memory as memory

    torch._dynamo.reset()
    sharded = _shard(model)
    if options is not None:
        options = {**options, "model": sharded}  # full needs the blocks: each compiled piece holds one
    compiled = torch.compile(sharded, backend=backend, options=options)
    compiled(tokens, tokens).backward()  # compile, and warm the allocator
    sharded.zero_grad(set_to_none=True)
    with memory.track() as tracked:
        loss = compiled(tokens, tokens)
        loss.backward()
    grads = [p.grad.to_local().clone() for p in sharded.parameters()]
    torch._dynamo.reset()
    return loss.detach(), grads, tracked.peak_bytes


def _worker(rank: int, port: int, out_dir: str) -> None:
    with rank_report(rank, port, out_dir, WORLD, 120, runs={}) as report:
        torch.set_num_threads(1)
        warnings.simplefilter("ignore")
        import copy

        import hyper_ac  # noqa: F401  (registers backend="hyper_ac")

        model, tokens = _build()
        stock = {compiler: _step(copy.deepcopy(model), tokens, "aot_eager" if compiler == "eager" else "inductor")
                 for compiler in sorted({c for c, _ in RUNS})}
        for compiler, mode in RUNS:
            results: list = []
            loss, grads, peak = _step(copy.deepcopy(model), tokens, "hyper_ac",
                                      {"config": {"ac_mode": mode}, "compiler": compiler, "on_result": results.append})
            ref_loss, ref_grads, ref_peak = stock[compiler]
            if compiler == "eager":
                same = torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
            else:
                same = torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-6) and all(
                    torch.allclose(g, r, rtol=1e-4, atol=1e-5) for g, r in zip(grads, ref_grads))
            report["runs"][f"{compiler}/{mode}"] = {
                "same": bool(same), "peak": peak, "stock_peak": ref_peak, "planned": len(results),
                "recomputed": sum(len(r.plan.get("duplicates", [])) for r in results)}


def test_fsdp2_two_ranks_hyper_ac_backend(tmp_path):
    reports = run_ranks(_worker, tmp_path, WORLD, TIMEOUT_S)
    problems = []
    for report in reports:
        for run, entry in report["runs"].items():
            where = f"rank {report['rank']}, {run}"
            if not entry["same"]:
                problems.append(f"{where}: loss or gradients differ from stock")
            # off is stock's partition, but under FSDP2 its measured peak is ~5% above
            # aot_eager's (equal without FSDP2; not understood yet): checked for the plans only.
            if not run.endswith("/off") and entry["peak"] > entry["stock_peak"]:
                problems.append(f"{where}: peak {entry['peak']} > stock {entry['stock_peak']}")
            if (entry["planned"] == 0) != run.endswith("/off"):
                problems.append(f"{where}: {entry['planned']} graph(s) planned")
        if report["runs"]["eager/full"]["recomputed"] == 0:
            problems.append(f"rank {report['rank']}: full recomputed nothing: nothing tested")
    assert not problems, "\n".join(problems) + "\n" + json.dumps([r["runs"] for r in reports], indent=1)
