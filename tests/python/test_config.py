"""Config loading: presets, YAML quirks, and one test per error class."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hyper_ac.planning import config as hc
from hyper_ac.frontend import adapters
from hyper_ac.frontend.adapters import ModelAdapter
from hyper_ac.planning.config import ConfigError, load_config

CONFIGS = hc.CONFIG_DIR  # hyper_ac/configs: package data


@pytest.mark.parametrize("preset", sorted(p.name for p in CONFIGS.glob("*.yaml") if p.name != "op_policy.yaml"))
def test_every_preset_loads(preset):
    cfg = load_config(CONFIGS / preset)
    assert cfg.mode in {"off", "full", "selective", "auto", "budget"}


def test_presets_found_by_name():
    assert load_config("selective.yaml").mode == "selective"


def test_presets_resolve_by_name_and_path_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the package's own presets answer
    for source in ("full", "full.yaml", "configs/full.yaml", hc.CONFIG_DIR / "full.yaml"):
        cfg = load_config(source)
        assert cfg.mode == "full", source
        assert Path(cfg.source) == hc.CONFIG_DIR / "full.yaml", source
    assert load_config("budget").mode == "budget"
    assert hc.preset_names() == ["auto", "budget", "flat", "full", "layers", "moe", "selective"]
    # a file of the same name in the working directory wins over the preset
    (tmp_path / "full.yaml").write_text("ac_mode: selective\n")
    assert load_config("full.yaml").mode == "selective"
    with pytest.raises(ConfigError, match=r"'fulll' does not exist.*full"):
        load_config("fulll")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("op_policy/../nope")


def test_backend_accepts_a_preset_name():
    import hyper_ac

    assert callable(hyper_ac.backend("auto"))
    assert hyper_ac.backend("auto").aot_backend is not None


def test_mode_config_takes_the_budget_from_the_budget_preset():
    preset = load_config("budget").data["activation_checkpoint"]["memory_budget"]
    assert hc.mode_config("budget") == {"ac_mode": "budget", "ac_memory_budget": preset}
    assert hc.mode_config("auto") == {"ac_mode": "auto"}
    for mode in ("off", "full", "selective", "auto", "budget"):
        assert load_config(hc.mode_config(mode)).mode == mode


def test_unquoted_off_in_yaml_is_mode_off(tmp_path):
    path = tmp_path / "off.yaml"
    path.write_text("activation_checkpoint:\n  mode: off\n")
    assert load_config(path).mode == "off"
    path.write_text("ac_mode: off\n")
    assert load_config(path).mode == "off"


def test_flat_and_nested_forms_agree():
    flat = load_config({"ac_mode": "full", "ac_layer_count": 2})
    nested = load_config({"activation_checkpoint": {"mode": "full", "selection": {"layer_count": 2}}})
    assert flat.data == nested.data


@pytest.mark.parametrize("mode, key, allowed", [
    ("off", None, True), ("auto", None, False), ("full", None, False),
    ("auto", "inductor", True), ("off", "none", False), ("off", "auto", True),
])
def test_buffer_reuse_resolves_per_mode(mode, key, allowed):
    config = {"ac_mode": mode, **({"ac_buffer_reuse": key} if key else {})}
    assert load_config(config).inductor_buffer_reuse is allowed


def test_buffer_reuse_bad_value_names_the_key_and_the_choices(tmp_path):
    path = tmp_path / "reuse.yaml"
    path.write_text("activation_checkpoint:\n  mode: auto\n  buffer_reuse: yes\n")
    with pytest.raises(ConfigError, match=r"activation_checkpoint.buffer_reuse.*must be a string \(auto, inductor or none\)"):
        load_config(path)


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ConfigError, match=r"activation_checkpoint.selction.*did you mean 'selection'"):
        load_config({"activation_checkpoint": {"mode": "full", "selction": {}}})


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"'ac_layer_count'.*boolean"):
        load_config({"ac_mode": "full", "ac_layer_count": True})
    with pytest.raises(ConfigError, match=r"regions.exclude.*strings"):
        load_config({"activation_checkpoint": {"regions": {"exclude": [3]}}})


def test_conflicting_options():
    with pytest.raises(ConfigError, match="both layer_count and layer_indices"):
        load_config({"ac_mode": "full", "ac_layer_count": 1, "ac_layer_indices": [0]})
    with pytest.raises(ConfigError, match="needs a memory_budget"):
        load_config({"ac_mode": "budget"})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("activation_checkpoint: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(empty)


def test_error_names_the_file(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("ac_mdoe: full\n")
    with pytest.raises(ConfigError, match=r"typo.yaml.*did you mean 'ac_mode'"):
        load_config(path)


def test_not_a_config():
    with pytest.raises(TypeError, match="YAML path, a dict"):
        load_config(42)
    with pytest.raises(ConfigError, match="not plain data"):
        load_config({"ac_mode": {1, 2}})


def test_op_policy_override_is_validated():
    with pytest.raises(ConfigError, match="did you mean 'must_recompute'"):
        load_config({"ac_mode": "selective", "op_policy": {"must_recompte": ["aten::topk"]}})
    cfg = load_config({"ac_mode": "selective", "op_policy": {"must_save": ["aten::bmm"]}})
    assert cfg.data["op_policy"] == {"must_save": ["aten::bmm"]}


def test_adapter_registry_and_run_once_hook():
    calls = []

    class Model:
        pass

    class SubModel(Model):
        pass

    policy = ModelAdapter(["layers.*.mlp"], ["*.mlp.act"], on_applied=calls.append)
    adapters.register_adapter(Model, policy)
    try:
        model = SubModel()
        assert hc.adapter_for(model) is policy
        adapters.apply_adapter_hook(model)
        adapters.apply_adapter_hook(model)
        assert calls == [model]
        data = json.loads(load_config({"ac_mode": "full"}).json_for(model))
        assert data["adapter"] == {"include": ["layers.*.mlp"], "exclude": ["*.mlp.act"]}
    finally:
        adapters.unregister_adapter(Model)
    assert hc.adapter_for(SubModel()) is None


def test_recompute_policy_validates_its_fields():
    with pytest.raises(TypeError, match="region_patterns"):
        ModelAdapter("layers.*")
    with pytest.raises(TypeError, match="on_applied"):
        ModelAdapter(["a"], on_applied=3)


# Issue 14: YAML spellings of numbers JSON cannot carry, or that YAML 1.1 reads
# as strings, give messages saying what was read.
@pytest.mark.parametrize("text, spelled", [(".inf", ".inf"), ("-.inf", "-.inf"), (".nan", ".nan"), (".NaN", ".nan")])
def test_yaml_non_finite_numbers_are_named(tmp_path, text, spelled):
    path = tmp_path / "c.yaml"
    path.write_text(f"activation_checkpoint:\n  mode: auto\n  lambda: {text}\n")
    with pytest.raises(ConfigError, match=rf"{path.name}.*'activation_checkpoint.lambda': read {re.escape(spelled)}.*finite"):
        load_config(path)
    path.write_text(f"ac_mode: auto\nac_hardware:\n  peak_flops: {text}\n  memory_bandwidth: 1.0e+12\n")
    with pytest.raises(ConfigError, match=rf"'ac_hardware.peak_flops': read {re.escape(spelled)}"):
        load_config(path)
    with pytest.raises(ConfigError, match=rf"'ac_memory_budget': read {re.escape(spelled)}"):
        load_config({"ac_mode": "budget", "ac_memory_budget": float(text.replace(".", "").lower())})


def test_yaml_exponent_without_a_dot_is_a_string_and_the_message_says_so(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ac_mode: auto\nac_lambda: 1e15\n")
    with pytest.raises(ConfigError, match=r"'ac_lambda'.*the string \"1e15\".*write 1\.0e\+15"):
        load_config(path)
    path.write_text("ac_mode: auto\nac_hardware: {peak_flops: 1e15, memory_bandwidth: 1.0e+12}\n")
    with pytest.raises(ConfigError, match=r"'ac_hardware.peak_flops'.*the string \"1e15\".*1\.0e\+15"):
        load_config(path)
    path.write_text("ac_mode: auto\nac_lambda: 1.0e+15\n")  # YAML 1.1: a float needs the '.' and the sign
    assert load_config(path).data["activation_checkpoint"]["lambda"] == 1e15
    # A byte size may be a string: 1e15 bytes.
    path.write_text("ac_mode: budget\nac_memory_budget: 1e15\n")
    assert load_config(path).data["activation_checkpoint"]["memory_budget"] == 1e15


def test_numbers_outside_their_range_name_the_range():
    with pytest.raises(ConfigError, match=r"'ac_lambda'.*\[0, 1e\+30\].*1e\+31"):
        load_config({"ac_mode": "auto", "ac_lambda": 1e31})
    with pytest.raises(ConfigError, match=r"peak_flops.*\[1, 1e\+30\].*1e-300"):
        load_config({"ac_mode": "auto", "ac_hardware": {"peak_flops": 1e-300, "memory_bandwidth": 1e12}})
    # A budget past any peak is accepted (it means no limit).
    assert load_config({"ac_mode": "budget", "ac_memory_budget": 1e19}).data["activation_checkpoint"]["memory_budget"] == 1e19


def test_canonical_form_carries_every_resolved_value():
    """The core writes every option's value, defaults included (its option table): Python restates none."""
    section = load_config({"ac_mode": "auto"}).data["activation_checkpoint"]
    assert {k: section[k] for k in ("compiler", "split", "buffer_reuse", "rng", "scope")} == {
        "compiler": "eager", "split": "native", "buffer_reuse": "auto", "rng": "replay", "scope": "auto"}
    assert section["selection"]["source"] == "blocks"
    assert "lambda" not in section  # derived from the hardware: a fact, not a setting


def test_facts_come_from_the_core():
    from hyper_ac import _core

    facts = load_config({"ac_mode": "auto", "ac_hardware": "h100"}).facts
    assert facts["plans"] and facts["compare_with_stock"] and not facts["lambda_configured"]
    assert facts["lambda"] == 3.35e12 / 4  # memory_bandwidth / 4 (docs/config.md)
    assert json.loads(_core.config_facts(load_config({"ac_mode": "auto", "ac_lambda": 5.0}).to_json()))["lambda"] == 5.0
    assert not load_config("full").facts["compare_with_stock"]
    assert not load_config({"ac_mode": "off"}).facts["plans"]
    # The compiler a backend runs: an eager config takes it; an unknown name is the core's ConfigError.
    assert load_config({"ac_mode": "auto"}).with_compiler("inductor").compiler == "inductor"
    assert load_config({"ac_mode": "auto", "ac_compiler": "inductor"}).with_compiler("eager").compiler == "inductor"
    with pytest.raises(ConfigError, match="compiler must be.*'tvm'"):
        load_config({"ac_mode": "auto"}).with_compiler("tvm")
    with pytest.raises(ConfigError, match="compiler must be.*'tvm'"):
        load_config({"ac_mode": "auto"}).facts_for("tvm")
    assert load_config({"ac_mode": "auto", "ac_buffer_reuse": "none"}).facts_for("eager")["warnings"]
    assert not load_config({"ac_mode": "auto", "ac_buffer_reuse": "none"}).facts_for("inductor")["warnings"]


def test_default_op_table_is_the_shipped_one_everywhere():
    """The binding's default table (no op_policy_json) is the CLI's: op_policy.yaml compiled in, equal to the file."""
    from hyper_ac import _core
    from hyper_ac.planning.config import DEFAULT_OP_POLICY, op_policy_json

    assert json.loads(_core.DEFAULT_OP_POLICY) == json.loads(op_policy_json(DEFAULT_OP_POLICY))
    assert op_policy_json() == _core.DEFAULT_OP_POLICY
    from conftest import get_captured

    captured = get_captured("transformer")
    graph, cfg = captured.json(), load_config("selective").json_for(captured.model)
    shipped = _core.plan(graph, cfg)
    assert shipped == _core.plan(graph, cfg, op_policy_json(DEFAULT_OP_POLICY))
    assert shipped != _core.plan(graph, cfg, "")  # "" is no table: selective then decides otherwise


def test_with_option_sets_one_key_on_either_form():
    # Flat and nested forms give the same canonical config; the other keys stay; the core validates the value.
    flat = load_config({"ac_mode": "budget", "ac_memory_budget": 0.5}).with_option("scope", "unit_graph")
    nested = load_config({"activation_checkpoint": {"mode": "budget", "memory_budget": 0.5}}).with_option("scope", "unit_graph")
    assert flat.data == nested.data
    assert flat.data["activation_checkpoint"]["scope"] == "unit_graph"
    assert flat.data["activation_checkpoint"]["memory_budget"] == 0.5
    with pytest.raises(ConfigError, match="scope"):
        load_config("full").with_option("scope", "everything")
