# %% [markdown] slideshow={"slide_type": "slide"}
# # 5. Multi-head attention
#
# One attention head gives every token one weighted average of the others. Multi-head attention
# runs several heads side by side, each with its own projections, and mixes their results.
#
# **After this notebook you can**
# - build multi-head attention two ways, as a list of single-head modules and as one module that
#   handles every head in one batched product, copy one's weights into the other, and prove that
#   the two compute the same thing;
# - write down the shape of every tensor on the way, `[B, H, N, D_H]`, and say what `W_O` does;
# - read the attention maps of each head;
# - size the KV cache and say what grouped-query (GQA) and multi-query (MQA) attention save;
# - use the same module for cross-attention.
#
# **It assumes** notebooks 3 (scaled dot-product attention) and 4 (masking). The attention
# itself comes from `helpers.model.attention`; this notebook only arranges heads around it.

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import re

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from helpers.model.attention import causal_mask, scaled_dot_product_attention
from helpers.lab.exercises import check
from helpers.lab.plots import heatmap
from helpers.lab.widgets import Explorer
from helpers.lab.sections import catch_up

# The tensors here are tiny: one thread is faster than splitting each product across several.
torch.set_num_threads(1)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Why more than one head? (optional)
#
# A head's weights for one query form a single probability distribution. Suppose a token needs
# two different things, say its subject and its object, carried by two value vectors. One head
# can only return a blend of them; two heads, each looking for one, return both intact.

# %% slideshow={"slide_type": "fragment"}
values = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (2 keys, 2 features): "subject", "object"
keys = torch.eye(2)
wants_both = torch.tensor([[1.0, 1.0]])          # one query matching both keys equally
one_head, _ = scaled_dot_product_attention(wants_both, keys, values)
wants_subject, wants_object = torch.tensor([[9.0, 0.0]]), torch.tensor([[0.0, 9.0]])
two_heads = torch.cat([scaled_dot_product_attention(wants_subject, keys, values)[0],
                       scaled_dot_product_attention(wants_object, keys, values)[0]], dim=-1)
print("one head :", one_head)
print("two heads:", two_heads.round(decimals=2))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The single head returns the average `[0.5, 0.5]`: it can no longer tell which feature came from
# which key. The two heads return `[1, 0]` and `[0, 1]` side by side (each to two decimals).
# That is the idea; the rest of the notebook is the bookkeeping.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Heads as separate modules (optional)
#
# The input is the 4 x 8 matrix of the Matrix Magic notes ("I like to eat": token plus position embeddings).
# Each head has its own `W_Q`, `W_K`, `W_V` of shape `[D x D_H]`; its output is `[N x D_H]`.
# The heads' outputs are concatenated to `[N x H·D_H]` and multiplied by `W_O` of shape
# `[H·D_H x D]`. Here `H·D_H = D`, the usual choice (the USF notes), so `W_O` is square; the Matrix Magic notes use
# four heads of size 4 on an 8-wide input, so their `W_O` is 16 x 8.

# %% slideshow={"slide_type": "fragment"}
catch_up("05_multihead_attention",
         "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
tokens_matrix_magic = ["I", "like", "to", "eat"]
X = torch.tensor([[0.68, 0.54, 0.06, 0.65, 0.23, 1.45, 0.76, 0.84],
                  [0.43, 1.22, 1.13, 1.49, 1.04, 1.09, 0.65, 0.62],
                  [1.20, 0.66, 1.08, 1.50, 0.54, 0.91, 0.94, 0.16],
                  [1.80, 0.92, 0.84, 0.14, 0.72, 0.94, 1.93,
                   0.76]])  # (N, D), the Matrix Magic notes
N, D = X.shape
H = 2
D_H = D // H
print(f"N = {N} tokens, D = {D} features, H = {H} heads of D_H = {D_H}, so W_O is {H * D_H} x {D}")
print(f"(the Matrix Magic notes: 4 heads of 4 on D = {D} give {4 * 4} concatenated features and a "
      f"{4 * 4} x {D} W_O)")

torch.manual_seed(0)
W_Q = [torch.randn(D, D_H) / D**0.5 for _ in range(H)]  # one [D x D_H] matrix per head
W_K = [torch.randn(D, D_H) / D**0.5 for _ in range(H)]
W_V = [torch.randn(D, D_H) / D**0.5 for _ in range(H)]
W_O = torch.randn(H * D_H, D) / (H * D_H) ** 0.5       # [H·D_H x D]

# %% slideshow={"slide_type": "fragment"}
def one_head(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
             w_v: torch.Tensor) -> torch.Tensor:
    """x: (N, D) -> (N, D_H): masked self-attention with this head's own projections."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # (N, D_H) each
    out, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(len(x)))
    return out


head_outputs = [one_head(X, W_Q[h], W_K[h], W_V[h]) for h in range(H)]  # H x (N, D_H)
concatenated = torch.cat(head_outputs, dim=-1)                           # (N, H·D_H)
multi_head_plain = concatenated @ W_O                                    # (N, D)
for name, t in [("one head's output", head_outputs[0]), ("concatenated", concatenated),
                ("after W_O", multi_head_plain)]:
    print(f"{name:>18}: {tuple(t.shape)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same thing lives in `helpers.model.multihead` as `SeparateHeadsAttention`: an `nn.ModuleList` of
# `AttentionHead` modules (each with `q_proj`, `k_proj`, `v_proj`) and an `out_proj` for `W_O`.
# `nn.Linear` stores its weight as `[out x in]`, the transpose of the `[in x out]` matrices above,
# so copying our matrices in takes a `.T`. The cell checks that the module and the plain code agree.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.multihead import SeparateHeadsAttention

separate = SeparateHeadsAttention(d_model=D, n_heads=H, bias=False)
with torch.no_grad():
    for h, head in enumerate(separate.heads):
        head.q_proj.weight.copy_(W_Q[h].T)
        head.k_proj.weight.copy_(W_K[h].T)
        head.v_proj.weight.copy_(W_V[h].T)
    separate.out_proj.weight.copy_(W_O.T)

from_module = separate(X.unsqueeze(0), causal=True)[0]  # the module wants a batch axis: (1, N, D)
assert torch.allclose(from_module, multi_head_plain, atol=1e-6)
print("SeparateHeadsAttention == plain code:", torch.allclose(from_module, multi_head_plain,
                                                              atol=1e-6))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. All heads at once: four matrix multiplies (core)
#
# Running the heads one after another wastes the hardware: every head does the same operations on
# different numbers. The USF notes write multi-head attention as four matrix multiplies over a batch
# of `B` sequences:
#
# | step | operation | shapes |
# |---|---|---|
# | 1. QKV projection | `X W_QKV`, then split and reshape | `[B, N, D] [D, 3·H·D_H] -> 3 x [B, H, N, D_H]` |
# | 2. QK similarity | `Q Kᵀ / sqrt(D_H)` | `[B, H, N, D_H] [B, H, D_H, N] -> [B, H, N, N]` |
# | 3. V weighting | `softmax(...) V` | `[B, H, N, N] [B, H, N, D_H] -> [B, H, N, D_H]` |
# | 4. output projection | merge heads, then `W_O` | `[B, N, H·D_H] [H·D_H, D] -> [B, N, D]` |
#
# The head axis `H` sits next to the batch axis, so PyTorch's batched matrix product runs every
# (sequence, head) pair in one call. Steps 1 and 4 hide the only tricky lines: turning
# `[B, N, H·D_H]` into `[B, H, N, D_H]` and back. You write both first; then a cell does the four
# steps by hand with them on a batch of two sequences (the Matrix Magic sentence and the same tokens
# reversed) and asserts every shape.

# %% slideshow={"slide_type": "fragment"}
catch_up("05_multihead_attention",
         "3.")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: split the heads
#
# Write `my_split_heads(x, n_heads)`: `x` is `(B, N, H·D_H)`, the result `(B, H, N, D_H)`, where
# head `h` holds features `h·D_H ... (h+1)·D_H - 1` of every token. Reshaping straight to
# `[B, H, N, D_H]` has the right shape and the wrong contents; the checker notices.
#
# <details><summary>Hint 1: the idea</summary>
#
# The D features of a token are H blocks of D_H side by side; each block becomes a head, and in
# the result heads come before tokens.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Read the sizes off the input. (2) Give each
# token's features a head axis and a per-head axis, each token keeping its own features. (3) Bring
# the heads in front of the tokens.</details>

# %% slideshow={"slide_type": "fragment"}
def my_split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, N, H * D_H) -> (B, H, N, D_H)."""
    ### BEGIN SOLUTION
    n_batch, n_tokens, width = x.shape
    head_dim = width // n_heads
    per_head = x.view(n_batch, n_tokens, n_heads, head_dim)  # (B, N, H, D_H)
    return per_head.transpose(1, 2)                           # (B, H, N, D_H)
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("multihead_attention.split_heads", my_split_heads)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: merge the heads
#
# Write `my_merge_heads(heads)`, the inverse: `(B, H, N, D_H)` in, `(B, N, H·D_H)` out, each token's
# heads side by side.
#
# <details><summary>Hint 1: the idea</summary>
#
# Undo the split step by step, in reverse order.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Bring each token's heads back together: the head
# axis behind the token axis again. (2) Join the head axis and the per-head axis into one axis of
# features.</details>
#
# <details><summary>Hint 3: closer</summary>After the swap the memory is no longer in row order: a
# view refuses, a reshape copies when it has to.</details>

# %% slideshow={"slide_type": "fragment"}
def my_merge_heads(heads: torch.Tensor) -> torch.Tensor:
    """(B, H, N, D_H) -> (B, N, H * D_H)."""
    ### BEGIN SOLUTION
    b, h, n, d_h = heads.shape
    tokens_first = heads.transpose(1, 2)  # (B, N, H, D_H)
    return tokens_first.reshape(b, n, h * d_h)
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("multihead_attention.merge_heads", my_merge_heads)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The four steps now run on your two functions (or on the course's `split_heads` and
# `merge_heads` from `helpers.model.multihead`, until yours pass their checks).

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises import yours_or
from helpers.model import multihead

split_heads = yours_or("multihead_attention.split_heads", my_split_heads, multihead.split_heads)
merge_heads = yours_or("multihead_attention.merge_heads", my_merge_heads, multihead.merge_heads)

# %% slideshow={"slide_type": "fragment"}
batch = torch.stack([X, X.flip(0)])  # (B, N, D)
B = batch.shape[0]
W_QKV = torch.cat(W_Q + W_K + W_V, dim=1)  # [D, 3·H·D_H]: all heads' Q, then K, then V columns

qkv = batch @ W_QKV                                        # step 1
q, k, v = (split_heads(t, H) for t in qkv.split(H * D_H, dim=-1))  # 3 x [B, H, N, D_H]
heads, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(N))  # steps 2 and 3
merged = merge_heads(heads)                                # [B, N, H·D_H]
fused_plain = merged @ W_O                                 # step 4

expected_shapes = {"W_QKV": (D, 3 * H * D_H), "qkv": (B, N, 3 * H * D_H), "q": (B, H, N, D_H),
                   "k": (B, H, N, D_H), "v": (B, H, N, D_H), "weights": (B, H, N, N),
                   "heads": (B, H, N, D_H), "merged": (B, N, H * D_H), "fused_plain": (B, N, D)}
tensors = {"W_QKV": W_QKV, "qkv": qkv, "q": q, "k": k, "v": v, "weights": weights,
           "heads": heads, "merged": merged, "fused_plain": fused_plain}
for name, shape in expected_shapes.items():
    assert tuple(tensors[name].shape) == shape, (name, tensors[name].shape, shape)
    print(f"{name:>12}: {shape}")
assert torch.allclose(fused_plain[0], multi_head_plain, atol=1e-6)
print("four matrix multiplies == heads one by one:", torch.allclose(fused_plain[0],
                                                                    multi_head_plain, atol=1e-6))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The fused module, and the proof that both styles agree
#
# `helpers.model.multihead.MultiHeadAttention(d_model, n_heads)` is the batched version: it keeps
# three projections, `q_proj`, `k_proj`, `v_proj`, each `nn.Linear(D, H·D_H)`, and `out_proj` for
# `W_O`, and runs the four steps with `split_heads` and `merge_heads`. (Kept apart rather than as one
# `W_QKV`, the projections let keys and values have fewer heads than queries, section 6.) Given the
# same weights, it must compute exactly what `SeparateHeadsAttention` computes.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: fuse a list of heads into one module
#
# Write `my_fuse_heads(separate)`: a new `MultiHeadAttention` with the same `d_model`, the same number
# of heads, and biases exactly when `separate` has them, whose weights are copies of those of the
# `SeparateHeadsAttention` `separate`, so that the two modules give the same output. In
# `nn.Linear`'s `[out x in]` layout, head `h`'s query weight (`separate.heads[h].q_proj.weight`,
# `[D_H x D]`) must become rows `h·D_H ... (h+1)·D_H - 1` of the fused query weight; the same for
# keys, values and the biases. `W_O` works on the concatenated heads in both modules. The cell
# after the check builds the fused module with your function and compares the two.
#
# <details><summary>Hint 1: the idea</summary>
#
# Concatenating the heads' outputs is the same as one big projection whose weight is the heads'
# weights stacked, head 0's rows first. So the fused projections are stacks of the heads'
# projections, and the output projection is shared as it is.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) A fused module of the same size, with biases when
# the separate one has them. (2) Each fused projection (queries, keys, values) takes the heads'
# projections stacked in head order, weights and biases. (3) The output projection is copied as it
# is. Copy without recording gradients.</details>
#
# <details><summary>Hint 3: closer</summary>Stack the weights along the output axis, head 0's rows
# first.</details>

# %% slideshow={"slide_type": "fragment"}
from helpers.model.multihead import MultiHeadAttention


def my_fuse_heads(separate: SeparateHeadsAttention) -> MultiHeadAttention:
    """A MultiHeadAttention computing what `separate` (H heads of D_H, D = H·D_H) computes."""
    ### BEGIN SOLUTION
    has_bias = separate.out_proj.bias is not None
    fused = MultiHeadAttention(separate.d_model, separate.n_heads, bias=has_bias)
    pairs = [(fused.q_proj, [head.q_proj for head in separate.heads]),
             (fused.k_proj, [head.k_proj for head in separate.heads]),
             (fused.v_proj, [head.v_proj for head in separate.heads])]
    with torch.no_grad():
        for big, small in pairs:
            big.weight.copy_(torch.cat([one.weight for one in small], dim=0))  # (H·D_H, D)
            if has_bias:
                big.bias.copy_(torch.cat([one.bias for one in small]))
        fused.out_proj.weight.copy_(separate.out_proj.weight)
        if has_bias:
            fused.out_proj.bias.copy_(separate.out_proj.bias)
    return fused
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("multihead_attention.fuse_heads", my_fuse_heads)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The cell fuses a random `SeparateHeadsAttention` with your function (or the course's
# `fuse_heads`) and compares the outputs, with biases, on random batches, with and without the
# causal mask. Every later cell of this notebook that needs a fused module with known weights uses
# this one.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.multihead import fuse_heads

fuse = yours_or("multihead_attention.fuse_heads", my_fuse_heads, fuse_heads)
torch.manual_seed(1)
separate = SeparateHeadsAttention(d_model=32, n_heads=4)
fused = fuse(separate)
x = torch.randn(3, 7, 32)  # (B, N, D)
for causal in (False, True):
    gap = (separate(x, causal=causal) - fused(x, causal=causal)).abs().max().item()
    assert gap < 1e-6
    print(f"causal={causal!s:5}: largest |separate - fused| below 1e-6: {gap < 1e-6}")
assert torch.allclose(separate.last_weights, fused.last_weights, atol=1e-6)
print("attention weights, shape (B, H, N, N):", tuple(fused.last_weights.shape))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Stacking the three fused projections gives the USF notes' single `[D x 3·H·D_H]` projection; one
# product with it yields the same queries, keys and values.

# %% slideshow={"slide_type": "fragment"}
w_qkv = torch.cat([fused.q_proj.weight, fused.k_proj.weight, fused.v_proj.weight])  # (3·D, D)
b_qkv = torch.cat([fused.q_proj.bias, fused.k_proj.bias, fused.v_proj.bias])
q_once, k_once, v_once = (x @ w_qkv.T + b_qkv).split(32, dim=-1)
assert torch.allclose(q_once, fused.q_proj(x), atol=1e-6) and torch.allclose(v_once,
        fused.v_proj(x), atol=1e-6)
print("one [D x 3D] product == three [D x D] products:", tuple(w_qkv.T.shape))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the forward pass of multi-head attention
#
# Now write what `MultiHeadAttention.forward` does, from its four `nn.Linear` layers
# (`mha.q_proj`, `mha.k_proj`, `mha.v_proj`, `mha.out_proj`) and `mha.n_heads`: `x` `(B, N, D)` in,
# `(B, N, D)` out, with the causal mask when `causal` is true. Compute the scores, the mask and the
# softmax yourself; `split_heads` and `merge_heads` (yours from above, or the course's) may help.
# Calling the module itself (or its `attend`) does not count. The cell after the check proves your
# function equal to the module and to PyTorch's own `torch.nn.MultiheadAttention`.
#
# <details><summary>Hint 1: the idea</summary>
#
# The four steps of the table in section 3: project, split into heads, attend inside each head
# (the heads never mix here), then put the heads side by side again and project with `W_O`.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Project x to queries, keys and values and cut each
# into the module's heads. (2) Scaled dot-product attention inside each head, the future hidden when
# causal. (3) Merge the heads and apply the output projection.</details>
#
# <details><summary>Hint 3: closer</summary>Your split and merge functions of this notebook do the
# cutting and the joining. Scale by the square root of the head size, not of the model's width;
# causal hides the entries above the diagonal before the softmax.</details>

# %% slideshow={"slide_type": "fragment"}
def my_mha_forward(x: torch.Tensor, mha: MultiHeadAttention, causal: bool = False) -> torch.Tensor:
    """Multi-head self-attention of x (B, N, D) with the weights of `mha`. Returns (B, N, D)."""
    ### BEGIN SOLUTION
    n_tokens, n_heads = x.shape[1], mha.n_heads
    queries = split_heads(mha.q_proj(x), n_heads)             # (B, H, N, D_H)
    keys = split_heads(mha.k_proj(x), n_heads)
    values = split_heads(mha.v_proj(x), n_heads)
    scores = queries @ keys.transpose(-2, -1) / queries.shape[-1] ** 0.5  # (B, H, N, N)
    if causal:
        above = torch.triu(torch.ones(n_tokens, n_tokens, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(above, float("-inf"))
    heads = torch.softmax(scores, dim=-1) @ values            # (B, H, N, D_H)
    return mha.out_proj(merge_heads(heads))                   # (B, N, D)
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("multihead_attention.mha_forward", my_mha_forward)

# %% slideshow={"slide_type": "fragment"}
def module_forward(x: torch.Tensor, mha: MultiHeadAttention, causal: bool = False) -> torch.Tensor:
    """The course's forward: the module itself."""
    return mha(x, causal=causal)


mha_forward = yours_or("multihead_attention.mha_forward", my_mha_forward, module_forward)
reference = torch.nn.MultiheadAttention(32, 4, batch_first=True)
with torch.no_grad():  # PyTorch keeps W_Q, W_K, W_V stacked in one (3·D, D) matrix
    reference.in_proj_weight.copy_(w_qkv)
    reference.in_proj_bias.copy_(b_qkv)
    reference.out_proj.weight.copy_(fused.out_proj.weight)
    reference.out_proj.bias.copy_(fused.out_proj.bias)
    for causal in (False, True):
        # PyTorch's mask: True = may NOT attend
        future = ~causal_mask(x.shape[1]) if causal else None
        theirs = reference(x, x, x, attn_mask=future, need_weights=False)[0]
        gaps = [(mha_forward(x, fused, causal) - other).abs().max().item() for other in (fused(x,
                causal=causal), theirs)]
        assert max(gaps) < 1e-5
        print(f"causal={causal!s:5}: largest gap to the module and to torch.nn.MultiheadAttention "
              f"below 1e-5: "
              f"{max(gaps) < 1e-5}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. What `W_O` does (core)
#
# Cut `W_O` into `H` horizontal blocks of `D_H` rows. Multiplying the concatenated heads by `W_O`
# is the same as multiplying each head's output by its own block and adding up. So `W_O` is where
# the heads' results are combined: without it, output feature `j` would come from one head only.

# %% slideshow={"slide_type": "fragment"}
catch_up("05_multihead_attention",
         "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
per_head = [head_outputs[h] @ W_O[h * D_H:(h + 1) * D_H] for h in range(H)]  # H x (N, D)
assert torch.allclose(sum(per_head), multi_head_plain, atol=1e-6)
print("concat(heads) @ W_O == sum over heads of head_h @ W_O[block h]:",
      torch.allclose(sum(per_head), multi_head_plain, atol=1e-6))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. What each head looks at (optional)
#
# Random weights give random-looking maps. To make four heads with four clear jobs, we set the
# weights of a `MultiHeadAttention` by hand. Each token is a 64-feature vector: features 0-15 are
# a one-hot position, features 16-31 a fixed random unit vector for the word (lower-cased),
# features 32-63 stay zero (room a trained model would use). With `D_H = 16`:
#
# - **head 0, previous token**: the query reads position `i`, the key of position `j` says `j + 1`;
#   they match when `j = i - 1`.
# - **head 1, same word**: query and key both read the word vector; equal words match.
# - **head 2, first token**: the query is a constant (its bias); only position 0 has a key that answers.
# - **head 3, average**: all query weights are zero, so every score is 0 and the weights are uniform.
#
# Matching vectors get a dot product of `STRENGTH²`, far above the others, so the softmax picks them.

# %% slideshow={"slide_type": "fragment"}
catch_up("05_multihead_attention",
         "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.text.corpus import TOY_CAT, TOY_SOUP, load_corpus


def words(sentence: str) -> list[str]:
    """A sentence split into words and punctuation marks."""
    return re.findall(r"\w+|[^\w\s]", sentence)


def repeats_a_word(tokens: list[str]) -> bool:
    lowered = [t.lower() for t in tokens]
    return len(set(lowered)) < len(lowered)


MAX_TOKENS = 16
corpus_picks = [s for s in load_corpus().splitlines()
                if s and len(words(s)) <= MAX_TOKENS and repeats_a_word(words(s))][:3]
sentences = [TOY_SOUP, *corpus_picks]
cross_query, cross_context = TOY_CAT, "Here, the cat sat down"
for s in sentences:
    print(f"{len(words(s)):2} tokens: {s}")

# %% slideshow={"slide_type": "fragment"}
D_MODEL, N_HEADS = 64, 4
HEAD_DIM = D_MODEL // N_HEADS
POSITIONS, WORD = slice(0, 16), slice(16, 32)
STRENGTH = 6.0
HEAD_NAMES = ["previous token", "same word", "first token", "average"]

vocabulary = sorted({w.lower() for s in [*sentences, cross_query, cross_context] for w in words(s)})
word_vectors = torch.nn.functional.normalize(
    torch.randn(len(vocabulary), 16, generator=torch.Generator().manual_seed(0)), dim=-1)


def embed(tokens: list[str]) -> torch.Tensor:
    """tokens -> (1, N, 64): one-hot position in features 0-15, word vector in 16-31."""
    x = torch.zeros(1, len(tokens), D_MODEL)
    x[0, :, POSITIONS] = torch.eye(16)[: len(tokens)]
    x[0, :, WORD] = word_vectors[[vocabulary.index(t.lower()) for t in tokens]]
    return x


# %% slideshow={"slide_type": "fragment"}
@torch.no_grad()
def wire_heads(mha: MultiHeadAttention) -> MultiHeadAttention:
    """Set the weights so that head h does the job HEAD_NAMES[h]."""
    for p in mha.parameters():
        p.zero_()
    rows = [slice(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in range(N_HEADS)]
    match = STRENGTH * torch.eye(HEAD_DIM)
    mha.q_proj.weight[rows[0], POSITIONS] = match
    mha.k_proj.weight[rows[0], POSITIONS] = torch.diag(torch.full((HEAD_DIM - 1,), STRENGTH),
                                                       -1)  # key j says "j + 1"
    mha.q_proj.weight[rows[1], WORD] = match
    mha.k_proj.weight[rows[1], WORD] = match
    mha.q_proj.bias[rows[2].start] = STRENGTH                      # every query asks for "start"
    mha.k_proj.weight[rows[2].start, POSITIONS.start] = STRENGTH   # only position 0 answers
    mha.v_proj.weight.normal_(generator=torch.Generator().manual_seed(1))
    mha.out_proj.weight.normal_(std=D_MODEL**-0.5, generator=torch.Generator().manual_seed(2))
    return mha

# %% slideshow={"slide_type": "fragment"}
wired = wire_heads(MultiHeadAttention(D_MODEL, N_HEADS))
print(f"D = {D_MODEL}, H = {N_HEADS}, D_H = {HEAD_DIM}; position one-hot in features "
      f"{POSITIONS.start}-{POSITIONS.stop - 1}, word vector in {WORD.start}-{WORD.stop - 1}")
print(f"a match scores STRENGTH² = {STRENGTH**2:.0f}, divided by sqrt(D_H): "
      f"{STRENGTH**2 / HEAD_DIM**0.5:.0f}")

# %% slideshow={"slide_type": "fragment"}
def head_weights(sentence: str) -> torch.Tensor:
    """The wired module's causal attention weights on `sentence`: (H, N, N)."""
    wired(embed(words(sentence)), causal=True)
    return wired.last_weights[0]


soup = head_weights(TOY_SOUP)
n = soup.shape[-1]
rows_after_first = torch.arange(1, n)
assert torch.equal(soup[0, rows_after_first].argmax(-1), rows_after_first - 1)  # previous token
assert torch.equal(soup[2].argmax(-1), torch.zeros(n, dtype=torch.long))        # first token
assert torch.allclose(soup[3, -1], torch.full((n,), 1 / n))                      # uniform
print(f"head 0, last query: weight {soup[0, -1, -2]:.4f} on the token before it")
print(f"head 2, last query: weight {soup[2, -1, 0]:.4f} on the first token")
print(f"head 3, last query: every one of the {n} weights is 1/{n} = {1 / n:.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Reading the heads
#
# The assertions confirm the wiring: head 0's weight on the previous token, head 2's on the first
# token (both printed above) and head 3's uniform rows. Here are the four maps for the first
# sentence, with the causal mask (a decoder): each row is a query, each column a key it may read.

# %% slideshow={"slide_type": "fragment"}
fig, axes = plt.subplots(2, 2, figsize=(15, 13))
tokens = words(TOY_SOUP)
for h, ax in enumerate(axes.flat):
    heatmap(soup[h], tokens, tokens, title=f"head {h}: {HEAD_NAMES[h]}",
            xlabel="key (attended to)", ylabel="query (attending)", ax=ax, vmin=0, vmax=1)
fig.suptitle(f"Four heads, one sentence: {TOY_SOUP}", fontsize=16)
fig.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Head 1 links "Soup" to "soup" and the second "I" to the first, splitting its weight between
# the earlier copy and itself. In a trained model heads are learned, not wired, and real maps are
# messier; notebook 7 draws those. Pick a head and a sentence:

# %% slideshow={"slide_type": "fragment"}
def draw_head(head: int, sentence: str) -> np.ndarray:
    """Draw one head's causal attention map on `sentence`; return the weights (N, N)."""
    weights = head_weights(sentence)[head]
    tokens = words(sentence)
    fig, ax = plt.subplots(figsize=(9, 7.5))
    heatmap(weights, tokens, tokens, title=f"head {head}: {HEAD_NAMES[head]}",
            xlabel="key (attended to)", ylabel="query (attending)", ax=ax, vmin=0, vmax=1)
    fig.tight_layout()
    return weights.numpy()


_ = draw_head(head=1, sentence=sentences[1])
plt.show()

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# A live widget: its display holds a model id that changes on every run.
explorer = Explorer(
    draw_head,
    head=widgets.Dropdown(options=[(f"{h}: {name}", h) for h, name in enumerate(HEAD_NAMES)],
                          value=1, description="head"),
    sentence=widgets.Dropdown(options=sentences, value=sentences[1], description="sentence",
                              layout=widgets.Layout(width="600px")),
)
explorer

# %% slideshow={"slide_type": "fragment"}
before = explorer.reset()
after_head = explorer.set(head=0)
assert after_head.shape == before.shape and not np.allclose(after_head, before)
after_sentence = explorer.set(sentence=sentences[0])
assert after_sentence.shape == (len(words(sentences[0])),) * 2
print("changing the head redraws a different map; changing the sentence changes its size")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Causality holds in every head
#
# With `causal=True` the mask is shared by all heads, so no head can look ahead. The cell checks
# both consequences on a random module: every weight above the diagonal is zero in every head, and
# changing the last tokens leaves the outputs at earlier positions exactly as they were.

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(2)
mha = MultiHeadAttention(d_model=32, n_heads=4)
x = torch.randn(2, 6, 32)
out = mha(x, causal=True)
above_diagonal = ~causal_mask(6)
assert (mha.last_weights[..., above_diagonal] == 0).all()
x_changed = x.clone()
x_changed[:, 4:] = torch.randn(2, 2, 32)
assert torch.equal(mha(x_changed, causal=True)[:, :4], out[:, :4])
print("weights above the diagonal, all heads:", mha.last_weights[...,
                                                                 above_diagonal].abs().max().item())
print("outputs 0-3 unchanged when tokens 4-5 change:", torch.equal(mha(x_changed, causal=True)[:,
        :4], out[:, :4]))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Grouped-query and multi-query attention (optional)
#
# When a model generates text it keeps the keys and values of every earlier token, in every
# layer, so that each new token only computes its own (the KV cache of notebook 7). The textbook section gives
# its size as `2 x L x H x d_h` numbers per token (K and V, layers, heads, head size). In a long
# conversation, or with many users at once, this cache is what fills the GPU's memory.
#
# Grouped-query attention (GQA) keeps all `H` query heads but only `H_kv` key/value heads; each
# serves a group of `H / H_kv` query heads. Multi-query attention (MQA) is the extreme `H_kv = 1`.
# In `MultiHeadAttention` this is the argument `n_kv_heads`: `k_proj` and `v_proj` produce only
# `H_kv · D_H` features, and each key/value head is repeated for its group before attention.

# %% slideshow={"slide_type": "fragment"}
catch_up("05_multihead_attention",
         "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
for n_kv_heads in (8, 2, 1):
    m = MultiHeadAttention(d_model=64, n_heads=8, n_kv_heads=n_kv_heads)
    k_cache, v_cache = m.project_keys_values(torch.randn(1, 10, 64))
    n_params = sum(p.numel() for p in m.parameters())
    print(f"n_kv_heads={n_kv_heads}: k_proj {tuple(m.k_proj.weight.shape)}, K cached for 10 tokens "
          f"{tuple(k_cache.shape)}, parameters {n_params:,}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Two proofs of what GQA is. First, with `n_kv_heads == n_heads` it is ordinary multi-head
# attention: the fused module built with `n_kv_heads` set explicitly gives the same outputs as the
# separate heads of section 3. Second, GQA with 2 key/value heads for 8 query heads is exactly
# multi-head attention in which the 4 heads of a group share one `W_K` and one `W_V`: copying each
# group's key/value weights into all four heads of an ordinary module reproduces its output.

# %% slideshow={"slide_type": "fragment"}
explicit = MultiHeadAttention(d_model=32, n_heads=4, n_kv_heads=4)
explicit.load_state_dict(fused.state_dict())
x = torch.randn(3, 7, 32)
assert torch.allclose(explicit(x, causal=True), separate(x, causal=True), atol=1e-6)
print("n_kv_heads == n_heads gives the separate heads' output:",
      torch.allclose(explicit(x, causal=True), separate(x, causal=True), atol=1e-6))


# %% slideshow={"slide_type": "fragment"}
@torch.no_grad()
def ungroup(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """Ordinary multi-head attention whose heads share K/V weights within each of gqa's groups."""
    mha = MultiHeadAttention(gqa.d_model, gqa.n_heads)
    groups = gqa.n_heads // gqa.n_kv_heads
    for name in ("q_proj", "out_proj"):
        getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
    for name in ("k_proj", "v_proj"):
        small, big = getattr(gqa, name), getattr(mha, name)
        big.weight.copy_(small.weight.view(gqa.n_kv_heads, gqa.head_dim, -1)
                         .repeat_interleave(groups, dim=0).reshape(big.weight.shape))
        big.bias.copy_(small.bias.view(gqa.n_kv_heads, gqa.head_dim)
                       .repeat_interleave(groups, dim=0).reshape(-1))
    return mha


torch.manual_seed(3)
gqa = MultiHeadAttention(d_model=64, n_heads=8, n_kv_heads=2)
x = torch.randn(2, 9, 64)
assert torch.allclose(gqa(x, causal=True), ungroup(gqa)(x, causal=True), atol=1e-6)
print("GQA (8 query heads, 2 KV heads) == MHA with K/V shared in groups of 4:",
      torch.allclose(gqa(x, causal=True), ungroup(gqa)(x, causal=True), atol=1e-6))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: bytes of KV cache per token
#
# Write `my_kv_cache_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_value)`: how many
# bytes of keys and values one token leaves in the cache, as an `int`. The table after the check
# runs on your function: the cache of GPT-3 and two Llama shapes.
#
# <details><summary>Hint 1: the idea</summary>
#
# Count the numbers the cache keeps for one new token, then multiply by the bytes of each.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Every layer stores, for every key/value head, one key vector and one value vector of
# `head_dim` numbers. Multiply the two vectors by the layers, the key/value heads and the head
# size, and that count by the bytes of one number.
# </details>

# %% slideshow={"slide_type": "fragment"}
def my_kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int,
                                bytes_per_value: int) -> int:
    """Bytes of KV cache that one token occupies."""
    ### BEGIN SOLUTION
    numbers = 2 * n_layers * n_kv_heads * head_dim  # a key and a value per head and layer
    return numbers * bytes_per_value
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("multihead_attention.kv_cache_bytes_per_token", my_kv_cache_bytes_per_token)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### What the cache costs at real sizes
#
# The table uses your `my_kv_cache_bytes_per_token` once it passes (else the course's
# `helpers.model.multihead.kv_cache_bytes_per_token`) with 2-byte (fp16) numbers, for GPT-3
# and two Llama-like shapes, each with its full context. Llama 2 70B and Llama 3 8B really use
# GQA with 8 key/value heads; GPT-3 uses plain multi-head attention. The MHA and MQA rows show
# what the same shape would cost with the other choices.

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises import yours_or
from helpers.model.multihead import kv_cache_bytes_per_token as course_kv_cache_bytes

kv_cache_bytes_per_token = yours_or("multihead_attention.kv_cache_bytes_per_token",
                                    my_kv_cache_bytes_per_token, course_kv_cache_bytes)
BYTES_FP16 = 2
SHAPES = {  # layers L, query heads H, head size d_h, context length in tokens
    "GPT-3 175B": dict(n_layers=96, n_heads=96, head_dim=128, context=2048),
    "Llama-2-70B-like": dict(n_layers=80, n_heads=64, head_dim=128, context=4096),
    "Llama-3-8B-like": dict(n_layers=32, n_heads=32, head_dim=128, context=8192),
}
cache = {}
print(
    f"{'model shape':<18}{'attention':<11}{'H_kv':>5}{'KiB per token':>15}{'GiB per context':>17}"
)
for model, s in SHAPES.items():
    for kind, n_kv in (("MHA", s["n_heads"]), ("GQA", 8), ("MQA", 1)):
        per_token = kv_cache_bytes_per_token(s["n_layers"], n_kv, s["head_dim"], BYTES_FP16)
        cache[model, kind] = per_token
        print(f"{model:<18}{kind:<11}{n_kv:>5}{per_token / 2**10:>15,.0f}"
              f"{per_token * s['context'] / 2**30:>17.2f}")

# %% slideshow={"slide_type": "fragment"}
gpt3 = SHAPES["GPT-3 175B"]
print(f"\nGPT-3 with MHA: {cache['GPT-3 175B', 'MHA']:,} bytes = "
      f"{cache['GPT-3 175B', 'MHA'] / 2**20:.1f} MiB per token, "
      f"{cache['GPT-3 175B', 'MHA'] * gpt3['context'] / 2**30:.1f} GiB for {gpt3['context']} "
      f"tokens")
print(f"GQA-8 saves a factor {cache['GPT-3 175B', 'MHA'] // cache['GPT-3 175B', 'GQA']} there, "
      f"MQA a factor {cache['GPT-3 175B', 'MHA'] // cache['GPT-3 175B', 'MQA']}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# One GPT-3 sequence of 2048 tokens holds 9.0 GiB of keys and values (printed above); with 8
# key/value heads it would be 12 times smaller, with one 96 times. The saving is in memory, and
# so in how many requests and how long a context fit on one GPU (the DS 246 notes). It does not shrink the
# attention computation much: every query head still compares itself with every key. And sharing
# keys and values costs some quality, which is why GQA, in between, is the common choice.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Cross-attention: the same module, two sequences (optional)
#
# In cross-attention the queries come from one sequence and the keys and values from another,
# the `context`: in the original encoder-decoder Transformer the decoder's tokens ask, and the
# encoder's output answers. Nothing in the module changes; `forward(x, context=...)` simply
# projects keys and values from `context`. With `N` queries and `M` context tokens the weights
# are `[B, H, N, M]`, no longer square. The wired "same word" head now finds each query word in
# the other sentence, whatever its position there.

# %% slideshow={"slide_type": "fragment"}
catch_up("05_multihead_attention",
         "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
queries, context = words(cross_query), words(cross_context)
out = wired(embed(queries), context=embed(context))
cross_weights = wired.last_weights
assert cross_weights.shape == (1, N_HEADS, len(queries), len(context))
assert out.shape == (1, len(queries), D_MODEL)
print(f"x: {tuple(embed(queries).shape)}  context: {tuple(embed(context).shape)}  "
      f"weights: {tuple(cross_weights.shape)}  output: {tuple(out.shape)}")

fig, ax = plt.subplots(figsize=(8, 5))
heatmap(cross_weights[0, 1], queries, context, title="Cross-attention, head 1 (same word)",
        xlabel="context token (key)", ylabel="query token", ax=ax, vmin=0, vmax=1)
fig.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Because the keys and values depend only on the context, a decoder can compute them once per
# layer with `project_keys_values(context)` and reuse them for every token it generates.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. What are Q, K and V in multi-head attention, and what are their shapes?** Take GPT-2 small:
# `D = 768`, `H = 12`, a batch of 8 sequences of 1024 tokens.
#
# <details><summary>Answer</summary>
#
# Each head projects every token to a query (what it looks for), a key (what it offers) and a
# value (what it passes on), each of `D_H = D / H` features. Batched, Q, K and V are
# `[B, H, N, D_H]`, the weights `[B, H, N, N]`, the merged heads `[B, N, D]` before `W_O`. The
# cell below prints them for GPT-2 small.
# </details>

# %% slideshow={"slide_type": "fragment"}
catch_up("05_multihead_attention",
         "Check")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
d_model, n_heads, n_batch, n_tokens = 768, 12, 8, 1024
head_dim = d_model // n_heads
print(f"D_H = {d_model} / {n_heads} = {head_dim}")
print(f"Q, K, V: {(n_batch, n_heads, n_tokens, head_dim)}   weights: "
      f"{(n_batch, n_heads, n_tokens, n_tokens)}"
      f"   merged heads: {(n_batch, n_tokens, n_heads * head_dim)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. What runs in parallel in multi-head attention?** And how big is the attention matrix of
# GPT-3 (the DS 246 notes: 96 heads, 2048 tokens)?
#
# <details><summary>Answer</summary>
#
# All heads (the head axis is a batch axis of one matrix product), all sequences of the batch and,
# in training, all positions: every query is compared with every key in one `Q Kᵀ`. Only
# generation is sequential, one new token at a time. The price of comparing everything with
# everything is an `N x N` matrix per head: the DS 246 notes' 4.2M values per head and 403M per layer,
# computed exactly below.
# </details>

# %% slideshow={"slide_type": "fragment"}
n_tokens, n_heads = 2048, 96
per_head = n_tokens * n_tokens
print(f"per head: {n_tokens} x {n_tokens} = {per_head:,} weights;  per layer ({n_heads} heads): "
      f"{per_head * n_heads:,}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. Why not one head of width `D` instead of `H` heads of width `D / H`?**
#
# <details><summary>Answer</summary>
#
# The cost is the same (the projections have the same size), but one head gives each token one
# distribution over the others. Section 1 showed that one head asked for two things returns their
# blend `[0.5, 0.5]`, while two heads return both. Several heads can follow several relations at
# once: the previous token, the same word, the start of the sentence (section 5).
# </details>
#
# **4. GQA with 8 key/value heads instead of 96: what shrinks, what does not?**
#
# <details><summary>Answer</summary>
#
# The KV cache shrinks by `96 / 8 = 12` (printed in section 6), and so do `k_proj` and `v_proj`.
# The number of query heads, and so the number of query-key comparisons, does not change, which is
# why GQA saves memory rather than attention compute. The cell counts the attention parameters of
# one GPT-3-sized layer both ways.
# </details>

# %% slideshow={"slide_type": "fragment"}
def attention_parameters(d_model: int, n_heads: int, n_kv_heads: int) -> int:
    """Weights and biases of q_proj, k_proj, v_proj and out_proj, counted without building them."""
    kv_width = n_kv_heads * (d_model // n_heads)
    return 2 * (d_model * d_model + d_model) + 2 * (d_model * kv_width + kv_width)


small = MultiHeadAttention(d_model=64, n_heads=8, n_kv_heads=2)
assert attention_parameters(64, 8, 2) == sum(p.numel() for p in small.parameters())
full, grouped = attention_parameters(12288, 96, 96), attention_parameters(12288, 96, 8)
print(f"GPT-3 layer, MHA: {full:,} attention parameters; GQA-8: {grouped:,} ({grouped / full:.1%})")
