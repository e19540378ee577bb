"""Capture a training step without its memory: a model built from its config alone, under ``FakeTensorMode``.

Planning a model that does not fit the planning machine needs its joint graph,
not its weights. :func:`capture_from_config` builds a HuggingFace model from
its ``config.json`` with every parameter, buffer and input a ``FakeTensor``
(shape, dtype and stride, no storage), and captures the joint forward+backward
graph the usual way (:func:`hyper_ac.frontend.capture.capture_joint`, the
compile tracer). The graph is the one a real step would give on the CPU: the
same ops, the same sizes, attention as the fused kernel the CPU dispatch picks
for it (flash attention, which saves its output and log-sum-exp as CUDA's
flash kernel does). The core then plans it as any other graph; nothing runs.

Why fake tensors and not the meta device: on the meta device the attention
falls back to its math decomposition (an S×S score matrix per head, which no
GPU run keeps) and ``nll_loss`` has no autograd kernel, so the backward is lost.
What the simulation cannot see is written in docs/fake-planning.md.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.nn as nn

from hyper_ac.frontend.capture import CapturedGraph, capture_joint

__all__ = ["DTYPES", "capture_fake", "capture_from_config", "load_hf_config"]

#: ``--dtype`` names and the parameter dtype each means.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Head classes tried in order: a language-model head computes the loss from ``labels``.
_HEADS = {"AutoModelForCausalLM": "ForCausalLM", "AutoModelForMaskedLM": "ForMaskedLM"}


def load_hf_config(source: Union[str, os.PathLike, Mapping[str, Any]]) -> Any:
    """A ``transformers`` config from a ``config.json`` path (or a directory holding one) or its dict.

    Raises ``ValueError`` naming the file and what is wrong: unreadable, not
    JSON, no ``model_type``, or a ``model_type`` this ``transformers`` does not know.
    """
    try:
        import transformers
    except ImportError:
        raise ValueError("planning from a HuggingFace config needs the transformers package "
                         "(pip install transformers)") from None
    if isinstance(source, Mapping):
        where, doc = "<dict>", dict(source)
    else:
        where = os.fspath(source)
        path = os.path.join(where, "config.json") if os.path.isdir(where) else where
        try:
            with open(path) as f:
                text = f.read()
        except OSError as error:
            raise ValueError(f"cannot read HuggingFace config '{path}': {error.strerror}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"HuggingFace config '{path}' is not JSON: {error}") from None
        where = path
    if not isinstance(doc, dict):
        raise ValueError(f"HuggingFace config {where}: expected a JSON object, got {type(doc).__name__}")
    model_type = doc.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"HuggingFace config {where}: key 'model_type' is missing; it names the architecture "
                         "(e.g. \"llama\", \"mixtral\", \"gpt2\")")
    fields = {k: v for k, v in doc.items() if k != "model_type"}
    try:
        return transformers.AutoConfig.for_model(model_type, **fields)
    except ValueError as error:
        raise ValueError(f"HuggingFace config {where}: model_type {model_type!r} is unknown to transformers "
                         f"{transformers.__version__}: {str(error).splitlines()[0]}") from None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _language_model(config: Any, attention: str) -> nn.Module:
    """The language-model head class for ``config``, built under the caller's modes."""
    import transformers

    config.use_cache = False
    config._attn_implementation = attention
    errors = []
    for head, loss_type in _HEADS.items():
        try:
            model = getattr(transformers, head).from_config(config)
        except ValueError as error:  # not a model of that head
            errors.append(f"{head}: {str(error).splitlines()[0]}")
            continue
        # A class name transformers does not map to a loss (GPT2LMHeadModel) would warn inside the trace.
        model.loss_type = loss_type
        return model
    raise ValueError(f"model_type {config.model_type!r} has no language-model head to train with labels: "
                     + "; ".join(errors))


def capture_fake(make_model: Callable[[], nn.Module], make_batch: Callable[[], Mapping[str, Any]], *,
                 dtype: torch.dtype = torch.float32, loss_fn: Optional[Callable[[Any], torch.Tensor]] = None,
                 ) -> CapturedGraph:
    """The joint graph of one training step of ``make_model()`` on ``make_batch()``, every tensor fake.

    Both callables run under one ``FakeTensorMode`` with ``dtype`` the default
    float dtype, so parameters, buffers and the batch have shapes but no
    storage. The model's other tensor outputs (logits, ...) stay forward
    outputs after the loss, alive through the backward as in ``torch.compile(model)``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)  # constants a forward makes (positions) are real
    with fake_mode, _default_dtype(dtype):
        model = make_model()
        model.train()
        batch = dict(make_batch())
        # The capture runs the traced step once: under the mode, the tensors its factory ops make
        # (an S×S causal mask per layer) are fake too, not gigabytes of real memory.
        return capture_joint(model, loss_fn=loss_fn, keep_outputs=True, **batch)


def capture_from_config(config: Any, *, seq: int, batch: int = 1,
                        dtype: Union[str, torch.dtype] = "bf16", attention: str = "sdpa") -> CapturedGraph:
    """The joint graph of one training step of the model ``config`` describes, on fake tensors.

    ``config``: a ``transformers`` config, or what :func:`load_hf_config` reads
    (a path or a dict). The model is its language-model head class in training
    mode, without a KV cache, with ``attention`` as its attention implementation
    (transformers' name: ``sdpa``, ``eager``), parameters of ``dtype``
    (a :data:`DTYPES` name or a torch dtype). The batch is ``batch × seq`` token
    ids and labels of that shape, from which the model computes its loss.
    """
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    for name, value, least in (("seq", seq, 2), ("batch", batch, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"capture_from_config: {name} must be an integer of at least {least}, got {value!r}")
    if not hasattr(config, "model_type"):
        config = load_hf_config(config)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and seq > limit:
        raise ValueError(f"seq {seq} is longer than the config's max_position_embeddings {limit}")

    def token_batch() -> dict:
        # Labels are a tensor of their own, as in a real batch.
        return {"input_ids": torch.zeros(batch, seq, dtype=torch.long),
                "labels": torch.zeros(batch, seq, dtype=torch.long)}

    return capture_fake(lambda: _language_model(config, attention), token_batch, dtype=dtype)
