"""helpers.model.llama: every LlamaConfig field read at a non-default value, the three places the
RoPE base can come from, the refusals (RoPE scaling, activation, wrong config) read in full, and a
tied Llama's checkpoint loaded.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_modern.py and test_bad_input_newer.py let through.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers.model.llama import config_from_llama
from helpers.model.modern import ModernConfig

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency")
from transformers import LlamaConfig  # noqa: E402  (loaded once, at collection)

# Every size differs from ModernConfig's default, so a field dropped on the way is seen.
SIZES = dict(vocab_size=37, hidden_size=32, intermediate_size=72, num_hidden_layers=3,
             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=24,
             rms_norm_eps=1e-5, tie_word_embeddings=True)
EXPECTED = ModernConfig(vocab_size=37, context_length=24, n_layers=3, n_heads=2, n_kv_heads=1,
                        d_model=32, mlp_hidden=72, rope_base=500000.0, norm_eps=1e-5, tie_weights=True)


def old_style(**fields) -> SimpleNamespace:
    """A config as transformers 4 wrote it: no rope_parameters, rope_theta an attribute."""
    return SimpleNamespace(**SIZES, **fields)


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
