"""Notebook 11: the general wrappers on models the course's GPT is not, each against a reference.

    make(name)                    a small model by name: "tied_mlp" (an MLP language model whose
                                  output matrix is its embedding), "llama" (a two-block Llama-style
                                  decoder: RMSNorm, RoPE, GQA, SwiGLU), "encoder" (PyTorch's own
                                  nn.TransformerEncoder on a regression task)
    UNITS[name]                   the submodules FSDP gathers one at a time for that model
    train_fsdp_any                worker: FSDP (ours) + AdamW; losses and the full weights
    train_fully_shard_any         worker: PyTorch's fully_shard (FSDP2) + AdamW, the same run
    train_one_process_any         the same run in one process, whole batches (the reference)
    train_sharded_optimizer_any   worker: ShardedOptimizer(AdamW) against an unsharded AdamW given
                                  the same averaged gradients; are they equal bit for bit?

A run's batch at step t is the same on every rank (seeded by t); rank r trains on its rows
r::W... as data parallelism does (`shard_rows`), and a mean over ranks of per-rank means equals
the whole batch's mean, so every run sees the same gradient up to round-off.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.model.modern import ModernBlock, ModernConfig, ModernGPT
from helpers.scale.data_parallel import average_gradients, shard_rows
from helpers.scale.fsdp_module import FSDP
from helpers.scale.zero import ShardedOptimizer

VOCAB, WIDTH, TOKENS, BATCH = 32, 32, 8, 12  # 12 rows split evenly over 1, 2, 3 or 4 ranks
MODELS = ("tied_mlp", "llama", "encoder")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class TiedMLP(nn.Module):
    """ids (B, N) -> logits (B, N, V): embed, a two-layer MLP, the embedding again as the output."""

    def __init__(self, vocab_size: int = VOCAB, d_model: int = WIDTH) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied: one matrix, two places

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        return self.head(x + self.mlp(x))


def make(name: str, seed: int = 0) -> nn.Module:
    """The model `name` (one of MODELS), initialised from `seed`."""
    checks.one_of("name", name, MODELS)
    torch.manual_seed(seed)
    if name == "tied_mlp":
        return TiedMLP()
    if name == "llama":
        return ModernGPT(ModernConfig(vocab_size=VOCAB, context_length=TOKENS, n_layers=2, n_heads=4,
                                      n_kv_heads=2, d_model=WIDTH, tie_weights=True))
    layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


UNITS: dict[str, Any] = {"tied_mlp": [nn.Sequential], "llama": [ModernBlock],
                         "encoder": [nn.TransformerEncoderLayer]}


def batch(name: str, step: int) -> tuple[Tensor, Tensor]:
    """The whole batch of `step` for model `name`: (inputs, targets), BATCH rows."""
    generator = torch.Generator().manual_seed(1000 + step)
    if name == "encoder":
        x = torch.randn(BATCH, TOKENS, WIDTH, generator=generator)
        return x, x.flip(1)  # learn to reverse the sequence's order
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def loss_of(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy (logits (B, N, V)) or mean squared error, in float32."""
    out = model(inputs).float()
    if targets.dtype == torch.long:
        return F.cross_entropy(out.flatten(0, 1), targets.flatten())
    return F.mse_loss(out, targets)


OPTIMIZERS = ("adamw", "sgd")


def _check_run(name: str, dtype: str, steps: int, optimizer: str = "adamw") -> torch.dtype:
    checks.one_of("name", name, MODELS)
    checks.one_of("dtype", dtype, tuple(DTYPES))
    checks.positive_int("steps", steps)
    checks.one_of("optimizer", optimizer, OPTIMIZERS)
    return DTYPES[dtype]


def _optimizer(kind: str, params: Any, lr: float) -> torch.optim.Optimizer:
    """AdamW, or plain SGD: Adam divides by the gradient's size, so a round-off difference in a
    near-zero gradient can flip a step's sign; SGD keeps round-off at round-off, for comparing
    with one process."""
    return torch.optim.AdamW(params, lr=lr) if kind == "adamw" else torch.optim.SGD(params, lr=lr)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, name: str, steps: int,
           rank: int, world_size: int) -> list[float]:
    """`steps` steps of data parallelism on this rank's rows; the loss of each, averaged over ranks."""
    losses = []
    for step in range(steps):
        inputs, targets = batch(name, step)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, shard_rows(inputs, rank, world_size), shard_rows(targets, rank, world_size))
        loss.backward()
        optimizer.step()
        losses.append(_mean_over_ranks(loss.detach(), world_size))
    return losses


def train_fsdp_any(rank: int, world_size: int, name: str, dtype: str = "float32",
                   steps: int = 3, lr: float = 1e-2, optimizer: str = "adamw") -> dict[str, Any]:
    """Worker: our FSDP around model `name`, the optimizer on the shards; losses, full weights."""
    compute = _check_run(name, dtype, steps, optimizer)
    model = FSDP(make(name), compute_dtype=None if compute == torch.float32 else compute,
                 units=UNITS[name])
    losses = _train(model, _optimizer(optimizer, model.parameters(), lr), name, steps, rank, world_size)
    return {"losses": losses, "weights": model.full_parameters(), "piece_bytes": model.piece_bytes()}


def train_fully_shard_any(rank: int, world_size: int, name: str, dtype: str = "float32",
                          steps: int = 3, lr: float = 1e-2) -> dict[str, Any]:
    """Worker: PyTorch's fully_shard (FSDP2) on the same units and run, float32 reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    compute = _check_run(name, dtype, steps)
    model = make(name)
    names = [n for n, _ in model.named_parameters()]
    policy = MixedPrecisionPolicy(param_dtype=None if compute == torch.float32 else compute,
                                  reduce_dtype=torch.float32)
    kinds = tuple(UNITS[name])
    for module in [m for m in model.modules() if isinstance(m, kinds)]:
        fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    losses = _train(model, torch.optim.AdamW(model.parameters(), lr=lr), name, steps, rank, world_size)
    weights = {n: p.full_tensor().detach().clone() for n, p in zip(names, model.parameters(), strict=True)}
    return {"losses": losses, "weights": weights}


def train_one_process_any(name: str, steps: int = 3, lr: float = 1e-2,
                          optimizer: str = "adamw") -> dict[str, Any]:
    """The reference: the same run in one process, float32, whole batches."""
    _check_run(name, "float32", steps, optimizer)
    model = make(name)
    losses = _train(model, _optimizer(optimizer, model.parameters(), lr), name, steps, 0, 1)
    return {"losses": losses, "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _mean_over_ranks(value: Tensor, world_size: int) -> float:
    value = value.float().clone()
    if world_size > 1:
        dist.all_reduce(value)
    return float(value) / world_size


def train_sharded_optimizer_any(rank: int, world_size: int, name: str, steps: int = 3,
                                lr: float = 1e-2) -> dict[str, Any]:
    """Worker: ShardedOptimizer(AdamW) and an unsharded AdamW on a twin, given the same averaged
    gradients at every step: equal bit for bit (torch.equal) after every step?"""
    _check_run(name, "float32", steps)
    model, twin = make(name), make(name)
    sharded = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=lr)
    full = torch.optim.AdamW(twin.parameters(), lr=lr)
    equal_after = []
    for step in range(steps):
        inputs, targets = batch(name, step)
        sharded.zero_grad()
        loss_of(model, shard_rows(inputs, rank, world_size), shard_rows(targets, rank, world_size)).backward()
        average_gradients(model)
        for mine, other in zip(model.parameters(), twin.parameters(), strict=True):
            other.grad = mine.grad.clone()
        sharded.step()
        full.step()
        equal_after.append(all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True)))
    return {"equal_after": equal_after, "state_bytes": sharded.state_bytes(),
            "full_state_bytes": sum(t.numel() * t.element_size() for s in full.state.values()
                                    for t in s.values() if isinstance(t, Tensor))}
