"""``torch.compile(model, backend="hyper_ac", options=...)``: hyper_ac as a dynamo backend by name (issue 25)."""

from __future__ import annotations

import inspect
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

import hyper_ac
from hyper_ac import models
from hyper_ac.lower import dynamo_backend
from hyper_ac.lower.backends import backend

ROOT = Path(__file__).resolve().parents[2]


def _model_and_input():
    model = models.build("transformer")
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    return model, (tokens, tokens)


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _run(model, inputs, **compile_kwargs):
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "does not lower the simulated peak" notes on a tiny model
        torch.compile(model, **compile_kwargs)(*inputs).backward()
    torch._dynamo.reset()
    return _grads(model)


def test_options_are_the_arguments_of_hyper_ac_backend():
    assert dynamo_backend.OPTIONS == tuple(inspect.signature(backend).parameters)


def test_by_name_with_options_plans_with_the_config_and_matches_eager():
    model, inputs = _model_and_input()
    model(*inputs).backward()
    want = _grads(model)
    results: list = []
    got = _run(model, inputs, backend="hyper_ac",
               options={"config": "full", "compiler": "eager", "model": model, "on_result": results.append})
    assert results and results[0].mode == "full"
    assert results[0].plan.get("duplicates"), "full recomputes: the config reached the plan"
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_config_from_the_environment(monkeypatch):
    model, inputs = _model_and_input()
    seen: list = []
    monkeypatch.setenv(dynamo_backend.ENV_CONFIG, "{ac_mode: selective}")
    monkeypatch.setenv(dynamo_backend.ENV_COMPILER, "eager")
    args = dynamo_backend.backend_arguments()
    assert args == {"config": {"ac_mode": "selective"}, "compiler": "eager"}
    _run(model, inputs, backend="hyper_ac", options={"on_result": seen.append})
    assert seen and seen[0].mode == "selective"
    # options win over the environment
    assert dynamo_backend.backend_arguments({"config": "auto"})["config"] == "auto"
    monkeypatch.setenv(dynamo_backend.ENV_CONFIG, "full")
    assert dynamo_backend.backend_arguments()["config"] == "full"


def test_clear_errors(monkeypatch):
    monkeypatch.delenv(dynamo_backend.ENV_CONFIG, raising=False)
    with pytest.raises(ValueError, match="no config.*HYPER_AC_CONFIG"):
        dynamo_backend.backend_arguments({})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['ac_mode'\]"):
        dynamo_backend.backend_arguments({"ac_mode": "full"})
    monkeypatch.setenv(dynamo_backend.ENV_CONFIG, "{ac_mode: [")
    with pytest.raises(ValueError, match="not valid YAML"):
        dynamo_backend.backend_arguments({})
    with pytest.raises(ValueError, match="mode='max-autotune'"):
        dynamo_backend.hyper_ac_backend(None, [], options={"config": "auto"}, mode="max-autotune")
    model, inputs = _model_and_input()
    monkeypatch.delenv(dynamo_backend.ENV_CONFIG)
    with pytest.raises(Exception, match="no config"):
        _run(model, inputs, backend="hyper_ac")


def test_registered_at_import_and_declared_as_entry_point():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("hyper_ac") is dynamo_backend.hyper_ac_backend
    assert dynamo_backend.register() is False  # already registered: a no-op
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["torch_dynamo_backends"] == {"hyper_ac": "hyper_ac.lower.dynamo_backend:hyper_ac_backend"}
    assert hyper_ac.lower.dynamo_backend.NAME == "hyper_ac"


def test_by_name_inductor(monkeypatch):
    import hyper_ac.lower.backends

    made: list = []
    original = hyper_ac.lower.backends.backend

    def spy(*args, **kwargs):
        made.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(hyper_ac.lower.backends, "backend", spy)
    model = models.build("mlp")  # the smallest model: an Inductor compile is slow on a small machine
    batch = models.example_batch("mlp")
    inputs = (batch["x"], batch["target"])
    model(*inputs).backward()
    want = _grads(model)
    results: list = []
    got = _run(model, inputs, backend="hyper_ac",
               options={"config": "full", "compiler": "inductor", "on_result": results.append})
    assert made and all(kwargs["compiler"] == "inductor" for kwargs in made)
    assert results and results[0].mode == "full"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
