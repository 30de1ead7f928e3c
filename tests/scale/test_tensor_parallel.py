"""helpers.scale.tensor_parallel in the pytest process: two to four ranks as threads
(tests/ranks_in_threads.py), each split module against the whole one forward and backward, Megatron's f and g
against their definitions, the hand-split MLP against torch.distributed.tensor.parallel's; every
refusal's message.

The tests marked `processes` run the same workers in two spawned processes (gloo).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.tensor.parallel  # noqa: F401 - imported once here, not inside a timed test
from ranks_in_threads import locked, run_ranks
from torch import nn

from helpers.model.layers import Block, FeedForward
from helpers.model.multihead import MultiHeadAttention
from helpers.scale import tensor_parallel as tp
from helpers.scale.tensor_parallel import (
    TensorParallelAttention,
    TensorParallelBlock,
    TensorParallelMLP,
    column_shard,
    copy_to_ranks,
    demo_block,
    dtensor_mlp,
    row_shard,
    sum_over_ranks,
    tensor_parallel_block,
)


@pytest.fixture(autouse=True)
def _one_seeding_rank_at_a_time(monkeypatch):
    """The ranks are threads of one process and share its random generator."""
    monkeypatch.setattr(tp, "demo_block", locked(tp.demo_block))


def _linear(n_in, n_out, bias=True):
    linear = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(n_out * n_in, dtype=torch.float32).reshape(n_out, n_in))
        if bias:
            linear.bias.copy_(100 + torch.arange(n_out, dtype=torch.float32))
    return linear


# --- the shards ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_column_shard_holds_its_ranks_output_rows(rank):
    linear = _linear(2, 6)
    shard = column_shard(linear, rank, 3)
    assert (shard.in_features, shard.out_features) == (2, 2)
    assert torch.equal(shard.weight, linear.weight[2 * rank:2 * rank + 2])
    assert torch.equal(shard.bias, linear.bias[2 * rank:2 * rank + 2])
    assert shard.weight.requires_grad and shard.weight.grad_fn is None
    assert column_shard(_linear(2, 6, bias=False), rank, 3).bias is None


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_row_shard_holds_its_ranks_input_columns_and_no_bias(rank):
    linear = _linear(6, 2)
    shard = row_shard(linear, rank, 3)
    assert (shard.in_features, shard.out_features) == (2, 2)
    assert torch.equal(shard.weight, linear.weight[:, 2 * rank:2 * rank + 2])
    assert shard.bias is None and shard.weight.requires_grad and shard.weight.grad_fn is None


@pytest.mark.parametrize("shard_of", [column_shard, row_shard])
def test_a_shard_keeps_the_layers_dtype_and_draws_no_random_numbers(shard_of):
    """A shard copies its weights: a float64 layer's shard is float64 to the last bit, and making
    it leaves the global generator where it was (another rank-thread may be seeding it)."""
    linear = _linear(6, 6).double()
    with torch.no_grad():
        linear.weight.add_(1e-12)  # a difference float32 cannot hold
    torch.manual_seed(0)
    shard = shard_of(linear, 1, 2)
    after_shard = torch.rand(4)
    torch.manual_seed(0)
    assert torch.equal(after_shard, torch.rand(4))
    assert shard.weight.dtype == torch.float64 and shard.weight.device == linear.weight.device
    columns = shard.weight if shard_of is row_shard else shard.weight.T
    assert torch.equal(columns, (linear.weight[:, 3:] if shard_of is row_shard else linear.weight[3:].T))
    if shard_of is column_shard:
        assert shard.bias.dtype == torch.float64 and torch.equal(shard.bias, linear.bias[3:])


@pytest.mark.parametrize("shard_of", [column_shard, row_shard])
def test_a_shard_of_a_layer_on_the_meta_device_stays_there(shard_of):
    """A model built on the meta device (no memory) is split before any weight exists."""
    with torch.device("meta"):
        linear = nn.Linear(4, 4)
    shard = shard_of(linear, 0, 2)
    assert shard.weight.is_meta and shard.weight.shape == ((2, 4) if shard_of is column_shard else (4, 2))


@pytest.mark.parametrize("call, message", [
    (lambda: column_shard(_linear(4, 6), 0, 4),
     "^out_features=6 cannot be split over world_size=4 ranks: expected a multiple of 4$"),
    (lambda: row_shard(_linear(6, 4), 0, 4),
     "^in_features=6 cannot be split over world_size=4 ranks: expected a multiple of 4$"),
    (lambda: column_shard(_linear(4, 6), 3, 3), "^rank is 3, expected 0 <= rank < world_size = 3$"),
    (lambda: row_shard(_linear(6, 4), -1, 3), "^rank is -1, expected 0 <= rank < world_size = 3$"),
    (lambda: TensorParallelAttention(MultiHeadAttention(8, 2), 0, 4),
     "^n_heads=2 cannot be split over world_size=4 ranks: expected a multiple of 4$"),
    (lambda: TensorParallelAttention(MultiHeadAttention(12, 6, n_kv_heads=3), 0, 2),
     "^n_kv_heads=3 cannot be split over world_size=2 ranks: expected a multiple of 2$"),
])
def test_a_split_that_does_not_divide_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- Megatron's f and g -------------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [2, 3])
def test_copy_to_ranks_is_the_identity_forward_and_sums_the_gradients_backward(world_size):
    def task(rank, world_size):
        x = torch.full((2,), rank + 1.0, requires_grad=True)
        y = copy_to_ranks(x)
        assert torch.equal(y, x)
        (y * (rank + 1)).sum().backward()
        return x.grad.tolist()

    total = sum(range(1, world_size + 1))
    assert run_ranks(world_size, task) == [[float(total)] * 2] * world_size


def test_copy_to_ranks_leaves_the_gradient_of_other_branches_alone():
    """The gradient it receives is the tensor a sum handed to every branch: reduced in place, it
    would change the other branch's gradient too."""
    def task(rank, world_size):
        x, other = (torch.ones(2, requires_grad=True) for _ in range(2))
        (other * 1 + copy_to_ranks(x)).sum().backward()
        return x.grad.tolist(), other.grad.tolist()

    assert run_ranks(2, task) == [([2.0, 2.0], [1.0, 1.0])] * 2


@pytest.mark.parametrize("world_size", [2, 3])
def test_sum_over_ranks_adds_forward_and_passes_the_gradient_through(world_size):
    def task(rank, world_size):
        partial = torch.full((2,), rank + 1.0, requires_grad=True)
        kept = partial.detach().clone()
        total = sum_over_ranks(partial)
        assert torch.equal(partial, kept)  # the sum is a new tensor
        (total * (rank + 1)).sum().backward()
        return total.tolist(), partial.grad.tolist()

    total = float(sum(range(1, world_size + 1)))
    assert run_ranks(world_size, task) == [([total] * 2, [rank + 1.0] * 2) for rank in range(world_size)]


# --- the split modules against the whole ones ---------------------------------------------------

def _compare(whole, make_split, x, world_size, **forward):
    """Run the split module on every rank; its output and input gradient must be the whole one's."""
    x = x.detach().requires_grad_(True)
    probe = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
    (whole(x, **forward) * probe).sum().backward()

    def task(rank, world_size):
        split = make_split(rank, world_size)
        x_here = x.detach().requires_grad_(True)
        with torch.device("meta"):  # a default device elsewhere: what the forward makes follows x
            out = split(x_here, **forward)
        (out * probe).sum().backward()
        return out.detach(), x_here.grad, split

    results = run_ranks(world_size, task)
    expected = whole(x, **forward).detach()
    for out, x_grad, _ in results:
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(x_grad, x.grad, rtol=0, atol=1e-5)
    return [split for _, _, split in results]


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("activation, bias", [("gelu", True), ("relu", False)])
def test_the_split_mlp_is_the_mlp(world_size, activation, bias):
    torch.manual_seed(0)
    mlp = FeedForward(8, 16, activation=activation, bias=bias)
    splits = _compare(mlp, lambda rank, ws: TensorParallelMLP(mlp, rank, ws), torch.randn(3, 8), world_size)
    k = 16 // world_size
    for rank, split in enumerate(splits):
        assert type(split.activation) is type(mlp.activation) and split.activation is not mlp.activation
        torch.testing.assert_close(split.up.weight.grad, mlp.up.weight.grad[rank * k:(rank + 1) * k])
        torch.testing.assert_close(split.down.weight.grad, mlp.down.weight.grad[:, rank * k:(rank + 1) * k])
        if bias:
            torch.testing.assert_close(split.down_bias.grad, mlp.down.bias.grad)
            assert split.down_bias.data_ptr() != mlp.down.bias.data_ptr()
        else:
            assert split.down_bias is None


@pytest.mark.parametrize("world_size, n_kv_heads", [(1, None), (2, None), (4, None), (2, 2)])
@pytest.mark.parametrize("causal", [True, False])
def test_the_split_attention_is_the_attention(world_size, n_kv_heads, causal):
    torch.manual_seed(1)
    attn = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads)
    splits = _compare(attn, lambda rank, ws: TensorParallelAttention(attn, rank, ws), torch.randn(2, 5, 16),
                      world_size, causal=causal)
    for rank, split in enumerate(splits):
        assert (split.n_heads, split.n_kv_heads) == (4 // world_size, (n_kv_heads or 4) // world_size)
        k = 16 // world_size
        torch.testing.assert_close(split.q_proj.weight.grad, attn.q_proj.weight.grad[rank * k:(rank + 1) * k])
        torch.testing.assert_close(split.out_bias.grad, attn.out_proj.bias.grad)
        assert split.out_bias.data_ptr() != attn.out_proj.bias.data_ptr()


def test_the_split_attention_is_causal_unless_told():
    torch.manual_seed(2)
    attn = MultiHeadAttention(8, 2, bias=False)
    _compare(lambda x: attn(x, causal=True), lambda rank, ws: TensorParallelAttention(attn, rank, ws),
             torch.randn(1, 4, 8), 2)
    assert TensorParallelAttention(attn, 0, 2).out_bias is None


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_split_block_is_the_block(world_size):
    torch.manual_seed(3)
    block = Block(16, 4)
    with torch.no_grad():  # LayerNorms away from their initial ones and zeros
        for ln in (block.ln1, block.ln2):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    splits = _compare(block, lambda rank, ws: TensorParallelBlock(block, rank, ws), torch.randn(2, 5, 16),
                      world_size)
    for split in splits:
        # each rank's own replica of the LayerNorms, not the block's tensors
        assert split.ln1.weight.data_ptr() != block.ln1.weight.data_ptr()
        assert split.ln2.weight.data_ptr() != block.ln2.weight.data_ptr()
        torch.testing.assert_close(split.ln1.weight.grad, block.ln1.weight.grad)
        torch.testing.assert_close(split.ln2.bias.grad, block.ln2.bias.grad)


# --- the demos and the workers ------------------------------------------------------------------

def test_the_demo_block_and_its_inputs_come_from_the_seed():
    block, x, probe = tp.demo_block(seed=4, d_model=16, n_heads=2)
    torch.manual_seed(4)
    expected = Block(16, 2)
    assert block.attn.n_heads == 2 and block.ln1.d_model == 16
    for a, b in zip(block.state_dict().values(), expected.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(x, torch.randn(2, 8, 16)) and torch.equal(probe, 0.1 * torch.randn(2, 8, 16))
    block, x, probe = tp.demo_block()
    assert block.ln1.d_model == 32 and block.attn.n_heads == 4 and x.shape == probe.shape == (2, 8, 32)
    assert torch.equal(x, tp.demo_block(seed=0)[1])


@pytest.mark.parametrize("seed", [None, 5])
def test_the_worker_returns_the_split_blocks_output_and_gradients(seed):
    results = run_ranks(2, tp.tensor_parallel_block, *([] if seed is None else [seed]))
    block, x, probe = tp.demo_block(seed or 0)
    x.requires_grad_(True)
    out = block(x)
    (out * probe).sum().backward()
    whole = sum(p.numel() for p in block.parameters())
    split = sum(p.numel() for lin in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj, block.mlp.up)
                for p in lin.parameters()) + block.attn.out_proj.weight.numel() + block.mlp.down.weight.numel()
    for rank, result in enumerate(results):
        torch.testing.assert_close(result["out"], out.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(result["x_grad"], x.grad, rtol=0, atol=1e-5)
        torch.testing.assert_close(result["up_grad"], block.mlp.up.weight.grad[rank * 64:(rank + 1) * 64])
        torch.testing.assert_close(result["q_grad"], block.attn.q_proj.weight.grad[rank * 16:(rank + 1) * 16])
        assert result["parameters"] == whole - split // 2


@pytest.mark.parametrize("seed", [None, 6])
def test_torchs_tensor_parallel_mlp_is_the_mlp_and_ours(seed):
    results = run_ranks(2, tp.dtensor_mlp, *([] if seed is None else [seed]))
    block, x, _ = tp.demo_block(seed or 0)
    expected = block.mlp(x).detach()
    ours = run_ranks(2, lambda rank, ws: TensorParallelMLP(block.mlp, rank, ws)(x).detach())
    for result, by_hand in zip(results, ours, strict=True):
        torch.testing.assert_close(result["out"], expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(result["out"], by_hand, rtol=0, atol=1e-5)
        assert (result["up_local"], result["down_local"], result["kind"]) == ((64, 32), (32, 64), "DTensor")


@pytest.mark.processes
def test_tensor_parallel_block_equals_the_block_forward_and_backward(scale_workers):
    results = scale_workers.run(tensor_parallel_block)
    block, x, probe = demo_block()
    x.requires_grad_(True)
    out = block(x)
    (out * probe).sum().backward()
    k = block.mlp.up.out_features // 2
    for rank, result in enumerate(results):
        assert (result["out"] - out).abs().max() < 1e-5
        assert (result["x_grad"] - x.grad).abs().max() < 1e-5
        assert torch.allclose(result["up_grad"], block.mlp.up.weight.grad[rank * k:(rank + 1) * k], atol=1e-5)
    assert (results[0]["out"] - out).abs().max() < 1e-5
    assert not torch.allclose(results[0]["x_grad"], x.grad * 0.5, atol=1e-5)  # the backward all-reduce ran


@pytest.mark.processes
def test_dtensor_mlp_equals_the_mlp(scale_workers):
    results = scale_workers.run(dtensor_mlp)
    block, x, _ = demo_block()
    with torch.no_grad():
        expected = block.mlp(x)
    for result in results:
        assert (result["out"] - expected).abs().max() < 1e-5
        assert result["up_local"] == (64, 32)


def test_shards_refuse_sizes_the_world_does_not_divide():
    mlp = FeedForward(6, 12)
    assert column_shard(mlp.up, 1, 3).weight.shape == (4, 6)
    assert row_shard(mlp.down, 1, 3).weight.shape == (6, 4)
    with pytest.raises(ValueError, match="out_features=12 cannot be split over world_size=5"):
        column_shard(mlp.up, 0, 5)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_split_mlp_weights_cuts_the_tensors_as_column_and_row_shard_cut_the_layers(rank):
    torch.manual_seed(0)
    up, down = nn.Linear(4, 6), nn.Linear(6, 4)
    got = tp.split_mlp_weights(up.weight, up.bias, down.weight, rank, 3)
    column, row = tp.column_shard(up, rank, 3), tp.row_shard(down, rank, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, (column.weight, column.bias, row.weight), strict=True))


def test_split_mlp_weights_refuses_bad_input_by_name():
    up, bias, down = torch.zeros(6, 4), torch.zeros(6), torch.zeros(4, 6)
    with pytest.raises(ValueError, match="rank is 2"):
        tp.split_mlp_weights(up, bias, down, 2, 2)
    with pytest.raises(ValueError, match="multiple of world_size=4"):
        tp.split_mlp_weights(up, bias, down, 0, 4)
    with pytest.raises(ValueError, match="up_bias is"):
        tp.split_mlp_weights(up, bias[None], down, 0, 2)
