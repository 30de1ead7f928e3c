"""helpers.model.llama: every LlamaConfig field read at a non-default value, the three places the
RoPE base can come from, the refusals (RoPE scaling, activation, wrong config) read in full, and a
tied Llama's checkpoint loaded.


"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from helpers.model.gpt import GPTConfig
from helpers.model.llama import config_from_llama, from_llama_state_dict, llama_key_map
from helpers.model.modern import ModernConfig, ModernGPT

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402  (loaded once, at collection)

# Every size differs from ModernConfig's default, so a field dropped on the way is seen.
SIZES = dict(vocab_size=37, hidden_size=32, intermediate_size=72, num_hidden_layers=3,
             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=24,
             rms_norm_eps=1e-5, tie_word_embeddings=True)
EXPECTED = ModernConfig(vocab_size=37, context_length=24, n_layers=3, n_heads=2, n_kv_heads=1,
                        d_model=32, mlp_hidden=72, rope_base=500000.0, norm_eps=1e-5, tie_weights=True)


def old_style(**fields) -> SimpleNamespace:
    """A config as transformers 4 wrote it: no rope_parameters, rope_theta an attribute."""
    return SimpleNamespace(**SIZES, **fields)


def test_every_llama_config_field_reaches_the_modern_config():
    config = LlamaConfig(**SIZES, rope_parameters={"rope_type": "default",
                                                                "rope_theta": 500000.0})
    assert config_from_llama(config) == EXPECTED
    untied = LlamaConfig(**{**SIZES, "tie_word_embeddings": False})
    assert config_from_llama(untied).tie_weights is False
    assert config_from_llama(untied).rope_base == 10000.0  # transformers' own default, read


def test_rope_base_from_an_attribute_or_the_default():
    assert config_from_llama(old_style(rope_theta=500000.0)) == EXPECTED
    assert config_from_llama(old_style(rope_theta=500000.0, rope_parameters=None)) == EXPECTED
    assert config_from_llama(old_style()).rope_base == 10000.0  # neither: RoPE's usual base
    # rope_parameters wins over a stale attribute
    both = old_style(rope_theta=20000.0, rope_parameters={"rope_theta": 500000.0})
    assert config_from_llama(both) == EXPECTED
    assert config_from_llama(old_style(rope_theta=500000.0, rope_scaling=None, hidden_act="silu")) == EXPECTED


@pytest.mark.parametrize("make", [
    lambda: LlamaConfig(**SIZES, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    lambda: old_style(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0}),
    lambda: old_style(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
    lambda: old_style(rope_scaling={"type": "llama3", "factor": 8.0}),  # transformers 4.3x's key
])
def test_rope_scaling_is_refused(make):
    with pytest.raises(ValueError) as info:
        config_from_llama(make())
    assert str(info.value) == ("llama_config has rope_type = 'llama3', expected 'default': "
                               "ModernGPT's RoPE has no frequency scaling, so its logits would differ")


def test_a_llama_with_scaling_turns_other_angles_than_without():
    """Why the refusal: llama3 scaling changes transformers' RoPE angles, which ModernGPT's lack."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaled_config = LlamaConfig(**SIZES, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    x, positions = torch.zeros(1, 20, 32), torch.arange(20)[None]
    cos_plain, _ = LlamaRotaryEmbedding(LlamaConfig(**SIZES))(x, positions)
    cos_scaled, _ = LlamaRotaryEmbedding(scaled_config)(x, positions)
    assert (cos_plain - cos_scaled).abs().max() > 1e-2


def test_an_activation_other_than_silu_is_refused():
    with pytest.raises(ValueError) as info:
        config_from_llama(LlamaConfig(**SIZES, hidden_act="gelu"))
    assert str(info.value) == ("llama_config has hidden_act = 'gelu', expected 'silu': ModernGPT's "
                               "SwiGLU gates with SiLU, so its logits would differ")


def test_a_tied_llama_loads_and_gives_its_logits():
    """transformers saves a tied lm_head.weight too (equal to the embedding): it is accepted."""
    torch.manual_seed(1)
    reference = LlamaForCausalLM(LlamaConfig(
        **SIZES, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})).eval()
    state = reference.state_dict()
    assert "lm_head.weight" in state
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)  # older versions' buffer
    ours = from_llama_state_dict(state, config_from_llama(reference.config)).eval()
    assert ours.lm_head.weight is ours.embed.weight
    ids = torch.randint(0, 37, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), reference(ids).logits, atol=1e-5, rtol=1e-5)


def test_the_loader_refuses_a_config_of_another_kind():
    with pytest.raises(TypeError) as info:
        from_llama_state_dict({}, GPTConfig())
    assert str(info.value) == "config is a GPTConfig, expected a ModernConfig (config_from_llama)"


def _state(config: ModernConfig) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    names = llama_key_map(config)
    return {names[ours]: p.detach() for ours, p in ModernGPT(config).named_parameters()}


def test_weights_left_over_are_named_three_at_most():
    small = ModernConfig(**{**EXPECTED.__dict__, "n_layers": 2})
    state = _state(EXPECTED)  # three layers for a two-layer config: nine weights too many
    extra = sorted(name for name in state if name.startswith("model.layers.2."))
    assert len(extra) == 9
    with pytest.raises(ValueError) as info:
        from_llama_state_dict(state, small)
    assert str(info.value) == (f"state_dict has weights the config has no place for: {extra[:3]} "
                               "(config: n_layers = 2), expected a LlamaForCausalLM of these sizes")


@pytest.mark.parametrize("tie", [True, False])
def test_a_missing_weight_is_named_with_what_was_expected(tie):
    config = ModernConfig(**{**EXPECTED.__dict__, "tie_weights": tie})
    state = _state(config)
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError) as info:
        from_llama_state_dict(state, config)
    untied = "" if tie else " and an untied lm_head"
    assert info.value.args[0] == ("state_dict has no 'model.layers.1.mlp.up_proj.weight', expected "
                                  "it for blocks.1.mlp.up.weight (a LlamaForCausalLM with "
                                  f"n_layers = 3{untied})")


MODERN = ModernConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, n_kv_heads=1, d_model=8)


@pytest.mark.parametrize("spoil, error, message", [
    (lambda w: w.round().long(), TypeError, r"has dtype torch.int64, expected a floating-point tensor"),
    (lambda w: w.tolist(), TypeError, r"has a list, expected a floating-point tensor"),
    (lambda w: w.clone().fill_(float("nan")), ValueError, r"holds NaN or inf, expected finite weights"),
])
def test_llama_weights_that_are_not_finite_floats_are_refused_by_name(spoil, error, message):
    torch.manual_seed(0)
    model = ModernGPT(MODERN)
    names = llama_key_map(MODERN)
    state = {names[ours]: p.detach() for ours, p in model.named_parameters()}
    first = names[next(iter(dict(model.named_parameters())))]
    state[first] = spoil(state[first])
    with pytest.raises(error, match=re.escape(f"state_dict[{first!r}]") + " " + message):
        from_llama_state_dict(state, MODERN)
