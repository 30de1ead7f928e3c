"""The GPT of notebook 7: causality, weight tying, parameter counts, the KV cache, sampling, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.model.fused import fast_block
from helpers.model.generation import generate, sample_next
from helpers.model.gpt import (
    GPT,
    GPTConfig,
    build_without_weights,
    count_parameters,
    exact_parameters,
    formula_parameters,
    parameter_breakdown,
)
from helpers.model.kv_cache import KVCache
from helpers.model.layers import Block

SMALL = GPTConfig(vocab_size=23, context_length=16, n_layers=2, n_heads=4, d_model=32)


def small_model(seed: int = 0, **changes) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(**{**SMALL.to_dict(), **changes})
    return GPT(config).eval()


def random_ids(batch: int, length: int, vocab: int = SMALL.vocab_size, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- the model -----------------------------------------------------------------------------

def test_model_is_built_from_the_course_blocks():
    model = small_model()
    assert len(model.blocks) == SMALL.n_layers
    assert all(type(block) is Block for block in model.blocks)


@pytest.mark.parametrize("fast", [False, True])
def test_changing_a_later_token_leaves_earlier_logits_unchanged(fast):
    model = small_model()
    ids = random_ids(2, 12)
    logits = model(ids, fast=fast)
    for t in (0, 5, 10):
        changed = ids.clone()
        changed[:, t + 1] = (changed[:, t + 1] + 1) % SMALL.vocab_size
        new_logits = model(changed, fast=fast)
        torch.testing.assert_close(new_logits[:, :t + 1], logits[:, :t + 1], atol=1e-6, rtol=0)
        assert not torch.allclose(new_logits[:, t + 1], logits[:, t + 1]), "token t+1 must matter"


def test_weight_tying_shares_one_storage():
    model = small_model()
    assert model.lm_head.weight is model.embed.token.weight
    assert model.lm_head.weight.data_ptr() == model.embed.token.weight.data_ptr()
    with torch.no_grad():
        model.embed.token.weight[3, 0] = 42.0
    assert model.lm_head.weight[3, 0].item() == 42.0
    untied = small_model(tie_weights=False)
    assert untied.lm_head.weight.data_ptr() != untied.embed.token.weight.data_ptr()


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_computes_the_plain_forward(dtype, activation):
    model = small_model(activation=activation)
    ids = random_ids(3, SMALL.context_length)
    plain = model(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        fast = model(ids, fast=True).float()
    # float32: the same sums in another order. bfloat16 keeps 8 bits of mantissa (~0.4 %).
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(fast, plain, atol=tolerance, rtol=0)


# --- parameter counts ----------------------------------------------------------------------

def test_activation_is_a_config_field_and_gpt2_uses_the_tanh_gelu():
    assert GPTConfig().activation == "gelu"  # the course's small models: exact GELU
    assert GPTConfig.gpt2_small().activation == "gelu_tanh"
    model = small_model(activation="gelu_tanh")
    assert all(block.mlp.activation.approximate == "tanh" for block in model.blocks)
    exact = small_model()
    ids = random_ids(2, SMALL.context_length)
    assert not torch.equal(model(ids), exact(ids))  # same weights, another function
    with pytest.raises(ValueError, match="activation is 'swish', expected one of 'relu', 'gelu', 'gelu_tanh'"):
        GPTConfig(activation="swish")


def test_gpt2_small_has_exactly_124_439_808_parameters_without_allocating_them():
    config = GPTConfig.gpt2_small()
    model = build_without_weights(config)
    assert all(p.is_meta for p in model.parameters())
    assert count_parameters(model) == exact_parameters(config) == 124_439_808


def test_untied_gpt2_small_adds_one_vocabulary_matrix():
    config = GPTConfig(**{**GPTConfig.gpt2_small().to_dict(), "tie_weights": False})
    assert count_parameters(build_without_weights(config)) == 124_439_808 + 50257 * 768


@settings(max_examples=25, deadline=None)
@given(n_layers=st.integers(1, 3), n_heads=st.sampled_from([1, 2, 4]), head_dim=st.integers(1, 6),
       vocab=st.integers(1, 40), context=st.integers(1, 20), bias=st.booleans(), tie=st.booleans())
def test_exact_parameters_matches_a_built_model(n_layers, n_heads, head_dim, vocab, context, bias, tie):
    config = GPTConfig(vocab_size=vocab, context_length=context, n_layers=n_layers, n_heads=n_heads,
                       d_model=n_heads * head_dim, bias=bias, tie_weights=tie)
    model = build_without_weights(config)
    assert count_parameters(model) == exact_parameters(config)
    assert sum(parameter_breakdown(model).values()) == count_parameters(model)


def test_formula_gives_gpt3_175b_and_ignores_only_small_terms():
    assert formula_parameters(96, 12288, 50257) == 175_181_291_520
    config = GPTConfig.gpt2_small()
    # The formula counts the vocabulary matrix twice; with tying the model holds it once.
    formula_tied = formula_parameters(12, 768, 50257) - 50257 * 768
    assert 0 < exact_parameters(config) - formula_tied < 0.01 * exact_parameters(config)


def test_parameter_breakdown_of_gpt2_small():
    parts = parameter_breakdown(build_without_weights(GPTConfig.gpt2_small()))
    assert parts["attention"] == 12 * (4 * 768**2 + 4 * 768)
    assert parts["feed-forward"] == 12 * (8 * 768**2 + 5 * 768)
    assert parts["embeddings"] == (50257 + 1024) * 768
    assert parts["layer norms"] == 12 * 4 * 768 + 2 * 768
    assert "output" not in parts


# --- the KV cache --------------------------------------------------------------------------

@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("chunks", [[16], [1] * 16, [5, 1, 1, 9], [7, 4, 1, 1, 1, 2]])
def test_cached_forward_equals_the_full_forward(fast, batch, chunks):
    model = small_model()
    ids = random_ids(batch, sum(chunks))
    cache = KVCache.for_model(model, batch)
    pieces, start = [], 0
    for size in chunks:
        pieces.append(model.forward_cached(ids[:, start:start + size], cache, fast=fast))
        start += size
        assert cache.length == start
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("prompt_length,new_tokens", [(1, 10), (3, 13), (5, 40)])
def test_greedy_generation_with_cache_equals_recomputation(batch, prompt_length, new_tokens):
    model = small_model()
    prompt = random_ids(batch, prompt_length, seed=prompt_length)
    with_cache = generate(model, prompt, new_tokens, temperature=0.0, use_cache=True)
    without = generate(model, prompt, new_tokens, temperature=0.0, use_cache=False)
    assert with_cache.shape == (batch, prompt_length + new_tokens)
    assert torch.equal(with_cache[:, :prompt_length], prompt)
    assert torch.equal(with_cache, without)  # 5 + 40 > 16: past the context length too


def test_the_course_block_feeds_a_cache_through_its_kv_store_hook():
    """Block.forward(kv_store=...) is what the cache plugs into: one token at a time, the
    stored keys and values give the rows of a full causal pass."""
    torch.manual_seed(0)
    block = Block(16, 4).eval()
    x = torch.randn(2, 6, 16)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep_all(k, v):  # (B, H, 1, D_H) each call -> everything so far
        kept.append((k, v))
        return torch.cat([k for k, _ in kept], dim=2), torch.cat([v for _, v in kept], dim=2)

    rows = [block(x[:, t:t + 1], causal=True, kv_store=keep_all) for t in range(6)]
    torch.testing.assert_close(torch.cat(rows, dim=1), block(x, causal=True), atol=1e-6, rtol=0)
    assert [k.shape for k, _ in kept] == [(2, 4, 1, 4)] * 6


def test_fast_block_refuses_a_post_ln_block():
    with pytest.raises(ValueError, match="Post-LN"):
        fast_block(Block(16, 4, pre_norm=False), torch.randn(1, 3, 16))


def test_generation_past_the_context_reads_only_the_last_window():
    model = small_model()
    prompt = random_ids(2, 30)  # longer than the context of 16
    out = generate(model, prompt, 3, temperature=0.0)
    expected_next = model(prompt[:, -SMALL.context_length:])[:, -1].argmax(-1)
    assert torch.equal(out[:, 30], expected_next)


def test_cache_memory_is_2_L_H_dh_per_token():
    model = small_model()
    cache = KVCache.for_model(model, batch_size=3)
    per_token = 2 * SMALL.n_layers * SMALL.n_heads * SMALL.head_dim
    assert cache.nbytes() == per_token * SMALL.context_length * 3 * 4  # float32: 4 bytes


def test_cache_refuses_more_tokens_than_the_context():
    model = small_model()
    cache = KVCache.for_model(model, 1)
    model.forward_cached(random_ids(1, 10), cache)
    with pytest.raises(ValueError, match="the cache holds 10 tokens and token_ids has 7 more"):
        model.forward_cached(random_ids(1, 7), cache)


def test_generate_restores_training_mode():
    model = small_model().train()
    generate(model, random_ids(1, 2), 2)
    assert model.training


# --- sampling ------------------------------------------------------------------------------

def test_temperature_zero_and_top_k_one_are_greedy():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(-1, keepdim=True)
    assert torch.equal(sample_next(logits, temperature=0.0), greedy)
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        assert torch.equal(sample_next(logits, temperature=2.0, top_k=1, generator=generator), greedy)
    model = small_model()
    prompt = random_ids(2, 3)
    top1 = generate(model, prompt, 8, temperature=1.0, top_k=1,
                    generator=torch.Generator().manual_seed(0))
    assert torch.equal(top1, generate(model, prompt, 8, temperature=0.0))


def test_top_k_only_draws_among_the_k_best():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9, -1.0]]).repeat(400, 1)
    drawn = sample_next(logits, temperature=5.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(drawn.flatten().tolist()) == {1, 3}


def test_low_temperature_concentrates_and_high_temperature_spreads():
    logits = torch.tensor([[2.0, 1.0, 0.0]]).repeat(2000, 1)

    def share_of_best(temperature: float) -> float:
        generator = torch.Generator().manual_seed(0)
        return (sample_next(logits, temperature, generator=generator) == 0).float().mean().item()

    assert share_of_best(0.2) > share_of_best(1.0) > share_of_best(5.0)


# --- clear errors --------------------------------------------------------------------------

def test_width_not_divisible_by_heads_is_refused_with_both_numbers():
    with pytest.raises(ValueError, match=r"d_model=130 is not divisible by n_heads=4"):
        GPTConfig(d_model=130, n_heads=4)


@pytest.mark.parametrize("field,value,error", [("n_layers", 0, ValueError), ("vocab_size", -3, ValueError),
                                               ("context_length", 2.5, TypeError)])
def test_sizes_must_be_positive_ints(field, value, error):
    with pytest.raises(error, match=f"{field} is {value!r}.*, expected a positive int"):
        GPTConfig(**{field: value})


def test_token_ids_outside_the_vocabulary_are_refused():
    model = small_model()
    with pytest.raises(ValueError, match=r"contains the id 23, expected ids in \[0, 22\]"):
        model(torch.tensor([[1, 2, 23]]))
    with pytest.raises(ValueError, match="contains the id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError, match="expected an integer dtype"):
        model(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="contains the id 23"):
        model.forward_cached(torch.tensor([[23]]), KVCache.for_model(model, 1))


def test_badly_shaped_input_is_refused():
    model = small_model()
    with pytest.raises(ValueError, match=r"token_ids has shape \(5,\), expected \(B, N\)"):
        model(torch.arange(5))
    with pytest.raises(ValueError, match="expected at most context_length = 16"):
        model(random_ids(1, 17))


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": -1.0}, "temperature is -1.0, expected a number >= 0"),
    ({"top_k": 0}, "top_k is 0, expected a positive int"),
])
def test_sampling_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample_next(torch.zeros(1, 4), **kwargs)


def test_generate_checks_its_arguments():
    model = small_model()
    with pytest.raises(ValueError, match=r"prompt has shape \(1, 0\)"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="max_new_tokens is 0"):
        generate(model, random_ids(1, 2), 0)
