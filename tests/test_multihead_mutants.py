"""helpers.model.multihead: SeparateHeadsAttention.last_weights and fuse_heads, the two bodies
that the first mutation runs skipped (a @property and a @torch.no_grad() function).

Written for the mutation run (benchmarks/mutation.py, issue 30): sizes all differ (B=2, H=3,
N=4, M=5) so that a stack along the wrong axis shows; biases are set away from 0 so that a bias
left uncopied shows.
"""

from __future__ import annotations

import pytest
import torch

from helpers.model.multihead import MultiHeadAttention, SeparateHeadsAttention, fuse_heads


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
