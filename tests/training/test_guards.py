"""helpers.training.guards: the Trainer's checks, each refusal whole and each edge it accepts.

Every message matched in
full (the argument named, what it got, what was expected), windows of exactly context_length + 1
tokens, a window as long as the model's, and the names of at most three broken weights.
"""

from __future__ import annotations

import math
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
from helpers.training.trainer import TrainConfig, Trainer

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


# --- the Trainer refuses ------------------------------------------------------------------

def test_train_config_is_checked():
    with pytest.raises(ValueError, match="batch_size is 0, expected a positive int"):
        TrainConfig(batch_size=0)


def test_trainer_refuses_a_model_without_a_config(model_and_data):
    _, train_ids, val_ids = model_and_data()
    with pytest.raises(TypeError, match="model is a Linear, expected a torch.nn.Module mapping token ids"):
        Trainer(torch.nn.Linear(2, 2), train_ids, val_ids)


def test_trainer_checks_its_token_ids_once(model_and_data):
    model, train_ids, val_ids = model_and_data()
    with pytest.raises(ValueError, match=r"val_ids contains the id 7, expected ids in \[0, 6\]"):
        Trainer(model, train_ids, torch.tensor([1, 2, 7] * 20))


def test_the_trainer_refuses_a_config_that_is_not_a_trainconfig(small_config):
    ids = torch.arange(5).repeat(4)
    with pytest.raises(TypeError, match="^config is a dict, expected a TrainConfig$"):
        Trainer(GPT(small_config), ids, ids, {"fast": False})


def test_a_nan_weight_stops_the_step_with_the_loss_and_norm_it_saw(tiny_trainer):
    trainer = tiny_trainer(fast=False)
    with torch.no_grad():
        trainer.model.blocks[0].attn.q_proj.weight[0, 0] = float("nan")
    said = ("the training loss is nan and the gradient norm nan at step 1 (learning rate 0.001), so "
            "training stopped before the update; the model's weights already hold NaN or inf "
            "(blocks.0.attn.q_proj.weight): rebuild or reload it")
    with pytest.raises(FloatingPointError, match="^" + re.escape(said) + "$"):
        trainer.train_step(1e-3)


def test_a_divergence_names_the_peak_rate_and_what_to_try(tiny_trainer):
    trainer = tiny_trainer(learning_rate=0.25)
    trainer.history.steps = [1, 2]
    said = ("the training loss is inf and the gradient norm 3.0 at step 3 (learning rate 0.125), so "
            "training stopped before the update; it diverged: try a smaller TrainConfig(learning_rate=...) "
            "(the peak is 0.25), a longer warmup or a smaller grad_clip")
    with pytest.raises(FloatingPointError, match="^" + re.escape(said) + "$"):
        trainer._stop_diverged(float("inf"), 3.0, 0.125)


@pytest.mark.parametrize("field, value, error, said", [
    ("batch_size", 0, ValueError, "batch_size is 0, expected a positive int"),
    ("eval_every", 0, ValueError, "eval_every is 0, expected a positive int"),
    ("eval_batches", 1.5, TypeError, "eval_batches is 1.5 (a float), expected a positive int"),
    ("context_length", 0, ValueError,
     "context_length is 0, expected a positive int (or None for the model's context length)"),
    ("context_length", "8", TypeError,
     "context_length is '8' (a str), expected a positive int (or None for the model's context length)"),
    ("learning_rate", 0.0, ValueError, "learning_rate is 0.0, expected a finite number > 0"),
    ("grad_clip", -1.0, ValueError, "grad_clip is -1.0, expected a finite number > 0"),
    ("warmup", 1.0, ValueError, "warmup is 1.0, expected a fraction of the run in [0, 1)"),
    ("warmup", -0.5, ValueError, "warmup is -0.5, expected a fraction of the run in [0, 1)"),
    ("min_lr_ratio", 1.5, ValueError, "min_lr_ratio is 1.5, expected a fraction of the peak learning rate in [0, 1]"),
    ("min_lr_ratio", -0.5, ValueError, "min_lr_ratio is -0.5, expected a fraction of the peak learning rate in [0, 1]"),
    ("weight_decay", -0.5, ValueError, "weight_decay is -0.5, expected a number >= 0 (0 = no decay)"),
    ("weight_decay", float("inf"), ValueError, "weight_decay is inf, expected a number >= 0 (0 = no decay)"),
    ("precision", "fp16", ValueError, "precision is 'fp16', expected one of 'auto', 'bf16', 'fp32'"),
    ("fast", 1, TypeError, "fast is 1 (a int), expected True or False"),
    ("compile", "no", TypeError, "compile is 'no' (a str), expected True or False"),
    ("seed", -1, ValueError, "seed is -1, expected an int >= 0"),
])
def test_trainconfig_messages(field, value, error, said):
    with pytest.raises(error, match="^" + re.escape(said) + "$"):
        TrainConfig(**{field: value})
    with pytest.raises(ValueError, match="^compile=True needs fast=True: the plain path is the uncompiled reference$"):
        TrainConfig(compile=True, fast=False)


def test_trainconfig_accepts_the_edges_of_each_range():
    config = TrainConfig(warmup=0.0, min_lr_ratio=1.0, weight_decay=0.0, seed=0, context_length=1,
                         batch_size=1, eval_every=1, eval_batches=1, precision="bf16")
    assert (config.warmup, config.min_lr_ratio, config.weight_decay) == (0.0, 1.0, 0.0)
    assert TrainConfig(min_lr_ratio=0.0, fast=False, precision="fp32").min_lr_ratio == 0.0


def training_data() -> tuple[torch.Tensor, torch.Tensor]:
    pattern = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]).repeat(40)
    return pattern[:400], pattern[400:]


def test_trainer_refuses_a_model_with_a_nan_weight(small_config):
    model = GPT(small_config)
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"model has NaN or inf in blocks.1.attn.q_proj.weight before training"):
        Trainer(model, *training_data())


@pytest.mark.parametrize("fast", [True, False])
def test_training_stops_at_a_weight_turned_nan_naming_the_step(fast, small_config):
    torch.manual_seed(0)
    model = GPT(small_config)
    trainer = Trainer(model, *training_data(), TrainConfig(batch_size=4, fast=fast, precision="fp32"))
    trainer.fit(steps=2, progress_bar=False)
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight[0, 0] = float("nan")
    before = model.blocks[0].mlp.up.weight.clone()
    with pytest.raises(FloatingPointError, match=r"at step 3 .*weights already hold NaN "
                                                 r"or inf \(blocks.1.attn.q_proj.weight\)"):
        trainer.fit(steps=5, progress_bar=False)
    assert torch.equal(model.blocks[0].mlp.up.weight, before)  # stopped before the update


@pytest.mark.parametrize("fast", [True, False])
def test_training_stops_when_a_huge_learning_rate_diverges(fast, small_config):
    torch.manual_seed(0)
    config = TrainConfig(batch_size=4, learning_rate=1e6, warmup=0.0, fast=fast, precision="fp32")
    trainer = Trainer(GPT(small_config), *training_data(), config)
    with pytest.raises(FloatingPointError, match=r"at step \d+ .*try a smaller TrainConfig\(learning_rate"):
        trainer.fit(steps=40, progress_bar=False)
    assert all(math.isfinite(loss) for loss in trainer.history.losses)  # nothing NaN was recorded


@pytest.mark.parametrize("field, value, error", [
    ("context_length", 0, ValueError), ("context_length", 4.0, TypeError), ("weight_decay", -1.0, ValueError),
    ("min_lr_ratio", 5.0, ValueError), ("warmup", -1.0, ValueError), ("warmup", 1.0, ValueError),
    ("learning_rate", 0.0, ValueError), ("precision", "fp16", ValueError),
])
def test_train_config_refuses_values_that_make_no_sense(field, value, error):
    with pytest.raises(error, match=f"{field} is {value!r}"):
        TrainConfig(**{field: value})


def test_block_size_none_means_the_context_length_and_a_longer_one_is_refused(small_config):
    train_ids, val_ids = training_data()
    n = small_config.context_length
    assert Trainer(GPT(small_config), train_ids, val_ids, TrainConfig(context_length=None)).context_length == n
    with pytest.raises(ValueError, match=f"context_length is {n + 1}, expected at most the model's "
                                         f"context_length = {n}"):
        Trainer(GPT(small_config), train_ids, val_ids, TrainConfig(context_length=n + 1))


@pytest.mark.parametrize("short", ["train_ids", "val_ids"])
def test_too_short_data_is_named(short, small_config):
    data = dict(zip(("train_ids", "val_ids"), training_data(), strict=True))
    data[short] = data[short][:5]
    with pytest.raises(ValueError, match=rf"{short} has shape \(5,\), expected .* at least context_length \+ 1 = {small_config.context_length + 1}"):
        Trainer(GPT(small_config), data["train_ids"], data["val_ids"])


def _escape(text: str) -> str:
    import re
    return re.escape(text)


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1.0, "0.1"])
def test_train_step_refuses_a_learning_rate_that_is_not_finite_and_non_negative(lr, small_config):
    torch.manual_seed(0)
    ids = torch.arange(40) % small_config.vocab_size
    trainer = Trainer(GPT(small_config), ids, ids, TrainConfig(batch_size=2, precision="fp32"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises((ValueError, TypeError), match="lr is"):
        trainer.train_step(lr)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
