"""helpers.model.fused: each fused function against the plain definition it must follow
(LayerNorm, causal attention, Block.forward), at non-default settings (eps, biases off, GQA,
cached keys, bfloat16), and which kernel each case is documented to use.


"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.model import fused
from helpers.model.fused import fast_block, fused_causal_attention, fused_layer_norm
from helpers.model.kv_cache import KVCache
from helpers.model.layers import Block, LayerNorm


def reference_attention(q, k, v):
    """softmax(q k^T / sqrt(D_H)) v in float64, query i seeing keys up to M - N + i."""
    q, k, v = (t.double() for t in (q, k, v))
    n, m = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    allowed = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
    return F.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def qkv(n, m, dtype=torch.float32, head_dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, n, head_dim, generator=g).to(dtype),
            torch.randn(2, 3, m, head_dim, generator=g).to(dtype),
            torch.randn(2, 3, m, head_dim, generator=g).to(dtype))


def test_fused_layer_norm_uses_the_norms_weight_bias_and_eps():
    torch.manual_seed(0)
    norm = LayerNorm(6, eps=0.5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(6))
        norm.bias.copy_(torch.randn(6))
    x = torch.randn(2, 3, 6)
    torch.testing.assert_close(fused_layer_norm(norm, x), norm(x))
    # eps = 0.5 matters here: x has variance of order 1
    assert not torch.allclose(fused_layer_norm(norm, x), F.layer_norm(x, (6,), norm.weight, norm.bias))


@pytest.mark.parametrize("n, m", [(5, 5), (1, 6), (2, 6), (3, 7)])
def test_fused_causal_attention_matches_the_definition(n, m):
    q, k, v = qkv(n, m)
    torch.testing.assert_close(fused_causal_attention(q, k, v).double(), reference_attention(q, k, v),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_three_products_on_cpu_in_half_precision_match_the_definition(dtype):
    q, k, v = qkv(6, 6, dtype=dtype, head_dim=8)
    out = fused_causal_attention(q, k, v)
    assert out.dtype == dtype and out.shape == (2, 3, 6, 8)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v), atol=3e-2, rtol=3e-2)


def test_three_products_take_values_in_their_own_dtype():
    q, k, _ = qkv(4, 4, dtype=torch.bfloat16)
    v = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    out = fused._attention_in_three_products(q, k, v)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference_attention(q, k, v), atol=3e-2, rtol=3e-2)


def count_sdpa(monkeypatch) -> list[object]:
    """Record the attn_mask of each scaled_dot_product_attention call."""
    masks: list[object] = []
    original = F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kwargs):
        masks.append(attn_mask if attn_mask is None else attn_mask.clone())
        return original(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(fused.F, "scaled_dot_product_attention", recording)
    return masks


def test_which_kernel_each_case_uses(monkeypatch):
    masks = count_sdpa(monkeypatch)
    fused_causal_attention(*qkv(4, 4, dtype=torch.bfloat16))  # bf16 on a CPU: three products
    assert masks == []
    fused_causal_attention(*qkv(4, 4))  # float32: PyTorch's kernel, is_causal
    assert masks == [None]
    fused_causal_attention(*qkv(1, 5))  # one query sees every key: no mask
    assert masks == [None, None]
    fused_causal_attention(*qkv(2, 5))  # cached keys first: the bottom-right triangle
    assert len(masks) == 3 and torch.equal(masks[2], torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool())
    fused_causal_attention(*qkv(2, 5, dtype=torch.bfloat16))  # with a cache: the kernel even in bf16
    assert len(masks) == 4


def causal_bias_by_hand(n: int) -> torch.Tensor:
    """(n, n) float32: 0 on and below the diagonal, -inf above it."""
    return torch.tensor([[0.0 if j <= i else float("-inf") for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("compiling", [False, True])
def test_the_causal_bias_is_zero_on_and_below_the_diagonal_in_the_asked_dtype(monkeypatch, compiling):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    fused._kept_causal_bias.cache_clear()  # an earlier test may have kept this size already
    # under a meta default device, so that a tensor made without device=... shows
    with torch.device("meta"):
        bias = fused._causal_bias(4, torch.float16, torch.device("cpu"))
    assert bias.dtype == torch.float16 and bias.device.type == "cpu"
    assert torch.equal(bias.float(), causal_bias_by_hand(4))
    on_meta = fused._causal_bias(3, torch.bfloat16, torch.device("meta"))
    assert on_meta.is_meta and on_meta.dtype == torch.bfloat16 and on_meta.shape == (3, 3)


def test_the_causal_bias_is_kept_per_size_unless_compiling(monkeypatch):
    fused._kept_causal_bias.cache_clear()
    bias = fused._causal_bias(4, torch.bfloat16, torch.device("cpu"))
    assert fused._causal_bias(4, torch.bfloat16, torch.device("cpu")) is bias  # made once
    assert fused._causal_bias(3, torch.bfloat16, torch.device("cpu")).shape == (3, 3)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    first = fused._causal_bias(4, torch.bfloat16, torch.device("cpu"))
    assert first is not bias and fused._causal_bias(4, torch.bfloat16, torch.device("cpu")) is not first
    assert torch.equal(first, bias)


@pytest.mark.parametrize("dtype, n_q", [(torch.float32, 4), (torch.float32, 2), (torch.bfloat16, 4)])
def test_attention_makes_its_mask_on_the_inputs_device(dtype, n_q):
    fused._kept_causal_bias.cache_clear()
    q, k, v = qkv(n_q, 4, dtype=dtype)
    with torch.device("meta"):  # a mask made on the default device would be on meta
        out = fused_causal_attention(q, k, v)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out.double(), reference_attention(q, k, v), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("n_q", [5, 2])
def test_attention_reads_the_token_axis_second_from_the_end_whatever_the_leading_axes(n_q):
    # (B * H, N, D_H) with N != D_H: the token axis is -2, not axis 2
    q, k, v = (t.reshape(6, -1, 4) for t in qkv(n_q, 5))
    torch.testing.assert_close(fused_causal_attention(q, k, v).double(), reference_attention(q, k, v),
                               atol=1e-5, rtol=1e-5)


def gqa_block(bias: bool = True) -> Block:
    torch.manual_seed(0)
    block = Block(12, 4, n_kv_heads=2, bias=bias, activation="relu").eval()
    with torch.no_grad():
        for p in block.parameters():  # norms and biases away from 1 and 0
            p.add_(0.3 * torch.randn_like(p))
    return block


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n", [1, 4])
def test_fast_block_equals_the_block(bias, n):
    block = gqa_block(bias)
    x = torch.randn(2, n, 12)
    torch.testing.assert_close(fast_block(block, x), block(x), atol=1e-5, rtol=1e-5)


def test_fast_block_reads_and_writes_the_kv_store():
    block = gqa_block()
    x = torch.randn(2, 6, 12)
    full = block(x)
    plain, fast = KVCache(1, 2, 2, 6, 3), KVCache(1, 2, 2, 6, 3)
    rows = [fast_block(block, x[:, :4], kv_store=fast.store_hook(0))]
    block(x[:, :4], kv_store=plain.store_hook(0))
    fast.length = plain.length = 4
    for t in (4, 5):
        rows.append(fast_block(block, x[:, t:t + 1], kv_store=fast.store_hook(0)))
        block(x[:, t:t + 1], kv_store=plain.store_hook(0))
        fast.length = plain.length = t + 1
    torch.testing.assert_close(torch.cat(rows, dim=1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.keys, plain.keys, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fast.values, plain.values, atol=1e-6, rtol=1e-6)


def test_a_single_token_projects_q_k_v_apart_and_more_tokens_in_one_product():
    block = gqa_block()
    calls = []
    for proj in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj):
        proj.register_forward_hook(lambda module, args, out: calls.append(out.shape[-1]))
    fast_block(block, torch.randn(2, 1, 12))
    assert calls == [12, 6, 6]
    calls.clear()
    fast_block(block, torch.randn(2, 3, 12))
    assert calls == []


def test_fast_block_applies_dropout_in_training():
    torch.manual_seed(0)
    block = Block(8, 2, dropout=0.5)
    x = torch.randn(1, 4, 8)
    block.train()
    assert not torch.equal(fast_block(block, x), fast_block(block, x))
    block.eval()
    assert torch.equal(fast_block(block, x), fast_block(block, x))


def test_fast_block_refuses_a_post_ln_block_with_the_whole_message():
    with pytest.raises(ValueError, match=r"^fast_block computes a Pre-LN block \(GPT-2's order\); this "
                                         r"block is Post-LN \(pre_norm=False\): call block\(x\) instead$"):
        fast_block(Block(8, 2, pre_norm=False), torch.randn(1, 3, 8))
