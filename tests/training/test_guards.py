"""helpers.training.guards: the Trainer's checks, each refusal whole and each edge it accepts.

Every message matched in
full (the argument named, what it got, what was expected), windows of exactly context_length + 1
tokens, a window as long as the model's, and the names of at most three broken weights.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.training.guards import (
    MAX_BATCH_SIZE,
    check_learning_rate,
    check_train_config,
    check_trainer_inputs,
    non_finite_parameters,
)
from helpers.training.trainer import TrainConfig

TINY = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=1, d_model=8)
FIVE = torch.arange(5)  # one window of the model's length and its next token


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(TINY)


@pytest.mark.parametrize("lr, error, said", [
    (-1.0, ValueError, "lr is -1.0, expected a finite learning rate >= 0"),
    (float("inf"), ValueError, "lr is inf, expected a finite learning rate >= 0"),
    (float("nan"), ValueError, "lr is nan, expected a finite learning rate >= 0"),
    ("x", TypeError, "lr is 'x' (a str), expected a finite learning rate >= 0"),
])
def test_check_learning_rate_messages(lr, error, said):
    with pytest.raises(error, match="^" + re.escape(said) + "$"):
        check_learning_rate(lr)


def test_a_batch_too_large_to_allocate_is_refused_when_the_config_is_made():
    # TrainConfig(batch_size=10**9) was accepted, and the Trainer died in the allocator 16 s later
    with pytest.raises(ValueError, match=r"^batch_size is 1,000,000,000, expected at most MAX_BATCH_SIZE = "
                                         r"65,536 windows a step \(its logits alone would not fit in memory\)"):
        TrainConfig(batch_size=10**9)
    assert TrainConfig(batch_size=MAX_BATCH_SIZE).batch_size == 2**16
    config = TrainConfig()
    config.batch_size = MAX_BATCH_SIZE + 1  # a field changed after the config was made
    with pytest.raises(ValueError, match=r"^batch_size is 65,537, expected at most MAX_BATCH_SIZE"):
        check_train_config(config)


def test_check_learning_rate_returns_a_float_and_allows_0():
    assert check_learning_rate(0) == 0.0 and isinstance(check_learning_rate(0), float)
    assert check_learning_rate(3e-4) == 3e-4


def _break(model: GPT, names: list[str]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in names:
                p.view(-1)[0] = float("inf") if len(name) % 2 else float("nan")


def test_non_finite_parameters_names_at_most_three():
    model = tiny_gpt()
    names = [name for name, _ in model.named_parameters()]
    assert non_finite_parameters(model) == ""
    _break(model, names[1:4])
    assert non_finite_parameters(model) == ", ".join(names[1:4])  # three: all named, no "..."
    _break(model, names[5:6])
    assert non_finite_parameters(model) == ", ".join(names[1:4]) + ", ..."


NOT_A_MODEL = ("expected a torch.nn.Module mapping token ids (B, N) to logits (B, N, V) with "
               "config.vocab_size and config.context_length, such as a helpers.model.gpt.GPT")
TOO_SHORT = ("expected a 1-D tensor of at least context_length + 1 = 5 tokens (one window and its next "
             "token): give more text or a smaller context_length")


class _Configured(torch.nn.Module):
    def __init__(self, **config) -> None:
        super().__init__()
        self.config = SimpleNamespace(**config)


@pytest.mark.parametrize("model, train_ids, val_ids, window, error, said", [
    ("m", FIVE, FIVE, None, TypeError, "model is a str, " + NOT_A_MODEL),
    (_Configured(vocab_size=5), FIVE, FIVE, None, TypeError, "model is a _Configured, " + NOT_A_MODEL),
    (_Configured(context_length=4), FIVE, FIVE, None, TypeError, "model is a _Configured, " + NOT_A_MODEL),
    (None, FIVE, FIVE, 5, ValueError, "context_length is 5, expected at most the model's context_length = 4"),
    (None, FIVE, FIVE, 0, ValueError, "window is 0, expected a positive int"),
    (None, FIVE, FIVE, -3, ValueError, "window is -3, expected a positive int"),
    (None, FIVE, FIVE, 2.0, TypeError, "window is 2.0 (a float), expected a positive int"),
    (None, FIVE[:4], FIVE, None, ValueError, "train_ids has shape (4,), " + TOO_SHORT),
    (None, FIVE, FIVE[:4], None, ValueError, "val_ids has shape (4,), " + TOO_SHORT),
    (None, FIVE, torch.zeros(2, 5, dtype=torch.long), None, ValueError, "val_ids has shape (2, 5), " + TOO_SHORT),
    (None, FIVE, FIVE + 3, None, ValueError, "val_ids contains the id 7, expected ids in [0, 4] for a vocabulary of 5 tokens"),
    (None, FIVE.float(), FIVE, None, TypeError, "train_ids has dtype torch.float32, expected an integer dtype (torch.long)"),
])
def test_check_trainer_inputs_messages(model, train_ids, val_ids, window, error, said):
    with pytest.raises(error, match="^" + re.escape(said) + "$"):
        check_trainer_inputs(tiny_gpt() if model is None else model, train_ids, val_ids, window)


def test_check_trainer_inputs_refuses_a_broken_model_by_name():
    model = tiny_gpt()
    _break(model, ["blocks.0.attn.q_proj.weight"])
    with pytest.raises(ValueError, match="^" + re.escape(
            "model has NaN or inf in blocks.0.attn.q_proj.weight before training: rebuild or reload it") + "$"):
        check_trainer_inputs(model, FIVE, FIVE, None)


def test_check_trainer_inputs_returns_the_window_at_its_edges():
    model = tiny_gpt()
    assert check_trainer_inputs(model, FIVE, FIVE, None) == 4  # the model's, with exactly 5 tokens
    assert check_trainer_inputs(model, FIVE, FIVE, 4) == 4      # as long as the model's
    assert check_trainer_inputs(model, FIVE[:3], FIVE[2:], 2) == 2  # a shorter window needs fewer tokens
