"""Notebook 11, section 4: tensor parallelism, splitting every matrix of a block across ranks.

The MLP D -> hidden -> D (Megatron-LM's recipe): the up projection is *column parallel* (rank r
computes hidden units r * hidden/p ... of every token, no communication: the activation works
unit by unit), the down projection *row parallel* (rank r multiplies its hidden units by its rows
of W_down, a partial sum of the output); one all-reduce adds the partial sums. Attention splits
the same way by heads: each rank projects Q, K, V for its heads, attends, multiplies by its rows
of W_O, and one all-reduce adds the heads' contributions.

    column_shard, row_shard     this rank's slice of a Linear (ValueError if p does not divide it)
    split_mlp_weights           the same cut of an MLP's up weight, up bias and down weight, as tensors
    copy_to_ranks               identity forward; backward all-reduces the gradient (Megatron's f)
    sum_over_ranks              forward all-reduce; identity backward (Megatron's g)
    TensorParallelMLP           FeedForward split over the ranks
    TensorParallelAttention     MultiHeadAttention with the heads split over the ranks
    TensorParallelBlock         a Pre-LN Block built from the two (LayerNorms replicated)
    tensor_parallel_block       worker: the split block's output and gradients, for comparison
    dtensor_mlp                 worker: the same MLP split by torch.distributed.tensor.parallel
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import Tensor, nn

from helpers import checks
from helpers.model.attention import scaled_dot_product_attention
from helpers.model.layers import Block, FeedForward
from helpers.model.multihead import MultiHeadAttention, attention_mask, merge_heads, split_heads


def _check_splits(name: str, size: int, world_size: int) -> int:
    if size % world_size:
        raise ValueError(f"{name}={size} cannot be split over world_size={world_size} ranks: "
                         f"expected a multiple of {world_size}")
    return size // world_size


def _empty_linear(like: nn.Linear, in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """An uninitialised Linear in `like`'s dtype and device, for a shard to copy its weights into.

    Why not nn.Linear(...): its random initialisation would draw from the global generator (and
    move it) only to be overwritten, and its float32 default would round a float64 layer.
    """
    return nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias,
                              device=like.weight.device, dtype=like.weight.dtype)


@torch.no_grad()
def column_shard(linear: nn.Linear, rank: int, world_size: int) -> nn.Linear:
    """Rows rank * k ... (rank + 1) * k of W (out_features) and of the bias: k = out / p outputs."""
    checks.rank_in_world(rank, world_size)
    k = _check_splits("out_features", linear.out_features, world_size)
    shard = _empty_linear(linear, linear.in_features, k, bias=linear.bias is not None)
    shard.weight.copy_(linear.weight[rank * k:(rank + 1) * k])
    if linear.bias is not None:
        shard.bias.copy_(linear.bias[rank * k:(rank + 1) * k])
    return shard


@torch.no_grad()
def row_shard(linear: nn.Linear, rank: int, world_size: int) -> nn.Linear:
    """Columns rank * k ... (rank + 1) * k of W (in_features), no bias: the bias is added once,
    after the partial sums are added up."""
    checks.rank_in_world(rank, world_size)
    k = _check_splits("in_features", linear.in_features, world_size)
    shard = _empty_linear(linear, k, linear.out_features, bias=False)
    shard.weight.copy_(linear.weight[:, rank * k:(rank + 1) * k])
    return shard


def split_mlp_weights(up_weight: Tensor, up_bias: Tensor, down_weight: Tensor, rank: int,
                      world_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Rank `rank`'s block of hidden units of an MLP's weights, as tensors: up_weight (hidden, D)
    -> (hidden / p, D), up_bias (hidden,) -> (hidden / p,), down_weight (D, hidden) -> (D, hidden / p),
    the cut column_shard and row_shard make of the layers (notebook 11's split_mlp exercise)."""
    checks.rank_in_world(rank, world_size)
    for name, t, dims in (("up_weight", up_weight, 2), ("up_bias", up_bias, 1), ("down_weight", down_weight, 2)):
        if not isinstance(t, Tensor) or t.dim() != dims:
            raise ValueError(f"{name} is {getattr(t, 'shape', type(t).__name__)}, expected a {dims}-D tensor")
    hidden = up_weight.shape[0]
    if up_bias.shape != (hidden,) or down_weight.shape[1] != hidden or hidden % world_size:
        raise ValueError(f"up_weight {tuple(up_weight.shape)}, up_bias {tuple(up_bias.shape)} and down_weight "
                         f"{tuple(down_weight.shape)}: expected (hidden, D), (hidden,) and (D, hidden) with "
                         f"hidden a multiple of world_size={world_size}")
    k = hidden // world_size
    units = slice(rank * k, (rank + 1) * k)
    return up_weight[units], up_bias[units], down_weight[:, units]


class _CopyToRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)  # every rank's branch used x: their gradients add up
        return grad


class _SumOverRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, partial: Tensor) -> Tensor:
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        return grad  # d(sum)/d(partial) = 1 on every rank


def copy_to_ranks(x: Tensor) -> Tensor:
    return _CopyToRanks.apply(x)


def sum_over_ranks(partial: Tensor) -> Tensor:
    return _SumOverRanks.apply(partial)


class TensorParallelMLP(nn.Module):
    """This rank's part of `mlp` (a FeedForward): hidden / p units; output = all-reduced sum."""

    def __init__(self, mlp: FeedForward, rank: int, world_size: int) -> None:
        super().__init__()
        self.up = column_shard(mlp.up, rank, world_size)      # (hidden / p, D)
        self.activation = copy.deepcopy(mlp.activation)
        self.down = row_shard(mlp.down, rank, world_size)     # (D, hidden / p)
        self.down_bias = None if mlp.down.bias is None else nn.Parameter(mlp.down.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., D), the same on every rank -> (..., D), the same on every rank."""
        partial = self.down(self.activation(self.up(copy_to_ranks(x))))  # (..., D), this rank's share
        out = sum_over_ranks(partial)
        return out if self.down_bias is None else out + self.down_bias


class TensorParallelAttention(nn.Module):
    """This rank's heads of `attn` (H / p query heads, H_kv / p key/value heads), causal or not."""

    def __init__(self, attn: MultiHeadAttention, rank: int, world_size: int) -> None:
        super().__init__()
        self.n_heads = _check_splits("n_heads", attn.n_heads, world_size)
        self.n_kv_heads = _check_splits("n_kv_heads", attn.n_kv_heads, world_size)
        # The heads are consecutive blocks of D_H rows, so a block of rows is a block of heads.
        self.q_proj = column_shard(attn.q_proj, rank, world_size)
        self.k_proj = column_shard(attn.k_proj, rank, world_size)
        self.v_proj = column_shard(attn.v_proj, rank, world_size)
        self.out_proj = row_shard(attn.out_proj, rank, world_size)
        self.out_bias = None if attn.out_proj.bias is None else nn.Parameter(attn.out_proj.bias.detach().clone())

    def forward(self, x: Tensor, causal: bool = True) -> Tensor:
        """x: (B, N, D) -> (B, N, D)."""
        x = copy_to_ranks(x)
        q = split_heads(self.q_proj(x), self.n_heads)                          # (B, H/p, N, D_H)
        k, v = split_heads(self.k_proj(x), self.n_kv_heads), split_heads(self.v_proj(x), self.n_kv_heads)
        groups = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = attention_mask(None, causal, q.shape[-2], k.shape[-2], q.device)
        heads, _ = scaled_dot_product_attention(q, k, v, mask=mask)             # (B, H/p, N, D_H)
        out = sum_over_ranks(self.out_proj(merge_heads(heads)))                # (B, N, D)
        return out if self.out_bias is None else out + self.out_bias


class TensorParallelBlock(nn.Module):
    """A Pre-LN Block with its attention and MLP split over the ranks; LayerNorms on every rank."""

    def __init__(self, block: Block, rank: int, world_size: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.attn = TensorParallelAttention(block.attn, rank, world_size)
        self.mlp = TensorParallelMLP(block.mlp, rank, world_size)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def demo_block(seed: int = 0, d_model: int = 32, n_heads: int = 4) -> tuple[Block, Tensor, Tensor]:
    """The block, input (2, 8, D) and output weights the tensor-parallel demos use, from `seed`."""
    torch.manual_seed(seed)
    block = Block(d_model, n_heads)
    x = torch.randn(2, 8, d_model)
    probe = 0.1 * torch.randn(2, 8, d_model)  # the loss is (output * probe).sum()
    return block, x, probe


def tensor_parallel_block(rank: int, world_size: int, seed: int = 0) -> dict[str, Tensor | int]:
    """Worker: run the split block forward and backward; return what the parent compares."""
    block, x, probe = demo_block(seed)
    split = TensorParallelBlock(block, rank, world_size)
    x.requires_grad_(True)
    out = split(x)
    (out * probe).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "up_grad": split.mlp.up.weight.grad,
            "q_grad": split.attn.q_proj.weight.grad,
            "parameters": sum(p.numel() for p in split.parameters())}


def dtensor_mlp(rank: int, world_size: int, seed: int = 0) -> dict[str, Tensor | tuple]:
    """Worker: torch.distributed.tensor.parallel splits the same MLP (ColwiseParallel up,
    RowwiseParallel down) on a one-axis device mesh; returns the output and this rank's shapes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    block, x, _ = demo_block(seed)
    mesh = init_device_mesh("cpu", (world_size,))
    mlp = parallelize_module(block.mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    out = mlp(x)
    out = out.wait() if hasattr(out, "wait") else out  # an asynchronous collective's result
    return {"out": out.detach().clone(), "up_local": tuple(mlp.up.weight.to_local().shape),
            "down_local": tuple(mlp.down.weight.to_local().shape), "kind": type(mlp.up.weight).__name__}
