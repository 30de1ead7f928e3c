"""Tiled (Flash) attention in plain PyTorch: the online softmax, both loop orders, and a backward.

    exp_shifted(x, shift)               exp(x - shift) that gives 0, never NaN, when shift is -inf
    SoftmaxState, softmax_state         running (max, sum) of a softmax over the keys seen so far
    merge_softmax_states(a, b)          the state of the concatenated keys, exactly
    TileState, tile_step, finish        one FlashAttention-2 update of an output tile by a key tile
    tiled_attention_fa1(q, k, v)        Algorithm 1 of FlashAttention: key tiles outside, O in "HBM"
    tiled_attention_fa2(q, k, v)        FlashAttention-2 order: query tiles outside; (output, lse)
    flash_attention(q, k, v)            differentiable: forward tiled, backward recomputes P from lse
    trace_tiles(q, k, v)                the running statistics after every (query tile, key tile)

What tiling costs (elements moved, FLOPs) is counted in `helpers.flash.costs`; the peak memory a
call holds is measured by `helpers.flash.profiling.peak_memory_bytes`.

Masks follow `helpers.model.attention`: boolean, True = this query may attend to this key, broadcastable
to (..., N_q, N_k). `causal=True` is `helpers.model.attention.causal_mask`: query i sees key j when
j <= i + (N_k - N_q), the triangle aligned to the bottom right (equal to the usual lower triangle
when N_q == N_k). A query that may see no key gets a zero output and a log-sum-exp of -inf.

Model code: it imports torch only, never plots, widgets or exercises.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from helpers.model.attention import check_mask, check_qkv, check_scale

NEG_INF = float("-inf")
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 1024


# --- The online softmax ---------------------------------------------------------------------

def exp_shifted(x: Tensor, shift: Tensor) -> Tensor:
    """exp(x - shift), with a shift of -inf treated as 0.

    x: (..., n) or (...,), shift broadcastable to it. A shift of -inf means "no key seen yet" (or a
    fully masked tile); then every x in that row is -inf too, and exp(-inf - -inf) would be NaN.
    Shifting by 0 instead gives exp(-inf) = 0, the right answer.
    """
    return (x - _finite_shift(shift)).exp_()  # in place on the fresh difference: one buffer, not two


def _finite_shift(shift: Tensor) -> Tensor:
    """`shift` with -inf replaced by 0 (see exp_shifted)."""
    return torch.where(shift == NEG_INF, torch.zeros_like(shift), shift)


class SoftmaxState(NamedTuple):
    """The two numbers per row that summarise a softmax over some keys.

    row_max: (...,) m, the largest score seen so far (-inf before any key).
    row_sum: (...,) l = sum_j exp(s_j - m), the softmax denominator measured from that max.
    """

    row_max: Tensor
    row_sum: Tensor


def softmax_state(scores: Tensor) -> SoftmaxState:
    """The state of one block of scores (..., n): its row max and sum of exp(score - max)."""
    row_max = scores.amax(dim=-1)
    return SoftmaxState(row_max, exp_shifted(scores, row_max.unsqueeze(-1)).sum(dim=-1))


def merge_softmax_states(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """The state of the keys of `a` and of `b` together: the same numbers as one pass over both.

    Both sums are moved to the common max m = max(m_a, m_b): l = e^(m_a - m) l_a + e^(m_b - m) l_b.
    """
    row_max = torch.maximum(a.row_max, b.row_max)
    row_sum = exp_shifted(a.row_max, row_max) * a.row_sum + exp_shifted(b.row_max, row_max) * b.row_sum
    return SoftmaxState(row_max, row_sum)


def log_sum_exp(state: SoftmaxState) -> Tensor:
    """log sum_j exp(s_j) = m + log l; -inf for a row that saw no key."""
    return state.row_max + torch.log(state.row_sum)


class TileState(NamedTuple):
    """What FlashAttention-2 keeps on chip for one query tile while it walks the key tiles.

    row_max: (..., B_r)       running max of each query's scores
    row_sum: (..., B_r)       running sum of exp(score - row_max)
    acc:     (..., B_r, d_v)  running sum of exp(score - row_max) * v, not yet divided by row_sum
    """

    row_max: Tensor
    row_sum: Tensor
    acc: Tensor


def start_tile_state(q_tile: Tensor, d_v: int) -> TileState:
    """The state before any key: max -inf, sum 0, accumulator 0. q_tile: (..., B_r, d)."""
    rows = q_tile.shape[:-1]
    return TileState(
        row_max=torch.full(rows, NEG_INF, dtype=q_tile.dtype, device=q_tile.device),
        row_sum=torch.zeros(rows, dtype=q_tile.dtype, device=q_tile.device),
        acc=torch.zeros(*rows, d_v, dtype=q_tile.dtype, device=q_tile.device),
    )


def tile_step(state: TileState, scores: Tensor, v_tile: Tensor) -> TileState:
    """Fold one key tile into the running state of a query tile.

    scores: (..., B_r, B_c) the scaled scores of this tile, -inf where masked. It is scratch
            space: on return it holds the tile's exp(score - new max), as a kernel reuses the same
            registers (pass a copy to keep the scores).
    v_tile: (..., B_c, d_v).
    The old sum and accumulator were measured from the old max; both are multiplied by
    e^(old max - new max) so that everything is measured from the new max before adding this tile.
    """
    row_max = torch.maximum(state.row_max, scores.amax(dim=-1))
    correction = exp_shifted(state.row_max, row_max)
    probs = scores.sub_(_finite_shift(row_max).unsqueeze(-1)).exp_()  # exp_shifted, in place
    row_sum = correction * state.row_sum + probs.sum(dim=-1)
    acc = correction.unsqueeze(-1) * state.acc + probs @ v_tile
    return TileState(row_max, row_sum, acc)


def finish(state: TileState) -> tuple[Tensor, Tensor]:
    """Divide by the softmax sum once, at the end: (output (..., B_r, d_v), lse (..., B_r))."""
    row_sum = state.row_sum.unsqueeze(-1)
    output = state.acc / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    return output, log_sum_exp(SoftmaxState(state.row_max, state.row_sum))


# --- Input checks and tiles -----------------------------------------------------------------

def _check_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                  block_q: int, block_k: int, scale: float | None, causal: bool = False) -> None:
    """Raise a ValueError or TypeError naming what is wrong with the arguments.

    The q/k/v and mask checks are attention's own; tiling adds two rules: the leading
    (batch, head) dimensions must be equal rather than broadcast, and tiles need positive sizes.
    """
    check_qkv(q, k, v)
    if q.shape[-2] == 0:
        raise ValueError(f"q has shape {tuple(q.shape)}: N_q is 0, expected at least one query")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: "
                         "expected the same leading (batch, head) dimensions")
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"{name} is {block!r}, expected a positive int (rows per tile)")
    check_causal(causal, q.shape[-2], k.shape[-2])
    if scale is not None:
        checked_scale(scale, q.shape[-1])
    if mask is not None:
        check_mask(mask, torch.Size((*q.shape[:-1], k.shape[-2])))


def check_causal(causal: bool, n_q: int = 0, n_k: int = 0) -> None:
    """Raise a TypeError unless `causal` is a bool (a string such as "no" is truthy), and, as
    `causal_mask` does, a ValueError for causal attention with more queries than keys."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal is {causal!r} ({type(causal).__name__}), expected True or False")
    if causal and n_q > n_k:
        raise ValueError(f"n_k is {n_k}, expected n_k >= n_q = {n_q} for causal attention (queries are the last n_q keys)")


def checked_scale(scale: float | None, head_dim: int) -> float:
    """`scale` as a Python float, 1/sqrt(head_dim) when None; a ValueError unless positive and
    finite. Any real number type is accepted (numpy.float32 too); bools and tensors are not."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    check_scale(scale)
    return float(scale)


def _tiles(n: int, block: int) -> list[slice]:
    """[0:block], [block:2 block], ...; the last tile is shorter when block does not divide n."""
    return [slice(start, min(start + block, n)) for start in range(0, n, block)]


def _causal_offset(n_q: int, n_k: int) -> int:
    """Query i sees keys j <= i + offset (the triangle aligned to the bottom right)."""
    return n_k - n_q


def _tile_is_hidden(rows: slice, cols: slice, offset: int) -> bool:
    """True when causality hides every key of `cols` from every query of `rows`."""
    return cols.start > rows.stop - 1 + offset


def _tile_visibility(rows: slice, cols: slice, mask: Tensor | None, causal: bool,
                     offset: int, device: torch.device) -> Tensor | None:
    """Bool (..., rows, cols), True where a query may see a key; None when it sees them all."""
    visible = None if mask is None else mask[..., rows, cols]
    if causal and cols.stop - 1 > rows.start + offset:  # some key lies past some query's diagonal
        row_ids = torch.arange(rows.start, rows.stop, device=device).unsqueeze(-1)
        col_ids = torch.arange(cols.start, cols.stop, device=device)
        below = col_ids <= row_ids + offset
        visible = below if visible is None else visible & below
    return visible


def _scores(q_tile: Tensor, k_tile: Tensor, visible: Tensor | None) -> Tensor:
    """(..., B_r, B_c) scores of an already scaled query tile, -inf where a key is hidden."""
    scores = q_tile @ k_tile.transpose(-2, -1)
    return scores if visible is None else scores.masked_fill_(~visible, NEG_INF)


def _expanded_mask(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """A view of `mask` with the full (..., N_q, N_k) shape, so that tiles can be sliced from it."""
    if mask is None:
        return None
    return mask.expand(*q.shape[:-1], k.shape[-2])


# --- The two loop orders --------------------------------------------------------------------

def tiled_attention_fa1(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                        causal: bool = False, scale: float | None = None,
                        block_q: int = 64, block_k: int = 64) -> Tensor:
    """Algorithm 1 of the FlashAttention paper: key tiles in the outer loop.

    q: (..., N_q, d), k: (..., N_k, d), v: (..., N_k, d_v); mask broadcastable to (..., N_q, N_k).
    Returns (..., N_q, d_v). O, l and m live in full-size tensors (the paper's HBM): every key tile
    reads and rewrites every output tile, which keeps O normalised after each step.
    """
    _check_inputs(q, k, v, mask, block_q, block_k, scale, causal)
    scale = checked_scale(scale, q.shape[-1])
    mask = _expanded_mask(mask, q, k)
    n_q, n_k = q.shape[-2], k.shape[-2]
    offset = _causal_offset(n_q, n_k)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    row_sum = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
    row_max = torch.full(q.shape[:-1], NEG_INF, dtype=q.dtype, device=q.device)
    for cols in _tiles(n_k, block_k):                 # line 5: for each key/value tile
        k_tile, v_tile = k[..., cols, :], v[..., cols, :]
        for rows in _tiles(n_q, block_q):             # line 7: for each query tile
            if causal and _tile_is_hidden(rows, cols, offset):
                continue
            visible = _tile_visibility(rows, cols, mask, causal, offset, q.device)
            scores = _scores(q[..., rows, :] * scale, k_tile, visible)     # line 9
            tile = softmax_state(scores)                                    # line 10
            probs = exp_shifted(scores, tile.row_max.unsqueeze(-1))
            old = SoftmaxState(row_max[..., rows], row_sum[..., rows])
            new = merge_softmax_states(old, tile)                           # line 11
            kept = (exp_shifted(old.row_max, new.row_max) * old.row_sum).unsqueeze(-1)
            added = exp_shifted(tile.row_max, new.row_max).unsqueeze(-1)
            total = new.row_sum.unsqueeze(-1)
            total = torch.where(total > 0, total, torch.ones_like(total))
            out[..., rows, :] = (kept * out[..., rows, :] + added * (probs @ v_tile)) / total  # 12
            row_max[..., rows], row_sum[..., rows] = new.row_max, new.row_sum                 # 13
    return out


def tiled_attention_fa2(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                        causal: bool = False, scale: float | None = None,
                        block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K
                        ) -> tuple[Tensor, Tensor]:
    """FlashAttention-2 order: each query tile walks the key tiles, then is divided once.

    q: (..., N_q, d), k: (..., N_k, d), v: (..., N_k, d_v); mask broadcastable to (..., N_q, N_k).
    Returns output (..., N_q, d_v) and the log-sum-exp of each query's scores (..., N_q), which is
    all the backward pass needs to rebuild the attention weights. Query tiles never interact, so
    they could run in parallel; with `causal`, key tiles wholly above the diagonal are skipped.
    Tiles are overwritten in place, so autograd cannot follow it: use `flash_attention` for
    gradients.
    """
    _check_inputs(q, k, v, mask, block_q, block_k, scale, causal)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError("q, k or v requires grad, but tiled_attention_fa2 reuses its tiles in place "
                         "and has no autograd graph: call flash_attention(q, k, v, ...) instead")
    scale = checked_scale(scale, q.shape[-1])
    mask = _expanded_mask(mask, q, k)
    n_q, n_k = q.shape[-2], k.shape[-2]
    offset = _causal_offset(n_q, n_k)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=q.dtype, device=q.device)
    for rows in _tiles(n_q, block_q):
        q_tile = q[..., rows, :] * scale
        state = start_tile_state(q_tile, v.shape[-1])
        for cols in _tiles(n_k, block_k):
            if causal and _tile_is_hidden(rows, cols, offset):
                break  # every later key tile is hidden too
            visible = _tile_visibility(rows, cols, mask, causal, offset, q.device)
            state = tile_step(state, _scores(q_tile, k[..., cols, :], visible), v[..., cols, :])
        out[..., rows, :], lse[..., rows] = finish(state)
    return out, lse


# --- The backward pass: recompute the attention weights tile by tile from the saved log-sum-exp ---

class TiledAttention(torch.autograd.Function):
    """Forward: FlashAttention-2 tiles, saving only q, k, v, the output and the log-sum-exp.

    Backward: for each tile, P = exp(S - lse) is rebuilt from q and k instead of being read back,
    so no (N_q, N_k) matrix is ever stored. With D = rowsum(dO * O):
        dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = scale dS K,   dK = scale dS^T Q.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                scale: float, block_q: int, block_k: int) -> Tensor:
        out, lse = tiled_attention_fa2(q, k, v, mask, causal, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mask, ctx.causal, ctx.scale, ctx.blocks = mask, causal, scale, (block_q, block_k)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        grads = tiled_attention_backward(q, k, v, out, lse, grad_out, ctx.mask, ctx.causal,
                                         ctx.scale, *ctx.blocks)
        return (*grads, None, None, None, None, None)


def tiled_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             grad_out: Tensor, mask: Tensor | None, causal: bool, scale: float,
                             block_q: int, block_k: int) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV of attention from the saved output and log-sum-exp, tile by tile.

    q: (..., N_q, d), k: (..., N_k, d), v: (..., N_k, d_v), out and grad_out: (..., N_q, d_v),
    lse: (..., N_q). Returns tensors shaped like q, k and v.
    """
    mask = _expanded_mask(mask, q, k)
    offset = _causal_offset(q.shape[-2], k.shape[-2])
    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    out_dot_grad = (grad_out * out).sum(dim=-1)  # D_i = sum_j P_ij dP_ij, one number per query
    for rows in _tiles(q.shape[-2], block_q):
        q_tile, grad_out_tile = q[..., rows, :], grad_out[..., rows, :]
        for cols in _tiles(k.shape[-2], block_k):
            if causal and _tile_is_hidden(rows, cols, offset):
                break
            visible = _tile_visibility(rows, cols, mask, causal, offset, q.device)
            scores = _scores(q_tile * scale, k[..., cols, :], visible)
            probs = exp_shifted(scores, lse[..., rows].unsqueeze(-1))
            grad_v[..., cols, :] += probs.transpose(-2, -1) @ grad_out_tile
            grad_probs = grad_out_tile @ v[..., cols, :].transpose(-2, -1)
            grad_scores = probs * (grad_probs - out_dot_grad[..., rows].unsqueeze(-1))
            grad_q[..., rows, :] += scale * (grad_scores @ k[..., cols, :])
            grad_k[..., cols, :] += scale * (grad_scores.transpose(-2, -1) @ q_tile)
    return grad_q, grad_k, grad_v


def flash_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    causal: bool = False, scale: float | None = None,
                    block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K) -> Tensor:
    """Differentiable tiled attention: softmax(q k^T * scale, masked) v without an N x N matrix.

    q: (..., N_q, d), k: (..., N_k, d), v: (..., N_k, d_v); mask broadcastable to (..., N_q, N_k).
    Returns (..., N_q, d_v). Gradients flow to q, k and v (not to the mask).
    """
    _check_inputs(q, k, v, mask, block_q, block_k, scale, causal)
    scale = checked_scale(scale, q.shape[-1])
    return TiledAttention.apply(q, k, v, mask, causal, scale, block_q, block_k)


# --- Watching the tiles ---------------------------------------------------------------------

class TileSnapshot(NamedTuple):
    """The state of one query tile just after one key tile was folded in.

    rows, cols: which query rows and key columns the tile covers.
    row_max, row_sum: (B_r,) running statistics; output: (B_r, d_v) acc / row_sum so far.
    """

    rows: slice
    cols: slice
    row_max: Tensor
    row_sum: Tensor
    output: Tensor


def trace_tiles(q: Tensor, k: Tensor, v: Tensor, block_q: int, block_k: int,
                causal: bool = False) -> list[TileSnapshot]:
    """Every (query tile, key tile) step of FlashAttention-2 on one head, in order.

    q: (N_q, d), k: (N_k, d), v: (N_k, d_v). Hidden causal tiles are skipped, as the forward does.
    """
    if q.dim() != 2:
        raise ValueError(f"q has shape {tuple(q.shape)}, expected one head (N_q, d)")
    _check_inputs(q, k, v, None, block_q, block_k, None, causal)
    scale = 1.0 / math.sqrt(q.shape[-1])
    offset = _causal_offset(q.shape[0], k.shape[0])
    snapshots = []
    for rows in _tiles(q.shape[0], block_q):
        state = start_tile_state(q[rows], v.shape[-1])
        for cols in _tiles(k.shape[0], block_k):
            if causal and _tile_is_hidden(rows, cols, offset):
                break
            visible = _tile_visibility(rows, cols, None, causal, offset, q.device)
            state = tile_step(state, _scores(q[rows] * scale, k[cols], visible), v[cols])
            output, _ = finish(state)
            snapshots.append(TileSnapshot(rows, cols, state.row_max, state.row_sum, output))
    return snapshots
