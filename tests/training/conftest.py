"""What the training tests share: one small GPT configuration, its data and a small trainer.

Fixtures, not imports: a test module never imports another test module.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.training.trainer import TrainConfig, Trainer, split_train_val


@pytest.fixture
def small_config() -> GPTConfig:
    """The one model size of the training tests: vocabulary 7, context 16, 2 layers of width 16."""
    return GPTConfig(vocab_size=7, context_length=16, n_layers=2, n_heads=2, d_model=16)


@pytest.fixture
def model_and_data(small_config: GPTConfig) -> Callable[..., tuple[GPT, torch.Tensor, torch.Tensor]]:
    """model_and_data(seed=0) -> (a small GPT from `seed`, train ids, val ids) of an easy pattern."""
    def make(seed: int = 0) -> tuple[GPT, torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        pattern = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1])  # easy to learn
        return GPT(small_config), *split_train_val(pattern.repeat(300), 0.2)
    return make


@pytest.fixture
def tiny_trainer(small_config: GPTConfig) -> Callable[..., Trainer]:
    """tiny_trainer(**config) -> a Trainer of the small GPT (seed 0), batch 2, one evaluation batch
    every 2 steps, the plain path unless `config` says otherwise; validation is another text."""
    def make(**config: object) -> Trainer:
        torch.manual_seed(0)
        ids = torch.tensor([0, 1, 2, 3, 4, 3, 2, 1]).repeat(10)
        settings = dict(batch_size=2, eval_batches=1, eval_every=2, fast=False) | config
        val = torch.tensor([4, 4, 0, 0, 1, 2]).repeat(10)  # another text: its loss differs
        return Trainer(GPT(small_config), ids, val, TrainConfig(**settings))
    return make
