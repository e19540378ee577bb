"""Graph passes and a pipeline that composes them, with the ordering contract.

A :class:`GraphPass` has a ``name`` and ``run(gm, config=None, **kw)`` that
returns the (possibly new) ``fx.GraphModule``. :class:`PassPipeline` runs
passes in order, handing each the previous one's module and the same config
and keyword arguments.

The ordering contract (docs/architecture.md, "Passes and their order"):
activation checkpointing runs **before** any pass that shards parameters or
splits pipeline stages. The recomputed copies the pass inserts read the
joint graph's placeholders as full, unsharded tensors; a sharding pass that
runs afterwards rewrites every read of a parameter, the replays' included,
so the replays gather again like the originals. Run the other way round the
plan would treat gathered parameters as activations, and a stage split
would leave replays reading values of another stage. So a pass declares
``shards_parameters`` / ``splits_stages``, the pipeline rejects a
checkpointing pass (``needs_unsharded_placeholders``) placed after one, and
:func:`mark_placeholders_rewritten` records on the graph that such a pass
ran, so :class:`hyper_ac.ActivationCheckpointPass` also refuses the graph
outside a pipeline.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from torch import fx

from hyper_ac import fx_meta

__all__ = ["GraphPass", "PassOrderError", "PassPipeline", "mark_placeholders_rewritten", "placeholders_rewritten_by"]


class PassOrderError(ValueError):
    """Passes in an order that breaks the contract (the message names both)."""


class GraphPass:
    """Base of a graph pass: ``name`` and ``run(gm, config=None, **kw) -> gm``.

    Declare what the pass does to the graph's inputs:
    ``shards_parameters`` (parameter placeholders hold shards, reads go
    through a gather), ``splits_stages`` (the graph is cut into pipeline
    stages); ``needs_unsharded_placeholders`` (the pass must see placeholders
    as the full tensors: activation checkpointing).
    """

    name: str = "graph_pass"
    shards_parameters: bool = False
    splits_stages: bool = False
    needs_unsharded_placeholders: bool = False

    def run(self, graph_module: fx.GraphModule, config: Any = None, **kwargs: Any) -> fx.GraphModule:
        raise NotImplementedError(f"{type(self).__name__}.run")

    def __call__(self, graph_module: fx.GraphModule, config: Any = None, **kwargs: Any) -> fx.GraphModule:
        return self.run(graph_module, config, **kwargs)

    @property
    def rewrites_placeholders(self) -> bool:
        return bool(self.shards_parameters or self.splits_stages)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def mark_placeholders_rewritten(graph_module: fx.GraphModule, pass_name: str) -> None:
    """Record on ``graph_module`` that ``pass_name`` sharded parameters or split stages."""
    graph_module.meta.setdefault(fx_meta.PLACEHOLDERS_REWRITTEN_BY, []).append(pass_name)


def placeholders_rewritten_by(graph_module: fx.GraphModule) -> list[str]:
    """The passes that sharded this graph's parameters or split its stages (empty: none)."""
    return list(getattr(graph_module, "meta", {}).get(fx_meta.PLACEHOLDERS_REWRITTEN_BY, []))


class PassPipeline(GraphPass):
    """Run ``passes`` in order: ``PassPipeline([ActivationCheckpointPass(cfg), shard]).run(gm, model=model)``.

    The order is checked when the pipeline is built: a pass that needs
    unsharded placeholders (activation checkpointing) after one that shards
    parameters or splits stages raises :class:`PassOrderError`. ``config`` and
    the keyword arguments of :meth:`run` go to every pass.
    """

    name = "pipeline"

    def __init__(self, passes: Iterable[GraphPass], *, name: Optional[str] = None) -> None:
        self.passes = list(passes)
        if name is not None:
            self.name = name
        for i, p in enumerate(self.passes):
            if not callable(getattr(p, "run", None)):
                raise TypeError(f"PassPipeline: pass #{i} ({p!r}) has no run(gm, config, **kw) method")
        self.needs_unsharded_placeholders = any(getattr(p, "needs_unsharded_placeholders", False) for p in self.passes)
        self.shards_parameters = any(getattr(p, "shards_parameters", False) for p in self.passes)
        self.splits_stages = any(getattr(p, "splits_stages", False) for p in self.passes)
        _check_order(self.passes)

    def run(self, graph_module: fx.GraphModule, config: Any = None, **kwargs: Any) -> fx.GraphModule:
        for p in self.passes:
            result = p.run(graph_module, config, **kwargs)
            if not isinstance(result, fx.GraphModule):
                raise TypeError(f"pass {_name(p)!r} returned {type(result).__name__}, not the fx.GraphModule "
                                "(a GraphPass returns the module it rewrote)")
            graph_module = result
        return graph_module

    def __repr__(self) -> str:
        return f"PassPipeline([{', '.join(_name(p) for p in self.passes)}])"


def _name(p: Any) -> str:
    return str(getattr(p, "name", type(p).__name__))


def _check_order(passes: list) -> None:
    rewriter: Optional[Any] = None
    for p in passes:
        if getattr(p, "needs_unsharded_placeholders", False) and rewriter is not None:
            what = "shards parameters" if getattr(rewriter, "shards_parameters", False) else "splits pipeline stages"
            raise PassOrderError(
                f"pass {_name(p)!r} (activation checkpointing) is placed after {_name(rewriter)!r}, which {what}; "
                f"run {_name(p)!r} first so its replays read the unsharded placeholders and "
                f"{_name(rewriter)!r} then rewrites originals and replays alike (docs/architecture.md)")
        if getattr(p, "shards_parameters", False) or getattr(p, "splits_stages", False):
            rewriter = rewriter or p
