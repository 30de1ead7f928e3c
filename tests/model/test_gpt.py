"""The GPT of notebook 7: causality, weight tying, parameter counts, the KV cache, sampling, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_tools import DTYPES, changed_at, small_gpt, tiny_ids, tiny_model
from torch import nn

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
from helpers.model.gpt2 import convert_gpt2_state
from helpers.model.kv_cache import KVCache
from helpers.model.layers import Block
from helpers.model.multihead import MultiHeadAttention
from helpers.training.trainer import TrainConfig

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


# helpers.model.gpt: configuration asserted at non-default values, counts against built models,
# and every refusal's message.
#
#

TINY = dict(vocab_size=11, context_length=9, n_layers=2, n_heads=2, d_model=8)


def test_config_defaults_and_dict():
    config = GPTConfig()
    assert config.to_dict() == {
        "vocab_size": 64, "context_length": 64, "n_layers": 4, "n_heads": 4, "d_model": 128,
        "dropout": 0.0, "bias": True, "tie_weights": True, "activation": "gelu"}
    assert config.head_dim == 32 and GPTConfig(n_heads=8, d_model=64).head_dim == 8


def test_gpt2_small_config():
    config = GPTConfig.gpt2_small()
    assert (config.vocab_size, config.context_length, config.n_layers, config.n_heads,
            config.d_model, config.activation) == (50257, 1024, 12, 12, 768, "gelu_tanh")
    assert config.dropout == 0.0 and config.bias is True and config.tie_weights is True


def test_every_config_field_reaches_the_model():
    torch.manual_seed(0)
    config = GPTConfig(**TINY, dropout=0.25, bias=False, tie_weights=False, activation="relu")
    model = GPT(config)
    assert model.config is config and len(model.blocks) == 2
    assert model.embed.token.weight.shape == (11, 8) and model.embed.position.weight.shape == (9, 8)
    assert model.drop.p == 0.25
    for block in model.blocks:
        assert block.attn.n_heads == 2 and block.attn.dropout.p == 0.25 and block.mlp.dropout.p == 0.25
        assert block.attn.q_proj.bias is None and block.mlp.up.bias is None
        assert isinstance(block.mlp.activation, nn.ReLU) and block.pre_norm is True
    assert model.ln_f.d_model == 8 and model.lm_head.bias is None
    assert model.lm_head.weight.shape == (11, 8)
    assert model.lm_head.weight is not model.embed.token.weight
    tied = GPT(GPTConfig(**TINY))
    assert tied.lm_head.weight is tied.embed.token.weight
    assert tied.blocks[0].attn.q_proj.bias is not None and tied.drop.p == 0.0
    assert tied.blocks[0].mlp.activation.approximate == "none"


def test_gpt_is_initialised_like_gpt2_for_its_depth():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, context_length=8, n_layers=8, n_heads=4, d_model=128))
    std = model.blocks[0].mlp.down.weight.std().item()
    assert abs(std - 0.02 / 4) < 0.1 * 0.02 / 4  # 0.02 / sqrt(2 * 8)
    assert abs(model.blocks[0].mlp.up.weight.std().item() - 0.02) < 0.002
    assert torch.equal(model.blocks[0].mlp.up.bias, torch.zeros(512))


def test_dropout_after_the_embedding_acts_in_training_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, dropout=0.5))
    ids = torch.randint(0, 11, (2, 9))
    model.eval()
    assert torch.equal(model(ids), model(ids))
    model.train()
    assert not torch.equal(model(ids), model(ids))


@pytest.mark.parametrize("fast", [False, True])
def test_forward_cached_one_token_at_a_time_equals_the_full_pass(fast):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY)).eval()
    ids = torch.randint(0, 11, (2, 9))
    full = model(ids)
    cache = KVCache.for_model(model, 2)
    rows = [model.forward_cached(ids[:, :4], cache, fast=fast)]
    assert cache.length == 4
    for t in range(4, 9):
        rows.append(model.forward_cached(ids[:, t:t + 1], cache, fast=fast))
        assert cache.length == t + 1
    torch.testing.assert_close(torch.cat(rows, dim=1), full, atol=1e-5, rtol=1e-5)


def test_forward_cached_refuses_training_with_dropout_and_a_full_cache():
    model = GPT(GPTConfig(**TINY, dropout=0.1))
    cache = KVCache.for_model(model, 1)
    with pytest.raises(RuntimeError, match=r"^forward_cached is for generation, but the model is in "
                                           r"training mode with dropout = 0.1, so dropout"):
        model.forward_cached(torch.zeros(1, 2, dtype=torch.long), cache)
    model.eval()
    model.forward_cached(torch.zeros(1, 7, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"^the cache holds 7 tokens and token_ids has 3 more, expected "
                                         r"at most context_length = 9 in all"):
        model.forward_cached(torch.zeros(1, 3, dtype=torch.long), cache)
    assert cache.length == 7
    model.forward_cached(torch.zeros(1, 2, dtype=torch.long), cache)  # exactly 9: accepted
    assert cache.length == 9
    # training mode without dropout is allowed: nothing random happens
    plain = GPT(GPTConfig(**TINY)).train()
    plain.forward_cached(torch.zeros(1, 2, dtype=torch.long), KVCache.for_model(plain, 1))


def test_forward_cached_checks_its_arguments():
    model = GPT(GPTConfig(**TINY)).eval()
    cache = KVCache.for_model(model, 1)
    with pytest.raises(TypeError, match=r"^cache is a dict, expected a KVCache"):
        model.forward_cached(torch.zeros(1, 2, dtype=torch.long), {})
    with pytest.raises(TypeError, match=r"^fast is "):
        model.forward_cached(torch.zeros(1, 2, dtype=torch.long), cache, fast="yes")
    with pytest.raises(ValueError, match=r"expected \(B, N\)"):
        model.forward_cached(torch.zeros(2, dtype=torch.long), cache)
    with pytest.raises(ValueError):
        model.forward_cached(torch.zeros(2, 2, dtype=torch.long), cache)  # batch 2 in a cache of 1
    assert cache.length == 0


def test_forward_names_bad_ids():
    model = GPT(GPTConfig(**TINY))
    with pytest.raises(TypeError, match=r"^fast is "):
        model(torch.zeros(1, 2, dtype=torch.long), fast=1)
    with pytest.raises(ValueError, match=r"^token_ids has shape \(2,\), expected \(B, N\): add a batch "
                                         r"axis with token_ids.unsqueeze\(0\)$"):
        model(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^token_ids has shape \(1, 0\): a sequence of 0 tokens, "
                                         r"expected at least one \(N >= 1\)$"):
        model(torch.zeros(1, 0, dtype=torch.long))


def test_a_meta_model_takes_ids_on_any_device():
    model = GPT(GPTConfig(**TINY)).to("meta")
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 11)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tie", [True, False])
def test_exact_parameters_and_breakdown_match_a_built_model(bias, tie):
    config = GPTConfig(vocab_size=13, context_length=7, n_layers=3, n_heads=2, d_model=6,
                       bias=bias, tie_weights=tie)
    model = GPT(config)
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert exact_parameters(config) == count_parameters(model) == total
    parts = parameter_breakdown(model)
    d, v = 6, 13
    assert parts["attention"] == 3 * (4 * d * d + (4 * d if bias else 0))
    assert parts["feed-forward"] == 3 * (8 * d * d + (5 * d if bias else 0))
    assert parts["embeddings"] == v * d + 7 * d
    assert parts["layer norms"] == 3 * 4 * d + 2 * d
    if tie:
        assert "output" not in parts
    else:
        assert parts["output"] == v * d
    assert sum(parts.values()) == total
    assert list(parts)[:4] == ["attention", "feed-forward", "embeddings", "layer norms"]


def test_formula_parameters_exact_values_and_checks():
    assert formula_parameters(1, 1, 1) == 14
    assert formula_parameters(2, 3, 5) == 12 * 2 * 9 + 2 * 5 * 3
    for name, args in (("n_layers", (0, 3, 5)), ("d_model", (2, 0, 5)), ("vocab_size", (2, 3, 0))):
        with pytest.raises(ValueError, match=rf"^{name} is 0"):
            formula_parameters(*args)


def test_build_without_weights_is_on_meta_with_the_exact_count():
    config = GPTConfig(**TINY, tie_weights=False)
    model = build_without_weights(config)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert count_parameters(model) == exact_parameters(config)
    assert isinstance(model, GPT) and model.config is config


@pytest.mark.parametrize("field", ["vocab_size", "context_length", "n_layers"])
def test_config_names_a_bad_size(field):
    with pytest.raises(ValueError, match=rf"^{field} is 0"):
        GPTConfig(**{field: 0})


@pytest.mark.parametrize("field", ["bias", "tie_weights"])
def test_config_refuses_a_string_boolean(field):
    with pytest.raises(TypeError, match=rf"^{field} is .*expected True or False"):
        GPTConfig(**{field: "False"})


def test_config_names_a_bad_activation_dropout_and_heads():
    with pytest.raises(ValueError, match="activation"):
        GPTConfig(activation="swish")
    for p in (1.0, -0.5):
        with pytest.raises(ValueError, match=rf"^dropout is {p}, expected a probability in \[0, 1\)$"):
            GPTConfig(dropout=p)
    assert GPTConfig(dropout=0.99).dropout == 0.99
    with pytest.raises(ValueError, match="n_heads"):
        GPTConfig(n_heads=3, d_model=8)


def _spy_forwards(model):
    """Replace the forward of ln_f and of every block by a counting wrapper (this model only)."""
    calls = {"ln_f": 0, "blocks": []}

    def wrap(module, record):
        original = module.forward

        def spy(*args, **kwargs):
            record(kwargs)
            return original(*args, **kwargs)
        module.forward = spy

    wrap(model.ln_f, lambda kwargs: calls.__setitem__("ln_f", calls["ln_f"] + 1))
    for block in model.blocks:
        wrap(block, calls["blocks"].append)
    return calls


@pytest.mark.parametrize("cached", [False, True])
def test_fast_false_runs_the_course_modules_and_fast_true_does_not(cached):
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (1, 4))
    for fast in (False, True):
        model = GPT(GPTConfig(**TINY)).eval()
        calls = _spy_forwards(model)
        if cached:
            model.forward_cached(ids, KVCache.for_model(model, 1), fast=fast)
        else:
            model(ids, fast=fast)
        if fast:
            assert calls == {"ln_f": 0, "blocks": []}
        else:
            assert calls["ln_f"] == 1 and len(calls["blocks"]) == 2


def test_refusals_name_the_remedy_in_full():
    model = GPT(GPTConfig(**TINY, dropout=0.1))
    with pytest.raises(RuntimeError, match=r"dropout would change its outputs: call model.eval\(\) first "
                                           r"\(generate\(\) does\)$"):
        model.forward_cached(torch.zeros(1, 2, dtype=torch.long), KVCache.for_model(model, 1))
    with pytest.raises(TypeError, match=r"^cache is a NoneType, expected a KVCache "
                                        r"\(KVCache.for_model\(model, batch_size\)\)$"):
        model.eval().forward_cached(torch.zeros(1, 2, dtype=torch.long), None)


def test_ids_on_another_device_than_the_model_are_named():
    # No second device on a CPU-only machine: the model reports its weights on cuda:0 (all that
    # _check_ids reads), and the ids stay on the CPU. The refusal comes before any computation.
    model = GPT(GPTConfig(**TINY))
    fake_weight = type("FakeWeight", (), {"device": torch.device("cuda", 0)})()
    object.__setattr__(model, "lm_head", type("FakeHead", (), {"weight": fake_weight})())
    with pytest.raises(ValueError, match=r"^token_ids is on cpu and the model on cuda:0: move the ids "
                                         r"with token_ids.to\('cuda:0'\)$"):
        model(torch.zeros(1, 3, dtype=torch.long))


def test_head_dim_is_an_int():
    """head_dim sizes tensors (the KV cache, the attention's split): a float would not do."""
    for config in (GPTConfig(), GPTConfig(n_heads=3, d_model=12), GPTConfig(**TINY)):
        assert type(config.head_dim) is int and config.head_dim * config.n_heads == config.d_model


def test_forward_cached_takes_the_fast_path_by_default():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY)).eval()
    calls = _spy_forwards(model)
    cache = KVCache.for_model(model, 1)
    model.forward_cached(torch.tensor([[1, 2, 3]]), cache)
    assert calls == {"ln_f": 0, "blocks": []} and cache.length == 3


@pytest.mark.parametrize("make, name", [
    (lambda: GPTConfig(tie_weights="False"), "tie_weights"),
    (lambda: GPTConfig(bias="True"), "bias"),
    (lambda: Block(8, 2, pre_norm="no"), "pre_norm"),
    (lambda: MultiHeadAttention(8, 2, bias="False"), "bias"),
    (lambda: TrainConfig(fast="False"), "fast"),
    (lambda: TrainConfig(compile="yes"), "compile"),
    (lambda: MultiHeadAttention(8, 2)(torch.randn(1, 3, 8), causal="no"), "causal"),
    (lambda: tiny_model()(tiny_ids(), fast="False"), "fast"),
    (lambda: generate(tiny_model(), tiny_ids(), 2, use_cache="False"), "use_cache"),
])
def test_strings_are_refused_where_a_bool_is_expected(make, name):
    with pytest.raises(TypeError, match=rf"{name} is '.*' \(a str\), expected True or False"):
        make()


@pytest.mark.parametrize("token_ids, error, match", [
    (torch.tensor([[1, 2]], dtype=torch.uint8), TypeError, "token_ids has dtype torch.uint8, expected .*torch.long"),
    (torch.zeros(1, 2, dtype=torch.long, device="meta"), ValueError, "token_ids is on the meta device"),
    (torch.zeros(1, 0, dtype=torch.long), ValueError, r"token_ids has shape \(1, 0\): a sequence of 0 tokens"),
])
def test_bad_token_ids_are_named(token_ids, error, match):
    with pytest.raises(error, match=match):
        tiny_model()(token_ids)


def test_vocab_size_none_is_named():
    with pytest.raises(TypeError, match="vocab_size is None"):
        GPTConfig(vocab_size=None)


def test_gpt2_conversion_refuses_integer_weights():
    config = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=2, d_model=4)
    state = {"wte.weight": torch.zeros(5, 4, dtype=torch.int32)}
    with pytest.raises(ValueError, match="'wte.weight' has dtype torch.int32, expected floating-point"):
        convert_gpt2_state(state, config)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("position", [1, 7, 15])
def test_a_future_token_leaves_every_earlier_logit_of_the_gpt_bit_identical(dtype, fast, position):
    model = small_gpt(dtype)
    ids = torch.randint(0, 31, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids, fast=fast)
        after = model(changed_at(ids, position, 31), fast=fast)
    assert torch.equal(before[:, :position], after[:, :position])
    assert not torch.equal(before[:, position:], after[:, position:])  # the change is seen later
