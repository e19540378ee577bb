"""The FX ``node.meta`` contract: every key hyper_ac reads or writes, one accessor each.

No other module spells a key (tests/python/test_fx_meta.py checks it): they
call the accessors, or, where a loop must stay lean, index ``node.meta`` with
the constants below. Every accessor has one default, stated in its docstring;
it is what a node without the key means.

Three owners:

* **torch writes, hyper_ac reads** (dynamo / AOTAutograd): :data:`VAL`,
  :data:`TENSOR_META`, :data:`DESC`, :data:`PARTITIONER_TAG`,
  :data:`NN_MODULE_STACK`, :data:`FWD_NN_MODULE_STACK`, :data:`SEQ_NR`,
  :data:`IS_GRADIENT_ACC`, :data:`STACK_TRACE`, :data:`OUTPUT_STACK_TRACES`.
* **shared with torch's checkpointing** (its partitioner and Inductor read
  them, ``torch.utils.checkpoint`` writes them): :data:`BACKWARD`
  (``autograd_backward``), :data:`RECOMPUTE` (a ``CheckpointPolicy``),
  :data:`AC_GRAPH_ID` (the checkpoint region of a tag).
* **hyper_ac's own** (``ac_`` prefix): :data:`MODULE_STACK`, :data:`ROLE`,
  :data:`SOURCE` (written by :func:`hyper_ac.frontend.annotate.annotate_joint`);
  :data:`RECOMPUTED`, :data:`RECOMPUTED_FROM`, :data:`DUPLICATE`,
  :data:`RNG_REPLAY`, :data:`RNG_REPLAY_OF` (written by
  :func:`hyper_ac.lower.apply.apply_plan`); and the ``gm.meta`` key
  :data:`PLACEHOLDERS_REWRITTEN_BY` (:mod:`hyper_ac.planning.pipeline`).
"""

from __future__ import annotations

from typing import Any, Optional

from torch import fx

__all__ = [
    "AC_GRAPH_ID", "BACKWARD", "BACKWARD_OUTPUT", "DESC", "DUPLICATE", "FWD_NN_MODULE_STACK", "IS_GRADIENT_ACC", "MODULE_STACK",
    "NN_MODULE_STACK", "OUTPUT_STACK_TRACES", "PARTITIONER_TAG", "PLACEHOLDERS_REWRITTEN_BY", "RECOMPUTE",
    "RECOMPUTED", "RECOMPUTED_FROM", "RNG_REPLAY", "RNG_REPLAY_OF", "ROLE", "ROLES", "SEQ_NR", "SOURCE",
    "STACK_TRACE", "TENSOR_META", "VAL", "VALUE_KEYS",
    "desc", "duplicate_index", "graph_id", "has_phase", "is_backward", "is_backward_output", "is_duplicate",
    "is_gradient_acc", "is_opaque",
    "is_rng_replay", "mark_duplicate", "mark_rng_replay", "module_stack", "partitioner_tag", "policy",
    "recomputed_from", "rng_replay_of", "role", "set_backward", "set_duplicate_index", "set_graph_id",
    "set_backward_output", "set_module_stack", "set_policy", "set_rng_replay_of", "set_role", "source", "user_tagged", "val",
]

# --------------------------------------------------------------------------
# keys
# --------------------------------------------------------------------------

# torch's, read only
VAL = "val"  #: the fake tensor (or SymInt, tuple of them) a node produces
TENSOR_META = "tensor_meta"  #: torch's TensorMetadata of that value
DESC = "desc"  #: AOTAutograd's input/output descriptors (placeholders, the output node)
PARTITIONER_TAG = "partitioner_tag"  #: is_forward / is_backward / must_be_in_forward / must_be_in_backward
NN_MODULE_STACK = "nn_module_stack"  #: dynamo's module stack (forward nodes)
FWD_NN_MODULE_STACK = "fwd_nn_module_stack"  #: the forward's stack, copied onto some backward nodes
SEQ_NR = "seq_nr"  #: autograd sequence number: links a backward node to its forward op
IS_GRADIENT_ACC = "is_gradient_acc"  #: a gradient accumulation (belongs to no forward op)
STACK_TRACE = "stack_trace"
OUTPUT_STACK_TRACES = "output_stack_traces"  #: the output node's per-output stack traces

# shared with torch's checkpointing
BACKWARD = "autograd_backward"  #: the phase: True in the backward
RECOMPUTE = "recompute"  #: a CheckpointPolicy: the node's save/recompute tag
AC_GRAPH_ID = "ac_graph_id"  #: the checkpoint region of a tag (torch.utils.checkpoint's counter)

# hyper_ac's own
BACKWARD_OUTPUT = "ac_backward_output"  #: True on a forward node the backward returns as it is (graph field)
MODULE_STACK = "ac_module_stack"  #: [(fqn, type_name), ...], innermost first, root left out
ROLE = "ac_role"  #: placeholders: one of ROLES
SOURCE = "ac_source"  #: parameter / buffer placeholders: the tensor's FQN in the model
RECOMPUTED = "ac_recomputed"  #: True on a duplicate (the backward copy of a recomputed node)
RECOMPUTED_FROM = "ac_recomputed_from"  #: a duplicate's original, by name
DUPLICATE = "ac_duplicate"  #: index in the plan's duplicates (a duplicate, or its private get_attr)
RNG_REPLAY = "ac_rng_replay"  #: True on a duplicate that replays a random op under the saved state
RNG_REPLAY_OF = "ac_rng_replay_of"  #: run_and_save_rng_state and its getitems: the random op they replace
PLACEHOLDERS_REWRITTEN_BY = "hyper_ac_placeholders_rewritten_by"  #: ``gm.meta``: passes that rewrote the inputs

#: The values of :data:`ROLE`.
ROLES = ("parameter", "buffer", "input", "tangent")
#: Keys that describe a node's value, not the op: a node computing another value leaves them behind.
VALUE_KEYS = (VAL, TENSOR_META)

# --------------------------------------------------------------------------
# phase
# --------------------------------------------------------------------------


def is_backward(node: fx.Node) -> bool:
    """Whether the node runs in the backward. Default ``False``: a node without
    the key is forward, as torch's own readers take it
    (``node.meta.get("autograd_backward", False)``). Every graph hyper_ac plans
    has the key on every node (:func:`has_phase`; ``ActivationCheckpointPass``
    refuses a graph without it), so the default only answers for unannotated
    graphs (the serialiser infers their phase instead: ``annotate.phase_of``)."""
    return bool(node.meta.get(BACKWARD, False))


def has_phase(node: fx.Node) -> bool:
    """Whether the node carries its phase (:data:`BACKWARD`). Default ``False``."""
    return node.meta.get(BACKWARD) is not None


def set_backward(node: fx.Node, backward: bool) -> None:
    node.meta[BACKWARD] = bool(backward)


def is_backward_output(node: fx.Node) -> bool:
    """Whether the step's backward returns this forward node's value as it is (a DTensor
    gradient's mesh is the forward's mesh placeholder; graph field ``backward_output``).
    Default ``False``."""
    return bool(node.meta.get(BACKWARD_OUTPUT, False))


def set_backward_output(node: fx.Node, returned: bool) -> None:
    if returned:
        node.meta[BACKWARD_OUTPUT] = True
    else:
        node.meta.pop(BACKWARD_OUTPUT, None)


def is_opaque(node: fx.Node) -> bool:
    """Whether the node's value is an opaque object, not a tensor (a DTensor's ``DeviceMesh``, a
    ``ProcessGroup``, a script object): aot_autograd's own test (graph field ``opaque``)."""
    from torch._functorch._aot_autograd.graph_compile import is_opaque_node

    return is_opaque_node(node)


# --------------------------------------------------------------------------
# checkpoint tags (torch.utils.checkpoint's and hyper_ac's)
# --------------------------------------------------------------------------


def policy(node: fx.Node) -> Any:
    """The node's save/recompute tag (a ``CheckpointPolicy``, as stored). Default ``None``: untagged."""
    return node.meta.get(RECOMPUTE)


def user_tagged(node: fx.Node) -> bool:
    """Whether the node carries a tag hyper_ac did not write on this graph: the
    model's own checkpointing (``torch.utils.checkpoint``, a selective-checkpoint
    policy, or a user writing ``meta["recompute"]``), which every mode honours.
    The test is a policy on the node, region id or not: that is what the
    serialiser hands the core as the node's ``policy``, and what the core's
    ``user_tagged`` statistic counts. Call it before hyper_ac writes its own tags
    (a graph hyper_ac already tagged and planned again is, to the core, tagged
    by its user). Default ``False``."""
    return node.meta.get(RECOMPUTE) is not None


def set_policy(node: fx.Node, value: Any) -> None:
    """Write a tag: a ``CheckpointPolicy`` or its name (``"MUST_SAVE"``); ``None`` removes it."""
    if value is None:
        node.meta.pop(RECOMPUTE, None)
        return
    if isinstance(value, str):
        from torch.utils.checkpoint import CheckpointPolicy

        value = CheckpointPolicy[value]
    node.meta[RECOMPUTE] = value


def graph_id(node: fx.Node) -> Optional[int]:
    """The checkpoint region of the node's tag: an int >= 0. Default ``None``:
    untagged, no region, or a region id that is not a non-negative int (an id
    means something only together with a tag)."""
    if node.meta.get(RECOMPUTE) is None:
        return None
    value = node.meta.get(AC_GRAPH_ID)
    return int(value) if isinstance(value, int) and value >= 0 else None


def set_graph_id(node: fx.Node, value: Optional[int]) -> None:
    """Write the region of the node's tag; ``None`` removes it."""
    if value is None:
        node.meta.pop(AC_GRAPH_ID, None)
    else:
        node.meta[AC_GRAPH_ID] = value


# --------------------------------------------------------------------------
# annotation (annotate_joint)
# --------------------------------------------------------------------------


def module_stack(node: fx.Node) -> list:
    """``[(fqn, type_name), ...]``, innermost first (the stored list, not a copy).
    Default ``[]``: the node sits in no module (unannotated, or the root's own op)."""
    return node.meta.get(MODULE_STACK) or []


def set_module_stack(node: fx.Node, stack: list) -> None:
    node.meta[MODULE_STACK] = stack


def role(node: fx.Node) -> Optional[str]:
    """A placeholder's role (one of :data:`ROLES`). Default ``None``: not a
    placeholder, or not annotated (the serialiser then guesses from the name)."""
    return node.meta.get(ROLE)


def source(node: fx.Node) -> Optional[str]:
    """A parameter / buffer placeholder's FQN in the model. Default ``None``: unknown, or another role."""
    return node.meta.get(SOURCE)


def set_role(node: fx.Node, value: str, source_fqn: Optional[str] = None) -> None:
    """Write a placeholder's role and its source FQN (``None`` removes a stale one)."""
    if value not in ROLES:
        raise ValueError(f"unknown role {value!r} for {node.name} (expected one of {', '.join(ROLES)})")
    node.meta[ROLE] = value
    if source_fqn is None:
        node.meta.pop(SOURCE, None)
    else:
        node.meta[SOURCE] = source_fqn


# --------------------------------------------------------------------------
# what apply_plan makes
# --------------------------------------------------------------------------


def is_duplicate(node: fx.Node) -> bool:
    """Whether the node is a duplicate (the backward copy of a recomputed node). Default ``False``."""
    return bool(node.meta.get(RECOMPUTED, False))


def recomputed_from(node: fx.Node) -> Optional[str]:
    """A duplicate's original, by name (a node stored there is read as its name). Default ``None``."""
    value = node.meta.get(RECOMPUTED_FROM)
    if value is None:
        return None
    return value.name if isinstance(value, fx.Node) else str(value)


def duplicate_index(node: fx.Node) -> Optional[int]:
    """The index in the plan's duplicates of a duplicate, or of a duplicate's
    private ``get_attr``. Default ``None``: not made by ``apply_plan`` for a duplicate."""
    return node.meta.get(DUPLICATE)


def mark_duplicate(node: fx.Node, original: str, index: int) -> None:
    """Mark ``node`` as duplicate ``index`` of the plan, a backward copy of
    ``original``. Its tag goes: a second pass must not take a duplicate for a candidate."""
    meta = node.meta
    meta.pop(RECOMPUTE, None)
    meta[BACKWARD] = True
    meta[RECOMPUTED] = True
    meta[RECOMPUTED_FROM] = original
    meta[DUPLICATE] = index


def set_duplicate_index(node: fx.Node, index: int) -> None:
    """A private ``get_attr`` of duplicate ``index`` (a backward node the split files with it)."""
    node.meta[BACKWARD] = True
    node.meta[DUPLICATE] = index


def is_rng_replay(node: fx.Node) -> bool:
    """Whether the duplicate replays a random op under its saved generator state. Default ``False``."""
    return bool(node.meta.get(RNG_REPLAY, False))


def mark_rng_replay(node: fx.Node) -> None:
    node.meta[RNG_REPLAY] = True


def rng_replay_of(node: fx.Node) -> Optional[str]:
    """The random op whose forward call this node (``run_and_save_rng_state`` or
    one of its getitems) replaces, by name. Default ``None``."""
    return node.meta.get(RNG_REPLAY_OF)


def set_rng_replay_of(node: fx.Node, original: str) -> None:
    node.meta[RNG_REPLAY_OF] = original


# --------------------------------------------------------------------------
# torch's facts
# --------------------------------------------------------------------------


def val(node: fx.Node) -> Any:
    """The fake value the node produces. Default ``None`` (an ``output`` node, a graph without fake values)."""
    return node.meta.get(VAL)


def desc(node: fx.Node) -> Any:
    """AOTAutograd's descriptor (a placeholder's) or descriptor list (the output node's). Default ``None``."""
    return node.meta.get(DESC)


def partitioner_tag(node: fx.Node) -> Optional[str]:
    """AOTAutograd's phase tag. Default ``None`` (a graph not made by AOTAutograd's joint trace)."""
    return node.meta.get(PARTITIONER_TAG)


def is_gradient_acc(node: fx.Node) -> bool:
    """Whether the backward node accumulates gradients. Default ``False``."""
    return bool(node.meta.get(IS_GRADIENT_ACC, False))
