"""Helpers for the Transformer course, grouped by the stages of the course map.

Each module's docstring names the notebook section that derives it; the notebook writes the
idea in plain code first, then switches to the helper and checks the two agree.

    checks      the argument checks every module shares: positive_int(name, value), ...
    timing      wall-clock timing; at the top because scale measures its collectives with it
    text/       tokenizers (chars, bpe, subword, gpt2_tokenizer) and the corpora  nb 1, 7
    model/      embeddings, attention, multihead, layers, fused, kv_cache, gpt,
                generation, checkpoints, gpt2, modern (RoPE ... GQA), llama   nb 2-7, 9
                and the 2025-2026 decoder: moe, mla, sliding, frontier, deepseek nb 12
    flash/      tiled attention, Triton kernels, cost model, memory profiling    nb 8
    training/   the loop by hand (by_hand), the Trainer (trainer, guards) and its
                speed machinery (speed), the Muon optimiser (muon)               nb 7, 9
    families/   translation task, seq2seq, GRU (with attention), masked LM       nb 10
    scale/      workers and collectives, data parallel, ZeRO-1, tensor and
                expert parallel                                                  nb 11, 12
    post/       after pretraining: tasks, classify, lora, sft, dpo, grpo         nb 13
    serve/      serving: sampling, batching, paged cache, scheduler,
                speculative decoding, quantization                               nb 14
    lab/        what only notebooks use: set-up, plots, widgets, exercises, the
                notes' tables, own text

Arrows run one way: checks <- (timing, text) <- model <- (flash, training) <- (families,
scale, post, serve) <- lab <- notebooks. Nothing in model imports training; nothing below lab imports plots,
widgets or exercises; tests/course/test_layout.py draws the import graph and fails on a circle or an
arrow against this order. `timing` sits near the top rather than in lab because the scale
workers time their collectives with it; it checks its arguments with `checks`. Each subpackage's `__init__.py` lists its modules and
re-exports nothing: every name has one import path (`from helpers.model.gpt import GPT`).

The shape legend, used in every docstring and shape comment of the package:

    B     batch: sequences processed together
    N     tokens: the length of a sequence (queries); never the number of layers
    M     keys: N for self-attention, the cached or encoded length otherwise
    V     vocabulary size (vocab_size)
    D     d_model: the width of every token vector
    H     heads (n_heads); H_KV key/value heads (n_kv_heads; fewer than H: GQA, 1: MQA)
    D_H   head_dim = D / H: the width of one head
    L     n_layers: the number of blocks
    P     rows of a position table (context_length, the longest sequence)
    hidden  the MLP's inner width (4 D for GELU, about 8/3 D for SwiGLU)

Modules are imported on demand (`from helpers.model.gpt import GPT`), so importing `helpers` alone
is instant and pulls in nothing heavy.
"""

__version__ = "0.1.0"
