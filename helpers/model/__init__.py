"""The model: from token ids to logits, every piece of the decoder and its KV cache.

Built in notebooks 2-7, 9 and 12 on top of `helpers.text`; nothing here imports training, flash,
scale or lab. The model owns both of its forwards: the plain one and the fused one.

    embeddings   one-hot, token embeddings, learned and sinusoidal positions         nb 2
    attention    softmax, scaled dot-product attention, the attention layer,
                 causal/padding/sparse masks                                         nb 3, 4
    multihead    multi-head attention (two styles, GQA/MQA), the KV-cache size       nb 5
    layers       LayerNorm, feed-forward networks (GELU, SwiGLU), the Pre-LN block   nb 6
    fused        the same block with PyTorch's fused kernels (GPT.forward(fast=True)) nb 7
    kv_cache     every layer's keys and values, preallocated                         nb 7
    gpt          the GPT: config, model, parameter counts                            nb 7
    generation   sampling (temperature, top-k) and the generation loop               nb 7
    checkpoints  save_checkpoint / load_checkpoint, safely (weights_only)            nb 7
    gpt2         GPT-2's published checkpoints loaded into the course's GPT          nb 7
    modern       RoPE, ALiBi, RMSNorm, SwiGLU width, the GQA decoder                 nb 9
    llama        a Hugging Face Llama's weights loaded into the modern decoder       nb 9
    moe          router (three conventions), experts as a loop and sorted, capacity,
                 the Switch loss, DeepSeek-V3's bias, the MoE layer                  nb 12
    mla          multi-head latent attention, naive and absorbed; cache sizes       nb 12
    sliding      banded mask, ring-buffer KV cache, Gemma 3's pattern, QK-norm,
                 RoPE scaling (Llama 3, YaRN)                                        nb 12
    frontier     the decoder with MoE, QK-norm, windows; Qwen3-MoE weights          nb 12
    deepseek     MLA + sigmoid-routed MoE; DeepSeek-V3 weights                      nb 12
    gemma        Gemma 3's text decoder (four norms, GeGLU, local/global RoPE)       nb 12
"""
