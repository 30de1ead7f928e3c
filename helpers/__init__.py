"""Helpers for the Transformer course, one module per idea, in the order the course meets them.

Each module's docstring names the notebook section that derives it; the notebook writes the
idea in plain code first, then switches to the helper and checks the two agree.

    corpus        the small course corpus (a story grammar) and its checker             nb 1, 2, 10
    lexicon       word stems and English spelling rules (plurals, pasts, -er/-est, un-)
    corpus_rich   the rich corpus: tales, dialogues, diaries from the lexicon; checker   nb 1, 7
    tokenizers    character tokenizer and the text checks the tokenizers share          nb 1
    bpe           byte-level BPE, from the textbook loop to the fast trainer            nb 1
    subword       WordPiece and Unigram                                                 nb 1
    embeddings    one-hot, token embeddings, learned and sinusoidal positions           nb 2
    attention     softmax, scaled dot-product attention, causal/padding/sparse masks    nb 3, 4
    multihead     multi-head attention (two styles, GQA/MQA), the KV-cache size         nb 5
    layers        LayerNorm, feed-forward networks (GELU, SwiGLU), the Pre-LN block     nb 6
    gpt           the GPT: config, model, parameter counts                              nb 7
    generation    the KV cache, sampling (temperature, top-k), generate                 nb 7
    train         batches, the learning-rate schedule, the Trainer and its History      nb 7
    checkpoints   save_checkpoint / load_checkpoint, safely (weights_only)              nb 7
    own_text      your own text: read a UTF-8 file, train the BPE and a GPT on it       nb 1, 7
    fast          the fast path beside the plain code: fused kernels, bf16 working copy,
                  one buffer for every weight, compile (equal to the plain path, tested)
    gpt2          GPT-2's checkpoints (safetensors or .bin) loaded into the course's GPT nb 7
    gpt2_tokenizer  GPT-2's vocab.json + merges.txt as a relabelled course BPE           nb 7
    flash         online softmax and tiled FlashAttention in PyTorch (forward, backward) nb 8
    flash_costs   the HBM-traffic and FLOP counts of naive and tiled attention          nb 8
    flash_triton  the same algorithm as Triton kernels (GPU, or the interpreter)         nb 8
    flash_triton_kernels  the kernels themselves, forward and backward                  nb 8
    modern        the modern decoder: RoPE, ALiBi, RMSNorm, SwiGLU width, GQA model     nb 9
    translation   the generated translation task (English -> Grammish) and its splits   nb 10
    seq2seq       encoder and decoder layers with cross-attention, beam search          nb 10
    rnn           the GRU seq2seq without attention: the bottleneck, measured           nb 10
    mlm           masked-language-model pretraining (80/10/10) and a finetuned classifier nb 10
    distributed   Workers: local processes with gloo, collectives, clean failures       nb 11
    data_parallel data parallelism by hand: all-reduce, bucketed hooks, torchrun entry  nb 11
    sharded       ZeRO-1 by hand: each rank keeps the optimizer state of its shard      nb 11
    tensor_parallel  column- and row-parallel MLP, attention heads split across ranks   nb 11
    parallelism   what each kind of parallelism splits and sends, in bytes per step     nb 11
    checks        the argument checks they share: positive_int(name, value), boolean(...), ...

and, at the side, used by the notebooks and never by the model code:

    environment   the set-up cell: seeds, device, figure style
    plots         projector-friendly figures, labelled heat maps, loss curves (LiveLossPlot)
    widgets       Explorer: controls that redraw a figure, with a static fallback
    exercises     checked exercises with hints
    timing        wall-clock timing printed in a form the tests can sanitise
    profiling     peak memory of a call, from the PyTorch profiler

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

Modules are imported on demand (`from helpers.gpt import GPT`), so importing `helpers` alone
is instant and pulls in nothing heavy.
"""

__version__ = "0.1.0"
