"""The helpers trainer against nanoGPT's recipe and a plain loop, side by side, in one run.

    python benchmarks/bench_train.py              # throughput, then races of 60 s and 180 s (~14 min)
    python benchmarks/bench_train.py --quick      # the same parts, short (~2.5 min)
    python benchmarks/bench_train.py --threads 1  # one CPU thread for all
    python benchmarks/bench_train.py --precision fp32   # the helpers trainer in float32 (a laptop)
    python benchmarks/bench_train.py --precision bf16   # ... in bfloat16 (emulated, slow, without
                                                        # AVX512-BF16 or AMX)
    python benchmarks/bench_train.py --no-race    # throughput and MFU only

All train the same GPT (n_layers=4, n_heads=4, d_model=128, block 64, batch 12) on the course
corpus, one character per token, from the same initial weights, with the same recipe (AdamW
with weight decay on matrices, warm-up then cosine learning rate, gradient clipping at 1.0).
Only how fast a step runs differs:

    reference   float32, the course's own attention and LayerNorm, torch.optim.AdamW's
                per-parameter loop, batches stacked window by window
    nanogpt     nanoGPT's recipe as its model.py and train.py write it, on a CPU: its model
                (one Linear for Q, K and V, PyTorch's fused causal attention, nn.LayerNorm,
                the loss computed inside forward), in float32 without autocast (nanoGPT's
                `ctx` is a nullcontext on a CPU, its GradScaler is off outside float16),
                torch.optim.AdamW with nanoGPT's parameter groups and no fused step (nanoGPT
                asks for it on CUDA only), clip_grad_norm_, zero_grad(set_to_none=True).
                Same config, same data, same initial weights, same learning rates
    helpers     helpers.training.trainer.Trainer as notebook 7 uses it: bfloat16 where the CPU has it
                natively (a bf16 working copy, float32 weights for AdamW), fused kernels, every
                weight and gradient in one buffer, a fused AdamW step, batches cut with one
                indexing operation
    compiled    the same Trainer with TrainConfig(compile=True): torch.compile on top. Its
                compile time is printed, and in the races it counts as training time

MFU (model FLOP utilisation) is counted as nanoGPT's `estimate_mfu` counts it: 6 N + 12 L H Q T
FLOPs per token (N parameters without the position table, L layers, H heads, Q = D / H, T the
window), times the tokens per second, over the machine's peak. The peak is measured here: the
best rate of a 1024 x 1024 x 1024 float32 matrix product (and in bfloat16, for --precision bf16)
on the same threads, so MFU says how much of what this CPU's BLAS can do a step uses.

The contestants take turns in short slices, so that anything else running on the machine slows
them alike. Budgets (exit status 1 when one is missed):
    - the helpers trainer processes at least 2x the reference's tokens per second, with and
      without compile, and at least 1.5x nanoGPT's recipe in float32, 2.5x in bfloat16;
    - after equal training time, its validation loss is lower than the reference's (each race,
      both helpers contestants).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.model.gpt import GPT, GPTConfig
from helpers.text.chars import CharTokenizer
from helpers.text.corpus import load_corpus
from helpers.training.speed import cpu_has_native_bf16, pick_dtype
from helpers.training.trainer import (
    TrainConfig,
    Trainer,
    encode_text,
    evaluate_loss,
    learning_rate,
    random_batch,
    split_train_val,
)

N_LAYER, N_HEAD, N_EMBD, BLOCK, BATCH = 4, 4, 128, 64, 12
PEAK_LR, WEIGHT_DECAY, BETAS, GRAD_CLIP = 2e-3, 0.1, (0.9, 0.99), 1.0
SPEEDUP_BUDGET = 2.0
NANOGPT_BUDGETS = {"fp32": 1.5, "bf16": 2.5}  # the helpers trainer over nanoGPT's recipe (issue 23)


class ReferenceLoop:
    """A plain training loop: float32, manual attention, standard AdamW, no tricks."""

    def __init__(self, model: GPT, train_ids: torch.Tensor, seed: int = 0) -> None:
        self.model, self.train_ids = model, train_ids
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        vectors = [p for p in model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": matrices, "weight_decay": WEIGHT_DECAY},
             {"params": vectors, "weight_decay": 0.0}],
            lr=PEAK_LR, betas=BETAS, foreach=False)
        self.generator = torch.Generator().manual_seed(seed)

    def get_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.train_ids) - BLOCK, (BATCH,), generator=self.generator)
        x = torch.stack([self.train_ids[i:i + BLOCK] for i in starts])
        y = torch.stack([self.train_ids[i + 1:i + BLOCK + 1] for i in starts])
        return x, y

    def train_step(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.get_batch()
        logits = self.model(x)  # the course's Block.forward: its own attention, float32
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        return loss.item()


# --- nanoGPT's recipe -----------------------------------------------------------------------

class NanoAttention(nn.Module):
    """nanoGPT's causal self-attention: one Linear makes Q, K and V; PyTorch's fused kernel."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n_tokens, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, n_tokens, self.n_heads, width // self.n_heads).transpose(1, 2)
                   for t in (q, k, v))  # (B, H, N, D_H)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, n_tokens, width))


class NanoBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = NanoAttention(d_model, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPTModel(nn.Module):
    """nanoGPT's GPT at the benchmark's sizes (dropout 0, so no dropout layers), started from
    the course GPT's weights: the same function at step 0."""

    def __init__(self, course: GPT) -> None:
        super().__init__()
        config = course.config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.context_length, config.d_model)
        self.h = nn.ModuleList(NanoBlock(config.d_model, config.n_heads) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in nanoGPT
        self._copy_weights(course)

    @torch.no_grad()
    def _copy_weights(self, course: GPT) -> None:
        self.wte.weight.copy_(course.embed.token.weight)
        self.wpe.weight.copy_(course.embed.position.weight)
        self.ln_f.load_state_dict(course.ln_f.state_dict())
        for ours, theirs in zip(self.h, course.blocks, strict=True):
            ours.ln_1.load_state_dict(theirs.ln1.state_dict())
            ours.ln_2.load_state_dict(theirs.ln2.state_dict())
            projections = (theirs.attn.q_proj, theirs.attn.k_proj, theirs.attn.v_proj)
            ours.attn.c_attn.weight.copy_(torch.cat([p.weight for p in projections]))
            ours.attn.c_attn.bias.copy_(torch.cat([p.bias for p in projections]))
            ours.attn.c_proj.load_state_dict(theirs.attn.out_proj.state_dict())
            ours.mlp[0].load_state_dict(theirs.mlp.up.state_dict())
            ours.mlp[2].load_state_dict(theirs.mlp.down.state_dict())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


class NanoGPTLoop(ReferenceLoop):
    """nanoGPT's train.py step on a CPU, with its optimiser set-up (ReferenceLoop's batches)."""

    def __init__(self, model: NanoGPTModel, train_ids: torch.Tensor, seed: int = 0) -> None:
        super().__init__(model, train_ids, seed)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(  # nanoGPT passes fused=True on CUDA only
            [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
            lr=PEAK_LR, betas=BETAS)
        self.ctx = contextlib.nullcontext()  # nanoGPT: no autocast when device_type == "cpu"

    def train_step(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.get_batch()
        with self.ctx:
            _, loss = self.model(x, y)
        loss.backward()  # nanoGPT's GradScaler is disabled outside float16: a plain backward
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


@torch.no_grad()
def nanogpt_loss(model: NanoGPTModel, batches: list) -> float:
    """Mean validation loss of the nanoGPT model, as evaluate_loss computes it for the others."""
    model.eval()
    total = sum(model(x, y)[1].item() for x, y in batches)
    model.train()
    return total / len(batches)



@dataclass
class Runner:
    """One contestant: its step function and the training time it has used."""

    name: str
    model: nn.Module
    train_step: Callable[[float], float]
    seconds: float = 0.0
    steps: int = 0

    def run_for(self, slice_seconds: float, budget: float | None = None) -> None:
        """Train until this slice is used up (or the budget is reached); learning rate by the
        fraction of the budget spent."""
        end = self.seconds + slice_seconds if budget is None else min(budget, self.seconds + slice_seconds)
        while self.seconds < end:
            progress = self.seconds / budget if budget else 0.5
            lr = learning_rate(progress, PEAK_LR)
            started = time.perf_counter()
            self.train_step(lr)
            self.seconds += time.perf_counter() - started
            self.steps += 1


def make_runners(vocab_size: int, train_ids: torch.Tensor, val_ids: torch.Tensor,
                 nanogpt: bool = True, precision: str = "auto", compiled: bool = True) -> tuple[Runner, ...]:
    """The reference loop, (optionally) nanoGPT's recipe and the helpers trainer (without and
    with compile), on models with the same initial weights."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=vocab_size, context_length=BLOCK, n_layers=N_LAYER,
                       n_heads=N_HEAD, d_model=N_EMBD)
    reference_model = GPT(config)
    runners = [Runner("reference", reference_model, ReferenceLoop(reference_model, train_ids).train_step)]
    if nanogpt:
        nano_model = NanoGPTModel(reference_model)
        runners.append(Runner("nanogpt", nano_model, NanoGPTLoop(nano_model, train_ids).train_step))
    for name, compile_it in (("helpers", False), ("compiled", True))[:2 if compiled else 1]:
        model = GPT(config)
        model.load_state_dict(reference_model.state_dict())
        trainer = Trainer(model, train_ids, val_ids,
                          TrainConfig(batch_size=BATCH, context_length=BLOCK, learning_rate=PEAK_LR,
                                      weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP, compile=compile_it,
                                      precision=precision))
        runners.append(Runner(name, model, trainer.train_step))
    return tuple(runners)


def throughput(runners: tuple[Runner, ...], rounds: int, slice_seconds: float) -> dict[str, float]:
    """Tokens per second of each runner: the median over `rounds` short turns each, after a
    warm-up (which includes compiling). The median ignores turns that a burst of other work on
    the machine slowed down."""
    for runner in runners:
        started = time.perf_counter()
        runner.train_step(PEAK_LR)  # the compiled runner compiles here
        print(f"{runner.name}: first step {time.perf_counter() - started:.1f} s")
        runner.run_for(1.0)
    rates: dict[str, list[float]] = {r.name: [] for r in runners}
    for _ in range(rounds):
        for runner in runners:
            steps, seconds = runner.steps, runner.seconds
            runner.run_for(slice_seconds)
            rates[runner.name].append((runner.steps - steps) * BATCH * BLOCK / (runner.seconds - seconds))
    return {name: statistics.median(values) for name, values in rates.items()}


def race(runners: tuple[Runner, ...], budget: float, val_batches: list, slice_seconds: float) -> dict[str, float]:
    """Validation loss of each runner after `budget` seconds of training, taking turns."""
    while any(r.seconds < budget for r in runners):
        for runner in runners:
            if runner.seconds < budget:
                runner.run_for(slice_seconds, budget)
    return {r.name: nanogpt_loss(r.model, val_batches) if isinstance(r.model, NanoGPTModel)
            else evaluate_loss(r.model, val_batches) for r in runners}


def peak_flops(dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    """The best FLOP/s of a (size x size) @ (size x size) product in `dtype`: this machine's peak
    as its BLAS reaches it, on the current threads (2 size^3 FLOPs per product)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # warm-up
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def flops_per_token(model: nn.Module) -> float:
    """nanoGPT's estimate_mfu count: 6 N + 12 L H Q T, N the parameters without the position
    table (nanoGPT's get_num_params), Q the head width, T the window."""
    config = model.config
    n_params = sum(p.numel() for p in model.parameters()) - model.embed.position.weight.numel()
    head = config.d_model // config.n_heads
    return 6 * n_params + 12 * config.n_layers * config.n_heads * head * BLOCK


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (races of 10 s and 20 s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for PyTorch (default: PyTorch's choice, one per core)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="the helpers trainer's TrainConfig(precision=...) (default auto)")
    parser.add_argument("--no-race", action="store_true", help="throughput and MFU only")
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled contestant")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    budgets = (10.0, 20.0) if args.quick else (60.0, 180.0)
    rounds = 10 if args.quick else 40

    text = load_corpus()
    tokenizer = CharTokenizer.train(text)
    train_ids, val_ids = split_train_val(encode_text(tokenizer, text))
    generator = torch.Generator().manual_seed(1)
    val_batches = [random_batch(val_ids, 32, BLOCK, generator) for _ in range(16)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; GPT n_layers={N_LAYER} "
          f"n_heads={N_HEAD} d_model={N_EMBD}, block {BLOCK}, batch {BATCH}, vocab {tokenizer.vocab_size}")
    dtype = pick_dtype(torch.device("cpu"), args.precision)
    print(f"helpers trainer precision: {dtype} (--precision {args.precision}; native bf16: "
          f"{cpu_has_native_bf16()})")
    peaks = {torch.float32: peak_flops(torch.float32)}
    if dtype != torch.float32:
        peaks[dtype] = peak_flops(dtype)
    print("peak (best 1024^3 matrix product): " + ", ".join(
        f"{str(d).removeprefix('torch.')} {rate / 1e9:.1f} GFLOP/s" for d, rate in peaks.items()))

    failures = []
    runners = make_runners(tokenizer.vocab_size, train_ids, val_ids, precision=args.precision,
                           compiled=not args.no_compile)
    speeds = throughput(runners, rounds, 0.5)
    # The peak again after the contestants, the best of both: on a shared machine a single
    # measurement can land in a quiet moment or a busy one (MFU above 100% means the latter).
    peaks = {d: max(rate, peak_flops(d)) for d, rate in peaks.items()}
    print("peak, best of before and after: " + ", ".join(
        f"{str(d).removeprefix('torch.')} {rate / 1e9:.1f} GFLOP/s" for d, rate in peaks.items()))
    print("\ntokens per second: " + ", ".join(f"{name} {rate:,.0f}" for name, rate in speeds.items()))
    print(f"  nanogpt: {speeds['nanogpt'] / speeds['reference']:.2f}x the reference")
    per_token = flops_per_token(runners[0].model)
    for name, rate in speeds.items():
        peak = peaks[dtype] if name in ("helpers", "compiled") else peaks[torch.float32]
        print(f"  MFU {name}: {rate * per_token / 1e9:.2f} GFLOP/s = {rate * per_token / peak:.1%} of "
              f"the {'float32' if peak == peaks[torch.float32] else str(dtype)} peak")
    precision = "bf16" if dtype == torch.bfloat16 else "fp32"
    for name in ("helpers", "compiled")[:1 if args.no_compile else 2]:
        ratio, over_nano = speeds[name] / speeds["reference"], speeds[name] / speeds["nanogpt"]
        print(f"  {name}: {ratio:.2f}x the reference (budget >= {SPEEDUP_BUDGET:.0f}x), "
              f"{over_nano:.2f}x nanoGPT's recipe (budget in {precision} >= {NANOGPT_BUDGETS[precision]}x)")
        if ratio < SPEEDUP_BUDGET:
            failures.append(f"{name} speed-up {ratio:.2f}x < {SPEEDUP_BUDGET}x")
        if over_nano < NANOGPT_BUDGETS[precision]:
            failures.append(f"{name} over nanoGPT {over_nano:.2f}x < {NANOGPT_BUDGETS[precision]}x")

    for budget in () if args.no_race else budgets:
        runners = make_runners(tokenizer.vocab_size, train_ids, val_ids, nanogpt=False,
                               precision=args.precision, compiled=not args.no_compile)
        losses = race(runners, budget, val_batches, slice_seconds=2.0)
        print(f"after {budget:.0f} s of training, validation loss: " + ", ".join(
            f"{r.name} {losses[r.name]:.3f} ({r.steps} steps)" for r in runners))
        for name in [r.name for r in runners if r.name != "reference"]:
            if not losses[name] < losses["reference"]:
                failures.append(f"{name}: validation loss after {budget:.0f} s not lower")

    print("\nbudgets: " + ("all met" if not failures else "MISSED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
