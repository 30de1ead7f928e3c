"""helpers.model.gemma: the refusals read in full, the model at its edge lengths (one token, the
whole context), in float64 and bfloat16, and the attention mask moved to the input's device.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_gemma.py lets through.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers.model.gemma import (
    GemmaConfig,
    GemmaGPT,
    from_gemma3,
)

SMALL = GemmaConfig(vocab_size=13, context_length=6, d_model=48, n_heads=2, n_kv_heads=1, head_dim=8,
                    mlp_hidden=16, kinds=("local", "global"), window=2)


def message(error_type, call) -> str:
    with pytest.raises(error_type) as info:
        call()
    return str(info.value)


def small_model(dtype: torch.dtype = torch.float32) -> GemmaGPT:
    torch.manual_seed(0)
    model = GemmaGPT(SMALL)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.to(dtype)


def our_state(model: GemmaGPT) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' Gemma3ForCausalLM names."""
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    theirs = {"pre_attn": "input_layernorm", "post_attn": "post_attention_layernorm",
              "pre_mlp": "pre_feedforward_layernorm", "post_mlp": "post_feedforward_layernorm",
              "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    out = {}
    for name, p in model.named_parameters():
        if name in names:
            out[names[name]] = p.detach()
            continue
        _, i, *rest = name.split(".")
        part = ".".join(rest[:-1])
        part = theirs.get(part, part.replace("attn.", "self_attn."))
        out[f"model.layers.{i}.{part}.weight"] = p.detach()
    return out


def test_the_embedding_is_scaled_by_sqrt_d_in_the_models_dtype():
    model = small_model(torch.float64)
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    ids = torch.tensor([[1, 4, 2]])
    logits = model(ids)
    assert logits.dtype == torch.float64
    assert torch.equal(seen[0], model.embed(ids) * math.sqrt(48))  # sqrt(48) in float64, not float32


def test_the_loader_refuses_a_config_of_another_kind():
    from helpers.model.modern import ModernConfig
    assert message(TypeError, lambda: from_gemma3({}, ModernConfig())) == \
        "config is a ModernConfig, expected a GemmaConfig (config_from_gemma3)"
