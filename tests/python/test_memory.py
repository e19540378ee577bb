"""hyper_ac.memory: exact byte counts through the counting c10 CPU allocator."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from hyper_ac import memory

pytestmark = pytest.mark.skipif(
    not memory.is_available(), reason="hyper_ac._memory extension not built"
)

F32 = 4


def test_is_available_and_installed():
    assert memory.is_available()
    with memory.track():
        info = memory._C.debug_info()
        # torch.empty really goes through the wrapper: c10::GetCPUAllocator()
        # returns it while tracking.
        assert info["installed"] is True
        assert info["open_scopes"] >= 1


def test_install_is_idempotent_and_keeps_priority():
    C = memory._C
    assert C.install() is True
    prio = C.debug_info()["priority"]
    assert C.install() is True
    assert C.is_installed() is True
    assert C.debug_info()["priority"] == prio
    # torch registers its default CPU allocator at priority 0; probing from 0
    # upwards installs at the registered priority, not above it.
    assert prio == 0


def test_exact_bytes_alloc_and_free():
    with memory.track() as t:
        assert (t.current_bytes, t.peak_bytes) == (0, 0)
        a = torch.empty(1024, dtype=torch.float32)
        assert (t.current_bytes, t.peak_bytes) == (4096, 4096)
        b = torch.empty(10, dtype=torch.float64)
        assert (t.current_bytes, t.peak_bytes) == (4176, 4176)
        del a
        assert (t.current_bytes, t.peak_bytes) == (80, 4176)
        c = torch.empty(3, dtype=torch.uint8)  # odd size: requested bytes, no rounding
        assert (t.current_bytes, t.peak_bytes) == (83, 4176)
        del b, c
        assert (t.current_bytes, t.peak_bytes) == (0, 4176)
    # frozen after the block
    assert (t.current_bytes, t.peak_bytes) == (0, 4176)


def test_views_do_not_allocate_and_outputs_do():
    x = torch.ones(256)
    with memory.track() as t:
        v = x.view(16, 16)[2:4]
        assert t.current_bytes == 0
        y = x + 1
        assert t.current_bytes == 256 * F32
        del v, y
    assert t.current_bytes == 0


def test_live_tensor_at_exit_stays_counted():
    with memory.track() as t:
        keep = torch.zeros(100)
    assert (t.current_bytes, t.peak_bytes) == (400, 400)
    del keep  # freed after the block: harmless, nobody is counting


def test_allocated_before_freed_inside_is_ignored():
    old = torch.empty(1 << 16)
    with memory.track() as t:
        new = torch.empty(8)
        del old
        assert t.current_bytes == 8 * F32
        assert t.peak_bytes == 8 * F32
        del new
        assert t.current_bytes == 0


def test_allocated_in_previous_block_freed_in_next_is_ignored():
    with memory.track() as first:
        x = torch.empty(1000)
    with memory.track() as second:
        del x
        assert second.current_bytes == 0
        y = torch.empty(10)
        assert second.current_bytes == 40
        del y
    assert first.current_bytes == 4000
    assert (second.current_bytes, second.peak_bytes) == (0, 40)


def test_nested_blocks():
    with memory.track() as outer:
        a = torch.empty(1000)  # 4000
        with memory.track() as inner:
            b = torch.empty(500)  # 2000
            del a  # allocated before the inner block: only the outer sees it
            assert inner.current_bytes == 2000
            assert outer.current_bytes == 2000
            c = torch.empty(250)  # 1000
            del c
            assert (inner.current_bytes, inner.peak_bytes) == (2000, 3000)
        assert (inner.current_bytes, inner.peak_bytes) == (2000, 3000)
        # the inner block did not reset or lower the outer peak
        assert outer.peak_bytes == 6000
        assert outer.current_bytes == 2000
        del b
        assert outer.current_bytes == 0
    assert (outer.current_bytes, outer.peak_bytes) == (0, 6000)


def test_inner_peak_is_relative_to_its_start():
    with memory.track() as outer:
        big = torch.empty(10_000)
        with memory.track() as inner:
            small = torch.empty(10)
        assert inner.peak_bytes == 40
        assert outer.peak_bytes == 40_040
        del big, small


def test_repeated_use_of_one_object_resets():
    t = memory.track()
    with t:
        x = torch.empty(100)
        del x
    assert (t.current_bytes, t.peak_bytes) == (0, 400)
    with t:
        assert (t.current_bytes, t.peak_bytes) == (0, 0)
        y = torch.empty(10)
    assert (t.current_bytes, t.peak_bytes) == (40, 40)
    del y


def test_reentering_an_open_block_is_an_error():
    t = memory.track()
    with t:
        with pytest.raises(RuntimeError):
            t.__enter__()


def test_reset_peak():
    with memory.track() as t:
        a = torch.empty(100)
        b = torch.empty(100)
        del b
        assert t.peak_bytes == 800
        t.reset_peak()
        assert t.peak_bytes == 400
        del a


def test_exception_closes_block():
    with pytest.raises(ValueError):
        with memory.track() as t:
            x = torch.empty(10)
            raise ValueError
    assert not t.active
    assert t.current_bytes == 40
    del x
    assert memory._C.debug_info()["open_scopes"] == 0


def test_other_threads_count():
    out = []
    with memory.track() as t:
        th = threading.Thread(target=lambda: out.append(torch.empty(64)))
        th.start()
        th.join()
        assert t.current_bytes == 256


def test_lazy_clone_of_tracked_tensor():
    # Tracked memory keeps context == data, so copy-on-write still works.
    with memory.track() as t:
        a = torch.ones(64)
        b = a._lazy_clone()
        assert t.current_bytes == 256
        b.add_(1)  # materialises: one more allocation
        assert t.current_bytes == 512
        assert a[0].item() == 1.0 and b[0].item() == 2.0
        del a, b
        assert t.current_bytes == 0


def test_uninstall_then_free_then_reinstall():
    C = memory._C
    with memory.track() as t:
        x = torch.empty(100)
    assert C.uninstall() is True
    assert C.is_installed() is False
    del x  # tracked memory freed after uninstall: still goes through our deleter
    with memory.track() as t:
        assert C.is_installed() is True
        y = torch.empty(5)
        assert t.current_bytes == 20
        del y
    assert t.current_bytes == 0
    assert C.debug_info()["live_tracked_allocations"] == 0


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)
    )


def test_mlp_forward_backward_peak_is_plausible():
    model = _mlp()
    x = torch.randn(8, 32)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gc.collect()
    with memory.track() as t:
        loss = model(x).sum()
        fwd_current = t.current_bytes
        loss.backward()
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    assert grad_bytes == param_bytes
    # After the forward, autograd keeps relu's output (saved by relu and by
    # fc2 for its weight gradient) and the loss is live; fc1's and fc2's
    # outputs are already gone.  x and the weights predate the block.
    assert fwd_current >= (8 * 64 + 1) * F32
    # gradients are allocated inside and still live; activations were freed
    assert t.current_bytes >= grad_bytes
    assert t.peak_bytes >= grad_bytes + 8 * 64 * F32
    assert t.peak_bytes >= 2 * 8 * 64 * F32  # fc1 and relu outputs coexist
    assert t.peak_bytes >= fwd_current
    assert t.peak_bytes < 10 * (grad_bytes + fwd_current)
    del loss
    for p in model.parameters():
        p.grad = None


def test_fx_timeline_is_exact_for_mlp():
    model = _mlp()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(8, 32)
    with torch.no_grad(), memory.track() as t:
        out = t.run_graph(gm, x)
    names = [n.name for n in gm.graph.nodes]
    assert [r.name for r in t.timeline] == names
    by_name = {r.name: r for r in t.timeline}
    h = 8 * 64 * F32
    o = 8 * 16 * F32
    inp, fc1, relu, fc2, output = names
    assert by_name[inp].current_bytes == 0  # the input predates the block
    assert by_name[fc1].current_bytes == h
    # relu's input died at relu: freed before its record was taken
    assert by_name[relu].current_bytes == h
    assert by_name[relu].node_peak_bytes == 2 * h
    assert by_name[fc2].current_bytes == o
    assert by_name[fc2].node_peak_bytes == h + o
    assert by_name[output].current_bytes == o
    assert t.peak_bytes == 2 * h
    assert [r.peak_bytes for r in t.timeline] == [0, h, 2 * h, 2 * h, 2 * h]
    assert torch.allclose(out, model(x))
    assert t.current_bytes == o  # `out` is still alive


def test_tracking_interpreter_standalone_and_module_run_graph():
    model = _mlp()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(4, 32)
    with torch.no_grad():
        interp = memory.TrackingInterpreter(gm)
        interp.run(x)
        assert len(interp.timeline) == len(gm.graph.nodes)
        assert interp.tracker.peak_bytes == 2 * 4 * 64 * F32
        out, t = memory.run_graph(gm, x)
        assert t.timeline == interp.timeline
        assert out.shape == (4, 16)


def test_joint_forward_backward_through_interpreter():
    # make_fx traces forward + backward into one aten graph, the shape of graph
    # hyper_ac works on; the interpreter then measures it node by node.
    from torch.fx.experimental.proxy_tensor import make_fx

    model = _mlp()
    params = dict(model.named_parameters())

    def step(params, x):
        out = torch.func.functional_call(model, params, (x,))
        return torch.autograd.grad(out.sum(), list(params.values()))

    x = torch.randn(8, 32)
    gm = make_fx(step)(params, x)
    with memory.track() as t:
        grads = t.run_graph(gm, params, x)
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)
    assert len(t.timeline) == len(gm.graph.nodes)
    assert t.current_bytes >= grad_bytes  # the returned gradients are live
    assert t.peak_bytes >= grad_bytes + 8 * 64 * F32
    assert t.timeline[-1].current_bytes == t.current_bytes
    assert max(r.node_peak_bytes for r in t.timeline) == t.peak_bytes
    for g, p in zip(grads, params.values()):
        assert g.shape == p.shape


def test_extension_links_c10_only():
    path = memory._C.__file__
    data = open(path, "rb").read()
    assert b"libc10.so" in data
    for lib in (b"libtorch_cpu.so", b"libtorch_python.so", b"libtorch.so"):
        assert lib not in data


def test_measuring_a_step_on_a_device_it_cannot_count_names_the_device():
    """A step on the meta device (or CUDA) allocates nothing the CPU allocator sees: an error naming
    the device, never a silent zero; the CPU step beside it measures."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    cpu = memory.measure_step(lambda: model(x).sum())
    assert cpu.peak_bytes > 0
    meta_model = torch.nn.Sequential(torch.nn.Linear(8, 16, device="meta"), torch.nn.ReLU(),
                                     torch.nn.Linear(16, 1, device="meta"))
    with pytest.raises(ValueError, match=r"measure_step: the step runs on device 'meta'.*cannot count"):
        memory.measure_step(lambda: meta_model(torch.randn(4, 8, device="meta")).sum())
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device 'cuda:0'"):
            memory.require_countable("cuda:0", "measure_step")
    memory.require_countable(torch.device("cpu"), "measure_step")  # counted: no error
    with pytest.raises(ValueError, match=r"device 'meta' has no allocator hyper_ac can count"):
        memory.track("meta")


class _CudaAllocatorStats:
    """torch.cuda's allocator statistics for one device, driven by hand (a caching allocator that frees nothing to the driver)."""

    def __init__(self, allocated: int = 0) -> None:
        self.allocated = self.peak = self.reserved = self.reserved_peak = allocated

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n

    def reset_peak(self, device=None) -> None:
        self.peak, self.reserved_peak = self.allocated, self.reserved


@pytest.fixture
def cuda_stats(monkeypatch):
    """CUDA's statistics API on a CPU machine: tests the CUDA counter's arithmetic (scopes, nesting, resets)."""
    stats = _CudaAllocatorStats(allocated=1000)
    for name, fn in {"is_available": lambda: True, "is_initialized": lambda: True, "current_device": lambda: 0,
                     "synchronize": lambda device=None: None,
                     "memory_allocated": lambda device=None: stats.allocated,
                     "max_memory_allocated": lambda device=None: stats.peak,
                     "max_memory_reserved": lambda device=None: stats.reserved_peak,
                     "reset_peak_memory_stats": stats.reset_peak}.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    return stats


def test_cuda_track_nests_on_the_devices_one_peak(cuda_stats):
    with memory.track("cuda") as outer:
        assert outer.device == torch.device("cuda", 0)
        cuda_stats.alloc(50)
        with memory.track("cuda:0") as inner:  # resets the device's peak: the outer block keeps its own
            cuda_stats.free(50)
            cuda_stats.alloc(30)
            assert (inner.current_bytes, inner.peak_bytes) == (-20, 0)
        assert (inner.current_bytes, inner.peak_bytes) == (-20, 0)  # frozen when closed
        assert outer.peak_bytes == 50
        cuda_stats.alloc(100)
        assert (outer.current_bytes, outer.peak_bytes) == (130, 130)
        outer.reset_peak()
        cuda_stats.free(100)
        assert outer.peak_bytes == 130  # the reset lowered the peak to the figure then
    assert (outer.current_bytes, outer.peak_bytes) == (30, 130)
    assert outer.reserved_peak_bytes == 1130  # the allocator's segments (absolute): the largest since the reset
    with memory.track() as cpu:
        pass
    assert cpu.reserved_peak_bytes is None


def test_measure_step_counts_a_cuda_loss_on_its_device(cuda_stats):
    class Loss:  # a loss on CUDA whose backward allocates 400 B of gradients and 200 B it frees
        device = torch.device("cuda", 0)

        def backward(self):
            cuda_stats.alloc(600)
            cuda_stats.free(200)

        def detach(self):
            return self

    class Output:
        def __init__(self):
            cuda_stats.alloc(300)  # what the forward keeps
            self.loss = Loss()

    step = memory.measure_step(Output)
    assert (step.peak_bytes, step.forward_bytes, step.device) == (900, 300, "cuda:0")
    assert step.reserved_peak_bytes == 1900
    Loss.device = torch.device("cuda", 1)  # not the current device, which is the one counted by default
    with pytest.raises(ValueError, match=r"loss is on 'cuda:1'.*counted on cpu, cuda:0; pass device='cuda:1'"):
        memory.measure_step(Output)
