"""helpers.model.modern: the gaps its mutation run found (benchmarks/MUTATION.md).

Grouped by issue 30's classes: ALiBi attention against PyTorch's attention with the same bias
(hand-written against the reference), dtypes and devices kept on every path, configuration
defaults asserted (SwiGLU's rounding, a block's start), edge shapes and every error message
read in full.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from shared_tools import full

from helpers.model.kv_cache import KVCache
from helpers.model.modern import (
    ModernBlock,
    ModernConfig,
    ModernGPT,
    RMSNorm,
    RopeTable,
    alibi_attention,
    alibi_bias,
    alibi_slopes,
    llama_hidden_size,
    rms_norm,
    rope_angles,
    rope_rotate_complex,
    rope_rotate_half,
)

SMALL = dict(vocab_size=40, context_length=32, n_layers=1, n_heads=4, n_kv_heads=2, d_model=32)


def alibi_reference(q, k, v):
    """PyTorch's attention with ALiBi's bias and the causal mask as one additive float mask."""
    n_heads, n_tokens = q.shape[1], q.shape[2]
    visible = torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()
    bias = alibi_bias(n_heads, n_tokens).to(q.dtype).masked_fill(~visible, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


# --- hand-written against the reference: ALiBi attention -------------------------------------

def test_alibi_attention_equals_torch_attention_with_the_bias():
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 5, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 5, 6, generator=generator, dtype=torch.float64)  # D_V != D_H != N != H
    torch.testing.assert_close(alibi_attention(q, k, v), alibi_reference(q, k, v), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_alibi_attention_keeps_a_low_precision_dtype(dtype):
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=generator).to(dtype) for _ in range(3))
    out = alibi_attention(q, k, v)
    assert out.dtype == dtype
    expected = alibi_reference(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), expected, atol=3e-2, rtol=0)


def test_alibi_attention_on_the_meta_device_builds_its_mask_there():
    q = torch.zeros(2, 3, 5, 4, device="meta")  # shapes only: the mask must follow q's device
    out = alibi_attention(q, q, q)
    assert out.device.type == "meta" and out.shape == (2, 3, 5, 4)


@pytest.mark.parametrize("shapes", [
    ((2, 5, 4), (2, 5, 4), (2, 5, 4)),              # 3-D: no head axis
    ((1, 2, 5, 4), (1, 2, 6, 4), (1, 2, 5, 4)),     # more keys than queries
    ((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 6, 4)),     # v with another number of tokens
])
def test_alibi_attention_refuses_mismatched_shapes_with_the_whole_message(shapes):
    q, k, v = (torch.zeros(shape) for shape in shapes)
    message = (f"q, k, v have shapes {shapes[0]}, {shapes[1]}, {shapes[2]}, expected q and k "
               "(B, H, N, D_H) alike and v (B, H, N, D_V): the bias buffer is (H, N, N), for as "
               "many keys as queries")
    with pytest.raises(ValueError, match=full(message)):
        alibi_attention(q, k, v)


@pytest.mark.parametrize("position, name", [(0, "q"), (1, "k"), (2, "v")])
def test_alibi_attention_names_the_argument_that_is_not_a_tensor(position, name):
    args = [torch.zeros(1, 2, 3, 4) for _ in range(3)]
    args[position] = [[0.0]]
    with pytest.raises(TypeError, match=full(f"{name} is a list, expected a tensor (B, H, N, D_H)")):
        alibi_attention(*args)


# --- configuration: defaults asserted ---------------------------------------------------------

def test_llama_hidden_size_rounds_up_to_32_by_default():
    assert llama_hidden_size(100) == 288  # int(800 / 3) = 266 -> 9 x 32
    assert llama_hidden_size(100, 256) == 512
    assert llama_hidden_size(4096, 256) == 11008  # Llama 7B


def test_a_block_starts_at_position_0_by_default():
    torch.manual_seed(2)
    config = ModernConfig(**SMALL)
    block, table = ModernBlock(config), RopeTable.build(config.head_dim, 32)
    x = torch.randn(1, 6, 32)
    assert torch.equal(block(x, table), block(x, table, start=0))
    assert not torch.equal(block(x, table), block(x, table, start=1))


def test_to_empty_without_recursion_leaves_the_submodules_weights_alone():
    torch.manual_seed(3)
    model = ModernGPT(ModernConfig(**SMALL))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.to_empty(device="cpu", recurse=False)  # the model itself holds no parameter
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


# --- edge inputs and the full messages --------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: alibi_slopes(0), "n_heads is 0, expected a positive int"),
    (lambda: alibi_bias(4, 0), "n_tokens is 0, expected a positive int"),
    (lambda: llama_hidden_size(0), "d_model is 0, expected a positive int"),
    (lambda: llama_hidden_size(64, 0), "multiple_of is 0, expected a positive int"),
    (lambda: RMSNorm(16)(torch.zeros(2, 12)),
     "x has shape (2, 12), expected (..., 16): the last dimension holds each token's d_model = 16"),
])
def test_the_argument_is_named_first(make, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        make()


@pytest.mark.parametrize("ids, got", [
    ([[1, 2]], "list"),
    (torch.zeros(5, dtype=torch.long), "(5,)"),
    (torch.zeros(1, 0, dtype=torch.long), "(1, 0)"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "(1, 2, 3)"),
])
def test_the_model_refuses_ids_that_are_not_b_by_n(ids, got):
    model = ModernGPT(ModernConfig(**SMALL))
    with pytest.raises(ValueError, match=full(f"token_ids has shape {got}, expected (B, N) with N >= 1")):
        model(ids)


def test_too_many_ids_name_the_last_position_allowed():
    model = ModernGPT(ModernConfig(**SMALL))
    message = "token_ids reach position 32, expected at most context_length - 1 = 31"
    with pytest.raises(ValueError, match=full(message)):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_with_identity_values_the_output_is_the_biased_softmax_over_past_keys():
    q = torch.eye(4).reshape(1, 1, 4, 4)
    weights = alibi_attention(q, q, torch.eye(4).reshape(1, 1, 4, 4))[0, 0]
    scores = torch.eye(4) / math.sqrt(4) + alibi_bias(1, 4)[0]
    expected = scores.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected)


# --- RoPE's table: rows, positions and their edges ---------------------------------------------

def test_rows_default_to_the_first_positions():
    table = RopeTable.build(8, 10, 500.0)
    cos, sin = table.rows(torch.zeros(4, 8), None)
    assert torch.equal(cos, table.cos[:4]) and torch.equal(sin, table.sin[:4])


def test_both_rope_forms_rotate_by_the_given_positions_not_by_the_order():
    generator = torch.Generator().manual_seed(4)
    table, x = RopeTable.build(8, 12), torch.randn(2, 3, 8, generator=generator)
    positions = torch.tensor([9, 2, 11])  # scattered, reaching the table's last row
    for rotate in (rope_rotate_complex, rope_rotate_half):
        out = rotate(x, table, positions=positions)
        for i, m in enumerate(positions.tolist()):
            torch.testing.assert_close(out[:, i], rotate(x[:, i:i + 1], table, start=m)[:, 0],
                                       atol=1e-6, rtol=0)
        assert not torch.allclose(out, rotate(x, table), atol=1e-3)


def test_rope_under_a_meta_default_device_still_indexes_the_tables_device():
    generator = torch.Generator().manual_seed(5)
    table, x = RopeTable.build(8, 12), torch.randn(2, 5, 8, generator=generator)
    expected = rope_rotate_half(x, table, start=3)
    with torch.device("meta"):  # a factory call without a device would land on meta
        out = rope_rotate_half(x, table, start=3)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("x, got", [(torch.zeros(8), "(8,)"), ([0.0] * 8, "list")])
def test_rows_refuse_x_without_a_token_axis_naming_it(x, got):
    message = (f"x has shape {got}, expected (..., N, 8): the table was built for head_dim = 8")
    with pytest.raises(ValueError, match=full(message)):
        RopeTable.build(8, 10).rows(x, None)


@pytest.mark.parametrize("positions, got", [
    ([0, 1], "list"), (torch.tensor([0.0, 1.0]), "(2,) torch.float32"),
])
def test_rows_refuse_positions_that_are_not_an_integer_tensor(positions, got):
    message = (f"positions is {got}, expected an integer tensor of shape (2,): one position for "
               "each of x's 2 tokens")
    with pytest.raises(ValueError, match=full(message)):
        RopeTable.build(8, 10).rows(torch.zeros(2, 8), positions)


def test_the_first_position_past_the_table_is_refused():
    table = RopeTable.build(8, 10)
    table.rows(torch.zeros(1, 8), torch.tensor([9]))  # the last row: fine
    message = ("positions reach 10 (lowest 10), expected 0 <= position < 10, the rows of the RoPE "
               "table: build it with more n_positions")
    with pytest.raises(ValueError, match=full(message)):
        table.rows(torch.zeros(1, 8), torch.tensor([10]))
    with pytest.raises(ValueError, match=full("start is -1, expected an int >= 0")):
        table.rows(torch.zeros(1, 8), None, start=-1)


# --- RMSNorm: its eps, default and given ---------------------------------------------------------

def test_rmsnorm_uses_its_own_eps_and_defaults_to_llamas():
    assert RMSNorm(4).eps == 1e-6 and ModernConfig().norm_eps == 1e-6
    x = torch.tensor([[0.1, -0.2, 0.3, 0.0]])
    norm = RMSNorm(4, eps=0.5)
    torch.testing.assert_close(norm(x), rms_norm(x, norm.weight, 0.5), atol=0, rtol=0)
    assert not torch.allclose(norm(x), rms_norm(x, norm.weight), atol=1e-3)


@pytest.mark.parametrize("make, message", [
    (lambda: rms_norm(torch.ones(3), eps=0.0),
     "eps is 0.0, expected a finite number > 0 (it keeps the division away from 0)"),
    (lambda: RMSNorm(0), "d_model is 0, expected a positive int"),
    (lambda: ModernConfig(vocab_size=0), "vocab_size is 0, expected a positive int"),
    (lambda: ModernConfig(mlp_hidden=0), "mlp_hidden is 0, expected a positive int"),
    (lambda: ModernConfig(rope_base=math.inf), "rope_base is inf, expected a finite number > 1"),
])
def test_sizes_and_numbers_are_named_in_full(make, message):
    with pytest.raises(ValueError, match=full(message)):
        make()


def test_a_rope_base_between_1_and_2_is_accepted():
    model = ModernGPT(ModernConfig(**SMALL, rope_base=1.5))
    assert torch.equal(model.rope.cos, RopeTable.build(8, 32, 1.5).cos)


# --- the model's initialisation ------------------------------------------------------------------

def test_matrices_start_at_std_0_02_and_norm_gains_at_one():
    torch.manual_seed(6)
    model = ModernGPT(ModernConfig(**dict(SMALL, d_model=64, vocab_size=400)))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert 0.015 < p.std().item() < 0.025, name
        else:
            assert torch.equal(p, torch.ones_like(p)), name


# --- RoPE's angles: the base, the dtype, the head size ---------------------------------------------

def test_rope_angles_are_the_float64_formula_with_llamas_base_by_default():
    angles = rope_angles(8, 5000)
    assert angles.dtype == torch.float64 and torch.equal(angles, rope_angles(8, 5000, 10000.0))
    for m, i in ((4999, 1), (4999, 3), (1234, 2)):
        assert angles[m, i].item() == pytest.approx(m * 10000.0 ** (-2 * i / 8), rel=1e-14)


def test_a_rope_base_just_above_1_is_accepted():
    assert rope_angles(4, 3, 1.5)[2, 1].item() == pytest.approx(2 * 1.5 ** -0.5, rel=1e-14)


@pytest.mark.parametrize("make, error, message", [
    (lambda: RopeTable.build(7, 10), ValueError, "head_dim is 7, expected an even number: RoPE "
     "rotates pairs of features, so every feature needs a partner"),
    (lambda: RopeTable.build(0, 10), ValueError, "head_dim is 0, expected a positive int"),
    (lambda: rope_angles(8, 0), ValueError, "n_positions is 0, expected a positive int"),
    (lambda: rope_angles(8, 4, math.inf), ValueError, "base is inf, expected a finite number > 1 "
     "(1 gives every position the same angle; Llama uses 10000)"),
    (lambda: ModernConfig(norm_eps=0.0), ValueError, "norm_eps is 0.0, expected a finite number > 0"),
    (lambda: ModernConfig(tie_weights=1), TypeError, "tie_weights is 1"),
])
def test_rope_and_config_arguments_are_named_in_full(make, error, message):
    with pytest.raises(error, match="^" + re.escape(message)):
        make()


# --- the @property and @torch.no_grad() bodies (mutated since the script rewrites decorators) ---

def test_rope_table_sizes_and_complex_form():
    table = RopeTable.build(6, 7)
    assert table.n_positions == 7 and table.head_dim == 6
    assert isinstance(table.n_positions, int) and isinstance(table.head_dim, int)
    z = table.complex
    assert z.shape == (7, 3) and z.is_complex()
    assert torch.equal(z.real, table.cos) and torch.equal(z.imag, table.sin)


def test_config_head_dim_is_an_int_and_hidden_is_llamas_unless_given():
    config = ModernConfig(**SMALL)
    assert config.head_dim == 8 and isinstance(config.head_dim, int)
    assert config.hidden == llama_hidden_size(32) == 96
    assert ModernConfig(**SMALL, mlp_hidden=40).hidden == 40
    assert ModernConfig(**{**SMALL, "d_model": 24, "n_heads": 2, "n_kv_heads": 1}).head_dim == 12


def test_forward_cached_moves_the_cache_on_by_the_tokens_fed():
    torch.manual_seed(0)
    model = ModernGPT(ModernConfig(**{**SMALL, "context_length": 6})).eval()
    ids = torch.randint(0, 40, (2, 6))
    cache = KVCache.for_model(model, 2)
    first = model.forward_cached(ids[:, :3], cache)
    assert first.shape == (2, 3, 40) and cache.length == 3
    assert not first.requires_grad  # generation records no graph
    second = model.forward_cached(ids[:, 3:], cache)  # exactly the context: accepted
    assert cache.length == 6
    torch.testing.assert_close(torch.cat([first, second], dim=1), model(ids), atol=1e-5, rtol=1e-5)
    whole = KVCache.for_model(model, 2)
    model.forward_cached(ids, whole)  # a full context into an empty cache
    assert whole.length == 6


def test_forward_cached_refuses_a_cache_of_another_batch_or_no_room():
    torch.manual_seed(0)
    model = ModernGPT(ModernConfig(**{**SMALL, "context_length": 6})).eval()
    cache = KVCache.for_model(model, 2)
    with pytest.raises(ValueError, match=r"^cache has batch size 2 .*expected 3 for this model"):
        model.forward_cached(torch.zeros(3, 2, dtype=torch.long), cache)
    model.forward_cached(torch.zeros(2, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=full("token_ids reach position 6, expected at most "
                                              "context_length - 1 = 5")):
        model.forward_cached(torch.zeros(2, 3, dtype=torch.long), cache)
    assert cache.length == 4
    with pytest.raises(ValueError, match=full("token_ids has shape (2,), expected (B, N) with N >= 1")):
        model.forward_cached(torch.zeros(2, dtype=torch.long), cache)
