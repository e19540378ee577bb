"""HuggingFace ``Trainer`` with hyper_ac as its compiler (issue 25).

A few optimiser steps of a tiny GPT-2 under ``Trainer``, the model compiled
with ``backend="hyper_ac"``, log the same losses as the same run compiled
with the stock backend the config's compiler stands for (``aot_eager`` for
``compiler: eager``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from hyper_ac import models  # noqa: E402


class _Batches(torch.utils.data.Dataset):
    def __init__(self):
        self.batch = models.example_batch("gpt2", batch=8, seq=16)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.batch.items()}


def _args(tmp_path, **kwargs):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, use_cpu=True, report_to=[],
        logging_steps=1, save_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True, **kwargs)


def _losses(tmp_path, backend, options=None):
    model = models.build("gpt2")
    model.compile(backend=backend, options=options)  # in place: Trainer keeps the HF model class
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = transformers.Trainer(model=model, args=_args(tmp_path), train_dataset=_Batches())
        trainer.train()
    torch._dynamo.reset()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_trainer_with_hyper_ac_matches_stock_aot_eager(tmp_path):
    stock = _losses(tmp_path / "stock", "aot_eager")
    got = _losses(tmp_path / "hyper_ac", "hyper_ac", {"config": "full", "compiler": "eager"})
    assert len(stock) == 3
    assert got == stock


@pytest.mark.xfail(strict=True, raises=ValueError,
                   reason="accelerate's TorchDynamoPlugin accepts only the backend names of its DynamoBackend enum")
def test_training_arguments_torch_compile_backend_by_name(tmp_path, monkeypatch):
    # What a Trainer user would write. accelerate rejects any name outside its enum,
    # so this fails before anything compiles; when it stops failing (strict xfail),
    # the README's Trainer advice can name torch_compile_backend="hyper_ac".
    monkeypatch.setenv("HYPER_AC_CONFIG", "full")
    transformers.Trainer(model=models.build("gpt2"), args=_args(tmp_path, torch_compile=True,
                                                                 torch_compile_backend="hyper_ac"),
                         train_dataset=_Batches())
