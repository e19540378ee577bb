"""Planning without the memory (issue 38): the step captured on fake tensors, planned as any graph.

The fake capture gives the graph a real capture gives; its plans' simulated
peaks predict real steps (CPU, eager compiler) within 3%; nothing real is
allocated; the CLI's per-mode table and its errors.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import hyper_ac
from hyper_ac import _core, memory, models
from hyper_ac.__main__ import main
from hyper_ac.frontend.capture import capture_joint
from hyper_ac.frontend.fake import capture_fake, capture_from_config, load_hf_config

SHAPE = dict(hidden=64, heads=4, max_seq=64)


def _zeros(batch: dict) -> dict:
    return {k: torch.zeros_like(v) for k, v in batch.items()}


def _config(mode: str) -> dict:
    if mode == "budget":
        return {"ac_mode": "budget", "ac_memory_budget": 0.5, "ac_peak_oracle": "off"}
    return {"ac_mode": mode, "ac_peak_oracle": "off"}


def test_fake_capture_is_the_real_capture():
    model = models.build("llama", 2, **SHAPE)
    batch = models.example_batch("llama", batch=2, seq=32)
    fake = capture_fake(lambda: models.build("llama", 2, **SHAPE), lambda: _zeros(batch))
    real = capture_joint(copy.deepcopy(model), keep_outputs=True, **batch)
    assert all(isinstance(p, torch._subclasses.FakeTensor) for p in fake.model.parameters())
    assert _core.graph_summary(fake.to_json()) == _core.graph_summary(real.to_json())
    for mode in ("full", "selective", "budget"):
        ours, theirs = (hyper_ac.plan(c.graph_module, _config(mode), c.model) for c in (fake, real))
        assert ours.saved == theirs.saved
        assert ours.stats["simulated_peak_after"] == theirs.stats["simulated_peak_after"]


@pytest.mark.parametrize("name, mode", [("llama", "full"), ("gpt2", "selective"), ("mixtral", "budget"),
                                        ("bert", "auto"), ("transformer", "off"), ("gpt2", "off"),
                                        ("mixtral", "off")])
def test_fake_plan_predicts_the_measured_step_within_3_percent(name, mode):
    # The benchmark's bench shape, two layers (benchmarks.fake_planning measures all five models, every mode).
    build = (lambda: models.build(name, 2, dim=128, heads=4, max_seq=128)) if name == "transformer" else (
        lambda: models.build(name, 2, hidden=128, heads=4, max_seq=128))
    model = build()
    batch = models.example_batch(name, batch=4, seq=128)
    fake = capture_fake(build, lambda: _zeros(batch))
    cfg = _config("full" if mode == "off" else mode)
    stats = hyper_ac.plan(fake.graph_module, cfg, fake.model).stats
    # off is the uncompiled eager step: everything saved, and each saved input freed only when the autograd
    # node reading it returns (simulated_activation_peak_autograd); a planned mode the step hyper_ac's
    # backend compiles.
    predicted = stats["simulated_activation_peak_autograd" if mode == "off" else "simulated_activation_peak_after"]
    run = model if mode == "off" else torch.compile(
        model, fullgraph=True, backend=hyper_ac.backend(cfg, model=model, compiler="eager"))
    memory.loss_of(run(**batch)).backward()
    for p in model.parameters():
        p.grad = None
    measured = memory.measure_step(lambda: run(**batch)).peak_bytes
    assert abs(predicted - measured) <= 0.03 * measured, f"{name}/{mode}: predicted {predicted} B, measured {measured} B"


def test_capture_from_config_allocates_no_real_memory():
    config = models.build("llama", 2, **SHAPE).config.to_dict()
    config["max_position_embeddings"] = 1024
    with memory.track() as t:
        captured = capture_from_config(config, seq=1024, batch=2, dtype="fp32")
    # A real capture holds a 1024 x 1024 causal mask per layer, and the activations: megabytes.
    assert t.peak_bytes < 64 * 1024, t.peak_bytes
    summary = _core.graph_summary(captured.to_json())
    assert summary["backward_nodes"] > 0 and summary["activation_bytes_read_by_backward"] > 2**20


def _tiny_config(tmp_path, **changes):
    doc = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
           **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


def test_cli_plans_every_mode_from_a_config(tmp_path, capsys):
    path = _tiny_config(tmp_path)
    assert main(["plan", "--hf-config", str(path), "--seq", "128", "--batch", "2", "--dtype", "fp32",
                 "--hardware", "h100", "--device-memory", "3MiB"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] and
            line.split()[0] in ("off", "selective", "auto", "full", "budget")}
    assert set(rows) == {"off", "selective", "auto", "full", "budget"}
    assert rows["off"][-1] == "no" and rows["full"][-1] == "yes"  # 3 MiB: between full's peak (2.3 MiB) and off's (3.7)
    assert "fits 3.00 MiB" in out and "  mode: budget" in out and "  hardware: h100" in out
    assert main(["plan", "--hf-config", str(path), "--seq", "128", "--batch", "2", "--dtype", "fp32",
                 "--device-memory", "1MiB"]) == 0
    assert "nothing fits 1.00 MiB" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--seq", "64", "--hardware", "measured"], "hardware: measured times each op"),
    ([], "--hf-config needs --seq"),
    (["--seq", "1024"], "longer than the config's max_position_embeddings 256"),
    (["--seq", "64", "--device-memory", "0.5"], "not a byte size"),
    (["--seq", "64", "--device-memory", "1MiB", "--reserve", "2MiB"], "leaves nothing"),
    (["--seq", "64", "--print"], "--print and --detail"),
])
def test_cli_refuses_bad_arguments(tmp_path, capsys, argv, message):
    assert main(["plan", "--hf-config", str(_tiny_config(tmp_path)), *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_plan_of_a_graph_file_keeps_its_form(tmp_path, capsys):
    assert main(["plan", str(tmp_path / "g.json")]) == 2
    assert "plan needs a graph file and a config" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "g.json"), "full", "--seq", "8"]) == 2
    assert "--seq goes with --hf-config" in capsys.readouterr().err


def test_load_hf_config_names_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="cannot read HuggingFace config"):
        load_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        load_hf_config(bad)
    with pytest.raises(ValueError, match="key 'model_type' is missing"):
        load_hf_config({"hidden_size": 8})
    with pytest.raises(ValueError, match="model_type 'no-such-model' is unknown"):
        load_hf_config({"model_type": "no-such-model"})
    assert load_hf_config(_tiny_config(tmp_path)).num_hidden_layers == 2  # a path
    assert load_hf_config(tmp_path).num_hidden_layers == 2  # its directory


def test_shipped_8b_config_reads_as_the_8b_shape():
    from pathlib import Path

    config = load_hf_config(Path(__file__).resolve().parents[2] / "examples" / "hf_configs" / "llama3_8b.json")
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size) == (32, 4096, 14336, 32, 8, 128256)
