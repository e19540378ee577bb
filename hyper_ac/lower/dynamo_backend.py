"""``torch.compile(model, backend="hyper_ac", options={...})``: hyper_ac as a dynamo backend by name.

Frameworks and config files pick a compiler backend by string. The name is
registered with dynamo's backend registry in two ways: by the
``torch_dynamo_backends`` entry point (pyproject.toml), which dynamo reads the
first time it meets a name it does not know, so an installed hyper_ac works
without ``import hyper_ac``; and by ``import hyper_ac`` when torch is already
loaded (a source checkout has no entry point).

For a backend other than ``"inductor"``, ``torch.compile`` passes its
``options`` dict unchanged to the backend as ``options=`` (and ``mode``, when
given, as ``mode=``). The options are :func:`hyper_ac.backend`'s arguments
(:data:`OPTIONS`); what they leave out comes from the environment
(:data:`ENV_CONFIG`, :data:`ENV_COMPILER`) for frameworks that can only pass a
name, then from :func:`hyper_ac.backend`'s defaults. A config is required:
without one the backend raises rather than silently leave the model as stock.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

__all__ = ["NAME", "OPTIONS", "ENV_CONFIG", "ENV_COMPILER", "hyper_ac_backend", "backend_arguments", "register"]

#: The backend's name in ``torch.compile(backend=...)``.
NAME = "hyper_ac"
#: The environment variable read for the config when ``options`` give none: a preset
#: name (``auto``), a YAML path, or an inline YAML / JSON mapping (``{ac_mode: full}``).
ENV_CONFIG = "HYPER_AC_CONFIG"
#: The environment variable read for the compiler (``eager`` | ``inductor``) when ``options`` give none.
ENV_COMPILER = "HYPER_AC_COMPILER"


#: The keys ``options`` may hold: :func:`hyper_ac.backend`'s parameters, under their own names
#: (a test keeps the two lists equal; this module stays torch-free until a graph compiles).
OPTIONS = ("config", "model", "compiler", "tag_only", "on_result", "detail")


def _config_from_env(value: str) -> Any:
    """A preset name or YAML path as it is; an inline mapping parsed (YAML reads JSON too)."""
    if value.lstrip().startswith("{"):
        import yaml

        try:
            data = yaml.safe_load(value)
        except yaml.YAMLError as error:
            raise ValueError(f"hyper_ac backend: {ENV_CONFIG} holds an inline mapping that is not valid YAML/JSON: "
                             f"{error}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"hyper_ac backend: {ENV_CONFIG}={value!r} is not a mapping")
        return dict(data)
    return value


def backend_arguments(options: Optional[Mapping[str, Any]] = None,
                      environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """The keyword arguments of :func:`hyper_ac.backend` for ``torch.compile(..., options=options)``:
    ``options`` first, then :data:`ENV_CONFIG` / :data:`ENV_COMPILER`. Raises ``ValueError``
    on an unknown key or when no config is given anywhere."""
    environ = os.environ if environ is None else environ
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"hyper_ac backend: unknown option(s) {unknown}; torch.compile(backend='hyper_ac', "
                         f"options=...) takes {list(OPTIONS)} (the arguments of hyper_ac.backend)")
    if "config" not in options or options["config"] is None:
        value = environ.get(ENV_CONFIG, "").strip()
        if not value:
            raise ValueError(
                "hyper_ac backend: no config. Pass one with torch.compile(model, backend='hyper_ac', "
                f"options={{'config': 'auto'}}) (a preset name, a YAML path or a dict), or set {ENV_CONFIG} "
                f"(e.g. {ENV_CONFIG}=auto) where a framework can only pass the backend's name")
        options["config"] = _config_from_env(value)
    if "compiler" not in options and environ.get(ENV_COMPILER, "").strip():
        options["compiler"] = environ[ENV_COMPILER].strip()
    return options


def hyper_ac_backend(gm: Any, example_inputs: Any, *, options: Optional[Mapping[str, Any]] = None,
                     mode: Optional[str] = None):
    """The compiler function registered as ``"hyper_ac"``: builds :func:`hyper_ac.backend`
    from ``options`` (:func:`backend_arguments`) and compiles this graph with it."""
    if mode not in (None, "default"):
        raise ValueError(f"hyper_ac backend: torch.compile(mode={mode!r}) selects stock Inductor's settings and "
                         "does not apply to hyper_ac; leave mode unset and set Inductor's options through "
                         "torch._inductor.config (they apply to options={'compiler': 'inductor'})")
    from hyper_ac.lower.backends import backend

    return backend(**backend_arguments(options))(gm, example_inputs)


def register() -> bool:
    """Register :func:`hyper_ac_backend` as ``"hyper_ac"`` with dynamo (imports ``torch._dynamo``).
    True if this call registered it, False if the name already resolves to it (the entry point
    loaded it, or a second call). Raises ``RuntimeError`` if another backend holds the name."""
    from torch._dynamo.backends import registry

    try:
        registry.register_backend(compiler_fn=hyper_ac_backend, name=NAME)
        return True
    except AssertionError:  # dynamo asserts on a duplicate name
        if registry.lookup_backend(NAME) is hyper_ac_backend:
            return False
        raise RuntimeError(f"hyper_ac: torch.compile backend name {NAME!r} is taken by "
                           f"{registry.lookup_backend(NAME)!r}") from None


def entry_point_installed() -> bool:
    """Whether an installed distribution declares this backend in ``torch_dynamo_backends``."""
    from importlib.metadata import entry_points

    target = f"{__name__}:{hyper_ac_backend.__name__}"
    return any(ep.value == target for ep in entry_points(group="torch_dynamo_backends", name=NAME))


def register_if_torch_loaded() -> None:
    """``import hyper_ac``'s hook: register the name when torch is already imported, so a
    source checkout (no entry point) works; otherwise ``import hyper_ac`` stays torch-free.
    With the entry point installed, dynamo registers it itself: this import may be dynamo
    loading it, and a registration here would then collide with dynamo's own."""
    if "torch" in sys.modules and not entry_point_installed():
        register()

