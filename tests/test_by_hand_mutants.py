"""helpers.training.by_hand: what the mutation run (benchmarks/mutation.py) showed no test asserting.

Every refusal's whole message (the argument named, what it got, what was expected), the edges
of each accepted range (the shortest window, beta = 0, lr = 0, a list of betas), and the step
against torch.optim.AdamW on those edges.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from helpers.model.gpt import GPT, GPTConfig
from helpers.training.by_hand import adamw_update, next_token_loss

TINY = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=1, d_model=8)


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(TINY)


@pytest.mark.parametrize("model, ids, error, said", [
    ("gpt", torch.zeros(2, 3, dtype=torch.long), TypeError,
     "model is a str, expected a language model (an nn.Module mapping ids (B, N) to logits (B, N, V))"),
    (None, [[1, 2]], TypeError, "ids is a list, expected a tensor of token ids (B, N + 1)"),
    (None, torch.zeros(2, 3, dtype=torch.complex64), TypeError,
     "ids has dtype torch.complex64, expected integer token ids (torch.long)"),
    (None, torch.zeros(2, 3), TypeError, "ids has dtype torch.float32, expected integer token ids (torch.long)"),
    (None, torch.zeros(2, 3, dtype=torch.bool), TypeError,
     "ids has dtype torch.bool, expected integer token ids (torch.long)"),
    (None, torch.zeros(2, 1, dtype=torch.long), ValueError,
     "ids has shape (2, 1), expected windows (B, N + 1) of at least 2 tokens: N inputs and, one step "
     "later, N targets"),
    (None, torch.zeros(3, dtype=torch.long), ValueError, "ids has shape (3,), expected windows (B, N + 1)"),
])
def test_next_token_loss_messages(model, ids, error, said):
    with pytest.raises(error, match="^" + re.escape(said)):
        next_token_loss(tiny_gpt() if model is None else model, ids)


def test_next_token_loss_on_the_shortest_windows_is_f_cross_entropy():
    model = tiny_gpt()
    ids = torch.tensor([[1, 2], [3, 0], [4, 4]])  # N = 1: one input and one target per window
    expected = F.cross_entropy(model(ids[:, :1]).flatten(0, 1), ids[:, 1])
    assert torch.allclose(next_token_loss(model, ids), expected, atol=1e-6)
    assert next_token_loss(model, ids).shape == ()


GOOD = {"p": torch.ones(2, 3), "g": torch.ones(2, 3), "m": torch.zeros(2, 3), "v": torch.zeros(2, 3), "t": 1,
        "lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.1}


@pytest.mark.parametrize("change, error, said", [
    ({"p": [[1.0]]}, TypeError, "p is a list, expected a tensor"),
    ({"g": [[1.0]]}, TypeError, "g is a list, expected a tensor"),
    ({"m": None}, TypeError, "m is a NoneType, expected a tensor"),
    ({"v": 0.0}, TypeError, "v is a float, expected a tensor"),
    ({"p": torch.ones(2, 3, dtype=torch.long)}, TypeError, "p has dtype torch.int64, expected a floating-point tensor"),
    ({"g": torch.ones(2, 3, dtype=torch.int32)}, TypeError, "g has dtype torch.int32, expected a floating-point tensor"),
    ({"m": torch.zeros(2, 3, dtype=torch.bool)}, TypeError, "m has dtype torch.bool, expected a floating-point tensor"),
    ({"v": torch.zeros(2, 3, dtype=torch.long)}, TypeError, "v has dtype torch.int64, expected a floating-point tensor"),
    ({"g": torch.ones(3, 2)}, ValueError, "g has shape (3, 2), expected p's shape (2, 3)"),
    ({"m": torch.zeros(6)}, ValueError, "m has shape (6,), expected p's shape (2, 3)"),
    ({"v": torch.zeros(2, 3, 1)}, ValueError, "v has shape (2, 3, 1), expected p's shape (2, 3)"),
    ({"t": 0}, ValueError, "t is 0, expected a positive int"),
    ({"lr": -0.1}, ValueError, "lr is -0.1, expected a finite number >= 0"),
    ({"lr": float("inf")}, ValueError, "lr is inf, expected a finite number >= 0"),
    ({"betas": 0.9}, ValueError, "betas is 0.9, expected two numbers (beta1, beta2)"),
    ({"betas": (0.9,)}, ValueError, "betas is (0.9,), expected two numbers (beta1, beta2)"),
    ({"betas": (0.9, 0.99, 0.999)}, ValueError, "betas is (0.9, 0.99, 0.999), expected two numbers (beta1, beta2)"),
    ({"betas": (-0.1, 0.9)}, ValueError, "betas[0] is -0.1, expected a number in [0, 1)"),
    ({"betas": (1.0, 0.9)}, ValueError, "betas[0] is 1.0, expected a number in [0, 1)"),
    ({"betas": (0.9, 1.0)}, ValueError, "betas[1] is 1.0, expected a number in [0, 1)"),
    ({"eps": 0.0}, ValueError, "eps is 0.0, expected a finite number > 0"),
    ({"weight_decay": -1}, ValueError, "weight_decay is -1, expected a finite number >= 0 (0 = no decay)"),
    ({"weight_decay": float("inf")}, ValueError, "weight_decay is inf, expected a finite number >= 0 (0 = no decay)"),
])
def test_adamw_update_messages(change, error, said):
    with pytest.raises(error, match="^" + re.escape(said) + "$"):
        adamw_update(**{**GOOD, **change})
