"""Training a GPT fast on a laptop CPU: batches, AdamW, a schedule, clipping, bf16, checkpoints.

    encode_text / split_train_val / random_batch   token ids and (inputs, next-token targets)
    split_stories / line_overlap                   a validation split of whole stories, and
                                                   the sentences it still shares with training
    learning_rate                                  linear warm-up, then cosine decay
    pick_dtype                                     bfloat16 where the hardware has it, else float32
    make_optimizer, matrices_and_vectors           AdamW, weight decay on matrices only
    FlatWeights                                    every weight and gradient in one buffer each,
                                                   with the bf16 working copy of the fast path
    TrainConfig, Trainer, History                  the training loop and what it measured
    evaluate_loss                                  mean loss on fixed batches, always in float32
    LiveLossPlot                                   a callback that redraws the losses in place
    save_checkpoint / load_checkpoint              torch.save, torch.load(weights_only=True);
                                                   CheckpointError for files that are not one

What makes the trainer fast, each measured in benchmarks/bench_train.py against a plain loop:

- bfloat16 mixed precision, on CPUs with native bf16 (elsewhere it falls back to float32 by
  itself): forward and backward run on a bf16 working copy of the model, while the optimiser
  updates the float32 weights and the copy is refreshed from them after every step. This is
  what `torch.autocast` does op by op, done once per step: autocast re-casts weights and
  activations at every product, about 200 small casts per step for the benchmark's GPT, and
  a step took about 5 % longer with it on the course's 2-core CPU;
- fused LayerNorm and attention kernels and one Q/K/V product (`GPT.forward(..., fast=True)`);
- one buffer for all the weights and one for all the gradients (`FlatWeights`): copying the
  gradients to float32, clipping them, the AdamW update and refreshing the bf16 copy are then
  a few operations on long vectors, not a few hundred on small tensors;
- batches cut out of the token tensor with one indexing operation;
- optionally (`TrainConfig(compile=True)`), `torch.compile` fuses the forward and backward
  passes further. Compiling takes a while (tens of seconds on a laptop CPU) and needs a C++
  compiler, so it pays only for longer runs and is off by default.

`Trainer(config=TrainConfig(fast=False))` runs the plain path instead: float32, the course's
own LayerNorm and attention, the textbook AdamW loop.

matplotlib and IPython are imported only inside LiveLossPlot, so this module stays light.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from helpers import checks
from helpers.embeddings import check_token_ids
from helpers.gpt import GPT, GPTConfig

# --- data ----------------------------------------------------------------------------------


def encode_text(tokenizer: Any, text: str) -> Tensor:
    """The token ids of `text` as one long tensor (n_tokens,) of int64."""
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def split_train_val(ids: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """The first (1 - val_fraction) of `ids` for training, the rest for validation.

    A split by position, not at random, so no window straddles the two. The cut may fall inside
    a story, and a corpus that repeats sentences repeats them across the cut: for the course
    corpus use `split_stories`, which keeps stories whole, and `line_overlap` to measure how much
    of the validation text the training text already contains.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction is {val_fraction!r}, expected a number between 0 and 1")
    cut = int(len(ids) * (1.0 - val_fraction))
    return ids[:cut], ids[cut:]


def split_stories(text: str, val_fraction: float = 0.1, separator: str = "\n\n") -> tuple[str, str]:
    """Whole stories for training, the last `val_fraction` of them (at least one) for validation.

    Stories are the pieces of `text` between `separator`s (the course corpus puts a blank line
    between stories). No story is cut in two, and each part ends with the separator, as the
    corpus does. Held-out stories are new stories, not necessarily new sentences: a corpus made
    from templates repeats its sentences across stories (`line_overlap` measures how many).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction is {val_fraction!r}, expected a number between 0 and 1")
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


def cpu_has_native_bf16() -> bool:
    """True on x86 CPUs with AVX512-BF16 or AMX, where bfloat16 matrix products run natively."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)


def pick_dtype(device: torch.device, precision: str = "auto") -> torch.dtype:
    """The dtype to compute in: "bf16", "fp32", or "auto" (bf16 where it is native).

    Without native support, bf16 products still run but slowly (each one is emulated), so
    "auto" then falls back to float32.
    """
    if precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"precision is {precision!r}, expected 'auto', 'bf16' or 'fp32'")
    if precision != "auto":
        return torch.bfloat16 if precision == "bf16" else torch.float32
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def make_optimizer(matrices: Sequence[Tensor], vectors: Sequence[Tensor], lr: float,
                   weight_decay: float, betas: tuple[float, float] = (0.9, 0.99),
                   fused: bool = True) -> torch.optim.AdamW:
    """AdamW that decays `matrices` and leaves `vectors` (biases, LayerNorm gains) alone.

    fused=True asks for PyTorch's single-kernel AdamW step (where this PyTorch has one);
    fused=False is the textbook per-parameter loop.
    """
    groups = [{"params": list(params), "weight_decay": decay}
              for params, decay in ((matrices, weight_decay), (vectors, 0.0)) if len(params)]
    if fused:
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
        except (RuntimeError, TypeError):  # no fused kernel for this device or PyTorch
            return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=False)


def matrices_and_vectors(model: torch.nn.Module) -> tuple[list[Tensor], list[Tensor]]:
    """The model's parameters split for weight decay: matrices (dim >= 2), and the rest."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [p for p in params if p.dim() >= 2], [p for p in params if p.dim() < 2]


def flatten_into_one_buffer(params: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """Move `params` into one new 1-D buffer of `dtype`, in order; each becomes a view of it.

    Writing the buffer writes the parameters and the other way round, so one operation on the
    buffer reaches every parameter. Returns the buffer, (total number of entries,).
    """
    buffer = torch.cat([p.detach().reshape(-1).to(dtype) for p in params])
    for param, view in zip(params, buffer.split([p.numel() for p in params]), strict=True):
        param.data = view.view_as(param)
    return buffer


class FlatWeights:
    """A model's float32 weights in one buffer, their gradients in another, and the model that
    runs forward and backward (the working model) in the compute dtype.

    In float32 the working model is the model itself. In bfloat16 it is a copy whose weights
    and gradients are again one buffer each: backward accumulates into the bf16 gradient
    buffer, `gather_gradients` copies it into the float32 one in a single operation, the
    optimiser updates the float32 weights, and `refresh_working_copy` rounds them back into
    the copy, again in one operation.

    The weights are laid out matrices first, so that `matrices_and_vectors()` can hand AdamW
    two slices: the matrices, which get weight decay, and the biases and LayerNorm gains,
    which do not.
    """

    def __init__(self, model: GPT, dtype: torch.dtype) -> None:
        if not all(p.requires_grad for p in model.parameters()):
            raise ValueError("FlatWeights trains every parameter, and this model has frozen ones "
                             "(requires_grad=False): use TrainConfig(fast=False)")
        matrices, vectors = matrices_and_vectors(model)  # a tied matrix appears once
        self.params = matrices + vectors
        self.n_matrix_entries = sum(p.numel() for p in matrices)
        self.weights = flatten_into_one_buffer(self.params, torch.float32)
        self.gradients = torch.zeros_like(self.weights)
        if dtype == torch.float32:
            self.working, self.working_params = model, self.params
            self.working_weights, self.working_gradients = self.weights, self.gradients
        else:
            self.working = copy.deepcopy(model)  # tied weights stay tied
            copied_matrices, copied_vectors = matrices_and_vectors(self.working)  # same order
            self.working_params = copied_matrices + copied_vectors
            self.working_weights = flatten_into_one_buffer(self.working_params, dtype)
            self.working_gradients = torch.zeros_like(self.working_weights)
        self._weight_addresses = [p.data_ptr() for p in self.params]
        self.zero_gradients()  # attaches the gradient views

    def matrices_and_vectors(self) -> tuple[list[Tensor], list[Tensor]]:
        """Two slices of the float32 weights, each with its slice of the gradients as .grad:
        every matrix entry (weight decay applies), then every vector entry (it does not)."""
        cut = self.n_matrix_entries
        matrices, vectors = self.weights[:cut], self.weights[cut:]
        matrices.grad, vectors.grad = self.gradients[:cut], self.gradients[cut:]
        return [matrices] if cut else [], [vectors] if vectors.numel() else []

    def zero_gradients(self) -> None:
        """Zero the working gradients, and (re)attach them as each parameter's .grad, in case
        something set those to None (as `model.zero_grad()` does)."""
        if self._weight_addresses != [p.data_ptr() for p in self.params]:
            raise RuntimeError("the model's parameters were moved or replaced after the Trainer "
                               "was made (by .to(), .float() or similar): make a new Trainer")
        self.working_gradients.zero_()
        sizes = [p.numel() for p in self.working_params]
        for param, view in zip(self.working_params, self.working_gradients.split(sizes), strict=True):
            if param.grad is None or param.grad.data_ptr() != view.data_ptr():
                param.grad = view.view_as(param)

    @torch.no_grad()
    def gather_gradients(self) -> None:
        """The working gradients, in float32, into the gradients of the weights."""
        if self.working_gradients is not self.gradients:
            self.gradients.copy_(self.working_gradients)

    @torch.no_grad()
    def clip_gradients(self, max_norm: float) -> Tensor:
        """Scale the float32 gradients down so that their norm (over every parameter at once)
        is at most `max_norm`, as torch.nn.utils.clip_grad_norm_ does; returns the norm before.

        On one buffer this is two operations; clip_grad_norm_, even given just the two slices,
        measured several times slower here.
        """
        norm = torch.linalg.vector_norm(self.gradients)
        self.gradients.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    @torch.no_grad()
    def refresh_working_copy(self) -> None:
        """The float32 weights, rounded to the working dtype, into the working copy."""
        if self.working_weights is not self.weights:
            self.working_weights.copy_(self.weights)


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

    def __post_init__(self) -> None:
        for name in ("batch_size", "eval_every", "eval_batches"):
            checks.positive_int(name, getattr(self, name))
        if self.context_length is not None:
            try:
                checks.positive_int("context_length", self.context_length)
            except (TypeError, ValueError) as error:
                raise type(error)(f"{error} (or None for the model's context length)") from None
        checks.positive_float("learning_rate", self.learning_rate)
        checks.positive_float("grad_clip", self.grad_clip)
        checks.number_in("warmup", self.warmup, 0.0, 1.0, high_open=True,
                         expected="a fraction of the run in [0, 1)")
        checks.number_in("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0,
                         expected="a fraction of the peak learning rate in [0, 1]")
        checks.number_in("weight_decay", self.weight_decay, 0.0, math.inf, high_open=True,
                         expected="a number >= 0 (0 = no decay)")
        checks.one_of("precision", self.precision, ("auto", "bf16", "fp32"))
        checks.boolean("fast", self.fast)
        checks.boolean("compile", self.compile)
        checks.non_negative_int("seed", self.seed)
        if self.compile and not self.fast:
            raise ValueError("compile=True needs fast=True: the plain path is the uncompiled reference")


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


Callback = Callable[[History], None]


@torch.no_grad()
def evaluate_loss(model: GPT, batches: Sequence[tuple[Tensor, Tensor]]) -> float:
    """Mean next-token loss over (x, y) batches, in float32 without dropout, whatever the
    precision the model trains in: the same yardstick for every trainer."""
    was_training = model.training
    model.eval()
    total = sum(F.cross_entropy(model(x, fast=True).flatten(0, 1), y.flatten()).item()
                for x, y in batches)
    model.train(was_training)
    return total / len(batches)


class Trainer:
    """Trains a GPT on a long tensor of token ids with the recipe of `TrainConfig`.

    `fit(steps=...)` or `fit(seconds=...)` runs a whole schedule with a progress bar;
    `train_step(lr)` and `evaluate()` are the pieces, for loops of one's own.
    """

    def __init__(self, model: GPT, train_ids: Tensor, val_ids: Tensor,
                 config: TrainConfig | None = None) -> None:
        if not isinstance(model, GPT):
            raise TypeError(f"model is a {type(model).__name__}, expected a helpers.gpt.GPT")
        config = TrainConfig() if config is None else config
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config is a {type(config).__name__}, expected a TrainConfig")
        self.model, self.config = model, config
        context = model.config.context_length
        self.context_length = context if config.context_length is None else config.context_length
        if self.context_length > context:
            raise ValueError(f"context_length is {self.context_length}, expected at most the model's "
                             f"context_length = {context}")
        for name, ids in (("train_ids", train_ids), ("val_ids", val_ids)):
            check_token_ids(ids, model.config.vocab_size, name)  # once here, not at every step
            if ids.dim() != 1 or len(ids) < self.context_length + 1:
                raise ValueError(f"{name} has shape {tuple(ids.shape)}, expected a 1-D tensor of at "
                                 f"least context_length + 1 = {self.context_length + 1} tokens (one window "
                                 "and its next token): give more text or a smaller context_length")
        broken = _non_finite_parameters(model)
        if broken:
            raise ValueError(f"model has NaN or inf in {', '.join(broken[:3])}"
                             f"{', ...' if len(broken) > 3 else ''} before training: "
                             "rebuild or reload it")
        self.train_ids, self.val_ids = train_ids, val_ids
        self.device = model.lm_head.weight.device
        self.dtype = pick_dtype(self.device, self.config.precision) if self.config.fast else torch.float32
        lr, decay, fast = self.config.learning_rate, self.config.weight_decay, self.config.fast
        # The fast path trains through FlatWeights: `working` is the model itself (float32) or
        # its bf16 copy, refreshed from the model's weights after every optimiser step.
        self.flat = FlatWeights(model, self.dtype) if fast else None
        self.working = self.flat.working if self.flat else model
        split = self.flat.matrices_and_vectors() if self.flat else matrices_and_vectors(model)
        self.optimizer = make_optimizer(*split, lr=lr, weight_decay=decay, fused=fast)
        self._loss = torch.compile(self._working_loss) if self.config.compile else self._working_loss
        self.generator = torch.Generator().manual_seed(self.config.seed)
        self.eval_sets = {name: self._fixed_batches(ids, self.config.seed + 1)
                          for name, ids in (("train", train_ids), ("val", val_ids))}
        self.history = History(tokens_per_step=self.config.batch_size * self.context_length)

    def _fixed_batches(self, ids: Tensor, seed: int) -> list[tuple[Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed)
        return [self._to_device(random_batch(ids, self.config.batch_size, self.context_length, generator))
                for _ in range(self.config.eval_batches)]

    def _to_device(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        return batch[0].to(self.device), batch[1].to(self.device)

    def loss_on(self, x: Tensor, y: Tensor) -> Tensor:
        """Mean next-token cross-entropy on inputs x and targets y, both (B, N), computed by
        the working model (bf16 on the fast path): the loss that training differentiates."""
        return self._loss(x, y)

    def _working_loss(self, x: Tensor, y: Tensor) -> Tensor:
        logits = self.working(x, fast=self.config.fast)  # (B, N, V)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def train_step(self, lr: float) -> float:
        """One AdamW step at learning rate `lr` on a fresh random batch; returns its loss.

        A loss or gradient norm that is NaN or infinite stops training with a FloatingPointError
        before the optimiser step (which would spread the NaN into every weight). (PyTorch's
        fused attention on a CPU turns a query row of NaN into zeros, so with a NaN weight the
        fast path's loss can stay finite while its gradient does not: both are checked.)
        """
        x, y = self._to_device(random_batch(self.train_ids, self.config.batch_size,
                                            self.context_length, self.generator))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = self.loss_on(x, y)
        if self.flat:
            self.flat.zero_gradients()
        else:
            self.model.zero_grad(set_to_none=True)
        loss.backward()
        if self.flat:
            self.flat.gather_gradients()
            norm = self.flat.clip_gradients(self.config.grad_clip)
        else:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip,
                                                  foreach=False)
        value, norm = loss.item(), norm.item()
        if not (math.isfinite(value) and math.isfinite(norm)):
            self._stop_diverged(value, norm, lr)
        self.optimizer.step()
        if self.flat:
            self.flat.refresh_working_copy()
        return value

    def _stop_diverged(self, loss: float, norm: float, lr: float) -> None:
        """Raise a FloatingPointError that says at which step the loss or the gradient stopped
        being finite, and what to try."""
        step = len(self.history.steps) + 1
        broken = _non_finite_parameters(self.model)
        if broken:
            cause = (f"the model's weights already hold NaN or inf ({', '.join(broken[:3])}"
                     f"{', ...' if len(broken) > 3 else ''}): rebuild or reload the model")
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
            callbacks: Sequence[Callback] = (), progress_bar: bool = True) -> History:
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
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps is {steps!r}, expected a positive int")
        if seconds is not None and not seconds > 0:
            raise ValueError(f"seconds is {seconds!r}, expected a positive number")
        if self.flat:  # in case the weights were changed by hand
            self.flat.refresh_working_copy()
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
            self._record(loss, lr, elapsed)
            bar.update(1 if steps is not None else elapsed)
            if done % self.config.eval_every == 0:
                self._evaluate_and_report(callbacks, bar)
        if done % self.config.eval_every:
            self._evaluate_and_report(callbacks, bar)
        bar.close()
        return self.history

    def _record(self, loss: float, lr: float, seconds: float) -> None:
        history = self.history
        history.steps.append(len(history.steps) + 1)
        history.losses.append(loss)
        history.lrs.append(lr)
        history.train_seconds += seconds

    def _evaluate_and_report(self, callbacks: Iterable[Callback], bar: tqdm) -> None:
        losses = self.evaluate()
        self.history.eval_steps.append(len(self.history.steps))
        self.history.train_losses.append(losses["train"])
        self.history.val_losses.append(losses["val"])
        bar.set_postfix(train=f"{losses['train']:.3f}", val=f"{losses['val']:.3f}")
        for callback in callbacks:
            callback(self.history)


def _non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """The names of the parameters holding a NaN or an infinity."""
    return [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]


def _progress_bar(steps: int | None, seconds: float | None, enabled: bool) -> tqdm:
    """A text progress bar counting steps, or seconds of training for a time budget."""
    if steps is not None:
        return tqdm(total=steps, unit="step", disable=not enabled, mininterval=0.5)
    return tqdm(total=seconds, unit="s", disable=not enabled, mininterval=0.5,
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}]{postfix}")


# --- watching it learn ---------------------------------------------------------------------


def draw_losses(history: History, ax: Any = None, title: str = "Training a GPT on the course corpus") -> Any:
    """Training-batch loss (thin), fixed-batch train and validation loss (thick), against step."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(history.steps, history.losses, color="0.75", linewidth=1, label="training batch")
    ax.plot(history.eval_steps, history.train_losses, "o-", label="train (fixed batches)")
    ax.plot(history.eval_steps, history.val_losses, "s-", label="validation")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.set_title(title)
    ax.legend()
    return ax


class LiveLossPlot:
    """A callback for `Trainer.fit` that redraws the loss curves in place at every evaluation.

    In Jupyter or Colab the figure updates under the cell; elsewhere it is shown once per call.
    """

    def __init__(self, title: str = "Training a GPT on the course corpus") -> None:
        self.title = title
        self.handle: Any = None
        self.redraws = 0

    def __call__(self, history: History) -> None:
        import matplotlib.pyplot as plt
        from IPython.display import display

        ax = draw_losses(history, title=self.title)
        if self.handle is None:
            self.handle = display(ax.figure, display_id=True)
        else:
            self.handle.update(ax.figure)
        plt.close(ax.figure)
        self.redraws += 1


# --- checkpoints ---------------------------------------------------------------------------


def save_checkpoint(path: str | Path, model: GPT, optimizer: torch.optim.Optimizer | None = None,
                    **extra: Any) -> Path:
    """Save the config, the weights, (optionally) the optimiser state and plain `extra` values.

    Only tensors, numbers, strings and containers of them go in, so `load_checkpoint` can use
    torch.load(weights_only=True), which refuses to run code hidden in a file. Anything else in
    `extra` (a Path, a numpy number) is refused here, naming its key, rather than saved into a
    file that could not be loaded back.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model is a {type(model).__name__}, expected a helpers.gpt.GPT")
    for key, value in extra.items():
        _check_plain(f"extra value {key!r}", value)
    state = {"config": model.config.to_dict(), "model": model.state_dict(), "extra": dict(extra)}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    torch.save(state, path)
    return Path(path)


PLAIN_TYPES = (bool, int, float, str, type(None), Tensor)  # what weights_only loading accepts


def _check_plain(what: str, value: Any) -> None:
    """Raise a TypeError unless `value` is a plain scalar, string, tensor, or a list, tuple or
    dict (with str or int keys) of them."""
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            _check_plain(f"{what}[{i}]", item)
    elif type(value) is dict:
        for key, item in value.items():
            if type(key) not in (str, int):
                raise TypeError(f"{what} has the key {key!r} (a {type(key).__name__}), expected "
                                "str or int keys")
            _check_plain(f"{what}[{key!r}]", item)
    elif type(value) not in PLAIN_TYPES and not isinstance(value, Tensor):
        hint = " (use float(...) or int(...))" if hasattr(value, "item") else \
            " (use str(...))" if isinstance(value, Path) else ""
        raise TypeError(f"{what} is {value!r}, a {type(value).__name__}: expected a bool, int, "
                        f"float, str, None, tensor, or a list or dict of them{hint}, which "
                        "load_checkpoint can read back safely")


class CheckpointError(ValueError):
    """A file that `load_checkpoint` cannot read as a course checkpoint."""


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> tuple[GPT, dict]:
    """The GPT saved at `path` and the whole saved dictionary (for "optimizer" and "extra").

    The file is read with torch.load(weights_only=True), which loads tensors and plain values
    only and never runs code. A file that is not a checkpoint of `save_checkpoint` (another
    kind of file, a truncated one, a whole pickled model, a bare state dict) raises a
    CheckpointError (a ValueError) saying what was found. The saved config is checked, and
    the weights' shapes compared with it on the meta device, before any memory is allocated.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path is {str(path)!r}: no such file")
    state = _read_checkpoint(path, device)
    if not isinstance(state, dict) or "config" not in state or "model" not in state:
        keys = sorted(map(str, state))[:5] if isinstance(state, dict) else []
        looks_like_weights = bool(keys) and all(isinstance(v, Tensor) for v in state.values())
        found = ("a bare state dict (weights without a config, e.g. torch.save(model.state_dict()))"
                 if looks_like_weights else f"a {type(state).__name__}"
                 + (f" with the keys {keys}" if keys else ""))
        raise CheckpointError(f"{path} holds {found}, expected a checkpoint with 'config' and "
                              "'model' entries: save with helpers.train.save_checkpoint(path, model)")
    config = _config_from(state["config"], path)
    _check_weights_fit(config, state["model"], path)
    model = GPT(config).to(device)
    model.load_state_dict(state["model"])
    return model, state


def _read_checkpoint(path: Path, device: torch.device | str) -> Any:
    """torch.load(weights_only=True), its errors turned into what the student can act on."""
    with path.open("rb") as file:
        head = file.read(4)
    if head[:1] in (b"{", b"["):
        raise CheckpointError(f"{path} is a JSON file (a tokenizer's or a config's?), expected "
                              "a checkpoint written by helpers.train.save_checkpoint")
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # noqa: BLE001 - every failure gets the course's message
        text = str(error)
        if "Unsupported global" in text or "weights_only" in text and "GLOBAL" in text:
            what = ("a whole pickled object (torch.save(model)?), which could run code when "
                    "loaded, so it is not loaded")
        elif head == b"PK\x03\x04":
            what = "a damaged or truncated checkpoint (the zip archive is incomplete)"
        else:
            what = "not a PyTorch checkpoint"
        raise CheckpointError(f"{path} is {what}: expected a file written by "
                              "helpers.train.save_checkpoint(path, model)") from None


def _config_from(saved: Any, path: Path) -> GPTConfig:
    """The GPTConfig of a checkpoint, checked (types and sizes) before anything is built."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path} has a 'config' of type {type(saved).__name__}, expected a "
                              "dict of GPTConfig fields")
    known = set(GPTConfig.__dataclass_fields__)
    unknown = sorted(set(map(str, saved)) - known)
    if unknown:
        raise CheckpointError(f"{path} has a config with unknown fields {unknown}, expected "
                              f"fields among {sorted(known)}")
    try:
        return GPTConfig(**saved)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path} has an invalid config: {error}") from None


def _check_weights_fit(config: GPTConfig, weights: Any, path: Path) -> None:
    """Compare the saved weights' names and shapes with a GPT(config) built on the meta device
    (no memory), so a config that does not match its weights is caught before allocating."""
    if not isinstance(weights, dict):
        raise CheckpointError(f"{path} has 'model' of type {type(weights).__name__}, expected a "
                              "state dict of tensors")
    from helpers.gpt import build_without_weights

    expected = {name: tuple(t.shape) for name, t in build_without_weights(config).state_dict().items()}
    got = {name: tuple(t.shape) for name, t in weights.items() if isinstance(t, Tensor)}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        wrong = sorted(n for n in set(expected) & set(got) if expected[n] != got[n])[:3]
        detail = (f"missing {missing}" if missing else
                  f"{wrong[0]} has shape {got[wrong[0]]}, the config gives {expected[wrong[0]]}"
                  if wrong else f"unexpected {sorted(set(got) - set(expected))[:3]}")
        raise CheckpointError(f"{path} has weights that do not match its config ({detail})")
