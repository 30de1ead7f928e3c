"""Expert parallelism (notebook 12, section 1): each rank holds E / W experts, tokens travel.

    expert_parallel_step(rank, world_size, ...)   run inside each worker (`Workers.run`): route
                              this rank's tokens, all-to-all them to the ranks that hold their
                              experts, run the local experts, all-to-all the results back, and
                              compare with the whole layer run in one process
    dispatch_plan(experts, n_experts, world_size) which rank every assignment goes to, in send
                              order, and how many go to each rank

Two all-to-alls per MoE layer and direction (forward: dispatch and combine), each moving
T x k x D numbers per rank in total: the price of holding only E / W experts per rank.
Built on `helpers.scale.workers` (processes, gloo) and `helpers.model.moe`.
Shapes: T tokens per rank, D d_model, E experts, k per token, W world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from helpers import checks
from helpers.model.moe import MoELayer, check_expert_indices, route


def dispatch_plan(experts: Tensor, n_experts: int, world_size: int) -> tuple[Tensor, Tensor]:
    """experts (T, k) -> (order (T k,), the assignments sorted by destination rank; counts (W,)).

    Rank r holds experts r E/W ... (r+1) E/W - 1, so assignment a goes to rank experts[a] // (E/W).
    """
    checks.positive_int("world_size", world_size)
    check_expert_indices(experts, n_experts)
    if n_experts % world_size:
        raise ValueError(f"n_experts is {n_experts}, expected a multiple of world_size = {world_size}: "
                         "every rank holds the same number of experts")
    destination = experts.reshape(-1) // (n_experts // world_size)
    order = torch.argsort(destination, stable=True)
    return order, torch.bincount(destination, minlength=world_size)


def _all_to_all(x: Tensor, send_counts: list[int], receive_counts: list[int]) -> Tensor:
    out = x.new_empty((sum(receive_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), receive_counts, send_counts)
    return out


@torch.no_grad()
def expert_parallel_step(rank: int, world_size: int, seed: int = 0, n_tokens: int = 16,
                         d_model: int = 16, n_experts: int = 4, top_k: int = 2,
                         hidden: int = 32) -> dict[str, float]:
    """One MoE layer's forward split across the ranks; returns the largest difference from the
    single-process layer, and the rows this rank sent and computed."""
    for name, value in (("n_tokens", n_tokens), ("d_model", d_model), ("n_experts", n_experts),
                        ("top_k", top_k), ("hidden", hidden)):
        checks.positive_int(name, value)
    torch.manual_seed(seed)                                   # the same layer on every rank
    layer = MoELayer(d_model, n_experts, top_k, hidden).eval()
    x = torch.randn(n_tokens, d_model, generator=torch.Generator().manual_seed(seed + 1 + rank))
    weights, experts = route(layer.router(x), top_k, layer.mode)
    order, counts = dispatch_plan(experts, n_experts, world_size)
    # 1. tell every rank how many rows it will receive from us
    receive = torch.empty_like(counts)
    dist.all_to_all_single(receive, counts)
    send_counts, receive_counts = counts.tolist(), receive.tolist()
    # 2. dispatch: each assignment's token vector and expert index to the rank holding the expert
    token = order // top_k
    arrived = _all_to_all(x[token], send_counts, receive_counts)                   # (R, D)
    arrived_expert = _all_to_all(experts.reshape(-1)[order], send_counts, receive_counts)
    # 3. the local experts (plain loop over this rank's E / W experts)
    per_rank = n_experts // world_size
    done = torch.zeros_like(arrived)
    for e in range(rank * per_rank, (rank + 1) * per_rank):
        rows = arrived_expert == e
        done[rows] = layer.experts.one(e, arrived[rows])
    # 4. combine: results back to their tokens' ranks, weighted and summed per token
    returned = _all_to_all(done, receive_counts, send_counts)                       # (T k, D)
    out = torch.zeros_like(x).index_add(0, token, returned * weights.reshape(-1)[order, None])
    reference = layer(x)
    return {"max_error": float((out - reference).abs().max()), "rows_sent": int(sum(send_counts)),
            "rows_computed": int(arrived.shape[0])}
