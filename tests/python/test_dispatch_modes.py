"""A step compiled with hyper_ac runs under any ``TorchDispatchMode`` (issue 25).

MFU counters (``FlopCounterMode``), memory trackers and debug modes push a
dispatch mode around the forward or the backward. The random-op replays
hyper_ac writes into the graph (``run_and_save_rng_state`` /
``run_with_rng_state``, torch's higher-order ops) have no rule for such modes;
the eager compiler runs their per-device kernels as plain calls
(:mod:`hyper_ac.lower.runtime`), so the wrapped op is dispatched as an ordinary op.
Each step is compared with the same compiled step run without the mode: bit
for bit on the eager compiler, to rounding on Inductor.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import hyper_ac
from hyper_ac import models


class DoNothing(TorchDispatchMode):
    """A mode that only forwards each op (supports_higher_order_operators left False)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _gpt2(hidden: int = 64):
    model = models.build("gpt2", dropout=0.1, hidden=hidden, heads=2 if hidden < 64 else 4, max_seq=32)
    return model, models.example_batch("gpt2", batch=4, seq=32)


def _opt():
    """An OPT-like decoder (learned positions, pre-LN, ReLU MLP) with OPT's default dropout 0.1."""
    import transformers as tf

    cfg = tf.OPTConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                       max_position_embeddings=64, word_embed_proj_dim=64, dropout=0.1, use_cache=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tf.OPTForCausalLM(cfg)
    model.config._attn_implementation = "eager"
    return model.train(), models.example_batch("gpt2", batch=4, seq=32)


def _step(compiled, model, batch, forward_mode=None, backward_mode=None):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(7)
    with forward_mode or contextlib.nullcontext():
        loss = compiled(**batch).loss
    with backward_mode or contextlib.nullcontext():
        loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _modes():
    return {"FlopCounterMode": lambda: FlopCounterMode(display=False), "DoNothing": DoNothing}


@pytest.mark.parametrize("name, mode", [("gpt2", "full"), ("gpt2", "selective"), ("gpt2", "auto"),
                                        ("opt", "selective")])
def test_eager_compiler_step_under_dispatch_modes_is_bitwise(name, mode):
    model, batch = _gpt2() if name == "gpt2" else _opt()
    results: list = []
    compiled = torch.compile(model, backend=hyper_ac.backend({"ac_mode": mode}, model=model,
                                                             on_result=results.append))
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FlopCounterMode's global module hooks; recompute-cost notes
        reference = _step(compiled, model, batch)
        assert sum(r.stats.get("rng_replayed", 0) for r in results) > 0, "no random op is replayed: nothing tested"
        for mode_name, make in _modes().items():
            # The backward first: a forward under FlopCounterMode installs global module
            # hooks, which make dynamo recompile, and the later steps run that graph.
            for phase in ("backward_mode", "forward_mode"):
                active = make()
                loss, grads = _step(compiled, model, batch, **{phase: active})
                if isinstance(active, FlopCounterMode):  # the mode saw the step's ops
                    assert active.get_total_flops() > 0
                assert torch.equal(loss, reference[0]), f"{mode_name} in the {phase}: the loss differs"
                for got, want in zip(grads, reference[1]):
                    assert torch.equal(got, want), f"{mode_name} in the {phase}: a gradient differs"
    torch._dynamo.reset()


def test_inductor_backward_under_dispatch_modes():
    # Inductor's own random numbers are functional (seeded), so its graph holds
    # no replay op; the backward under a mode matches the one without to rounding.
    model, batch = _gpt2(hidden=32)
    compiled = torch.compile(model, backend=hyper_ac.backend({"ac_mode": "full"}, model=model, compiler="inductor"))
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = _step(compiled, model, batch)
        for mode_name, make in _modes().items():
            loss, grads = _step(compiled, model, batch, backward_mode=make())
            torch.testing.assert_close(loss, reference[0], msg=f"{mode_name}: the loss differs")
            for got, want in zip(grads, reference[1]):
                torch.testing.assert_close(got, want, msg=f"{mode_name}: a gradient differs")
    torch._dynamo.reset()
