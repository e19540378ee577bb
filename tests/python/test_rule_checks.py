"""Rules that gradients alone cannot see (issue 14, "tests that catch a broken rule").

A duplicate inserted too early still gives bitwise-equal gradients; it only
holds memory longer. So the rewritten FX graph itself is checked: every
duplicate sits right before its earliest backward consumer (the nodes between
them, if any, are other duplicates), not at the start of the backward.
(`getitem` copies of a recomputed tuple sit with the tuple's copy: aliases.)
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch

from hyper_ac import fx_meta, models
from hyper_ac.frontend.capture import capture_joint
from hyper_ac.lower.checkpoint_pass import ActivationCheckpointPass


def _consumers(node, is_dup):
    """Non-duplicate nodes reading `node`, directly or through other duplicates."""
    out, stack, seen = [], [node], {node}
    while stack:
        for user in stack.pop().users:
            if user in seen:
                continue
            seen.add(user)
            if is_dup(user):
                stack.append(user)
            else:
                out.append(user)
    return out


# auto on the small MLP recomputes nothing (the cut keeps every value at this
# size), so it has no duplicate to place; the transformer's auto plan does.
@pytest.mark.parametrize("name,mode", [("mlp", "full"), ("mlp", "selective"), ("transformer", "full"),
                                       ("transformer", "selective"), ("transformer", "auto")])
def test_each_duplicate_sits_right_before_its_earliest_backward_consumer(name, mode):
    model = models.build(name)
    batch = models.example_batch(name)
    gm = capture_joint(copy.deepcopy(model), **batch).graph_module
    ActivationCheckpointPass({"ac_mode": mode}).run(gm, model=model if name != "mlp" else None)
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    nodes = list(gm.graph.nodes)

    is_dup = fx_meta.is_duplicate
    duplicates = [n for n in nodes if is_dup(n)]
    assert duplicates, "the check needs duplicates to look at"
    first_backward = min(order[n] for n in nodes if fx_meta.is_backward(n) and not is_dup(n))
    late = 0
    for dup in duplicates:
        if dup.target is operator.getitem:
            # A projection of a recomputed tuple is placed with the tuple's copy
            # (an alias: it costs no memory); the tuple's copy is what is checked.
            assert is_dup(dup.args[0]) and order[dup.args[0]] < order[dup], f"{dup.name} is not after its tuple's copy"
            continue
        consumers = _consumers(dup, is_dup)
        assert consumers, f"duplicate {dup.name} has no reader"
        earliest = min(consumers, key=order.__getitem__)
        between = nodes[order[dup] + 1:order[earliest]]
        assert all(is_dup(n) for n in between), (
            f"duplicate {dup.name} (of {fx_meta.recomputed_from(dup)}) sits at {order[dup]}, but its earliest "
            f"backward consumer {earliest.name} is at {order[earliest]}: "
            f"{[n.name for n in between if not is_dup(n)][:5]} run in between"
        )
        late += order[earliest] > first_backward + len(duplicates)
    # The check must be able to fail: some duplicate is needed well after the backward starts.
    assert late > 0, "every consumer is at the start of the backward: this graph cannot tell placements apart"
