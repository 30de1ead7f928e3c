"""Exercises of notebook 11 (beyond one machine): a ring all-reduce's bytes, the gradient
all-reduce of data parallelism, and an MLP's weights split for tensor parallelism."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model.gpt import GPT, GPTConfig
from helpers.scale.workers import ring_all_reduce_bytes


@exercise(hint="Reduce-scatter and all-gather each take p - 1 steps; in each step a rank sends one "
               "p-th of the tensor. Total: 2 (p - 1) / p x n_bytes.")
def ring_bytes(student: Callable[[float, int], float]) -> str:
    for n_bytes, world_size in ((1000.0, 2), (497_758_208.0, 8), (12.0, 3), (5e9, 1)):
        got = student(n_bytes, world_size)
        expected = ring_all_reduce_bytes(n_bytes, world_size)
        if not isinstance(got, int | float) or not math.isclose(float(got), expected, rel_tol=1e-9, abs_tol=1e-9):
            if isinstance(got, int | float) and math.isclose(float(got), expected / 2, rel_tol=1e-9):
                raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave {got}, half the answer: "
                                     "you counted the reduce-scatter; the all-gather sends as much again.")
            raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave {got!r}, expected {expected:g}.")
    return "Right: almost 2 x the gradient's bytes per rank, however many ranks share the work."


def _two_replicas() -> tuple[GPT, GPT, GPT]:
    """A tiny tied GPT, its twin, and a copy with the whole batch's gradient for reference."""
    config = GPTConfig(vocab_size=16, context_length=8, n_layers=1, n_heads=2, d_model=16)
    torch.manual_seed(0)
    models = [GPT(config) for _ in range(3)]
    for other in models[1:]:
        other.load_state_dict(models[0].state_dict())
    ids = torch.randint(0, config.vocab_size, (4, config.context_length + 1), generator=torch.Generator().manual_seed(1))
    for model, rows in zip(models, (ids[:2], ids[2:], ids), strict=True):
        logits = model(rows[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()).backward()
    return models[0], models[1], models[2]


@exercise(hint="for p in model.parameters(): all_reduce(p.grad), then p.grad /= world_size. "
               "parameters() lists a tied matrix once: reduce each tensor exactly once.")
def average_gradients(student: Callable[[nn.Module, Callable[[Tensor], None], int], None]) -> str:
    rank0, rank1, whole = _two_replicas()
    partner = {id(p.grad): q.grad for p, q in zip(rank0.parameters(), rank1.parameters(), strict=True)}
    calls: list[int] = []

    def all_reduce(tensor: Tensor) -> None:
        """In-place sum with the other rank's copy of the same gradient (as dist.all_reduce does)."""
        if id(tensor) not in partner:
            raise ExerciseFailed("all_reduce was called on a tensor that is not a parameter's .grad.")
        calls.append(id(tensor))
        tensor += partner[id(tensor)]

    student(rank0, all_reduce, 2)
    if len(calls) != len(set(calls)):
        raise ExerciseFailed("some gradient was all-reduced twice (a tied matrix listed twice?): "
                             "use model.parameters(), which lists each tensor once.")
    for (name, p), q in zip(rank0.named_parameters(), whole.parameters(), strict=True):
        if id(p.grad) not in calls:
            raise ExerciseFailed(f"the gradient of {name} was never all-reduced.")
        if not torch.allclose(p.grad, q.grad, atol=1e-6) and torch.allclose(p.grad, 2 * q.grad, atol=1e-6):
            raise ExerciseFailed(f"{name}.grad is the sum over the ranks: divide by world_size for the mean.")
        expect_close(p.grad, q.grad, f"{name}.grad after averaging")
    return "Every rank now holds the whole batch's gradient: the same step everywhere."


@exercise(hint="Rank r takes hidden units r k ... (r + 1) k with k = hidden / world_size: those rows "
               "of up_weight and of up_bias, and those columns of down_weight.")
def split_mlp(student: Callable[[Tensor, Tensor, Tensor, int, int], tuple[Tensor, Tensor, Tensor]]) -> str:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 6))
    x = torch.randn(3, 6)
    for world_size in (2, 3):
        total = torch.zeros(3, 6)
        for rank in range(world_size):
            got = student(mlp[0].weight.detach(), mlp[0].bias.detach(), mlp[2].weight.detach(), rank, world_size)
            if not isinstance(got, tuple | list) or len(got) != 3:
                raise ExerciseFailed("split_mlp should return three tensors (up_weight, up_bias, down_weight).")
            up_w, up_b, down_w = got
            k = 12 // world_size
            expect_close(up_w, mlp[0].weight.detach()[rank * k:(rank + 1) * k], f"rank {rank}'s up_weight of {world_size}")
            expect_close(up_b, mlp[0].bias.detach()[rank * k:(rank + 1) * k], f"rank {rank}'s up_bias of {world_size}")
            expect_close(down_w, mlp[2].weight.detach()[:, rank * k:(rank + 1) * k],
                         f"rank {rank}'s down_weight of {world_size}")
            total += F.gelu(x @ up_w.T + up_b) @ down_w.T
        with torch.no_grad():
            expect_close(total + mlp[2].bias.detach(), mlp(x), f"the sum of the {world_size} ranks' outputs")
    return "The ranks' partial outputs add up to the MLP's output: one all-reduce per MLP."
