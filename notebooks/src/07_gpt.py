# %% [markdown] slideshow={"slide_type": "slide"}
# # 7. The full GPT
#
# Notebooks 1 to 6 built the parts: a tokenizer, embeddings, attention, masks, multi-head
# attention and the Pre-LN block. Here they become a model that writes. We assemble GPT-2's
# architecture, count its parameters to the last one, train it on the course corpus on a CPU,
# sample from it, make generation fast with a KV cache, look inside its attention, and place it
# among the three transformer families.
#
# **After this notebook you can**
# - assemble a decoder-only GPT from blocks and explain every shape of its forward pass;
# - count a GPT's parameters with `12Nd² + 2Vd` and exactly, and plan memory from the count;
# - write a training step by hand (the next-token loss, AdamW, gradient clipping, the schedule)
#   and check each piece against PyTorch's own;
# - train a small GPT on a laptop CPU and judge its output with a measurement, not by eye;
# - sample with temperature and top-k, and write a greedy decoding step;
# - write one KV-cache step by hand; explain, build and time a KV cache, compute its memory;
# - say what changes between encoder-only, decoder-only and encoder-decoder models.
#
# **It assumes** notebooks 1 to 6; the `helpers` modules they wrote are the parts used here.

# %% [setup]

# %% [markdown] slideshow={"slide_type": "notes"}
# **Opening.** Everything of notebooks 2 to 6 comes together today: embeddings, attention,
# the causal mask, multi-head, LayerNorm, the MLP and residuals. Ask the room to name the parts
# of a GPT block from memory before you show the class; write their list on the board and tick
# it off as section 1 runs.
# Tell them what they will see by the end: a model trained on their laptop in under a minute,
# sampling text, and a KV cache that makes sampling faster.

# %% slideshow={"slide_type": "fragment"}
import math
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

# Two cores, often shared with other work (a browser, a video call): one thread per product
# avoids threads waiting for each other. On a quiet machine with more cores, delete this line.
torch.set_num_threads(1)

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import causal_mask
from helpers.text.corpus_rich import (
    known_word_fraction,
    load_rich_corpus,
    rich_well_formed_fraction,
    word_forms,
)
from helpers.model.embeddings import TokenAndPositionEmbedding
from helpers.lab.exercises import check, yours_or
from helpers.lab.notes_tables import load_notes_tables
from helpers.model.layers import Block, FeedForward, LayerNorm
from helpers.model.multihead import MultiHeadAttention, merge_heads, split_heads
from helpers.lab.plots import heatmap
from helpers.timing import format_duration
from helpers.lab.sections import catch_up, refuse_untrained

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. From parts to a model (core)
#
# A decoder-only GPT is four steps:
#
# 1. **embed**: each token id becomes its row of a token table plus the row of its position in
#    a learned position table (notebook 2);
# 2. **N blocks**: each is `x + attention(LayerNorm(x))` with the causal mask, then
#    `x + FFN(LayerNorm(x))` (notebooks 3 to 6, GPT-2's Pre-LN order, GELU MLP `d -> 4d -> d`);
# 3. **a final LayerNorm**, because Pre-LN blocks leave the residual stream un-normalised;
# 4. **the output layer**: a product with a `V x d` matrix gives one score (logit) per
#    vocabulary token, at every position. GPT-2 **ties** it to the token table: the same matrix
#    reads tokens in and scores them out.
#
# The textbook section's algorithm also multiplies the token embedding by `sqrt(d)`, as the 2017
# Transformer did; GPT-2 does not, and neither do we.
#
# In plain code, with the parts of the earlier notebooks:

# %% [markdown] slideshow={"slide_type": "notes"}
# **Core.** Four steps: embed, N blocks, a final LayerNorm, the output layer. Stress weight
# tying: the same matrix reads tokens in and scores them out. Ask: "why is a final LayerNorm
# needed in a Pre-LN model?" (the residual stream is never normalised inside the blocks).

# %% slideshow={"slide_type": "fragment"}
class MiniGPT(nn.Module):
    """Decoder-only GPT from the course's parts: token ids (B, N) -> logits (B, N, V)."""

    def __init__(self, vocab_size: int, context_length: int, n_layers: int, n_heads: int,
                 d_model: int) -> None:
        super().__init__()
        self.embed = TokenAndPositionEmbedding(vocab_size, context_length, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.embed.token.weight  # weight tying: one matrix, two jobs

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(token_ids)                      # (B, N, d)
        for block in self.blocks:
            x = block(x, causal=True)                  # (B, N, d)
        return self.lm_head(self.ln_f(x))              # (B, N, V)


torch.manual_seed(0)
mini = MiniGPT(vocab_size=70, context_length=64, n_layers=2, n_heads=4, d_model=128)
print(mini.lm_head.weight is mini.embed.token.weight, "- the output matrix is the token table")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same model lives in `helpers.model.gpt` as `GPT`, configured by a dataclass, `GPTConfig`, that
# checks its numbers. `GPT` adds GPT-2's initialisation (`init_gpt2_` of notebook 6), dropout, a
# cached forward for generation (section 6) and a fast path for training (section 10). With the
# same weights it computes exactly what `MiniGPT` computes. And the config
# refuses sizes that cannot work, naming the numbers (here a width that the heads cannot share
# evenly), and the model refuses token ids outside its vocabulary:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.gpt import GPT, GPTConfig

config = GPTConfig(vocab_size=70, context_length=64, n_layers=2, n_heads=4,
                   d_model=128)  # V: section 4's characters
print(config)
model = GPT(config)
mini.load_state_dict(model.state_dict())
ids = torch.randint(0, 70, (2, 64))
assert torch.equal(mini(ids), model(ids))
print("MiniGPT == helpers.model.gpt.GPT:", torch.equal(mini(ids), model(ids)))

for bad in (lambda: GPTConfig(d_model=130, n_heads=4), lambda: model(torch.tensor([[3, 75]]))):
    try:
        bad()
    except ValueError as error:
        print("ValueError:", error)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. One forward pass at toy size (the Matrix Magic notes) (optional)
#
# The Matrix Magic notes walk the sentence "I like to eat" through a GPT with a vocabulary of 12
# words and `d_model = 8`, one matrix at a time. We do the same twice. First with a one-block
# `GPT`, whose token and position tables are set to the notes' tables so that the first sum can
# be checked against the slide; its other weights are random, so from there on the numbers are
# ours and the shapes are the point. Two heads of size 4 keep `H x d_h = d_model`, as GPT-2 does;
# the notes' four heads of size 4 concatenate to 16 columns. Then, in the appendix at the end of
# the notebook, with the notes' own weights: they print `W_O`, the FFN's two matrices and the LM
# head, so every later table of theirs can be recomputed and checked. Every table the notes print
# is read from one fixture, `data/notes_tables.txt`, by one call.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
toy_vocab = ["I", "like", "to", "eat", "soup", "am", "a", "good", "cook", ".", "is", "yummy"]
mm = load_notes_tables("matrix_magic")  # every table the notes print (data/notes_tables.txt)

torch.manual_seed(0)
toy = GPT(GPTConfig(vocab_size=12, context_length=4, n_layers=1, n_heads=2, d_model=8)).eval()
with torch.no_grad():
    for param in toy.parameters():
        if param.dim() == 2:
            param.normal_(0.0, 0.5)  # larger than GPT-2's 0.02, so that two decimals show something
    toy.embed.token.weight.copy_(mm.TOKEN_TABLE)
    toy.embed.position.weight.copy_(mm.POSITION_TABLE)
sentence = ["I", "like", "to", "eat"]
toy_ids = torch.tensor([[toy_vocab.index(word) for word in sentence]])
print(toy.config)
print(f"here: {toy.config.n_heads} heads x d_h {toy.config.head_dim} = {toy.config.d_model} = "
      f"d_model; "
      f"the Matrix Magic notes: 4 heads x 4 = {4 * 4} columns, then W_O (16, 8)")
print("token ids:", toy_ids.tolist())

# %% slideshow={"slide_type": "fragment"}
torch.set_printoptions(precision=2, sci_mode=False)


def show(name: str, tensor: torch.Tensor) -> None:
    """Print a named intermediate with its shape, batch axis dropped."""
    print(f"{name}  {tuple(tensor.shape)}\n{tensor[0].detach()}\n")


block = toy.blocks[0]


# %% slideshow={"slide_type": "fragment"}
with torch.no_grad():
    x0 = toy.embed.token(toy_ids) + toy.embed.position(torch.arange(4))
    show("token + position embeddings  (B, N, d)", x0)
    assert torch.allclose(x0[0], mm.SUM_TABLE.float(),
                          atol=0.011)  # the notes round to two decimals
    print(f"largest difference from the notes' sum table: "
          f"{(x0[0] - mm.SUM_TABLE.float()).abs().max():.2f}\n")
    h = block.ln1(x0)
    q, k, v = (split_heads(proj(h), 2) for proj in (block.attn.q_proj, block.attn.k_proj,
                                                    block.attn.v_proj))
    show("queries, split into heads  (B, H, N, d_h)", q)
    scores = q @ k.transpose(-2, -1) / math.sqrt(4)
    show("scores Q K^T / sqrt(d_h)  (B, H, N, N)", scores)
    weights = scores.masked_fill(~causal_mask(4), float("-inf")).softmax(dim=-1)
    show("attention weights after the causal mask  (B, H, N, N)", weights)
    heads = merge_heads(weights @ v)
    show("heads side by side  (B, N, H*d_h)", heads)
    x1 = x0 + block.attn.out_proj(heads)
    show("residual stream after attention: x + W_O(heads)  (B, N, d)", x1)

# %% slideshow={"slide_type": "fragment"}
with torch.no_grad():
    hidden = F.gelu(block.mlp.up(block.ln2(x1)))
    show("FFN hidden layer after GELU  (B, N, 4d)", hidden)
    x2 = x1 + block.mlp.down(hidden)
    show("residual stream after the FFN  (B, N, d)", x2)
    logits = toy.lm_head(toy.ln_f(x2))
    show("logits: final LayerNorm, then the tied output matrix  (B, N, V)", logits)
    probabilities = logits.softmax(dim=-1)
    show("next-token probabilities  (B, N, V)", probabilities)
assert torch.allclose(probabilities, toy(toy_ids).softmax(dim=-1), atol=1e-6)
for t in range(len(sentence)):
    best = probabilities[0, t].argmax().item()
    print(f"after '{' '.join(sentence[:t + 1])}': '{toy_vocab[best]}' "
          f"({probabilities[0, t, best]:.2f}),"
          f" row sum {probabilities[0, t].sum():.2f}")
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown] slideshow={"slide_type": "slide"}
# The first matrix agrees with the notes' sum table to within 0.01 in every entry (the
# assertion checks each one): the notes added unrounded tables and then rounded, so a last digit
# can differ, as `0.00 + 0.05` showing as `0.06` on the slide. The last matrix equals
# `toy(ids).softmax(-1)`, so the walk-through skipped nothing. Row `t` of
# the probabilities is the model's guess for the token after position `t`: one forward pass
# makes a prediction at **every** position at once, which is what makes training parallel.
# Each row sums to 1; the last lines above give the most likely next word after each prefix.
#
# Untrained, the guesses are arbitrary. Training changes that (section 4).
#
# ## 3. Counting parameters (optional)
#
# The textbook section's table counts the weight matrices of one block: attention has `W_Q, W_K, W_V, W_O`,
# each `d x d` (`4d²`); the FFN has `d x 4d` and `4d x d` (`8d²`). With `N` blocks and a
# vocabulary matrix of `V x d` at each end, the count is about **`12Nd² + 2Vd`**. The exact
# count adds what the rule of thumb leaves out (the biases, the LayerNorms, the position table)
# and counts a tied matrix once: working out how much each adds is the exercise.
#
# ### Exercise: count a GPT's parameters exactly
#
# Write that exact count for a GPT-2-style model with biases and tied weights, from its four
# sizes. The check tries GPT-2 small, GPT-2 medium, our character model and the Matrix Magic
# toy; when a count is off, it says which piece the gap looks like. The cell after it counts our
# character model with your function and compares with the model itself.
#
# <details><summary>Hint 1: the idea</summary>
#
# Count each weight tensor once: the rule of thumb counts only the big matrices of the blocks and
# one vocabulary matrix; the small vectors (biases, LayerNorm gains and biases) and the position
# table are what it leaves out, and the tied output matrix is no extra tensor at all.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) One block's parameters: attention's four
# projections, the MLP's two, its two LayerNorms, every bias and gain included. (2) All the blocks.
# (3) What lies outside the blocks: the token table (once: the output layer shares it), the position
# table and the final LayerNorm.</details>
#
# <details><summary>Hint 3: closer</summary>Attention's matrices are d by d, the MLP's d by 4d and
# 4d by d; a bias has one number per output of its layer; a LayerNorm has a gain and a bias of d
# numbers each.</details>

# %% [markdown] slideshow={"slide_type": "notes"}
# Optional, but the exercise is short and popular. The formula 12 N d^2 + 2 V d is worth
# deriving on the board: 4 d^2 for attention's four projections, 8 d^2 for the MLP's d -> 4d -> d.
# Then the exact count of GPT-2 small, built on the meta device: no weight is allocated.
# Ask: "where do most of GPT-3's parameters live, attention or the MLP?"

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def gpt_parameters(n_layers: int, d_model: int, vocab_size: int, context_length: int) -> int:
    """Exact parameter count of a GPT-2-style model (biases, tied output matrix)."""
    ### BEGIN SOLUTION
    d = d_model
    attention = 4 * d * d + 4 * d                       # W_Q, W_K, W_V, W_O and their biases
    mlp = d * 4 * d + 4 * d + 4 * d * d + d             # d -> 4d and 4d -> d, with biases
    layer_norms = 2 * (d + d)                           # two per block: a gain and a bias each
    tables = vocab_size * d + context_length * d        # the token table counts once: it is tied
    return n_layers * (attention + mlp + layer_norms) + tables + 2 * d   # + the final LayerNorm
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("gpt.exact_parameters", gpt_parameters)

# %% [markdown] slideshow={"slide_type": "subslide"}
# For our character model, by the rule of thumb, by your count (the course's `exact_parameters`
# until yours passes) and by counting the model's tensors:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.gpt import (build_without_weights, count_parameters, exact_parameters,
                               formula_parameters, parameter_breakdown)


def course_parameters(n_layers: int, d_model: int, vocab_size: int, context_length: int) -> int:
    """helpers.model.gpt.exact_parameters, called with gpt_parameters' four sizes."""
    return exact_parameters(GPTConfig(vocab_size=vocab_size, context_length=context_length,
                                      n_layers=n_layers, n_heads=1, d_model=d_model))


parameters_of = yours_or("gpt.exact_parameters", gpt_parameters, course_parameters)
exact_count = parameters_of(config.n_layers, config.d_model, config.vocab_size,
                            config.context_length)
assert exact_count == count_parameters(model) == exact_parameters(config)
print(f"formula 12Nd² + 2Vd : "
      f"{formula_parameters(config.n_layers, config.d_model, config.vocab_size):>9,}")
print(f"exact, by that count: {exact_count:>9,}")
print(f"counted in the model: {count_parameters(model):>9,}")
print(f"sum over every tensor, tied matrix twice: "
      f"{sum(p.numel() for p in model.state_dict().values()):,}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# `model.parameters()` yields the tied matrix once; its `state_dict` lists it under both names,
# so summing that counts it twice.
#
# ### GPT-2 small: 124,439,808, without allocating a single weight
#
# GPT-2 small has `N = 12`, `d = 768`, `V = 50257` and a context of 1024. Built on PyTorch's
# **meta device**, every tensor has a shape but no storage, so counting its parameters costs
# no memory. Then where its parameters sit, per component, counted from the meta model's own
# tensors, with the textbook section's rule of thumb beside them:

# %% slideshow={"slide_type": "fragment"}
gpt2 = GPTConfig.gpt2_small()
started = time.perf_counter()
gpt2_meta = build_without_weights(gpt2)
print(gpt2)
print(f"parameters: {count_parameters(gpt2_meta):,} (exact formula: {exact_parameters(gpt2):,}), "
      f"on device {gpt2_meta.lm_head.weight.device}")
print("building it", format_duration(time.perf_counter() - started))
assert count_parameters(gpt2_meta) == exact_parameters(gpt2) == 124_439_808

# %% slideshow={"slide_type": "fragment"}
def tensors_in(*modules: nn.Module) -> int:
    """How many numbers the modules' parameters hold (shapes only: the meta model has no
    storage)."""
    return sum(p.numel() for module in modules for p in module.parameters())


d, N, V = gpt2.d_model, gpt2.n_layers, gpt2.vocab_size
first = gpt2_meta.blocks[0]
rows = [
    ("attention (Q, K, V, O)", 4 * d * d, tensors_in(first.attn), "per block"),
    ("FFN (d -> 4d -> d)", 8 * d * d, tensors_in(first.mlp), "per block"),
    ("2 LayerNorms", 0, tensors_in(first.ln1, first.ln2), "per block"),
    ("token table (tied output)", V * d, tensors_in(gpt2_meta.embed.token), "once"),
    ("position table", 0, tensors_in(gpt2_meta.embed.position), "once"),
    ("final LayerNorm", 0, tensors_in(gpt2_meta.ln_f), "once"),
]
print(f"{'component':<26}{'rule of thumb':>15}{'counted':>13}")
for name, thumb, exact, how_often in rows:
    print(f"{name:<26}{thumb:>15,}{exact:>13,}  {how_often}")
total = sum(exact * (N if how_often == "per block" else 1) for _, _, exact, how_often in rows)
print(f"{'total':<26}{'':>15}{total:>13,}")
assert total == 124_439_808

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### GPT-3 from the formula, and the Matrix Magic notes' table of GPT-3 sizes
#
# The textbook section says `12Nd² + 2Vd` gives "roughly 175 billion" for GPT-3 (`N = 96`, `d = 12288`,
# `V = 50257`). The cell computes it, and then every row of the GPT-3 table of the Matrix Magic
# notes, with two formulas. GPT-2 ties its output matrix to its token table; the GPT-3 paper
# describes its model as GPT-2's with changes, and does not say whether it ties them. So both
# are shown: `12Nd² + 2Vd` counts an untied output matrix, `12Nd² + Vd` a tied one. For the
# small models the vocabulary term is a large share, so the choice matters there.

# %% slideshow={"slide_type": "fragment"}
print(f"GPT-3: 12Nd² + 2Vd = {formula_parameters(96, 12288, 50257):,}")
gpt3_table = [("GPT-3 Small", "125M", 12, 768), ("GPT-3 Medium", "350M", 24, 1024),
              ("GPT-3 Large", "760M", 24, 1536), ("GPT-3 XL", "1.3B", 24, 2048),
              ("GPT-3 2.7B", "2.7B", 32, 2560), ("GPT-3 6.7B", "6.7B", 32, 4096),
              ("GPT-3 13B", "13.0B", 40, 5140), ("GPT-3 175B", "175.0B", 96, 12288)]
print(f"\n{'model':<14}{'reported':>9}{'12Nd²+2Vd':>12}{'12Nd²+Vd':>11}   nearer")
for name, reported, n_layers, width in gpt3_table:
    untied = formula_parameters(n_layers, width, 50257)
    tied = untied - 50257 * width
    reported_value = float(reported[:-1]) * (1e6 if reported.endswith("M") else 1e9)
    nearer = "tied" if abs(tied - reported_value) < abs(untied - reported_value) else "untied"
    print(f"{name:<14}{reported:>9}{untied / 1e9:>11.3f}B{tied / 1e9:>10.3f}B   {nearer}")
print(f"\n13B row: d_model 5140 / 40 heads = {5140 / 40} per head; 40 x 128 = {40 * 128}")
print(f"with d = 5120: 12Nd² + Vd = "
      f"{(formula_parameters(40, 5120, 50257) - 50257 * 5120) / 1e9:.3f}B")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The tied formula lands nearer the reported size in every row but the last (the `nearer`
# column); that fits tied embeddings without proving them. The 13B row of the table (copied
# from the GPT-3 paper) lists `d_model = 5140`, which 40 heads of 128 cannot make: the
# architecture is `40 x 128 = 5120`, and either value gives about 13 billion.
#
# ### The original Transformer: 213M
#
# The USF notes give the 2017 Transformer ("Transformer big" of the paper) 213M parameters:
# 6 encoder and 6 decoder blocks ("12 blocks"), `D = 1024`, 16 heads, an FFN of `4D = 4096`.
# Its positions are sinusoidal, so they have no parameters. The paper shares one embedding
# matrix between the encoder's input, the decoder's input and the output layer, over a
# byte-pair vocabulary of "about 37000 tokens" (English-German). An encoder block is GPT's block
# (`12D² + 13D`, with the 2017 Post-LN order); a decoder block adds cross-attention and its
# LayerNorm. The cell counts it:

# %% slideshow={"slide_type": "fragment"}
D_BIG, FFN_BIG, LAYERS_BIG, VOCAB_BIG = 1024, 4096, 6, 37_000
attention_big = 4 * D_BIG * D_BIG + 4 * D_BIG          # W_Q, W_K, W_V, W_O and their biases
ffn_big = 2 * D_BIG * FFN_BIG + FFN_BIG + D_BIG         # two matrices and their biases
layer_norm_big = 2 * D_BIG
encoder_block_big = attention_big + ffn_big + 2 * layer_norm_big
decoder_block_big = 2 * attention_big + ffn_big + 3 * layer_norm_big   # self- and cross-attention
blocks_big = LAYERS_BIG * (encoder_block_big + decoder_block_big)
total_big = blocks_big + VOCAB_BIG * D_BIG             # one shared embedding, counted once
print(f"encoder block {encoder_block_big:,} x {LAYERS_BIG} + decoder block {decoder_block_big:,} x "
      f"{LAYERS_BIG} "
      f"= {blocks_big:,}")
print(f"+ shared embedding {VOCAB_BIG:,} x {D_BIG} = {VOCAB_BIG * D_BIG:,}  ->  total "
      f"{total_big / 1e6:.1f}M")
print(f"the vocabulary that gives exactly 213M: {(213e6 - blocks_big) / D_BIG:,.0f} tokens")
print(f"unshared embeddings would add 2 x {VOCAB_BIG:,} x {D_BIG} = "
      f"{2 * VOCAB_BIG * D_BIG / 1e6:.1f}M; "
      f"GPT-3 175B / 213M = {175e9 / 213e6:.0f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# With a vocabulary of 37,000 the count is 214M; "about 37000" is a rounded figure, and 213M
# corresponds to a vocabulary of about 35,800. Unshared embeddings would add two more `V x D`
# matrices, about 76M, so the 213M also confirms the sharing. GPT-3's largest model is about
# 820 times larger.

# ### Planning memory (the textbook section's 16 GB example)
#
# A team has 16 GB of GPU memory and stores weights in fp16, 2 bytes each. The textbook section works out
# that `N = 32, d = 4096` fits and `N = 40, d = 5120` does not, quoting about 6.4B and 12.6B
# parameters with `V = 50,000`. The cell redoes it:

# %% slideshow={"slide_type": "fragment"}
budget_bytes, bytes_per_parameter = 16e9, 2
budget = budget_bytes / bytes_per_parameter
print(f"budget: {budget_bytes / 1e9:.0f} GB / {bytes_per_parameter} bytes = {budget / 1e9:.1f}B "
      f"parameters")
for n_layers, width in ((32, 4096), (40, 5120)):
    blocks_only = 12 * n_layers * width**2
    full = formula_parameters(n_layers, width, 50_000)
    verdict = "fits" if full <= budget else "does not fit"
    print(f"N={n_layers}, d={width}: 12Nd² = {blocks_only / 1e9:.2f}B, 12Nd² + 2Vd = "
          f"{full / 1e9:.2f}B "
          f"-> {full * bytes_per_parameter / 1e9:.1f} GB, {verdict}")
adam_bytes = 2 + 4 + 4 + 4 + 2  # fp16 weight, fp32 master copy, Adam's two moments, fp16 gradient
print(f"training with Adam in mixed precision: about {adam_bytes} bytes per parameter -> "
      f"{budget_bytes / adam_bytes / 1e9:.1f}B parameters in the same 16 GB")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The textbook section's 6.4B and 12.6B are the `12Nd²` term alone; adding `2Vd` gives 6.85B and 13.09B,
# and the verdicts stand. This counts the weights only: to *train*, Adam's moments and a float32
# master copy bring it to about 16 bytes per parameter, so the same card trains a model of about
# a billion parameters. Serving also needs room for the KV cache (section 6).
#
# ### Which part holds the parameters?

# %% slideshow={"slide_type": "fragment"}
gpt3_meta = build_without_weights(GPTConfig(vocab_size=50257, context_length=2048, n_layers=96,
                                            n_heads=96, d_model=12288))
models = {"our char GPT": model, "GPT-2 small": gpt2_meta, "GPT-3 175B": gpt3_meta}
splits = {name: parameter_breakdown(m) for name, m in models.items()}
parts = list(splits["GPT-2 small"])

fig, ax = plt.subplots(figsize=(9, 4))
left = torch.zeros(len(models))
for part in parts:
    shares = torch.tensor([100 * s[part] / sum(s.values()) for s in splits.values()])
    ax.barh(list(models), shares, left=left, label=part)
    left += shares
ax.set_xlabel("share of all parameters (%)")
ax.set_title("Where a GPT's parameters are")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4)
ax.invert_yaxis()
plt.show()
for name, split in splits.items():
    total = sum(split.values())
    print(f"{name:<13}" + "  ".join(f"{part} {100 * split[part] / total:5.2f}%" for part in parts))

# %% [markdown] slideshow={"slide_type": "slide"}
# In a big model the blocks hold nearly everything, with the FFN at twice attention (`8d²` vs
# `4d²`). In our small character model, the per-block split is the same, and the embeddings
# are small because its vocabulary is only the 70 characters of its config (printed in section 1);
# in GPT-2 small the 50,257-token table
# is almost a third of the model.
#
# ## 4. Training on the course corpus (core)
#
# The course's rich corpus (`helpers.text.corpus_rich`, met in notebook 1) is tales, conversations
# and diary pages from a grammar of thousands of word forms (counted below), one sentence per
# line: quoted speech, questions, numbers in digits and in words, dates and clock times. We read
# it one character at a time: the vocabulary is every character that occurs, and a model that
# must spell every word is the hardest test of what it learned.

# %% [markdown] slideshow={"slide_type": "notes"}
# **Core.** The labels are the text shifted by one: that is why a GPT can learn from plain text
# with no annotation. Sample from the untrained model first and read the gibberish aloud; after
# training, run the same measurement again.
# Exercises: next-token loss, one AdamW update, AdamW on every weight. Live-code the loss (`python3
# course.py blank 07 next_token_loss`), give the AdamW ones as homework.
# Run the training cell live: it takes well under a minute; keep the default TRAIN_STEPS in class.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.text.chars import CharTokenizer
from helpers.training.trainer import encode_text, line_overlap, random_batch, split_stories

text = load_rich_corpus()
tokenizer = CharTokenizer.train(text)
train_text, val_text = split_stories(text, val_fraction=0.1)
train_ids, val_ids = encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)
n_stories = {name: len(part.strip().split("\n\n")) for name, part in (("train", train_text), ("val",
        val_text))}
print(f"{len(text):,} characters, vocabulary of {tokenizer.vocab_size}: "
      f"{''.join(tokenizer.chars)!r}")
print(f"word forms the grammar can write: {len(word_forms()):,}")
print(f"train: {n_stories['train']:,} stories, {len(train_ids):,} tokens; "
      f"validation: the last {n_stories['val']:,} stories, {len(val_ids):,} tokens")
overlap = line_overlap(train_text, val_text)
print(f"validation lines that also occur word for word in the training stories: {overlap:.0%}")
assert tokenizer.vocab_size == config.vocab_size and 0 < overlap < 1

# %% [markdown] slideshow={"slide_type": "subslide"}
# The split keeps stories whole: validation is the last tenth of the stories, none of which the
# model trains on. They are new stories, but not all new sentences: short lines such as a
# greeting or a date recur, so some of the validation lines (the share is printed above) also
# occur, word for word, in training. Most do not, as a grammar of thousands of words rarely
# writes the same long sentence twice; but every story is built from the same templates, so the
# validation loss below measures how well the model predicts new sentences in familiar
# patterns, not text of a new kind.
#
# ### Why a GPT can learn from plain text: the labels are the text
#
# Supervised learning needs an answer for every example. For next-token prediction the answer
# is already in the text: the target at each position is simply the next character. Nobody
# labels anything, which is why a GPT can be trained on as much text as can be found
# (self-supervised learning). The inputs and the targets are the same text, shifted by one. A training example is then a window of
# `context_length` characters, `x`, and the same window one character later, `y`: at every
# position the target is the next character, so one window of 64 characters gives 64
# predictions to learn from:

# %% slideshow={"slide_type": "fragment"}
line_ids = encode_text(tokenizer, train_text.splitlines()[0])
inputs, targets = line_ids[:-1], line_ids[1:]
assert torch.equal(inputs[1:], targets[:-1])  # the same characters, one step apart
for position in range(6):
    print(f"input {tokenizer.decode(inputs[:position + 1].tolist())!r:<10} -> target "
          f"{tokenizer.decode([targets[position].item()])!r}")
print(f"labels available for free in the training stories: {len(train_ids) - 1:,}, one per "
      f"character after the first")

x, y = random_batch(train_ids, batch_size=2, context_length=config.context_length,
                    generator=torch.Generator().manual_seed(0))
print("x:", repr(tokenizer.decode(x[0].tolist())))
print("y:", repr(tokenizer.decode(y[0].tolist())))
print("shapes:", tuple(x.shape), tuple(y.shape))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Before training: how good is the text?
#
# Because the corpus comes from a known grammar, we can **measure** the quality of generated
# text: `rich_well_formed_fraction` is the share of lines the grammar can produce, and the gentler
# `known_word_fraction` the share of words it could write somewhere (a misspelt word costs one
# word, not the whole line). We let the model write a window's worth of characters after a
# newline, many times over, at temperature 0.6 (`SAMPLE_TEMPERATURE`, used after training too),
# keep the complete lines, and measure. The corpus itself scores 1. The known-word share has a
# floor above zero: one-letter words ("a", "I") and digit strings are words the grammar writes,
# so even characters drawn at random score about a third (printed), and so does the untrained
# model:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.generation import generate


SAMPLE_TEMPERATURE = 0.6  # before and after training alike, so the two measurements compare


def written_lines(gpt: GPT, n_samples: int = 48, temperature: float = SAMPLE_TEMPERATURE,
                  seed: int = 0) -> list[str]:
    """Complete lines the model writes after a newline, filling its context (cut-off lines
    dropped)."""
    prompt = torch.tensor([tokenizer.encode("\n")] * n_samples)
    n_chars = gpt.config.context_length - 1
    out = generate(gpt, prompt, n_chars, temperature=temperature,
                   generator=torch.Generator().manual_seed(seed))
    lines = []
    for row in out[:, 1:].tolist():
        lines += [line for line in tokenizer.decode(row).split("\n")[:-1] if line.strip()]
    return lines


# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
model = GPT(config)
before = written_lines(model)
quality_before = rich_well_formed_fraction("\n".join(before))
words_before = known_word_fraction("\n".join(before))
corpus_sample = text[:20_000].rsplit("\n", 1)[0]  # whole lines only
noise = tokenizer.decode(torch.randint(0, tokenizer.vocab_size, (20_000,),
                                       generator=torch.Generator().manual_seed(0)).tolist())
for name, sample in (("corpus", corpus_sample), ("random characters", noise)):
    print(f"{name}: {rich_well_formed_fraction(sample):.2f} well formed, "
          f"{known_word_fraction(sample):.2f} known words")
print(f"untrained model: {quality_before:.2f} well formed, {words_before:.2f} known words, "
      f"e.g. {before[0][:60]!r}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The training step by hand
#
# Training repeats one step: compute the loss on a batch, compute its gradient with
# `loss.backward()`, clip the gradient, and let the optimiser move every weight at the
# learning rate of the schedule. `helpers.training.trainer.Trainer` does all of it, fast. First
# each piece is written in plain code (the loss and the optimiser by you, in three exercises) and
# checked against PyTorch's own, then a loop of a dozen lines trains a tiny model with them.
#
# **The loss.** A window of `N + 1` tokens gives `N` predictions: the inputs are its first `N`
# tokens, `ids[:, :-1]`, and the targets the last `N`, `ids[:, 1:]`. The model turns the
# inputs into logits `z` of shape `(B, N, V)`; log-softmax turns each row into
# log-probabilities, `log p_i = z_i - log sum_j exp(z_j)` (the largest `z` is taken out first so
# that `exp` cannot overflow). The loss is the cross-entropy: minus the mean, over all `B x N`
# positions, of the log-probability the model gave the right next token.
#
# ### Exercise: the next-token loss of a model
#
# Write that loss for a model and windows of token ids `(B, N + 1)`: the shift by one, the
# log-softmax and the mean, yourself (the check refuses `F.cross_entropy` and `F.nll_loss`). The
# cell after the check compares your loss with PyTorch's on two windows of the corpus; the
# training loop below runs on it.
#
# <details><summary>Hint 1: the idea</summary>
#
# Each position predicts the token after it: the model reads all but the last token of each
# window, and each prediction is scored against the token that follows it, averaged over every
# position of every row.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Inputs and targets from each window, one shifted
# against the other. (2) The model's log-probabilities on the inputs, computed so that no
# exponential overflows. (3) Each position's log-probability of its own target, and minus their
# mean.</details>
#
# <details><summary>Hint 3: closer</summary>The inputs are every token but the last, the targets
# every token but the first. A stable log-softmax takes each row's largest logit out before the log
# of the sum of exponentials. Pick the target's entry along the vocabulary axis.</details>

# %% slideshow={"slide_type": "fragment"}
def next_token_loss(gpt: GPT, ids: torch.Tensor) -> torch.Tensor:
    """ids (B, N + 1) -> the mean cross-entropy of predicting ids[:, 1:] from ids[:, :-1], a
    scalar."""
    ### BEGIN SOLUTION
    seen, answers = ids[:, :-1], ids[:, 1:]                     # position i predicts token i + 1
    z = gpt(seen)                                               # logits (B, N, V)
    z_top = z.amax(dim=-1, keepdim=True)                        # taken out so exp cannot overflow
    log_p = z - z_top - (z - z_top).exp().sum(dim=-1, keepdim=True).log()   # log-softmax
    log_p_answer = log_p.gather(-1, answers.unsqueeze(-1))      # (B, N, 1)
    return -log_p_answer.mean()
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("gpt.next_token_loss", next_token_loss)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Two windows of `N + 1 = 65` characters from the training stories, through the untrained model,
# with your loss (the course's `helpers.training.by_hand.next_token_loss` until yours passes) and
# with `F.cross_entropy`, which takes the logits flattened to `(B x N, V)` and the targets to
# `(B x N,)`:

# %% slideshow={"slide_type": "fragment"}
from helpers.training import by_hand

loss_of = yours_or("gpt.next_token_loss", next_token_loss, by_hand.next_token_loss)
windows = torch.stack([train_ids[start:start + config.context_length + 1] for start in (0, 5000)])
window_inputs, window_targets = windows[:, :-1], windows[:, 1:]      # (2, 64) each, one apart
with torch.no_grad():
    by_you = loss_of(model, windows)
    untrained_logits = model(window_inputs)                          # (2, 64, V)
by_torch = F.cross_entropy(untrained_logits.flatten(0, 1), window_targets.flatten())
assert torch.allclose(by_you, by_torch, atol=1e-6)
print(f"windows {tuple(windows.shape)} -> inputs {tuple(window_inputs.shape)}, targets "
      f"{tuple(window_targets.shape)}")
print(f"untrained loss: about {by_you.item():.1f}, close to uniform guessing (ln "
      f"{config.vocab_size} = "
      f"{math.log(config.vocab_size):.2f})")
print("that loss vs F.cross_entropy: difference < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# `random_batch` above returns exactly these pairs: `x` is a window's first `N` tokens and `y`
# its last `N`.
#
# **The gradient and AdamW.** `loss.backward()` fills `p.grad` for every weight `p`. AdamW then
# keeps two running averages per weight, of the gradient `g` and of its square, and moves the
# weight by their ratio. At step `t = 1, 2, ...`, with `m` and `v` starting at zero:
#
# - `m = beta1 m + (1 - beta1) g` and `v = beta2 v + (1 - beta2) g^2`;
# - bias correction, as both start at zero: `m_hat = m / (1 - beta1^t)`, `v_hat = v / (1 - beta2^t)`;
# - decoupled weight decay: `p = p (1 - lr x weight_decay)`, on weight matrices only (not on biases or gains);
# - the step: `p = p - lr x m_hat / (sqrt(v_hat) + eps)`.
#
# ### Exercise: one AdamW update
#
# Write these lines for one weight tensor: given the weight `p`, its gradient `g`, the averages
# `m` and `v`, the step number `t` (from 1) and the settings, return the new `(p, m, v)`. The check
# runs four steps against `torch.optim.AdamW`; the optimiser of the next exercise runs your update
# on every weight of a model.
#
# <details><summary>Hint 1: the idea</summary>
#
# Two running averages (of the gradient and of its square), each corrected for starting at zero;
# the weight decay shrinks `p` on its own, outside the adaptive step.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Follow the four lines of equations above in order: the two averages, their bias correction,
# the decay of `p`, then the step. Return the new weight together with the two uncorrected
# averages, which the next step needs.
# </details>

# %% slideshow={"slide_type": "fragment"}
def adamw_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int,
                 lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step on a weight p with gradient g; all tensors have p's shape."""
    ### BEGIN SOLUTION
    beta1, beta2 = betas
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    p = p * (1 - lr * weight_decay)
    return p - lr * m_hat / (v_hat.sqrt() + eps), m, v
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("gpt.adamw_update", adamw_update)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Every weight of a model.** Each weight gets its own step size: one whose gradient is
# consistently large or small moves by about `lr` either way. An optimiser keeps `m` and `v` for
# every weight of the model and runs the update on each, with weight decay on the matrices only
# (`matrices_and_vectors` finds them: biases and LayerNorm gains are vectors).
#
# ### Exercise: AdamW on every weight
#
# Write the class `HandAdamW`: built from an `update` function (the one you just wrote, or the
# course's), the list of matrices, the list of vectors and the settings, its `step(lr)` moves
# every weight by one AdamW step, using each weight's `.grad`. The check runs three steps on two
# matrices and two vectors against `torch.optim.AdamW` with the same two groups; then the cells
# below check it on a whole GPT and train with it.
#
# <details><summary>Hint 1: the idea</summary>
#
# The optimiser owns the state: a running average of the gradient and one of its square for every
# weight, and the number of steps taken. The model owns the weights, so a step must change them
# where they are.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Constructor: the settings, a step count at zero,
# and for every weight its state: two running averages starting at zero and its own decay (matrices
# decay, vectors do not). (2) Step: count one more step; for each weight, let the update of exercise
# 2 give its new value and averages. (3) Keep the averages, and write the new value into the weight
# in place.</details>

# %% slideshow={"slide_type": "fragment"}
from collections.abc import Callable

from helpers.training.trainer import matrices_and_vectors

# %% slideshow={"slide_type": "fragment"}
class HandAdamW:
    """AdamW on every weight, one `update(p, g, m, v, t, ...)` per tensor; `matrices` are decayed,
    `vectors` (biases, gains) are not."""

    def __init__(self, update: Callable, matrices: list[torch.Tensor], vectors: list[torch.Tensor],
                 betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.1) -> None:
        ### BEGIN SOLUTION
        self.update, self.betas, self.eps = update, betas, eps
        self.t = 0                                   # steps taken; the first step is t = 1
        self.slots = []                              # [weight, m, v, its decay] per tensor
        for p in matrices:
            self.slots.append([p, torch.zeros_like(p), torch.zeros_like(p), weight_decay])
        for p in vectors:
            self.slots.append([p, torch.zeros_like(p), torch.zeros_like(p), 0.0])
        ### END SOLUTION

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """One AdamW step of every weight at learning rate lr, from each weight's .grad."""
        ### BEGIN SOLUTION
        self.t += 1
        for slot in self.slots:
            p, m, v, decay = slot
            new_p, slot[1], slot[2] = self.update(p, p.grad, m, v, self.t, lr, self.betas, self.eps,
                                                  decay)
            p.copy_(new_p)                           # in place: the model keeps its tensor
        ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("gpt.hand_adamw", HandAdamW)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Your optimiser with your update (each replaced by the course's, in `helpers.training.by_hand`,
# until it passes its check), against `torch.optim.AdamW` with the same two groups on a tiny GPT,
# both given the same gradient:

# %% slideshow={"slide_type": "fragment"}
update = yours_or("gpt.adamw_update", adamw_update, by_hand.adamw_update)
Optimizer = yours_or("gpt.hand_adamw", HandAdamW, by_hand.HandAdamW)


def windows_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A batch (x, y) of random_batch as windows (B, N + 1): x and y's last token."""
    return torch.cat([x, y[:, -1:]], dim=1)

# %% slideshow={"slide_type": "fragment"}
tiny_config = GPTConfig(vocab_size=tokenizer.vocab_size, context_length=32, n_layers=2, n_heads=2,
                        d_model=32)
torch.manual_seed(0)
ours, theirs = GPT(tiny_config), GPT(tiny_config)
theirs.load_state_dict(ours.state_dict())
hand_optimizer = Optimizer(update, *matrices_and_vectors(ours), weight_decay=0.1)
their_matrices, their_vectors = matrices_and_vectors(theirs)
torch_optimizer = torch.optim.AdamW([{"params": their_matrices, "weight_decay": 0.1},
                                     {"params": their_vectors, "weight_decay": 0.0}],
                                    lr=1e-2, betas=(0.9, 0.99), eps=1e-8, foreach=False)
batches = torch.Generator().manual_seed(1)
for _ in range(5):
    x_batch, y_batch = random_batch(train_ids, 8, tiny_config.context_length, batches)
    ours.zero_grad(set_to_none=True)
    loss_of(ours, windows_of(x_batch, y_batch)).backward()           # fills p.grad
    for mine, other in zip(ours.parameters(), theirs.parameters(), strict=True):
        other.grad = mine.grad.clone()                               # the same gradient for both
    hand_optimizer.step(lr=1e-2)
    torch_optimizer.step()
adamw_gap = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters(),
                                                           strict=True))
assert adamw_gap < 1e-6
print(f"{len(their_matrices)} matrices decayed, {len(their_vectors)} vectors not")
print("after 5 steps, largest difference from torch.optim.AdamW (two groups): < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### One gradient, two optimisers
#
# Both optimisers receive the same gradient. Two separate `backward()` passes would differ in
# round-off only, yet the optimisers would drift apart: the key biases get a gradient that is zero
# up to round-off (adding the same number to every score of a row leaves the softmax unchanged),
# and Adam divides each gradient by its own size, so a round-off gradient of either sign moves its
# weight by about `lr` in that direction.
#
# **Gradient clipping.** One unlucky batch can give a huge gradient. Clipping by the global norm
# treats all the gradients as one long vector: if its length `||g|| = sqrt(sum of every g^2)`
# exceeds `max_norm`, every gradient is multiplied by `max_norm / ||g||`, so the direction is
# kept and only the length shrinks. Checked against `torch.nn.utils.clip_grad_norm_` on a fresh
# gradient, with a `max_norm` small enough that it clips:

# %% slideshow={"slide_type": "fragment"}
def clip_by_global_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale every p.grad by min(1, max_norm / total norm) in place; return the norm before."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.sqrt(sum((g * g).sum() for g in grads))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # the 1e-6 as in PyTorch: no 0 / 0
    for g in grads:
        g.mul_(scale)
    return total


ours.zero_grad(set_to_none=True)
loss_of(ours, windows_of(x_batch, y_batch)).backward()
params = list(ours.parameters())
raw = [p.grad.clone() for p in params]
hand_norm = clip_by_global_norm(params, max_norm=0.1)
hand_clipped = [p.grad.clone() for p in params]
for p, g in zip(params, raw, strict=True):
    p.grad = g.clone()
torch_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=0.1, foreach=False)
clip_gap = max((a - p.grad).abs().max().item() for a, p in zip(hand_clipped, params, strict=True))
new_norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in params)).item()
assert hand_norm > 0.1 and torch.allclose(hand_norm, torch_norm) and clip_gap < 1e-7
assert abs(new_norm - 0.1) < 1e-5
print("gradient norm above 0.1, so it was clipped:", hand_norm.item() > 0.1)
print(f"norm after clipping: {new_norm:.4f}; largest difference from clip_grad_norm_: < 1e-7")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The schedule and the loop
#
# **The schedule.** The learning rate rises linearly from 0 to its peak over the first 5 % of
# the run (the first steps, with `m` and `v` still poor averages, would otherwise be too
# large), then follows half a cosine down to a tenth of the peak. Written out, and checked against
# `helpers.training.trainer.learning_rate` on a fine grid:

# %% slideshow={"slide_type": "fragment"}
from helpers.training.trainer import learning_rate


def warmup_cosine(progress: float, peak: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """The learning rate `progress` (0 -> 1) of the way through a run."""
    if progress < warmup:
        return peak * progress / warmup
    done = (progress - warmup) / (1 - warmup)  # fraction of the cosine decay done, 0 -> 1
    return peak * (floor + (1 - floor) * (1 + math.cos(math.pi * done)) / 2)


grid = [i / 1000 for i in range(1001)]
schedule_gap = max(abs(warmup_cosine(p, 5e-3) - learning_rate(p, 5e-3)) for p in grid)
assert schedule_gap < 1e-15
print(f"peak 5e-3: {warmup_cosine(0.0, 5e-3):g} at the start, {warmup_cosine(0.05, 5e-3):g} after "
      f"the warm-up, {warmup_cosine(1.0, 5e-3):g} at the end")
print(
    f"{len(grid)} points, largest difference from helpers.training.trainer.learning_rate: < 1e-15"
)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **The loop.** Now the pieces train a tiny GPT (2 blocks, width 32, a context of 32, float32)
# for `PLAIN_STEPS` steps of 16 random windows, on your `next_token_loss`, `adamw_update` and
# `HandAdamW` (the course's until yours pass their checks). The rate at each step is the schedule's at the
# end of that step, `(step + 1) / PLAIN_STEPS`, as in `helpers.training.trainer`. For the first
# `TWIN_STEPS` steps a twin with the same first weights and the same windows takes the course
# Trainer's step on its plain path (`fast=False`: `F.cross_entropy`, `clip_grad_norm_` and
# `torch.optim.AdamW` with the same two groups). Its own `backward()` differs from ours in
# round-off, so the key biases drift apart (see above), but they cannot change the output: the
# two losses must agree.

# %% slideshow={"slide_type": "fragment"}
from helpers.training.trainer import TrainConfig, Trainer

PLAIN_STEPS = 120  # the knob of this plain loop: a few seconds of CPU
TWIN_STEPS = 40    # the first steps, taken by the Trainer's twin too

torch.manual_seed(0)
tiny, twin = GPT(tiny_config), GPT(tiny_config)
twin.load_state_dict(tiny.state_dict())
optimizer = Optimizer(update, *matrices_and_vectors(tiny), weight_decay=0.1)
twin_trainer = Trainer(twin, train_ids, val_ids, TrainConfig(batch_size=16, learning_rate=1e-2,
                                                             fast=False))
batches = torch.Generator().manual_seed(twin_trainer.config.seed)  # so both draw the same windows
plain_losses, twin_losses = [], []
for step in range(PLAIN_STEPS):
    x, y = random_batch(train_ids, 16, tiny_config.context_length, batches)
    ids = windows_of(x, y)                                          # the windows (16, 33)
    lr = warmup_cosine((step + 1) / PLAIN_STEPS, peak=1e-2)         # the schedule
    loss = loss_of(tiny, ids)                                       # your loss
    tiny.zero_grad(set_to_none=True)
    loss.backward()                                                 # the gradient
    clip_by_global_norm(list(tiny.parameters()), max_norm=1.0)      # clipping
    optimizer.step(lr)                                              # your AdamW, every weight
    plain_losses.append(loss.item())
    if step < TWIN_STEPS:
        twin_losses.append(twin_trainer.train_step(lr))             # PyTorch's pieces

# %% slideshow={"slide_type": "fragment"}
twin_gap = max(abs(a - b) for a, b in zip(plain_losses[:TWIN_STEPS], twin_losses, strict=True))
first, last = plain_losses[0], sum(plain_losses[-10:]) / 10
assert twin_gap < 1e-3 and last < 2.5 < first - 1.0
print(f"first {TWIN_STEPS} steps: largest difference from the Trainer twin's losses < 1e-3")
print(f"loss fell from {first:.2f} at the first step (ln {tokenizer.vocab_size} = "
      f"{math.log(tokenizer.vocab_size):.2f}) to below 2.5 (the mean of the last 10 steps)")
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(range(1, PLAIN_STEPS + 1), plain_losses, label="the plain loop on your pieces")
ax.plot(range(1, TWIN_STEPS + 1), twin_losses, "--", label="its twin: Trainer.train_step")
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.set_title("A tiny GPT trained by the plain loop")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# That is all of training. **This is what `helpers.training.trainer` does, faster**: `Trainer.train_step`
# is the body of this loop (its plain path just took the twin's steps), with `torch.optim.AdamW`
# (its fused kernel) in place of `HandAdamW`, `clip_grad_norm_` in place of `clip_by_global_norm`,
# `F.cross_entropy` for the loss and `learning_rate` for the schedule; section 10 explains what makes its steps fast (that
# machinery lives apart, in `helpers.training.speed`, so `helpers/training/trainer.py` reads like this loop). From here
# on the notebook trains with it.
#
# ### The recipe
#
# `helpers.training.trainer.Trainer` trains with AdamW (weight decay on the weight matrices only), a
# learning rate that rises linearly for the first 5 % of the run and then follows half a cosine
# down to a tenth of its peak, and gradient clipping (the whole gradient is scaled down whenever
# its norm exceeds 1). Evaluations use fixed batches, so the train and validation curves are
# comparable from point to point.
#
# This notebook asks it for one change, `TrainConfig(optimizer="muon")`: the hidden matrices (the
# attention's and the MLP's weights) then take the steps of **Muon**, which orthogonalises each
# matrix's momentum before stepping (notebook 9 derives it), at their own peak rate
# `muon_learning_rate`, on the same schedule; the embeddings, gains and biases keep AdamW. A Muon
# step costs more than an AdamW step, so the two were compared at equal time, not equal steps:
# `benchmarks/bench_nb7_optimizer.py` timed both steps in turns on one thread, gave Muon the
# steps that fit in the time of AdamW's 600 (AdamW's default here until then), and trained both
# from three seeds, in float32 and in bf16. The cell prints what it stored.

# %% slideshow={"slide_type": "fragment"}
import json

from helpers.text.corpus import data_dir

for precision in ("", "_bf16"):
    stored = json.loads((data_dir() / f"nb7_optimizer{precision}.json").read_text(encoding="utf-8"))
    print(f"{stored['settings']['precision']}: a Muon step took {stored['step_ratio']:.2f}x an "
          f"AdamW step, "
          f"so Muon got {stored['muon_steps']} steps for AdamW's {stored['settings']['steps']}")
    for run in stored["runs"]:
        print(f"  seed {run['seed']}: validation loss " + ", ".join(
            f"{name} {result['val_loss']:.3f}" for name, result in run.items() if name != "seed"))
    # the rate this notebook trains with
    muon = stored["summary"][f"muon lr {TrainConfig.muon_learning_rate:g}"]
    print(f"  Muon (lr {TrainConfig.muon_learning_rate:g}) minus AdamW (peak 5e-3), per seed:",
          [round(gap, 2) for gap in muon["val_loss_minus_adamw"]])
    assert muon["beats_every_adamw_rate_on_every_seed"] and max(muon["val_loss_minus_adamw"]) < -0.2

# %% [markdown] slideshow={"slide_type": "subslide"}
# On every seed, in both precisions, Muon at `TrainConfig`'s rate (`muon lr 0.04`) ends far below
# AdamW at this notebook's rate (`adamw`, peak `5e-3`), and in float32 below AdamW at the two
# other rates tried as well (`adamw lr ...`): by more than 0.2 on every seed (the differences
# printed), in no more time. So the notebook trains with Muon, for 400 steps, about the time of
# AdamW's 600 at the step costs printed.
#
# ### Train
#
# `TRAIN_STEPS`, at the top of the next cell, is the knob: the default trains in about 20 seconds on a 2-core laptop in float32 (the time is printed below); more
# steps give better stories. The progress bar and the loss plot update as it
# runs (the plot redraws at every evaluation).

# %% slideshow={"slide_type": "fragment"}
TRAIN_STEPS = 400  # the knob: more steps, better stories

from helpers.lab.plots import LiveLossPlot, draw_losses
from helpers.training.trainer import TrainConfig, Trainer

train_config = TrainConfig(batch_size=16, learning_rate=5e-3, eval_every=100, optimizer="muon")
progress = torch.linspace(0, 1, 200)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(progress * 100, [learning_rate(p.item(), train_config.learning_rate) for p in progress])
ax.set_xlabel("progress through training (%)")
ax.set_ylabel("learning rate")
ax.set_title("Warm-up, then cosine decay")
plt.show()
print(train_config)

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The progress bar, the live plot and the exact losses depend on the machine's speed and CPU.
trainer = Trainer(model, train_ids, val_ids, train_config)
live_plot = LiveLossPlot()
started = time.perf_counter()
history = trainer.fit(steps=TRAIN_STEPS, callbacks=[live_plot])
train_seconds = time.perf_counter() - started
print(f"trained in {trainer.dtype} on {trainer.device.type}: {len(history.steps)} steps, "
      f"{history.tokens_per_second:,.0f} tokens/s, {format_duration(train_seconds)}")
print(f"loss: train {history.train_losses[-1]:.3f}, validation {history.val_losses[-1]:.3f} "
      f"(uniform guessing: ln {config.vocab_size} = {math.log(config.vocab_size):.3f})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The cell above cannot print the same numbers on every machine (bfloat16 rounds differently
# from one CPU to another), so the next cell checks what must hold instead: the run took
# `TRAIN_STEPS` steps, the loss fell far below uniform guessing and below a second reference,
# the **bigram model** nanoGPT's lessons start from (the next character predicted from the
# current one alone, by counting pairs in the training text; add-one smoothing keeps unseen
# pairs possible), and validation stayed close to training. The run reads fewer tokens than the training stories hold (the fraction is printed
# below; its windows are drawn at random, so some text is read twice and some not at all), too
# little to overfit; besides, many validation sentences were seen whole in training (section 4).

# %% slideshow={"slide_type": "fragment"}
def bigram_loss(train: torch.Tensor, val: torch.Tensor, vocab_size: int) -> float:
    """Validation cross-entropy of next-character probabilities counted from `train`'s pairs."""
    counts = torch.ones(vocab_size, vocab_size, dtype=torch.float64)  # add-one smoothing
    counts.index_put_((train[:-1], train[1:]), torch.ones(len(train) - 1, dtype=torch.float64),
                      accumulate=True)
    log_probs = (counts / counts.sum(-1, keepdim=True)).log()
    return -log_probs[val[:-1], val[1:]].mean().item()


bigram = bigram_loss(train_ids, val_ids, config.vocab_size)
print(f"validation loss references: uniform ln {config.vocab_size} = "
      f"{math.log(config.vocab_size):.3f}, "
      f"bigram counts {bigram:.3f}")
assert history.val_losses[-1] < bigram < math.log(config.vocab_size)
print("the trained GPT's validation loss is below the bigram's:", history.val_losses[-1] < bigram)

# %% slideshow={"slide_type": "fragment"}
tokens_read = TRAIN_STEPS * train_config.batch_size * config.context_length
print(f"tokens read: {TRAIN_STEPS} steps x {train_config.batch_size} x {config.context_length} = "
      f"{tokens_read:,}, "
      f"{tokens_read / len(train_ids):.2f} of the {len(train_ids):,} training tokens")
assert len(history.steps) == TRAIN_STEPS and live_plot.redraws == len(history.val_losses)
assert history.val_losses[-1] < 0.5 * history.val_losses[0] < math.log(config.vocab_size)
assert abs(history.val_losses[-1] - history.train_losses[-1]) < 0.1
print(
    "the loss fell:",
    history.val_losses[0] > 2 * history.val_losses[-1],
    "| validation within 0.1 of train:",
    abs(history.val_losses[-1] - history.train_losses[-1]) < 0.1,
)
draw_losses(history)
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Sampling: temperature and top-k (optional)
#
# The model gives a probability for every next character. **Greedy** decoding takes the most
# likely one. **Sampling** draws one at random from the distribution, after two adjustments:
#
# - **temperature** `T` divides the logits: `T < 1` sharpens the distribution towards the top
#   choice (`T -> 0` is greedy), `T > 1` flattens it towards uniform;
# - **top-k** keeps only the `k` most likely tokens (renormalised) and never draws the long tail.
#
# `helpers.model.generation.sample_next` does this for a batch of logits, and `generate` repeats
# it, each time appending the new token; temperature 0 or top-k 1 is greedy (the cell checks both).
# The next-character distribution after "On Monday, the 3rd of May, Mia walked to the ", three
# ways:

# %% [markdown] slideshow={"slide_type": "notes"}
# Let the room choose a temperature and a k and sample. Low temperature repeats itself, high
# temperature drifts into noise; top-k cuts the tail. Ask: "what does temperature 0 mean, and why
# can we not divide by it?"

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.generation import sample_next

prompt_text = "On Monday, the 3rd of May, Mia walked to the "
model.eval()
with torch.no_grad():
    next_logits = model(torch.tensor([tokenizer.encode(prompt_text)]))[0, -1]
top = next_logits.topk(12).indices
labels = [repr(tokenizer.decode([i]))[1:-1] or "␣" for i in top.tolist()]
fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
for ax, (t, k) in zip(axes, [(0.5, None), (1.0, None), (1.0, 3)], strict=True):
    scaled = next_logits / t  # the temperature
    if k is not None:  # only the k best keep their logit
        best_k = scaled.argsort(descending=True)[:k]
        scaled = torch.full_like(scaled, float("-inf")).index_copy(0, best_k, scaled[best_k])
    ax.bar(labels, scaled.softmax(-1)[top].numpy())
    ax.set_title(f"T = {t}" + (f", top-k = {k}" if k else ""))
    ax.set_xlabel("next character")
axes[0].set_ylabel("probability")
fig.suptitle(f"After {prompt_text!r}", y=1.03)
plt.show()

assert torch.equal(sample_next(next_logits[None], temperature=0.0), next_logits.argmax().view(1, 1))
assert torch.equal(sample_next(next_logits[None], temperature=1.3, top_k=1),
                   next_logits.argmax().view(1, 1))
print("temperature 0 and top-k 1 both pick the most likely character, the first bar above")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: sampling with temperature and top-k
#
# Write the loop `generate` runs, with both adjustments: `my_generate(gpt, prompt,
# max_new_tokens, temperature, top_k, generator)` extends the prompt `(B, S)` by `max_new_tokens`
# tokens, one at a time, and returns `(B, S + max_new_tokens)`. Remember that the model reads at
# most `context_length` tokens, and that only the last position predicts the next one.
# Temperature 0 or top-k 1 is greedy; otherwise draw each token with `torch.multinomial` and the `generator` you are given, so
# that a seeded run repeats. The check compares greedy runs with `generate`, and the frequencies
# of thousands of draws with the probabilities they should have; the cell after it writes with
# your sampler.
#
# <details><summary>Hint 1: the idea</summary>
#
# Each step runs the model on what it can read and keeps the prediction of the last position;
# greedy takes its most likely token, sampling draws one instead: the temperature reshapes that
# distribution, top-k cuts its tail, and the drawn token is appended before the
# next step reads the sequence again.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Repeat once per new token: run the model on what
# it can read and keep the last position's logits. (2) Greedy settings take the most likely token.
# (3) Otherwise sharpen or soften the distribution (temperature), cut its tail (top-k) and draw one
# token per row with the generator. (4) Append the token and go on.</details>
#
# <details><summary>Hint 3: closer</summary>What the model can read is the last context's worth of
# tokens. Greedy means temperature 0 or a top-k of 1. The temperature divides the logits; the top-k
# cut sends every logit below a row's k-th largest to minus infinity; the draw is from the softmax
# of what is left.</details>

# %% slideshow={"slide_type": "fragment"}
def my_generate(gpt: GPT, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """prompt (B, S) -> (B, S + max_new_tokens): the prompt and the tokens sampled after it."""
    ### BEGIN SOLUTION
    sequence = prompt
    for _ in range(max_new_tokens):
        readable = sequence[:, -gpt.config.context_length:]          # at most a context's worth
        with torch.no_grad():
            last = gpt(readable)[:, -1]                               # (B, V), the last position
        if temperature == 0 or top_k == 1:
            next_id = last.argmax(dim=-1, keepdim=True)                   # greedy
        else:
            last = last / temperature
            if top_k is not None:
                threshold = last.topk(top_k, dim=-1).values[:, -1:]       # (B, 1): the k-th best
                last = last.masked_fill(last < threshold, -math.inf)
            next_id = torch.multinomial(last.softmax(dim=-1), num_samples=1, generator=generator)
        sequence = torch.cat([sequence, next_id], dim=1)
    return sequence
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("gpt.sample_tokens", my_generate)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Your sampler (the course's `generate` until yours passes) continues the prompt of the bars
# above. Greedy, it must write exactly what `generate` writes; the prompt and the 30 new
# characters are longer than the context of 64, so this also checks the cropping.

# %% slideshow={"slide_type": "fragment"}
sampler = yours_or("gpt.sample_tokens", my_generate, generate)
start = torch.tensor([tokenizer.encode(prompt_text)])
greedy_yours = sampler(model, start, 30, temperature=0.0)
same_as_generate = torch.equal(greedy_yours, generate(model, start, 30, temperature=0.0))
assert same_as_generate
print(
    f"{start.shape[1]} + 30 tokens, context {config.context_length}: greedy agrees with generate:",
    same_as_generate,
)

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# What a trained model writes depends on the CPU's bfloat16 rounding.
print(f"greedy:            ...{tokenizer.decode(greedy_yours[0, start.shape[1]:].tolist())!r}")
for temperature, k in ((0.6, None), (1.0, 5)):
    out = sampler(model, start, 30, temperature=temperature, top_k=k,
                  generator=torch.Generator().manual_seed(0))
    print(f"T = {temperature}, top-k = {k}: "
          f"...{tokenizer.decode(out[0, start.shape[1]:].tolist())!r}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### After training: the same measurement
#
# Twice as many samples of a context's worth of characters (fewer lines would make the share
# jump from run to run), at the same temperature as before training, 0.6, sharper than the
# model's own distribution. Some of their lines, and the two measures:

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# What a trained model writes depends on the CPU's bfloat16 rounding; the next cell checks it.
N_SAMPLES = 96
after = written_lines(model, n_samples=N_SAMPLES)
quality_after = rich_well_formed_fraction("\n".join(after))
words_after = known_word_fraction("\n".join(after))
print("\n".join(after[:12]))
print(f"\n{N_SAMPLES} samples x {config.context_length - 1} characters, {len(after)} lines: "
      f"{quality_after:.2f} well formed after training, {quality_before:.2f} before; "
      f"known words {words_after:.2f} after, {words_before:.2f} before")

# %% slideshow={"slide_type": "fragment"}
random_words = known_word_fraction(noise)
assert quality_after > 0.01 > quality_before and words_after > 0.7 > max(words_before, random_words)
print("training raised the well-formed share from", quality_before, "to more than 0.01,",
      f"and the share of known words from {words_before:.2f} (random characters: "
      f"{random_words:.2f})",
      "to more than 0.7")

# %% [markdown] slideshow={"slide_type": "slide"}
# The grammar is strict: a line counts only if every word, number, comma and quotation mark in it
# is one the grammar could have written there, from thousands of word forms. Lines that miss
# often still read as English, with a misspelt word or two sentences run together; more
# `TRAIN_STEPS` raise the share.
#
# ## 6. The KV cache (optional)
#
# Generating token `t + 1` by running the model on all `t` tokens recomputes the keys and values
# of tokens `0 .. t-1`, which the previous step already computed: the causal mask guarantees
# they cannot have changed. A **KV cache** keeps them. Each step then feeds **one** token
# through the model: its query attends to all stored keys and values, and its own key and value
# are appended.
#
# ### Exercise: one cached attention step
#
# One step of the cache, for one head with plain matrices: the cache holds the keys and values of
# the tokens so far; a new token arrives alone. Project it to `q`, `k` and `v`, append its `k` and
# `v` to the stored ones, and let its `q` attend to all of them. It needs no mask: the newest
# token may see every stored token, and itself. The result must equal the last row of attention
# recomputed over the whole sequence.
#
# Given the new token's vector `x_new` `(B, 1, d)`, the projections `w_q`, `w_k`, `w_v`
# `(d, d_h)` and the stored `keys` and `values` `(B, t, d_h)`, return the new token's attention
# output `(B, 1, d_h)` and the keys and values with its own appended, `(B, t + 1, d_h)` each. The
# check compares with attention recomputed over the whole sequence; the cell after it runs your
# step on every head of the trained model's first block.
#
# <details><summary>Hint 1: the idea</summary>
#
# Only the new token is computed: its key and value join the cached ones; its query attends to
# all of them, itself included, so no mask is needed.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Project only the new token to its query, key and
# value. (2) Grow the cache by the new key and value, along the token axis. (3) The new query
# attends to all the keys, itself included; return the output and the grown cache.</details>
#
# <details><summary>Hint 3: closer</summary>Scaled scores (by the square root of d_h), a softmax
# over the keys, the values weighted by it; no mask is needed.</details>

# %% [markdown] slideshow={"slide_type": "notes"}
# The cache stores each layer's keys and values so a new token costs one row, not the whole
# sequence again. The notebook proves cached and full recomputation equal before it times them:
# say why the proof comes first (a fast wrong answer is worthless).

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def cache_step(x_new: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                  torch.Tensor]:
    """One new token attends to the stored keys and values and its own; returns (out, keys,
    values)."""
    ### BEGIN SOLUTION
    query = x_new @ w_q                                          # (B, 1, d_h)
    keys = torch.cat([keys, x_new @ w_k], dim=1)                 # (B, t + 1, d_h)
    values = torch.cat([values, x_new @ w_v], dim=1)
    d_h = keys.shape[-1]
    attention = torch.softmax(query @ keys.mT / d_h ** 0.5, dim=-1)  # (B, 1, t + 1)
    return attention @ values, keys, values
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("gpt.cache_step", cache_step)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Your step on every head of the trained model
#
# The first block's attention of the trained model has `H` heads, each with its own slice of
# the projections (and a bias, carried here by a column of ones appended to every token's
# vector). The cache holds the keys and values of a prompt's first tokens; the last token
# arrives alone and goes through your `cache_step` once per head; `W_O` mixes the heads. The
# result must equal the last row of attention recomputed over the whole prompt:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import scaled_dot_product_attention


def course_cache_step(x_new: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor,
                      keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                         torch.Tensor]:
    """The same step with the course's attention (no mask: one query may see every key)."""
    keys, values = torch.cat([keys, x_new @ w_k], dim=1), torch.cat([values, x_new @ w_v], dim=1)
    return scaled_dot_product_attention(x_new @ w_q, keys, values)[0], keys, values


step = yours_or("gpt.cache_step", cache_step, course_cache_step)
attn = model.blocks[0].attn
n_heads, head_dim = attn.n_heads, attn.head_dim


def head_matrix(projection: nn.Linear, head: int) -> torch.Tensor:
    """One head's slice of a projection as a (d + 1, D_H) matrix, its bias as the last row."""
    rows = slice(head * head_dim, (head + 1) * head_dim)
    return torch.cat([projection.weight[rows].T, projection.bias[rows][None]])


# %% slideshow={"slide_type": "fragment"}
with torch.no_grad():
    # (1, T, d)
    h = model.blocks[0].ln1(model.embed(torch.tensor([tokenizer.encode("Once upon a time")])))
    full = attn(h, causal=True)                                      # (1, T, d), all tokens at once
    h1 = torch.cat([h, torch.ones_like(h[..., :1])], dim=-1)        # (1, T, d + 1): the bias column
    heads = []
    for head in range(n_heads):
        w_q, w_k, w_v = (head_matrix(p, head) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        stored_k, stored_v = h1[:, :-1] @ w_k, h1[:, :-1] @ w_v     # the cache: (1, T - 1, D_H)
        out, k, v = step(h1[:, -1:], w_q, w_k, w_v, stored_k, stored_v)
        heads.append(out)                                            # (1, 1, D_H)
    one_step = attn.out_proj(torch.cat(heads, dim=-1))               # (1, 1, d)
cache_gap = (one_step - full[:, -1:]).abs().max().item()
assert cache_gap < 1e-5
print(f"{n_heads} heads: stored keys {tuple(stored_k.shape)} + the new token's -> {tuple(k.shape)} "
      f"each; "
      f"output {tuple(one_step.shape)}")
print("one cached step vs the last row of full attention: largest difference < 1e-5")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The cache in helpers
#
# `GPT.forward_cached` does this with each block's weights through notebook 5's hook `kv_store`:
# `MultiHeadAttention.forward` projects only the new tokens, hands their keys and values to
# `kv_store` and attends to what it returns; the cache's hook writes them into a `KVCache` (two
# preallocated tensors) and returns all of that layer's. A prompt (several new tokens) needs
# notebook 4's end-aligned `causal_mask(n_new, n_total)`; one new token sees every stored key.
# Generation is inference only, so this runs section 10's fused kernels by default (`fast=True`);
# `fast=False` runs the course's own `Block`, as the cell checks too.
#
# First the proof: greedy generation with and without the cache writes the same tokens, and the
# cached logits equal the full forward pass.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.kv_cache import KVCache

prompt = torch.tensor([tokenizer.encode("Once upon a time"), tokenizer.encode('"Good morning, L')])
with_cache = generate(model, prompt, 100, temperature=0.0, use_cache=True)
recomputed = generate(model, prompt, 100, temperature=0.0, use_cache=False)
assert torch.equal(with_cache, recomputed)
print(
    f"prompts of {prompt.shape[1]} + 100 greedy tokens = {with_cache.shape[1]} tokens, context "
    f"{config.context_length}: cache and recomputation agree on every token:",
    torch.equal(with_cache, recomputed),
)

# %% slideshow={"slide_type": "fragment"}
window = with_cache[:, :config.context_length]
cache = KVCache.for_model(model, batch_size=2)
start = prompt.shape[1]
step_logits = [model.forward_cached(window[:, :start],
                                    cache)]  # the prompt at once, then one by one
step_logits += [model.forward_cached(window[:, t:t + 1], cache) for t in range(start,
        config.context_length)]
with torch.no_grad():
    full_logits = model(window)
largest_gap = (torch.cat(step_logits, dim=1) - full_logits).abs().max().item()
course_cache = KVCache.for_model(model, batch_size=2)  # the same with the course's own Block
course_logits = torch.cat([model.forward_cached(window[:, t:t + 1], course_cache, fast=False)
                           for t in range(config.context_length)], dim=1)
course_gap = (course_logits - full_logits).abs().max().item()
assert largest_gap < 1e-4 and course_gap < 1e-4
print(f"largest difference between cached and full logits over {config.context_length} positions: "
      "< 1e-4 (fused kernels and course Block alike)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Past the context length the model reads only the last `context_length` tokens, as nanoGPT's
# `generate` does (GPT-2's original sampling script refuses lengths past its window, and Hugging
# Face's GPT-2 has no position past its 1,024th), so positions shift and the cache is rebuilt from
# the new window: the tokens still match recomputation exactly, as the 116 tokens above show for a context of 64.
#
# ### How much faster?
#
# Timing needs a longer context to show the effect, so we time an untrained model the size of
# the benchmark's (4 layers, a context of 512; speed does not depend on the weights). Each
# length is generated greedily, with and without the cache:

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
long_model = GPT(GPTConfig(vocab_size=70, context_length=512, n_layers=4, n_heads=4,
                           d_model=128)).eval()
long_prompt = torch.randint(0, long_model.config.vocab_size, (1, 12))
lengths = [25, 50, 100, 150]  # recomputation's time grows with the square of the length
seconds = {"recompute": [], "KV cache": []}
for new_tokens in lengths:
    for name, use_cache in (("recompute", False), ("KV cache", True)):
        started = time.perf_counter()
        generate(long_model, long_prompt, new_tokens, temperature=0.0, use_cache=use_cache)
        seconds[name].append(time.perf_counter() - started)
for i, new_tokens in enumerate(lengths):
    print(f"{new_tokens:>4} new tokens: recompute {format_duration(seconds['recompute'][i])}, "
          f"KV cache {format_duration(seconds['KV cache'][i])}")

fig, ax = plt.subplots(figsize=(7, 4))
for name, values in seconds.items():
    ax.plot(lengths, values, "o-", label=name)
ax.set_xlabel("new tokens generated")
ax.set_ylabel("seconds")
ax.set_title("Greedy generation, context 512")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Recomputation does about `t` tokens of work at step `t`, so its total grows with the square
# of the length; the cache does one token of work per step (plus attention over the stored
# keys), so its total grows about linearly. `benchmarks/bench_kv_cache.py` times 500 new tokens
# at context 512.
#
# ### What the cache costs
#
# It stores a key and a value (2) in every layer (`L`) for every head (`H`), each of `d_h`
# numbers, for each of the `n` tokens: **`2 x L x H x d_h x n`** numbers per sequence. The
# formula against the cache's real tensors:

# %% slideshow={"slide_type": "fragment"}
long_cache = KVCache.for_model(long_model, batch_size=1)
cfg = long_model.config
formula_bytes = 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.context_length * 4  # float32
print(f"2 x {cfg.n_layers} x {cfg.n_heads} x {cfg.head_dim} x {cfg.context_length} x 4 bytes = "
      f"{formula_bytes:,} bytes")
print(f"keys {tuple(long_cache.keys.shape)} + values {tuple(long_cache.values.shape)}: "
      f"{long_cache.nbytes():,} bytes")
assert long_cache.nbytes() == formula_bytes
for name, (n_layers, n_heads, head_dim, n_tokens) in {
    "GPT-2 small, 1024 tokens": (12, 12, 64, 1024),
    "GPT-3 175B, 2048 tokens": (96, 96, 128, 2048),
}.items():
    fp16_bytes = 2 * n_layers * n_heads * head_dim * n_tokens * 2
    print(f"{name}, fp16: {fp16_bytes / 1e6:,.1f} MB per sequence")

# %% [markdown] slideshow={"slide_type": "slide"}
# A single GPT-3 sequence of 2048 tokens needs gigabytes of cache; a server with many users
# multiplies that by the batch. Grouped-query attention (notebook 5) shrinks `H` in the formula
# to the number of key/value heads.
#
# ## 7. Attention maps of the trained model (optional)
#
# Which characters does each head look at? We run a sentence from a validation story through
# the trained model and draw every head of every layer (`block.attn.last_weights`). Each row is
# a query character; it can only look left (the causal mask).

# %% [markdown] slideshow={"slide_type": "notes"}
# Show one head whose map is a clean diagonal (attending to the previous token) and one that
# spreads out. This cell refuses an untrained model: after a restart, run section 4 first or let
# its catch-up cell do it.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
sentence_text = next(line for line in val_text.splitlines() if 20 <= len(line) <= 26)
sentence_ids = torch.tensor([tokenizer.encode(sentence_text)])
with torch.no_grad():
    sentence_logits = model(sentence_ids)
sentence_loss = F.cross_entropy(sentence_logits[0, :-1], sentence_ids[0, 1:]).item()
refuse_untrained(sentence_loss, tokenizer.vocab_size)  # an untrained model's maps show nothing
chars = [c if c != " " else "␣" for c in sentence_text]
print(repr(sentence_text), f"{len(chars)} characters")
for layer, blk in enumerate(model.blocks):
    fig, axes = plt.subplots(1, config.n_heads, figsize=(22, 5.5))
    for head, ax in enumerate(axes):
        heatmap(
            blk.attn.last_weights[0, head],
            chars,
            chars,
            title=f"layer {layer}, head {head}",
            xlabel="key",
            ylabel="query" if head == 0 else "",
            ax=ax,
            annotate=False,
            vmin=0,
            vmax=1,
        )
    plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
# Look for heads that attend to the previous character (a bright line just below the diagonal),
# heads that look back to the start of the current word or to the space before it, and heads
# that spread their attention evenly. The exact pictures depend on the training run.
#
# ## 8. Encoder-only, decoder-only, encoder-decoder (optional)
#
# The same parts build all three transformer families (the DS 246 notes); what changes is the mask,
# whether there is cross-attention, and what the model is trained to predict.
#
# | | mask | cross-attention | training objective | examples |
# |---|---|---|---|---|
# | encoder-only | none: every token sees every token (bidirectional) | no | predict masked-out tokens | BERT, RoBERTa |
# | decoder-only | causal: each token sees itself and the past | no | predict the next token at every position | GPT, LLaMA |
# | encoder-decoder | encoder: none; decoder: causal | yes, in every decoder block | predict the next target token, given the source | T5, BART, the 2017 Transformer |
#
# **The mask.** One `Block`, run with and without the causal mask: change the last token, and
# see which outputs move.

# %% [markdown] slideshow={"slide_type": "notes"}
# The three families in one table (the DS 246 and CS 4804 notes): BERT reads both ways, GPT
# reads left to right, T5 and the original Transformer do both with cross-attention between them.
# Ask: "which family would you pick to classify a review, to translate, to chat?"

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "8.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
shared_block = Block(16, 2).eval()
tokens = torch.randn(1, 5, 16)
changed = tokens.clone()
changed[0, -1] = torch.randn(16)  # a different last token
for name, causal in (("encoder (bidirectional)", False), ("decoder (causal)", True)):
    with torch.no_grad():
        moved = (shared_block(changed, causal=causal) - shared_block(tokens,
                causal=causal)).abs().amax(-1)[0]
    print(f"{name:<24} outputs that changed: {(moved > 1e-6).int().tolist()}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The encoder's first four outputs moved because they look at the last token; the decoder's did
# not, which is what lets it be trained on every position at once and then generate.
#
# **Cross-attention** sits in the decoder of an encoder-decoder, between its masked
# self-attention and its FFN: queries come from the target being written, keys and values from
# the encoder's output (the USF notes' shapes: `Q [N_Q x D]`, `X [N_X x D]`, weights
# `[N_Q x N_X]`). Built from the helpers parts, for the DS 246 notes' source sentence "The cat sat
# here":

# %% slideshow={"slide_type": "fragment"}
class DecoderBlockWithCrossAttention(nn.Module):
    """Pre-LN decoder block of an encoder-decoder: causal self-attention, cross-attention, FFN."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2, self.ln3 = LayerNorm(d_model), LayerNorm(d_model), LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = MultiHeadAttention(d_model, n_heads)
        self.mlp = FeedForward(d_model)

    def forward(self, target: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """target (B, N_target, d), memory = encoder output (B, N_source, d) -> (B, N_target, d)."""
        x = target + self.self_attn(self.ln1(target), causal=True)
        x = x + self.cross_attn(self.ln2(x),
                                context=memory)  # queries: target; keys, values: source
        return x + self.mlp(self.ln3(x))


# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
source_words, target_words = ["The", "cat", "sat", "here"], ["<start>", "Le", "chat", "était",
                                                             "assis"]
encoder = Block(16, 2).eval()
decoder = DecoderBlockWithCrossAttention(16, 2).eval()
with torch.no_grad():
    memory = encoder(torch.randn(1, len(source_words), 16), causal=False)   # (1, 4, 16)
    out = decoder(torch.randn(1, len(target_words), 16), memory)            # (1, 5, 16)
cross = decoder.cross_attn.last_weights[0, 0]
print("encoder output", tuple(memory.shape), "| decoder output", tuple(out.shape),
      "| cross-attention weights", tuple(decoder.cross_attn.last_weights.shape))
fig, axes = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"wspace": 0.45})
heatmap(decoder.self_attn.last_weights[0, 0], target_words, target_words, ax=axes[0],
        title="decoder self-attention (causal)", xlabel="target key", ylabel="target query")
heatmap(cross, target_words, source_words, ax=axes[1], title="cross-attention (no mask)",
        xlabel="source key (encoder)", ylabel="target query")
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The decoder's self-attention is triangular; its cross-attention is a full `5 x 4` rectangle:
# every target position may read the whole source (the weights are random here, untrained).
#
# **The objective.** A decoder-only model learns from every position of every window (section
# 4). An encoder-only model like BERT hides about 15 % of the tokens and learns only from
# those; the DS 246 notes note that next-token prediction gives "more learning signals". Per window of
# our 64 characters:

# %% slideshow={"slide_type": "fragment"}
window_length, mask_share = config.context_length, 0.15
print(f"decoder-only, next token: {window_length} predictions per window")
print(f"encoder-only, {mask_share:.0%} masked: about {window_length * mask_share:.0f} predictions "
      f"per window")
masked = torch.rand(window_length, generator=torch.Generator().manual_seed(0)) < mask_share
print(f"one random masking of {window_length} positions hid {int(masked.sum())}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 9. Saving and loading a checkpoint (optional)
#
# `helpers.model.checkpoints.save_checkpoint` stores the config, the weights and (optionally) the optimiser
# state, all as plain tensors, numbers and strings, so that `load_checkpoint` can read it with
# `torch.load(..., weights_only=True)`, which refuses to unpickle arbitrary objects and so
# cannot run code hidden in a file.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "9.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.checkpoints import load_checkpoint, save_checkpoint

with tempfile.TemporaryDirectory() as folder:
    path = save_checkpoint(Path(folder) / "char_gpt.pt", model, trainer.optimizer,
                           steps=TRAIN_STEPS)
    restored, saved = load_checkpoint(path)
    print(f"{path.name}: keys {sorted(saved)}, extra {saved['extra']}")
restored.eval()
with torch.no_grad():
    same = torch.equal(restored(sentence_ids), model(sentence_ids))
assert same and restored.lm_head.weight is restored.embed.token.weight
print("restored model gives identical logits:", same, "| still tied:",
      restored.lm_head.weight is restored.embed.token.weight)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 10. How fast is the trainer? (optional)
#
# The trainer is fast for a CPU because of a few choices, all in `helpers.training.speed` and each measured
# by `benchmarks/bench_train.py` (against a plain loop and against nanoGPT's recipe):
#
# - **bfloat16** on CPUs with native bf16 instructions (elsewhere it falls back to float32 by
#   itself; `COURSE_PRECISION=fp32` forces float32): forward and backward run on a bf16 copy of
#   the model, whose products read half the bytes and use the CPU's bf16 instructions, while
#   AdamW updates the float32 weights and refreshes the copy once per step (`torch.autocast`
#   would cast weights op by op, at every product of every step);
# - **fused kernels**: `GPT.forward(..., fast=True)` calls PyTorch's LayerNorm, one product for
#   Q, K and V together, and PyTorch's `scaled_dot_product_attention` in float32, instead of
#   the step-by-step versions we wrote;
# - **one buffer for all the weights** and one for all the gradients (`FlatWeights`): every
#   parameter is a view into it, so copying the gradients to float32, clipping them, the fused
#   AdamW step and refreshing the bf16 copy are a handful of operations on long vectors instead
#   of hundreds on small tensors;
# - batches cut out of the token tensor with one indexing operation.
#
# One more lever is off by default: `TrainConfig(compile=True)` runs the loss through
# `torch.compile`, which fuses the forward and backward passes further. Its first step compiles
# for tens of seconds (and needs a C++ compiler), so it pays for long runs, not for a live demo.
#
# The plain path (`TrainConfig(fast=False)`) keeps the course's own code in float32; a test
# checks that both give the same loss on the same batch, and that in float32 they take the same
# steps. The benchmark races a plain training loop against the trainer, with and without
# compile, on the same model (the `bench_config` below), data and batch, for a minute and for
# three, and compares tokens per second and validation loss. A short side-by-side measurement,
# here:

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "10.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Speeds depend on the machine and on whatever else runs on it; benchmarks/bench_train.py holds the
# budget.
bench_config = GPTConfig(vocab_size=70, context_length=64, n_layers=4, n_heads=4, d_model=128)
racers = {}
for fast in (False, True):
    torch.manual_seed(0)
    racers["fast" if fast else "plain"] = Trainer(GPT(bench_config), train_ids, val_ids,
                                                  TrainConfig(batch_size=12, fast=fast))
busy = {name: 0.0 for name in racers}
for _ in range(3):  # take turns, so that other work on the machine slows both alike
    for name, racer in racers.items():
        racer.train_step(1e-3)  # the first of each turn warms up, untimed
        started = time.perf_counter()
        for _ in range(3):
            racer.train_step(1e-3)
        busy[name] += time.perf_counter() - started
speeds = {name: 3 * 3 * 12 * bench_config.context_length / seconds for name,
          seconds in busy.items()}
print(f"plain path {speeds['plain']:,.0f} tokens/s, fast path {speeds['fast']:,.0f} tokens/s: "
      f"{speeds['fast'] / speeds['plain']:.1f}x")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. What are the differences between a transformer encoder and a decoder? (the USF notes)**
#
# <details><summary>Answer</summary>
#
# The mask: an encoder's self-attention sees every token, a decoder's sees only the past
# (section 8). Cross-attention: the decoder of an encoder-decoder has a third sub-layer whose
# keys and values come from the encoder, which adds `4d² + 4d` weights and a LayerNorm (`2d`)
# per block, as the cell below counts for `d = 768`. The objective: encoders learn to fill in
# masked tokens and produce representations; decoders learn to predict the next token and
# generate. A decoder-only GPT has no encoder and so no cross-attention at all.
# </details>

# %% [markdown] slideshow={"slide_type": "notes"}
# Close with the parameter-count and memory questions: they come back in notebooks 11 and 12,
# where the models no longer fit one machine.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "Check")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
d = 768
encoder_block = 12 * d * d + 13 * d  # attention, FFN, their biases, two LayerNorms
cross_extra = 4 * d * d + 4 * d + 2 * d
print(f"block with self-attention + FFN (d=768): {encoder_block:,}")
print(f"decoder block with cross-attention: {encoder_block + cross_extra:,} (+{cross_extra:,})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. What parallelises in a transformer, and what does not? (the USF notes)**
#
# <details><summary>Answer</summary>
#
# In training, everything across positions: one forward pass of a `(B, N)` batch makes `B x N`
# next-token predictions at once (the causal mask stops each from seeing its answer), all heads
# run as one batched product, and LayerNorm and the FFN treat all tokens as one big matrix. The
# cell counts the predictions per step of our training run. In generation, tokens come one after
# another: each needs the previous one, so `n` new tokens take `n` forward steps however many
# cores there are. The KV cache makes each step cheap; it does not make the steps parallel.
# </details>

# %% slideshow={"slide_type": "fragment"}
print(f"one training step: {train_config.batch_size} x {config.context_length} = "
      f"{train_config.batch_size * config.context_length:,} next-token predictions in one forward "
      f"pass")
print("generating 100 tokens: 100 forward steps, one after another")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. GPT-2 small (the textbook section).** `N = 12`, `d = 768`, `V = 50257`, tied weights. (a) The
# parameters of the blocks with `12d²` per layer? (b) Add the embedding, counted once.
# (c) The reported total is about 124M: where does the gap come from?
#
# <details><summary>Answer</summary>
#
# (a) `12 x 12 x 768² = 84,934,656`. (b) `+ 50257 x 768 = 38,597,376` gives `123,532,032`.
# (c) The exact count is `124,439,808` (section 3); the gap of `907,776` is the position table
# (`1024 x 768 = 786,432`), the biases (`9d` per block, `82,944`) and the LayerNorms (`4d` per
# block plus the final `2d`: `38,400`). The textbook section's sketch names the positions and the
# LayerNorms (it says "~37K") but forgets the biases, which are twice as many as the LayerNorm
# parameters. The cell computes each number.
# </details>

# %% slideshow={"slide_type": "fragment"}
blocks_12d2 = 12 * 12 * 768**2
embedding = 50257 * 768
gaps = {"positions": 1024 * 768, "biases": 12 * 9 * 768, "LayerNorms": 12 * 4 * 768 + 2 * 768}
print(f"(a) {blocks_12d2:,}  (b) {blocks_12d2 + embedding:,}")
print(f"(c) exact {exact_parameters(gpt2):,}, gap "
      f"{exact_parameters(gpt2) - blocks_12d2 - embedding:,} = "
      + " + ".join(f"{name} {value:,}" for name, value in gaps.items()))
assert blocks_12d2 + embedding + sum(gaps.values()) == exact_parameters(gpt2)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. The KV cache (the textbook section).** The textbook section says that without a cache a 1,000-token response
# needs "roughly 500,000 redundant Key and Value computations". Check it, and say what the cache
# costs instead.
#
# <details><summary>Answer</summary>
#
# Step `t` (counting from an empty context) recomputes the keys and values of the `t - 1`
# earlier tokens, so the total is `0 + 1 + ... + 999 = 499,500`, per layer and head: the notes'
# round number. The cache replaces that work with memory, `2 x L x H x d_h x n` numbers that
# grow linearly with the length; for GPT-2 small at 1024 tokens in fp16 the cell prints the
# size per sequence, and section 6 the GPT-3 one. That is why servers shrink it with GQA
# (fewer key/value heads), paging and quantisation.
# </details>

# %% slideshow={"slide_type": "fragment"}
redundant = sum(t - 1 for t in range(1, 1001))
print(f"redundant key/value computations for 1,000 tokens: {redundant:,}")
print(f"GPT-2 small cache, 1024 tokens, fp16: {2 * 12 * 12 * 64 * 1024 * 2 / 1e6:.1f} MB per "
      f"sequence")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Optional: your own text (optional)
#
# Section 4 trained on the course corpus. The same tokenizer, model and Trainer learn from any
# text you have: a book from Project Gutenberg, your notes, song lyrics, code. Save it as a
# plain UTF-8 text file (a few hundred kilobytes or more; a whole novel is ideal), put its path
# in `MY_TEXT_FILE` and run the cell. `helpers.lab.own_text.gpt_on_text_file` reads the file with
# `read_text_file` (which explains what is wrong with a missing, empty, binary or non-UTF-8
# file), trains notebook 1's BPE on it with `MY_VOCAB_SIZE` ids, trains a GPT of size
# `MY_CONFIG` for `MY_STEPS` steps with the Trainer (the first 90% of the tokens for training,
# the last 10% for validation), and samples a continuation of the validation text's first
# tokens. A file too short for one training and one validation window is refused with the number
# of tokens it needs. On a laptop CPU the default run takes a minute or two; more steps, or a
# GPU, give text that sounds more like yours. Left `None`, the cell only says what it would do.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "Optional: your")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.own_text import gpt_on_text_file

MY_TEXT_FILE = None  # <- the path of a UTF-8 text file, such as "my_book.txt"
MY_STEPS = 300
MY_VOCAB_SIZE = 512
MY_CONFIG = GPTConfig(context_length=128, n_layers=4, n_heads=4,
                      d_model=128)  # vocab_size: the tokenizer's

if MY_TEXT_FILE is not None:
    my_run = gpt_on_text_file(MY_TEXT_FILE, steps=MY_STEPS, vocab_size=MY_VOCAB_SIZE,
                              config=MY_CONFIG)
    my_history = my_run.history
    print(f"{len(my_history.losses)} steps, {format_duration(my_history.train_seconds)}: "
          f"validation loss "
          f"{my_history.val_losses[0]:.2f} at step {my_history.eval_steps[0]}, "
          f"{my_history.val_losses[-1]:.2f} at the end")
    print(my_run.sample)
else:
    print(f"MY_TEXT_FILE = None: nothing read. A path would train a BPE tokenizer of "
          f"{MY_VOCAB_SIZE} ids and a GPT "
          f"({MY_CONFIG.n_layers} layers, d_model {MY_CONFIG.d_model}, windows of "
          f"{MY_CONFIG.context_length} "
          f"tokens) for {MY_STEPS} steps on that file, then print the losses and a sample.")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Optional: GPT-2's own weights in this GPT (needs internet; off by default) (optional)
#
# Section 3 built GPT-2 small's architecture and counted 124,439,808 parameters without
# allocating one. OpenAI published the trained weights, and Hugging Face hosts them with the
# tokenizer files. `helpers.model.gpt2` loads them into the course `GPT` from section 1, unchanged:
#
# - **the weights** (`model.safetensors`): the names differ (`h.0.attn.c_attn.weight` is block
#   0's attention), GPT-2's projections are stored as (in, out), the transpose of an
#   `nn.Linear`'s (out, in), and its W_Q, W_K, W_V are one matrix of `3 d` columns, cut into three;
# - **the tokenizer** (`vocab.json`, `merges.txt`): GPT-2's tokenizer is notebook 1's byte-level
#   BPE, with the same pre-tokenizer rule. Its merges build a course `BPETokenizer`; only the
#   ids are relabelled, because GPT-2 writes each byte as a printable character and numbers
#   its tokens in its own order.
#
# The tests (`tests/model/test_gpt2.py`, `tests/text/test_gpt2_tokenizer.py`) prove both on files written
# by Hugging Face's own libraries: the same logits as its GPT-2 to 1e-5 (plain, fast and
# cached paths), the same token ids on arbitrary Unicode. The cell below shows GPT-2's byte
# table: the bytes that print as themselves keep their character, the others are moved to
# characters from 256 up, so that the space becomes `Ġ`.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt",
         "Optional: GPT-2's")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.text.gpt2_tokenizer import bytes_to_unicode

byte_table = bytes_to_unicode()
moved = [byte for byte, char in byte_table.items() if ord(char) != byte]
print(f"{len(moved)} of 256 bytes are moved; space -> {byte_table[32]!r}, newline -> "
      f"{byte_table[10]!r}, 'A' -> {byte_table[65]!r}")
assert len(moved) == 68 and byte_table[32] == "Ġ"

# %% [markdown] slideshow={"slide_type": "subslide"}
# **The knob.** Set `LOAD_GPT2 = True` on a machine with internet (Colab is one) and run the
# cell: it downloads GPT-2 small's three files (about half a gigabyte, as the cell prints) once
# into a cache folder, loads them with the code the tests prove, prints the parameter count
# beside section 3's, and continues a prompt with the course's `generate` and KV cache (top-k sampling, seeded).
# Left `False`, nothing touches the network: the cell says what it would do.

# %% slideshow={"slide_type": "fragment"}
from pathlib import Path

from helpers.model.gpt import GPTConfig, count_parameters, exact_parameters
from helpers.model.gpt2 import GPT2_FILES, GPT2_URL, gpt2_demo

LOAD_GPT2 = False  # <- set to True on a machine with internet (downloads about half a GB once)
GPT2_CACHE_NAME = "~/.cache/transformer-course/gpt2"
GPT2_PROMPT = "The Transformer is a neural network that"

if LOAD_GPT2:
    gpt2_model, gpt2_tokenizer, gpt2_text = gpt2_demo(Path(GPT2_CACHE_NAME).expanduser(),
                                                      GPT2_PROMPT,
                                                      max_new_tokens=40)
    print(f"GPT-2 small in the course GPT: {count_parameters(gpt2_model):,} parameters "
          f"(section 3: {exact_parameters(GPTConfig.gpt2_small()):,})")
    print(gpt2_text)
else:
    weight_bytes = 4 * exact_parameters(GPTConfig.gpt2_small())  # float32
    print(f"LOAD_GPT2 = False: nothing downloaded. True would fetch {', '.join(GPT2_FILES)}")
    print(f"from {GPT2_URL}")
    print(f"into {GPT2_CACHE_NAME} (once), load GPT-2 small's "
          f"{exact_parameters(GPTConfig.gpt2_small()):,} parameters into a course GPT and continue "
          f"{GPT2_PROMPT!r}")
    print(f"the weights alone: {weight_bytes / 1e6:.0f} MB in float32")
# %% [markdown] slideshow={"slide_type": "slide"}
# ## Appendix: the Matrix Magic notes' walk-through, every table checked (optional)
#
# Section 2 ran the notes' sentence through a GPT with their embedding tables and our own
# random weights. This appendix finishes the audit with their own weights.
#
# The notes print every matrix of their walk-through: the four heads side by side, `W_O`, the
# FFN's `W1` and `W2` (to one decimal), the LM head, and each intermediate table. So we can redo
# every step from the notes' own inputs and check each of their tables against it. The tables are
# typed in as on the slides, in `data/notes_tables.txt`, read by one call in section 2 (their
# first sum was checked there, the stream in notebook 6).
#
# Each step, computed from the notes' own input to it, against the notes' table for it. The
# largest entry-wise gap tells whether the table follows from its inputs; the tables are printed
# to two decimals (the FFN weights to one), so gaps of a few hundredths are rounding.

# %% slideshow={"slide_type": "fragment"}
catch_up("07_gpt", "Appendix:")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
print("the Matrix Magic notes' tables, read from data/notes_tables.txt:")
print(", ".join(f"{name} {tuple(table.shape)}" for name, table in vars(mm).items()))

NOTES_EPS = 0.001  # the notes' LayerNorm epsilon


def largest_gap(computed: torch.Tensor, notes: torch.Tensor) -> float:
    """Largest entry-wise difference, rounded to 6 decimals so that round-off cannot move a
    digit."""
    return round((computed - notes).abs().max().item(), 6)


def notes_layer_norm(x: torch.Tensor) -> torch.Tensor:
    """What the notes' LayerNorm tables compute: the standard deviation where the variance
    belongs."""
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.std(-1, correction=0, keepdim=True)
                                                       + NOTES_EPS)


# %% slideshow={"slide_type": "fragment"}
relu = F.relu(mm.LINEAR_1)
steps = [
    ("heads @ W_O", mm.HEADS @ mm.W_O, mm.ATTENTION),
    ("residual: + embeddings", mm.ATTENTION + mm.SUM_TABLE, mm.STREAM),
    ("LayerNorm (nn.LayerNorm)", F.layer_norm(mm.STREAM, (8,), eps=NOTES_EPS), mm.LAYER_NORM),
    ("stream @ W1 (as drawn)", mm.STREAM @ mm.W1, mm.LINEAR_1),
    ("notes' LayerNorm @ W1", mm.LAYER_NORM @ mm.W1, mm.LINEAR_1),
    ("ReLU", relu, mm.RELU),
    ("ReLU @ W2", relu @ mm.W2, mm.LINEAR_2),
    ("dropout slide 1 vs its input", mm.LINEAR_2, mm.DROPOUT_A),
    ("dropout slide 2 vs its input", mm.LINEAR_2, mm.DROPOUT_B),
    ("final LayerNorm (nn.LayerNorm)",
     F.layer_norm(mm.STREAM + mm.DROPOUT_B, (8,), eps=NOTES_EPS), mm.FINAL_LN),
    ("notes' LayerNorm of dropout B", notes_layer_norm(mm.DROPOUT_B), mm.FINAL_LN),
    ("final LayerNorm @ LM head", mm.FINAL_LN @ mm.LM_HEAD, mm.LOGITS),
    ("softmax(logits)", mm.LOGITS.softmax(-1), mm.PROBABILITIES),
]
gaps = {name: largest_gap(computed, notes) for name, computed, notes in steps}
print(f"{'step':<32}{'largest gap to the notes':>26}")
for name, gap in gaps.items():
    print(f"{name:<32}{gap:>26.2f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Where the notes differ, and why
#
# Where a gap is large, the cells below find what the notes did instead.
#
# **The FFN's two linear layers.** The slide draws the stream itself going into `W1`, which gives
# values far larger than the notes' table (the `stream @ W1` line). Their table follows instead
# from their LayerNorm rows, as in GPT-2's `x + FFN(LN(x))`, to within about half a unit, and the
# second layer to a similar gap. That is what printing `W1` and `W2` to one decimal allows: each
# weight may be off by up to 0.05, so an output may be off by up to 0.05 times the sum of the
# absolute values of its inputs. The cell computes that bound, then looks at ReLU.
#
# **ReLU.** Rows 2 to 4 of the notes' ReLU table are exactly `max(0, x)` of their first linear
# layer's output. Row 1 is not: from column 10 on, its entries sit one column to the left of
# where they belong, and a 0 fills the gap.

# %% slideshow={"slide_type": "fragment"}
for name, inputs, notes_output, weights in (("W1", mm.LAYER_NORM, mm.LINEAR_1, mm.W1),
                                            ("W2", relu, mm.LINEAR_2, mm.W2)):
    bound = 0.05 * inputs.abs().sum(-1, keepdim=True)                  # (4, 1): one bound per row
    within = ((inputs @ weights - notes_output).abs() <= bound).all().item()
    print(f"{name}: largest gap {largest_gap(inputs @ weights, notes_output):.2f}, "
          f"rounding bound per row {round(bound.min().item(), 6):.2f} to "
          f"{round(bound.max().item(), 6):.2f}, "
          f"every entry within its row's bound: {within}")
    assert within

notes_row, true_row = mm.RELU[0], relu[0]
wrong_columns = ((notes_row - true_row).abs() > 1e-9).nonzero().flatten() + 1
print("rows 2-4 exact:", torch.equal(mm.RELU[1:], relu[1:]))
print("row 1, columns that differ:", wrong_columns.tolist())
print("notes' row 1, columns 10-23:", notes_row[9:23].tolist())
print("true row 1,   columns 11-24:", true_row[10:24].tolist())
assert torch.equal(notes_row[9:23], true_row[10:24]) and torch.equal(notes_row[24:], true_row[24:])

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Dropout.** Both dropout slides keep the surviving values exactly as they were. `nn.Dropout(p)`
# in training mode multiplies the survivors by `1/(1-p)`, so that each value keeps its expected
# size; the notes do not give `p`, so the cell uses 0.1. And the two slides, which show the same
# step, zero different entries.
#
# **The final LayerNorm.** In GPT-2 the FFN's output is added to the stream (the second residual),
# and the final LayerNorm normalises that sum. The notes' table instead follows from the
# **second** dropout table alone, with no residual, and with the slip notebook 6 found in their
# first LayerNorm (the standard deviation where the variance belongs): the `notes' LayerNorm of
# dropout B` line above has a small gap, the `nn.LayerNorm` line a large one. From there on the
# notes are consistent again: their logits are their final rows times the LM head, and their
# probabilities the softmax of their logits (small gaps above).
#
# The same weights, run the way GPT-2 runs them at inference (true LayerNorms, both residuals,
# no dropout), give other predictions (the last lines of the cell):

# %% slideshow={"slide_type": "fragment"}
def zeroed(table: torch.Tensor) -> list[tuple[int, int]]:
    """(row, column) of the entries dropout set to 0, counting from 1 like the slides."""
    return [(r + 1, c + 1) for r, c in ((table == 0) & (mm.LINEAR_2 != 0)).nonzero().tolist()]


kept = mm.DROPOUT_A != 0
survivor_ratio = mm.DROPOUT_A[kept] / mm.LINEAR_2[kept]
print(
    f"notes: survivors / inputs between {survivor_ratio.min():.2f} and {survivor_ratio.max():.2f}"
)
torch.manual_seed(0)
dropped = nn.Dropout(p=0.1).train()(mm.LINEAR_2)
ratios = dropped[dropped != 0] / mm.LINEAR_2[dropped != 0]
print(f"nn.Dropout(p=0.1): survivors / inputs = {ratios.min():.4f} = 1/(1 - 0.1) = {1 / 0.9:.4f}")
print("first slide zeroes", zeroed(mm.DROPOUT_A), "| second slide zeroes", zeroed(mm.DROPOUT_B))

stream = mm.STREAM
hidden = F.relu(F.layer_norm(stream, (8,), eps=NOTES_EPS) @ mm.W1)
stream = stream + hidden @ mm.W2
probabilities_done_right = (F.layer_norm(stream, (8,), eps=NOTES_EPS) @ mm.LM_HEAD).softmax(-1)
for t, word in enumerate(sentence):
    ours = probabilities_done_right[t].argmax().item()
    theirs = mm.PROBABILITIES[t].argmax().item()
    print(f"after '{word}': notes predict '{toy_vocab[theirs]}', the same weights done right "
          f"'{toy_vocab[ours]}' ({probabilities_done_right[t, ours]:.2f})")

