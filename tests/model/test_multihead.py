"""Multi-head attention in helpers.model.multihead: both styles agree with each other and with PyTorch's own
nn.MultiheadAttention, GQA is multi-head attention with K/V shared in groups, every head is causal,
and bad arguments are named in the error."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from helpers.lab.exercises import ExerciseFailed, get
from helpers.model.attention import causal_mask
from helpers.model.multihead import (
    AttentionHead,
    MultiHeadAttention,
    SeparateHeadsAttention,
    fuse_heads,
    kv_cache_bytes_per_token,
    merge_heads,
    split_heads,
)


def torch_reference(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """PyTorch's multi-head attention with the same weights as `mha` (which must have K/V for every head)."""
    ref = nn.MultiheadAttention(mha.d_model, mha.n_heads, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        ref.out_proj.load_state_dict(mha.out_proj.state_dict())
    return ref


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), n_tokens=st.integers(1, 6), n_heads=st.integers(1, 4),
       head_dim=st.integers(1, 5), causal=st.booleans(), seed=st.integers(0, 10_000))
def test_fused_module_equals_separate_heads(batch, n_tokens, n_heads, head_dim, causal, seed):
    torch.manual_seed(seed)
    d_model = n_heads * head_dim
    separate = SeparateHeadsAttention(d_model, n_heads)
    fused = fuse_heads(separate)
    x = torch.randn(batch, n_tokens, d_model)
    torch.testing.assert_close(fused(x, causal=causal), separate(x, causal=causal), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused.last_weights, separate.last_weights, atol=1e-6, rtol=1e-5)


def test_fused_module_equals_separate_heads_in_cross_attention_without_bias():
    torch.manual_seed(0)
    separate = SeparateHeadsAttention(12, 3, bias=False)
    fused = fuse_heads(separate)
    assert fused.q_proj.bias is None
    x, context = torch.randn(2, 4, 12), torch.randn(2, 9, 12)
    torch.testing.assert_close(fused(x, context=context), separate(x, context=context), atol=1e-6, rtol=1e-5)
    assert fused.last_weights.shape == (2, 3, 4, 9)


@pytest.mark.parametrize("causal", [False, True])
def test_equal_kv_heads_is_pytorchs_multi_head_attention(causal):
    torch.manual_seed(1)
    mha = MultiHeadAttention(16, 4, n_kv_heads=4)
    x = torch.randn(3, 7, 16)
    ref = torch_reference(mha)
    expected, weights = ref(x, x, x, attn_mask=~causal_mask(7) if causal else None,
                            need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(mha(x, causal=causal), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mha.last_weights, weights, atol=1e-6, rtol=1e-5)


def test_cross_attention_is_pytorchs_with_keys_and_values_from_the_context():
    torch.manual_seed(2)
    mha = MultiHeadAttention(16, 2)
    x, context = torch.randn(2, 3, 16), torch.randn(2, 8, 16)
    expected, _ = torch_reference(mha)(x, context, context)
    torch.testing.assert_close(mha(x, context=context), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(8, 2), (8, 1), (6, 3), (4, 4)])
def test_gqa_is_mha_whose_heads_share_keys_and_values_within_a_group(n_heads, n_kv_heads):
    torch.manual_seed(3)
    gqa = MultiHeadAttention(n_heads * 4, n_heads, n_kv_heads=n_kv_heads)
    mha = MultiHeadAttention(n_heads * 4, n_heads)
    group = n_heads // n_kv_heads
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            small, big = getattr(gqa, name), getattr(mha, name)
            for h in range(n_heads):  # query head h reads key/value head h // group
                rows, kv_rows = slice(4 * h, 4 * h + 4), slice(4 * (h // group), 4 * (h // group) + 4)
                big.weight[rows] = small.weight[kv_rows]
                big.bias[rows] = small.bias[kv_rows]
    x = torch.randn(2, 5, n_heads * 4)
    torch.testing.assert_close(gqa(x, causal=True), mha(x, causal=True), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_every_head_is_causal(n_kv_heads):
    torch.manual_seed(4)
    mha = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads)
    x = torch.randn(2, 6, 16)
    out = mha(x, causal=True)
    assert (mha.last_weights[..., ~causal_mask(6)] == 0).all()
    assert torch.allclose(mha.last_weights.sum(-1), torch.ones(2, 4, 6))
    changed = x.clone()
    changed[:, 3:] += torch.randn(2, 3, 16)
    assert torch.equal(mha(changed, causal=True)[:, :3], out[:, :3])
    assert not torch.allclose(mha(changed, causal=True)[:, 3:], out[:, 3:])


def test_separate_heads_are_causal_too():
    torch.manual_seed(5)
    separate = SeparateHeadsAttention(12, 3)
    x = torch.randn(1, 5, 12)
    separate(x, causal=True)
    assert (separate.last_weights[..., ~causal_mask(5)] == 0).all()


def test_attending_new_queries_to_cached_keys_reproduces_the_full_pass():
    """What a KV cache relies on: the last queries against all keys give the last rows."""
    torch.manual_seed(6)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2)
    x = torch.randn(2, 7, 16)
    full = mha(x, causal=True)
    k, v = mha.project_keys_values(x)
    q_last = split_heads(mha.q_proj(x[:, 5:]), 4)
    torch.testing.assert_close(mha.attend(q_last, k, v, causal=True), full[:, 5:], atol=1e-6, rtol=1e-5)


def test_user_masks_of_two_three_and_four_dims_hide_the_same_keys():
    torch.manual_seed(7)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    keep = torch.tensor([True, True, False, True])
    outputs = [mha(x, mask=keep.expand(4, 4)),
               mha(x, mask=keep.expand(2, 4, 4)),
               mha(x, mask=keep.view(1, 1, 1, 4))]
    assert (mha.last_weights[..., 2] == 0).all()
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0])


def test_dropout_only_in_training():
    torch.manual_seed(8)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(1, 4, 8)
    assert not torch.equal(mha(x), mha(x))
    mha.eval()
    assert torch.equal(mha(x), mha(x))


def test_split_heads_gives_each_head_its_own_slice_and_merge_undoes_it():
    x = torch.arange(2 * 3 * 12.0).view(2, 3, 12)
    heads = split_heads(x, 4)
    assert heads.shape == (2, 4, 3, 3)
    for h in range(4):
        assert torch.equal(heads[:, h], x[..., 3 * h:3 * h + 3])
    assert torch.equal(merge_heads(heads), x)


def test_kv_cache_bytes_match_what_project_keys_values_stores():
    mha = MultiHeadAttention(32, 8, n_kv_heads=2).half()
    n_layers, n_tokens = 3, 5
    k, v = mha.project_keys_values(torch.randn(1, n_tokens, 32).half())
    stored = n_layers * (k.numel() + v.numel()) * k.element_size()
    assert kv_cache_bytes_per_token(n_layers, 2, 4, bytes_per_value=2) * n_tokens == stored


@pytest.mark.parametrize(("args", "named"), [
    ((10, 3), ["d_model=10", "n_heads=3"]),
    ((12, 6, 4), ["n_heads=6", "n_kv_heads=4"]),
    ((12, 0), ["n_heads", "0"]),
    ((12, 4, 8), ["n_heads=4", "n_kv_heads=8"]),
])
def test_head_counts_that_do_not_divide_are_named(args, named):
    with pytest.raises(ValueError) as error:
        MultiHeadAttention(*args)
    for text in named:
        assert text in str(error.value)


def test_bad_inputs_name_the_argument_and_shape():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"x has shape \(4, 8\), expected \(B, N, 8\)"):
        mha(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"context has shape \(1, 3, 6\)"):
        mha(torch.randn(1, 2, 8), context=torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match="batch sizes must match"):
        mha(torch.randn(1, 2, 8), context=torch.randn(2, 3, 8))
    with pytest.raises(TypeError, match="mask is torch.float32"):
        mha(torch.randn(1, 2, 8), mask=torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"mask has shape \(2,\)"):
        mha(torch.randn(1, 2, 8), mask=torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_heads is 5"):
        split_heads(torch.randn(1, 2, 8), 5)
    with pytest.raises(ValueError, match=r"expected \(N, M\) or \(B, N, M\)"):
        AttentionHead(8, 4)(torch.randn(1, 2, 8), mask=torch.ones(1, 1, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_layers is 0"):
        kv_cache_bytes_per_token(0, 1, 1)


def test_exercise_checkers_accept_the_solutions_and_explain_the_usual_mistakes():
    assert get("multihead_attention.split_heads").checker(split_heads)
    assert get("multihead_attention.merge_heads").checker(merge_heads)
    assert get("multihead_attention.kv_cache_bytes_per_token").checker(kv_cache_bytes_per_token)

    def split_without_transpose(x, n_heads):
        b, n, d = x.shape
        return x.reshape(b, n_heads, n, d // n_heads)

    def merge_without_transpose(h):
        b, n_heads, n, d = h.shape
        return h.reshape(b, n, n_heads * d)

    with pytest.raises(ExerciseFailed, match="wrong places"):
        get("multihead_attention.split_heads").checker(split_without_transpose)
    with pytest.raises(ExerciseFailed, match="interleaves tokens"):
        get("multihead_attention.merge_heads").checker(merge_without_transpose)
    with pytest.raises(ExerciseFailed, match="both K and V"):
        get("multihead_attention.kv_cache_bytes_per_token").checker(lambda n, h, d, b: n * h * d * b)
    with pytest.raises(ExerciseFailed, match="not bytes"):
        get("multihead_attention.kv_cache_bytes_per_token").checker(lambda n, h, d, b: 2 * n * h * d)
