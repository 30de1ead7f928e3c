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
from helpers.model import multihead as mh
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
    # the mask's shape as it was passed, not as reshaped inside (it said (2, 1, 4, 4) for (2, 4, 4))
    with pytest.raises(ValueError, match=r"^mask has shape \(2, 4, 4\), expected \(B=2, N=3, M=3\) to match "
                                         r"the 3 queries and 3 keys \(a size of 1 broadcasts\)$"):
        mha(torch.randn(2, 3, 8), mask=torch.ones(2, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^mask has shape \(3, 3, 3\), expected \(B=2, N=3, M=3\)"):
        mha(torch.randn(2, 3, 8), mask=torch.ones(3, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^mask has shape \(2, 3, 3, 3\), expected \(B=2, H=2, N=3, M=3\)"):
        mha(torch.randn(2, 3, 8), mask=torch.ones(2, 3, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^mask has shape \(3, 4\), expected \(N=3, M=3\)"):
        AttentionHead(8, 4)(torch.randn(2, 3, 8), mask=torch.ones(3, 4, dtype=torch.bool))
    padding = torch.ones(2, 1, 1, 3, dtype=torch.bool)  # (B, 1, 1, M) broadcasts over heads and queries
    assert mha(torch.randn(2, 3, 8), mask=padding).shape == (2, 3, 8)
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


# helpers.model.multihead: SeparateHeadsAttention.last_weights and fuse_heads, the two bodies
# (a @property and a @torch.no_grad() function), read exactly: sizes all differ (B=2, H=3,
# N=4, M=5) so that a stack along the wrong axis shows; biases are set away from 0 so that a bias
# left uncopied shows.

def separate_heads(bias: bool) -> SeparateHeadsAttention:
    torch.manual_seed(0)
    separate = SeparateHeadsAttention(12, 3, bias=bias)
    with torch.no_grad():
        for p in separate.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return separate


def test_last_weights_stacks_each_heads_weights_along_axis_1():
    separate = separate_heads(True)
    assert separate.last_weights is None  # before any forward
    x, context = torch.randn(2, 4, 12), torch.randn(2, 5, 12)
    separate(x, context)
    weights = separate.last_weights
    assert weights.shape == (2, 3, 4, 5)
    for h, head in enumerate(separate.heads):
        assert torch.equal(weights[:, h], head.last_weights)


def test_last_weights_is_none_while_any_head_has_none():
    separate = separate_heads(True)
    separate(torch.randn(2, 4, 12))
    separate.heads[1].last_weights = None
    assert separate.last_weights is None


@pytest.mark.parametrize("bias", [True, False])
def test_fuse_heads_copies_every_weight_and_bias_in_head_order(bias):
    separate = separate_heads(bias)
    fused = fuse_heads(separate)
    assert isinstance(fused, MultiHeadAttention)
    assert (fused.d_model, fused.n_heads, fused.n_kv_heads, fused.head_dim) == (12, 3, 3, 4)
    for name in ("q_proj", "k_proj", "v_proj"):
        for h, head in enumerate(separate.heads):
            rows = slice(4 * h, 4 * h + 4)
            assert torch.equal(getattr(fused, name).weight[rows], getattr(head, name).weight)
            if bias:
                assert torch.equal(getattr(fused, name).bias[rows], getattr(head, name).bias)
            else:
                assert getattr(fused, name).bias is None
    assert torch.equal(fused.out_proj.weight, separate.out_proj.weight)
    assert (fused.out_proj.bias is None) == (not bias)
    if bias:
        assert torch.equal(fused.out_proj.bias, separate.out_proj.bias)
    x = torch.randn(2, 4, 12)
    torch.testing.assert_close(fused(x, causal=True), separate(x, causal=True), atol=1e-5, rtol=1e-5)
    # copies, not the same tensors; still trainable parameters
    assert fused.q_proj.weight.requires_grad and fused.out_proj.weight.requires_grad
    with torch.no_grad():
        separate.heads[0].q_proj.weight.add_(1.0)
        separate.out_proj.weight.add_(1.0)
    assert not torch.equal(fused.q_proj.weight[:4], separate.heads[0].q_proj.weight)
    assert not torch.equal(fused.out_proj.weight, separate.out_proj.weight)


def test_a_zero_length_sequence_is_named_as_the_argument():
    with pytest.raises(ValueError, match=r"x has shape \(1, 0, 8\): a sequence of 0 tokens"):
        MultiHeadAttention(8, 2)(torch.randn(1, 0, 8), causal=True)


def test_the_heads_causal_mask_is_made_on_the_inputs_device():
    torch.manual_seed(0)
    x, head, fused = torch.randn(2, 4, 8), mh.AttentionHead(8, 4), mh.MultiHeadAttention(8, 2)
    expected = head(x, causal=True), fused(x, causal=True)
    with torch.device("meta"):
        got = head(x, causal=True), fused(x, causal=True)
    for a, b in zip(got, expected, strict=True):
        assert a.device == x.device and torch.equal(a, b)


@pytest.mark.parametrize("mask_dims", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_k", [4, 6])
def test_separate_heads_mask_as_the_fused_attention_does(mask_dims, causal, n_k):
    """SeparateHeadsAttention (and so each AttentionHead) against fuse_heads' MultiHeadAttention,
    with a padding mask that decides the answer, alone, with causality, and in cross-attention."""
    torch.manual_seed(0)
    separate = mh.SeparateHeadsAttention(8, 2).double()
    fused = mh.fuse_heads(separate).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    context = None if n_k == 4 else torch.randn(2, n_k, 8, dtype=torch.float64)
    mask = torch.ones(2, 4, n_k, dtype=torch.bool)
    mask[0, :, 0] = False  # the first key of the first sequence is padding
    mask = mask[0] if mask_dims == 2 else mask
    got = separate(x, context, mask=mask, causal=causal)
    torch.testing.assert_close(got, fused(x, context, mask=mask, causal=causal))
    assert not torch.allclose(got, separate(x, context, causal=causal))  # the mask matters
    if causal:
        assert not torch.allclose(got, separate(x, context, mask=mask))  # and so does causality
    assert separate.last_weights.shape == (2, 2, 4, n_k)
    # exactly: the padded key and (when causal) the last key change nothing they must not
    source = x if context is None else context
    for position, rows in ((0, slice(None)), (-1, slice(0, 3) if causal else slice(0, 0))):
        changed = source.clone()
        changed[0, position] += 1.0
        args = (changed, None) if context is None else (x, changed)
        if context is None and position == 0:  # x is also the queries: leave query 0 out
            rows = slice(1, None)
        after = separate(*args, mask=mask, causal=causal)
        if position == 0 or causal:
            assert torch.equal(after[0, rows], got[0, rows])


def test_heads_have_biases_and_see_every_key_unless_told():
    torch.manual_seed(0)
    head, separate = mh.AttentionHead(8, 4), mh.SeparateHeadsAttention(8, 2)
    fused = mh.MultiHeadAttention(8, 2)
    assert all(p.bias is not None for p in (head.q_proj, head.k_proj, head.v_proj))
    assert separate.out_proj.bias is not None and separate.heads[0].k_proj.bias is not None
    assert (head.d_model, head.head_dim) == (8, 4)
    mh.check_features("x", torch.ones(8), 8, torch.float32)  # one token's features, no batch
    plain = mh.AttentionHead(8, 4, bias=False)
    assert all(p.bias is None for p in (plain.q_proj, plain.k_proj, plain.v_proj))
    assert head.last_weights is None and fused.last_weights is None
    assert separate.last_weights is None
    x = torch.randn(1, 4, 8)
    assert torch.equal(head(x), head(x, causal=False))
    assert not torch.allclose(head(x), head(x, causal=True))
    q, k, v = (torch.randn(1, 2, 4, 4) for _ in range(3))
    assert torch.equal(fused.attend(q, k, v), fused.attend(q, k, v, causal=False))
    assert not torch.allclose(fused.attend(q, k, v), fused.attend(q, k, v, causal=True))


def test_a_kv_cache_entry_is_two_bytes_unless_told():
    assert mh.kv_cache_bytes_per_token(2, 3, 4) == 2 * 2 * 3 * 4 * 2
    assert mh.kv_cache_bytes_per_token(2, 3, 4, bytes_per_value=4) == 2 * 2 * 3 * 4 * 4


@pytest.mark.parametrize("call, error, message", [
    (lambda: mh.split_heads([1.0], 2), ValueError, r"^x has shape list, expected \(B, N, H \* D_H\)$"),
    (lambda: mh.split_heads(torch.ones(2, 3), 2), ValueError, r"^x has shape \(2, 3\), expected"),
    (lambda: mh.split_heads(torch.ones(1, 2, 4), 0), ValueError, "^n_heads is 0, expected a positive int$"),
    (lambda: mh.merge_heads([1.0]), ValueError, r"^x has shape list, expected \(B, H, N, D_H\)$"),
    (lambda: mh.merge_heads(torch.ones(2, 3)), ValueError, r"^x has shape \(2, 3\), expected"),
    (lambda: mh.check_head_counts(10, 4, 4), ValueError, "gets d_model / n_heads = 2.5 features, "
     "which must be a whole number$"),
    (lambda: mh.check_head_counts(12, 3, 2), ValueError, "serve the same number of query heads, got 1.5$"),
    (lambda: mh.check_head_counts(12, 3, 0), ValueError, "^n_kv_heads is 0, expected a positive int$"),
    (lambda: mh.kv_cache_bytes_per_token(1, 0, 1), ValueError, "^n_kv_heads is 0"),
    (lambda: mh.kv_cache_bytes_per_token(1, 1, 0), ValueError, "^head_dim is 0"),
    (lambda: mh.kv_cache_bytes_per_token(1, 1, 1, 0), ValueError, "^bytes_per_value is 0"),
    (lambda: mh.MultiHeadAttention(8, 2, dropout=1.0), ValueError,
     r"^dropout is 1.0, expected a number in \[0, 1\)$"),
    (lambda: mh.MultiHeadAttention(8, 2, dropout=1.5), ValueError, "^dropout is 1.5"),
    (lambda: mh.AttentionHead(0, 4), ValueError, "^d_model is 0, expected a positive int$"),
    (lambda: mh.AttentionHead(8, 0), ValueError, "^head_dim is 0, expected a positive int$"),
    (lambda: mh.AttentionHead(8, 4, bias="yes"), TypeError, "^bias is 'yes'"),
    (lambda: mh.AttentionHead(8, 4)([1.0]), TypeError,
     r"^x is a list, expected a torch.Tensor \(B, N, 8\)$"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 0, 8)), ValueError,
     r"^x has shape \(1, 0, 8\): a sequence of 0 tokens, expected at least one token \(N >= 1\)$"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 2, 8), torch.ones(1, 2, 4)), ValueError,
     r"^context has shape \(1, 2, 4\)"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 2, 8), mask=torch.ones(1, 1, 2, 2, dtype=torch.bool)),
     ValueError, r"expected \(N, M\) or \(B, N, M\): a single head has no head axis$"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 2, 8), [1.0]), TypeError,
     r"^context is a list, expected a torch.Tensor \(B, N, 8\)$"),
    (lambda: mh.check_features("x", torch.tensor(1.0), 4, torch.float32), ValueError,
     r"^x has shape \(\), expected \(\.\.\., 4\)"),
    (lambda: mh.check_features("x", [1.0], 4, torch.float32), TypeError,
     r"^x is a list, expected a torch.Tensor \(\.\.\., 4\)$"),
    (lambda: mh.attention_mask([True], False, 2, 2, "cpu"), TypeError,
     r"^mask is list, expected a torch.bool tensor \(True = may attend\)$"),
])
def test_the_attention_modules_name_what_is_wrong(call, error, message):
    with pytest.raises(error, match=message):
        call()
