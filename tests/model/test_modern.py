"""The modern decoder (helpers/model/modern.py, notebook 9): RoPE, ALiBi, RMSNorm, the model, its cache,
bad input, and equality with Hugging Face's Llama (transformers is a test-only dependency)."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from shared_tools import DTYPES, changed_at, full, small_gpt

from helpers.model import llama as llama_loader
from helpers.model import modern
from helpers.model.kv_cache import KVCache
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.llama import from_llama_state_dict, llama_key_map
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

SMALL = dict(vocab_size=40, context_length=32, n_layers=2, n_heads=4, n_kv_heads=2, d_model=32)


# --- RoPE -----------------------------------------------------------------------------------

def test_rope_complex_and_rotate_half_forms_are_equal():
    torch.manual_seed(0)
    table = RopeTable.build(16, 64)
    x = torch.randn(2, 3, 20, 16)
    for start in (0, 7, 44):
        a = rope_rotate_complex(x, table, start=start)
        b = rope_rotate_half(x, table, start=start)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(rope_rotate_half(x, table, start=1), x, atol=1e-3)


def test_rope_one_pair_is_a_rotation_by_position_times_theta():
    table = RopeTable.build(2, 10)  # one pair, theta_0 = 1
    x = torch.tensor([[1.0, 0.0]]).expand(10, 2)
    out = rope_rotate_half(x, table)
    m = torch.arange(10, dtype=torch.float32)
    torch.testing.assert_close(out, torch.stack([m.cos(), m.sin()], dim=1))


def test_rope_keeps_lengths_and_score_depends_only_on_the_offset():
    torch.manual_seed(1)
    table = RopeTable.build(8, 200)
    q, k = torch.randn(8), torch.randn(8)

    def score(m: int, n: int) -> float:
        qm = rope_rotate_half(q[None], table, positions=torch.tensor([m]))[0]
        kn = rope_rotate_half(k[None], table, positions=torch.tensor([n]))[0]
        return float(qm @ kn)

    for offset in (0, 1, 5, 30):
        scores = [score(m, m - offset) for m in range(offset, offset + 150, 13)]
        assert max(scores) - min(scores) < 1e-4, (offset, scores)
    assert abs(score(10, 9) - score(10, 0)) > 1e-3  # and it does depend on the offset
    rotated = rope_rotate_half(q.expand(50, 8), table)
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm().expand(50))


def test_rope_table_matches_the_formula():
    table = RopeTable.build(6, 5, base=100.0)
    theta = 100.0 ** (-torch.tensor([0.0, 2.0, 4.0]) / 6)
    torch.testing.assert_close(table.cos[3], (3 * theta).cos())
    torch.testing.assert_close(table.complex[4], torch.polar(torch.ones(3), 4 * theta))


# --- ALiBi ----------------------------------------------------------------------------------

def test_alibi_slopes_power_of_two_are_geometric():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(4)]))


def test_alibi_slopes_other_head_counts_use_the_papers_interpolation():
    slopes = alibi_slopes(12)
    expected = [2.0 ** -(h + 1) for h in range(8)] + [2.0 ** (-0.5 * (h + 1)) for h in (0, 2, 4, 6)]
    torch.testing.assert_close(slopes, torch.tensor(expected))
    assert len(alibi_slopes(6)) == 6 and len(set(alibi_slopes(6).tolist())) == 6


def test_alibi_bias_buffer_shape_and_values():
    bias = alibi_bias(4, 5)
    assert bias.shape == (4, 5, 5)
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                expected = -float(slopes[h]) * (i - j) if j <= i else 0.0
                assert math.isclose(float(bias[h, i, j]), expected, abs_tol=1e-7)


def test_alibi_attention_is_causal_and_prefers_near_keys():
    torch.manual_seed(2)
    q = torch.zeros(1, 2, 6, 4)  # equal scores: only the bias decides
    k, v = torch.randn(1, 2, 6, 4), torch.eye(6)[None, None].expand(1, 2, 6, 6)
    weights = modern.alibi_attention(q, k, v)  # v = identity: the output is the weights
    assert torch.all(weights.triu(1) == 0)
    assert torch.all(weights[0, :, 5, 1:] > weights[0, :, 5, :-1])


# --- RMSNorm --------------------------------------------------------------------------------

def test_rms_norm_by_hand_matches_torch():
    torch.manual_seed(3)
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = torch.randn(3, 5, 16) * 4 + 1
    reference = torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        reference.weight.copy_(norm.weight)
    torch.testing.assert_close(norm(x), reference(x), atol=1e-6, rtol=1e-5)
    plain = modern.rms_norm(x)
    torch.testing.assert_close(plain.pow(2).mean(-1), torch.ones(3, 5), atol=1e-4, rtol=0)


# --- SwiGLU width ---------------------------------------------------------------------------

def test_llama_hidden_size_rounding():
    assert llama_hidden_size(4096, multiple_of=256) == 11008  # Llama 7B
    assert llama_hidden_size(96, multiple_of=1) == 256
    assert llama_hidden_size(100, multiple_of=32) % 32 == 0


# --- the model and its cache ----------------------------------------------------------------

@pytest.mark.parametrize("tie", [False, True])
def test_modern_cache_equals_full_recomputation(tie):
    torch.manual_seed(4)
    model = ModernGPT(ModernConfig(**SMALL, tie_weights=tie)).eval()
    ids = torch.randint(0, 40, (2, 20))
    full = model(ids)
    one_by_one = modern.modern_generate_logits(model, ids)
    torch.testing.assert_close(one_by_one, full, atol=1e-5, rtol=1e-5)
    cache = KVCache.for_model(model, 2)  # a prompt of 12, then 8 more
    chunks = torch.cat([model.forward_cached(ids[:, :12], cache),
                        model.forward_cached(ids[:, 12:], cache)], dim=1)
    torch.testing.assert_close(chunks, full, atol=1e-5, rtol=1e-5)
    assert (model.lm_head.weight is model.embed.weight) == tie


def test_modern_model_is_causal_and_has_no_biases():
    torch.manual_seed(5)
    model = ModernGPT(ModernConfig(**SMALL)).eval()
    ids = torch.randint(0, 40, (1, 10))
    changed = ids.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % 40
    torch.testing.assert_close(model(ids)[:, :7], model(changed)[:, :7])
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())


def test_gqa_cache_is_smaller_by_heads_over_kv_heads():
    config = ModernConfig(**SMALL)
    model = ModernGPT(config)
    gqa = KVCache.for_model(model, 1)
    full = KVCache(config.n_layers, 1, config.n_heads, config.context_length, config.head_dim)
    assert full.nbytes() == gqa.nbytes() * config.n_heads // config.n_kv_heads


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, words", [
    (lambda: RopeTable.build(7, 10), ValueError, ["head_dim", "7", "even"]),
    (lambda: rope_rotate_half(torch.zeros(12, 8), RopeTable.build(8, 10)), ValueError,
     ["positions", "11", "< 10"]),
    (lambda: rope_rotate_complex(torch.zeros(3, 8), RopeTable.build(8, 10), start=9), ValueError,
     ["positions", "11", "< 10"]),
    (lambda: rope_rotate_half(torch.zeros(3, 6), RopeTable.build(8, 10)), ValueError,
     ["x", "(3, 6)", "8"]),
    (lambda: alibi_slopes(0), ValueError, ["n_heads", "0", "positive"]),
    (lambda: alibi_slopes(2.5), TypeError, ["n_heads", "2.5", "int"]),
    (lambda: RMSNorm(16)(torch.zeros(2, 12)), ValueError, ["x", "(2, 12)", "16"]),
    (lambda: ModernConfig(n_heads=6, n_kv_heads=4, d_model=48), ValueError,
     ["n_heads=6", "n_kv_heads=4", "divisible"]),
    (lambda: ModernConfig(n_heads=4, n_kv_heads=2, d_model=20), ValueError, ["head_dim", "5", "even"]),
    (lambda: ModernGPT(ModernConfig(**SMALL))(torch.zeros(1, 33, dtype=torch.long)), ValueError,
     ["token_ids", "32", "context_length"]),
])
def test_bad_input_names_the_argument(make, error, words):
    with pytest.raises(error) as info:
        make()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_loader_names_a_missing_or_misshapen_weight():
    config = ModernConfig(**SMALL)
    state = {theirs: p.detach() for ours, theirs in llama_loader.llama_key_map(config).items()
             for name, p in ModernGPT(config).named_parameters() if name == ours}
    from_llama_state_dict(state, config)  # complete: loads
    broken = dict(state)
    del broken["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        from_llama_state_dict(broken, config)
    broken = dict(state, **{"model.norm.weight": torch.ones(31)})
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(31,\).*\(32,\)"):
        from_llama_state_dict(broken, config)


# --- equal to Hugging Face's Llama ----------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers", reason="transformers is a test-only "
                                       "dependency: pip install -e '.[test]'")
    torch.manual_seed(6)
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
        rms_norm_eps=1e-6, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF initialises RMSNorm gains to ones: make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return transformers, model


def test_modern_model_gives_llamas_logits(llama):
    _, reference = llama
    ours = from_llama_state_dict(reference.state_dict(), llama_loader.config_from_llama(reference.config))
    ids = torch.randint(0, 50, (2, 40), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = reference(ids).logits
        torch.testing.assert_close(ours.eval()(ids), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(modern.modern_generate_logits(ours, ids), expected,
                                   atol=1e-5, rtol=1e-5)


def test_rope_rmsnorm_and_swiglu_layers_match_llamas(llama):
    _, reference = llama
    layer = reference.model.layers[0]
    torch.manual_seed(8)
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        ours = RMSNorm(64, eps=1e-6)
        ours.weight.copy_(layer.input_layernorm.weight)
        torch.testing.assert_close(ours(x), layer.input_layernorm(x), atol=1e-5, rtol=1e-5)
        mlp = SwiGLUFeedForward(64, 160, bias=False)
        for mine, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            getattr(mlp, mine).weight.copy_(getattr(layer.mlp, theirs).weight)
        torch.testing.assert_close(mlp(x), layer.mlp(x), atol=1e-5, rtol=1e-5)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        positions = torch.arange(9)[None]
        cos, sin = reference.model.rotary_emb(x, positions)
        q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
        q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
        table = RopeTable.build(16, 48)
        torch.testing.assert_close(rope_rotate_half(q, table), q_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rope_rotate_complex(k, table), k_ref, atol=1e-5, rtol=1e-5)


# --- notebook 9's exercise checkers catch the usual mistakes --------------------------------

def test_exercise_checkers_name_the_usual_mistakes():
    from helpers.lab import exercises
    from helpers.lab.exercises import ExerciseFailed

    def clockwise(a, b, position, theta):
        angle = position * theta
        return a * math.cos(angle) + b * math.sin(angle), -a * math.sin(angle) + b * math.cos(angle)

    def flipped(slopes, n):
        return -alibi_bias(len(slopes), n)

    def layer_norm_instead(x, weight, eps):
        return modern.rms_norm(x - x.mean(-1, keepdim=True), weight, eps)

    for name, wrong, words in (("rotate_pair", clockwise, "clockwise"),
                               ("alibi_bias", flipped, "sign"),
                               ("rms_norm", layer_norm_instead, "LayerNorm")):
        with pytest.raises(ExerciseFailed, match=words):
            exercises.get(f"modern_decoder.{name}").checker(wrong)
    assert exercises.get("modern_decoder.alibi_bias").checker(
        lambda slopes, n: alibi_bias(len(slopes), n))


def test_modern_model_moves_its_rope_table_with_it():
    torch.manual_seed(9)
    model = ModernGPT(ModernConfig(**SMALL)).eval()
    ids = torch.randint(0, 40, (1, 12))
    as_double = model.double()
    assert as_double.rope.cos.dtype == torch.float64
    assert as_double(ids).dtype == torch.float64
    assert "rope" not in "".join(model.state_dict())  # the table is rebuilt, never saved


# helpers.model.modern, exactly:
#
# Grouped by issue 30's classes: ALiBi attention against PyTorch's attention with the same bias
# (hand-written against the reference), dtypes and devices kept on every path, configuration
# defaults asserted (SwiGLU's rounding, a block's start), edge shapes and every error message
# read in full.

TINY_GQA = dict(vocab_size=40, context_length=32, n_layers=1, n_heads=4, n_kv_heads=2, d_model=32)


def alibi_reference(q, k, v):
    """PyTorch's attention with ALiBi's bias and the causal mask as one additive float mask."""
    n_heads, n_tokens = q.shape[1], q.shape[2]
    visible = torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()
    bias = alibi_bias(n_heads, n_tokens).to(q.dtype).masked_fill(~visible, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


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


def test_llama_hidden_size_rounds_up_to_32_by_default():
    assert llama_hidden_size(100) == 288  # int(800 / 3) = 266 -> 9 x 32
    assert llama_hidden_size(100, 256) == 512
    assert llama_hidden_size(4096, 256) == 11008  # Llama 7B


def test_a_block_starts_at_position_0_by_default():
    torch.manual_seed(2)
    config = ModernConfig(**TINY_GQA)
    block, table = ModernBlock(config), RopeTable.build(config.head_dim, 32)
    x = torch.randn(1, 6, 32)
    assert torch.equal(block(x, table), block(x, table, start=0))
    assert not torch.equal(block(x, table), block(x, table, start=1))


def test_to_empty_without_recursion_leaves_the_submodules_weights_alone():
    torch.manual_seed(3)
    model = ModernGPT(ModernConfig(**TINY_GQA))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.to_empty(device="cpu", recurse=False)  # the model itself holds no parameter
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


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
    model = ModernGPT(ModernConfig(**TINY_GQA))
    with pytest.raises(ValueError, match=full(f"token_ids has shape {got}, expected (B, N) with N >= 1")):
        model(ids)


def test_too_many_ids_name_the_last_position_allowed():
    model = ModernGPT(ModernConfig(**TINY_GQA))
    message = "token_ids reach position 32, expected at most context_length - 1 = 31"
    with pytest.raises(ValueError, match=full(message)):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_with_identity_values_the_output_is_the_biased_softmax_over_past_keys():
    q = torch.eye(4).reshape(1, 1, 4, 4)
    weights = alibi_attention(q, q, torch.eye(4).reshape(1, 1, 4, 4))[0, 0]
    scores = torch.eye(4) / math.sqrt(4) + alibi_bias(1, 4)[0]
    expected = scores.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected)


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
    model = ModernGPT(ModernConfig(**TINY_GQA, rope_base=1.5))
    assert torch.equal(model.rope.cos, RopeTable.build(8, 32, 1.5).cos)


def test_matrices_start_at_std_0_02_and_norm_gains_at_one():
    torch.manual_seed(6)
    model = ModernGPT(ModernConfig(**dict(TINY_GQA, d_model=64, vocab_size=400)))
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert 0.015 < p.std().item() < 0.025, name
        else:
            assert torch.equal(p, torch.ones_like(p)), name


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


def test_rope_table_sizes_and_complex_form():
    table = RopeTable.build(6, 7)
    assert table.n_positions == 7 and table.head_dim == 6
    assert isinstance(table.n_positions, int) and isinstance(table.head_dim, int)
    z = table.complex
    assert z.shape == (7, 3) and z.is_complex()
    assert torch.equal(z.real, table.cos) and torch.equal(z.imag, table.sin)


def test_config_head_dim_is_an_int_and_hidden_is_llamas_unless_given():
    config = ModernConfig(**TINY_GQA)
    assert config.head_dim == 8 and isinstance(config.head_dim, int)
    assert config.hidden == llama_hidden_size(32) == 96
    assert ModernConfig(**TINY_GQA, mlp_hidden=40).hidden == 40
    assert ModernConfig(**{**TINY_GQA, "d_model": 24, "n_heads": 2, "n_kv_heads": 1}).head_dim == 12


def test_forward_cached_moves_the_cache_on_by_the_tokens_fed():
    torch.manual_seed(0)
    model = ModernGPT(ModernConfig(**{**TINY_GQA, "context_length": 6})).eval()
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
    model = ModernGPT(ModernConfig(**{**TINY_GQA, "context_length": 6})).eval()
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


MODERN = ModernConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, n_kv_heads=1, d_model=8)


def test_llama_state_dict_with_extra_layers_is_refused():
    torch.manual_seed(0)
    bigger = ModernGPT(ModernConfig(**{**MODERN.__dict__, "n_layers": 3}))
    names = llama_key_map(bigger.config)
    state = {names[ours]: p.detach() for ours, p in bigger.named_parameters()}
    with pytest.raises(ValueError, match=r"no place for: \['model.layers.2"):
        from_llama_state_dict(state, MODERN)


@pytest.mark.parametrize("make, words", [
    (lambda: RMSNorm(4, eps=0.0), "eps is 0.0"), (lambda: RMSNorm(4, eps=-1e-6), "eps is -1e-06"),
    (lambda: rms_norm(torch.ones(2, 4), eps=0.0), "eps is 0.0"),
    (lambda: rope_angles(8, 4, base=1.0), "base is 1.0, expected a finite number > 1"),
    (lambda: rope_angles(8, 4, base=0.5), "base is 0.5"),
    (lambda: ModernConfig(rope_base=1.0), "rope_base is 1.0, expected a finite number > 1"),
])
def test_modern_parts_refuse_nonsense_numbers(make, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        make()


def test_rope_positions_of_the_wrong_shape_or_dtype_are_named():
    table = RopeTable.build(8, 16)
    for positions in (torch.arange(3), torch.arange(4)[None], torch.arange(4.0)):
        with pytest.raises(ValueError, match=r"positions is .*expected an integer tensor of shape \(4,\)"):
            rope_rotate_half(torch.zeros(4, 8), table, positions=positions)


def test_alibi_with_different_query_and_key_lengths_is_named():
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match=r"q, k, v have shapes \(1, 2, 4, 8\), \(1, 2, 6, 8\)"):
        alibi_attention(q, k, k)


def test_alibi_names_a_q_of_too_few_dimensions_and_a_non_tensor_before_any_work():
    """q.shape[-3] used to be read before the check: a 2-D q raised IndexError, a list AttributeError."""
    with pytest.raises(ValueError, match=r"q, k, v have shapes \(4, 8\), \(4, 8\), \(4, 8\)"):
        alibi_attention(torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(TypeError, match="k is a list, expected a tensor"):
        alibi_attention(torch.randn(1, 2, 4, 8), [[0.0]], torch.randn(1, 2, 4, 8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_a_future_token_leaves_the_modern_decoder_bit_identical(dtype, n_kv_heads):
    torch.manual_seed(0)
    model = ModernGPT(ModernConfig(vocab_size=29, context_length=16, n_layers=2, n_heads=4,
                                   n_kv_heads=n_kv_heads, d_model=32)).to(dtype).eval()
    ids = torch.randint(0, 29, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before, after = model(ids), model(changed_at(ids, 10, 29))
    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.equal(before[:, 10:], after[:, 10:])


def test_config_values_other_than_the_defaults_reach_the_model():
    model = small_gpt(torch.float32, bias=False, tie_weights=False, activation="relu")
    assert all(p.dim() >= 2 for name, p in model.named_parameters()
               if ".attn." in name or ".mlp." in name)  # no bias anywhere in attention or MLP
    assert model.lm_head.weight is not model.embed.token.weight
    x = torch.tensor([[-1.0, 2.0]])
    assert torch.equal(model.blocks[0].mlp.activation(x), torch.relu(x))
    modern = ModernGPT(ModernConfig(vocab_size=29, context_length=16, n_layers=1, n_heads=4,
                                    n_kv_heads=2, d_model=32, norm_eps=1e-3, rope_base=500.0,
                                    mlp_hidden=48))
    block = modern.blocks[0]
    assert block.attn.n_kv_heads == 2 and block.attn.k_proj.weight.shape == (2 * 8, 32)
    assert {m.eps for m in modern.modules() if type(m).__name__ == "RMSNorm"} == {1e-3}
    assert torch.equal(modern.rope.cos, RopeTable.build(8, 16, 500.0).cos)  # theta's base 500
    assert not torch.equal(modern.rope.cos, RopeTable.build(8, 16, 10000.0).cos)
    assert block.mlp.gate.weight.shape == (48, 32)
