"""Small built-in models for demos, tests and benchmarks.

Nothing here downloads weights: the HuggingFace models are built from tiny
configs with random (seeded) initialisation.

* :class:`TinyMLP` — torch-only MLP.
* :class:`TinyTransformer` — torch-only decoder-only transformer with the
  HuggingFace scope marker (``gradient_checkpointing``) and its blocks in a
  ``nn.ModuleList`` named ``layers``.
* :func:`hf_model` — tiny ``gpt2`` / ``llama`` / ``mistral`` / ``qwen2`` / ``mixtral`` / ``bert``.
* :func:`example_batch` — inputs (with labels) whose forward returns a loss.
* :func:`build` — one call for any of the above names.
* :func:`parallelize` — torchtitan's tensor / sequence parallel plan (DTensor)
  for the Llama-family HF models, optionally with FSDP2 on a data-parallel mesh.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "TinyMLP",
    "TinyTransformer",
    "TransformerBlock",
    "SelfAttention",
    "FeedForward",
    "MODEL_NAMES",
    "HF_MODEL_NAMES",
    "hf_model",
    "example_batch",
    "build",
    "parallelize",
    "PARALLEL_MODEL_NAMES",
]

DEFAULT_SEED = 0

HF_MODEL_NAMES = ("gpt2", "llama", "mistral", "qwen2", "mixtral", "bert", "t5")
MODEL_NAMES = ("mlp", "transformer") + HF_MODEL_NAMES


# --------------------------------------------------------------------------
# torch-only models
# --------------------------------------------------------------------------


class TinyMLP(nn.Module):
    """``Linear → ReLU → … → Linear``; returns MSE loss when ``target`` is given."""

    def __init__(self, dim: int = 32, hidden: int = 64, depth: int = 3, out_dim: int | None = None):
        super().__init__()
        out_dim = dim if out_dim is None else out_dim
        dims = [dim] + [hidden] * (depth - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        if target is not None:
            return F.mse_loss(x, target)
        return x


class SelfAttention(nn.Module):
    """Causal multi-head attention with q/k/v/o projections."""

    def __init__(self, dim: int, heads: int, use_sdpa: bool = False, dropout: float = 0.0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.use_sdpa = use_sdpa
        self.dropout = dropout
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        if self.use_sdpa:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
            probs = F.dropout(torch.softmax(scores, dim=-1), p=p, training=self.training)
            out = probs @ v
        out = out.transpose(1, 2).reshape(b, s, d)
        return self.o_proj(out)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.up_proj = nn.Linear(dim, hidden)
        self.down_proj = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down_proj(F.gelu(self.up_proj(x))))


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: ``x + attn(ln(x))``, ``x + mlp(ln(x))``."""

    def __init__(self, dim: int, heads: int, hidden: int, use_sdpa: bool = False, dropout: float = 0.0):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(dim)
        self.self_attn = SelfAttention(dim, heads, use_sdpa=use_sdpa, dropout=dropout)
        self.post_attention_layernorm = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim, hidden, dropout=dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyTransformer(nn.Module):
    """Decoder-only LM. ``forward(input_ids, labels=None)``.

    Returns the mean next-token cross-entropy when ``labels`` is given, the
    logits otherwise. ``gradient_checkpointing`` is the HuggingFace marker the
    scope discovery looks for: the blocks in ``layers`` are the units.
    """

    def __init__(
        self,
        vocab: int = 128,
        dim: int = 64,
        heads: int = 4,
        num_layers: int = 2,
        hidden: int | None = None,
        max_seq: int = 64,
        use_sdpa: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.gradient_checkpointing = False
        hidden = 4 * dim if hidden is None else hidden
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.embed_positions = nn.Embedding(max_seq, dim)
        self.layers = nn.ModuleList(
            TransformerBlock(dim, heads, hidden, use_sdpa=use_sdpa, dropout=dropout) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("position_ids", torch.arange(max_seq), persistent=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        s = input_ids.shape[1]
        x = self.embed_tokens(input_ids) + self.embed_positions(self.position_ids[:s])
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        if labels is None:
            return logits
        return F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        )


# --------------------------------------------------------------------------
# tiny HuggingFace models
# --------------------------------------------------------------------------

_HF_VOCAB = 128
_HF_HIDDEN = 64
_HF_HEADS = 4


def hf_model(
    name: str,
    num_layers: int = 2,
    *,
    hidden: int = _HF_HIDDEN,
    heads: int = _HF_HEADS,
    vocab: int = _HF_VOCAB,
    max_seq: int = 64,
    dropout: float = 0.0,
    attn_implementation: str = "eager",
    seed: int = DEFAULT_SEED,
    **overrides: Any,
) -> nn.Module:
    """A tiny, randomly initialised HuggingFace model in training mode.

    ``name``: ``gpt2`` (GPT2LMHeadModel), ``llama`` (LlamaForCausalLM),
    ``mistral`` (MistralForCausalLM), ``qwen2`` (Qwen2ForCausalLM),
    ``mixtral`` (MixtralForCausalLM, 4 experts, top-2), ``bert``
    (BertForMaskedLM), ``t5`` (T5ForConditionalGeneration). ``overrides`` go to the config unchanged.
    """
    import transformers as tf

    name = name.lower()
    common = dict(use_cache=False, tie_word_embeddings=False)
    if name == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=vocab, n_positions=max_seq, n_embd=hidden, n_layer=num_layers, n_head=heads,
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0,
            **common,
        )
        cls, loss_type = tf.GPT2LMHeadModel, "ForCausalLM"
    elif name == "llama":
        cfg = tf.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
            num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_seq,
            attention_dropout=dropout, **common,
        )
        cls, loss_type = tf.LlamaForCausalLM, "ForCausalLM"
    elif name in ("mistral", "qwen2"):
        config_cls, cls = {"mistral": (tf.MistralConfig, tf.MistralForCausalLM),
                           "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM)}[name]
        cfg = config_cls(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
            num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_seq,
            attention_dropout=dropout, **common,
        )
        loss_type = "ForCausalLM"
    elif name == "mixtral":
        cfg = tf.MixtralConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
            num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_seq,
            num_local_experts=4, num_experts_per_tok=2, attention_dropout=dropout,
            router_aux_loss_coef=0.0, output_router_logits=False, **common,
        )
        cls, loss_type = tf.MixtralForCausalLM, "ForCausalLM"
    elif name == "bert":
        cfg = tf.BertConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=num_layers, num_attention_heads=heads,
            intermediate_size=2 * hidden, max_position_embeddings=max_seq, hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout, **common,
        )
        cls, loss_type = tf.BertForMaskedLM, "ForMaskedLM"
    elif name == "t5":
        # Encoder-decoder: two kinds of repeated block (encoder.block.N, decoder.block.N).
        cfg = tf.T5Config(
            vocab_size=vocab, d_model=hidden, d_kv=hidden // heads, d_ff=2 * hidden, num_layers=num_layers,
            num_decoder_layers=num_layers, num_heads=heads, dropout_rate=dropout, decoder_start_token_id=0,
            pad_token_id=0, eos_token_id=1, **common,
        )
        cls, loss_type = tf.T5ForConditionalGeneration, None
    else:
        raise ValueError(f"unknown HF model {name!r}; choose from {HF_MODEL_NAMES}")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(cfg)
    if loss_type is not None:
        model.loss_type = loss_type  # silences transformers' "unrecognized loss_type" warning
    model.train()
    return model


def example_batch(model_name: str, batch: int = 2, seq: int = 16, *, vocab: int = _HF_VOCAB,
                  dim: int = 32, seed: int = DEFAULT_SEED) -> dict[str, torch.Tensor]:
    """Keyword inputs (incl. labels) so ``model(**batch)`` returns a loss.

    ``mlp``: ``{"x", "target"}`` of width ``dim``; ``transformer`` and HF
    models: ``{"input_ids", "labels"}`` (plus ``attention_mask`` for BERT).
    """
    g = torch.Generator().manual_seed(seed)
    name = model_name.lower()
    if name == "mlp":
        return {"x": torch.randn(batch, dim, generator=g), "target": torch.randn(batch, dim, generator=g)}
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    if name in ("transformer", "gpt2", "llama", "mistral", "qwen2", "mixtral", "t5"):
        return {"input_ids": ids, "labels": ids.clone()}
    if name == "bert":
        labels = torch.full_like(ids, -100)
        labels[:, ::3] = ids[:, ::3]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    raise ValueError(f"unknown model {model_name!r}; choose from {MODEL_NAMES}")


def build(name: str, num_layers: int = 2, *, seed: int = DEFAULT_SEED, **kwargs: Any) -> nn.Module:
    """Any built-in model by name (``MODEL_NAMES``), seeded, in training mode."""
    name = name.lower()
    if name in HF_MODEL_NAMES:
        return hf_model(name, num_layers, seed=seed, **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            model: nn.Module = TinyMLP(depth=num_layers + 1, **kwargs)
        elif name == "transformer":
            model = TinyTransformer(num_layers=num_layers, **kwargs)
        else:
            raise ValueError(f"unknown model {name!r}; choose from {MODEL_NAMES}")
    model.train()
    return model


# --------------------------------------------------------------------------
# tensor / sequence parallelism (DTensor) and FSDP2
# --------------------------------------------------------------------------

#: The HF model names :func:`parallelize` has a plan for (one decoder layout: q/k/v/o
#: attention projections, gate/up/down MLP, RMSNorms, rotary embedding).
PARALLEL_MODEL_NAMES = ("llama", "mistral", "qwen2")


def parallelize(model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False,
                dp_mesh: Any = None, wrap_layer: Any = None) -> nn.Module:
    """Shard a Llama-family HF model in place as torchtitan does, and return it.

    Tensor parallel over ``tp_mesh`` (a 1-D ``DeviceMesh``): q/k/v and gate/up
    ``ColwiseParallel``, o and down ``RowwiseParallel`` (a forward all-reduce
    after each; the backward all-reduces the input gradients). With
    ``sequence_parallel`` the residual stream is sharded along the sequence
    (``Shard(1)``) between the blocks: the norms run ``SequenceParallel``, a
    forward all-gather precedes attention and the MLP, a reduce-scatter follows
    them, and ``lm_head`` gathers its input. ``dp_mesh``: FSDP2 (``fully_shard``)
    on each decoder layer and the root over that mesh (2-D: FSDP2 × TP).
    ``wrap_layer(layer) -> module``: applied to each decoder layer after TP and
    before FSDP2 (torchtitan's order: TP, activation checkpointing, per-block
    compile, FSDP2), its result put in the layer's place.
    Heads must divide by the TP degree.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel, parallelize_module)

    config = getattr(model, "config", None)
    decoder = getattr(model, "model", None)
    if config is None or getattr(config, "model_type", None) not in PARALLEL_MODEL_NAMES or decoder is None:
        raise ValueError(f"parallelize: no tensor-parallel plan for {type(model).__name__}; it has one for the "
                         f"HF models {', '.join(PARALLEL_MODEL_NAMES)} (hyper_ac.models.build)")
    degree = tp_mesh.size()
    for key in ("num_attention_heads", "num_key_value_heads"):
        if getattr(config, key) % degree:
            raise ValueError(f"parallelize: {key}={getattr(config, key)} does not divide by the tensor-parallel "
                             f"degree {degree}")
    colwise = {name: ColwiseParallel() for name in
               ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")}
    if sequence_parallel:
        # The residual stream stays a Shard(1) DTensor between the blocks (use_local_output=False).
        parallelize_module(decoder, tp_mesh, {
            "embed_tokens": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                                use_local_output=False),
            # only the dtype and device of its input matter: its local shard, no gather
            "rotary_emb": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                             use_local_output=True),
            "norm": SequenceParallel(),
        })
        parallelize_module(model, tp_mesh, {
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
        layer_plan = {
            **colwise,
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        }
    else:
        layer_plan = {**colwise, "self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for i, layer in enumerate(decoder.layers):
        parallelize_module(layer, tp_mesh, layer_plan)
        if wrap_layer is not None:
            decoder.layers[i] = wrap_layer(layer)
    if dp_mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for layer in decoder.layers:
            fully_shard(layer, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return model
