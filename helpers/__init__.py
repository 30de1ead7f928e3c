"""Helpers for the Transformer course, one module per idea, in the order the course meets them.

    corpus        the course corpus (a story grammar) and its well-formedness checker
    tokenizers    character, byte-level BPE, WordPiece and Unigram tokenizers, from scratch
    embeddings    one-hot, token embeddings, learned and sinusoidal positions
    attention     softmax, scaled dot-product attention, causal/padding/sparse masks
    layers        multi-head attention (two styles, GQA/MQA), LayerNorm, FFN, the Pre-LN block
    gpt           the GPT: config, model, parameter counts, generation, KV cache
    modern        the modern decoder: RoPE, ALiBi, RMSNorm, SwiGLU width, GQA model, Llama loader
    train         the fast CPU trainer: batches, AdamW, schedule, bf16, one weight buffer, checkpoints
    flash         online softmax and tiled FlashAttention in PyTorch (forward and backward)
    flash_triton  the same algorithm as Triton kernels, forward and backward (GPU, or the interpreter)
    checks        the argument checks they share: positive_int(name, value), boolean(...), ...

and, at the side, used by the notebooks and never by the model code:

    environment   the set-up cell: seeds, device, figure style
    plots         projector-friendly figures and labelled heat maps
    widgets       Explorer: controls that redraw a figure, with a static fallback
    exercises     checked exercises with hints
    timing        wall-clock timing printed in a form the tests can sanitise

Modules are imported on demand (`from helpers.tokenizers import BPETokenizer`), so importing
`helpers` alone is instant and pulls in nothing heavy.
"""

__version__ = "0.1.0"
