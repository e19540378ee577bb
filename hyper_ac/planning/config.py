"""Loading and validating pass configs.

YAML (or a dict) goes in; the C++ core validates it (unknown keys with a
did-you-mean, wrong types, conflicts) and returns its canonical form, with the
region patterns of the model's adapter (:mod:`hyper_ac.frontend.adapters`).

The presets and the operator policy table ship inside the package
(``hyper_ac/configs/``; the checkout's top-level ``configs`` links there):
``load_config("full")``, ``load_config("full.yaml")`` and
``load_config("configs/full.yaml")`` find them from any working directory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import yaml

from hyper_ac import _core
from hyper_ac.frontend.adapters import adapter_for

#: The presets and the default operator policy table (package data).
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_OP_POLICY = CONFIG_DIR / "op_policy.yaml"

ConfigError = _core.ConfigError


@dataclasses.dataclass(frozen=True)
class Config:
    """A validated config: ``data`` is the core's canonical form."""

    data: Mapping[str, Any]
    source: str = "<dict>"

    @property
    def mode(self) -> str:
        return self.data["activation_checkpoint"]["mode"]

    @functools.cached_property
    def facts(self) -> Mapping[str, Any]:
        """What the core resolves this config to (``_core.config_facts``): ``plans``,
        ``compare_with_stock``, ``compiler``, ``split``, ``buffer_reuse``,
        ``inductor_buffer_reuse``, the effective ``lambda``, ``hardware``, ``rng``
        (docs/config.md). Python only reads them."""
        return self.facts_for(None)

    def facts_for(self, runner: Optional[str]) -> Mapping[str, Any]:
        """:attr:`facts` for the compiler that will run the graph (``eager`` | ``inductor``,
        checked by the core), with the ``warnings`` of settings that have no effect with it."""
        return json.loads(_core.config_facts(self.to_json(), runner))

    @property
    def compiler(self) -> str:
        """The fusion assumption of the recompute cost: ``eager`` (default) or ``inductor``."""
        return self.data["activation_checkpoint"]["compiler"]

    def with_compiler(self, compiler: str) -> "Config":
        """This config planned for ``compiler`` (``eager`` | ``inductor``, checked by the core);
        a config that already names inductor keeps it (``hyper_ac::with_runner``)."""
        return Config(json.loads(_core.with_runner(self.to_json(), compiler)), self.source)

    def with_option(self, key: str, value: Any) -> "Config":
        """This config with one ``activation_checkpoint`` key set (nested name, e.g. ``"scope"``),
        validated again by the core: the one way to set an option on a config of either form."""
        return self.with_options(**{key: value})

    def with_options(self, **keys: Any) -> "Config":
        """This config with these ``activation_checkpoint`` keys set, validated again by the core;
        its ``memory_budget`` is dropped when the mode set is not ``budget`` (a budget belongs to
        budget mode only)."""
        data = json.loads(self.to_json())
        section = {**data["activation_checkpoint"], **keys}
        if section.get("mode") != "budget":
            section.pop("memory_budget", None)
        data["activation_checkpoint"] = section
        return load_config(data)

    @property
    def split_method(self) -> str:
        """Config key ``split``. ``native`` (default): the backend builds the forward and backward modules from the
        core's split; ``torch``: with PyTorch's ``_extract_fwd_bwd_modules`` (docs/config.md)."""
        return self.data["activation_checkpoint"]["split"]

    @property
    def buffer_reuse(self) -> str:
        """``auto`` (default), ``inductor`` or ``none``: Inductor's buffer reuse in the graphs
        ``hyper_ac.backend(compiler="inductor")`` compiles (docs/config.md)."""
        return self.data["activation_checkpoint"]["buffer_reuse"]

    @property
    def inductor_buffer_reuse(self) -> bool:
        """Whether Inductor may reuse buffers here (the core's ``buffer_reuse`` rule: ``auto``
        keeps stock's reuse in mode ``off`` only)."""
        return self.facts["inductor_buffer_reuse"]

    @property
    def rng(self) -> str:
        """``replay`` (default) or ``save``: what the core may do with random ops (docs/config.md)."""
        return self.data["activation_checkpoint"]["rng"]

    def to_json(self) -> str:
        return json.dumps(self.data, sort_keys=True)

    def json_for(self, model: Any = None) -> str:
        """The config JSON handed to the core, with the model adapter's patterns."""
        data = dict(self.data)
        policy = adapter_for(model)
        if policy is not None:
            data["adapter"] = {"include": list(policy.region_patterns), "exclude": list(policy.exclude_patterns)}
            try:
                return _core.validate_config(json.dumps(data))
            except ConfigError as error:
                raise ConfigError(f"{self.source}: {error}") from None
        return json.dumps(data)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config file '{path}': {error.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"config file '{path}' is not valid YAML: {error}") from None


def preset_names() -> list[str]:
    """The presets shipped in :data:`CONFIG_DIR` (``load_config(name)`` loads one)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "op_policy")


def _resolve_path(path: Path) -> Optional[Path]:
    """An existing file, else the preset it names: ``full``, ``full.yaml`` or ``configs/full.yaml``."""
    if path.exists() or path.is_absolute():
        return path if path.exists() else None
    parts = path.parts[1:] if path.parts[:1] == ("configs",) else path.parts
    if not parts:
        return None
    candidate = CONFIG_DIR.joinpath(*parts)
    if not candidate.suffix:
        candidate = candidate.with_suffix(".yaml")
    return candidate if candidate.is_file() else None


def mode_config(mode: str) -> dict:
    """The config of one ``ac_mode`` with nothing else set. ``budget`` needs a
    budget: it takes the ``budget`` preset's ``memory_budget`` (the one place
    that fraction is written)."""
    config: dict = {"ac_mode": mode}
    if mode == "budget":
        config["ac_memory_budget"] = load_config("budget").data["activation_checkpoint"]["memory_budget"]
    return config


def _check_finite(data: Any, key: str = "") -> None:
    """Non-finite floats (YAML ``.inf``, ``-.inf``, ``.nan``) are rejected here,
    naming the key and what was read: JSON has no spelling for them."""
    if isinstance(data, float) and not math.isfinite(data):
        spelled = ".nan" if math.isnan(data) else (".inf" if data > 0 else "-.inf")
        raise ConfigError(f"config key '{key}': read {spelled} ({data!r}); every number in a config must be finite")
    if isinstance(data, Mapping):
        for name, value in data.items():
            _check_finite(value, f"{key}.{name}" if key else str(name))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            _check_finite(value, f"{key}[{index}]")


def load_config(source: Union[str, os.PathLike, Mapping[str, Any], Config, None]) -> Config:
    """Load and validate a config from a preset name, a YAML path, a dict or a Config.

    Raises ``hyper_ac.planning.config.ConfigError`` (a ``ValueError``) naming the key.
    """
    if isinstance(source, Config):
        return source
    if source is None:
        data: Any = {"ac_mode": "off"}
        label = "<none>"
    elif isinstance(source, (str, os.PathLike)):
        path = _resolve_path(Path(source))
        if path is None:
            raise ConfigError(
                f"config file '{source}' does not exist (presets, by name or path: {', '.join(preset_names())})")
        data = _read_yaml(path)
        label = str(path)
        if data is None:
            raise ConfigError(f"config file '{path}' is empty")
    elif isinstance(source, Mapping):
        data = dict(source)
        label = "<dict>"
    else:
        raise TypeError(f"config must be a YAML path, a dict or a hyper_ac Config, got {type(source).__name__}")
    try:
        _check_finite(data)
        canonical = _core.validate_config(json.dumps(data, allow_nan=False))
    except ConfigError as error:
        raise ConfigError(f"{label}: {error}") from None
    except TypeError as error:  # json.dumps on a non-JSON value (a date, a set, ...)
        raise ConfigError(f"{label}: config holds a value that is not plain data: {error}") from None
    return Config(json.loads(canonical), label)


_OP_POLICY_CACHE: dict[str, str] = {}


def op_policy_json(path: Union[str, os.PathLike, None] = None) -> str:
    """The operator policy table as the JSON the core reads. ``None``: the shipped table
    (:data:`DEFAULT_OP_POLICY`) as the core compiled it in (``_core.DEFAULT_OP_POLICY``, the
    CLI's default and the binding's when no table is passed)."""
    if path is None:
        return _core.DEFAULT_OP_POLICY
    path = Path(path)
    key = str(path)
    if key not in _OP_POLICY_CACHE:
        data = _read_yaml(path)
        text = json.dumps(data)
        try:
            _core.validate_op_policy(text)
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None
        _OP_POLICY_CACHE[key] = text
    return _OP_POLICY_CACHE[key]


def byte_size(value: Any, what: str, *, allow_zero: bool = False) -> int:
    """``value`` in bytes, read by the core's own size parser (``"6GiB"``, ``"512MB"``, ``1.5e9``).

    Raises ``ConfigError`` naming ``what`` for anything else, and for a
    figure of 1 or less, which ``memory_budget`` would read as a fraction
    (0 passes when ``allow_zero``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{what}: expected a byte count or a size string such as \"6GiB\", "
                          f"got {type(value).__name__}")
    if allow_zero and value in (0, "0"):
        return 0
    try:
        parsed = load_config({"ac_mode": "budget", "ac_memory_budget": value})
    except ConfigError as error:
        raise ConfigError(f"{what} {value!r}: {error}") from None
    size = parsed.data["activation_checkpoint"]["memory_budget"]
    if size <= 1:
        raise ConfigError(f"{what} {value!r} is not a byte size: give bytes (\"6GiB\", 5e8), not a fraction")
    return int(size)
