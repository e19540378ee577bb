"""PyTorch's own non-reentrant checkpoint tests, ported to ``hyper_ac.eager.checkpoint``.

Each test re-states what a test of PyTorch's suite asserts (named in its
docstring: ``test_utils.py`` ``TestCheckpoint`` or ``test_autograd.py``
``TestAutograd`` / ``TestNestedCheckpoint``) and runs it against two
implementations: ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``
itself, which shows that the test states PyTorch's behaviour, and
``hyper_ac.eager.checkpoint``, which must behave the same.  Error checks match
the key phrase of PyTorch's message, which both implementations contain.
Only reentrant-only or multi-GPU parts of the original tests are left out.
CPU only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_ckpt
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointError

from hyper_ac import eager

IMPLS = {
    "torch": functools.partial(torch_ckpt.checkpoint, use_reentrant=False),
    "hyper_ac": eager.checkpoint,
}


@pytest.fixture(params=sorted(IMPLS))
def ckpt(request):
    return IMPLS[request.param]


def _grads_of(params):
    return [p.grad.detach().clone() for p in params]


# --------------------------------------------------------------------------
# test_utils.py :: TestCheckpoint


def _run_segments(modules, segments, x, ckpt):
    """checkpoint_sequential's split: every segment but the last is checkpointed."""
    size = len(modules) // segments

    def run(start, end):
        def forward(inp):
            for m in modules[start:end]:
                inp = m(inp)
            return inp
        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        x = ckpt(run(start, end + 1), x)
    return run(end + 1, len(modules))(x)


def test_checkpoint_trigger(ckpt):
    """TestCheckpoint.test_checkpoint_trigger: forward counts per module."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.counter = 0

        def forward(self, x):
            self.counter += 1
            return x * torch.tensor(2.0)

    modules = [Net() for _ in range(10)]
    x = torch.randn(3, 4, requires_grad=True)
    out = _run_segments(modules, 2, x, ckpt)
    assert [m.counter for m in modules] == [1] * 10
    out.sum().backward()
    assert [m.counter for m in modules[:5]] == [2] * 5
    assert [m.counter for m in modules[5:]] == [1] * 5


def _mlp():
    return nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(),
                         nn.Linear(20, 5), nn.ReLU())


def test_checkpoint_valid(ckpt):
    """TestCheckpoint.test_checkpoint_valid (non-reentrant half): create_graph grads."""
    torch.manual_seed(0)
    model = _mlp()
    x = torch.randn(1, 100, requires_grad=True)
    out = model(x)
    want = torch.autograd.grad([out], [x], grad_outputs=[torch.ones(1, 5)], create_graph=True)
    out_ckpt = _run_segments(list(model.children()), 2, x, ckpt)
    assert torch.equal(out_ckpt, out)
    got = torch.autograd.grad([out_ckpt], [x], grad_outputs=[torch.ones(1, 5)], create_graph=True)
    assert torch.equal(got[0], want[0])
    assert got[0].requires_grad  # a graph of the gradient exists (double backward)


@pytest.mark.parametrize("as_module_list", [False, True])
def test_checkpoint_sequential_outputs_and_grads(ckpt, as_module_list):
    """TestCheckpoint.test_checkpoint / test_checkpoint_module_list."""
    torch.manual_seed(0)
    model = _mlp()
    modules = list(nn.ModuleList(model.children())) if as_module_list else list(model.children())
    x = torch.randn(1, 100, requires_grad=True)
    out = model(x)
    out.sum().backward()
    want_param, want_x = _grads_of(model.parameters()), x.grad.clone()

    model.zero_grad()
    x2 = x.detach().requires_grad_()
    out2 = _run_segments(modules, 2, x2, ckpt)
    out2.sum().backward()
    assert torch.equal(out2, out)
    assert torch.equal(x2.grad, want_x)
    for got, want in zip(_grads_of(model.parameters()), want_param):
        assert torch.equal(got, want)


def test_checkpoint_rng_cpu(ckpt):
    """TestCheckpoint.test_checkpoint_rng_cpu: dropout inside the checkpoint."""
    for _ in range(5):
        inp = torch.randn(20000).requires_grad_()
        phase1, phase2 = nn.Dropout(), nn.Dropout()
        state = torch.get_rng_state()
        out = ckpt(phase2, phase1(inp))
        out.sum().backward()
        with_ckpt = inp.grad
        torch.set_rng_state(state)
        inp.grad = None
        phase2(phase1(inp)).sum().backward()
        assert torch.equal(with_ckpt, inp.grad)


def test_checkpoint_not_preserve_rng_state(ckpt):
    """TestCheckpoint.test_checkpoint_not_preserve_rng_state_and_without_reentrant (CPU)."""
    inp = torch.randn(2).requires_grad_()
    out = ckpt(nn.Dropout(), inp, preserve_rng_state=False)
    out.sum().backward()
    assert inp.grad is not None


def test_checkpoint_non_tensor(ckpt):
    """TestCheckpoint.test_checkpoint_non_tensor: a None argument."""

    def run_fn(t1, t2):
        return t1 if t2 is None else t1 + t2

    x = torch.randn(1, 100, requires_grad=True)
    ckpt(run_fn, x, None).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def _mixed(t1, t2, scale, t3):
    t4 = t1 + t2 * t3
    t5 = t1 * t2 + t3
    t4 *= scale
    t5 *= scale
    return scale, t4, None, True, t5, "bar", t1


def test_checkpoint_non_tensor_inputs_outputs(ckpt):
    """TestCheckpoint.test_checkpoint_non_tensor_inputs_outputs, including the
    second backward through freed buffers."""
    t1 = torch.rand(10, requires_grad=True)
    t2 = torch.rand(10, requires_grad=True)
    t3 = torch.rand(10)
    scale = random.randint(1, 10)
    res = ckpt(_mixed, t1, t2, scale, t3)
    assert res[0] == scale and res[2] is None and res[3] is True and res[5] == "bar"
    assert torch.equal(res[1], (t1 + t2 * t3) * scale)
    assert torch.equal(res[4], (t1 * t2 + t3) * scale)
    assert res[6] is t1
    res[1].sum().backward(retain_graph=True)
    res[4].sum().backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        res[4].sum().backward()
    got = (t1.grad.clone(), t2.grad.clone())
    t1.grad = t2.grad = None
    plain = _mixed(t1, t2, scale, t3)
    torch.autograd.backward([plain[1].sum(), plain[4].sum()])
    assert torch.equal(got[0], t1.grad) and torch.equal(got[1], t2.grad)


def test_checkpoint_no_tensors(ckpt):
    """TestCheckpoint.test_checkpoint_no_tensors: only Python numbers."""
    t1, t2, t3 = random.random(), random.random(), random.random()
    scale = random.randint(0, 10)
    res = ckpt(_mixed, t1, t2, scale, t3)
    assert res == _mixed(t1, t2, scale, t3)


def test_checkpoint_partial_grad(ckpt):
    """TestCheckpoint.test_checkpoint_partial_grad (non-reentrant behaviour)."""

    def run_fn(t1, t2):
        return t1, t2

    a = torch.randn(1, 4, requires_grad=True)
    b = torch.randn(1, 4)
    out = ckpt(run_fn, a, b)
    out[0].sum().backward()
    assert torch.equal(a.grad, torch.ones_like(a))

    # Non-reentrant checkpoint does not force outputs to require grad: an
    # output that does not depend on a grad-requiring input fails in autograd.
    out = ckpt(lambda t1, t2: t1 * 2, torch.randn(1, 4), torch.randn(1, 4, requires_grad=True))
    assert not out.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()


def test_checkpointing_without_reentrant_early_free(ckpt):
    """TestCheckpoint.test_checkpointing_without_reentrant_early_free, on CPU:
    the recomputed buffers are released step by step as the backward goes,
    even with retain_graph=True.  Instead of device memory, count the live
    recomputed tensors (weak references) at each gradient hook."""

    def run(retain_graph):
        live: list = []
        counts: list[int] = []

        class Track(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten.pow.Tensor_Scalar:
                    live.append(StorageWeakRef(out.untyped_storage()))
                return out

        def hook(_grad):
            counts.append(sum(1 for r in live if not r.expired()))

        def fn(x):
            x = x ** 2
            x.register_hook(hook)
            x = x ** 2
            x.register_hook(hook)
            x = x ** 2
            x.register_hook(hook)
            return (x ** 2).sum()

        x = torch.zeros(10, requires_grad=True)
        out = ckpt(fn, x)
        live.clear()  # only the replay's tensors are counted
        with Track():
            out.backward(retain_graph=retain_graph)
        return counts

    # The replay recomputes three pow outputs that backward reads (x1, x2, x3);
    # each one is released by the gradient step that read it, so at the hooks
    # on x3, x2, x1 two, one, none are left -- with retain_graph too.
    assert run(False) == [2, 1, 0]
    assert run(True) == [2, 1, 0]


# --------------------------------------------------------------------------
# test_autograd.py :: TestAutograd (non-reentrant checkpoint tests)


@pytest.mark.parametrize("input_requires_grad", [False, True])
def test_checkpointing_without_reentrant_input_requires_grad(ckpt, input_requires_grad):
    """TestAutograd.test_checkpointing_without_reentrant_input_requires_grad_{False,True}
    and ..._correct_grad: parameter gradients equal the uncheckpointed run."""

    class Model(nn.Module):
        def __init__(self, use_ckpt):
            super().__init__()
            self.use_ckpt = use_ckpt
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = ckpt(layer, x) if self.use_ckpt else layer(x)
                x = x.relu()
            return x

    torch.manual_seed(0)
    plain = Model(False)
    torch.manual_seed(0)
    checkpointed = Model(True)
    x = torch.randn(4, 8, requires_grad=input_requires_grad)
    plain(x).sum().backward()
    checkpointed(x).sum().backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_checkpointing_without_reentrant_arbitrary_input_output(ckpt):
    """TestAutograd.test_checkpointing_without_reentrant_arbitrary_input_output:
    dict input, dict output."""

    class Model(nn.Module):
        def __init__(self, use_ckpt):
            super().__init__()
            self.use_ckpt = use_ckpt
            self.layer = nn.Linear(5, 5)

        def body(self, d):
            return {"out": self.layer(d["x"]).relu() + d["y"]}

        def forward(self, d):
            return ckpt(self.body, d)["out"] if self.use_ckpt else self.body(d)["out"]

    torch.manual_seed(0)
    plain = Model(False)
    torch.manual_seed(0)
    checkpointed = Model(True)
    d = {"x": torch.randn(3, 5, requires_grad=True), "y": torch.randn(3, 5)}
    out_plain = plain(d)
    out_ckpt = checkpointed(d)
    assert torch.equal(out_plain, out_ckpt)
    out_plain.sum().backward()
    grad_x = d["x"].grad.clone()
    d["x"].grad = None
    out_ckpt.sum().backward()
    assert torch.equal(grad_x, d["x"].grad)
    for a, b in zip(plain.parameters(), checkpointed.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_checkpointing_without_reentrant_detached_tensor(ckpt):
    """TestAutograd.test_checkpointing_without_reentrant_detached_tensor."""

    class NoGradModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2, bias=False)
            self.lin2 = nn.Linear(2, 2, bias=False)

        def forward(self, x):
            with torch.no_grad():
                return self.lin2(self.linear(x))

    module = NoGradModule()
    a = torch.randn(2, 2, requires_grad=True)
    for _ in range(3):
        out = ckpt(module, a)
        assert not out.requires_grad
        (out + a).sum().backward()  # runs; only the path through `a` has gradients
    assert torch.equal(a.grad, torch.full_like(a, 3.0))


def test_checkpointing_without_reentrant_custom_function_works(ckpt):
    """TestAutograd.test_checkpointing_without_reentrant_custom_function_works:
    a custom Function whose backward reads ctx.saved_tensors twice."""
    msg = "Unpack is being triggered for a tensor that was already unpacked once"

    class MyFunc(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y, z):
            w = x * y * z
            out = w + w
            ctx.save_for_backward(x, y, z, w, out)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, y, z, w, out = ctx.saved_tensors
            x_2, y_2, z_2, w_2, out_2 = ctx.saved_tensors  # second access
            return x, y, z

    x = torch.tensor(1.0, requires_grad=True)
    y = torch.tensor(2.0, requires_grad=True)
    z = torch.tensor(3.0, requires_grad=True)

    def foo(x, y, z):
        x = x * y * z
        y = y * y * z
        z = z * z
        return MyFunc.apply(x, y, z)

    out = ckpt(foo, x, y, z)
    with pytest.raises(CheckpointError, match=msg):
        out.sum().backward()


def test_access_saved_tensor_twice_without_recomputation_works(ckpt):
    """TestAutograd.test_access_saved_tensor_twice_without_recomputation_works:
    reading a saved tensor outside backward replays each time; after a
    backward freed the graph, access fails with autograd's own error."""
    count = [0]

    def foo(a):
        count[0] += 1
        b = a * a
        c = a * b
        return torch.exp(a)

    a = torch.randn(5, requires_grad=True)
    d = ckpt(foo, a)
    first = d.grad_fn._saved_result
    second = d.grad_fn._saved_result
    assert torch.equal(first, torch.exp(a)) and torch.equal(second, first)
    assert count[0] == 3  # forward + one replay per access outside backward
    d.sum().backward()
    with pytest.raises(RuntimeError, match="after they have already been freed"):
        d.grad_fn._saved_result


def test_checkpoint_detects_non_determinism(ckpt):
    """TestAutograd.test_checkpoint_detects_non_determinism."""

    def save_3(x):
        return x.sin().cos().exp()

    def save_2(x):
        return x.sin().exp()

    calls = {"n": 0}

    def changes_count(x):
        calls["n"] += 1
        return save_3(x) if calls["n"] == 1 else save_2(x)

    a = torch.tensor(1.0, requires_grad=True)
    out = ckpt(changes_count, a)
    with pytest.raises(CheckpointError,
                       match=r"(?s)A different number of tensors was saved.*"
                             r"Number of tensors saved during forward: 3.*"
                             r"Number of tensors saved during recomputation: 2"):
        out.backward()

    # More tensors during the replay, without early stop.
    calls["n"] = 0

    def grows(x):
        calls["n"] += 1
        return save_2(x) if calls["n"] == 1 else save_3(x)

    with torch_ckpt.set_checkpoint_early_stop(False):
        out = ckpt(grows, a)
    with pytest.raises(CheckpointError,
                       match="trying to save more tensors during recomputation than during "
                             "the original forward pass"):
        out.backward()

    # Same count, different shape / dtype.
    def make(change):
        state = {"first": True}

        def fn(x):
            y = x if state["first"] else change(x)
            state["first"] = False
            return y.sin().exp()
        return fn

    for change, what in [(lambda x: x.expand(2), r"torch.Size\(\[2\]\)"),
                         (lambda x: x.double(), "torch.float64")]:
        out = ckpt(make(change), a)
        with pytest.raises(CheckpointError,
                           match=r"(?s)Recomputed values for the following tensors have "
                                 r"different metadata than during the forward pass.*"
                                 r"tensor at position 0:.*saved metadata: .*"
                                 r"recomputed metadata: .*" + what):
            out.sum().backward()

    # determinism_check="none" turns the comparison off.
    out = ckpt(make(lambda x: x.double()), a, determinism_check="none")
    out.sum().backward()


@contextlib.contextmanager
def _without_pytest_log_capture():
    # debug=True logs every operator through the "LoggingTensor" logger, whose
    # records only PyTorch's own handler can format; pytest attaches its
    # capture handler to that (non-propagating) logger at the start of each
    # test phase, so detach it for the duration of the test body.
    logger = logging.getLogger("LoggingTensor")
    saved = list(logger.handlers)
    for handler in saved:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        for handler in saved:
            logger.addHandler(handler)


def test_checkpoint_debug(ckpt):
    with _without_pytest_log_capture():
        _check_debug(ckpt)


def _check_debug(ckpt):
    """TestAutograd checkpoint debug tests: debug=True and
    set_checkpoint_debug_enabled print the operator logs of both runs;
    set_checkpoint_debug_enabled(False) overrides debug=True."""
    debug_phrase = "You are seeing this error because you passed `debug=True` to checkpoint"

    def nondeterministic():
        calls = {"n": 0}

        def fn(x):
            calls["n"] += 1
            y = x.sin().cos() if calls["n"] == 1 else x.sin()
            return y.exp()
        return fn

    a = torch.tensor(1.0, requires_grad=True)

    out = ckpt(nondeterministic(), a, debug=False)
    with pytest.raises(CheckpointError) as plain:
        out.backward()
    assert debug_phrase not in str(plain.value)

    out = ckpt(nondeterministic(), a, debug=True)
    with pytest.raises(CheckpointError, match=debug_phrase) as info:
        out.backward()
    text = str(info.value)
    assert "Operations executed during the original forward" in text
    assert "Operations executed during recomputation" in text
    assert "aten.cos" in text  # the forward ran cos, the replay did not
    assert "A different number of tensors was saved" in str(info.value.__cause__)

    with torch_ckpt.set_checkpoint_debug_enabled(True):
        out = ckpt(nondeterministic(), a, debug=False)
    with pytest.raises(CheckpointError, match=debug_phrase):
        out.backward()

    with torch_ckpt.set_checkpoint_debug_enabled(False):
        out = ckpt(nondeterministic(), a, debug=True)
    with pytest.raises(CheckpointError) as overridden:
        out.backward()
    assert debug_phrase not in str(overridden.value)

    # A correct function in debug mode just works.
    x = torch.randn(3, requires_grad=True)
    ckpt(lambda t: t.sin().cos(), x, debug=True).sum().backward()
    assert torch.equal(x.grad, -torch.sin(torch.sin(x)) * torch.cos(x))

    with pytest.raises(ValueError, match="debug=True is incompatible with non-default context_fn"):
        ckpt(torch.sin, x, debug=True,
             context_fn=lambda: (torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
                                 torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)))


def test_checkpointing_non_reentrant_autocast_cpu(ckpt):
    """TestAutograd.test_checkpointing_non_reentrant_autocast_cpu."""

    def foo(x, y, z):
        z = torch.mm(x, y)
        return torch.mm(z, z)

    x = torch.randn(8, 8, requires_grad=True)
    y = torch.randn(8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ckpt(foo, x, y, None)
        assert out.dtype == torch.bfloat16
    out.sum().backward()  # the replay runs under the forward's autocast: no metadata error
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = foo(x.detach().requires_grad_(), y, None)
    assert torch.equal(out, want)


def test_checkpoint_device_context_fn(ckpt):
    """TestAutograd.test_checkpoint_device_context_fn: the replay runs under
    the forward's torch.device context, although backward runs outside it."""

    def fn(x):
        return x.sin() * torch.ones(3)  # a factory that follows the device context

    with torch.device("meta"):
        x = torch.randn(3, requires_grad=True)
        out = ckpt(fn, x)
    assert out.device.type == "meta"
    # Without the context in the replay, ones() would be a CPU tensor and the
    # determinism check would report a device mismatch.
    out.sum().backward()
    assert x.grad.device.type == "meta" and x.grad.shape == (3,)


class _CountOps(TorchDispatchMode):
    def __init__(self, name):
        super().__init__()
        self.name = name
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] == self.name:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_checkpointing_without_reentrant_with_context_fn(ckpt):
    """TestAutograd.test_checkpointing_without_reentrant_with_context_fn: the
    first context sees the forward, the second one the recomputation."""
    fwd_mode, recompute_mode = _CountOps("sin"), _CountOps("sin")

    def fn(x):
        return x.sin().sin()

    x = torch.randn(3, requires_grad=True)
    out = ckpt(fn, x, context_fn=lambda: (fwd_mode, recompute_mode))
    assert (fwd_mode.count, recompute_mode.count) == (2, 0)
    out.sum().backward()
    assert (fwd_mode.count, recompute_mode.count) == (2, 1)  # early stop before the last sin


def test_use_reentrant_false_accepted():
    """Drop-in (hyper_ac only): callers pass use_reentrant=False explicitly
    (PyTorch warns when it is missing); the keyword must not reach the function."""
    x = torch.randn(3, requires_grad=True)
    out = eager.checkpoint(torch.sin, x, use_reentrant=False)
    out.sum().backward()
    assert torch.equal(x.grad, x.detach().cos())


# --------------------------------------------------------------------------
# test_autograd.py :: TestNestedCheckpoint


def _nest(ckpt, fn, depth):
    for _ in range(depth):
        fn = functools.partial(ckpt, fn)
    return fn


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_nested_checkpoint(ckpt, depth):
    """TestNestedCheckpoint.test_nested_checkpoint: any nesting depth gives the
    uncheckpointed gradients (first and second order)."""

    def fn(x):
        return x.sin().exp().sin()

    x = torch.randn(4, requires_grad=True)
    want = torch.autograd.grad(fn(x).sum(), x, create_graph=True)[0]
    want2 = torch.autograd.grad(want.sum(), x)[0]
    got = torch.autograd.grad(_nest(ckpt, fn, depth)(x).sum(), x, create_graph=True)[0]
    got2 = torch.autograd.grad(got.sum(), x)[0]
    assert torch.equal(got, want) and torch.equal(got2, want2)


def test_nested_checkpoint_two_children(ckpt):
    """TestNestedCheckpoint.test_nested_checkpoint_two_children."""

    def f(x):
        return x.sin().exp()

    def g(x):
        return x.cos().sin()

    def outer(x):
        return ckpt(f, x) * ckpt(g, x)

    x = torch.randn(4, requires_grad=True)
    want = torch.autograd.grad((f(x) * g(x)).sum(), x)[0]
    got = torch.autograd.grad(ckpt(outer, x).sum(), x)[0]
    assert torch.equal(got, want)


def test_nested_checkpoint_non_tensor_inputs_and_outputs(ckpt):
    """TestNestedCheckpoint.test_nested_checkpoint_non_tensor_inputs_and_outputs."""

    def fn(k, a, b, f):
        return f(k * a * b.exp()), 1, "abcd"

    k, a, b = 3, torch.tensor(2.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)

    def outer(k, a, b):
        return ckpt(fn, k, a, b, torch.sin)

    got = ckpt(outer, k, a, b)
    assert got[1:] == (1, "abcd")
    grads = torch.autograd.grad(got[0], (a, b))
    want = torch.autograd.grad(fn(k, a, b, torch.sin)[0], (a, b))
    assert all(torch.equal(g, w) for g, w in zip(grads, want))


def test_nested_checkpoint_kwargs(ckpt):
    """TestNestedCheckpoint.test_nested_checkpoint_kwargs."""

    def fn(a, blah=None):
        out = a.sin().exp()
        return out * blah.sin().exp() if blah is not None else out

    a = torch.tensor(1.0, requires_grad=True)
    b = torch.tensor(2.0, requires_grad=True)
    got = ckpt(lambda a, blah=None: ckpt(fn, a, blah=blah), a, blah=b)
    grads = torch.autograd.grad(got, (a, b))
    want = torch.autograd.grad(fn(a, blah=b), (a, b))
    assert all(torch.equal(g, w) for g, w in zip(grads, want))


def test_nested_checkpoint_same_graph(ckpt):
    """TestNestedCheckpoint.test_nested_checkpoint_same_graph: replay counts."""
    counter = [0]

    def hook(*_):
        counter[0] += 1

    def fn(x):
        y = x.sin().cos()
        z = y.sin().cos()
        y.grad_fn.register_hook(hook)  # counts backward steps through the replayed graph
        return z

    x = torch.randn(5, requires_grad=True)

    def outer(x):
        return ckpt(fn, x)

    ckpt(outer, x).sum().backward()
    # The inner replay does not run a backward through its own graph: the hook
    # belongs to the graph of the first forward only.
    assert counter[0] == 1


def test_nested_checkpoint_set_early_stop(ckpt):
    """TestNestedCheckpoint.test_nested_checkpoint_set_early_stop: a clone
    after the last saved tensor runs again only without early stop."""
    counter = [0]

    def clone(x):
        counter[0] += 1
        return x.clone()

    def fn(x):
        return clone(x.sin().cos())

    a = torch.tensor(1.0, requires_grad=True)
    ckpt(fn, a).backward()
    assert counter[0] == 1

    counter[0] = 0
    with torch_ckpt.set_checkpoint_early_stop(False):
        out = ckpt(fn, a)
    out.backward()  # the setting only needs to be active in the forward
    assert counter[0] == 2


def test_nested_checkpoint_set_early_stop_no_recompution_needed(ckpt):
    """TestNestedCheckpoint.test_nested_checkpoint_set_early_stop_no_recompution_needed."""
    counter = [0]

    def fn(x):
        counter[0] += 1
        return x.sin()

    # Case 1: the only saved tensor is the input: with early stop the replay
    # stops before sin's kernel runs, without it the kernel runs again.
    a = torch.tensor(1.0, requires_grad=True)
    with _CountOps("sin") as mode:
        ckpt(fn, a).backward()
    assert counter[0] == 2 and mode.count == 1

    counter[0] = 0
    with _CountOps("sin") as mode:
        with torch_ckpt.set_checkpoint_early_stop(False):
            out = ckpt(fn, a)
        out.backward()
    assert counter[0] == 2 and mode.count == 2

    # Case 2: nothing saved: no replay at all, with or without early stop.
    def fn2(x):
        counter[0] += 1
        return x.clone()

    for early in (True, False):
        counter[0] = 0
        with torch_ckpt.set_checkpoint_early_stop(early):
            out = ckpt(fn2, a)
        out.backward()
        assert counter[0] == 1


@pytest.mark.parametrize("backward_inside", [False, True])
@pytest.mark.parametrize("inner_early_stop", [None, True, False])
@pytest.mark.parametrize("global_early_stop", [False, True])
def test_nested_checkpoint_global_early_stop_overrides_per_call(ckpt, global_early_stop, inner_early_stop,
                                                                backward_inside):
    """The global switch as a context manager around nested checkpoints
    (``_checkpoint_without_reentrant_generator``: ``set_checkpoint_early_stop``,
    when set, overrides the call's ``early_stop``): whatever the inner call
    passes, every checkpoint made under the context replays to its end
    without early stop and stops early with it, the inner one included."""
    tails = {"inner": 0, "outer": 0}

    def inner(x):
        y = x.sin().cos()
        tails["inner"] += 1  # after the last saved tensor: replayed only without early stop
        return y.clone()

    def outer(x):
        options = {} if inner_early_stop is None else {"early_stop": inner_early_stop}
        y = ckpt(inner, x.exp(), **options).sin()
        tails["outer"] += 1
        return y.clone()

    a = torch.tensor(1.0, requires_grad=True)
    with torch_ckpt.set_checkpoint_early_stop(global_early_stop):
        out = ckpt(outer, a)
        if backward_inside:
            out.backward()
    if not backward_inside:
        out.backward()
    # Forward, the outer replay (inner called again), the inner replay.
    want = {"inner": 2, "outer": 1} if global_early_stop else {"inner": 3, "outer": 2}
    assert tails == want
    assert torch.equal(a.grad, torch.autograd.grad(_nested_uncheckpointed(a), a)[0])


def _nested_uncheckpointed(x):
    return x.exp().sin().cos().clone().sin().clone()


@pytest.mark.parametrize("early_stop", [True, False])
def test_grad_inside_checkpointed_function(ckpt, early_stop):
    """Note [ Nestable Checkpoint ] Rule 6 (covered by TestNestedCheckpoint's
    backward-inside-forward tests): torch.autograd.grad inside the function."""

    def fn(x):
        y = x.sin()
        z = y.cos()
        gx, = torch.autograd.grad(z.sum(), x, create_graph=True)
        return x.cos() * gx

    x = torch.randn(4, requires_grad=True)
    want = torch.autograd.grad(fn(x).sum(), x)[0]
    with torch_ckpt.set_checkpoint_early_stop(early_stop):
        out = ckpt(fn, x)
    got = torch.autograd.grad(out.sum(), x)[0]
    assert torch.equal(got, want)
