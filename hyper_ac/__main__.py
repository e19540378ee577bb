"""Command line: ``python -m hyper_ac {demo,capture,plan,config,op-policy}``.

Exit status: 0 on success; 1 when ``demo`` finds gradients that differ; 2 for
a user error (unknown model, bad path, bad config or graph, bad argument),
reported as one line ``hyper_ac: error: ...`` on stderr, never a traceback.
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
    from hyper_ac.frontend.capture import capture_joint
    from hyper_ac.planning.config import mode_config
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


class UsageError(ValueError):
    """A bad command-line argument: reported as one line, exit status 2."""


def _progress(total: int, desc: str):
    """A tqdm bar on stderr when tqdm is installed and stderr is a terminal; otherwise a silent stand-in."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        return tqdm(total=total, desc=desc, file=sys.stderr, disable=None, leave=False, dynamic_ncols=True)

    class _Silent:
        def update(self, _n: int = 1) -> None:
            pass

        def set_postfix_str(self, _text: str) -> None:
            pass

        def close(self) -> None:
            pass

    return _Silent()


def _capture_model(spec: str, layers: int, seq: int):
    """``transformer`` / ``mlp`` / ``hf:<arch>`` → (model, example-batch name)."""
    from hyper_ac import models

    arches = [n for n in models.HF_MODEL_NAMES]
    choices = f"transformer, mlp or hf:<arch> with <arch> one of {', '.join(arches)}"
    name = spec.strip().lower()
    if name.startswith("hf:"):
        arch = name[3:]
        if arch not in arches:
            raise UsageError(f"unknown HuggingFace architecture {arch!r} in --model {spec}; choose {choices}")
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise UsageError(f"--model {spec} needs the transformers package (pip install transformers)") from None
        return models.build(arch, layers, max_seq=max(64, seq)), arch
    if name == "transformer":
        return models.build("transformer", layers, max_seq=max(64, seq)), "transformer"
    if name == "mlp":
        return models.build("mlp", layers), "mlp"
    if name in arches:
        raise UsageError(f"unknown model {spec!r}; HuggingFace models are named hf:{name}")
    raise UsageError(f"unknown model {spec!r}; choose {choices}")


def _check_output_path(path: str) -> None:
    import os

    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise UsageError(f"output '{path}' is a directory; give a file name, e.g. -o graph.json")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write '{path}': directory '{os.path.dirname(path) or parent}' does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(target) and not os.access(target, os.W_OK)):
        raise UsageError(f"cannot write '{path}': permission denied")


def _capture(args: argparse.Namespace) -> int:
    for flag, value, least in (("--layers", args.layers, 1), ("--batch", args.batch, 1), ("--seq", args.seq, 2)):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    _check_output_path(args.output)
    import torch

    from hyper_ac import _core, models
    from hyper_ac.frontend.capture import capture_joint

    bar = _progress(4, f"capture {args.model}")
    try:
        bar.set_postfix_str("building the model")
        model, batch_name = _capture_model(args.model, args.layers, args.seq)
        batch = models.example_batch(batch_name, batch=args.batch, seq=args.seq)
        bar.update()
        bar.set_postfix_str("tracing forward+backward")
        torch.manual_seed(0)
        captured = capture_joint(model, tracer=args.tracer, **batch)
        bar.update()
        bar.set_postfix_str("serialising")
        graph_json = captured.to_json(measure=args.measure)
        bar.update()
        bar.set_postfix_str("writing")
        try:
            with open(args.output, "w") as out:
                out.write(graph_json)
        except OSError as error:
            raise UsageError(f"cannot write '{args.output}': {error.strerror}") from None
        bar.update()
    finally:
        bar.close()
    summary = _core.graph_summary(graph_json)
    print(f"{args.output}: {args.model}, {summary['nodes']} nodes (forward {summary['forward_nodes']}, "
          f"backward {summary['backward_nodes']}), {summary['activations_read_by_backward']} activations read by "
          f"the backward ({_core.format_bytes(summary['activation_bytes_read_by_backward'])}), captured in "
          f"{captured.capture_seconds:.1f} s")
    return 0


def _read_text(path: str, what: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as error:
        raise UsageError(f"cannot read {what} '{path}': {error.strerror}") from None


def _plan(args: argparse.Namespace) -> int:
    if args.hf_config is not None:
        if args.graph is not None and args.config is not None:
            raise UsageError("with --hf-config give at most one positional argument, the base config "
                             f"(got {args.graph!r} and {args.config!r})")
        return _plan_from_config(args, args.graph if args.config is None else args.config)
    if args.graph is None or args.config is None:
        raise UsageError("plan needs a graph file and a config (plan GRAPH CONFIG), or --hf-config CONFIG.json "
                         "to plan a model from its HuggingFace config")
    for flag in ("seq", "batch", "dtype", "hardware", "compiler", "device_memory", "reserve"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} goes with --hf-config (a graph file has its shapes and "
                             "the config its hardware)")
    import hyper_ac
    from hyper_ac import _core
    from hyper_ac.planning.config import load_config, op_policy_json

    graph_json = _read_text(args.graph, "graph file")
    if args.print:  # the same plan, through the core's text printer
        print(_core.print_plan(graph_json, load_config(args.config).json_for(None), op_policy_json()), end="")
    else:
        print(json.dumps(hyper_ac.plan(graph_json, args.config, detail=args.detail).plan, indent=1))
    return 0


def _plan_from_config(args: argparse.Namespace, base_config: str | None) -> int:
    if args.print or args.detail:
        raise UsageError("--print and --detail show one graph's plan; with --hf-config the output is the per-mode table")
    if args.seq is None:
        raise UsageError("--hf-config needs --seq, the sequence length to plan for")
    for flag, value, least in (("--seq", args.seq, 2), ("--batch", args.batch or 1, 1)):
        if value < least:
            raise UsageError(f"{flag} must be at least {least}, got {value}")
    from hyper_ac import _core
    from hyper_ac.lower.whatif import plan_from_config

    t0 = time.perf_counter()
    report = plan_from_config(args.hf_config, seq=args.seq, batch=args.batch or 1, dtype=args.dtype or "bf16",
                              config=base_config, hardware=args.hardware, compiler=args.compiler,
                              device_memory=args.device_memory, reserve=args.reserve or 0)
    size = _core.format_bytes
    shape = ", ".join(part for part in (
        f"{report.layers} layers" if report.layers else "", f"hidden {report.hidden}" if report.hidden else "") if part)
    print(f"{report.model_type} ({shape}), batch {report.batch} x seq {report.seq}, {report.dtype}: "
          f"{report.nodes} nodes captured on fake tensors in {report.capture_seconds:.1f} s, "
          f"planned in {report.plan_seconds:.1f} s")
    print(f"parameters {size(report.parameter_bytes)}, gradients as much; hardware {json.dumps(report.hardware)}, "
          f"compiler {report.compiler}")
    limit = report.device_memory_bytes
    print()
    print(f"{'mode':<10} {'simulated peak':>15} {'saved for backward':>19} {'recompute time':>15} {'replayed nodes':>15}"
          + (f" {'fits':>5}" if limit is not None else ""))
    for row in report.rows:
        name = row.mode
        fits = "" if limit is None else f" {'yes' if row.simulated_peak_bytes <= limit - report.reserve_bytes else 'no':>5}"
        print(f"{name:<10} {size(row.simulated_peak_bytes):>15} {size(row.saved_bytes):>19} "
              f"{row.recompute_seconds * 1e3:>12.1f} ms {row.nodes_duplicated:>15}{fits}")
    print("\nsimulated peak: the step's parameters, gradients, batch and activations as the core schedules them; "
          "not the optimizer's state, the allocator's slack, nor what the compiler fuses (docs/fake-planning.md)")
    if limit is not None:
        room = limit - report.reserve_bytes
        reserve = f" less the {size(report.reserve_bytes)} reserve" if report.reserve_bytes else ""
        if report.fits:
            section = {k: v for k, v in report.fit.section.items() if k in ("mode", "memory_budget", "hardware", "compiler")}
            print(f"\nfits {size(limit)}{reserve} ({size(room)}) with the least recompute "
                  f"({report.fit.recompute_seconds * 1e3:.1f} ms, peak {size(report.fit.simulated_peak_bytes)}):")
            print("activation_checkpoint:")
            for key, value in section.items():
                if key == "hardware" and isinstance(value, dict) and value.get("name") in ("cpu", "a100", "h100", "h200"):
                    value = value["name"]  # the profile by its name
                if key == "memory_budget":
                    print(f"  {key}: {int(value)}  # {size(int(value))}")
                else:
                    print(f"  {key}: {json.dumps(value) if not isinstance(value, str) else value}")
        else:
            least = min(report.rows, key=lambda r: r.simulated_peak_bytes)
            print(f"\nnothing fits {size(limit)}{reserve}: the least simulated peak is {least.mode}'s "
                  f"{size(least.simulated_peak_bytes)}; shorten the sequence, shard the model or add memory")
    print(f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0


def _config(args: argparse.Namespace) -> int:
    from hyper_ac.planning.config import load_config

    print(json.dumps(load_config(args.config).data, indent=1, sort_keys=True))
    return 0


def _op_policy(_args: argparse.Namespace) -> int:
    from hyper_ac.planning.config import op_policy_json

    print(json.dumps(json.loads(op_policy_json()), indent=1))
    return 0


def _is_user_error(error: BaseException) -> bool:
    if isinstance(error, ValueError):  # UsageError, ConfigError, GraphError, ScopeError, JSON errors
        return True
    annotate = sys.modules.get("hyper_ac.frontend.annotate")  # CaptureError (graph break, ...) without importing torch here
    return annotate is not None and isinstance(error, annotate.CaptureError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m hyper_ac", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a built-in transformer one step with and without the pass")
    demo.add_argument("--layers", type=int, default=2)
    demo.add_argument("--modes", nargs="+", default=["full", "selective", "auto", "budget"])
    demo.set_defaults(func=_demo)
    capture = sub.add_parser(
        "capture", help="capture a built-in model's joint forward+backward graph to JSON (tiny configs, no downloads)")
    capture.add_argument("--model", required=True,
                         help="transformer, mlp or hf:<arch> (gpt2, llama, mistral, qwen2, mixtral, bert)")
    capture.add_argument("--layers", type=int, default=2, help="number of blocks (default 2)")
    capture.add_argument("--batch", type=int, default=2, help="batch size of the example batch (default 2)")
    capture.add_argument("--seq", type=int, default=16, help="sequence length of the example batch (default 16)")
    capture.add_argument("--tracer", choices=("compile", "export"), default="compile",
                         help="capture tracer (hyper_ac.frontend.capture.capture_joint; default compile)")
    capture.add_argument("-o", "--output", required=True, help="where to write the graph JSON")
    capture.add_argument("--measure", action="store_true",
                         help="time each op on this machine into measured_seconds, for configs with "
                              "hardware: measured (docs/config.md; cached on disk)")
    capture.set_defaults(func=_capture)
    plan = sub.add_parser(
        "plan", help="plan a serialised graph JSON with a config, or a model from its HuggingFace config (--hf-config)")
    plan.add_argument("graph", nargs="?", help="the graph JSON (python -m hyper_ac capture)")
    plan.add_argument("config", nargs="?", help="a preset name or YAML config (with --hf-config: the base config)")
    plan.add_argument("--print", action="store_true", help="print the annotated graph instead of the plan JSON")
    plan.add_argument("--detail", action="store_true",
                      help="the plan's full form (every tagged node's policy, region id and reason by name) "
                           "instead of the compact one (docs/graph-format.md)")
    what_if = plan.add_argument_group(
        "planning from a model's config", "capture the step on fake tensors (no weights, no memory) and print every "
        "mode's simulated peak and recompute time (docs/fake-planning.md)")
    what_if.add_argument("--hf-config", metavar="CONFIG.json", help="a HuggingFace config.json (or its directory)")
    what_if.add_argument("--seq", type=int, help="sequence length")
    what_if.add_argument("--batch", type=int, help="batch size (default 1)")
    what_if.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), help="parameter dtype (default bf16)")
    what_if.add_argument("--hardware", help="roofline profile of the recompute time: cpu, a100, h100, h200 "
                                            "(default: the config's)")
    what_if.add_argument("--compiler", choices=("eager", "inductor"), help="compiler the step will run under "
                                                                          "(default: the config's)")
    what_if.add_argument("--device-memory", help="the device's memory, e.g. 80GiB: adds the budget plan that fits it")
    what_if.add_argument("--reserve", help="bytes of that memory kept for what the step does not hold "
                                           "(optimizer state, allocator slack), e.g. 16GiB")
    plan.set_defaults(func=_plan)
    config = sub.add_parser("config", help="validate a YAML config and print its canonical JSON")
    config.add_argument("config")
    config.set_defaults(func=_config)
    op_policy = sub.add_parser("op-policy", help="print the default operator policy table as JSON")
    op_policy.set_defaults(func=_op_policy)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as error:  # config / graph / argument / capture errors: the message names what
        if not _is_user_error(error):
            raise
        first = str(error).strip().splitlines()
        print(f"hyper_ac: error: {first[0] if first else type(error).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hyper_ac: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
