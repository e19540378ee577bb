"""Models outside the bench set under Inductor, tried as a user would: stock ``torch.compile``
against hyper_ac's modes (``compiler="inductor"``), on tiny random-weight HuggingFace models.

    python scripts/outside_in_inductor.py [--models gpt_neox bloom falcon opt qwen2 ...] [--modes stock selective auto]

For each model and mode: the step's measured peak (``hyper_ac.memory.track()``) and its ratio to
stock's, what the step still holds when the forward ends, the plan's saved bytes and simulated
peak, and the largest gradient difference from the uncompiled (eager) step, relative to the
step's largest gradient. docs/mincut.md ("What each forward node is", "Limits") and the
README quote its figures.
"""

from __future__ import annotations

import argparse

import torch
import torch._dynamo
import transformers as tf

import hyper_ac
from hyper_ac import memory

MODELS = ("gpt_neox", "bloom", "falcon", "opt", "qwen2", "phi3", "gemma", "gptj", "qwen2_moe", "roberta", "t5")


def build(name: str) -> torch.nn.Module:
    """4 layers, hidden 128, 4 heads, no dropout, eager attention."""
    torch.manual_seed(0)
    common = dict(vocab_size=512, use_cache=False)
    if name == "gpt_neox":  # one query_key_value projection split into q, k, v; partial rotary
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
            max_position_embeddings=128, hidden_dropout=0.0, attention_dropout=0.0, **common))
    elif name == "bloom":  # fused qkv, ALiBi
        model = tf.BloomForCausalLM(tf.BloomConfig(
            hidden_size=128, n_layer=4, n_head=4, hidden_dropout=0.0, attention_dropout=0.0, **common))
    elif name == "falcon":  # fused qkv, multi-query attention, rotary
        model = tf.FalconForCausalLM(tf.FalconConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, new_decoder_architecture=False,
            multi_query=True, hidden_dropout=0.0, attention_dropout=0.0, **common))
    elif name == "opt":  # separate q, k, v projections, learned positions
        model = tf.OPTForCausalLM(tf.OPTConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, ffn_dim=512,
            max_position_embeddings=256, dropout=0.0, attention_dropout=0.0, word_embed_proj_dim=128, **common))
    elif name == "qwen2":  # grouped-query attention, q/k/v biases
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=512, max_position_embeddings=128, **common))
    elif name == "phi3":  # fused qkv and gate/up projections
        model = tf.Phi3ForCausalLM(tf.Phi3Config(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            intermediate_size=512, max_position_embeddings=128, pad_token_id=0, **common))
    elif name == "gemma":  # multi-query attention, GeGLU, scaled embeddings
        model = tf.GemmaForCausalLM(tf.GemmaConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
            intermediate_size=512, max_position_embeddings=128, **common))
    elif name == "gptj":  # parallel attention and MLP, interleaved partial rotary
        model = tf.GPTJForCausalLM(tf.GPTJConfig(
            n_embd=128, n_layer=4, n_head=4, n_positions=128, rotary_dim=16, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, **common))
    elif name == "qwen2_moe":  # top-2 of 4 experts plus a gated shared expert
        model = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=256,
            num_experts=4, num_experts_per_tok=2, max_position_embeddings=128, **common))
    elif name == "roberta":  # post-LN encoder, masked LM head
        model = tf.RobertaForMaskedLM(tf.RobertaConfig(
            hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
            max_position_embeddings=132, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            vocab_size=512))
    elif name == "t5":  # encoder-decoder, relative position buckets, cross-attention
        model = tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=128, d_kv=32, d_ff=512, num_layers=4, num_decoder_layers=4, num_heads=4, dropout_rate=0.0,
            decoder_start_token_id=0, pad_token_id=0, **common))
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    model.config._attn_implementation = "eager"
    return model.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--modes", nargs="+", default=["stock", "selective", "auto"])
    args = parser.parse_args()
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(1))
    for name in args.models:
        eager = build(name)
        eager(input_ids=ids, labels=ids).loss.backward()
        reference = [p.grad for p in eager.parameters()]
        # Relative to the largest gradient of the step: a gradient that is zero in exact arithmetic (a
        # key projection's bias under softmax) is rounding noise on every side, and its own scale is no scale.
        scale = max(float(r.abs().max()) for r in reference)
        stock_peak = None
        for mode in args.modes:
            torch._dynamo.reset()
            model = build(name)
            results: list = []
            if mode == "stock":
                step = torch.compile(model)
            else:
                step = torch.compile(model, backend=hyper_ac.backend({"ac_mode": mode}, model=model,
                                                                     compiler="inductor", on_result=results.append))
            step(input_ids=ids, labels=ids).loss.backward()  # compile, warm up; its gradients are compared
            gradient_error = max(float((p.grad - r).abs().max()) for p, r in zip(model.parameters(), reference)) / scale
            for p in model.parameters():
                p.grad = None
            with memory.track() as tracked:
                loss = step(input_ids=ids, labels=ids).loss
                forward_end = tracked.current_bytes
                loss.backward()
            if mode == "stock":
                stock_peak = tracked.peak_bytes
            ratio = f" ({tracked.peak_bytes / stock_peak:.3f}x stock)" if stock_peak else ""
            line = (f"{name:9s} {mode:10s} step peak {tracked.peak_bytes / 2**20:7.3f} MiB{ratio}, held after "
                    f"forward {forward_end / 2**20:7.3f} MiB, gradients vs eager {gradient_error:.1e}")
            if results:
                stats = results[0].stats
                line += (f"; plan: saved {stats['saved_bytes_after']:,} B, simulated peak "
                         f"{stats['simulated_peak_after']:,} B, {len(results[0].plan.get('duplicates', []))} replayed")
            print(line, flush=True)


if __name__ == "__main__":
    main()
