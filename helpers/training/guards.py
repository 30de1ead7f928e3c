"""The checks the Trainer runs before it trains and at every step (notebook 7, section 4).

    check_train_config       every field of a TrainConfig, when it is made
    check_trainer_inputs     the model, the token ids and the window, before anything is built
    check_learning_rate      a finite rate >= 0 for train_step (NaN or -1 would train on silently)
    non_finite_parameters    the weights holding NaN or inf, named, for the error messages

Shapes (the legend of `helpers`): B batch, N tokens, V vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.embeddings import check_token_ids
from helpers.training.speed import PRECISIONS

MAX_BATCH_SIZE = 2**16  # windows a step: the course trains with 12-64; 10**9 died in the allocator


def check_train_config(config: Any) -> None:
    """Raise naming the first field of a TrainConfig that is out of its range (or of its type)."""
    for name in ("batch_size", "eval_every", "eval_batches"):
        checks.positive_int(name, getattr(config, name))
    if config.batch_size > MAX_BATCH_SIZE:
        raise ValueError(f"batch_size is {config.batch_size:,}, expected at most MAX_BATCH_SIZE = "
                         f"{MAX_BATCH_SIZE:,} windows a step (its logits alone would not fit in memory): "
                         "take more steps instead")
    if config.context_length is not None:
        try:
            checks.positive_int("context_length", config.context_length)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{error} (or None for the model's context length)") from None
    checks.positive_float("learning_rate", config.learning_rate)
    checks.positive_float("grad_clip", config.grad_clip)
    checks.number_in("warmup", config.warmup, 0.0, 1.0, high_open=True, expected="a fraction of the run in [0, 1)")
    checks.number_in("min_lr_ratio", config.min_lr_ratio, 0.0, 1.0,
                     expected="a fraction of the peak learning rate in [0, 1]")
    checks.number_in("weight_decay", config.weight_decay, 0.0, math.inf, high_open=True,
                     expected="a number >= 0 (0 = no decay)")
    checks.one_of("precision", config.precision, PRECISIONS)
    checks.boolean("fast", config.fast)
    checks.boolean("compile", config.compile)
    checks.non_negative_int("seed", config.seed)
    checks.one_of("optimizer", config.optimizer, ("adamw", "muon"))
    checks.positive_float("muon_learning_rate", config.muon_learning_rate)
    if config.compile and not config.fast:
        raise ValueError("compile=True needs fast=True: the plain path is the uncompiled reference")


def check_learning_rate(lr: Any) -> float:
    """`lr` as a float, if it is a finite number >= 0 (0 is allowed: fit's time budget takes a
    first step at rate 0 to fill AdamW's averages)."""
    return checks.number_in("lr", lr, 0.0, math.inf, high_open=True,
                            expected="a finite learning rate >= 0")


def non_finite_parameters(model: nn.Module) -> str:
    """The names of the parameters holding a NaN or an infinity ("" if none), at most three."""
    broken = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    return ", ".join(broken[:3]) + (", ..." if len(broken) > 3 else "")


def check_trainer_inputs(model: nn.Module, train_ids: Tensor, val_ids: Tensor,
                         window: int | None) -> int:
    """Raise unless the Trainer can use these; return the training window's length."""
    model_config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or not all(
            hasattr(model_config, name) for name in ("vocab_size", "context_length")):
        raise TypeError(f"model is a {type(model).__name__}, expected a torch.nn.Module mapping "
                        "token ids (B, N) to logits (B, N, V) with config.vocab_size and "
                        "config.context_length, such as a helpers.model.gpt.GPT")
    longest = model_config.context_length
    context_length = longest if window is None else checks.positive_int("window", window)
    if context_length > longest:
        raise ValueError(f"context_length is {context_length}, expected at most the model's "
                         f"context_length = {longest}")
    for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
        check_token_ids(ids, model_config.vocab_size, name)  # once here, not at every step
        if ids.dim() != 1 or len(ids) < context_length + 1:
            raise ValueError(f"{name} has shape {tuple(ids.shape)}, expected a 1-D tensor of at "
                             f"least context_length + 1 = {context_length + 1} tokens (one window "
                             "and its next token): give more text or a smaller context_length")
    broken = non_finite_parameters(model)
    if broken:
        raise ValueError(f"model has NaN or inf in {broken} before training: rebuild or reload it")
    return context_length
