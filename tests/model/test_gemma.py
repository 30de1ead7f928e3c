"""Gemma 3's text decoder (helpers.model.gemma) against transformers' Gemma3ForCausalLM."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

from helpers.model import gemma as gemma_module
from helpers.model.gemma import (
    GemmaAttention,
    GemmaConfig,
    GemmaGPT,
    config_from_gemma3,
    from_gemma3,
    gemma_norm,
    gemma_rope,
)
from helpers.model.sliding import banded_mask

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


# helpers.model.gemma: the refusals read in full, the model at its edge lengths (one token, the
# whole context), in float64 and bfloat16, and the attention mask moved to the input's device.
#
#

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


def test_the_norm_names_a_bad_offset_in_full():
    assert message(ValueError, lambda: gemma_norm(torch.randn(2, 8), torch.zeros(2, 8), 1e-6)) == \
        "offset is torch.Size([2, 8]), expected a (D,) tensor"
    assert message(ValueError, lambda: gemma_norm(torch.randn(2, 8), [0.0] * 8, 1e-6)) == \
        "offset is list, expected a (D,) tensor"
    assert message(TypeError, lambda: gemma_norm([[1.0] * 8], torch.zeros(8), 1e-6)) == \
        "x is a list, expected a torch.Tensor (..., 8)"


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_the_norm_keeps_the_inputs_dtype(dtype):
    x, offset = torch.randn(3, 8, dtype=torch.float64).to(dtype), torch.full((8,), 0.5)
    out = gemma_norm(x, offset.to(dtype), 1e-6)
    assert out.dtype == dtype
    expected = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * 1.5
    torch.testing.assert_close(out.double(), expected, atol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_the_attention_names_its_input():
    table = gemma_rope(SMALL, "local", 6)
    assert message(ValueError, lambda: GemmaAttention(SMALL, "local")(torch.randn(1, 4, 47), table)) == (
        "x has shape (1, 4, 47), expected (..., 48): the last dimension holds each token's "
        "d_model = 48 features")


def test_the_mask_goes_to_the_inputs_device(monkeypatch):
    moved = []

    class Mask:  # stands for banded_mask's tensor, recording where it is sent
        def __init__(self, mask):
            self.mask = mask

        def to(self, device):
            moved.append(device)
            return self.mask.to(device)

    monkeypatch.setattr(gemma_module, "banded_mask", lambda n, window: Mask(banded_mask(n, window)))
    x = torch.randn(1, 5, 48)
    GemmaAttention(SMALL, "local")(x, gemma_rope(SMALL, "local", 6))
    assert moved == [x.device]


@pytest.mark.parametrize("length", [1, 6])  # one token; the whole context
def test_the_model_takes_one_token_and_the_whole_context(length):
    model = small_model()
    ids = torch.arange(length)[None] % 13
    logits = model(ids)
    assert logits.shape == (1, length, 13) and torch.isfinite(logits).all()
    assert message(ValueError, lambda: model(torch.zeros(1, 7, dtype=torch.long))) == \
        "token_ids has shape (1, 7), expected (B, N) with 1 <= N <= 6"


def test_the_embedding_is_scaled_by_sqrt_d_in_the_models_dtype():
    model = small_model(torch.float64)
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    ids = torch.tensor([[1, 4, 2]])
    logits = model(ids)
    assert logits.dtype == torch.float64
    assert torch.equal(seen[0], model.embed(ids) * math.sqrt(48))  # sqrt(48) in float64, not float32


def test_a_bfloat16_model_runs_in_bfloat16():
    model = small_model(torch.bfloat16)
    logits = model(torch.tensor([[1, 4, 2, 0]]))
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), small_model()(torch.tensor([[1, 4, 2, 0]])),
                               atol=0.3, rtol=0.1)


def test_the_loader_names_one_leftover_and_an_untied_head():
    model = small_model()
    state = our_state(model)
    loaded = from_gemma3(state, SMALL)
    assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), model.parameters(), strict=True))
    extra = dict(state, **{"model.layers.2.mlp.up_proj.weight": torch.zeros(16, 48)})
    assert message(ValueError, lambda: from_gemma3(extra, SMALL)) == (
        "state_dict has 1 entries the model has no place for, e.g. 'model.layers.2.mlp.up_proj.weight': "
        "expected 2 layers")
    untied = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"] + 1})
    assert message(ValueError, lambda: from_gemma3(untied, SMALL)) == \
        "state_dict['lm_head.weight'] differs from the embedding, expected them tied"
    tied = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"].clone()})
    from_gemma3(tied, SMALL)  # saved tied: accepted
    assert dataclasses.replace(SMALL) == SMALL


def test_the_loader_refuses_a_config_of_another_kind():
    from helpers.model.modern import ModernConfig
    assert message(TypeError, lambda: from_gemma3({}, ModernConfig())) == \
        "config is a ModernConfig, expected a GemmaConfig (config_from_gemma3)"


def hf_config(**fields) -> SimpleNamespace:
    """A Gemma3TextConfig's attributes, every size unlike GemmaConfig's defaults. Only the sizes
    are set: the optional flags (softcapping, biases, ...) are absent, as in older configs."""
    sizes = dict(vocab_size=50, max_position_embeddings=40, hidden_size=32, num_attention_heads=6,
                 num_key_value_heads=3, head_dim=8, intermediate_size=24, sliding_window=5,
                 query_pre_attn_scalar=12, rms_norm_eps=1e-5,
                 layer_types=["sliding_attention"] * 3 + ["full_attention"],
                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                                  "full_attention": {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0}})
    return SimpleNamespace(**{**sizes, **fields})

EXPECTED = GemmaConfig(vocab_size=50, context_length=40, d_model=32, n_heads=6, n_kv_heads=3,
                       head_dim=8, mlp_hidden=24, kinds=("local",) * 3 + ("global",), window=5,
                       query_scale=12.0, local_base=20000.0, global_base=5e5, global_rope_factor=4.0,
                       norm_eps=1e-5)


def test_every_gemma3_field_reaches_the_config():
    assert config_from_gemma3(hf_config()) == EXPECTED
    flags = dict(attn_logit_softcapping=None, final_logit_softcapping=None, attention_bias=None,
                 use_bidirectional_attention=0, hidden_activation="gelu_pytorch_tanh",
                 tie_word_embeddings=1)  # falsy and truthy values count as the flags they stand for
    assert config_from_gemma3(hf_config(**flags)) == EXPECTED  # tests/model/test_gemma.py reads real configs


def test_the_rope_factor_counts_only_for_linear_scaling():
    rope = {"sliding_attention": {"rope_theta": 20000.0},  # no rope_type: the default
            "full_attention": {"rope_type": "default", "rope_theta": 5e5, "factor": 4.0}}
    assert config_from_gemma3(hf_config(rope_parameters=rope)).global_rope_factor == 1.0
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 5e5}}  # no factor: 1
    assert config_from_gemma3(hf_config(rope_parameters=rope)).global_rope_factor == 1.0
    rope = {"sliding_attention": {"rope_theta": 20000.0}, "full_attention": {"rope_theta": 5e5}}
    assert config_from_gemma3(hf_config(rope_parameters=rope)) == \
        dataclasses.replace(EXPECTED, global_rope_factor=1.0)


@pytest.mark.parametrize("name, value, expected", [
    ("attention_bias", True, False), ("use_bidirectional_attention", True, False),
    ("tie_word_embeddings", False, True), ("hidden_activation", "gelu", "gelu_pytorch_tanh"),
    ("final_logit_softcapping", 30.0, None),
])
def test_what_the_course_model_lacks_is_named_in_full(name, value, expected):
    assert message(ValueError, lambda: config_from_gemma3(hf_config(**{name: value}))) == (
        f"{name} is {value!r}, expected {expected!r}: the course's Gemma model does not have it")


def test_rope_types_the_model_lacks_are_named_in_full():
    for kind in ("sliding_attention", "full_attention"):
        rope = dict(hf_config().rope_parameters, **{kind: {"rope_type": "yarn", "rope_theta": 1e4}})
        assert message(ValueError, lambda rope=rope: config_from_gemma3(hf_config(rope_parameters=rope))) == (
            f"rope_parameters[{kind!r}] has rope_type 'yarn', expected 'default' or 'linear'")
    rope = dict(hf_config().rope_parameters,
                sliding_attention={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0})
    assert message(ValueError, lambda: config_from_gemma3(hf_config(rope_parameters=rope))) == \
        "rope_parameters['sliding_attention'] is scaled, expected the default RoPE"


def test_an_unknown_layer_type_is_named():
    layers = ["sliding_attention", "chunked_attention"]
    assert message(ValueError, lambda: config_from_gemma3(hf_config(layer_types=layers))) == \
        "kinds[i] is 'chunked_attention', expected one of 'local', 'global'"


def test_the_config_refusals_in_full():
    assert message(ValueError, lambda: GemmaConfig(kinds=())) == \
        "kinds is empty, expected 'local' or 'global' for each layer"
    assert message(ValueError, lambda: GemmaConfig(kinds=("local", "loca"))) == \
        "kinds[i] is 'loca', expected one of 'local', 'global'"
    for value in (math.inf, 0.0, -1.0):
        assert message(ValueError, lambda value=value: GemmaConfig(query_scale=value)) == \
            f"query_scale is {value!r}, expected a finite number > 0"
    assert message(ValueError, lambda: GemmaConfig(global_rope_factor=0.5)) == \
        "global_rope_factor is 0.5, expected >= 1 (1: no scaling; Gemma 3 4B: 8)"


def test_the_pieces_name_their_arguments_in_full():
    from helpers.model.gemma import GemmaBlock, GemmaNorm
    config = GemmaConfig(context_length=8)
    expected = "kind is 'loca', expected one of 'local', 'global'"
    for make in (lambda: gemma_rope(config, "loca", 8), lambda: GemmaAttention(config, "loca"),
                 lambda: GemmaBlock(config, "loca")):
        assert message(ValueError, make) == expected
    assert message(ValueError, lambda: gemma_rope(config, "local", 0)) == \
        "n_positions is 0, expected a positive int"
    assert message(ValueError, lambda: GemmaNorm(0, 1e-6)) == "dim is 0, expected a positive int"


def test_the_rope_tables_are_computed_in_float64():
    config = GemmaConfig(head_dim=8, local_base=10_000.0, global_base=1e6, global_rope_factor=8.0)
    for kind, base, factor in (("local", 1e4, 1.0), ("global", 1e6, 8.0)):
        table = gemma_rope(config, kind, 4096)
        inv = [base ** (-i / 8) / factor for i in range(0, 8, 2)]
        angles = torch.tensor([[p * f for f in inv] for p in range(4096)], dtype=torch.float64)
        torch.testing.assert_close(table.cos, angles.cos().float(), atol=1e-6, rtol=0)
        torch.testing.assert_close(table.sin, angles.sin().float(), atol=1e-6, rtol=0)
