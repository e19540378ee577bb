"""Tests for hyper_ac.eager: checkpoint, handles/prefire/sessions, exclude wrapper.

Every numeric check compares with an uncheckpointed run using torch.equal;
replay counts are exact.  CPU only.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_ckpt
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

from hyper_ac import eager
from hyper_ac.eager import (
    checkpoint,
    checkpoint_exclude_wrapper,
    clear_recompute_session,
    recompute_handle,
    recompute_handle_collector_ctx,
    recompute_session_ctx,
)
from hyper_ac.eager import _exclude, _session


# --------------------------------------------------------------------------
# helpers


@pytest.fixture(autouse=True)
def _no_leftover_sessions():
    yield
    leftover = _session.live_session_ids()
    for sid in leftover:
        clear_recompute_session(sid)
    assert leftover == [], f"test left sessions behind: {leftover}"


class Block(torch.nn.Module):
    """Linear -> gelu -> dropout -> Linear, with a call counter."""

    def __init__(self, dim: int = 16, p: float = 0.0) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, 2 * dim)
        self.fc2 = torch.nn.Linear(2 * dim, dim)
        self.p = p
        self.calls = 0

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.calls += 1
        h = F.dropout(F.gelu(self.fc1(x)), self.p, training=True)
        return self.fc2(h).tanh() * scale


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


def _assert_all_equal(got, want):
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"gradient {index} differs"


def _make(seed: int = 0, p: float = 0.0, dim: int = 16):
    torch.manual_seed(seed)
    block = Block(dim, p)
    x = torch.randn(8, dim, requires_grad=True)
    return block, x, [x, *block.parameters()]


def _dx_dw(loss, x, weights):
    """Input gradients, then weight gradients, of one loss (the dx / dw split)."""
    return torch.autograd.grad(loss, [x], retain_graph=True), torch.autograd.grad(loss, weights)


class _StorageMeter(TorchDispatchMode):
    """Bytes of storages created under the mode that are still alive.

    Fallback for hyper_ac.memory.track() where the _memory extension is not
    built: a storage created by an operator inside the block and still alive
    is resident.  Storages of ``ignore`` tensors (parameters, inputs) existed
    before and are not counted.
    """

    def __init__(self, ignore=()) -> None:
        super().__init__()
        self.ignore = {StorageWeakRef(t.untyped_storage()).cdata for t in ignore}
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                ref = StorageWeakRef(storage)
                if ref.cdata not in self.ignore:
                    self.refs.setdefault(ref.cdata, (ref, storage.nbytes()))
        return out

    @property
    def current_bytes(self) -> int:
        return sum(n for ref, n in self.refs.values() if not ref.expired())


def _track_available() -> bool:
    try:
        from hyper_ac import memory
    except ImportError:
        return False
    return memory.is_available()


# "track": hyper_ac.memory.track() (LibTorch counting allocator), used where
# the extension is built; "storages": the dispatch-mode meter above, always.
METERS = ["storages"] + (["track"] if _track_available() else [])


def _meter(kind: str, ignore=()):
    """Context manager yielding an object whose current_bytes are live bytes
    allocated inside the block (frozen at exit for "track")."""
    if kind == "track":
        from hyper_ac import memory
        return memory.track()
    return _StorageMeter(ignore=ignore)


# --------------------------------------------------------------------------
# checkpoint: PyTorch non-reentrant semantics


def test_gradients_equal_uncheckpointed_and_one_replay():
    block, x, params = _make()
    want = _grads(block(x, scale=0.5).square().mean(), params)
    block.calls = 0
    out = checkpoint(block, x, scale=0.5)
    assert block.calls == 1
    got = _grads(out.square().mean(), params)
    assert block.calls == 2
    _assert_all_equal(got, want)


def test_matches_torch_checkpoint():
    block, x, params = _make()
    loss = torch_ckpt.checkpoint(block, x, use_reentrant=False).sum()
    want = _grads(loss, params)
    got = _grads(checkpoint(block, x).sum(), params)
    _assert_all_equal(got, want)


def test_no_grad_forward_just_runs():
    block, x, _ = _make()
    with torch.no_grad():
        out = checkpoint(block, x)
    assert out.grad_fn is None and block.calls == 1


def test_multiple_backwards_replay_per_backward():
    block, x, params = _make()
    ref = block(x).sum()
    ref.backward(retain_graph=True)
    ref.backward()
    want = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    block.calls = 0
    out = checkpoint(block, x).sum()
    out.backward(retain_graph=True)
    out.backward()
    assert block.calls == 3  # forward + one replay per backward, as in PyTorch
    _assert_all_equal([p.grad for p in params], want)


@pytest.mark.parametrize("grouped", [False, True])
def test_graph_exec_group_shares_one_replay_like_pytorch(grouped):
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    calls = {"fn": 0}

    def fn(t):
        calls["fn"] += 1
        return lin1(t).sin(), lin2(t).cos()

    want1 = _grads(fn(x)[0].sum(), [lin1.weight])
    want2 = _grads(fn(x)[1].sum(), [lin2.weight])
    calls["fn"] = 0
    a, b = checkpoint(fn, x)
    group = torch_ckpt.GraphExecGroup() if grouped else contextlib.nullcontext()
    with group:  # two backward passes over disjoint saved tensors
        got1 = _grads(a.sum(), [lin1.weight])
        got2 = _grads(b.sum(), [lin2.weight])
    assert calls["fn"] == (2 if grouped else 3)
    _assert_all_equal(got1, want1)
    _assert_all_equal(got2, want2)


def test_overlapping_backwards_in_graph_exec_group_raise_like_pytorch():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    for ckpt in (functools.partial(torch_ckpt.checkpoint, use_reentrant=False), checkpoint):
        loss = ckpt(lambda t: lin(t).sin(), x).sum()
        with torch_ckpt.GraphExecGroup():
            torch.autograd.grad(loss, [x], retain_graph=True)
            with pytest.raises(RuntimeError, match="unpacked"):
                torch.autograd.grad(loss, [lin.weight])


def test_nested_checkpoints_match_pytorch():
    def run(ckpt):
        torch.manual_seed(0)
        lin = torch.nn.Linear(6, 6)
        counts = {"inner": 0, "outer": 0}

        def inner(h):
            counts["inner"] += 1
            return lin(h).tanh()

        def outer(x):
            counts["outer"] += 1
            return ckpt(inner, x.sin()).cos()

        x = torch.randn(3, 6, requires_grad=True)
        grads = _grads(ckpt(outer, x).sum(), [x, lin.weight, lin.bias])
        return counts, grads

    torch_counts, torch_grads = run(functools.partial(torch_ckpt.checkpoint, use_reentrant=False))
    counts, grads = run(checkpoint)
    plain_counts, plain_grads = run(lambda fn, *a: fn(*a))
    assert counts == torch_counts == {"inner": 3, "outer": 2}
    _assert_all_equal(grads, plain_grads)
    _assert_all_equal(grads, torch_grads)


def test_early_stop_is_per_call():
    lin = torch.nn.Linear(4, 4)
    tail = {"stop": 0, "full": 0}

    def make_fn(name):
        def fn(x):
            y = lin(x).sin()  # last tensor saved for backward
            tail[name] += 1  # runs after the last save
            return y
        return fn

    x = torch.randn(2, 4, requires_grad=True)
    a = checkpoint(make_fn("stop"), x, early_stop=True)
    b = checkpoint(make_fn("full"), x, early_stop=False)
    (a + b).sum().backward()
    assert tail == {"stop": 1, "full": 2}


@pytest.mark.parametrize("bad", [1, "yes"])
def test_early_stop_must_be_bool(bad):
    # None is valid: it means "follow torch.utils.checkpoint.set_checkpoint_early_stop".
    with pytest.raises(ValueError, match="early_stop must be a bool or None"):
        checkpoint(torch.sin, torch.randn(2), early_stop=bad)


def test_bad_determinism_check_value():
    with pytest.raises(ValueError, match="determinism_check"):
        checkpoint(torch.sin, torch.randn(2), determinism_check="strict")


def test_determinism_check_reports_different_shapes():
    state = {"n": 4}

    def fn(x):
        n = state["n"]
        state["n"] = 3  # the replay sees a different slice
        return (x[:n] * 2).exp().sum()

    x = torch.randn(5, requires_grad=True)
    out = checkpoint(fn, x)
    with pytest.raises(torch_ckpt.CheckpointError,
                       match=r"(?s)different metadata.*torch.Size\(\[4\]\).*torch.Size\(\[3\]\)"):
        out.backward()


def test_determinism_check_reports_different_number_of_saves():
    state = {"extra": False}

    def fn(x):
        y = x.sin()
        if state["extra"]:
            y = y.cos()
        state["extra"] = True
        return y

    x = torch.randn(3, requires_grad=True)
    out = checkpoint(fn, x, early_stop=False, determinism_check="none").sum()
    with pytest.raises(RuntimeError, match="more tensors"):
        out.backward()


def test_dropout_same_gradients_and_rng_as_uncheckpointed():
    block, x, params = _make(p=0.5)
    torch.manual_seed(7)
    want = _grads(block(x).square().mean(), params)
    after_want = torch.rand(3)
    torch.manual_seed(7)
    got = _grads(checkpoint(block, x).square().mean(), params)
    after_got = torch.rand(3)  # the replay did not move the caller's RNG
    _assert_all_equal(got, want)
    assert torch.equal(after_got, after_want)


def test_autocast_state_restored_in_replay():
    block, x, params = _make()
    seen = []

    def fn(inp):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return block(inp)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = fn(x)
    want = _grads(ref.float().square().mean(), params)
    seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = checkpoint(fn, x)
    assert out.dtype == torch.bfloat16
    got = _grads(out.float().square().mean(), params)  # backward outside autocast
    assert seen == [(True, torch.bfloat16)] * 2
    _assert_all_equal(got, want)


def test_kwargs_and_non_tensor_args():
    lin = torch.nn.Linear(3, 3)

    def fn(x, k, *, bias, mode="add"):
        y = lin(x) * k
        return y + bias if mode == "add" else y - bias

    x = torch.randn(2, 3, requires_grad=True)
    bias = torch.randn(3, requires_grad=True)
    want = _grads(fn(x, 3, bias=bias, mode="sub").sum(), [x, bias, lin.weight])
    got = _grads(checkpoint(fn, x, 3, bias=bias, mode="sub").sum(), [x, bias, lin.weight])
    _assert_all_equal(got, want)


class _CountMM(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.mm += 1
        return func(*args, **(kwargs or {}))


def _sac_context_fn():
    policy = [torch.ops.aten.addmm.default, torch.ops.aten.mm.default]
    return functools.partial(torch_ckpt.create_selective_checkpoint_contexts, policy)


def test_selective_checkpoint_context_fn_saves_matmuls():
    block, x, params = _make()

    def backward_mm(run):
        loss = run().square().mean()
        with _CountMM() as counter:
            grads = _grads(loss, params)
        return counter.mm, grads

    base_mm, want = backward_mm(lambda: block(x))
    full_mm, full = backward_mm(lambda: checkpoint(block, x))
    sac_mm, got = backward_mm(lambda: checkpoint(block, x, context_fn=_sac_context_fn()))
    assert full_mm == base_mm + 2  # both Linear layers replayed
    assert sac_mm == base_mm  # saved by the policy, not replayed
    _assert_all_equal(full, want)
    _assert_all_equal(got, want)


def test_falls_back_to_torch_checkpoint_under_compile():
    torch._dynamo.reset()
    lin = torch.nn.Linear(4, 4)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def model(x):
        return checkpoint(lambda t: lin(t).relu().sin(), x).sum()

    x = torch.randn(3, 4, requires_grad=True)
    with recompute_handle_collector_ctx() as handles:
        out = torch.compile(model, backend=backend, fullgraph=True)(x)
    got = _grads(out, [x, lin.weight])
    want = _grads(lin(x).relu().sin().sum(), [x, lin.weight])
    _assert_all_equal(got, want)
    targets = {str(n.target) for g in graphs for n in g.graph.nodes}
    assert any("tag_activation_checkpoint" in t for t in targets), targets
    assert handles == []


# --------------------------------------------------------------------------
# handles, prefire, sessions


def test_collector_three_blocks_three_handles():
    torch.manual_seed(0)
    blocks = [Block() for _ in range(3)]
    x = torch.randn(4, 16, requires_grad=True)
    with recompute_handle_collector_ctx() as handles:
        h = x
        for block in blocks:
            h = checkpoint(block, h)
    assert len(handles) == 3
    assert all(isinstance(handle, eager.RecomputeHandle) for handle in handles)
    assert len({id(handle) for handle in handles}) == 3
    try:
        for handle in handles:
            recompute_handle(handle, "mb0")
        h.sum().backward()
    finally:
        clear_recompute_session("mb0")
    assert [block.calls for block in blocks] == [2, 2, 2]


def test_dx_then_dw_share_one_prefired_replay():
    block, x, params = _make(p=0.3)
    weights = params[1:]
    torch.manual_seed(3)
    want_dx, want_dw = _dx_dw(block(x).square().mean(), x, weights)

    block.calls = 0
    torch.manual_seed(3)
    with recompute_handle_collector_ctx() as handles:
        loss = checkpoint(block, x).square().mean()
    sid = ("micro_batch", 0)
    try:
        with recompute_session_ctx(sid, retain_on_unpack=True):
            for handle in handles:
                recompute_handle(handle, sid)
        assert block.calls == 2
        with recompute_session_ctx(sid, retain_on_unpack=True):
            dx = torch.autograd.grad(loss, [x], retain_graph=True)
        with recompute_session_ctx(sid, retain_on_unpack=False):
            dw = torch.autograd.grad(loss, weights)
    finally:
        clear_recompute_session(sid)
    assert block.calls == 2  # forward + exactly one replay
    _assert_all_equal(dx, want_dx)
    _assert_all_equal(dw, want_dw)


def test_prefire_then_plain_backward_does_not_replay_again():
    block, x, params = _make()
    want = _grads(block(x).sum(), params)
    block.calls = 0
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(block, x).sum()
    try:
        recompute_handle(handles[0], "s")
        recompute_handle(handles[0], "s")  # prefiring twice is a no-op
        assert block.calls == 2
        got = _grads(out, params)
    finally:
        clear_recompute_session("s")
    assert block.calls == 2
    _assert_all_equal(got, want)


def test_session_without_prefire_replays_per_backward():
    block, x, params = _make()
    out = checkpoint(block, x).sum()
    try:
        with recompute_session_ctx("s", retain_on_unpack=True):
            out.backward(retain_graph=True)
        with recompute_session_ctx("s"):
            out.backward()
    finally:
        clear_recompute_session("s")
    assert block.calls == 3


def test_two_micro_batches_two_sessions():
    block, x, params = _make()
    x1 = torch.randn_like(x, requires_grad=True)
    want0 = _grads(block(x).sum(), params)
    want1 = _grads(block(x1).sum(), [x1, *params[1:]])
    block.calls = 0
    with recompute_handle_collector_ctx() as h0:
        out0 = checkpoint(block, x).sum()
    with recompute_handle_collector_ctx() as h1:
        out1 = checkpoint(block, x1).sum()
    try:
        recompute_handle(h1[0], 1)
        recompute_handle(h0[0], 0)
        with recompute_session_ctx(1):
            got1 = _grads(out1, [x1, *params[1:]])
        with recompute_session_ctx(0):
            got0 = _grads(out0, params)
    finally:
        clear_recompute_session(0)
        clear_recompute_session(1)
    assert block.calls == 4
    _assert_all_equal(got0, want0)
    _assert_all_equal(got1, want1)


@pytest.mark.parametrize("meter", METERS)
def test_clear_frees_replayed_tensors_and_is_idempotent(meter):
    block, x, params = _make()
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(block, x).sum()
    with _meter(meter, ignore=params) as resident:
        recompute_handle(handles[0], "s")
        held = resident.current_bytes
        clear_recompute_session("s")
        after = resident.current_bytes
    assert held > 0
    assert after == 0
    clear_recompute_session("s")  # idempotent
    clear_recompute_session("never-used")
    # after clearing, the frame is an ordinary checkpoint again
    _grads(out, params)
    assert block.calls == 3


def test_session_id_reusable_after_exception():
    block, x, params = _make()
    want = _grads(block(x).sum(), params)
    block.calls = 0
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(block, x).sum()
    with pytest.raises(KeyError):
        try:
            with recompute_session_ctx("s", retain_on_unpack=True):
                recompute_handle(handles[0], "s")
                raise KeyError("scheduler failed")
        finally:
            clear_recompute_session("s")
            clear_recompute_session("s")
    assert _session.live_session_ids() == []
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(block, x).sum()
    try:
        with recompute_session_ctx("s"):
            recompute_handle(handles[0], "s")
            got = _grads(out, params)
    finally:
        clear_recompute_session("s")
    assert block.calls == 4  # two forwards, two prefires, nothing else
    _assert_all_equal(got, want)


def test_unpack_on_worker_thread_finds_session_without_lock_or_contextvar():
    block, x, params = _make()
    weights = params[1:]
    want_dx, want_dw = _dx_dw(block(x).square().mean(), x, weights)
    block.calls = 0
    with recompute_handle_collector_ctx() as handles:
        loss = checkpoint(block, x).square().mean()
    result = {}

    def worker():
        # A fresh thread starts with an empty contextvars context.
        result["session_seen_by_context"] = _session.active_session_id()
        result["dx"] = torch.autograd.grad(loss, [x], retain_graph=True)

    try:
        recompute_handle(handles[0], "s")
        with recompute_session_ctx("s", retain_on_unpack=True):
            # Hold the control-plane lock while the worker unpacks: an unpack
            # that needed it would block here.
            with _session._CONTROL_LOCK:
                thread = threading.Thread(target=worker)
                thread.start()
                thread.join(timeout=30)
                assert not thread.is_alive(), "unpack blocked on the control-plane lock"
        with recompute_session_ctx("s", retain_on_unpack=False):
            dw = torch.autograd.grad(loss, weights)
    finally:
        clear_recompute_session("s")
    assert result["session_seen_by_context"] is None
    assert block.calls == 2  # the worker's and the caller's backward used the prefire
    _assert_all_equal(result["dx"], want_dx)
    _assert_all_equal(dw, want_dw)


def test_selective_checkpoint_with_prefired_session():
    block, x, params = _make()
    weights = params[1:]
    want_dx, want_dw = _dx_dw(block(x).square().mean(), x, weights)
    block.calls = 0
    with recompute_handle_collector_ctx() as handles:
        loss = checkpoint(block, x, context_fn=_sac_context_fn()).square().mean()
    try:
        recompute_handle(handles[0], "s")
        with recompute_session_ctx("s", retain_on_unpack=True):
            dx = torch.autograd.grad(loss, [x], retain_graph=True)
        with recompute_session_ctx("s"):
            dw = torch.autograd.grad(loss, weights)
    finally:
        clear_recompute_session("s")
    assert block.calls == 2
    _assert_all_equal(dx, want_dx)
    _assert_all_equal(dw, want_dw)


def test_prefire_does_not_move_caller_rng_and_restores_autocast():
    block, x, params = _make(p=0.5)
    torch.manual_seed(11)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = block(x)
    want = _grads(ref.float().sum(), params)
    torch.manual_seed(11)
    with recompute_handle_collector_ctx() as handles:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(block, x)
    state = torch.get_rng_state()
    try:
        recompute_handle(handles[0], "s")  # outside autocast
        assert torch.equal(torch.get_rng_state(), state)
        got = _grads(out.float().sum(), params)
    finally:
        clear_recompute_session("s")
    _assert_all_equal(got, want)


@pytest.mark.parametrize("sid", [None, [1, 2], {"a": 1}])
def test_invalid_session_ids(sid):
    with pytest.raises(ValueError, match="session id"):
        with recompute_session_ctx(sid):
            pass
    with pytest.raises(ValueError, match="session id"):
        clear_recompute_session(sid)
    with recompute_handle_collector_ctx() as handles:
        checkpoint(torch.sin, torch.randn(2, requires_grad=True))
    with pytest.raises(ValueError, match="session id"):
        recompute_handle(handles[0], sid)


@pytest.mark.parametrize("bad", [1, None, "false"])
def test_retain_on_unpack_must_be_bool(bad):
    with pytest.raises(ValueError, match="retain_on_unpack must be a bool"):
        with recompute_session_ctx("s", retain_on_unpack=bad):
            pass


@pytest.mark.parametrize("bad", [None, object(), "handle", 3])
def test_invalid_handle(bad):
    with pytest.raises(ValueError, match="handle"):
        recompute_handle(bad, "s")


def test_sessions_do_not_nest():
    with recompute_session_ctx("a"):
        with pytest.raises(RuntimeError, match="do not nest"):
            with recompute_session_ctx("b"):
                pass
        with pytest.raises(RuntimeError, match="do not nest"):
            with recompute_session_ctx("a"):
                pass
    clear_recompute_session("a")


def test_prefire_for_other_session_is_rejected():
    block, x, _ = _make()
    with recompute_handle_collector_ctx() as handles:
        checkpoint(block, x)
    try:
        with recompute_session_ctx("a"):
            with pytest.raises(RuntimeError, match="inside recompute_session_ctx"):
                recompute_handle(handles[0], "b")
        recompute_handle(handles[0], "a")
        with pytest.raises(RuntimeError, match="already bound"):
            recompute_handle(handles[0], "b")
    finally:
        clear_recompute_session("a")
        clear_recompute_session("b")


def test_second_unpack_in_non_retaining_session_raises():
    block, x, params = _make()
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(block, x).sum()
    try:
        recompute_handle(handles[0], "s")
        with recompute_session_ctx("s", retain_on_unpack=False):
            out.backward(retain_graph=True)
            with pytest.raises(RuntimeError, match="already consumed in recompute session 's'"):
                out.backward()
    finally:
        clear_recompute_session("s")


def test_nested_checkpoint_during_scheduled_replay_raises():
    lin = torch.nn.Linear(4, 4)

    def outer(x):
        return checkpoint(lambda t: lin(t).sin(), x.cos()).exp()

    x = torch.randn(2, 4, requires_grad=True)
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(outer, x).sum()
    assert len(handles) == 2  # outer and inner
    try:
        with pytest.raises(RuntimeError, match="nested checkpoint"):
            recompute_handle(handles[0], "s")
        # the failed prefire left nothing bound: a normal backward still works
        got = _grads(out, [x, lin.weight])
    finally:
        clear_recompute_session("s")
    want = _grads(lin(x.cos()).sin().exp().sum(), [x, lin.weight])
    _assert_all_equal(got, want)


def test_prefire_inner_checkpoint_of_nested_pair():
    lin = torch.nn.Linear(4, 4)
    calls = {"inner": 0}

    def inner(t):
        calls["inner"] += 1
        return lin(t).sin()

    def outer(x):
        return checkpoint(inner, x.cos()).exp()

    x = torch.randn(2, 4, requires_grad=True)
    want = _grads(lin(x.cos()).sin().exp().sum(), [x, lin.weight])
    with recompute_handle_collector_ctx() as handles:
        out = checkpoint(outer, x).sum()
    try:
        recompute_handle(handles[1], "s")
        got = _grads(out, [x, lin.weight])
    finally:
        clear_recompute_session("s")
    _assert_all_equal(got, want)


def test_inert_handle_for_no_grad_checkpoint():
    with recompute_handle_collector_ctx() as handles:
        with torch.no_grad():
            checkpoint(torch.sin, torch.randn(3))
    assert len(handles) == 1
    recompute_handle(handles[0], "s")  # nothing to replay
    clear_recompute_session("s")


# --------------------------------------------------------------------------
# checkpoint_exclude_wrapper


class GroupedLinear(torch.nn.Module):
    """Grouped matmul (torch._grouped_mm) over equal-sized row groups."""

    def __init__(self, groups: int, k: int, n: int, rows_per_group: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(groups, k, n) * 0.1)
        offs = torch.arange(1, groups + 1, dtype=torch.int32) * rows_per_group
        self.register_buffer("offs", offs)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch._grouped_mm(x, self.weight, offs=self.offs)


class PlainLinear(torch.nn.Linear):
    def __init__(self, k: int, n: int) -> None:
        super().__init__(k, n, bias=False)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


def _moe_setup(kind: str):
    torch.manual_seed(0)
    norm = torch.nn.RMSNorm(32)
    mm = GroupedLinear(4, 32, 48, rows_per_group=16) if kind == "grouped" else PlainLinear(32, 48)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(64, 32, requires_grad=True)
    return norm, mm, x, [x, norm.weight, *mm.parameters()]


def _forward_resident(meter, run, ignore):
    with _meter(meter, ignore=ignore) as resident:
        out = run()
    return out, resident.current_bytes


@pytest.mark.parametrize("meter", METERS)
@pytest.mark.parametrize("kind", ["grouped", "plain"])
def test_exclude_runs_once_matches_baseline_and_drops_input(kind, meter):
    norm, mm, x, params = _moe_setup(kind)
    ignore = [*params, *mm.buffers()]
    want = _grads(mm(norm(x)).square().mean(), params)

    results = {}
    for mode in ("optimized", "legacy", "recompute"):
        if mode == "recompute":
            layer = mm
        else:
            layer = checkpoint_exclude_wrapper(mm, optimize_inputs=(mode == "optimized"))
        mm.calls = 0
        calls = {"fn": 0}

        def block(inp, layer=layer):
            calls["fn"] += 1
            return layer(norm(inp)).square().mean()

        loss, resident = _forward_resident(meter, lambda: checkpoint(block, x), ignore)
        grads = _grads(loss, params)
        results[mode] = (resident, mm.calls, calls["fn"], grads)

    h_bytes = 64 * 32 * 4  # the RMSNorm output = the matmul's input
    out_bytes = 64 * 48 * 4  # the matmul output, cached by the exclude wrapper
    for mode, (resident, mm_calls, fn_calls, grads) in results.items():
        _assert_all_equal(grads, want)
        assert fn_calls == 2, mode
        assert mm_calls == (2 if mode == "recompute" else 1), mode
    assert results["legacy"][0] - results["optimized"][0] == h_bytes
    assert results["optimized"][0] - results["recompute"][0] == out_bytes


@pytest.mark.parametrize("meter", METERS)
def test_exclude_view_input_falls_back(meter):
    norm, mm, x, params = _moe_setup("plain")
    ignore = [*params]
    want = _grads(mm(norm(x)).square().mean(), params)

    resident = {}
    for optimize in (True, False):
        layer = checkpoint_exclude_wrapper(mm, optimize_inputs=optimize)
        mm.calls = 0

        def block(inp, layer=layer):
            h = norm(inp).t()  # a view reaches the excluded module
            return layer(h.t()).square().mean()

        loss, resident[optimize] = _forward_resident(meter, lambda: checkpoint(block, x), ignore)
        _assert_all_equal(_grads(loss, params), want)
        assert mm.calls == 1
    assert resident[True] == resident[False]  # not optimised, still correct


def test_two_consecutive_excluded_modules():
    torch.manual_seed(0)
    norm = torch.nn.RMSNorm(16)
    first, second = PlainLinear(16, 24), PlainLinear(24, 16)
    x = torch.randn(8, 16, requires_grad=True)
    params = [x, norm.weight, first.weight, second.weight]
    ex1, ex2 = checkpoint_exclude_wrapper(first), checkpoint_exclude_wrapper(second)

    # back to back: the second wrapper's input is the first one's output
    def adjacent(inp, a, b):
        return b(a(norm(inp))).relu()

    # with an op in between
    def separated(inp, a, b):
        return b(a(norm(inp)).relu())

    for body in (adjacent, separated):
        want = _grads(body(x, first, second).square().mean(), params)
        first.calls = second.calls = 0
        calls = {"fn": 0}

        def block(inp, body=body):
            calls["fn"] += 1
            return body(inp, ex1, ex2)

        got = _grads(checkpoint(block, x).square().mean(), params)
        assert (first.calls, second.calls, calls["fn"]) == (1, 1, 2), body.__name__
        _assert_all_equal(got, want)


def test_exclude_same_wrapper_twice_is_fifo():
    torch.manual_seed(0)
    shared = PlainLinear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    params = [x, shared.weight]
    want = _grads(shared(shared(x.sin()).cos()).square().sum(), params)
    ex = checkpoint_exclude_wrapper(shared)
    shared.calls = 0
    got = _grads(checkpoint(lambda t: ex(ex(t.sin()).cos()), x).square().sum(), params)
    assert shared.calls == 2  # once per call site, never replayed
    _assert_all_equal(got, want)


def test_exclude_at_the_end_of_the_checkpoint():
    # Nothing after the excluded module is saved by the checkpoint, so only
    # the replay boundary makes the replay reach the wrapper.
    norm, mm, x, params = _moe_setup("plain")
    want = _grads(mm(norm(x)).square().mean(), params)
    ex = checkpoint_exclude_wrapper(mm)
    mm.calls = 0
    got = _grads(checkpoint(lambda t: ex(norm(t)), x).square().mean(), params)
    assert mm.calls == 1
    _assert_all_equal(got, want)


@pytest.mark.parametrize("kind", ["grouped", "plain"])
def test_exclude_with_prefired_dx_dw_session(kind):
    norm, mm, x, params = _moe_setup(kind)
    weights = params[1:]
    want_dx, want_dw = _dx_dw(mm(norm(x)).square().mean(), x, weights)
    ex = checkpoint_exclude_wrapper(mm)
    mm.calls = 0
    calls = {"fn": 0}

    def block(inp):
        calls["fn"] += 1
        return ex(norm(inp)).square().mean()

    with recompute_handle_collector_ctx() as handles:
        loss = checkpoint(block, x)
    try:
        with recompute_session_ctx("s", retain_on_unpack=True):
            recompute_handle(handles[0], "s")
            dx = torch.autograd.grad(loss, [x], retain_graph=True)
        with recompute_session_ctx("s", retain_on_unpack=False):
            dw = torch.autograd.grad(loss, weights)
    finally:
        clear_recompute_session("s")
    assert (calls["fn"], mm.calls) == (2, 1)
    _assert_all_equal(dx, want_dx)
    _assert_all_equal(dw, want_dw)


def test_exclude_keeps_rng_stream_of_skipped_body():
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    x = torch.randn(6, 8, requires_grad=True)
    params = [x, lin1.weight, lin2.weight]

    def excluded(h):
        return F.dropout(lin1(h), 0.5, training=True)

    def block(inp, layer):
        return F.dropout(lin2(layer(inp.sin())), 0.5, training=True)

    torch.manual_seed(5)
    want = _grads(block(x, excluded).square().sum(), params)
    torch.manual_seed(5)
    ex = checkpoint_exclude_wrapper(excluded)
    got = _grads(checkpoint(block, x, ex).square().sum(), params)
    _assert_all_equal(got, want)


def test_exclude_unpack_before_replay_raises():
    class Leaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, h):
            inner = h @ self.weight  # saves h
            self.inner = inner  # escapes without the replay boundary
            return inner * 2

    leaky = Leaky()
    ex = checkpoint_exclude_wrapper(leaky)
    x = torch.randn(3, 4, requires_grad=True)
    checkpoint(lambda t: ex(t.sin()).cos(), x)
    with pytest.raises(RuntimeError, match="replay has not reached this module"):
        leaky.inner.sum().backward()


def test_exclude_inplace_before_save_falls_back():
    torch.manual_seed(0)
    lin = PlainLinear(4, 4)

    def body(h):
        h.mul_(2)  # modified in place before Linear saves it
        return lin(h)

    x = torch.randn(3, 4, requires_grad=True)
    want = _grads(body(x.sin()).square().sum(), [x, lin.weight])
    ex = checkpoint_exclude_wrapper(body)
    got = _grads(checkpoint(lambda t: ex(t.sin()), x).square().sum(), [x, lin.weight])
    _assert_all_equal(got, want)


def test_exclude_outside_checkpoint_is_transparent():
    torch.manual_seed(0)
    lin = PlainLinear(4, 4)
    ex = checkpoint_exclude_wrapper(lin)
    x = torch.randn(2, 4, requires_grad=True)
    assert torch.equal(ex(x), lin(x))
    assert [name for name, _ in ex.named_parameters()] == ["module.weight"]


def test_exclude_rejects_selective_context_fn():
    ex = checkpoint_exclude_wrapper(PlainLinear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="context_fn"):
        checkpoint(lambda t: ex(t), x, context_fn=_sac_context_fn())


def test_deferred_input_object():
    deferred = _exclude._DeferredInput()
    with pytest.raises(RuntimeError, match="replay has not reached"):
        deferred.get()
    t = torch.ones(2)
    deferred.bind(t)
    assert deferred.get() is t


# --------------------------------------------------------------------------
# drop-in parity with torch.utils.checkpoint (see also test_eager_torch_parity.py)


def _tail_counter():
    lin = torch.nn.Linear(4, 4)
    calls = {"n": 0}

    def fn(x):
        y = lin(x).sin()  # last tensor saved for backward
        calls["n"] += 1  # runs after the last save: only without early stop
        return y
    return fn, calls


@pytest.mark.parametrize("global_setting, per_call, replays_to_end", [
    (None, None, False),   # default: early stop
    (None, False, True),   # no global setting: the per-call value applies
    (False, None, True),   # the global setting applies
    (True, None, False),
    (False, True, True),   # the global setting overrides a per-call value, as in PyTorch
    (True, False, False),
])
def test_early_stop_follows_set_checkpoint_early_stop_as_torch(global_setting, per_call, replays_to_end):
    def run(impl):
        fn, calls = _tail_counter()
        x = torch.randn(2, 4, requires_grad=True)
        ctx = (torch_ckpt.set_checkpoint_early_stop(global_setting)
               if global_setting is not None else contextlib.nullcontext())
        with ctx:
            out = impl(fn, x) if per_call is None else impl(fn, x, early_stop=per_call)
        out.sum().backward()  # outside the context: the forward's setting counts, as in PyTorch
        return calls["n"]

    assert run(functools.partial(torch_ckpt.checkpoint, use_reentrant=False)) == (2 if replays_to_end else 1), \
        "the expectation does not state PyTorch's behaviour"
    assert run(checkpoint) == (2 if replays_to_end else 1)


def test_use_reentrant_true_is_rejected_and_false_accepted():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="non-reentrant checkpoint only"):
        checkpoint(torch.sin, x, use_reentrant=True)
    checkpoint(torch.sin, x, use_reentrant=False).sum().backward()
    assert torch.equal(x.grad, x.detach().cos())


def test_debug_must_be_bool_and_is_not_passed_to_fn():
    with pytest.raises(ValueError, match="debug must be a bool"):
        checkpoint(torch.sin, torch.randn(2), debug="yes")
    seen = {}

    def fn(x, **kwargs):
        seen.update(kwargs)
        return x.sin()

    x = torch.randn(3, requires_grad=True)
    checkpoint(fn, x, debug=False).sum().backward()
    assert seen == {}


def test_debug_error_in_prefired_session_shows_operator_logs():
    import logging
    logger = logging.getLogger("LoggingTensor")
    saved = list(logger.handlers)  # pytest's capture handler cannot format these records
    for handler in saved:
        logger.removeHandler(handler)
    try:
        calls = {"n": 0}

        def fn(x):
            calls["n"] += 1
            return (x.sin().cos() if calls["n"] == 1 else x.sin()).exp()

        x = torch.randn(3, requires_grad=True)
        with recompute_handle_collector_ctx() as handles:
            checkpoint(fn, x, debug=True)
        with pytest.raises(torch_ckpt.CheckpointError, match="passed `debug=True`") as info:
            recompute_handle(handles[0], "dbg")
        assert "A different number of tensors was saved" in str(info.value.__cause__)
    finally:
        clear_recompute_session("dbg")
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        for handler in saved:
            logger.addHandler(handler)
