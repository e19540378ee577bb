"""A torch.compile backend: capture → ActivationCheckpointPass → partition."""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Optional

import torch
from torch import fx

from hyper_ac import _core
from hyper_ac.config import apply_adapter_hook, load_config
from hyper_ac.partition import partition_joint
from hyper_ac.passes import ActivationCheckpointPass, prepare_activation_checkpoint

_LOG = logging.getLogger("hyper_ac")

__all__ = ["backend", "boxed_fx_compiler"]


def boxed_fx_compiler(gm: fx.GraphModule, _example_inputs: Any):
    """Run a partitioned module as FX code with the boxed calling convention.

    The generated ``forward(args_list)`` unpacks and clears the list, so each
    input (a saved activation, in the backward) is freed after its last use,
    as Inductor's code does. ``make_boxed_func(gm.forward)`` (torch's
    ``boxed_nop``) keeps the list alive in its frame, so every saved
    activation would live until the backward returns.
    """
    from torch.fx.graph import _BoxedCodeGen

    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()
    forward = gm.forward

    def run(args: list):
        return forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def backend(config: Any, *, model: Optional[torch.nn.Module] = None, compiler: str = "eager",
            tag_only: bool = False, on_result: Optional[Callable[[Any], None]] = None):
    """``torch.compile(model, backend=hyper_ac.backend("configs/selective.yaml"))``.

    The config is loaded and validated now, so a bad config fails before
    anything compiles. ``model`` (optional) gives scope discovery the live
    module's ``gradient_checkpointing`` blocks; without it the core finds the
    repeated blocks from the module stacks. ``compiler``: ``"eager"`` runs the
    partitioned graphs as FX code (:func:`boxed_fx_compiler`); ``"inductor"`` compiles them with Inductor.
    ``tag_only=True`` only writes the policies and partitions with PyTorch's
    ``min_cut_rematerialization_partition``, which honours them.
    ``on_result(PassResult)`` is called after each graph is planned.
    """
    from torch._dynamo.backends.common import aot_autograd

    from hyper_ac.annotate import annotate_joint

    cfg = load_config(config)
    prepare_activation_checkpoint(model, cfg)  # adapter hook + every model-dependent config check, now
    if not isinstance(tag_only, bool):
        raise TypeError(f"hyper_ac.backend: tag_only must be a bool, got {type(tag_only).__name__}")
    if compiler not in ("eager", "inductor"):
        raise ValueError(f"hyper_ac.backend: compiler must be 'eager' or 'inductor', got {compiler!r}")
    if model is not None:
        apply_adapter_hook(model)

    # dynamo's real graph inputs (parameters included) for the graph being
    # compiled: they let annotate_joint tell parameters, buffers and inputs apart.
    current: dict = {}

    def partition_fn(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
        annotate_joint(joint, num_fwd_outputs, model=model, example_inputs=current.get("example_inputs"))
        ac_pass = ActivationCheckpointPass(cfg, tag_only=tag_only)
        try:
            # The partition builds fresh modules from the graph: no need to regenerate the joint's code.
            ac_pass.run(joint, model=model, recompile=False)
        except _core.NoUnitsError as error:
            # With graph breaks, a piece of the step (say, only the loss) may hold
            # no block at all: that piece trains without checkpointing.
            warnings.warn(f"hyper_ac: this graph is left without activation checkpointing: {error}", stacklevel=2)
            return partition_joint(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        if on_result is not None:
            on_result(ac_pass.result)
        if tag_only:
            from torch._functorch.partitioners import min_cut_rematerialization_partition

            return min_cut_rematerialization_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        return partition_joint(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    decompositions = None
    if compiler == "inductor":
        import functools

        from torch._inductor.compile_fx import compile_fx_inner
        from torch._inductor.decomposition import select_decomp_table

        # Inductor lowers from its own decomposition table; the joint graph must be traced with it.
        decompositions = select_decomp_table()
        fw_compiler = compile_fx_inner
        bw_compiler = functools.partial(compile_fx_inner, is_backward=True)
    else:
        fw_compiler = bw_compiler = boxed_fx_compiler

    aot_backend = aot_autograd(fw_compiler=fw_compiler, bw_compiler=bw_compiler, partition_fn=partition_fn,
                               decompositions=decompositions)

    def compile_graph(gm: fx.GraphModule, example_inputs: list):
        import torch._functorch.config as functorch_config

        current["example_inputs"] = list(example_inputs)
        # A cache hit would skip partition_fn, and with it this config's plan.
        with functorch_config.patch(enable_autograd_cache=False):
            return aot_backend(gm, example_inputs)

    # The aot_autograd backend inside, for instrumentation (the benchmarks time its partition_fn).
    compile_graph.aot_backend = aot_backend  # type: ignore[attr-defined]
    return compile_graph
