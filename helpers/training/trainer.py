"""Training a language model: batches, the schedule, AdamW's parameter split, the loop.

Defined in notebook 7, "GPT", section 4 (training on the course corpus), where each piece is
first written by hand ("The training step by hand"), then handed to the Trainer:

    encode_text / split_train_val / random_batch   token ids and (inputs, next-token targets)
    split_stories / line_overlap                   a validation split of whole stories, and
                                                   the sentences it still shares with training
    learning_rate                                  linear warm-up, then cosine decay
    matrices_and_vectors                           weight decay on matrices only
    TrainConfig, Trainer, History, evaluate_loss   the loop, what it measured, a fixed yardstick

The Trainer trains any model mapping token ids (B, N) to logits (B, N, V) that has
`config.vocab_size` and `config.context_length` (`helpers.model.gpt.GPT`, `helpers.model.modern.ModernGPT`).
Its step is the textbook one: loss, backward, clip the gradient norm, AdamW (or Muon for the
hidden matrices: `helpers.training.muon`). `TrainConfig(fast=True)`, the default, runs the same
step with less work (`helpers.training.speed`: bf16 working copy, one buffer for every weight,
fused AdamW, a GPT's fused kernels). Checkpoints: `helpers.model.checkpoints`; loss curves:
`helpers.lab.plots.LiveLossPlot`. Shapes: B batch, N tokens (the window), V vocabulary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from helpers import checks
from helpers.model.gpt import GPT
from helpers.training.guards import (
    check_learning_rate,
    check_train_config,
    check_trainer_inputs,
    non_finite_parameters,
)
from helpers.training.muon import MuonWithAdamW, muon_param_groups, split_for_muon
from helpers.training.speed import FlatWeights, compile_loss, make_optimizer, pick_dtype

# --- data ----------------------------------------------------------------------------------

def encode_text(tokenizer: Any, text: str) -> Tensor:
    """The token ids of `text` as one long tensor (n_tokens,) of int64."""
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def split_train_val(ids: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """The first (1 - val_fraction) of `ids` for training, the rest for validation: a split by
    position, so no window straddles the two. It may cut a story: for the course corpus use
    `split_stories`, and `line_overlap` to measure what validation shares with training."""
    checks.number_in("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    if not isinstance(ids, Tensor) or ids.dim() != 1:
        raise ValueError(f"ids is {_shape_of(ids)}, expected a 1-D tensor of token ids")
    cut = int(len(ids) * (1.0 - val_fraction))
    if not 0 < cut < len(ids):
        raise ValueError(f"val_fraction = {val_fraction:g} of {len(ids)} tokens leaves "
                         f"{cut} for training and {len(ids) - cut} for validation, expected both "
                         "parts non-empty: give more text or another val_fraction")
    return ids[:cut], ids[cut:]


def _shape_of(value: Any) -> str:
    return f"of shape {tuple(value.shape)}" if isinstance(value, Tensor) else f"a {type(value).__name__}"


def split_stories(text: str, val_fraction: float = 0.1, separator: str = "\n\n") -> tuple[str, str]:
    """Whole stories for training, the last `val_fraction` of them (at least one) for validation.

    Stories are the pieces of `text` between `separator`s (the course corpus puts a blank line
    between stories). No story is cut in two, and each part ends with the separator, as the
    corpus does. Held-out stories are new stories, not necessarily new sentences: a corpus made
    from templates repeats its sentences across stories (`line_overlap` measures how many).
    """
    checks.number_in("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    stories = [story.strip("\n") for story in text.split(separator) if story.strip()]
    if len(stories) < 2:
        raise ValueError(f"text has {len(stories)} stories separated by {separator!r}, expected at least 2")
    n_val = min(len(stories) - 1, max(1, round(len(stories) * val_fraction)))
    train, val = stories[:-n_val], stories[-n_val:]
    return separator.join(train) + separator, separator.join(val) + separator


def line_overlap(train_text: str, val_text: str) -> float:
    """The share of validation lines (blank lines left out) that occur word for word in training."""
    train_lines = set(train_text.splitlines())
    val_lines = [line for line in val_text.splitlines() if line.strip()]
    if not val_lines:
        raise ValueError("val_text has no non-blank lines, expected at least one")
    return sum(line in train_lines for line in val_lines) / len(val_lines)


def random_batch(ids: Tensor, batch_size: int, context_length: int,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """`batch_size` random windows of `context_length` tokens and the same windows one token later.

    ids: (n_tokens,). Returns inputs x and targets y, both (batch_size, context_length): y[b, t] is
    the token that follows x[b, t]. All windows are cut with one indexing operation.
    """
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("context_length", context_length)
    if not isinstance(ids, Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"ids is {_shape_of(ids) if not isinstance(ids, Tensor) else ids.dtype}, "
                        "expected a tensor of integer token ids")
    if ids.dim() != 1 or len(ids) < context_length + 1:
        raise ValueError(f"ids has shape {tuple(ids.shape)}, expected a 1-D tensor of at least "
                         f"context_length + 1 = {context_length + 1} tokens")
    starts = torch.randint(0, len(ids) - context_length, (batch_size,), generator=generator)
    windows = ids[starts.unsqueeze(1) + torch.arange(context_length + 1)]  # (B, context_length + 1)
    return windows[:, :-1], windows[:, 1:]


# --- the recipe ----------------------------------------------------------------------------

def learning_rate(progress: float, peak: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """The learning rate `progress` (0 -> 1) of the way through training.

    It rises linearly from 0 to `peak` over the first `warmup` of the run (Adam's early steps
    are noisy): peak * progress / warmup. Then it follows half a cosine down to `floor` x peak
    at the end: peak * (floor + (1 - floor) * (1 + cos(pi t)) / 2), t the fraction of the decay
    done. learning_rate(0, ...) is 0, so `Trainer.fit` asks for the rate at the end of each
    step, progress (i + 1) / steps: no step runs at a rate of 0, and the last runs at the floor.
    """
    checks.number_in("progress", progress, -math.inf, math.inf)
    checks.positive_float("peak", peak)
    checks.number_in("warmup", warmup, 0.0, 1.0, high_open=True)
    checks.number_in("floor", floor, 0.0, 1.0)
    progress = min(max(progress, 0.0), 1.0)
    if progress < warmup:
        return peak * progress / warmup
    decay = (progress - warmup) / (1.0 - warmup)
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * decay)))


def matrices_and_vectors(model: torch.nn.Module) -> tuple[list[Tensor], list[Tensor]]:
    """The model's parameters split for weight decay: matrices (dim >= 2), and the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]


@dataclass
class TrainConfig:
    """How to train. The defaults fit the course's small character-level GPT on a laptop CPU.

    context_length: tokens per training window (None: the model's context length; 0 is refused).
    learning_rate: the peak rate; warmup: the fraction of the run spent warming up, in [0, 1);
    min_lr_ratio: the final rate as a fraction of the peak, in [0, 1]; weight_decay >= 0.
    eval_every: steps between evaluations (and LiveLossPlot redraws); eval_batches: fixed
    batches each evaluation averages over. fast=False runs the plain float32 path.
    compile=True (fast path only) compiles the loss with torch.compile: faster steps after a
    first step that takes tens of seconds, and it needs a C++ compiler.
    optimizer: "adamw" (every weight), or "muon": Muon for the hidden matrices, AdamW for the
    rest (`helpers.training.muon.split_for_muon`), Muon at peak muon_learning_rate on the same
    schedule, its Newton-Schulz in the compute dtype. 0.04 beat 0.02 and 0.08 on 3 of 3 seeds in
    the race's 30 s (benchmarks/bench_recipe.py) and 0.02 at notebook 7's setting (bench_nb7_optimizer).
    """

    batch_size: int = 12
    context_length: int | None = None
    learning_rate: float = 2e-3
    warmup: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    precision: str = "auto"
    fast: bool = True
    compile: bool = False
    seed: int = 0
    optimizer: str = "adamw"
    muon_learning_rate: float = 0.04

    def __post_init__(self) -> None:
        check_train_config(self)


@dataclass
class History:
    """What a training run measured; evaluations are on fixed batches, in float32."""

    steps: list[int] = field(default_factory=list)          # one entry per optimiser step
    losses: list[float] = field(default_factory=list)       # that step's training-batch loss
    lrs: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)     # one entry per evaluation
    train_losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    tokens_per_step: int = 0
    train_seconds: float = 0.0                              # optimiser steps only, no evaluation

    @property
    def tokens_per_second(self) -> float:
        return len(self.steps) * self.tokens_per_step / max(self.train_seconds, 1e-9)


@torch.no_grad()
def evaluate_loss(model: nn.Module, batches: Sequence[tuple[Tensor, Tensor]]) -> float:
    """Mean next-token loss over (x, y) batches, in float32 without dropout, whatever the
    precision the model trains in: the same yardstick for every trainer."""
    was_training = model.training
    model.eval()
    total = sum(F.cross_entropy(_logits(model, x, fast=True).flatten(0, 1), y.flatten()).item()
                for x, y in batches)
    model.train(was_training)
    return total / len(batches)


def _logits(model: nn.Module, x: Tensor, fast: bool) -> Tensor:
    """model(x): (B, N) -> (B, N, V), with a GPT's fused kernels when `fast` (the one switch)."""
    return model(x, fast=True) if fast and isinstance(model, GPT) else model(x)


class PlainWeights:
    """The plain path behind FlatWeights' interface (`helpers.training.speed`): the model trains
    its own float32 tensors, each with its own .grad, clipped by torch.nn.utils.clip_grad_norm_."""

    def __init__(self, model: nn.Module) -> None:
        self.model = self.working = model

    def matrices_and_vectors(self) -> tuple[list[Tensor], list[Tensor]]:
        return matrices_and_vectors(self.model)

    def attach_weight_gradients(self) -> None:
        """Nothing to do: each weight has its own .grad already."""

    def zero_gradients(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def gather_and_clip_gradients(self, max_norm: float) -> Tensor:
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm, foreach=False)

    def refresh_working_copy(self) -> None:
        """Nothing to do: the model is its own working copy."""


class Trainer:
    """Trains a language model on a long tensor of token ids with the recipe of `TrainConfig`.

    model: maps token ids (B, N) to logits (B, N, V) and has `config.vocab_size` and
    `config.context_length` (a `helpers.model.gpt.GPT`, a `helpers.model.modern.ModernGPT`).
    `fit(steps=...)` or `fit(seconds=...)` runs a whole schedule with a progress bar;
    `train_step(lr)` and `evaluate()` are the pieces, for loops of one's own.
    """

    def __init__(self, model: nn.Module, train_ids: Tensor, val_ids: Tensor,
                 config: TrainConfig | None = None) -> None:
        config = TrainConfig() if config is None else config
        self.model, self.config = model, config
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config is a {type(config).__name__}, expected a TrainConfig")
        self.context_length = check_trainer_inputs(model, train_ids, val_ids, config.context_length)
        self.train_ids, self.val_ids = train_ids, val_ids
        self.device = next(model.parameters()).device
        self.dtype = pick_dtype(self.device, config.precision) if config.fast else torch.float32
        # The path, decided once: the fast one keeps every weight in one buffer (FlatWeights),
        # the plain one the model's own tensors (PlainWeights); both answer the same five calls.
        self.weights = FlatWeights(model, self.dtype) if config.fast else PlainWeights(model)
        self.working = self.weights.working  # runs forward and backward (fast, bf16: a bf16 copy)
        self.optimizer = self._make_optimizer()
        for group in self.optimizer.param_groups:  # each group's peak rate, which the schedule scales
            group["initial_lr"] = group["lr"]
        self._loss = compile_loss(self._working_loss) if config.compile else self._working_loss
        self.generator = torch.Generator().manual_seed(config.seed)
        self.eval_sets = {}  # the same batches at every evaluation
        for name, ids in (("train", train_ids), ("val", val_ids)):
            fixed = torch.Generator().manual_seed(config.seed + 1)
            self.eval_sets[name] = [self._batch(ids, fixed) for _ in range(config.eval_batches)]
        self.history = History(tokens_per_step=config.batch_size * self.context_length)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        config = self.config
        if config.optimizer == "muon":
            self.weights.attach_weight_gradients()
            groups = muon_param_groups(*split_for_muon(self.model), muon_lr=config.muon_learning_rate,
                                       adamw_lr=config.learning_rate, weight_decay=config.weight_decay)
            return MuonWithAdamW(groups, fused=config.fast, ns_dtype=self.dtype)
        return make_optimizer(*self.weights.matrices_and_vectors(), lr=config.learning_rate,
                              weight_decay=config.weight_decay, fused=config.fast)

    def _batch(self, ids: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A random batch of windows and their targets (`random_batch`), on the model's device."""
        x, y = random_batch(ids, self.config.batch_size, self.context_length, generator)
        return x.to(self.device), y.to(self.device)

    def loss_on(self, x: Tensor, y: Tensor) -> Tensor:
        """Mean next-token cross-entropy on inputs x and targets y, both (B, N), computed by
        the working model (bf16 on the fast path): the loss that training differentiates."""
        return self._loss(x, y)

    def _working_loss(self, x: Tensor, y: Tensor) -> Tensor:
        logits = _logits(self.working, x, self.config.fast)  # (B, N, V)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def train_step(self, lr: float) -> float:
        """One optimiser step at rate `lr` on a fresh batch; returns its loss. `lr` is AdamW's
        rate (TrainConfig.learning_rate at the peak); every group's rate is its own peak scaled
        alike, so Muon's runs at muon_learning_rate / learning_rate x lr.

        A loss or gradient norm that is NaN or infinite stops training with a FloatingPointError
        before the optimiser step (which would spread the NaN into every weight). (PyTorch's
        fused attention on a CPU turns a query row of NaN into zeros, so with a NaN weight the
        fast path's loss can stay finite while its gradient does not: both are checked.)
        """
        check_learning_rate(lr)
        x, y = self._batch(self.train_ids, self.generator)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * (group["initial_lr"] / self.config.learning_rate)
        loss = self.loss_on(x, y)
        self.weights.zero_gradients()
        loss.backward()
        norm = self.weights.gather_and_clip_gradients(self.config.grad_clip)
        value, norm = loss.item(), norm.item()
        if not (math.isfinite(value) and math.isfinite(norm)):
            self._stop_diverged(value, norm, lr)
        self.optimizer.step()
        self.weights.refresh_working_copy()
        return value

    def _stop_diverged(self, loss: float, norm: float, lr: float) -> None:
        """Raise a FloatingPointError that says at which step the loss or the gradient stopped
        being finite, and what to try."""
        step = len(self.history.steps) + 1
        broken = non_finite_parameters(self.model)
        if broken:
            cause = f"the model's weights already hold NaN or inf ({broken}): rebuild or reload it"
        else:
            cause = (f"it diverged: try a smaller TrainConfig(learning_rate=...) (the peak "
                     f"is {self.config.learning_rate:g}), a longer warmup or a smaller grad_clip")
        raise FloatingPointError(f"the training loss is {loss} and the gradient norm {norm} at "
                                 f"step {step} (learning rate {lr:.3g}), so training stopped "
                                 f"before the update; {cause}")

    def evaluate(self) -> dict[str, float]:
        """Mean loss on the fixed train and validation batches (see `evaluate_loss`)."""
        return {name: evaluate_loss(self.model, batches) for name, batches in self.eval_sets.items()}

    def fit(self, steps: int | None = None, seconds: float | None = None,
            callbacks: Sequence[Callable[[History], None]] = (), progress_bar: bool = True) -> History:
        """Train for `steps` optimiser steps or for `seconds` of training time (give one).

        The learning rate follows `learning_rate` over the run, taken where each step ends:
        (i + 1) / steps. With a time budget the end of a step is guessed from the last step's
        duration, so the first step (no duration known yet) runs at progress 0, a rate of 0:
        it only fills AdamW's running averages. Every `eval_every` steps and at the end the
        model is evaluated and each callback is called with the history.
        """
        checks.boolean("progress_bar", progress_bar)
        if (steps is None) == (seconds is None):
            raise ValueError(f"steps is {steps!r} and seconds is {seconds!r}, expected exactly one")
        if steps is not None:
            checks.positive_int("steps", steps)
        else:
            checks.positive_float("seconds", seconds)
        self.weights.refresh_working_copy()  # in case the weights were changed by hand
        bar = _progress_bar(steps, seconds, progress_bar)
        done, spent = 0, 0.0
        last = 0.0  # the last step's duration: a time budget guesses where a step will end
        while (done < steps) if steps is not None else (spent < seconds):
            # The rate at the end of this step (see learning_rate): never 0 with a step count.
            progress = (done + 1) / steps if steps is not None else (spent + last) / seconds
            lr = learning_rate(progress, self.config.learning_rate, self.config.warmup,
                               self.config.min_lr_ratio)
            started = time.perf_counter()
            loss = self.train_step(lr)
            elapsed = last = time.perf_counter() - started
            done, spent = done + 1, spent + elapsed
            self.history.steps.append(len(self.history.steps) + 1)
            self.history.losses.append(loss)
            self.history.lrs.append(lr)
            self.history.train_seconds += elapsed
            bar.update(1 if steps is not None else elapsed)
            if done % self.config.eval_every == 0:
                self._evaluate_and_report(callbacks, bar)
        if done % self.config.eval_every:
            self._evaluate_and_report(callbacks, bar)
        bar.close()
        return self.history

    def _evaluate_and_report(self, callbacks: Iterable[Callable[[History], None]], bar: tqdm) -> None:
        losses = self.evaluate()
        self.history.eval_steps.append(len(self.history.steps))
        self.history.train_losses.append(losses["train"])
        self.history.val_losses.append(losses["val"])
        bar.set_postfix(train=f"{losses['train']:.3f}", val=f"{losses['val']:.3f}")
        for callback in callbacks:
            callback(self.history)


def _progress_bar(steps: int | None, seconds: float | None, enabled: bool) -> tqdm:
    """A text progress bar counting steps, or seconds of training for a time budget."""
    if steps is not None:
        return tqdm(total=steps, unit="step", disable=not enabled, mininterval=0.5)
    return tqdm(total=seconds, unit="s", disable=not enabled, mininterval=0.5,
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}]{postfix}")
