"""Per-layer saved bytes of HF GPT-2 with and without dropout (issue 16).

The core's own saved-bytes figure (``hyper_ac.plan(...).stats["saved_bytes_after"]``,
replay states included) for a 4- and a 2-layer model; the per-layer figure is
the difference halved, in units of s*b*h*4 bytes (fp32). Seq 128, batch 4,
hidden 128, 4 heads, eager attention, as in the issue's table.

    python -m benchmarks.rng_saved_bytes > benchmarks/results/rng_saved_bytes.md
"""

from __future__ import annotations

import platform
import time
import warnings

import torch
import transformers

from benchmarks.provenance import code_commit, machine_load
from benchmarks.report import provenance_header
from hyper_ac import models, plan
from hyper_ac.frontend.capture import capture_joint

SEQ, BATCH, HIDDEN, HEADS = 128, 4, 128, 4


_CAPTURED: dict = {}


def saved_bytes(layers: int, dropout: float, config: dict) -> tuple[int, int]:
    if (layers, dropout) not in _CAPTURED:
        model = models.hf_model("gpt2", layers, hidden=HIDDEN, heads=HEADS, max_seq=SEQ, dropout=dropout)
        batch = models.example_batch("gpt2", batch=BATCH, seq=SEQ)
        _CAPTURED[layers, dropout] = (capture_joint(model, **batch), model)
    cap, model = _CAPTURED[layers, dropout]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = plan(cap.graph_module, config, model=model).stats
    return stats["saved_bytes_after"], stats.get("rng_state_bytes", 0)


def main() -> None:
    started = time.perf_counter()
    meta = {"command": "python -m benchmarks.rng_saved_bytes", "commit": code_commit(),
            "date": time.strftime("%Y-%m-%d"), "load": machine_load(),
            "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
            "torch": torch.__version__, "transformers": transformers.__version__}
    unit = SEQ * BATCH * HIDDEN * 4
    lines = [f"per-layer saved bytes, GPT-2 fp32 seq {SEQ} batch {BATCH} hidden {HIDDEN}; unit s*b*h = {unit} B",
             "", "| mode | rng | dropout 0 | dropout 0.1 | of which replay states |", "|---|---|---|---|---|"]
    for mode in ("off", "full", "selective", "auto"):
        for rng in ("replay", "save"):
            row = []
            states = 0
            for dropout in (0.0, 0.1):
                b4, s4 = saved_bytes(4, dropout, {"ac_mode": mode, "ac_rng": rng})
                b2, s2 = saved_bytes(2, dropout, {"ac_mode": mode, "ac_rng": rng})
                row.append((b4 - b2) / 2)
                states = (s4 - s2) / 2
            lines.append(f"| {mode} | {rng} | {row[0] / unit:.3f} ({row[0]:.0f} B) | {row[1] / unit:.3f} ({row[1]:.0f} B) "
                         f"| {states:.0f} B |")
    meta["total_seconds"] = time.perf_counter() - started
    print("# Per-layer saved bytes, GPT-2 with and without dropout\n")
    print("\n".join(provenance_header(meta)) + "\n")
    print("The core's `saved_bytes_after` (replay states included); per layer = (4-layer - 2-layer) / 2.\n")
    print("\n".join(lines))

if __name__ == "__main__":
    main()
