"""helpers.model.gpt: configuration asserted at non-default values, counts against built models,
and every refusal's message.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_gpt.py and the property tests let through.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

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

SMALL = dict(vocab_size=11, context_length=9, n_layers=2, n_heads=2, d_model=8)


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
    config = GPTConfig(**SMALL, dropout=0.25, bias=False, tie_weights=False, activation="relu")
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
    tied = GPT(GPTConfig(**SMALL))
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
    model = GPT(GPTConfig(**SMALL, dropout=0.5))
    ids = torch.randint(0, 11, (2, 9))
    model.eval()
    assert torch.equal(model(ids), model(ids))
    model.train()
    assert not torch.equal(model(ids), model(ids))


@pytest.mark.parametrize("fast", [False, True])
def test_forward_cached_one_token_at_a_time_equals_the_full_pass(fast):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL)).eval()
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
    model = GPT(GPTConfig(**SMALL, dropout=0.1))
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
    plain = GPT(GPTConfig(**SMALL)).train()
    plain.forward_cached(torch.zeros(1, 2, dtype=torch.long), KVCache.for_model(plain, 1))


def test_forward_cached_checks_its_arguments():
    model = GPT(GPTConfig(**SMALL)).eval()
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
    model = GPT(GPTConfig(**SMALL))
    with pytest.raises(TypeError, match=r"^fast is "):
        model(torch.zeros(1, 2, dtype=torch.long), fast=1)
    with pytest.raises(ValueError, match=r"^token_ids has shape \(2,\), expected \(B, N\): add a batch "
                                         r"axis with token_ids.unsqueeze\(0\)$"):
        model(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^token_ids has shape \(1, 0\): a sequence of 0 tokens, "
                                         r"expected at least one \(N >= 1\)$"):
        model(torch.zeros(1, 0, dtype=torch.long))


def test_a_meta_model_takes_ids_on_any_device():
    model = GPT(GPTConfig(**SMALL)).to("meta")
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 11)


# --- counting -----------------------------------------------------------------------------

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
    config = GPTConfig(**SMALL, tie_weights=False)
    model = build_without_weights(config)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert count_parameters(model) == exact_parameters(config)
    assert isinstance(model, GPT) and model.config is config


# --- the configuration's own checks ---------------------------------------------------------

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


# --- which path runs: fast=False is the course's own modules, fast=True the fused kernels ------

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
        model = GPT(GPTConfig(**SMALL)).eval()
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
    model = GPT(GPTConfig(**SMALL, dropout=0.1))
    with pytest.raises(RuntimeError, match=r"dropout would change its outputs: call model.eval\(\) first "
                                           r"\(generate\(\) does\)$"):
        model.forward_cached(torch.zeros(1, 2, dtype=torch.long), KVCache.for_model(model, 1))
    with pytest.raises(TypeError, match=r"^cache is a NoneType, expected a KVCache "
                                        r"\(KVCache.for_model\(model, batch_size\)\)$"):
        model.eval().forward_cached(torch.zeros(1, 2, dtype=torch.long), None)


def test_ids_on_another_device_than_the_model_are_named():
    # No second device on a CPU-only machine: the model reports its weights on cuda:0 (all that
    # _check_ids reads), and the ids stay on the CPU. The refusal comes before any computation.
    model = GPT(GPTConfig(**SMALL))
    fake_weight = type("FakeWeight", (), {"device": torch.device("cuda", 0)})()
    object.__setattr__(model, "lm_head", type("FakeHead", (), {"weight": fake_weight})())
    with pytest.raises(ValueError, match=r"^token_ids is on cpu and the model on cuda:0: move the ids "
                                         r"with token_ids.to\('cuda:0'\)$"):
        model(torch.zeros(1, 3, dtype=torch.long))


def test_head_dim_is_an_int():
    """head_dim sizes tensors (the KV cache, the attention's split): a float would not do."""
    for config in (GPTConfig(), GPTConfig(n_heads=3, d_model=12), GPTConfig(**SMALL)):
        assert type(config.head_dim) is int and config.head_dim * config.n_heads == config.d_model


def test_forward_cached_takes_the_fast_path_by_default():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL)).eval()
    calls = _spy_forwards(model)
    cache = KVCache.for_model(model, 1)
    model.forward_cached(torch.tensor([[1, 2, 3]]), cache)
    assert calls == {"ln_f": 0, "blocks": []} and cache.length == 3
