# %% [markdown]
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
# - train a small GPT on a laptop CPU and judge its output with a measurement, not by eye;
# - sample with temperature and top-k, and write a greedy decoding step;
# - explain, build and time a KV cache, and compute its memory;
# - say what changes between encoder-only, decoder-only and encoder-decoder models.
#
# **It assumes** notebooks 1 to 6; the `helpers` modules they wrote are the parts used here.

# %% [setup]

# %%
import math
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import causal_mask
from helpers.corpus import load_corpus, well_formed_fraction
from helpers.embeddings import TokenAndPositionEmbedding
from helpers.exercises import check
from helpers.layers import Block, LayerNorm, MultiHeadAttention, FeedForward, merge_heads, split_heads
from helpers.plots import heatmap
from helpers.timing import format_duration

# Two cores, often shared with other work (a browser, a video call): one thread per product
# avoids threads waiting for each other. On a quiet machine with more cores, delete this line.
torch.set_num_threads(1)

# %% [markdown]
# ## 1. From parts to a model
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
# Seed 002's algorithm also multiplies the token embedding by `sqrt(d)`, as the 2017
# Transformer did; GPT-2 does not, and neither do we.
#
# In plain code, with the parts of the earlier notebooks:

# %%
class MiniGPT(nn.Module):
    """Decoder-only GPT from the course's parts: token ids (B, N) -> logits (B, N, V)."""

    def __init__(self, vocab_size: int, context_length: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.embed = TokenAndPositionEmbedding(vocab_size, context_length, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.embed.token.weight  # weight tying: one matrix, two jobs

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(token_ids)                      # (B, N, d)
        for block in self.blocks:
            x = block(x, causal=True)                  # (B, N, d)
        return self.lm_head(self.ln_f(x))              # (B, N, V)


torch.manual_seed(0)
mini = MiniGPT(vocab_size=52, context_length=64, n_layer=2, n_head=4, n_embd=128)
print(mini.lm_head.weight is mini.embed.token.weight, "- the output matrix is the token table")

# %% [markdown]
# The same model lives in `helpers.gpt` as `GPT`, configured by a dataclass, `GPTConfig`, that
# checks its numbers. `GPT` adds GPT-2's initialisation (`init_gpt2_` of notebook 6), dropout, a
# cached forward for generation (section 6) and a fast path for training (section 10). With the
# same weights it computes exactly what `MiniGPT` computes:

# %%
from helpers.gpt import GPT, GPTConfig

config = GPTConfig(vocab_size=52, context_length=64, n_layer=2, n_head=4, n_embd=128)
print(config)
model = GPT(config)
mini.load_state_dict(model.state_dict())
ids = torch.randint(0, 52, (2, 64))
assert torch.equal(mini(ids), model(ids))
print("MiniGPT == helpers.gpt.GPT:", torch.equal(mini(ids), model(ids)))

# %% [markdown]
# The config refuses sizes that cannot work, naming the numbers (here a width that the heads
# cannot share evenly), and the model refuses token ids outside its vocabulary:

# %%
for bad in (lambda: GPTConfig(n_embd=130, n_head=4), lambda: model(torch.tensor([[3, 60]]))):
    try:
        bad()
    except ValueError as error:
        print("ValueError:", error)

# %% [markdown]
# ## 2. One forward pass at toy size (seed 001)
#
# Seed 001 walks the sentence "I like to eat" through a GPT with a vocabulary of 12 words and
# `d_model = 8`, one matrix at a time. We do the same with a one-block `GPT`: its token and
# position tables are set to the seed's tables, so the first sum can be checked against the
# slide. The seed's later matrices came from weights it does not print, so from there on our
# (random) weights give other numbers; the shapes are the point. Two heads of size 4 keep
# `H x d_h = d_model`, as GPT-2 does; the seed's four heads of size 4 concatenate to 16 columns.

# %%
toy_vocab = ["I", "like", "to", "eat", "soup", "am", "a", "good", "cook", ".", "is", "yummy"]
seed_token_table = torch.tensor([
    [0.26, 0.38, 0.00, 0.27, 0.18, 0.67, 0.65, 0.57], [0.23, 0.72, 0.86, 0.96, 0.33, 0.93, 0.23, 0.31],
    [0.89, 0.42, 0.71, 0.64, 0.51, 0.31, 0.63, 0.15], [0.90, 0.53, 0.41, 0.12, 0.52, 0.28, 0.99, 0.00],
    [0.55, 0.03, 0.98, 0.36, 0.01, 0.24, 0.47, 0.69], [0.12, 0.33, 0.50, 0.34, 0.41, 0.32, 0.57, 0.04],
    [0.89, 0.34, 0.20, 0.76, 0.04, 0.49, 0.65, 0.54], [0.39, 0.21, 0.99, 0.55, 0.51, 0.71, 0.05, 0.78],
    [1.00, 0.16, 0.37, 0.49, 0.18, 0.78, 0.94, 0.56], [0.97, 0.66, 0.28, 0.82, 0.71, 0.64, 0.18, 0.04],
    [0.56, 0.00, 0.56, 0.29, 0.37, 0.83, 0.95, 0.56], [0.73, 0.67, 0.46, 0.21, 0.18, 0.97, 0.60, 0.38]])
seed_position_table = torch.tensor([
    [0.42, 0.16, 0.05, 0.38, 0.05, 0.79, 0.12, 0.27], [0.19, 0.50, 0.26, 0.53, 0.71, 0.16, 0.42, 0.32],
    [0.32, 0.24, 0.36, 0.86, 0.02, 0.60, 0.31, 0.01], [0.90, 0.39, 0.44, 0.01, 0.20, 0.66, 0.94, 0.75]])
seed_sum_table = torch.tensor([  # the seed's "Token Embeddings (4,8) + Position Embeddings (4,8)"
    [0.68, 0.54, 0.06, 0.65, 0.23, 1.45, 0.76, 0.84], [0.43, 1.22, 1.13, 1.49, 1.04, 1.09, 0.65, 0.62],
    [1.20, 0.66, 1.08, 1.50, 0.54, 0.91, 0.94, 0.16], [1.80, 0.92, 0.84, 0.14, 0.72, 0.94, 1.93, 0.76]])

torch.manual_seed(0)
toy = GPT(GPTConfig(vocab_size=12, context_length=4, n_layer=1, n_head=2, n_embd=8)).eval()
with torch.no_grad():
    for param in toy.parameters():
        if param.dim() == 2:
            param.normal_(0.0, 0.5)  # larger than GPT-2's 0.02, so that two decimals show something
    toy.embed.token.weight.copy_(seed_token_table)
    toy.embed.position.weight.copy_(seed_position_table)
sentence = ["I", "like", "to", "eat"]
toy_ids = torch.tensor([[toy_vocab.index(word) for word in sentence]])
print(toy.config)
print(f"here: {toy.config.n_head} heads x d_h {toy.config.head_dim} = {toy.config.n_embd} = d_model; "
      f"seed 001: 4 heads x 4 = {4 * 4} columns, then W_O (16, 8)")
print("token ids:", toy_ids.tolist())

# %%
torch.set_printoptions(precision=2, sci_mode=False)


def show(name: str, tensor: torch.Tensor) -> None:
    """Print a named intermediate with its shape, batch axis dropped."""
    print(f"{name}  {tuple(tensor.shape)}\n{tensor[0].detach()}\n")


block = toy.blocks[0]
with torch.no_grad():
    x0 = toy.embed.token(toy_ids) + toy.embed.position(torch.arange(4))
    show("token + position embeddings  (B, N, d)", x0)
    assert torch.allclose(x0[0], seed_sum_table, atol=0.011)  # the seed rounds to two decimals
    print(f"largest difference from the seed's sum table: {(x0[0] - seed_sum_table).abs().max():.2f}\n")
    h = block.ln1(x0)
    q, k, v = (split_heads(proj(h), 2) for proj in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj))
    show("queries, split into heads  (B, H, N, d_h)", q)
    scores = q @ k.transpose(-2, -1) / math.sqrt(4)
    show("scores Q K^T / sqrt(d_h)  (B, H, N, N)", scores)
    weights = scores.masked_fill(~causal_mask(4), float("-inf")).softmax(dim=-1)
    show("attention weights after the causal mask  (B, H, N, N)", weights)
    heads = merge_heads(weights @ v)
    show("heads side by side  (B, N, H*d_h)", heads)
    x1 = x0 + block.attn.out_proj(heads)
    show("residual stream after attention: x + W_O(heads)  (B, N, d)", x1)
    hidden = F.gelu(block.mlp.up(block.ln2(x1)))
    show("FFN hidden layer after GELU  (B, N, 4d)", hidden)
    x2 = x1 + block.mlp.down(hidden)
    show("residual stream after the FFN  (B, N, d)", x2)
    logits = toy.lm_head(toy.ln_f(x2))
    show("logits: final LayerNorm, then the tied output matrix  (B, N, V)", logits)
    probabilities = logits.softmax(dim=-1)
    show("next-token probabilities  (B, N, V)", probabilities)
assert torch.allclose(probabilities, toy(toy_ids).softmax(dim=-1), atol=1e-6)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# The first matrix agrees with the seed's sum table to within 0.01 in every entry (the
# assertion checks each one): the seed added unrounded tables and then rounded, so a last digit
# can differ, as `0.00 + 0.05` showing as `0.06` on the slide. The last matrix equals
# `toy(ids).softmax(-1)`, so the walk-through skipped nothing. Row `t` of
# the probabilities is the model's guess for the token after position `t`: one forward pass
# makes a prediction at **every** position at once, which is what makes training parallel.
# Each row sums to 1, and the most likely next word after each prefix is:

# %%
for t in range(len(sentence)):
    best = probabilities[0, t].argmax().item()
    print(f"after '{' '.join(sentence[:t + 1])}': '{toy_vocab[best]}' ({probabilities[0, t, best]:.2f}),"
          f" row sum {probabilities[0, t].sum():.2f}")

# %% [markdown]
# Untrained, the guesses are arbitrary. Training changes that (section 4).
#
# ## 3. Counting parameters
#
# Seed 002's table counts the weight matrices of one block: attention has `W_Q, W_K, W_V, W_O`,
# each `d x d` (`4d²`); the FFN has `d x 4d` and `4d x d` (`8d²`). With `N` blocks and a
# vocabulary matrix of `V x d` at each end, the count is about **`12Nd² + 2Vd`**. The exact
# count adds the biases (`4d` in attention, `5d` in the FFN), two LayerNorms per block (`4d`),
# the position table (`context x d`) and the final LayerNorm (`2d`), and counts a tied matrix
# once. For our character model:

# %%
from helpers.gpt import (build_without_weights, count_parameters, exact_parameters,
                         formula_parameters, parameter_breakdown)

print(f"formula 12Nd² + 2Vd : {formula_parameters(config.n_layer, config.n_embd, config.vocab_size):>9,}")
print(f"exact, from config  : {exact_parameters(config):>9,}")
print(f"counted in the model: {count_parameters(model):>9,}")
print(f"sum over every tensor, tied matrix twice: {sum(p.numel() for p in model.state_dict().values()):,}")

# %% [markdown]
# `model.parameters()` yields the tied matrix once; its `state_dict` lists it under both names,
# so summing that counts it twice.
#
# ### GPT-2 small: 124,439,808, without allocating a single weight
#
# GPT-2 small has `N = 12`, `d = 768`, `V = 50257` and a context of 1024. Built on PyTorch's
# **meta device**, every tensor has a shape but no storage, so counting its parameters costs
# no memory:

# %%
gpt2 = GPTConfig.gpt2_small()
started = time.perf_counter()
gpt2_meta = build_without_weights(gpt2)
print(gpt2)
print(f"parameters: {count_parameters(gpt2_meta):,} (exact formula: {exact_parameters(gpt2):,}), "
      f"on device {gpt2_meta.lm_head.weight.device}")
print("building it", format_duration(time.perf_counter() - started))
assert count_parameters(gpt2_meta) == exact_parameters(gpt2) == 124_439_808

# %% [markdown]
# Where the parameters of GPT-2 small sit, per component, with the seed's rule of thumb beside
# the exact count:

# %%
d, N, V, C = gpt2.n_embd, gpt2.n_layer, gpt2.vocab_size, gpt2.context_length
rows = [
    ("attention (Q, K, V, O)", 4 * d * d, 4 * d * d + 4 * d, "per block"),
    ("FFN (d -> 4d -> d)", 8 * d * d, 8 * d * d + 5 * d, "per block"),
    ("2 LayerNorms", 4 * d, 4 * d, "per block"),
    ("token table (tied output)", V * d, V * d, "once"),
    ("position table", 0, C * d, "once"),
    ("final LayerNorm", 0, 2 * d, "once"),
]
print(f"{'component':<26}{'rule of thumb':>15}{'exact':>13}")
for name, thumb, exact, how_often in rows:
    print(f"{name:<26}{thumb:>15,}{exact:>13,}  {how_often}")
total = sum(exact * (N if how_often == "per block" else 1) for _, _, exact, how_often in rows)
print(f"{'total':<26}{'':>15}{total:>13,}")
assert total == 124_439_808

# %% [markdown]
# ### GPT-3 from the formula, and seed 001's table of GPT-3 sizes
#
# Seed 002 says `12Nd² + 2Vd` gives "roughly 175 billion" for GPT-3 (`N = 96`, `d = 12288`,
# `V = 50257`). The cell computes it, and then every row of the GPT-3 table of seed 001. GPT-3
# ties its embeddings, so `12Nd² + Vd` is the fairer formula; for the small models the
# vocabulary term is a large share and the untied formula overshoots by `Vd`.

# %%
print(f"GPT-3: 12Nd² + 2Vd = {formula_parameters(96, 12288, 50257):,}")
gpt3_table = [("GPT-3 Small", "125M", 12, 768), ("GPT-3 Medium", "350M", 24, 1024),
              ("GPT-3 Large", "760M", 24, 1536), ("GPT-3 XL", "1.3B", 24, 2048),
              ("GPT-3 2.7B", "2.7B", 32, 2560), ("GPT-3 6.7B", "6.7B", 32, 4096),
              ("GPT-3 13B", "13.0B", 40, 5140), ("GPT-3 175B", "175.0B", 96, 12288)]
print(f"\n{'model':<14}{'reported':>9}{'12Nd²+2Vd':>12}{'12Nd²+Vd':>11}")
for name, reported, n_layer, width in gpt3_table:
    untied = formula_parameters(n_layer, width, 50257)
    tied = untied - 50257 * width
    print(f"{name:<14}{reported:>9}{untied / 1e9:>11.3f}B{tied / 1e9:>10.3f}B")
print(f"\n13B row: d_model 5140 / 40 heads = {5140 / 40} per head; 40 x 128 = {40 * 128}")
print(f"with d = 5120: 12Nd² + Vd = {(formula_parameters(40, 5120, 50257) - 50257 * 5120) / 1e9:.3f}B")

# %% [markdown]
# Every row lands near its reported size with the tied formula. The 13B row of the table (copied
# from the GPT-3 paper) lists `d_model = 5140`, which 40 heads of 128 cannot make: the
# architecture is `40 x 128 = 5120`, and either value gives about 13 billion.
#
# ### Planning memory (seed 002's 16 GB example)
#
# A team has 16 GB of GPU memory and stores weights in fp16, 2 bytes each. Seed 002 works out
# that `N = 32, d = 4096` fits and `N = 40, d = 5120` does not, quoting about 6.4B and 12.6B
# parameters with `V = 50,000`. The cell redoes it:

# %%
budget_bytes, bytes_per_parameter = 16e9, 2
budget = budget_bytes / bytes_per_parameter
print(f"budget: {budget_bytes / 1e9:.0f} GB / {bytes_per_parameter} bytes = {budget / 1e9:.1f}B parameters")
for n_layer, width in ((32, 4096), (40, 5120)):
    blocks_only = 12 * n_layer * width**2
    full = formula_parameters(n_layer, width, 50_000)
    verdict = "fits" if full <= budget else "does not fit"
    print(f"N={n_layer}, d={width}: 12Nd² = {blocks_only / 1e9:.2f}B, 12Nd² + 2Vd = {full / 1e9:.2f}B "
          f"-> {full * bytes_per_parameter / 1e9:.1f} GB, {verdict}")
adam_bytes = 2 + 4 + 4 + 4 + 2  # fp16 weight, fp32 master copy, Adam's two moments, fp16 gradient
print(f"training with Adam in mixed precision: about {adam_bytes} bytes per parameter -> "
      f"{budget_bytes / adam_bytes / 1e9:.1f}B parameters in the same 16 GB")

# %% [markdown]
# The seed's 6.4B and 12.6B are the `12Nd²` term alone; adding `2Vd` gives 6.85B and 13.09B,
# and the verdicts stand. This counts the weights only: to *train*, Adam's moments and a float32
# master copy bring it to about 16 bytes per parameter, so the same card trains a model of about
# a billion parameters. Serving also needs room for the KV cache (section 6).
#
# ### Which part holds the parameters?

# %%
gpt3_meta = build_without_weights(GPTConfig(vocab_size=50257, context_length=2048, n_layer=96,
                                            n_head=96, n_embd=12288))
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

# %% [markdown]
# In a big model the blocks hold nearly everything, with the FFN at twice attention (`8d²` vs
# `4d²`). In our small character model, the per-block split is the same, and the embeddings
# are small because its vocabulary is only 52 characters; in GPT-2 small the 50,257-token table
# is almost a third of the model.
#
# ### Exercise: count a GPT's parameters exactly
#
# Write the exact count for a GPT-2-style model with biases and tied weights. The checker tries
# GPT-2 small, GPT-2 medium, our character model and the toy; when a count is off it says which
# piece the gap looks like.

# %%
def gpt_parameters(n_layer: int, n_embd: int, vocab_size: int, context_length: int) -> int:
    """Exact parameter count of a GPT-2-style model (biases, tied output matrix)."""
    raise NotImplementedError


check("gpt.exact_parameters", gpt_parameters)

# %% [markdown]
# <details><summary>Hint</summary>
#
# Start from `12 * n_layer * n_embd**2 + vocab_size * n_embd`, then add what the rule of thumb
# leaves out, one line of the table above at a time.
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def gpt_parameters(n_layer: int, n_embd: int, vocab_size: int, context_length: int) -> int:
#     """Exact parameter count of a GPT-2-style model (biases, tied output matrix)."""
#     d = n_embd
#     per_block = (4 * d * d + 4 * d) + (8 * d * d + 5 * d) + 4 * d
#     return n_layer * per_block + vocab_size * d + context_length * d + 2 * d
#
#
# check("gpt.exact_parameters", gpt_parameters)
# ```
# </details>

# %% [markdown]
# ## 4. Training on the course corpus
#
# The course corpus is short stories from a small grammar (`helpers.corpus`), one sentence per
# line. We read it one character at a time: the vocabulary is every character that occurs, and a
# model that must spell every word is the hardest test of what it learned.

# %%
from helpers.tokenizers import CharTokenizer
from helpers.train import encode_text, random_batch, split_train_val

text = load_corpus()
tokenizer = CharTokenizer.train(text)
token_ids = encode_text(tokenizer, text)
train_ids, val_ids = split_train_val(token_ids, val_fraction=0.1)
print(f"{len(text):,} characters, vocabulary of {tokenizer.vocab_size}: {''.join(tokenizer.chars)!r}")
print(f"train: {len(train_ids):,} tokens, validation: {len(val_ids):,} tokens (the last tenth)")
assert tokenizer.vocab_size == config.vocab_size

# %% [markdown]
# A training example is a window of `context_length` characters, `x`, and the same window one
# character later, `y`: at every position the target is the next character. One window of 64
# characters gives 64 predictions to learn from.

# %%
x, y = random_batch(train_ids, batch_size=2, block_size=config.context_length,
                    generator=torch.Generator().manual_seed(0))
print("x:", repr(tokenizer.decode(x[0].tolist())))
print("y:", repr(tokenizer.decode(y[0].tolist())))
print("shapes:", tuple(x.shape), tuple(y.shape))

# %% [markdown]
# ### Before training: how good is the text?
#
# Because the corpus comes from a known grammar, we can **measure** the quality of generated
# text: `well_formed_fraction` is the share of lines the grammar can produce. We let the model
# write a window's worth of characters after a newline, many times over, keep the complete
# lines, and measure. The corpus itself scores 1, and the untrained model writes noise:

# %%
from helpers.gpt import generate


def written_lines(gpt: GPT, n_samples: int = 48, temperature: float = 1.0, seed: int = 0) -> list[str]:
    """Complete lines the model writes after a newline, filling its context (cut-off lines dropped)."""
    prompt = torch.tensor([tokenizer.encode("\n")] * n_samples)
    n_chars = gpt.config.context_length - 1
    out = generate(gpt, prompt, n_chars, temperature=temperature,
                   generator=torch.Generator().manual_seed(seed))
    lines = []
    for row in out[:, 1:].tolist():
        lines += [line for line in tokenizer.decode(row).split("\n")[:-1] if line.strip()]
    return lines


torch.manual_seed(0)
model = GPT(config)
before = written_lines(model)
quality_before = well_formed_fraction("\n".join(before))
print(f"corpus: {well_formed_fraction(text[:20_000]):.2f} well formed")
print(f"untrained model: {quality_before:.2f} well formed, e.g. {before[0][:60]!r}")

# %% [markdown]
# ### The recipe
#
# `helpers.train.Trainer` trains with AdamW (weight decay on the weight matrices only), a
# learning rate that rises linearly for the first 5 % of the run and then follows half a cosine
# down to a tenth of its peak, and gradient clipping (the whole gradient is scaled down whenever
# its norm exceeds 1). Evaluations use fixed batches, so the train and validation curves are
# comparable from point to point.

# %%
from helpers.train import LiveLossPlot, TrainConfig, Trainer, draw_losses, learning_rate

train_config = TrainConfig(batch_size=16, learning_rate=5e-3, eval_every=100)
progress = torch.linspace(0, 1, 200)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(progress * 100, [learning_rate(p.item(), train_config.learning_rate) for p in progress])
ax.set_xlabel("progress through training (%)")
ax.set_ylabel("learning rate")
ax.set_title("Warm-up, then cosine decay")
plt.show()
print(train_config)

# %% [markdown]
# ### Train
#
# `TRAIN_STEPS` is the knob: the default trains in well under a minute on a 2-core laptop; more
# steps give better stories. The progress bar and the loss plot update as it
# runs (the plot redraws at every evaluation).

# %%
TRAIN_STEPS = 800  # the knob: more steps, better stories

# %%
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

# %% [markdown]
# The cell above cannot print the same numbers on every machine (bfloat16 rounds differently
# from one CPU to another), so the notebook's tests check what must hold instead: the run took
# `TRAIN_STEPS` steps, the loss fell far below uniform guessing, and validation stayed close to
# training (no overfitting in one pass over a tenth of the data).

# %%
assert len(history.steps) == TRAIN_STEPS and live_plot.redraws == len(history.val_losses)
assert history.val_losses[-1] < 0.5 * history.val_losses[0] < math.log(config.vocab_size)
assert abs(history.val_losses[-1] - history.train_losses[-1]) < 0.1
print("the loss fell:", history.val_losses[0] > 2 * history.val_losses[-1],
      "| validation within 0.1 of train:", abs(history.val_losses[-1] - history.train_losses[-1]) < 0.1)
draw_losses(history)
plt.show()

# %% [markdown]
# ## 5. Sampling: temperature and top-k
#
# The model gives a probability for every next character. **Greedy** decoding takes the most
# likely one. **Sampling** draws one at random from the distribution, after two adjustments:
#
# - **temperature** `T` divides the logits: `T < 1` sharpens the distribution towards the top
#   choice (`T -> 0` is greedy), `T > 1` flattens it towards uniform;
# - **top-k** keeps only the `k` most likely tokens (renormalised) and never draws the long tail.
#
# The next-character distribution after "One day, Mia went to the ", three ways:

# %%
from helpers.gpt import sample_next

prompt_text = "One day, Mia went to the "
model.eval()
with torch.no_grad():
    next_logits = model(torch.tensor([tokenizer.encode(prompt_text)]))[0, -1]
top = next_logits.topk(12).indices
labels = [repr(tokenizer.decode([i]))[1:-1] or "␣" for i in top.tolist()]
fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
for ax, (temperature, k) in zip(axes, [(0.5, None), (1.0, None), (1.0, 3)], strict=True):
    scaled = next_logits / temperature
    if k is not None:
        scaled = scaled.masked_fill(scaled < scaled.topk(k).values[-1], float("-inf"))
    ax.bar(labels, scaled.softmax(-1)[top].numpy())
    ax.set_title(f"T = {temperature}" + (f", top-k = {k}" if k else ""))
    ax.set_xlabel("next character")
axes[0].set_ylabel("probability")
fig.suptitle(f"After {prompt_text!r}", y=1.03)
plt.show()

# %% [markdown]
# `helpers.gpt.sample_next` does this for a batch of logits, and `generate` repeats it, each
# time appending the new token. Temperature 0 or top-k 1 is greedy:

# %%
assert torch.equal(sample_next(next_logits[None], temperature=0.0), next_logits.argmax().view(1, 1))
assert torch.equal(sample_next(next_logits[None], temperature=1.3, top_k=1), next_logits.argmax().view(1, 1))
print("temperature 0 and top-k 1 both pick the most likely character, the first bar above")

# %% [markdown]
# ### After training: the same measurement
#
# The same 48 samples of a context's worth of characters, now at temperature 0.8, a little
# sharper than the model's own distribution. Some of their lines, and the share that the grammar
# can produce:

# %%
# NBVAL_IGNORE_OUTPUT
# What a trained model writes depends on the CPU's bfloat16 rounding; the next cell checks it.
after = written_lines(model, temperature=0.8)
quality_after = well_formed_fraction("\n".join(after))
print("\n".join(after[:12]))
print(f"\n48 samples x {config.context_length - 1} characters, {len(after)} lines: "
      f"{quality_after:.2f} well formed after training, {quality_before:.2f} before")

# %%
assert quality_after > 0.3 > quality_before
print("training raised the well-formed share from", quality_before, "to more than 0.3")

# %% [markdown]
# ### Exercise: one step of greedy decoding
#
# Write the step `generate` repeats: given a model and ids `(B, S)`, return the most likely next
# token of each row, shape `(B, 1)`. Remember that the model reads at most `context_length`
# tokens.

# %%
def greedy_next(gpt: GPT, ids: torch.Tensor) -> torch.Tensor:
    """ids (B, S) -> the most likely next token of each row, (B, 1)."""
    raise NotImplementedError


check("gpt.greedy_step", greedy_next)

# %% [markdown]
# <details><summary>Hint</summary>
#
# `gpt(ids)` has shape `(B, S, V)`; the prediction for the next token is at the last position.
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def greedy_next(gpt: GPT, ids: torch.Tensor) -> torch.Tensor:
#     """ids (B, S) -> the most likely next token of each row, (B, 1)."""
#     window = ids[:, -gpt.config.context_length:]
#     return gpt(window)[:, -1].argmax(dim=-1, keepdim=True)
#
#
# check("gpt.greedy_step", greedy_next)
# ```
# </details>

# %% [markdown]
# ## 6. The KV cache
#
# Generating token `t + 1` by running the model on all `t` tokens recomputes the keys and values
# of tokens `0 .. t-1`, which the previous step already computed: the causal mask guarantees
# they cannot have changed. A **KV cache** keeps them. Each step then feeds **one** token
# through the model: its query attends to all stored keys and values, and its own key and value
# are appended. `GPT.forward_cached` does this with each block's own weights. The attention of
# notebook 5 has a hook for it, `kv_store`: `MultiHeadAttention.forward` projects only the new
# tokens to Q, K and V, hands the new keys and values to `kv_store`, and attends to whatever it
# returns. The cache's hook writes them into a `KVCache` (two preallocated tensors) and returns
# everything stored for that layer. Several new tokens at once (the prompt) need the end-aligned
# causal mask of notebook 4, `causal_mask(n_new, n_total)`; a single new token may see every
# stored key. Generation is inference only, so by default this runs the fused kernels of
# section 10 (`fast=True`); `fast=False` runs the course's own `Block`, as the cell checks too.
#
# First the proof: greedy generation with and without the cache writes the same tokens, and the
# cached logits equal the full forward pass.

# %%
from helpers.gpt import KVCache

prompt = torch.tensor([tokenizer.encode("Once upon a time"), tokenizer.encode("That night, Ada ")])
with_cache = generate(model, prompt, 100, temperature=0.0, use_cache=True)
recomputed = generate(model, prompt, 100, temperature=0.0, use_cache=False)
assert torch.equal(with_cache, recomputed)
print(f"prompts of {prompt.shape[1]} + 100 greedy tokens = {with_cache.shape[1]} tokens, context "
      f"{config.context_length}: cache and recomputation agree on every token:", torch.equal(with_cache, recomputed))

window = with_cache[:, :config.context_length]
cache = KVCache.for_model(model, batch_size=2)
start = prompt.shape[1]
step_logits = [model.forward_cached(window[:, :start], cache)]  # the prompt at once, then one by one
step_logits += [model.forward_cached(window[:, t:t + 1], cache) for t in range(start, config.context_length)]
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

# %% [markdown]
# Past the context length the model reads only the last `context_length` tokens (GPT-2 does the
# same), so positions shift and the cache is rebuilt from the new window: the tokens still match
# recomputation exactly, as the 116 tokens above show for a context of 64.
#
# ### How much faster?
#
# Timing needs a longer context to show the effect, so we time an untrained model the size of
# the benchmark's (4 layers, a context of 512; speed does not depend on the weights). Each
# length is generated greedily, with and without the cache:

# %%
torch.manual_seed(0)
long_model = GPT(GPTConfig(vocab_size=52, context_length=512, n_layer=4, n_head=4, n_embd=128)).eval()
long_prompt = torch.randint(0, 52, (1, 12))
lengths = [25, 50, 100, 200, 300]
seconds = {"recompute": [], "KV cache": []}
for new_tokens in lengths:
    for name, use_cache in (("recompute", False), ("KV cache", True)):
        started = time.perf_counter()
        generate(long_model, long_prompt, new_tokens, temperature=0.0, use_cache=use_cache)
        seconds[name].append(time.perf_counter() - started)
for i, new_tokens in enumerate(lengths):
    print(f"{new_tokens:>4} new tokens: recompute {format_duration(seconds['recompute'][i])}, "
          f"KV cache {format_duration(seconds['KV cache'][i])}")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
for name, values in seconds.items():
    ax.plot(lengths, values, "o-", label=name)
ax.set_xlabel("new tokens generated")
ax.set_ylabel("seconds")
ax.set_title("Greedy generation, context 512")
ax.legend()
plt.show()
speedup = seconds["recompute"][-1] / seconds["KV cache"][-1]
assert speedup > 2, f"the cache should win clearly at {lengths[-1]} tokens, got {speedup:.1f}x"
print(f"at {lengths[-1]} new tokens the cache is more than twice as fast:", speedup > 2)

# %% [markdown]
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

# %%
long_cache = KVCache.for_model(long_model, batch_size=1)
cfg = long_model.config
formula_bytes = 2 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.context_length * 4  # float32
print(f"2 x {cfg.n_layer} x {cfg.n_head} x {cfg.head_dim} x {cfg.context_length} x 4 bytes = {formula_bytes:,} bytes")
print(f"keys {tuple(long_cache.keys.shape)} + values {tuple(long_cache.values.shape)}: {long_cache.nbytes():,} bytes")
assert long_cache.nbytes() == formula_bytes
for name, (n_layer, n_head, head_dim, n_tokens) in {"GPT-2 small, 1024 tokens": (12, 12, 64, 1024),
                                                     "GPT-3 175B, 2048 tokens": (96, 96, 128, 2048)}.items():
    fp16_bytes = 2 * n_layer * n_head * head_dim * n_tokens * 2
    print(f"{name}, fp16: {fp16_bytes / 1e6:,.1f} MB per sequence")

# %% [markdown]
# A single GPT-3 sequence of 2048 tokens needs gigabytes of cache; a server with many users
# multiplies that by the batch. Grouped-query attention (notebook 5) shrinks `H` in the formula
# to the number of key/value heads.
#
# ## 7. Attention maps of the trained model
#
# Which characters does each head look at? We run a sentence from the validation text through
# the trained model and draw every head of every layer (`block.attn.last_weights`). Each row is
# a query character; it can only look left (the causal mask).

# %%
sentence_text = next(line for line in text.splitlines()[-200:] if 20 <= len(line) <= 26)
sentence_ids = torch.tensor([tokenizer.encode(sentence_text)])
with torch.no_grad():
    model(sentence_ids)
chars = [c if c != " " else "␣" for c in sentence_text]
print(repr(sentence_text), f"{len(chars)} characters")
for layer, blk in enumerate(model.blocks):
    fig, axes = plt.subplots(1, config.n_head, figsize=(22, 5.5))
    for head, ax in enumerate(axes):
        heatmap(blk.attn.last_weights[0, head], chars, chars, title=f"layer {layer}, head {head}",
                xlabel="key", ylabel="query" if head == 0 else "", ax=ax, annotate=False, vmin=0, vmax=1)
    plt.show()

# %% [markdown]
# Look for heads that attend to the previous character (a bright line just below the diagonal),
# heads that look back to the start of the current word or to the space before it, and heads
# that spread their attention evenly. The exact pictures depend on the training run.
#
# ## 8. Encoder-only, decoder-only, encoder-decoder
#
# The same parts build all three transformer families (seed 003); what changes is the mask,
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

# %%
torch.manual_seed(0)
shared_block = Block(16, 2).eval()
tokens = torch.randn(1, 5, 16)
changed = tokens.clone()
changed[0, -1] = torch.randn(16)  # a different last token
for name, causal in (("encoder (bidirectional)", False), ("decoder (causal)", True)):
    with torch.no_grad():
        moved = (shared_block(changed, causal=causal) - shared_block(tokens, causal=causal)).abs().amax(-1)[0]
    print(f"{name:<24} outputs that changed: {(moved > 1e-6).int().tolist()}")

# %% [markdown]
# The encoder's first four outputs moved because they look at the last token; the decoder's did
# not, which is what lets it be trained on every position at once and then generate.
#
# **Cross-attention** sits in the decoder of an encoder-decoder, between its masked
# self-attention and its FFN: queries come from the target being written, keys and values from
# the encoder's output (seed 000's shapes: `Q [N_Q x D]`, `X [N_X x D]`, weights
# `[N_Q x N_X]`). Built from the helpers parts, for seed 003's source sentence "The cat sat
# here":

# %%
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
        x = x + self.cross_attn(self.ln2(x), context=memory)  # queries: target; keys, values: source
        return x + self.mlp(self.ln3(x))


torch.manual_seed(0)
source_words, target_words = ["The", "cat", "sat", "here"], ["<start>", "Le", "chat", "était", "assis"]
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

# %% [markdown]
# The decoder's self-attention is triangular; its cross-attention is a full `5 x 4` rectangle:
# every target position may read the whole source (the weights are random here, untrained).
#
# **The objective.** A decoder-only model learns from every position of every window (section
# 4). An encoder-only model like BERT hides about 15 % of the tokens and learns only from
# those; seed 003 notes that next-token prediction gives "more learning signals". Per window of
# our 64 characters:

# %%
window_length, mask_share = config.context_length, 0.15
print(f"decoder-only, next token: {window_length} predictions per window")
print(f"encoder-only, {mask_share:.0%} masked: about {window_length * mask_share:.0f} predictions per window")
masked = torch.rand(window_length, generator=torch.Generator().manual_seed(0)) < mask_share
print(f"one random masking of {window_length} positions hid {int(masked.sum())}")

# %% [markdown]
# ## 9. Saving and loading a checkpoint
#
# `helpers.train.save_checkpoint` stores the config, the weights and (optionally) the optimiser
# state, all as plain tensors, numbers and strings, so that `load_checkpoint` can read it with
# `torch.load(..., weights_only=True)`, which refuses to unpickle arbitrary objects and so
# cannot run code hidden in a file.

# %%
from helpers.train import load_checkpoint, save_checkpoint

with tempfile.TemporaryDirectory() as folder:
    path = save_checkpoint(Path(folder) / "char_gpt.pt", model, trainer.optimizer, steps=TRAIN_STEPS)
    restored, saved = load_checkpoint(path)
    print(f"{path.name}: keys {sorted(saved)}, extra {saved['extra']}")
restored.eval()
with torch.no_grad():
    same = torch.equal(restored(sentence_ids), model(sentence_ids))
assert same and restored.lm_head.weight is restored.embed.token.weight
print("restored model gives identical logits:", same, "| still tied:", restored.lm_head.weight is restored.embed.token.weight)

# %% [markdown]
# ## 10. How fast is the trainer?
#
# The trainer is fast for a CPU because of a few choices, each measured by
# `benchmarks/bench_train.py`:
#
# - **bfloat16** on CPUs with native bf16 instructions (elsewhere it falls back to float32 by
#   itself): forward and backward run on a bf16 copy of the model, which halves the time of
#   every matrix product, while AdamW updates the float32 weights and refreshes the copy after
#   each step (`torch.autocast` does the same casting op by op, about 200 casts per step here,
#   and measured slower);
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

# %%
# NBVAL_IGNORE_OUTPUT
# Speeds depend on the machine and on whatever else runs on it; the next cell asserts the order.
bench_config = GPTConfig(vocab_size=52, context_length=64, n_layer=4, n_head=4, n_embd=128)
racers = {}
for fast in (False, True):
    torch.manual_seed(0)
    racers["fast" if fast else "plain"] = Trainer(GPT(bench_config), train_ids, val_ids,
                                                  TrainConfig(batch_size=12, fast=fast))
busy = {name: 0.0 for name in racers}
for _ in range(4):  # take turns, so that other work on the machine slows both alike
    for name, racer in racers.items():
        racer.train_step(1e-3)  # the first of each turn warms up, untimed
        started = time.perf_counter()
        for _ in range(4):
            racer.train_step(1e-3)
        busy[name] += time.perf_counter() - started
speeds = {name: 4 * 4 * 12 * bench_config.context_length / seconds for name, seconds in busy.items()}
print(f"plain path {speeds['plain']:,.0f} tokens/s, fast path {speeds['fast']:,.0f} tokens/s: "
      f"{speeds['fast'] / speeds['plain']:.1f}x")

# %%
assert speeds["fast"] > speeds["plain"]
print("the fast path is faster:", speeds["fast"] > speeds["plain"])

# %% [markdown]
# ## Check your understanding
#
# **1. What are the differences between a transformer encoder and a decoder? (seed 000)**
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

# %%
d = 768
encoder_block = 12 * d * d + 13 * d  # attention, FFN, their biases, two LayerNorms
cross_extra = 4 * d * d + 4 * d + 2 * d
print(f"block with self-attention + FFN (d=768): {encoder_block:,}")
print(f"decoder block with cross-attention: {encoder_block + cross_extra:,} (+{cross_extra:,})")

# %% [markdown]
# **2. What parallelises in a transformer, and what does not? (seed 000)**
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

# %%
print(f"one training step: {train_config.batch_size} x {config.context_length} = "
      f"{train_config.batch_size * config.context_length:,} next-token predictions in one forward pass")
print("generating 100 tokens: 100 forward steps, one after another")

# %% [markdown]
# **3. GPT-2 small (seed 002).** `N = 12`, `d = 768`, `V = 50257`, tied weights. (a) The
# parameters of the blocks with `12d²` per layer? (b) Add the embedding, counted once.
# (c) The reported total is about 124M: where does the gap come from?
#
# <details><summary>Answer</summary>
#
# (a) `12 x 12 x 768² = 84,934,656`. (b) `+ 50257 x 768 = 38,597,376` gives `123,532,032`.
# (c) The exact count is `124,439,808` (section 3); the gap of `907,776` is the position table
# (`1024 x 768 = 786,432`), the biases (`9d` per block, `82,944`) and the LayerNorms (`4d` per
# block plus the final `2d`: `38,400`). Seed 002's sketch names the positions and the
# LayerNorms (it says "~37K") but forgets the biases, which are twice as many as the LayerNorm
# parameters. The cell computes each number.
# </details>

# %%
blocks_12d2 = 12 * 12 * 768**2
embedding = 50257 * 768
gaps = {"positions": 1024 * 768, "biases": 12 * 9 * 768, "LayerNorms": 12 * 4 * 768 + 2 * 768}
print(f"(a) {blocks_12d2:,}  (b) {blocks_12d2 + embedding:,}")
print(f"(c) exact {exact_parameters(gpt2):,}, gap {exact_parameters(gpt2) - blocks_12d2 - embedding:,} = "
      + " + ".join(f"{name} {value:,}" for name, value in gaps.items()))
assert blocks_12d2 + embedding + sum(gaps.values()) == exact_parameters(gpt2)

# %% [markdown]
# **4. The KV cache (seed 002).** Seed 002 says that without a cache a 1,000-token response
# needs "roughly 500,000 redundant Key and Value computations". Check it, and say what the cache
# costs instead.
#
# <details><summary>Answer</summary>
#
# Step `t` (counting from an empty context) recomputes the keys and values of the `t - 1`
# earlier tokens, so the total is `0 + 1 + ... + 999 = 499,500`, per layer and head: the seed's
# round number. The cache replaces that work with memory, `2 x L x H x d_h x n` numbers that
# grow linearly with the length; for GPT-2 small at 1024 tokens in fp16 the cell prints the
# size per sequence, and section 6 the GPT-3 one. That is why servers shrink it with GQA
# (fewer key/value heads), paging and quantisation.
# </details>

# %%
redundant = sum(t - 1 for t in range(1, 1001))
print(f"redundant key/value computations for 1,000 tokens: {redundant:,}")
print(f"GPT-2 small cache, 1024 tokens, fp16: {2 * 12 * 12 * 64 * 1024 * 2 / 1e6:.1f} MB per sequence")
