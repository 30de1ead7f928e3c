"""The modern decoder (helpers/model/modern.py, notebook 9): RoPE, ALiBi, RMSNorm, the model, its cache,
bad input, and equality with Hugging Face's Llama (transformers is a test-only dependency)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.model import llama as llama_loader
from helpers.model import modern
from helpers.model.kv_cache import KVCache
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.llama import from_llama_state_dict
from helpers.model.modern import (
    ModernConfig,
    ModernGPT,
    RMSNorm,
    RopeTable,
    alibi_bias,
    alibi_slopes,
    llama_hidden_size,
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
