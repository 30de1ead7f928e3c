"""A Hugging Face Llama's weights in the course's ModernGPT (notebook 9, section 6).

    config_from_llama       a ModernConfig with the sizes of a transformers.LlamaConfig; RoPE
                            scaling or an activation ModernGPT lacks is refused
    llama_key_map           every ModernGPT parameter name -> Hugging Face's name for it
    from_llama_state_dict   a LlamaForCausalLM's state_dict() loaded into a ModernGPT; a missing
                            weight, a wrong shape or a weight left over (more layers than the
                            config) is refused, naming it

Both models pair RoPE features the "rotate half" way, so q_proj and k_proj load as they are.
tests/model/test_modern.py checks the logits against transformers' own Llama.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from helpers.model.modern import ModernConfig, ModernGPT


def config_from_llama(llama_config) -> ModernConfig:
    """A ModernConfig with the sizes of a `transformers.LlamaConfig` (read by attribute name).

    Raises ValueError for a Llama that ModernGPT would compute differently, whose weights would
    load and then give other logits: RoPE with frequency scaling (rope_type 'linear', 'llama3',
    'yarn', ...: Llama 3.1 and later) or an activation other than SiLU.
    """
    rope = getattr(llama_config, "rope_parameters", None) or {}  # transformers >= 5
    theta = rope.get("rope_theta", getattr(llama_config, "rope_theta", 10000.0))
    scaling = rope or getattr(llama_config, "rope_scaling", None) or {}  # transformers 4: rope_scaling
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"llama_config has rope_type = {rope_type!r}, expected 'default': "
                         "ModernGPT's RoPE has no frequency scaling, so its logits would differ")
    activation = getattr(llama_config, "hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"llama_config has hidden_act = {activation!r}, expected 'silu': "
                         "ModernGPT's SwiGLU gates with SiLU, so its logits would differ")
    return ModernConfig(
        vocab_size=llama_config.vocab_size, context_length=llama_config.max_position_embeddings,
        n_layers=llama_config.num_hidden_layers, n_heads=llama_config.num_attention_heads,
        n_kv_heads=llama_config.num_key_value_heads, d_model=llama_config.hidden_size,
        mlp_hidden=llama_config.intermediate_size, rope_base=float(theta),
        norm_eps=llama_config.rms_norm_eps, tie_weights=bool(llama_config.tie_word_embeddings))


# Hugging Face's names -> ours, for one layer ({} is the layer number).
_LLAMA_LAYER_NAMES = {
    "input_layernorm.weight": "norm1.weight", "post_attention_layernorm.weight": "norm2.weight",
    "self_attn.q_proj.weight": "attn.q_proj.weight", "self_attn.k_proj.weight": "attn.k_proj.weight",
    "self_attn.v_proj.weight": "attn.v_proj.weight", "self_attn.o_proj.weight": "attn.out_proj.weight",
    "mlp.gate_proj.weight": "mlp.gate.weight", "mlp.up_proj.weight": "mlp.up.weight",
    "mlp.down_proj.weight": "mlp.down.weight",
}


def llama_key_map(config: ModernConfig) -> dict[str, str]:
    """Every ModernGPT parameter name -> the name a Hugging Face LlamaForCausalLM gives it."""
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not config.tie_weights:
        names["lm_head.weight"] = "lm_head.weight"
    for layer in range(config.n_layers):
        for theirs, ours in _LLAMA_LAYER_NAMES.items():
            names[f"blocks.{layer}.{ours}"] = f"model.layers.{layer}.{theirs}"
    return names


@torch.no_grad()
def from_llama_state_dict(state_dict: Mapping[str, Tensor], config: ModernConfig) -> ModernGPT:
    """A ModernGPT holding the weights of a Hugging Face LlamaForCausalLM's `state_dict()`.

    Raises KeyError naming a missing weight, ValueError naming a weight of the wrong shape.
    Both models use the rotate-half pairing, so q_proj and k_proj load without a permutation.
    """
    if not isinstance(config, ModernConfig):
        raise TypeError(f"config is a {type(config).__name__}, expected a ModernConfig (config_from_llama)")
    names = llama_key_map(config)  # leftovers are refused, not dropped, as the GPT-2 loader does
    tied = {"lm_head.weight"} if config.tie_weights else set()  # saved anyway, equal to the embedding
    extra = sorted(k for k in set(state_dict) - set(names.values()) - tied
                   if not k.endswith("rotary_emb.inv_freq"))  # a buffer older versions saved
    if extra:
        raise ValueError(f"state_dict has weights the config has no place for: {extra[:3]} (config: "
                         f"n_layers = {config.n_layers}), expected a LlamaForCausalLM of these sizes")
    model = ModernGPT(config)
    ours = dict(model.named_parameters())
    for our_name, their_name in names.items():
        if their_name not in state_dict:
            raise KeyError(f"state_dict has no {their_name!r}, expected it for {our_name} "
                           f"(a LlamaForCausalLM with n_layers = {config.n_layers}"
                           f"{'' if config.tie_weights else ' and an untied lm_head'})")
        weight = state_dict[their_name]
        if not isinstance(weight, Tensor) or not weight.is_floating_point():
            got = f"dtype {weight.dtype}" if isinstance(weight, Tensor) else f"a {type(weight).__name__}"
            raise TypeError(f"state_dict[{their_name!r}] has {got}, expected a floating-point "
                            "tensor (integer weights are a quantized or wrong checkpoint)")
        if not torch.isfinite(weight).all():
            raise ValueError(f"state_dict[{their_name!r}] holds NaN or inf, expected finite weights")
        if tuple(weight.shape) != tuple(ours[our_name].shape):
            raise ValueError(f"state_dict[{their_name!r}] has shape {tuple(weight.shape)}, expected "
                             f"{tuple(ours[our_name].shape)} for {our_name}: the config's sizes differ")
        ours[our_name].copy_(weight)
    return model
