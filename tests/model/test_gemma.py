"""Gemma 3's text decoder (helpers.model.gemma) against transformers' Gemma3ForCausalLM."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from helpers.model.gemma import GemmaConfig, GemmaGPT, config_from_gemma3, from_gemma3, gemma_norm

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")


def tiny_gemma(global_rope: dict | None = None, layers: int = 6, **sizes):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(0)
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": global_rope or {"rope_type": "default", "rope_theta": 1e6}}
    config = Gemma3TextConfig(**({
        "vocab_size": 50, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "query_pre_attn_scalar": 8, "sliding_window": 4, "max_position_embeddings": 32,
        "rope_parameters": rope} | sizes))
    hf = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():  # the norms' offsets start at 0: move them so they matter
            p.normal_(0, 0.2)
    return config, hf


@needs_transformers
@pytest.mark.parametrize("global_rope", [None, {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}])
def test_gemma3_logits_equal_transformers(global_rope):
    hf_config, hf = tiny_gemma(global_rope)
    config = config_from_gemma3(hf_config)
    # five local layers then a global one, and a window shorter than the sequence, so the band matters
    assert config.kinds == ("local",) * 5 + ("global",) and config.window == 4
    assert config.global_rope_factor == (8.0 if global_rope else 1.0)
    ids = torch.randint(0, 50, (2, 12))
    ours = from_gemma3(hf.state_dict(), config).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


@needs_transformers
@pytest.mark.parametrize("change", [dict(window=12), dict(query_scale=9.0), dict(global_rope_factor=2.0),
                                    dict(kinds=("local",) * 6)])
def test_each_gemma_difference_matters_at_these_sizes(change):
    """The equality above would catch a wrong window, scale, RoPE factor or layer pattern."""
    hf_config, hf = tiny_gemma({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6})
    wrong = dataclasses.replace(config_from_gemma3(hf_config), **change)
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        gap = (from_gemma3(hf.state_dict(), wrong)(ids) - hf(ids).logits).abs().max()
    assert gap > 1e-3


def test_the_norm_stores_its_gain_as_an_offset_from_one():
    x = torch.randn(3, 8)
    assert torch.equal(gemma_norm(x, torch.zeros(8), 1e-6), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(gemma_norm(x, torch.ones(8), 1e-6), 2 * gemma_norm(x, torch.zeros(8), 1e-6))


@pytest.mark.parametrize("change, message", [
    (dict(kinds=()), "kinds is empty"),
    (dict(kinds=("local", "loca")), "kinds"),
    (dict(window=0), "window"),
    (dict(query_scale=float("nan")), "query_scale is nan"),
    (dict(global_rope_factor=0.5), "global_rope_factor is 0.5"),
    (dict(n_heads=3), "not divisible"),
    (dict(head_dim=7), "even number"),
])
def test_bad_config_raises_a_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        GemmaConfig(**change)


def test_bad_token_ids_raise_a_clear_error():
    model = GemmaGPT(GemmaConfig(context_length=8))
    with pytest.raises(ValueError, match="expected \\(B, N\\) with 1 <= N <= 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="token"):
        model(torch.full((1, 3), 64))


@needs_transformers
@pytest.mark.parametrize("sizes, message", [
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping is 30.0"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping is 50.0"),
    (dict(hidden_activation="gelu"), "hidden_activation is 'gelu'"),
])
def test_a_config_the_course_model_lacks_is_refused(sizes, message):
    hf_config, _ = tiny_gemma(layers=1, **sizes)
    with pytest.raises(ValueError, match=message):
        config_from_gemma3(hf_config)


@needs_transformers
def test_weights_the_model_has_no_place_for_are_refused():
    hf_config, hf = tiny_gemma(layers=2)
    config = config_from_gemma3(hf_config)
    short = dataclasses.replace(config, kinds=config.kinds[:1])
    with pytest.raises(ValueError, match="no place for, e.g. 'model.layers.1"):
        from_gemma3(hf.state_dict(), short)
    untied = dict(hf.state_dict()) | {"lm_head.weight": torch.zeros(50, 32)}
    with pytest.raises(ValueError, match="expected them tied"):
        from_gemma3(untied, config)
    missing = {k: v for k, v in hf.state_dict().items() if "k_norm" not in k}
    with pytest.raises(KeyError, match="k_norm"):
        from_gemma3(missing, config)


def test_the_pieces_check_their_arguments():
    from helpers.model.gemma import GemmaAttention, GemmaBlock, GemmaNorm, gemma_rope
    config = GemmaConfig(context_length=8)
    with pytest.raises(ValueError, match="offset is"):
        gemma_norm(torch.randn(2, 8), torch.zeros(2, 8), 1e-6)
    with pytest.raises(ValueError, match="x has shape \\(2, 7\\), expected \\(..., 8\\)"):
        gemma_norm(torch.randn(2, 7), torch.zeros(8), 1e-6)
    with pytest.raises(ValueError, match="eps"):
        gemma_norm(torch.randn(2, 8), torch.zeros(8), 0.0)
    with pytest.raises(ValueError, match="dim"):
        GemmaNorm(0, 1e-6)
    for make in (lambda: gemma_rope(config, "sliding", 8), lambda: GemmaAttention(config, "loca"),
                 lambda: GemmaBlock(config, "")):
        with pytest.raises(ValueError, match="kind"):
            make()
    with pytest.raises(ValueError, match="n_positions"):
        gemma_rope(config, "local", 0)
    table = gemma_rope(config, "local", 8)
    with pytest.raises(ValueError, match="expected \\(B, N, D\\) with N <= 8"):
        GemmaAttention(config, "local")(torch.randn(1, 9, 64), table)
    with pytest.raises(ValueError, match="expected \\(..., 64\\)"):
        GemmaAttention(config, "global")(torch.randn(1, 4, 63), table)
