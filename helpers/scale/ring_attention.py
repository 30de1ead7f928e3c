"""Notebook 11, part two: context parallelism, ring attention across processes.

A sequence too long for one device is split along its N tokens: each of p ranks keeps its slice
of the queries, keys and values. The keys and values travel around a ring: at step s rank r holds
the block of rank r - s, scores its own queries against it, and folds the result into a running
output with the online softmax of notebook 8 (the log-sum-exp of each row is all it needs to
merge); then it passes the block on to rank r + 1. After p steps every query has seen every key.

Causal attention: a query chunk skips key chunks entirely in its future. With a contiguous split
rank p - 1 would do p times rank 0's work; the zig-zag split cuts N into 2p chunks and gives rank
r chunks r and 2p - 1 - r, an early one and a late one, so every rank does the same work.

    chunk_ids(rank, world_size, zigzag)   which chunks of the sequence a rank holds
    split_sequence(x, rank, p, zigzag)     a rank's slice (B, H, n, D_H) of x (B, H, N, D_H)
    merge_partial(out, lse, o_b, lse_b)    one online-softmax merge: two partial attentions -> one
    block_attention(q, k, v, diagonal)     attention of a query chunk to a key chunk, with its lse
    RingPass                               send to rank + 1, receive from rank - 1 (backward: reverse)
    ring_attention_worker                  worker: forward and backward of the ring on this rank
    run_ring_attention(workers, ...)       checks the sizes before any process starts, then runs it
    full_attention_reference               one process: output and gradients to compare with

Shapes: B batch, H heads, N tokens in all, n = N / p on a rank, c tokens per chunk, D_H head size.
The backward runs through the ring with autograd: RingPass's backward sends gradients the other
way round the ring, so the gradient of a key reaches the rank that holds it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from helpers import checks
from helpers.scale.workers import Workers


def chunk_ids(rank: int, world_size: int, zigzag: bool) -> list[int]:
    """Zig-zag: chunks [r, 2p - 1 - r] of 2p; contiguous: chunk [r] of p."""
    checks.rank_in_world(rank, world_size)
    return [rank, 2 * world_size - 1 - rank] if checks.boolean("zigzag", zigzag) else [rank]


def check_divides(seq_len: int, world_size: int, zigzag: bool) -> int:
    """The chunk length; ValueError unless p (2p for zig-zag) divides the sequence."""
    checks.positive_int("seq_len", seq_len)
    checks.positive_int("world_size", world_size)
    pieces = 2 * world_size if checks.boolean("zigzag", zigzag) else world_size
    if seq_len % pieces:
        raise ValueError(f"seq_len={seq_len} cannot be split over world_size={world_size} ranks"
                         f"{' in zig-zag chunks' if zigzag else ''}: expected a multiple of {pieces}")
    return seq_len // pieces


def split_sequence(x: Tensor, rank: int, world_size: int, zigzag: bool) -> Tensor:
    """x (B, H, N, D_H) -> this rank's tokens (B, H, n, D_H), its chunks in order."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x is {got}, expected (B, H, N, D_H)")
    c = check_divides(x.shape[2], world_size, zigzag)
    return torch.cat([x[:, :, i * c:(i + 1) * c] for i in chunk_ids(rank, world_size, zigzag)], dim=2)


def block_attention(q: Tensor, k: Tensor, v: Tensor, diagonal: bool) -> tuple[Tensor, Tensor]:
    """q (B, H, c, D_H) against k, v (B, H, c', D_H): softmax(q k^T / sqrt(D_H)) v (B, H, c, D_H)
    and each row's log-sum-exp (B, H, c). diagonal: the same chunk, so the causal mask applies."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "(B, H, c, D_H) and two equal (B, H, c', D_H)")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        hidden = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    lse = scores.logsumexp(dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def merge_partial(out: Tensor | None, lse: Tensor | None, o_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """Two attentions of the same queries over disjoint keys -> the attention over both.

    out, o_b (..., c, D_H), lse, lse_b (..., c). With L = log(e^lse + e^lse_b), each part is
    reweighted by its share of the softmax's denominator: out e^(lse - L) + o_b e^(lse_b - L).
    out=None starts the running state."""
    if o_b.shape[:-1] != lse_b.shape:
        raise ValueError(f"o_b {tuple(o_b.shape)} and lse_b {tuple(lse_b.shape)}: expected (..., c, D_H) and (..., c)")
    if out is None:
        return o_b, lse_b
    new = torch.logaddexp(lse, lse_b)
    return out * torch.exp(lse - new).unsqueeze(-1) + o_b * torch.exp(lse_b - new).unsqueeze(-1), new


class RingPass(torch.autograd.Function):
    """forward: t goes to rank + 1, the tensor of rank - 1 comes back. backward: the gradient
    goes the other way, to rank - 1, so it reaches the rank the values came from."""

    @staticmethod
    def forward(ctx: Any, t: Tensor) -> Tensor:
        return _exchange(t, +1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _exchange(grad.contiguous(), -1)


def _exchange(t: Tensor, direction: int) -> Tensor:
    rank, p = dist.get_rank(), dist.get_world_size()
    received = torch.empty_like(t)
    send = dist.isend(t.contiguous(), dst=(rank + direction) % p)
    dist.recv(received, src=(rank - direction) % p)
    send.wait()
    return received


def ring_attention(q: Tensor, k: Tensor, v: Tensor, zigzag: bool, causal: bool = True) -> tuple[Tensor, int]:
    """This rank's queries (B, H, n, D_H) against the whole sequence's keys and values, which
    arrive one rank's block at a time. Returns the output (B, H, n, D_H) and the number of
    score entries computed (the work, to compare ranks)."""
    if not all(isinstance(t, Tensor) and t.dim() == 4 for t in (q, k, v)) or not q.shape == k.shape == v.shape:
        got = [tuple(getattr(t, "shape", ())) for t in (q, k, v)]
        raise ValueError(f"q, k, v have shapes {got}, expected three equal (B, H, n, D_H): this "
                         "rank's slice of the sequence")
    checks.boolean("zigzag", zigzag)
    checks.boolean("causal", causal)
    rank, p = dist.get_rank(), dist.get_world_size()
    mine = chunk_ids(rank, p, zigzag)
    if q.shape[2] % len(mine):
        raise ValueError(f"q has {q.shape[2]} positions, expected a multiple of {len(mine)} chunks")
    c = q.shape[2] // len(mine)
    kv = torch.stack([k, v])  # (2, B, H, n, D_H): one message per step
    state = [(None, None) for _ in mine]  # (out, lse) per query chunk
    work = 0
    for step in range(p):
        theirs = chunk_ids((rank - step) % p, p, zigzag)
        for a, qi in enumerate(mine):
            for b, ki in enumerate(theirs):
                if causal and ki > qi:
                    continue  # a chunk entirely in these queries' future
                o_b, lse_b = block_attention(q[:, :, a * c:(a + 1) * c], kv[0, :, :, b * c:(b + 1) * c],
                                             kv[1, :, :, b * c:(b + 1) * c], diagonal=causal and ki == qi)
                state[a] = merge_partial(*state[a], o_b, lse_b)
                work += c * c
        if step < p - 1:
            kv = RingPass.apply(kv)
    # Every rank must run every RingPass backward (a send and a receive), even where its causal
    # queries used none of the last block: zero times that block keeps it in the graph.
    return torch.cat([out for out, _ in state], dim=2) + 0 * kv.sum(), work


def _inputs(shape: tuple[int, int, int, int], seed: int) -> list[Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(4)]  # q, k, v, probe


def ring_attention_worker(rank: int, world_size: int, shape: tuple[int, int, int, int], zigzag: bool,
                          causal: bool = True, seed: int = 0) -> dict[str, Any]:
    """Worker: the same q, k, v, probe (B, H, N, D_H) from the seed on every rank; this rank's
    slice through the ring; backward of sum(out * probe). Returns out and the gradients of this
    rank's q, k, v slices, and the work done."""
    q, k, v, probe = (split_sequence(t, rank, world_size, zigzag) for t in _inputs(shape, seed))
    for t in (q, k, v):
        t.requires_grad_(True)
    out, work = ring_attention(q, k, v, zigzag, causal)
    (out * probe).sum().backward()
    return {"out": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad, "work": work}


def run_ring_attention(workers: Workers, shape: tuple[int, int, int, int], zigzag: bool = True,
                       causal: bool = True, seed: int = 0) -> list[dict[str, Any]]:
    """ring_attention_worker on every rank, after checking the sizes (no process started if the
    sequence length N does not split into p, or 2p for zig-zag, equal chunks)."""
    if not isinstance(workers, Workers):
        raise TypeError(f"workers is a {type(workers).__name__}, expected a Workers")
    _check_shape(shape)
    checks.boolean("causal", causal)
    check_divides(shape[2], workers.world_size, zigzag)
    return workers.run(ring_attention_worker, tuple(shape), zigzag, causal, seed)


def _check_shape(shape: object) -> None:
    if not isinstance(shape, tuple | list) or len(shape) != 4:
        raise ValueError(f"shape is {shape!r}, expected (B, H, N, D_H)")
    for name, size in zip(("B", "H", "N", "D_H"), shape, strict=True):
        checks.positive_int(f"shape's {name}", size)


def full_attention_reference(shape: tuple[int, int, int, int], causal: bool = True,
                             seed: int = 0) -> dict[str, Tensor]:
    """One process: out (B, H, N, D_H) and the gradients of q, k, v of sum(out * probe)."""
    _check_shape(shape)
    checks.boolean("causal", causal)
    q, k, v, probe = _inputs(tuple(shape), seed)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * probe).sum().backward()
    return {"out": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad}
