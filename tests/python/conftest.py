"""Shared fixtures: each model is built and captured at most once per session."""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if importlib.util.find_spec("hyper_ac") is None and ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # a plain source checkout without an install


def pytest_report_header(config):
    import hyper_ac

    where = os.path.dirname(os.path.abspath(hyper_ac.__file__))
    line = f"hyper_ac imported from {where}"
    if not where.startswith(ROOT + os.sep):
        line += f"  (WARNING: not this checkout {ROOT}; an install elsewhere shadows it)"
    return line



def pytest_configure(config):
    # Noise from transformers' output capturing (dynamo export) and torch's own deepcopy of pytree specs.
    config.addinivalue_line("filterwarnings", "ignore:While compiling, we found certain side effects:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")


class Captured:
    """A built model, its example batch, its captured joint graph and its JSON document."""

    def __init__(self, name: str, tracer: str = "compile"):
        from hyper_ac import models
        from hyper_ac.frontend import capture
        from hyper_ac.frontend import serialize

        self.name = name
        self.tracer = tracer
        self.model = models.build(name)
        self.batch = models.example_batch(name)
        t0 = time.perf_counter()
        self.captured = capture.capture_joint(self.model, tracer=tracer, **self.batch)
        t1 = time.perf_counter()
        self.doc = serialize.serialize_graph(self.captured.graph_module, self.model)
        t2 = time.perf_counter()
        self.capture_seconds = t1 - t0
        self.serialize_seconds = t2 - t1

    @property
    def gm(self):
        return self.captured.graph_module

    def json(self) -> str:
        import json

        return json.dumps(self.doc, separators=(",", ":"))


_CACHE: dict[tuple[str, str], Captured] = {}


def get_captured(name: str, tracer: str = "compile") -> Captured:
    key = (name, tracer)
    if key not in _CACHE:
        _CACHE[key] = Captured(name, tracer)
    return _CACHE[key]


@pytest.fixture(scope="session")
def captured():
    """``captured(name, tracer="compile")`` → :class:`Captured` (cached for the session)."""
    return get_captured


ALL_MODELS = ("mlp", "transformer", "gpt2", "llama", "mixtral", "bert", "t5")
HF_MODELS = ("gpt2", "llama", "mixtral")


@pytest.fixture(scope="session", params=ALL_MODELS)
def any_model(request) -> Captured:
    return get_captured(request.param)


@pytest.fixture(scope="session", params=HF_MODELS)
def hf_captured(request) -> Captured:
    return get_captured(request.param)


@pytest.fixture
def small_resnet():
    """``small_resnet()`` → a residual conv/batch-norm CNN with no checkpoint marker, its
    blocks in an ``nn.Sequential`` (``layer1.0..2``); BatchNorm updates its buffers in place.
    Called as ``model(x=[N,3,H,W], y=[N] class ids)``; it returns the loss."""
    from torch import nn

    class ConvBlock(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.conv = nn.Conv2d(channels, channels, 3, padding=1)
            self.bn = nn.BatchNorm2d(channels)

        def forward(self, x):
            import torch

            return torch.relu(x + self.bn(self.conv(x)))

    class SmallResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.layer1 = nn.Sequential(ConvBlock(8), ConvBlock(8), ConvBlock(8))
            self.head = nn.Linear(8, 10)

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.head(self.layer1(self.stem(x)).mean((2, 3))), y)

    return SmallResNet


def core_module():
    """``hyper_ac._core`` or skip (it exists once ``make build`` has run)."""
    try:
        import hyper_ac._core as core  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the build
        pytest.skip(f"hyper_ac._core not built: {exc}")
    return core


@pytest.fixture(autouse=True)
def _no_measured_peaks_between_tests():
    """The dry runs' figures are remembered for the process (hyper_ac.lower.oracle): a test that
    compiles what an earlier one did would see no dry run. Each test starts without them."""
    from hyper_ac.lower.oracle import forget_measured

    forget_measured()
    yield


def pytest_terminal_summary(terminalreporter):
    if not _CACHE:
        return
    terminalreporter.write_line("captured graphs (nodes, capture s, serialize s):")
    for (name, tracer), c in sorted(_CACHE.items()):
        terminalreporter.write_line(
            f"  {name:12s} {tracer:8s} {len(c.doc['nodes']):6d} {c.capture_seconds:7.2f} {c.serialize_seconds:7.3f}"
        )
