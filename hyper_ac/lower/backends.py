"""A torch.compile backend: stock ``torch.compile`` machinery, hyper_ac's plan in the partition step.

hyper_ac owns only the partition step (the split of the joint graph into a
forward and a backward); everything else is what stock ``torch.compile`` does
with the same compiler (docs/torch-compat.md):

- ``compiler="inductor"``: stock ``compile_fx`` (Inductor's decompositions,
  its joint-graph passes, fw/bw compilation) with this partition step as
  Inductor's ``custom_partitioner_fn``. The plan's decisions are written as
  ``MUST_RECOMPUTE`` / ``MUST_SAVE`` tags and PyTorch's
  ``min_cut_rematerialization_partition`` carries them out.
- ``compiler="eager"``: stock ``aot_eager`` (no decompositions, min-cut
  partition) with the partitioned graphs run as boxed FX code; a plan that
  changes the graph is carried out by hyper_ac's own ``partition_joint``, whose
  gradients are bitwise those of the uncheckpointed step. Its forward and
  backward modules are built from the core's split (config ``split: native``,
  the default) or by PyTorch's ``_extract_fwd_bwd_modules`` (``split: torch``).

The route is the core's: mode ``off`` (config fact ``plans``) and every plan
whose ``route`` is ``stock`` (a plan that recomputes nothing on a graph
without the model's own tags, or ``auto``'s fallback; plan ``route_reason``)
are partitioned exactly as stock does it (the same call with the same
arguments), and so is a graph the mode cannot plan (no units, for ``full`` /
``selective``). In ``auto`` (config fact ``compare_with_stock``) the values
stock's partition would recompute (:func:`stock_recomputed`, one extra stock
partition of a copy) go to the core, which routes the graph to stock unless
its own simulated peak is lower (docs/mincut.md, "Never worse than stock").
"""

from __future__ import annotations

import functools
import hashlib
import logging
import warnings
from typing import Any, Callable, Optional

import torch
from torch import fx

from hyper_ac import _core, fx_meta
from hyper_ac.planning.config import ConfigError, load_config
from hyper_ac.planning.passes import prepare_activation_checkpoint

_LOG = logging.getLogger("hyper_ac")

__all__ = ["backend", "boxed_fx_compiler"]


def boxed_fx_compiler(gm: fx.GraphModule, _example_inputs: Any):
    """Run a partitioned module as FX code with the boxed calling convention.

    The generated ``forward(args_list)`` unpacks and clears the list, so each
    input (a saved activation, in the backward) is freed after its last use,
    as Inductor's code does. ``make_boxed_func(gm.forward)`` (torch's
    ``boxed_nop``) keeps the list alive in its frame, so every saved
    activation would live until the backward returns. Random-op replays run
    torch's kernels as plain calls, so they work under any ``TorchDispatchMode``
    (:mod:`hyper_ac.lower.runtime`).
    """
    from torch.fx.graph import _BoxedCodeGen

    from hyper_ac.lower.runtime import use_mode_safe_rng_ops

    use_mode_safe_rng_ops(gm)
    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()
    forward = gm.forward

    def run(args: list):
        return forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def stock_partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any):
    """PyTorch's own partition step with the arguments stock passes it (``compiler``,
    ``num_fwd_outputs``, ``static_lifetime_input_indices``, ...): what ``aot_eager`` and
    Inductor call. It carries out every ``node.meta["recompute"]`` tag on the graph."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from hyper_ac.lower.partition import opaque_after_saved_tensors

    fw_module, bw_module = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    # Where its replayed random ops' states land behind a saved DeviceMesh, stock's own output
    # crashes aot_autograd's runtime; the same modules, the mesh put last, do not.
    opaque_after_saved_tensors(fw_module, bw_module, kwargs["num_fwd_outputs"])
    return fw_module, bw_module


def stock_recomputed(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> list:
    """The forward values stock's partition step recomputes on this (annotated)
    joint graph, by node name: :func:`stock_partition` run on a copy. A fact the
    core compares ``auto``'s plan, and under ``scope: unit_graph`` every mode's, with
    (``PlanOptions::stock_recomputed``, docs/mincut.md "Never worse than stock");
    nothing is decided here."""
    forward = {node.name for node in joint.graph.nodes
               if node.op == "call_function" and not fx_meta.is_backward(node)}
    # Stock's partition edits the graph and tags meta: it runs on a copy.
    from hyper_ac._fx import copy_graph_module

    _, bw = stock_partition(copy_graph_module(joint), joint_inputs, **kwargs)
    return sorted({node.name for node in bw.graph.nodes if node.op == "call_function" and node.name in forward})


def write_decisions(joint: fx.GraphModule, plan: Any) -> None:
    """Write a core plan's decisions as tags PyTorch's min-cut carries out:
    every value the plan recomputes ``MUST_RECOMPUTE``, every value it keeps
    (the plan's ``kept``: saved and decided by the plan) ``MUST_SAVE``, the
    rest untagged (min-cut decides, as stock). A saved value the plan did not
    decide is outside every recompute region (a causal mask, rotary tables,
    what the loss reads): PyTorch may rebuild it from its inputs as it does for
    stock and for per-layer ``checkpoint_wrapper`` (docs/floor.md). The model's
    own ``ac_graph_id`` stays on the nodes it tagged (the core's plan already
    honours those tags); hyper_ac's tags carry none."""
    from torch.utils.checkpoint import CheckpointPolicy

    from hyper_ac.planning import plan_doc

    by_name = {node.name: node for node in joint.graph.nodes}
    recomputed = {entry["of"] for entry in plan_doc.duplicates(plan)}
    for node in joint.graph.nodes:
        if node.op != "call_function":
            continue
        user_tagged = fx_meta.user_tagged(node)
        fx_meta.set_policy(node, None)
        if not user_tagged:
            fx_meta.set_graph_id(node, None)
    for name in recomputed:
        fx_meta.set_policy(by_name[name], CheckpointPolicy.MUST_RECOMPUTE)
    for name in plan_doc.kept(plan):
        node = by_name.get(name)
        if node is not None and node.op == "call_function":
            fx_meta.set_policy(node, CheckpointPolicy.MUST_SAVE)


def write_correctness_pins(joint: fx.GraphModule, plan: Any) -> int:
    """Tag ``MUST_SAVE`` every node the core's plan pins for correctness (in-place, rng,
    collective: :func:`hyper_ac.planning.plan_doc.pinned`) and leave the rest to PyTorch's min-cut;
    returns the count. PyTorch's min-cut does not know the first (it recomputes reads of a
    buffer the step updates in place), so these pins go with every stock call."""
    from torch.utils.checkpoint import CheckpointPolicy

    from hyper_ac.planning import plan_doc

    pinned = plan_doc.pinned(plan)
    count = 0
    for node in joint.graph.nodes:
        if node.name in pinned and node.op == "call_function" and fx_meta.policy(node) is None:
            fx_meta.set_policy(node, CheckpointPolicy.MUST_SAVE)
            count += 1
    return count


class _PartitionStep:
    """The partition step both compilers call: ``(joint, joint_inputs, *, num_fwd_outputs, **stock_kwargs)``.

    ``lowering``: ``"own"`` applies the plan to the joint graph and partitions with
    ``partition_joint``; ``"tag"`` writes the plan's decisions as tags for
    PyTorch's min-cut (:func:`write_decisions`).
    """

    def __init__(self, cfg: Any, *, model: Any, lowering: str, tag_only: bool,
                 on_result: Optional[Callable[[Any], None]], current: dict, detail: bool = False) -> None:
        self.cfg, self.model, self.lowering, self.tag_only, self.detail = cfg, model, lowering, tag_only, detail
        self.on_result, self.current = on_result, current

    def __call__(self, joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
        from hyper_ac.frontend.annotate import annotate_joint
        from hyper_ac.lower.apply import apply_plan
        from hyper_ac.planning.passes import plan

        kwargs["num_fwd_outputs"] = num_fwd_outputs
        facts = self.cfg.facts  # the core's: whether to plan, whether to measure stock
        routed = self.current.get("routed", {})  # Inductor compiles this graph by the core's route
        if not facts["plans"]:  # mode off: the core's route is stock, no plan needed to know it
            routed["stock"] = True
            return stock_partition(joint, joint_inputs, **kwargs)
        annotate_joint(joint, num_fwd_outputs, model=self.model, example_inputs=self.current.get("example_inputs"))
        own_split = self.lowering == "own" and not self.tag_only
        # Never worse than stock: the core compares auto's plan (and under unit_graph every mode's)
        # with stock's on its simulator (and skips the comparison on a graph the model tagged itself).
        baseline = stock_recomputed(joint, joint_inputs, **kwargs) if facts["compare_with_stock"] else None
        # Under Inductor the core checks its candidates on Inductor's own account of the step
        # (docs/mincut.md, "Measured peaks"): its dry run of this joint graph, partitioned as here.
        oracle = None
        if self.lowering == "tag" and facts["peak_oracle"] and not self.tag_only:
            from hyper_ac.lower.oracle import InductorDryRun, RealCompile

            # Compiled as the real compile will be, the kept candidate's dry run leaves it Inductor's work.
            real = RealCompile.of(joint, self.current.get("dynamo_graph"), len(self.current.get("example_inputs", ())),
                                  kwargs)
            oracle = InductorDryRun(joint, functools.partial(partition_as_planned, joint_inputs=joint_inputs, **kwargs),
                                    patches=functools.partial(inductor_patches, self.cfg), real=real)
        # With graph breaks, a piece of the step (say, only the loss) may hold no block:
        # the core routes it to stock with a warning (route_reason no_units).
        result = plan(joint, self.cfg, self.model, with_split=own_split, stock_recomputed=baseline,
                      detail=self.detail, unitless_to_stock=True, peak_oracle=oracle,
                      peak_lower_bound=oracle.lower_bound if oracle is not None else None)
        result.report()
        if self.on_result is not None:
            self.on_result(result)
        # Exact copies the core elided are removed by every lowering (the stock
        # partition included): what is left is the graph the core planned.
        from hyper_ac.lower.apply import apply_elided_copies
        from hyper_ac.planning import plan_doc

        routed["stock"] = to_stock = plan_doc.route(result.plan) == "stock"
        if to_stock or self.lowering == "tag" and not self.tag_only:
            return partition_as_planned(joint, result.plan, joint_inputs=joint_inputs, **kwargs)
        apply_elided_copies(joint, result.plan)
        plan_json = plan_doc.without_elided_copies(result.plan)
        if self.tag_only:
            apply_plan(joint, plan_json, tag_only=True)
            return stock_partition(joint, joint_inputs, **kwargs)
        from hyper_ac.lower.partition import partition_joint

        # The partition builds fresh modules from the graph: no need to regenerate the joint's code.
        apply_plan(joint, plan_json, recompile=False)
        # The core's split: native builds the modules from it, torch hands its saved set to PyTorch's extraction.
        return partition_joint(joint, joint_inputs, split=result.split, method=self.cfg.split_method, **kwargs)


def partition_as_planned(joint: fx.GraphModule, plan: Any, *, joint_inputs: Any, **kwargs: Any):
    """PyTorch's partition of ``joint`` carrying out a plan document (the tag lowering, and
    the core's route to stock on either compiler): exact copies the core elided removed; then,
    routed to stock, the stock partition (which may recompute what it fuses) but never of a value
    the core pins for correctness; otherwise the plan's decisions as tags PyTorch's min-cut
    carries out. What Inductor's dry run measures a candidate by (hyper_ac.lower.oracle)."""
    from hyper_ac.lower.apply import apply_elided_copies
    from hyper_ac.planning import plan_doc

    apply_elided_copies(joint, plan)
    if plan_doc.route(plan) == "stock":
        write_correctness_pins(joint, plan)
    else:
        write_decisions(joint, plan)
    return stock_partition(joint, joint_inputs, **kwargs)


def inductor_patches(cfg: Any, is_backward: bool, stock_route: bool = False) -> dict:
    """The Inductor config each graph of this config compiles under (its dry run too). A graph
    the core routes to stock compiles as mode off would (the core's ``stock_route_*`` facts)."""
    facts = cfg.facts
    prefix = "stock_route_" if stock_route else ""
    patches: dict = {"allow_buffer_reuse": facts[prefix + "inductor_buffer_reuse"]}
    if is_backward and not facts[prefix + "inductor_backward_horizontal_fusion"]:
        # The core's rule (config.h): no unit's replay fused into an earlier backward.
        # Inductor's C++ backend; its only knob for it is the fused group's size.
        patches["cpp.max_horizontal_fusion_size"] = 1
    return patches


def _inductor_partitioner(step: _PartitionStep, key: str):
    """Inductor's ``custom_partitioner_fn``: called inside Inductor's stock partition
    step (after its joint-graph passes) with ``compiler="inductor"``,
    ``num_fwd_outputs`` and ``static_lifetime_input_indices``."""
    from torch._inductor.custom_graph_pass import CustomPartitionerFn

    class HyperACPartitioner(CustomPartitionerFn):
        def __call__(self, gm, joint_inputs, **kwargs):
            return step(gm, joint_inputs, **kwargs)

        def uuid(self):
            return key

        def __reduce__(self):
            # Inductor's cache key pickles its config: this partitioner is keyed by its uuid.
            return (str, (key,))

    return HyperACPartitioner()


def backend(config: Any, *, model: Optional[torch.nn.Module] = None, compiler: str = "eager",
            tag_only: bool = False, on_result: Optional[Callable[[Any], None]] = None, detail: bool = False):
    """``torch.compile(model, backend=hyper_ac.backend("configs/selective.yaml"))``.

    The config is loaded and validated now, so a bad config fails before
    anything compiles. ``model`` (optional) gives scope discovery the live
    module's ``gradient_checkpointing`` blocks; without it the core finds the
    repeated blocks from the module stacks. ``compiler``: ``"eager"`` is stock
    ``aot_eager`` with the partitioned graphs run as FX code
    (:func:`boxed_fx_compiler`); ``"inductor"`` is stock Inductor
    (``compile_fx``) with hyper_ac's partition step. ``tag_only=True`` only
    writes the policies and partitions with PyTorch's
    ``min_cut_rematerialization_partition``, which honours them.
    ``on_result(PassResult)`` is called after each graph is planned; its plan is the
    compact form unless ``detail=True`` (docs/graph-format.md, "Plan document"), which the
    backend applies alike.
    The model's own checkpoint tags (``torch.utils.checkpoint``,
    ``gradient_checkpointing_enable()``) are honoured in every mode.
    """
    if not isinstance(tag_only, bool):
        raise TypeError(f"hyper_ac.backend: tag_only must be a bool, got {type(tag_only).__name__}")
    # The recompute cost assumes the compiler that will run the graph (fusion under Inductor);
    # the core checks the name.
    cfg = load_config(config)
    try:
        cfg = cfg.with_compiler(compiler)
    except ConfigError as error:
        raise ConfigError(f"hyper_ac.backend: {error}") from None
    prepare_activation_checkpoint(model, cfg)  # adapter hook + every model-dependent config check, now
    for note in cfg.facts_for(compiler)["warnings"]:  # settings without effect under this compiler
        warnings.warn(f"hyper_ac.backend: {note}", stacklevel=2)

    # dynamo's real graph inputs (parameters included) for the graph being
    # compiled: they let annotate_joint tell parameters, buffers and inputs apart.
    current: dict = {}
    step = _PartitionStep(cfg, model=model, lowering="tag" if compiler == "inductor" else "own",
                          tag_only=tag_only, on_result=on_result, current=current, detail=detail)

    if compiler == "inductor":
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        digest = hashlib.sha256(f"{cfg.json_for(model)}|{tag_only}|{_core.__file__}".encode()).hexdigest()[:16]
        partitioner = _inductor_partitioner(step, f"hyper_ac-{digest}")

        def compile_inductor(gm: fx.GraphModule, example_inputs: list):
            import torch._functorch.config as functorch_config

            # The partition step writes here whether the core routes this graph to stock; its
            # forward and (later, lazily) backward compile by that.
            routed: dict = {}
            current["example_inputs"], current["dynamo_graph"], current["routed"] = list(example_inputs), gm, routed
            # A cache hit would skip the partition step, and with it this config's plan.
            with torch._inductor.config.patch(custom_partitioner_fn=partitioner), \
                    functorch_config.patch(enable_autograd_cache=False):
                return compile_fx(gm, example_inputs, inner_compile=functools.partial(compile_one_graph, routed))

        def compile_one_graph(routed: dict, *args, **kwargs):
            # Inductor compiles the backward lazily, at its first call: a config patch
            # around compile_fx alone would miss it, so each graph's compile gets its own.
            patches = inductor_patches(cfg, bool(kwargs.get("is_backward")), routed.get("stock", False))
            with torch._inductor.config.patch(patches):
                return compile_fx_inner(*args, **kwargs)

        compile_inductor.partition_fn = step  # type: ignore[attr-defined]
        return compile_inductor

    from torch._dynamo.backends.common import aot_autograd

    # aot_eager's arguments, with hyper_ac's partition step and boxed FX code.
    aot_backend = aot_autograd(fw_compiler=boxed_fx_compiler, bw_compiler=boxed_fx_compiler, partition_fn=step,
                               keep_inference_input_mutations=True)

    def compile_graph(gm: fx.GraphModule, example_inputs: list):
        import torch._functorch.config as functorch_config

        current["example_inputs"] = list(example_inputs)
        with functorch_config.patch(enable_autograd_cache=False):
            return aot_backend(gm, example_inputs)

    # The aot_autograd backend inside, for instrumentation (the benchmarks time its partition_fn).
    compile_graph.aot_backend = aot_backend  # type: ignore[attr-defined]
    compile_graph.partition_fn = step  # type: ignore[attr-defined]
    return compile_graph
