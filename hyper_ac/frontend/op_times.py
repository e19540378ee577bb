"""Measured op times for ``hardware: measured`` (docs/config.md, "Measured op times").

Measurement, not a decision: the serialiser asks :class:`OpTimer` for the
seconds one run of a node's operator takes on this machine, and writes them
into the graph document as the node's ``measured_seconds``; the core prices
replays by them (``core/include/hyper_ac/cost.h``).

A node is timed by running its ``OpOverload`` standalone on fresh tensors of
its inputs' shapes, strides and dtypes (from the FX node's fake values) on
its output's device. Float inputs hold values in [0.5, 1) and integer / bool
inputs zeros (a valid index for gather / embedding / loss targets), drawn
from a private generator: the global RNG state is left alone. Nodes that
cannot be replayed so are skipped (the roofline prices them) and counted by
reason in :data:`STATS`: random ops, collectives, in-place ops, views, ops
that are no ``OpOverload`` (``getitem``, higher-order ops), symbolic shapes
or non-tensor values, and ops that fail on such inputs.

Times are cached on disk, one JSON file keyed by (operator, input
signature, device): ``$HYPER_AC_CACHE_DIR/op_times.json``, else
``~/.cache/hyper_ac/op_times.json``. Writes are atomic (a temporary file
renamed over it, merged with what another process wrote meanwhile); a file
that cannot be read as a cache gives a warning and is rebuilt.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
import torch.fx as fx

from hyper_ac import fx_meta

__all__ = ["CACHE_ENV", "STATS", "MeasureStats", "OpTimer", "cache_path", "clear_cache"]

#: The environment variable naming the cache's directory.
CACHE_ENV = "HYPER_AC_CACHE_DIR"
_FILE = "op_times.json"
_FORMAT = "hyper_ac.op_times"
_VERSION = 1
#: Wall time one timing trial aims at, and the trials per op (the least is kept).
_TRIAL_SECONDS = 2e-3
_TRIALS = 3
_MAX_REPS = 50


def cache_path() -> Path:
    """The cache file: ``$HYPER_AC_CACHE_DIR/op_times.json``, else ``~/.cache/hyper_ac/op_times.json``."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "hyper_ac") / _FILE


def clear_cache() -> None:
    """Delete the cache file (the next ``hardware: measured`` plan measures every op again)."""
    try:
        cache_path().unlink()
    except FileNotFoundError:
        pass


@dataclasses.dataclass
class MeasureStats:
    """Counts since import (or the last :meth:`reset`): nodes timed now, nodes
    whose time the cache held, and nodes skipped (left to the roofline) by reason."""

    measured: int = 0
    cached: int = 0
    skipped: dict = dataclasses.field(default_factory=dict)

    def reset(self) -> None:
        self.measured = self.cached = 0
        self.skipped = {}


STATS = MeasureStats()


class _Skip(Exception):
    """A node that cannot be replayed standalone; its argument is the reason."""


def _load(path: Path) -> dict[str, float]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as error:
        warnings.warn(f"hyper_ac: cannot read the op time cache '{path}' ({error.strerror}); measuring again")
        return {}
    try:
        doc = json.loads(text)
        if not (isinstance(doc, dict) and doc.get("format") == _FORMAT and doc.get("version") == _VERSION):
            raise ValueError(f"not a {_FORMAT} version {_VERSION} document")
        times = doc["times"]
        if not isinstance(times, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in times.values()):
            raise ValueError("'times' must map keys to finite seconds >= 0")
        return {str(k): float(v) for k, v in times.items()}
    except (ValueError, KeyError, TypeError) as error:
        warnings.warn(f"hyper_ac: the op time cache '{path}' is corrupt ({error}); it is rebuilt")
        return {}


def _save(path: Path, times: dict[str, float]) -> None:
    """Atomically: merged with the file's current entries, written to a temporary file, renamed over it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a corrupt file was already reported when loaded
            merged = _load(path)
        merged.update(times)
        doc = {"format": _FORMAT, "version": _VERSION, "times": dict(sorted(merged.items()))}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".op_times.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(doc, out, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as error:
        warnings.warn(f"hyper_ac: cannot write the op time cache '{path}' ({error.strerror}); times kept in memory")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu:{torch.get_num_threads()}threads"
    return device.type


def _concrete(sizes: Any) -> tuple[int, ...]:
    out = tuple(sizes)
    if not all(type(s) is int for s in out):
        raise _Skip("symbolic")
    return out


def _signature(value: Any) -> Any:
    """A JSON-ready stand-in for an argument: tensors by (shape, stride, dtype)."""
    if isinstance(value, fx.Node):
        value = fx_meta.val(value)
        if not isinstance(value, torch.Tensor):
            raise _Skip("symbolic")
    if isinstance(value, torch.Tensor):
        return ["T", list(_concrete(value.shape)), list(_concrete(value.stride())), str(value.dtype)]
    if isinstance(value, (list, tuple)):
        return [_signature(v) for v in value]
    if isinstance(value, (bool, int, float, str, type(None))):
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value)
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    raise _Skip("symbolic" if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) else "argument")


def _real(value: Any, generator: dict) -> Any:
    """The argument with every node replaced by a fresh tensor of its value's layout."""
    if isinstance(value, fx.Node):
        fake = fx_meta.val(value)
        shape, stride = _concrete(fake.shape), _concrete(fake.stride())
        extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0
        base = torch.empty(max(extent, 0), dtype=fake.dtype, device=fake.device)
        if base.is_floating_point():
            gen = generator.get(fake.device)
            if gen is None:
                gen = generator[fake.device] = torch.Generator(device=fake.device).manual_seed(0)
            base.uniform_(0.5, 1.0, generator=gen)
        else:
            base.zero_()
        return base.as_strided(shape, stride)
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, generator) for v in value)
    return value


def _out_device(val: Any) -> torch.device:
    tensors = [val] if isinstance(val, torch.Tensor) else list(val) if isinstance(val, (list, tuple)) else []
    if not tensors or not all(isinstance(t, torch.Tensor) or t is None for t in tensors):
        raise _Skip("output")
    devices = {t.device for t in tensors if t is not None}
    if len(devices) != 1:
        raise _Skip("output")
    (device,) = devices
    if device.type == "meta":
        raise _Skip("output")
    return device


def _time(run: Any, sync: Any) -> float:
    run()  # warm-up (allocator, caches, lazy initialisation)
    sync()
    start = time.perf_counter()
    run()
    sync()
    once = max(time.perf_counter() - start, 1e-9)
    reps = max(1, min(_MAX_REPS, int(_TRIAL_SECONDS / once)))
    best = math.inf
    for _ in range(_TRIALS):
        start = time.perf_counter()
        for _ in range(reps):
            run()
        sync()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


class OpTimer:
    """One serialisation's measurer: reads the cache once, times what it lacks, writes it back once (:meth:`close`)."""

    def __init__(self, path: Optional[Path] = None) -> None:
        self.path = Path(path) if path is not None else cache_path()
        self.times = _load(self.path)
        self.new: dict[str, float] = {}
        self._generators: dict = {}

    def seconds(self, node: fx.Node, name: str, facts: Any, rng: bool) -> Optional[float]:
        """Seconds one run of ``node``'s op takes here (``name``: its target name, ``facts``:
        its :class:`~hyper_ac.frontend.op_facts.OpFacts`), or None when it cannot be replayed standalone."""
        try:
            key, args, kwargs, device = self._prepare(node, name, facts, rng)
        except _Skip as skip:
            STATS.skipped[skip.args[0]] = STATS.skipped.get(skip.args[0], 0) + 1
            return None
        hit = self.times.get(key)
        if hit is not None:
            STATS.cached += 1
            return hit
        try:
            seconds = self._measure(node.target, args, kwargs, device)
        except Exception:  # an op that does not run on such inputs: the roofline prices it
            STATS.skipped["failed"] = STATS.skipped.get("failed", 0) + 1
            return None
        STATS.measured += 1
        self.times[key] = self.new[key] = seconds
        return seconds

    def close(self) -> None:
        """Write the times measured since the cache was read (nothing when none were)."""
        if self.new:
            _save(self.path, self.new)
            self.new = {}

    def _prepare(self, node: fx.Node, name: str, facts: Any, rng: bool) -> tuple:
        if not isinstance(node.target, torch._ops.OpOverload):
            raise _Skip("not_an_op")
        if rng:
            raise _Skip("random")
        if facts.collective:
            raise _Skip("collective")
        if facts.mutated:
            raise _Skip("in_place")
        if facts.view:
            raise _Skip("view")
        device = _out_device(fx_meta.val(node))
        signature = [name, _signature(node.args), sorted((k, _signature(v)) for k, v in node.kwargs.items()),
                     _device_name(device)]
        return json.dumps(signature, separators=(",", ":")), node.args, dict(node.kwargs), device

    def _measure(self, target: Any, args: Any, kwargs: dict, device: torch.device) -> float:
        from torch.utils._python_dispatch import _disable_current_modes

        # Real tensors, outside any fake / functional mode the caller (a compile backend) runs under.
        with _disable_current_modes(), torch.no_grad():
            real_args = _real(args, self._generators)
            real_kwargs = {k: _real(v, self._generators) for k, v in kwargs.items()}
            sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
            return _time(lambda: target(*real_args, **real_kwargs), sync)
