"""Command line: ``python -m hyper_ac {demo,plan,config,op-policy}``.

The benchmark suite is not part of the package: ``python -m benchmarks`` from the checkout.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    import torch

    import hyper_ac
    from hyper_ac import _core
    from hyper_ac.capture import capture_joint
    from hyper_ac.config import mode_config
    from hyper_ac.models import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(num_layers=args.layers)
    tokens = torch.randint(0, 128, (4, 64))

    t0 = time.perf_counter()
    captured = capture_joint(copy.deepcopy(model), tokens, tokens)
    graph_json = captured.to_json()
    summary = _core.graph_summary(graph_json)
    print(f"built-in transformer: {args.layers} layers, joint graph captured in {time.perf_counter() - t0:.2f} s")
    print(
        f"  nodes {summary['nodes']} (forward {summary['forward_nodes']}, backward {summary['backward_nodes']}), "
        f"activations read by backward: {summary['activations_read_by_backward']} "
        f"({summary['activation_bytes_read_by_backward'] / 2**10:.1f} KiB)"
    )

    baseline = copy.deepcopy(model)
    base_loss = baseline(tokens, tokens)
    base_loss.backward()

    rows = []
    for mode in args.modes:
        trained = copy.deepcopy(model)
        results: list = []
        compiled = torch.compile(
            trained, backend=hyper_ac.backend(mode_config(mode), model=trained,
                                              on_result=results.append), fullgraph=True)
        loss = compiled(tokens, tokens)
        loss.backward()
        same = torch.equal(loss, base_loss) and all(
            torch.equal(p.grad, q.grad) for p, q in zip(baseline.parameters(), trained.parameters()))
        stats = results[0].stats if results and results[0].stats else {}
        rows.append((mode, stats, same))
        torch._dynamo.reset()

    print()
    print(f"{'mode':<10} {'duplicated':>10} {'saved before':>14} {'saved after':>13} {'sim. peak':>12} "
          f"{'recompute FLOPs':>16} {'recompute time':>15}  gradients identical")
    for mode, stats, same in rows:
        print(
            f"{mode:<10} {stats.get('nodes_duplicated', 0):>10} "
            f"{stats.get('saved_bytes_before', 0) / 2**10:>10.1f} KiB {stats.get('saved_bytes_after', 0) / 2**10:>9.1f} KiB "
            f"{stats.get('simulated_peak_after', 0) / 2**10:>8.1f} KiB "
            f"{stats.get('recompute_flops', 0):>16.3g} {stats.get('recompute_seconds', 0) * 1e6:>12.1f} us  "
            f"{'yes' if same else 'NO'}"
        )
    if rows:
        print(f"(simulated peak without the pass: {rows[0][1].get('simulated_peak_before', 0) / 2**10:.1f} KiB; "
              "recompute time is the roofline estimate for the configured hardware profile)")
    return 0 if all(same for _, _, same in rows) else 1


def _plan(args: argparse.Namespace) -> int:
    import hyper_ac
    from hyper_ac import _core
    from hyper_ac.config import load_config, op_policy_json

    graph_json = open(args.graph).read()
    if args.print:  # the same plan, through the core's text printer
        print(_core.print_plan(graph_json, load_config(args.config).json_for(None), op_policy_json()), end="")
    else:
        print(json.dumps(hyper_ac.plan(graph_json, args.config).plan, indent=1))
    return 0


def _config(args: argparse.Namespace) -> int:
    from hyper_ac.config import load_config

    print(json.dumps(load_config(args.config).data, indent=1, sort_keys=True))
    return 0


def _op_policy(_args: argparse.Namespace) -> int:
    from hyper_ac.config import op_policy_json

    print(json.dumps(json.loads(op_policy_json()), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m hyper_ac", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a built-in transformer one step with and without the pass")
    demo.add_argument("--layers", type=int, default=2)
    demo.add_argument("--modes", nargs="+", default=["full", "selective", "auto", "budget"])
    demo.set_defaults(func=_demo)
    plan = sub.add_parser("plan", help="plan a serialised graph JSON with a config")
    plan.add_argument("graph")
    plan.add_argument("config")
    plan.add_argument("--print", action="store_true", help="print the annotated graph instead of the plan JSON")
    plan.set_defaults(func=_plan)
    config = sub.add_parser("config", help="validate a YAML config and print its canonical JSON")
    config.add_argument("config")
    config.set_defaults(func=_config)
    op_policy = sub.add_parser("op-policy", help="print the default operator policy table as JSON")
    op_policy.set_defaults(func=_op_policy)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as error:  # config / graph errors: the message names the key or node
        print(f"hyper_ac: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
