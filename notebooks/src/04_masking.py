# %% [markdown] slideshow={"slide_type": "slide"}
# # 4. Masking: what attention is allowed to see
#
# **After this notebook you will be able to**
# - build a causal mask with `masked_fill` and say why the masked scores must be $-\infty$, not 0;
# - prove, with a cell, that causal attention never reads the future;
# - combine padding masks with causal masks for a batch of sentences of different lengths;
# - explain what a fully masked row does to a softmax, and how to keep it from producing NaN;
# - tell encoder (bidirectional) attention from decoder (causal) attention, and draw the local,
#   strided and global patterns of efficient attention as masks.
#
# **It assumes** notebook 3: `scaled_dot_product_attention(q, k, v)` and the softmax.
#
# **Convention used everywhere here (and by PyTorch's `F.scaled_dot_product_attention`):** a mask
# is a boolean tensor broadcastable to the `(..., N_q, N_k)` scores, and **True means "this query
# may attend to this key"**.

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import re

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from helpers.model.attention import causal_mask, scaled_dot_product_attention, softmax
from helpers.text.corpus import TOY_CAT, TOY_SOUP
from helpers.lab.exercises import check, yours_or
from helpers.lab.plots import heatmap
from helpers.lab.widgets import Explorer
from helpers.lab.sections import catch_up

torch.set_num_threads(1)  # every tensor here is small: one thread beats coordinating several

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Why mask at all? (optional)
#
# A language model learns to predict token $t+1$ from tokens $0..t$. In training it does this for
# every position of a sentence at once, in one pass of matrix products. Without a mask, position
# $t$ can read every later token, including the one it is supposed to predict: it would learn to
# copy, not to predict. We can see the leak directly: edit the *last* token of "The cat sat here"
# and watch the output of the *first* token move.

# %% slideshow={"slide_type": "fragment"}
TOKENS = TOY_CAT.split()  # ['The', 'cat', 'sat', 'here']
torch.manual_seed(0)
X = torch.randn(len(TOKENS), 6, dtype=torch.float64)  # made-up token vectors (N = 4, d_model = 6)
W_Q, W_K, W_V = (torch.randn(6, 4, dtype=torch.float64) for _ in range(3))


def self_attention(x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor,
                                                                               torch.Tensor]:
    """Self-attention of tokens x (N, 6) with the fixed projections above. Returns (N, 4), (N,
    N)."""
    return scaled_dot_product_attention(x @ W_Q, x @ W_K, x @ W_V, mask=mask)


edited = X.clone()
edited[-1] = torch.randn(6, dtype=torch.float64)  # replace "here" by some other token
change = (self_attention(edited)[0] - self_attention(X)[0]).norm(dim=-1)
for token, delta in zip(TOKENS, change, strict=True):
    print(f"output of {token!r:>7} moved by {delta:.4f}")

# %% [markdown] slideshow={"slide_type": "slide"}
# Every output moves, including the one for "The", which in a language model would be
# predicting the next word while secretly reading the end of the sentence. The mask removes
# exactly those connections.
#
# ## 2. A causal mask with `masked_fill`, and why $-\infty$ (core)
#
# Query $i$ may see keys $0..i$: the lower triangle including the diagonal. `masked_fill(where,
# value)` writes `value` wherever `where` is True, so we fill the *disallowed* scores, `~allowed`.
# The numbers are the Matrix Magic notes' scaled scores for "I like to eat" (notebook 3 showed
# that they do not follow from the notes' own $Q$ and $K$ but from $KK^\top$; from here on the
# example is consistent, so we take them as given).

# %% slideshow={"slide_type": "fragment"}
TOKENS_MAGIC = ["I", "like", "to", "eat"]
MATRIX_MAGIC_SCALED = torch.tensor([[14.42, 20.16, 18.65, 21.83],
                                    [20.16, 28.53, 26.57, 31.22],
                                    [18.65, 26.57, 24.92, 29.32],
                                    [21.83, 31.22, 29.32, 34.54]], dtype=torch.float64)
allowed = torch.tril(torch.ones(4, 4, dtype=torch.bool))
print("allowed (True = may attend):\n", allowed)
masked_scores = MATRIX_MAGIC_SCALED.masked_fill(~allowed, float("-inf"))
print("\nscores after masked_fill(~allowed, -inf):\n", masked_scores)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Why $-\infty$? Because the softmax exponentiates: $e^{-\infty} = 0$ exactly, so a masked key
# gets exactly zero weight and contributes nothing. Filling with **0** looks similar on a slide
# (the Matrix Magic notes' "Masked Attention" table shows 0s) but $e^0 = 1$: every masked key
# still gets weight $1/\text{(row sum)}$. With the notes' large scores that weight is tiny, which
# hides the bug. With scores of ordinary size, 0 is a perfectly typical score and the future gets
# a large share:

# %% slideshow={"slide_type": "fragment"}
def future_weight(scores: torch.Tensor, fill: float) -> torch.Tensor:
    """Total weight each query puts on future keys when they are filled with `fill`. Shape (N,)."""
    future = ~causal_mask(scores.shape[-1])  # the upper triangle: the course's helper (section 4)
    weights = softmax(scores.masked_fill(future, fill))
    return (weights * future).sum(dim=-1)


torch.manual_seed(1)
ordinary_scores = torch.randn(4, 4, dtype=torch.float64)  # unit-variance scores, as after scaling
for name, scores in (("the notes' scores", MATRIX_MAGIC_SCALED), ("unit-variance scores",
                                                                  ordinary_scores)):
    print(f"{name:>22}: weight on the future per query, fill 0 -> "
          f"{[f'{w:.2g}' for w in future_weight(scores, 0.0).tolist()]}, "
          f"fill -inf -> {future_weight(scores, float('-inf')).tolist()}")

# %% [markdown] slideshow={"slide_type": "slide"}
# With 0 the first query, which should see only itself, spends most of its weight on three
# tokens it must not see; with $-\infty$ every query puts exactly 0 on the future.
#
# ## 3. The Matrix Magic notes' masked-softmax table, reproduced (core)
#
# The Matrix Magic notes exponentiate the masked scores, add each row up, and divide. We do the
# same with $-\infty$ and set the notes' printed exponentials beside ours.

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
exps = torch.exp(masked_scores)
row_sums = exps.sum(dim=-1)
# Six significant digits: the last digits of a float64 exp differ between CPUs' exp routines.
torch.set_printoptions(precision=5, sci_mode=True, linewidth=120)
print("exp(masked scores), computed, to 6 significant digits:\n", exps)
print("row sums, computed:", row_sums)
MATRIX_MAGIC_EXPS = torch.tensor([[1827800, 0, 0, 0],
                                  [567261070, 2449586694989, 0, 0],
                                  [125826465, 345618259437, 66316918440, 0],
                                  [3039308147, 36359847277715, 5389806117804,
                                   1003656459556760]], dtype=torch.float64)
MATRIX_MAGIC_SUMS = torch.tensor([1827803, 2450153956061, 412061004343, 1045409152260420],
                                 dtype=torch.float64)
print("the notes' exponentials:\n", MATRIX_MAGIC_EXPS)
torch.set_printoptions(precision=4, sci_mode=False)
print(f"\nlargest relative gap between our exponentials and the notes': "
      f"{((exps - MATRIX_MAGIC_EXPS).abs() / MATRIX_MAGIC_EXPS.clamp(min=1)).max():.4f}; "
      f"rounding a score by 0.005 changes its exponential by up to "
      f"{torch.tensor(0.005).exp() - 1:.4f}")
print("notes' row sum minus the sum of their own allowed exponentials:",
      (MATRIX_MAGIC_SUMS - MATRIX_MAGIC_EXPS.sum(dim=-1)).tolist(), "| masked entries per row:",
      (~allowed).sum(dim=-1).tolist())

# %% [markdown] slideshow={"slide_type": "subslide"}
# Two things differ, and both are explained by the cell:
# - the exponentials differ by up to 0.0049 (relative): the notes exponentiated their *unrounded*
#   scores, while we only have the two-decimal ones, and rounding a score by 0.005 moves its
#   exponential by up to 0.0050;
# - the notes' row sums exceed the sum of their own exponentials by 3, 2 and 1 in the first three
#   rows: exactly the number of masked entries in each row. (The last row has none; its -6 is
#   rounding, since its largest exponential and its sum, both near $10^{15}$, are printed to 15
#   significant digits and may each be off by 5.) The notes added $e^0 = 1$ for every masked
#   cell, so they filled with 0, not $-\infty$. Their scores are so large that this changes nothing
#   visible at two decimals, which is why the weights still come out right:

# %% slideshow={"slide_type": "fragment"}
weights_magic = exps / row_sums.unsqueeze(-1)
MATRIX_MAGIC_WEIGHTS = torch.tensor([[1.00, 0.00, 0.00, 0.00], [0.00, 1.00, 0.00, 0.00],
                                     [0.00, 0.84, 0.16, 0.00], [0.00, 0.03, 0.01,
                                                                0.96]], dtype=torch.float64)
torch.testing.assert_close(weights_magic, softmax(masked_scores))
print("weights, computed and rounded to two decimals, equal the notes' table:",
      torch.equal(weights_magic.round(decimals=2), MATRIX_MAGIC_WEIGHTS))
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
heatmap(masked_scores.masked_fill(~allowed, float("nan")), TOKENS_MAGIC, TOKENS_MAGIC, ax=axes[0],
        annotate=False,
        title="Masked scores (future = −∞)", xlabel="key", ylabel="query")
middle = masked_scores[allowed].mean()
for (i, j), score in zip(torch.cartesian_prod(torch.arange(4), torch.arange(4)).tolist(),
                         masked_scores.flatten().tolist(), strict=True):
    on_dark = bool(allowed[i, j]) and score < middle  # dark end of the colour map: write in white
    axes[0].text(j, i, f"{score:.2f}" if allowed[i, j] else "−∞", ha="center", va="center",
                 fontsize=11, color="white" if on_dark else "black")
heatmap(weights_magic, TOKENS_MAGIC, TOKENS_MAGIC, ax=axes[1], vmin=0, vmax=1,
        title="Causal attention weights", xlabel="key", ylabel="query")
fig.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Then the weights multiply the notes' value matrix. The notes spell out one entry,
# row "eat", column d1: $0 \times 1.73 + 0.03 \times 3.01 + 0.01 \times 3.08 + 0.96 \times 4.18$.

# %% slideshow={"slide_type": "fragment"}
V_MAGIC = torch.tensor([[1.73, 1.96, 2.34, 2.26], [3.01, 3.30, 4.60, 3.79],
                        [3.08, 3.39, 4.06, 3.44], [4.18, 3.14, 3.55, 4.12]], dtype=torch.float64)
MATRIX_MAGIC_OUT = torch.tensor([[1.73, 1.96, 2.34, 2.26], [3.01, 3.30, 4.60, 3.79],
                                 [3.02, 3.31, 4.51, 3.73], [4.13, 3.15, 3.59,
                                                            4.11]], dtype=torch.float64)
out_magic = weights_magic @ V_MAGIC
torch.set_printoptions(precision=2)
print("weights @ V, computed:\n", out_magic, "\nas the Matrix Magic notes print it:\n",
      MATRIX_MAGIC_OUT)
torch.set_printoptions(precision=4)
print(f"\nthe spelled-out entry: {0 * 1.73 + 0.03 * 3.01 + 0.01 * 3.08 + 0.96 * 4.18:.4f} with the "
      f"rounded "
      f"weights, {out_magic[3, 0]:.4f} with the exact ones")
print(f"row 'eat', column d4: notes {MATRIX_MAGIC_OUT[3, 3]:.2f}, exact {out_magic[3, 3]:.4f}, "
      f"from the notes' own "
      f"rounded weights {(MATRIX_MAGIC_WEIGHTS @ V_MAGIC)[3, 3]:.4f}")
print("all 16 entries, rounded to two decimals, equal the notes':",
      torch.equal(out_magic.round(decimals=2), MATRIX_MAGIC_OUT))

# %% [markdown] slideshow={"slide_type": "slide"}
# All sixteen entries match the notes at two decimals. One caution about the spelled-out sum:
# it uses the *rounded* weights, which is harmless for column d1 (4.1339 against 4.1337) but not
# for column d4, where the rounded weights give 4.1033 and the notes' 4.11 only comes out of the
# exact weights (4.1050). Round at the end, not in the middle.
#
# ## 4. The helpers: `causal_mask` and `mask=` (optional)
#
# From now on we use `helpers.model.attention.causal_mask(n)` (the same lower triangle) and pass masks
# to `scaled_dot_product_attention(q, k, v, mask=...)`, which does the `masked_fill` with
# $-\infty$ for us. The cell checks both against what we just built by hand, and against
# PyTorch's `is_causal=True`.

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
assert torch.equal(causal_mask(4), allowed)
torch.manual_seed(2)
q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4,
                                                                        8)  # (batch, heads, N, d)
by_hand = softmax((q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~allowed, float("-inf"))) @ v
helper_out, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(4))
torch.testing.assert_close(helper_out, by_hand)
torch.testing.assert_close(helper_out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
print("causal_mask(4) == tril; helper == by hand == torch's is_causal=True")
print("with a KV cache (2 new queries after 3 cached keys), causal_mask(2, 5) =\n", causal_mask(2,
                                                                                                5))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The second form, `causal_mask(n_q, n_k)` with more keys than queries, is what generation with a
# KV cache needs (notebook 7): the new queries are the *last* positions, so the last one sees
# every key.
#
# ### Exercise 1: a causal softmax, also with a cache
# Write `my_causal_softmax(scores)` for scores of shape `(..., n_q, n_k)` with `n_k >= n_q`,
# where the queries are the *last* `n_q` of the `n_k` positions: return the softmax weights over
# the last dimension with exactly 0 on every key after the query's own position. With
# `n_q = n_k` it is the lower triangle of section 2; `causal_mask(2, 5)` above shows the other
# case. A masked softmax is the softmax of the keys a query may see, with 0 on the others: write
# it either way, with `masked_fill` as in section 2, or query by query. The cell after the check
# runs your function on a cache step: the last two queries alone, against every key, must get the
# same weights as in the softmax of all the queries at once.
#
# <details><summary>Hint 1: the idea</summary>Query i sits at position i + n_k - n_q and may see
# every key up to that position. Its weights are the softmax of those scores alone, and exactly 0
# on the later keys, which is also what filling the later scores with minus infinity
# gives.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Where each query sits among the keys (the queries
# are the last n_q of the n_k positions). (2) For each query, the keys it may see: those up to its
# own position. (3) A softmax over those keys alone, weight 0 on the later ones (or hide the later
# scores with minus infinity before one softmax).</details>
#
# <details><summary>Hint 3: closer</summary>Query i sits at position i + n_k - n_q and sees n_k -
# n_q + i + 1 keys.</details>

# %% slideshow={"slide_type": "fragment"}
def my_causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Causal softmax weights of scores (..., n_q, n_k), the queries being the last n_q
    positions."""
    ### BEGIN SOLUTION
    n_q, n_k = scores.shape[-2:]
    weights = torch.zeros_like(scores)
    for i in range(n_q):
        # query i sees keys 0 ... its own position
        seen = n_k - n_q + i + 1
        weights[..., i, :seen] = softmax(scores[..., i,
                                                :seen])  # and every later key keeps weight 0
    return weights
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("masking.causal_softmax", my_causal_softmax)

# %% slideshow={"slide_type": "fragment"}
def course_causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """The course's version: the weights of the helper's attention of scores (..., n_q, n_k)
    under causal_mask, with the identity as keys and scale 1, so that q k^T is `scores`."""
    keys = torch.eye(scores.shape[-1], dtype=scores.dtype)  # (n_k, n_k)
    values = torch.zeros(scores.shape[-1], 1, dtype=scores.dtype)  # unused: only the weights
    return scaled_dot_product_attention(scores, keys, values, scale=1.0,
                                        mask=causal_mask(*scores.shape[-2:]))[1]


causal_softmax = yours_or("masking.causal_softmax", my_causal_softmax, course_causal_softmax)
torch.manual_seed(7)
all_scores = torch.randn(2, 5, 5, dtype=torch.float64)  # (batch, queries, keys): 5 tokens at once
full = causal_softmax(all_scores)
cached = causal_softmax(all_scores[:, 3:])  # a cache step: the last 2 queries against all 5 keys
torch.testing.assert_close(cached, full[:, 3:])
print("weights of the last 2 queries alone against 5 keys == rows 3-4 of all 5 queries at once:",
      torch.allclose(cached, full[:, 3:]))
print(cached[0])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Proof: changing future tokens leaves past outputs unchanged (optional)
#
# Take a longer sentence, replace every token from position `edit_from` on by random vectors,
# and compare the outputs position by position: with the causal mask ($-\infty$), with the
# 0-filled "mask", and with no mask at all.

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
SENTENCE = "I like to eat soup . I am a good cook".split()
n = len(SENTENCE)
torch.manual_seed(3)
x = torch.randn(n, 6, dtype=torch.float64)
edit_from = 7  # positions 7.. ("am a good cook") are replaced
x_edited = x.clone()
x_edited[edit_from:] = torch.randn(n - edit_from, 6, dtype=torch.float64)


def zero_filled_attention(x: torch.Tensor) -> torch.Tensor:
    """The buggy version: future scores set to 0 instead of -inf. Returns (N, 4)."""
    scores = (x @ W_Q) @ (x @ W_K).T / 2.0
    return softmax(scores.masked_fill(~causal_mask(len(x)), 0.0)) @ (x @ W_V)


# %% slideshow={"slide_type": "fragment"}
variants = {"causal, -inf": lambda t: self_attention(t, causal_mask(n))[0],
            "causal, 0 fill": zero_filled_attention,
            "no mask": lambda t: self_attention(t)[0]}
moved = {name: (f(x_edited) - f(x)).abs().amax(dim=-1) for name, f in variants.items()}
print(f"{'position':>14}" + "".join(f"{name:>16}" for name in variants))
for i, word in enumerate(SENTENCE):
    marker = "  (edited)" if i >= edit_from else ""
    print(f"{i:>3} {word:>10}" + "".join(f"{moved[name][i]:>16.2e}" for name in variants) + marker)
assert torch.equal(moved["causal, -inf"][:edit_from], torch.zeros(edit_from, dtype=torch.float64))
assert (moved["causal, -inf"][edit_from:] > 0).all(), "the edited positions themselves do change"
assert (moved["causal, 0 fill"][:edit_from] > 0).all() and (moved["no mask"][:edit_from] > 0).all()

# %% [markdown] slideshow={"slide_type": "slide"}
# With $-\infty$ the outputs before the edit are **bit-for-bit** identical (the asserted zeros);
# with the 0-fill or with no mask, every earlier position moves. The course's own tests (in the
# course repository, not in the student folder) check the same property of the helpers for
# several edit positions.
#
# ## 6. Padding masks (core)
#
# A batch holds sentences of different lengths, padded to the longest with a `<pad>` token. Pad
# tokens are not part of any sentence, so no query may attend to them. `helpers.model.attention.
# padding_mask(lengths, n_k)` returns a boolean tensor of shape `(B, 1, 1, n_k)`: True on the
# real tokens. The two 1s broadcast over heads and queries, so it combines with a causal mask by
# `&`.

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import padding_mask

sentences = [re.findall(r"\w+|\.", s) for s in re.findall(r"[^.]+\.", TOY_SOUP)]
lengths = torch.tensor([len(s) for s in sentences])
longest = int(lengths.max())
padded = [s + ["<pad>"] * (longest - len(s)) for s in sentences]
for row, length in zip(padded, lengths.tolist(), strict=True):
    print(f"length {length}: {row}")
pad = padding_mask(lengths, longest)
both = causal_mask(longest) & pad
print("\npadding mask", tuple(pad.shape), "& causal mask", tuple(causal_mask(longest).shape),
      "->", tuple(both.shape), "= (batch, heads, queries, keys)")

# %% slideshow={"slide_type": "fragment"}
def draw_mask(ax: plt.Axes, mask: torch.Tensor, tokens: list[str], title: str,
              ylabels: bool = True) -> None:
    """Draw a boolean (N, N) mask: dark = may attend. Queries down the side, keys along the
    bottom."""
    ax.imshow(mask, cmap="Blues", vmin=0,
              vmax=1.3)  # vmax > 1 keeps True cells mid-blue, labels legible
    ax.grid(False)
    ax.set_xticks(range(len(tokens)), labels=tokens, rotation=60, ha="right")
    ax.set_yticks(range(len(tokens)), labels=tokens if ylabels else [])
    ax.set(title=title, xlabel="key", ylabel="query" if ylabels else "")


short = int(lengths.argmin())  # the shortest sentence shows the padding
fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
for ax, (title, mask) in zip(axes, (("padding only", pad[short, 0].expand(longest, longest)),
                                    ("causal only", causal_mask(longest)),
                                    ("padding & causal", both[short, 0])), strict=True):
    draw_mask(ax, mask, padded[short], f"{title}\n{' '.join(sentences[short])}",
              ylabels=ax is axes[0])
fig.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The pad *columns* are off for every query. The pad *rows* still see the real tokens: a pad
# query produces some output, and the loss simply ignores those positions. What matters is that
# nothing real ever reads a pad. We check it with two heads and garbage in the pad slots:

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(4)
batch, heads, d_head = len(sentences), 2, 4
tokens = torch.randn(batch, longest, 6, dtype=torch.float64)
garbage = tokens.clone()
for b, length in enumerate(lengths.tolist()):
    garbage[b, length:] = 1e3 * torch.randn(longest - length, 6, dtype=torch.float64)


def heads_of(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v (B, 2, N, 4) of tokens x (B, N, 6): two heads sharing W_Q, W_K, W_V."""
    return tuple((x @ w).unsqueeze(1).expand(-1, heads, -1, -1) for w in (W_Q, W_K, W_V))


def batched_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of x (B, N, 6) under the padding & causal mask; returns (B, 2, N, 4), (B, 2, N,
    N)."""
    return scaled_dot_product_attention(*heads_of(x), mask=both)


# %% slideshow={"slide_type": "fragment"}
clean_out, clean_weights = batched_heads(tokens)
garbage_out, _ = batched_heads(garbage)
is_pad_key = ~pad.expand_as(clean_weights)
print("largest weight on any pad key:", clean_weights[is_pad_key].max().item())
for b, length in enumerate(lengths.tolist()):
    real_moved = (garbage_out[b, :, :length] - clean_out[b, :, :length]).abs().max().item()
    print(f"sentence {b}: real tokens' outputs moved by {real_moved} after filling the pads with "
          f"garbage")
    assert real_moved == 0

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 2: a padding mask, on either side
# Write `my_padding_mask(lengths, n, side="right")` returning a boolean tensor `(B, n)`, True on
# the real tokens of each sentence: with `side="right"` the pads come last (position `j` is real
# when `j < lengths[b]`, the batch above); with `side="left"` they come first, as in the batches for
# generation of section 7, so the real tokens are the last `lengths[b]` positions. The cell after
# the check builds section 6's batch with your function, and exercise 3 runs on the masks it makes.
#
# <details><summary>Hint 1: the idea</summary>Position j of sentence b is real when it is smaller
# than that sentence's length (pads last), or when at most that many positions remain from it to
# the end (pads first).</details>
#
# <details><summary>Hint 2: the plan</summary>(1) The positions of a sentence and the sentences'
# lengths, laid out so that one comparison makes the whole (B, n) table. (2) Pads last: a position
# is real while it is inside the length. (3) Pads first: it is real when the positions from it to
# the end, itself included, are no more than the length.</details>

# %% slideshow={"slide_type": "fragment"}
def my_padding_mask(lengths: torch.Tensor, n: int, side: str = "right") -> torch.Tensor:
    """True on the real tokens: lengths (B,) -> bool (B, n), the pads last (right) or first
    (left)."""
    ### BEGIN SOLUTION
    position = torch.arange(n)
    if side == "left":
        return position >= n - lengths[:, None]  # (B, n): the pads come first
    return position < lengths[:, None]           # (B, n): the pads come last
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("masking.padding_mask", my_padding_mask)

# %% slideshow={"slide_type": "fragment"}
def course_padding_mask(lengths: torch.Tensor, n: int, side: str = "right") -> torch.Tensor:
    """The course's version: the helper's padding_mask (B, 1, 1, n) as (B, n), flipped when the
    pads come first."""
    real = padding_mask(lengths, n)[:, 0, 0]
    return real.flip(-1) if side == "left" else real


real_tokens = yours_or("masking.padding_mask", my_padding_mask, course_padding_mask)
real_right = real_tokens(lengths, longest)  # (B, N): section 6's batch, the pads last
assert torch.equal(real_right, pad[:, 0, 0])
print("section 6's batch, 1 on the real tokens:\n", real_right.int())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. A fully masked row, and how to avoid NaN (optional)
#
# For generation, batches are often padded on the **left**, so that every sentence ends at the
# same position. Combine left padding with a causal mask and the first queries are pads whose
# only visible keys are pads: every key in their row is masked. What does the softmax of a row of
# $-\infty$ give?

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
left_padded = ["<pad>", "<pad>", "Soup", "is", "yummy", "."]
is_real = torch.tensor([t != "<pad>" for t in left_padded])
row_mask = causal_mask(len(left_padded)) & is_real
print("rows with nothing to attend to:", [left_padded[i] + f"@{i}" for i in range(6)
                                          if not row_mask[i].any()])
torch.manual_seed(5)
q, k, v = (torch.randn(6, 4) for _ in range(3))
scores = (q @ k.T / 2.0).masked_fill(~row_mask, float("-inf"))
plain = torch.softmax(scores, dim=-1)
print("torch.softmax, row 0:", plain[0])
print(
    "and what the NaN does downstream: output row 0",
    (plain @ v)[0],
    "| a loss that ignores row 0 by weighting it 0:",
    ((plain @ v).sum(dim=-1) * is_real).sum().item(),
)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Every $e^{-\infty}$ in the row is 0, so is their sum, and $0/0$ is NaN. Worse, NaN does not stay
# where it started: multiplying it by 0 gives NaN, so a loss that "ignores" the pad rows is NaN
# too, and so is every gradient. Two common ways out:
# 1. **What `helpers.model.attention.softmax` does:** if a row's maximum is $-\infty$, shift it by 0
#    instead of by the maximum (avoiding $-\infty - (-\infty)$), and if a row's sum is 0, divide by
#    1 instead. A fully masked row then gets all-zero weights and a zero output: "attend to
#    nothing" means "receive nothing". PyTorch's `F.scaled_dot_product_attention` does the same.
# 2. **Fill with a large finite number** such as `torch.finfo(dtype).min` instead of $-\infty$.
#    No NaN, but a fully masked row becomes a *uniform* average over all of its (forbidden) keys.
#    Harmless when the row is ignored anyway, but the weights are not zero.

# %% slideshow={"slide_type": "fragment"}
helper_out, helper_weights = scaled_dot_product_attention(q, k, v, mask=row_mask)
finite_fill = torch.softmax((q @ k.T / 2.0).masked_fill(~row_mask, torch.finfo(torch.float32).min),
                            dim=-1)
torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=row_mask)
print("helper weights, row 0:     ", helper_weights[0], " output row 0:", helper_out[0])
print("finite fill weights, row 0:", finite_fill[0])
print("torch's SDPA output row 0: ", torch_out[0])
assert torch.isfinite(helper_out).all() and torch.equal(helper_weights[0], torch.zeros(6))
torch.testing.assert_close(helper_out, torch_out)
torch.testing.assert_close(helper_weights[2:],
                           plain[2:])  # rows with something to see are unchanged

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 3 (core): attention with both masks, safe for a query with nothing to see
# Now the whole layer's core, the one `batched_heads` got from the helper in section 6: write
# `my_masked_attention(q, k, v, real)` for `q`, `k` of shape `(B, H, N, d)`, `v` of shape
# `(B, H, N, d_v)` and `real` of shape `(B, N)`, True on the real tokens (the cell after the check
# makes it with your `my_padding_mask`, for either side). Return
# `(output, weights)` of shapes `(B, H, N, d_v)` and `(B, H, N, N)`: no query puts weight on a
# later key or on a pad key, and a query that may see no key at all gets zero weights and a zero
# output, as in way 1 above. The cell after the check reruns section 6's garbage test and this
# section's left-padded sentence on your function.
#
# <details><summary>Hint 1: the idea</summary>One boolean mask says where a query may look: not in
# the future and not at a pad. Hide everything else before the softmax, and make the softmax safe
# for a row in which everything is hidden.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) The scaled scores. (2) One boolean table of the
# allowed (query, key) pairs: not in the future and not a pad, for every sentence, head and query.
# (3) Hide the rest, then a softmax that stays finite on a row where nothing is allowed (its weights
# are all zero). (4) The weights times the values.</details>
#
# <details><summary>Hint 3: closer</summary>The padding mask runs along the keys: give it axes for
# the heads and the queries. A fully hidden row has maximum minus infinity, and minus infinity minus
# minus infinity is NaN: shift such a row by 0 instead, and divide by 1 where a row's sum is
# 0.</details>

# %% slideshow={"slide_type": "fragment"}
def my_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal and padding attention: q, k (B, H, N, d), v (B, H, N, d_v), real (B, N) True on
    real tokens.

    Returns output (B, H, N, d_v) and weights (B, H, N, N); a query that may see no key gets zeros.
    """
    ### BEGIN SOLUTION
    n, d = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / d**0.5                   # (B, H, N, N)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))     # (N, N): key j <= query i
    allowed = causal & real[:, None, None, :]                   # (B, 1, N, N): and key j is no pad
    scores = scores.masked_fill(~allowed, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(allowed.any(dim=-1, keepdim=True), row_max,
                          0.0)  # -inf - -inf would be NaN
    exps = torch.exp(scores - row_max)
    total = exps.sum(dim=-1, keepdim=True)
    weights = exps / torch.where(total > 0, total, 1.0)         # an empty row: 0 / 1, not 0 / 0
    return weights @ v, weights
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("masking.masked_attention", my_masked_attention)

# %% slideshow={"slide_type": "fragment"}
def course_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The course's version: the helper with causal_mask & the real-token mask."""
    return scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[-2]) & real[:, None, None,
                                                                                      :])


masked_attention = yours_or("masking.masked_attention", my_masked_attention,
                            course_masked_attention)
clean = masked_attention(*heads_of(tokens), real_right)[0]
dirty = masked_attention(*heads_of(garbage), real_right)[0]
moved = max((dirty[b, :, :n] - clean[b, :, :n]).abs().max().item() for b,
            n in enumerate(lengths.tolist()))
torch.testing.assert_close(clean, clean_out)
print("right padding: largest move of a real token's output after filling the pads with garbage:",
      moved)
assert moved == 0
real_left = real_tokens(is_real.sum()[None], len(left_padded), side="left")  # (1, 6), pads first
assert torch.equal(real_left[0], is_real)
left_out, left_weights = masked_attention(q[None, None], k[None, None], v[None, None], real_left)
torch.testing.assert_close(left_out[0, 0], helper_out)
nothing_to_see = bool((left_weights[0, 0, 0] == 0).all() and (left_out[0, 0, 0] == 0).all())
print("left padding: the first pad, which may see no key, gets zero weights and a zero output:",
      nothing_to_see)
assert nothing_to_see

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. Encoder vs decoder: bidirectional vs causal (optional)
#
# An **encoder** (BERT and the left half of the original Transformer) reads a whole sentence that
# is already known, so every token may look both left and right: no causal mask (padding masks
# still apply). A **decoder** (GPT, and the right half of the original Transformer) generates
# left to right, so its self-attention is causal. A decoder in an encoder-decoder model has a
# second attention, *cross*-attention, whose queries come from the decoder and whose keys and
# values are the encoder's outputs: those are all known, so it is not causal either.

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "8.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import bidirectional_mask

encoder_out, encoder_w = self_attention(X, bidirectional_mask(4))
decoder_out, decoder_w = self_attention(X, causal_mask(4))
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
heatmap(encoder_w, TOKENS, TOKENS, ax=axes[0], vmin=0, vmax=1, title="Encoder: bidirectional",
        xlabel="key", ylabel="query")
heatmap(decoder_w, TOKENS, TOKENS, ax=axes[1], vmin=0, vmax=1, title="Decoder: causal",
        xlabel="key", ylabel="query")
fig.tight_layout()
plt.show()
edited_last = X.clone()
edited_last[-1] = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
for name, mask in (("encoder", bidirectional_mask(4)), ("decoder", causal_mask(4))):
    moved_first = (self_attention(edited_last, mask)[0][0] - self_attention(X,
                                                                            mask)[0][0]).abs().max()
    print(f"{name}: editing '{TOKENS[-1]}' moves the output of '{TOKENS[0]}' by {moved_first:.4f}")

# %% [markdown] slideshow={"slide_type": "slide"}
# The encoder's "The" depends on "here"; the decoder's cannot. That is the whole difference in
# the attention itself; the rest (what each is trained to do) follows from it.
#
# ## 9. Efficient attention: local, strided and global patterns (optional)
#
# Full attention stores an $N \times N$ weight matrix. Efficient-attention models (the DS 246 notes)
# keep only a sparse pattern of it:
# - **local** (sliding window): each token sees its neighbours within a window $w$;
# - **strided**: each token sees every $s$-th token;
# - **global**: a few chosen tokens see everything and are seen by everything.
#
# They are masks like any other: each is a rule about which (query, key) pairs to keep.
#
# ### Exercise 4 (core): the sparse patterns as one mask
# Write `my_sparse_mask(n, window=None, stride=None, global_tokens=(), causal=False)` returning
# a boolean `(n, n)` mask, True where query $i$ may see key $j$: the union of the parts asked for,
# - with `window` $w$: the keys with $|i - j| \le w$ (local);
# - with `stride` $s$: the keys with $i - j$ a multiple of $s$, counted from the query (strided);
# - with `global_tokens`: every key for a global query, and every global key for any query;
#
# and, with `causal=True`, of all of these only the keys with $j \le i$. Nothing asked for gives
# an all-False mask. The figures, the pair counts and the two-hop check below are all drawn
# with your function.
#
# <details><summary>Hint 1: the idea</summary>Local and strided are rules about the offset between
# a query and a key, how far back the key lies; global is a rule about the positions themselves.
# Build each part that was asked for as a boolean table, take their union, and cut the future
# last, so that the cut applies to every part.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) The table of offsets: how far each key lies behind
# each query. (2) The union of the parts asked for: the local window, the strided keys, the global
# tokens' rows and columns. (3) With causal, cut the future last, so that the cut applies to every
# part.</details>
#
# <details><summary>Hint 3: closer</summary>Start from an all-False table and add each part with a
# logical or. Local: the offset's size is within the window. Strided: the offset is a multiple of
# the stride.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "9.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def my_sparse_mask(n: int, window: int | None = None, stride: int | None = None,
                   global_tokens: tuple[int,
                           ...] | list[int] = (), causal: bool = False) -> torch.Tensor:
    """Bool (n, n): the union of a local window, a stride and global tokens, cut to the past if
    causal."""
    ### BEGIN SOLUTION
    position = torch.arange(n)
    offset = position[:, None] - position[None, :]  # (n, n): how far key j lies behind query i
    mask = torch.zeros(n, n, dtype=torch.bool)
    if window is not None:
        mask |= offset.abs() <= window               # local: the neighbours on either side
    if stride is not None:
        mask |= offset % stride == 0                 # strided: every stride-th key, from the query
    is_global = torch.zeros(n, dtype=torch.bool)
    is_global[list(global_tokens)] = True
    mask |= is_global[:, None] | is_global[None, :]  # global: their rows and their columns
    if causal:
        mask &= offset >= 0                          # last, so that it cuts every part
    return mask
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("masking.sparse_mask", my_sparse_mask)

# %% [markdown] slideshow={"slide_type": "subslide"}
# From here on the patterns come from `sparse_mask`: yours once it passes its check, until then
# one the course composes from its helpers `local_mask`, `strided_mask` and `global_mask`. Top
# row: the bidirectional (encoder) versions; bottom row: the same patterns `&` the causal mask
# (decoder).

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import global_mask, local_mask, strided_mask


def course_sparse_mask(n: int, window: int | None = None, stride: int | None = None,
                       global_tokens: tuple[int,
                               ...] | list[int] = (), causal: bool = False) -> torch.Tensor:
    """The same union, from the course's pattern helpers."""
    mask = ~bidirectional_mask(n)  # nothing yet
    if window is not None:
        mask |= local_mask(n, window, causal=False)
    if stride is not None:
        mask |= strided_mask(n, stride, causal=False)
    if len(global_tokens):
        mask |= global_mask(n, list(global_tokens))
    return mask & causal_mask(n) if causal else mask


sparse_mask = yours_or("masking.sparse_mask", my_sparse_mask, course_sparse_mask)

# %% slideshow={"slide_type": "fragment"}
PATTERN_SENTENCE = "once upon a time a small cat sat on the warm mat and fell fast asleep".split()
N_PAT, WINDOW, STRIDE, GLOBAL_TOKENS = len(PATTERN_SENTENCE), 2, 4, [0]
PARTS = {
    "full": {"window": N_PAT},
    "local": {"window": WINDOW},
    "strided": {"stride": STRIDE},
    "global": {"global_tokens": GLOBAL_TOKENS},
    "local + global": {"window": WINDOW, "global_tokens": GLOBAL_TOKENS},
}


def pattern(name: str, causal: bool) -> torch.Tensor:
    """The (N_PAT, N_PAT) boolean mask of a named pattern, optionally restricted to the past."""
    return sparse_mask(N_PAT, **PARTS[name], causal=causal)


# %% slideshow={"slide_type": "fragment"}
NAMES = ["full", "local", "strided", "global"]
fig, axes = plt.subplots(2, 4, figsize=(18, 10), layout="constrained")
for col, name in enumerate(NAMES):
    for row, causal in enumerate((False, True)):
        mask = pattern(name, causal)
        draw_mask(axes[row, col], mask, PATTERN_SENTENCE, ylabels=col == 0,
                  title=f"{name}{' & causal' if causal else ''}: {int(mask.sum())} pairs")
fig.suptitle(f"Attention patterns for N = {N_PAT} (window {WINDOW}, stride {STRIDE}, global token "
             f"0)", fontsize=16)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### What the patterns save as N grows
#
# For 16 tokens the savings are small; they grow with $N$. A local window keeps at most $2w + 1$
# keys per query, so for a fixed window its cost grows **linearly** in $N$. A strided pattern with
# a fixed stride $s$ keeps about $N/s$ keys per query, so its cost is about $N^2/s$: still
# **quadratic**, only $s$ times cheaper than full attention. That is why the Sparse Transformer
# (Child et al., 2019) does not fix the stride: it picks $s \approx \sqrt{N}$, so each query sees
# about $\sqrt{N}$ strided keys (plus a local window of about $\sqrt{N}$), and the cost grows like
# $N\sqrt{N}$. The table counts the pairs, and how much each count grows when $N$ doubles:

# %% slideshow={"slide_type": "fragment"}
def pattern_pairs(n_big: int) -> dict[str, int]:
    """Number of (query, key) pairs each pattern keeps for n_big tokens (bidirectional)."""
    sqrt_stride = round(n_big**0.5)
    return {"full": n_big * n_big,
            "local w=256": int(sparse_mask(n_big, window=256).sum()),
            "strided s=64": int(sparse_mask(n_big, stride=64).sum()),
            "strided s=sqrt(N)": int(sparse_mask(n_big, stride=sqrt_stride).sum())}


SIZES = (1024, 2048, 4096)
pairs = {n_big: pattern_pairs(n_big) for n_big in SIZES}
print(f"{'N':>6}" + "".join(f"{name:>20}" for name in pairs[SIZES[0]]))
for n_big in SIZES:
    print(f"{n_big:>6}" + "".join(f"{count:>20,}" for count in pairs[n_big].values()))
growth = {name: pairs[SIZES[-1]][name] / pairs[SIZES[-2]][name] for name in pairs[SIZES[0]]}
print(f"{'x2 N:':>6}" + "".join(f"{'x ' + format(factor, '.2f'):>20}"
                                for factor in growth.values()))
print(f"for comparison: 2^2 = 4 (quadratic), 2^1.5 = {2**1.5:.2f} (N sqrt N), 2 (linear)")
assert growth["strided s=64"] == 4 and growth["full"] == 4 and growth["local w=256"] < 2.2

# %% [markdown] slideshow={"slide_type": "subslide"}
# Doubling $N$ from 2048 to 4096 multiplies the full and the fixed-stride counts by exactly 4
# (quadratic), the local window's by a little over 2 (linear: near the ends of the sequence the
# window is cut short), and the $\sqrt{N}$-stride count by about 2.8, close to $2^{1.5}$.
#
# Used in attention, a pattern is just the `mask=` argument, and every weight outside it is
# exactly zero. Stacking layers restores reach: a causal local window of $s - 1$ followed by a
# causal stride of $s$ connects every query to every earlier key in **two** hops (the idea of the
# Sparse Transformer), which the cell checks with a boolean matrix product.

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(7)
q, k, v = (torch.randn(N_PAT, 8) for _ in range(3))
sparse = pattern("local + global", causal=True)
_, sparse_weights = scaled_dot_product_attention(q, k, v, mask=sparse)
assert (sparse_weights[~sparse] == 0).all() and (sparse_weights[sparse] > 0).all()
heatmap(sparse_weights, PATTERN_SENTENCE, PATTERN_SENTENCE, annotate=False, vmin=0, vmax=1,
        title="Attention weights under 'local + global & causal'", xlabel="key", ylabel="query")
plt.show()

one_hop_local = sparse_mask(N_PAT, window=STRIDE - 1, causal=True)
one_hop_strided = sparse_mask(N_PAT, stride=STRIDE, causal=True)
two_hops = ((one_hop_local.double() @ one_hop_strided.double()) > 0) | (
    (one_hop_strided.double() @ one_hop_local.double()) > 0
)
print("local + strided reach every earlier key in two hops:", torch.equal(two_hops,
                                                                          causal_mask(N_PAT)))
print(f"while one hop of either reaches only {int(one_hop_local.sum())} or "
      f"{int(one_hop_strided.sum())} of the {int(causal_mask(N_PAT).sum())} causal pairs")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Explore the patterns
# Pick a pattern and a query position: the left panel shows the mask with the query's row
# outlined, the right panel the attention weights that query actually gets. First the static
# drawing, then the widget.

# %% slideshow={"slide_type": "fragment"}
PATTERN_NAMES = ["full", "local", "strided", "global", "local + global"]


def draw_query_weights(right, query: int, weights: torch.Tensor, mask: torch.Tensor) -> None:
    """Bars of row `query` of weights (N_PAT, N_PAT), the keys that `mask` hides in grey."""
    right.bar(range(N_PAT), weights[query], color=["tab:blue" if m else "lightgray"
                                                   for m in mask[query]])
    right.set(
        xticks=range(N_PAT),
        ylim=(0, 1),
        ylabel="attention weight",
        title=f"query '{PATTERN_SENTENCE[query]}' (position {query}) "
        f"sees {int(mask[query].sum())} keys",
    )
    right.set_xticklabels(PATTERN_SENTENCE, rotation=60, ha="right")


# %% slideshow={"slide_type": "fragment"}
def draw_query_view(name: str, query: int, causal: bool) -> dict[str, list]:
    """Mask of pattern `name` with row `query` outlined, and that query's attention weights.

    Returns the keys the query may see and the weights it gives them.
    """
    mask = pattern(name, causal)
    _, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [1,
                                                                                             1.3]})
    draw_mask(left, mask, PATTERN_SENTENCE, f"{name}{' & causal' if causal else ''}")
    left.add_patch(plt.Rectangle((-0.5, query - 0.5), N_PAT, 1, fill=False, edgecolor="red",
                                 linewidth=3))
    draw_query_weights(right, query, weights, mask)
    fig.tight_layout()
    return {"visible": mask[query].nonzero().flatten().tolist(), "weights": weights[query].tolist()}


static_view = draw_query_view("local + global", 10, causal=True)
plt.show()
print("query 10 may see positions", static_view["visible"])

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds ids that change on every run; the static figure above is the same
# drawing.
explorer = Explorer(draw_query_view,
                    name=widgets.Dropdown(options=PATTERN_NAMES, value="local + global",
                                          description="pattern"),
                    query=widgets.IntSlider(min=0, max=N_PAT - 1, value=10, description="query"),
                    causal=widgets.Checkbox(value=True, description="causal"))
explorer

# %% slideshow={"slide_type": "fragment"}
start = explorer.reset()  # local + global, query 10, causal
query_3 = explorer.set(query=3)
strided_3 = explorer.set(name="strided")
two_sided = explorer.set(causal=False)
assert start["visible"] == [0, 8, 9, 10] and query_3["visible"] == [0, 1, 2, 3]
assert strided_3["visible"] == [3] and two_sided["visible"] == [3, 7, 11, 15]

# %% slideshow={"slide_type": "fragment"}
print("local + global, query 10:", start["visible"], "| query 3:", query_3["visible"],
      "| strided, query 3:", strided_3["visible"], "| strided, not causal:", two_sided["visible"])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. Why use masked attention? (the USF notes)**
# <details><summary>Answer</summary>
#
# A decoder is trained to predict each next token from the tokens before it, for all positions
# in one parallel pass. Without a mask, position $t$ could read token $t+1$ (the answer) and
# the model would learn to copy instead of predict; at generation time those future tokens do
# not exist yet. The causal mask makes training see exactly what generation will see. The cell
# computes it: the last token changes the first token's output without the mask, not with it.
# </details>

# %% slideshow={"slide_type": "fragment"}
catch_up("04_masking", "Check")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
for name, mask in (("no mask", None), ("causal mask", causal_mask(4))):
    moved_first = (self_attention(edited_last, mask)[0][0] - self_attention(X,
                                                                            mask)[0][0]).abs().max()
    print(f"{name:>12}: output of '{TOKENS[0]}' moves by {moved_first:.4f} when '{TOKENS[-1]}' "
          f"changes")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. Why $-\infty$ and not 0 in the masked scores?**
# <details><summary>Answer</summary>
#
# The softmax exponentiates: $e^{-\infty} = 0$ removes a key exactly, $e^0 = 1$ does not. With
# unit-size scores a 0-filled "mask" still sends a large share of the weight to the future
# (computed below for the first query of section 2), and section 5 shows the outputs then depend
# on future tokens.
# </details>

# %% slideshow={"slide_type": "fragment"}
print(f"first query's weight on the future: fill 0 -> "
      f"{future_weight(ordinary_scores, 0.0)[0]:.3f}, "
      f"fill -inf -> {future_weight(ordinary_scores, float('-inf'))[0]:.3f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. What are the differences between the Transformer encoder and decoder? (the USF notes)**
# <details><summary>Answer</summary>
#
# The encoder's self-attention is bidirectional: every token sees the whole (unpadded) input.
# The decoder's self-attention is causal, and in an encoder-decoder model each decoder block adds
# cross-attention: decoder queries over the encoder's outputs, unmasked except for padding. The
# cell prints the three masks for a 3-token target and a 4-token source.
# </details>

# %% slideshow={"slide_type": "fragment"}
n_target, n_source = 3, 4
print("encoder self-attention (source x source):\n", bidirectional_mask(n_source).int())
print("decoder self-attention (target x target):\n", causal_mask(n_target).int())
print("decoder cross-attention (target x source):\n", bidirectional_mask(n_target, n_source).int())

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. What parallelises in training a decoder?**
# <details><summary>Answer</summary>
#
# All positions at once. Because the mask hides the future, one masked pass over the full
# sentence gives, at every position $t$, exactly the output of running attention on the prefix
# $0..t$ alone. Training therefore needs one pass per sentence, not one per token. Generation,
# which must wait for each new token, is what stays sequential. The cell runs every prefix
# separately and compares.
# </details>

# %% slideshow={"slide_type": "fragment"}
full_pass = self_attention(x, causal_mask(n))[0]
prefix_by_prefix = torch.stack([self_attention(x[: t + 1])[0][-1] for t in range(n)])
torch.testing.assert_close(full_pass, prefix_by_prefix)
print(f"one masked pass == {n} separate prefix passes, for all {n} positions")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **5. What does `helpers.model.attention` return for a query that may see no key at all, and why
# not NaN?**
# <details><summary>Answer</summary>
#
# Zero weights and a zero output. A plain softmax computes $0/0$ there; the helper shifts an
# all-$-\infty$ row by 0 instead of by its maximum and divides by 1 when the row sum is 0
# (section 7). The cell checks it on a query with an all-False mask.
# </details>

# %% slideshow={"slide_type": "fragment"}
output, weights = scaled_dot_product_attention(torch.randn(1, 4), torch.randn(3, 4), torch.randn(3,
                                                                                                 2),
                                               mask=torch.zeros(1, 3, dtype=torch.bool))
print("weights:", weights, "output:", output)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **6. How much does a sliding window save for long sequences?**
# <details><summary>Answer</summary>
#
# A two-sided window of $w$ keeps at most $2w + 1$ keys per query instead of $N$, so the share of
# the $N^2$ pairs it keeps shrinks like $(2w+1)/N$: computed for $w = 256$ below.
# </details>

# %% slideshow={"slide_type": "fragment"}
for n_big in (1024, 4096, 16384):
    share = min(2 * 256 + 1, n_big) / n_big
    print(f"N = {n_big:>6}: at most {share:.1%} of the pairs")
