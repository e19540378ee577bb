"""Measured step peaks of a tiny GPT-NeoX under Inductor: stock torch.compile against hyper_ac's modes.

A model outside the bench set (fused query_key_value projection split into q, k, v; partial rotary),
tried as a user would: ``python scripts/neox_inductor_peaks.py [stock selective auto ...]``.
Prints each mode's forward-end and step peaks (``hyper_ac.memory.track()``) and the plan's stats.
docs/mincut.md ("What each forward node is", "Limits") quotes its figures.
"""

from __future__ import annotations

import sys

import torch
import torch._dynamo
import transformers as tf

import hyper_ac
from hyper_ac import memory


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = tf.GPTNeoXConfig(vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=512, max_position_embeddings=128, use_cache=False,
                           hidden_dropout=0.0, attention_dropout=0.0, attn_implementation="eager")
    return tf.GPTNeoXForCausalLM(cfg).train()


def main(modes: list[str]) -> None:
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(1))
    for mode in modes:
        torch._dynamo.reset()
        model = build()
        results: list = []
        if mode == "stock":
            step = torch.compile(model)
        else:
            step = torch.compile(model, backend=hyper_ac.backend({"ac_mode": mode}, model=model,
                                                                 compiler="inductor", on_result=results.append))
        step(input_ids=ids, labels=ids).loss.backward()  # compile, warm up
        for p in model.parameters():
            p.grad = None
        with memory.track() as tracked:
            loss = step(input_ids=ids, labels=ids).loss
            forward_end = tracked.current_bytes
            loss.backward()
        line = f"{mode:10s} step peak {tracked.peak_bytes / 2**20:7.3f} MiB, held after forward {forward_end / 2**20:7.3f} MiB"
        if results:
            stats = results[0].stats
            line += (f"; plan: saved {stats['saved_bytes_after']:,} B, simulated peak {stats['simulated_peak_after']:,} B,"
                     f" {len(results[0].plan.get('duplicates', []))} replayed")
        print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["stock", "selective", "auto"])
