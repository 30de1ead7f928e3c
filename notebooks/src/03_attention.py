# %% [markdown] slideshow={"slide_type": "slide"}
# # 3. Scaled dot-product attention
#
# **After this notebook you will be able to**
# - explain queries, keys and values as a *soft* dictionary lookup, and write down the shape of
#   every tensor in self-attention and in cross-attention;
# - write a numerically stable softmax and scaled dot-product attention from scratch, then an
#   attention *layer* with learned $W_Q$, $W_K$, $W_V$ that serves as self- and as cross-attention;
# - backpropagate through attention by hand, the softmax's Jacobian included, and check it against
#   autograd;
# - show, with numbers and plots, *why* the scores are divided by $\sqrt{d_k}$: large scores
#   saturate the softmax and the gradient that reaches $Q$ and $K$ dies;
# - reproduce the worked examples of the lecture notes ("I like to eat", "The cat sat here") and
#   spot where their printed numbers do not follow from their own inputs.
#
# **It assumes** notebook 2 (tokens become vectors) and basic PyTorch: tensors, `@`, autograd.
#
# **The formula of the whole notebook:**
# $\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(QK^\top / \sqrt{d_k}\right) V$.

# %% [setup]

# %% [markdown] slideshow={"slide_type": "notes"}
# **Opening (2 min).** Today is the one formula the whole course rests on:
# softmax(QK^T / sqrt(d_k)) V. Write it on the board before anything runs and leave it there.
# Ask the room: "which part of it do you think is there only to keep training stable?" Collect
# guesses; the saturation demo in section 5 settles it.
# Run the set-up cell live so they see `device: cpu | seed: 0`: everything today runs on a laptop.

# %% slideshow={"slide_type": "fragment"}
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from torch import nn

from helpers.lab.exercises import check, yours_or
from helpers.lab.notes_tables import load_notes_tables
from helpers.lab.plots import heatmap
from helpers.lab.widgets import Explorer
from helpers.model.attention import softmax as helper_softmax
from helpers.lab.sections import catch_up

torch.set_num_threads(1)  # every tensor here is small: one thread beats coordinating several

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. The dot product measures similarity (optional)
#
# $a \cdot b = \sum_i a_i b_i$ is large when two vectors point the same way, near zero when they
# are unrelated, and negative when they point apart. Attention is built on nothing else. Below,
# a made-up query vector for "kitten" is compared with three made-up key vectors (the three
# features could read "is an animal", "is furry", "has an engine").

# %% [markdown] slideshow={"slide_type": "notes"}
# Optional: skip it if the class met the dot product in notebook 2.
# If you keep it: the point is that a dot product is large when two vectors point the same way,
# which is all "similarity" means in attention. Ask: "what happens to the score if I double the
# length of one vector?" (it doubles: scores are not normalised, which is why softmax comes next).

# %% slideshow={"slide_type": "fragment"}
words = ["cat", "dog", "car"]
keys = torch.tensor([[1.0, 0.9, 0.0],    # cat
                     [0.9, 1.0, 0.1],    # dog
                     [0.0, 0.1, 1.0]])   # car
kitten = torch.tensor([1.0, 0.8, 0.1])

by_hand = [sum(kitten[i] * key[i] for i in range(3)).item() for key in keys]
as_matrix_product = keys @ kitten  # one dot product per row of `keys`
for word, score in zip(words, as_matrix_product, strict=True):
    print(f"kitten . {word} = {score:.2f}")
assert torch.allclose(torch.tensor(by_hand), as_matrix_product)

# %% [markdown] slideshow={"slide_type": "slide"}
# The matrix product `keys @ kitten` computes all three dot products at once: "cat" scores
# highest, "car" lowest. To turn scores into weights that are positive and sum to 1 we need a
# softmax.
#
# ## 2. Softmax, and how to compute it without overflow (optional)
#
# $\mathrm{softmax}(s)_i = e^{s_i} / \sum_j e^{s_j}$. Written literally it breaks as soon as a
# score is large: `exp(1000)` does not fit in a float.

# %% [markdown] slideshow={"slide_type": "notes"}
# Subtracting the maximum changes nothing mathematically (it cancels in the ratio) but keeps
# every exponent at or below 0, so nothing overflows. Run the overflowing version first and let
# the room see the `nan`; then the stable one.
# Exercise 1 is a good one to live-code: `python3 course.py blank 03 stable_softmax` gives you a
# copy with only this answer blanked.

# %% slideshow={"slide_type": "fragment"}
def naive_softmax(scores: torch.Tensor) -> torch.Tensor:
    """exp(s) / sum(exp(s)) over the last dim, exactly as the formula reads. Shape: as `scores`."""
    return torch.exp(scores) / torch.exp(scores).sum(dim=-1, keepdim=True)


big = torch.tensor([1000.0, 0.0, -1000.0])
print("naive_softmax([1000, 0, -1000]) =", naive_softmax(big))
print("exp(1000) in float32 is", torch.exp(torch.tensor(1000.0)).item())

# %% [markdown] slideshow={"slide_type": "subslide"}
# `exp(1000)` is `inf`, and `inf / inf` is `nan`. The fix uses one fact: adding the same number
# to every score does not change the softmax (it multiplies top and bottom by the same $e^c$).
# So subtract the row's maximum first; every exponent is then at most 0 and nothing overflows.
#
# ### Exercise 1: a stable softmax
# Write `my_softmax(x)`: the softmax over the last dimension of a tensor of any shape `(..., n)`,
# returning the same shape, which must survive logits of ±1000. Build it from `torch.exp`: the
# check refuses `torch.softmax`, `F.softmax` and `Tensor.softmax`. The rest of the notebook
# computes its softmaxes with yours.
#
# <details><summary>Hint 1: the idea</summary>Softmax does not change when the same constant is
# added to every logit of a row. Choose the constant that makes every exponent zero or
# negative.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Shift each row so that its largest logit becomes
# 0: softmax ignores the shift. (2) Then the plain softmax of the shifted rows.</details>
#
# <details><summary>Hint 3: closer</summary>Every per-row number (the shift, the row's total) must
# keep its reduced axis with size 1, so that it broadcasts against its row.</details>

# %% slideshow={"slide_type": "fragment"}
def my_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of x (..., n), without overflow. Returns (..., n)."""
    ### BEGIN SOLUTION
    shift = x.max(dim=-1, keepdim=True).values  # a constant per row, which softmax ignores
    e = (x - shift).exp()                       # every exponent <= 0: no overflow
    return e / e.sum(dim=-1, keepdim=True)
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("attention.stable_softmax", my_softmax)

# %% [markdown] slideshow={"slide_type": "subslide"}
# From here on `softmax` is yours once it passes its check (until then the course's
# `helpers.model.attention.softmax` stands in, saying so). It survives the logits that broke the
# naive formula, and agrees with it, and with PyTorch, where both work:

# %% slideshow={"slide_type": "fragment"}
softmax = yours_or("attention.stable_softmax", my_softmax, helper_softmax)
print("softmax([1000, 0, -1000]) =", softmax(big))
small = torch.tensor([2.0, 1.0, 0.1])
assert torch.allclose(softmax(small), naive_softmax(small))
assert torch.allclose(softmax(big), torch.softmax(big, dim=-1))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Queries, keys and values: a soft dictionary lookup (optional)
#
# A Python `dict` is a lookup: a query must equal one key exactly, and you get that key's value.
# Attention keeps the idea and makes every step soft.
#
# | role | the question it answers | in a search engine |
# |---|---|---|
# | **query** $q$ | what is this token looking for? | the words you type |
# | **key** $k$ | what does each token advertise about itself? | a page's index terms |
# | **value** $v$ | what does each token hand over when chosen? | the page itself |
#
# The query is compared with *every* key (dot products), the scores go through a softmax, and
# the answer is the weighted average of *all* the values. Here each value is a tiny record:
# (number of legs, number of wheels).

# %% [markdown] slideshow={"slide_type": "notes"}
# The DS 246 notes' search analogy: the query is what you type, the keys are the titles of the
# pages, the values are the pages. A hard lookup returns one page; attention returns a blend,
# weighted by how well each title matches. Ask: "why would a blend be better than the best
# match?" (it is differentiable, so it can be learned).

# %% slideshow={"slide_type": "fragment"}
catch_up("03_attention", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
values = torch.tensor([[4.0, 0.0],    # cat: 4 legs, 0 wheels
                       [4.0, 0.0],    # dog
                       [0.0, 4.0]])   # car
weights = softmax(keys @ kitten)
answer = weights @ values
print("weights over (cat, dog, car):", [round(w, 3) for w in weights.tolist()])
print(f"answer: {answer[0]:.2f} legs, {answer[1]:.2f} wheels")

# %% [markdown] slideshow={"slide_type": "slide"}
# The answer is mostly "legs", because the query resembles the animal keys, but a little of the
# car leaks in: a soft lookup never picks exactly one entry. In a Transformer, queries, keys and
# values are not written by hand; each is a learned linear map of the token vectors.
#
# ## 4. Attention in plain code, and every shape (core)
#
# Stacking the queries as rows of $Q$ and the keys as rows of $K$, all the dot products are
# one matrix product $QK^\top$. Dividing by $\sqrt{d_k}$ is the "scaled" in the name (section 5
# shows why it is there), the softmax runs along each row, and the output is $AV$.

# %% [markdown] slideshow={"slide_type": "notes"}
# **Core.** Say every shape out loud as you run the cells: queries (N_q, d_k), keys (N_k, d_k),
# values (N_k, d_v), scores (N_q, N_k), output (N_q, d_v). Students who get lost later are almost
# always lost on a shape.
# Exercise 2 is the one to give the room five minutes for. Then cross-attention versus
# self-attention: the only difference is where Q comes from.
# Ask at the "bank" example: "which word should 'bank' attend to, and what would change the
# answer?"

# %% slideshow={"slide_type": "fragment"}
catch_up("03_attention", "4.")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 2: scaled dot-product attention
# Write `my_attention(q, k, v)` returning `(output, weights)`: for `q` of shape `(..., N_q, d_k)`,
# `k` of shape `(..., N_k, d_k)` and `v` of shape `(..., N_k, d_v)`, the output has shape
# `(..., N_q, d_v)` and the weights `(..., N_q, N_k)`. It must work for self-attention, for
# cross-attention ($N_q \ne N_k$, $d_v \ne d_k$) and with extra leading dimensions (batch,
# heads). Use your `softmax`. The rest of this section runs on it.
#
# <details><summary>Hint 1: the idea</summary>Score every query against every key with one matrix
# product, turn each query's row of scores into a distribution over the keys, and average the
# values with it.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Every query's score against every key, in one
# product. (2) Scale the scores. (3) Each query's scores into a distribution over the keys. (4) That
# distribution averages the values; return the output and the weights.</details>
#
# <details><summary>Hint 3: closer</summary>Transpose the keys in their last two dimensions only (a
# plain transpose also swaps batch axes); the scale is one over the square root of the key size; the
# softmax runs across the keys.</details>

# %% slideshow={"slide_type": "fragment"}
def my_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor,
                                                                             torch.Tensor]:
    """softmax(q k^T / sqrt(d_k)) v. q (..., N_q, d_k), k (..., N_k, d_k), v (..., N_k, d_v).

    Returns the output (..., N_q, d_v) and the weights (..., N_q, N_k).
    """
    ### BEGIN SOLUTION
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, N_k): one score per (query, key)
    weights = softmax(scores)                          # each row sums to 1
    return weights @ v, weights
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("attention.scaled_attention", my_attention)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The course package holds the same function as
# `helpers.model.attention.scaled_dot_product_attention(q, k, v, mask=None, scale=None)`, which also
# takes a mask (notebook 4) and checks its inputs. `attention` is yours once it passes, that
# helper until then:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import scaled_dot_product_attention, softmax_jacobian

attention = yours_or("attention.scaled_attention", my_attention, scaled_dot_product_attention)


# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Cross-attention: the queries come from somewhere else
#
# In the notation of the USF notes, cross-attention takes $N_Q$ query vectors
# $Q$ and $N_X$ data vectors $X$; the keys and values are computed from the data. Every size
# below is different, so each shape tells you exactly where it came from.

# %% slideshow={"slide_type": "fragment"}
def show_shapes(rows: list[tuple[str, str, torch.Tensor]]) -> None:
    """Print one line per tensor: its name, how it is computed, and its shape."""
    for name, formula, tensor in rows:
        print(f"{name:<18}{formula:<22}{' x '.join(map(str, tensor.shape))}")


N_Q, N_X, D_X, D_Q, D_V = 2, 5, 6, 4, 3
torch.manual_seed(0)
Q = torch.randn(N_Q, D_Q)
X = torch.randn(N_X, D_X)
W_K, W_V = torch.randn(D_X, D_Q), torch.randn(D_X, D_V)
K, V = X @ W_K, X @ W_V
Y, A = attention(Q, K, V)
E = Q @ K.T / math.sqrt(D_Q)
print(f"N_Q = {N_Q}, N_X = {N_X}, D_X = {D_X}, D_Q = {D_Q}, D_V = {D_V}\n")
show_shapes([("queries Q", "given", Q), ("data X", "given", X), ("key matrix W_K", "learned", W_K),
             ("value matrix W_V", "learned", W_V), ("keys K", "X W_K", K), ("values V", "X W_V", V),
             ("similarities E", "Q K^T / sqrt(D_Q)", E), ("weights A", "softmax(E, dim=1)", A),
             ("outputs Y", "A V", Y)])
largest_row_error = (A.sum(dim=1) - 1).abs().max().item()  # float32 sums are 1 up to round-off
assert largest_row_error < 1e-6
print("\nevery row of A sums to 1 (largest |row sum - 1| < 1e-6)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Each query produces one output row, a mix of the data's values: $Y$ has $N_Q$ rows, not $N_X$.
# The softmax runs along `dim=1`, across the keys, so each *row* of $A$ sums to 1: every query
# gets a probability distribution over the data. (The USF notes' slide says the softmax "normalizes
# each column"; with $A$ of shape $N_Q \times N_X$ and `dim=1`, it is the rows, as the sums show.)
#
# ### Self-attention: queries, keys and values all come from the same tokens

# %% slideshow={"slide_type": "fragment"}
N, D_IN, D_OUT = 5, 6, 4
torch.manual_seed(1)
X = torch.randn(N, D_IN)
W_Q, W_K, W_V = (torch.randn(D_IN, D_OUT) for _ in range(3))
Q, K, V = X @ W_Q, X @ W_K, X @ W_V
Y, A = attention(Q, K, V)
print(f"N = {N}, D_in = {D_IN}, D_out = {D_OUT}\n")
show_shapes([("inputs X", "given", X), ("W_Q, W_K, W_V", "learned, each", W_Q),
             ("Q, K, V", "X W_Q, X W_K, X W_V", Q), ("similarities E", "Q K^T / sqrt(D_out)",
                                                     Q @ K.T),
             ("weights A", "softmax(E, dim=1)", A), ("outputs Y", "A V", Y)])

# %% [markdown] slideshow={"slide_type": "subslide"}
# With one input the shapes get simpler: $N$ tokens in, $N$ outputs out, and the weight
# matrix is square, $N \times N$. Almost always $D_Q = D_V = D_{out}$.
#
# ### What kind of bank? Context changes meaning
# The Matrix Magic notes ask what "bank" means in "I swam across the river to get to the other
# bank" and in "I walked across the intersection to get to the other bank". The embedding table
# gives "bank" one vector, whatever the sentence. Self-attention hands each token a weighted
# average of the others' values, so after it the two "bank"s differ. To make that visible we
# write the vectors by hand, with three readable features (a trained model learns its own), and
# use the vectors themselves as queries, keys and values: each token attends to the tokens that
# share its features.

# %% slideshow={"slide_type": "fragment"}
FEATURES = ["water", "town", "money"]
MEANING = {"bank": [1.0, 1.0, 1.0],
           # ambiguous: a river bank, or a bank in town that holds money
           "river": [3.0, 0.0, 0.0], "swam": [2.0, 0.0, 0.0],
           # every other word: all zeros
           "intersection": [0.0, 3.0, 0.0], "walked": [0.0, 1.0, 0.0]}
SENSES = {"river bank": torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64),
          "bank, the business": torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)}


def meaning_vectors(sentence: str) -> torch.Tensor:
    """The hand-made vector of every word of `sentence`: (n_words, 3)."""
    return torch.tensor([MEANING.get(word, [0.0, 0.0, 0.0]) for word in sentence.split()],
                        dtype=torch.float64)


# %% slideshow={"slide_type": "fragment"}
def sense_cosines(vector: torch.Tensor) -> dict[str, float]:
    """Cosine of `vector` (3,) with each sense of "bank"."""
    return {name: (torch.dot(vector, sense) / (vector.norm() * sense.norm())).item() for name,
            sense in SENSES.items()}


def show_bank(when: str, vector: torch.Tensor) -> None:
    """Print the features of a "bank" vector (3,) and its cosine with each sense."""
    features = " ".join(f"{name}={value:.2f}" for name, value in zip(FEATURES, vector.tolist(),
                                                                     strict=True))
    cosines = ", ".join(f"{name} {cosine:.2f}" for name, cosine in sense_cosines(vector).items())
    print(f"  'bank' {when:<17} {features}; cosine with {cosines}")

# %% slideshow={"slide_type": "fragment"}
bank_in, bank_out = {}, {}
for sentence in ("I swam across the river to get to the other bank",
                 "I walked across the intersection to get to the other bank"):
    x = meaning_vectors(sentence)  # (11, 3)
    output, _ = attention(x, x, x)  # self-attention with Q = K = V = x
    bank_in[sentence], bank_out[sentence] = x[-1], output[-1]
    print(f'"{sentence}"')
    show_bank("before attention", x[-1])
    show_bank("after attention", output[-1])
river, road = bank_in
assert torch.equal(bank_in[river], bank_in[road]) and not torch.allclose(bank_out[river],
                                                                         bank_out[road])
after_river, after_road = sense_cosines(bank_out[river]), sense_cosines(bank_out[road])
assert after_river["river bank"] > after_river["bank, the business"]
assert after_road["bank, the business"] > after_road["river bank"]
print(f"\ndistance between the two 'bank's: {(bank_in[river] - bank_in[road]).norm():.2f} before "
      f"attention, "
      f"{(bank_out[river] - bank_out[road]).norm():.2f} after")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same token enters both sentences with the same vector and leaves with two different ones:
# next to "river" and "swam" its output leans to the water feature and to the river-bank sense
# (cosine 0.58 before, 0.96 after); next to "intersection" and "walked" it leans to the town
# feature and away from the river bank (0.58 before, 0.22 after), so the business sense wins. This
# is what "contextual embedding" means. In a real model the features are not readable and $W_Q$,
# $W_K$, $W_V$ are learned, but the mechanism is this weighted average.
#
# ### The helper, your attention and PyTorch agree
# The cell below proves that `attention` (yours, or the helper standing in), the helper and
# PyTorch's own `F.scaled_dot_product_attention` agree on a batch of heads, and so do the two
# softmaxes. The attention layer of exercise 3 may call `attention`.

# %% slideshow={"slide_type": "fragment"}
import torch.nn.functional as F

torch.manual_seed(2)
q, k, v = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6,
                                                                        5)  # (batch, heads, N, d)
ours, our_weights = attention(q, k, v)
helper_out, helper_weights = scaled_dot_product_attention(q, k, v)
torch.testing.assert_close(ours, helper_out)
torch.testing.assert_close(our_weights, helper_weights)
torch.testing.assert_close(helper_out, F.scaled_dot_product_attention(q, k, v))
torch.testing.assert_close(softmax(q), helper_softmax(q))
print("attention, helpers.model.attention and torch agree; output", tuple(helper_out.shape),
      "weights", tuple(helper_weights.shape))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The helper also refuses inputs that cannot be attended together, naming both shapes:

# %% slideshow={"slide_type": "fragment"}
try:
    scaled_dot_product_attention(torch.randn(2, 4), torch.randn(3, 5), torch.randn(3, 5))
except ValueError as error:
    print("ValueError:", error)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 3 (core): an attention layer with learned projections
# So far $W_Q$, $W_K$, $W_V$ were tensors drawn by hand. In a model they are the learned parameters
# of a layer. Write `MyAttentionLayer(d_in, d_k, d_v)`, a `torch.nn.Module` that
# - holds three projections without bias, named `w_q`, `w_k` ($d_{in} \to d_k$) and `w_v`
#   ($d_{in} \to d_v$): each an `nn.Linear` or an `nn.Parameter` matrix, stored either way round;
# - when called as `layer(x_query, x_data)`, with tokens of shapes `(..., N_q, d_in)` and
#   `(..., N_x, d_in)`, returns `(output, weights)` of shapes `(..., N_q, d_v)` and `(..., N_q, N_x)`.
#
# Self-attention is then `layer(x, x)` and cross-attention `layer(decoder_tokens, encoder_tokens)`.
# The check builds your layer with $d_{in}$, $d_k$, $d_v$ all different, puts its own numbers in the
# three projections and compares with the formula, on single sequences and on batches. Sections 7
# and 8 run on your layer once it passes. You may call `attention` (yours, or the helper standing
# in).
#
# <details><summary>Hint 1: the idea</summary>Three learned linear maps turn tokens into queries,
# keys and values; from there it is exercise 2. The only new question is which input feeds which
# map: the queries ask, so they come from the first input; the keys and the values are what gets
# looked up, so they come from the second.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Constructor: set the module up, then three learned
# linear maps without bias, under the names the check looks for. (2) Forward: the queries from the
# first input, the keys and values from the second. (3) From there, exercise 2's attention; return
# the output and the weights.</details>
#
# <details><summary>Hint 3: closer</summary>The query and key maps go from d_in to d_k, the value
# map from d_in to d_v; the names are w_q, w_k and w_v.</details>

# %% slideshow={"slide_type": "fragment"}
class MyAttentionLayer(nn.Module):
    """Attention with learned projections: layer(x_query (..., N_q, d_in), x_data (..., N_x, d_in))
    returns the output (..., N_q, d_v) and the weights (..., N_q, N_x)."""

    def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
        ### BEGIN SOLUTION
        super().__init__()
        self.w_q = nn.Linear(d_in, d_k, bias=False)  # queries: what each token looks for
        self.w_k = nn.Linear(d_in, d_k, bias=False)  # keys: what each token offers
        self.w_v = nn.Linear(d_in, d_v, bias=False)  # values: what each token hands over
        ### END SOLUTION

    def forward(self, x_query: torch.Tensor, x_data: torch.Tensor) -> tuple[torch.Tensor,
                                                                            torch.Tensor]:
        ### BEGIN SOLUTION
        # (..., N_q, d_k): the queries ask
        q = self.w_q(x_query)
        # (..., N_x, d_k): the data is looked up
        k = self.w_k(x_data)
        v = self.w_v(x_data)                                       # (..., N_x, d_v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., N_q, N_x)
        weights = softmax(scores)                                  # each row sums to 1
        return weights @ v, weights
        ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("attention.attention_layer", MyAttentionLayer)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### From here on: `helpers.model.attention.AttentionLayer`
# The course package holds the same layer as `helpers.model.attention.AttentionLayer(d_in, d_k, d_v)`
# (its projections are `nn.Linear`s named `w_q`, `w_k`, `w_v`, and it checks its inputs). From here
# on the notebook builds its layers from `MyAttentionLayer`: yours once it passes its check, the
# helper until then. One layer with the cross-attention sizes of section 4 serves both uses:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import AttentionLayer

MyAttentionLayer = yours_or("attention.attention_layer", MyAttentionLayer, AttentionLayer)
torch.manual_seed(8)
decoder_tokens, encoder_tokens = torch.randn(2, 6), torch.randn(5, 6)  # N_q = 2, N_x = 5, d_in = 6
layer = MyAttentionLayer(6, 4, 3)  # d_in = 6, d_k = 4, d_v = 3
with torch.no_grad():
    cross_out, cross_weights = layer(decoder_tokens, encoder_tokens)  # queries ask the encoder
    self_out, self_weights = layer(encoder_tokens, encoder_tokens)    # the encoder asks itself
print(f"cross-attention, layer(decoder, encoder): output {tuple(cross_out.shape)}, weights "
      f"{tuple(cross_weights.shape)}")
print(f"self-attention,  layer(encoder, encoder): output {tuple(self_out.shape)}, weights "
      f"{tuple(self_weights.shape)}")
assert torch.allclose(cross_weights.sum(dim=-1),
                      torch.ones(2)) and torch.allclose(self_weights.sum(dim=-1), torch.ones(5))
learned = sum(p.numel() for p in layer.parameters())
assert learned == 6 * (2 * 4 + 3)
print(f"learned numbers: {learned} = d_in x (2 d_k + d_v) = 6 x (2 x 4 + 3); every row of weights "
      f"sums to 1")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Why divide by $\sqrt{d_k}$? The softmax-saturation demo (core)
#
# ### 5a. Two softmaxes
# The USF notes take one query whose scores over three keys are $[20, 0, -20]$,
# and the same scores divided by 8, $[2.5, 0, -2.5]$. We compute both in float64 with enough
# digits to see what happens.

# %% [markdown] slideshow={"slide_type": "notes"}
# **Core, the heart of the lecture.** The USF notes' two softmaxes: scores [20, 0, -20] give a
# one-hot answer, the same scores divided by 8 still spread the weight. Point out the notes' typo
# (one 9 too many) that the cell prints: the weights must sum to 1.
# Then the Jacobian diag(a) - a a^T: when a is one-hot, every entry is (nearly) zero, so no
# gradient reaches the scores. That is the answer to the opening question.
# 5c measures why large scores appear at all: the variance of q.k grows with d_k; dividing by
# sqrt(d_k) brings it back to 1. Let the plot speak before you explain it.

# %% slideshow={"slide_type": "fragment"}
catch_up("03_attention", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def show_softmax(scores: list[float]) -> torch.Tensor:
    """Print softmax(scores) with enough digits to see saturation; return it (float64)."""
    a = helper_softmax(torch.tensor(scores, dtype=torch.float64))
    print(f"softmax({scores}) = [{a[0]:.12f}, {a[1]:.4g}, {a[2]:.4g}]")
    return a


saturated = show_softmax([20.0, 0.0, -20.0])
relaxed = show_softmax([2.5, 0.0, -2.5])
USF_PRINTS = 0.9999999998  # the USF notes' first slide
print(f"\nthe USF notes print {USF_PRINTS} for the first weight; the true value is "
      f"{saturated[0]:.12f}")
print(f"1 - first weight = {1 - saturated[0]:.4g}, and the other two weights sum to "
      f"{saturated[1] + saturated[2]:.4g}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The first softmax is one-hot: the two other keys share 2.061e-09 of the weight. The second still
# spreads weight over all three keys. The slide's 0.9999999998 has one 9 too many: the weights
# must sum to 1, so the first one is 1 minus the second (2.061e-09), which the cell prints as
# 0.999999997939.
#
# ### 5b. The softmax Jacobian: how much gradient gets through
# The softmax maps a vector to a vector, so its derivative is a matrix,
# $J_{ij} = \partial a_i / \partial s_j = a_i(\delta_{ij} - a_j)$, that is
# $J = \mathrm{diag}(a) - a a^\top$. Backpropagation multiplies the incoming gradient by $J$,
# so if $J$ is tiny, so is every gradient flowing back into the scores.
#
# #### Exercise 4: the Jacobian by hand
# Write `my_jacobian(a)` that returns $\mathrm{diag}(a) - aa^\top$, shape `(n, n)`, for a
# probability vector `a` of shape `(n,)`. The check refuses autograd's own `jacobian`; the cells
# after it compare yours with autograd and measure how the Jacobian collapses.
#
# <details><summary>Hint 1: the idea</summary>Differentiate a_i = e^{z_i} / sum_k e^{z_k} with
# respect to z_j: every entry gets the term -a_i a_j, and the diagonal (i = j) gets an extra
# a_i.</details>
#
# <details><summary>Hint 2: the plan</summary>Build the square matrix that holds the
# probabilities on its diagonal and zeros elsewhere; build the outer product of the vector with
# itself, whose entry (i, j) is a_i times a_j; subtract the second from the first.</details>

# %% slideshow={"slide_type": "fragment"}
def my_jacobian(a: torch.Tensor) -> torch.Tensor:
    """The softmax Jacobian diag(a) - a a^T at probabilities a (n,). Returns (n, n)."""
    ### BEGIN SOLUTION
    jacobian = torch.diag_embed(a)                 # a_i on the diagonal, 0 elsewhere
    jacobian -= a.unsqueeze(-1) * a.unsqueeze(-2)  # every entry (i, j): -a_i a_j
    return jacobian
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("attention.softmax_jacobian", my_jacobian)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now compare the formula with what autograd computes by differentiating the softmax itself, for
# both score vectors, using your `my_jacobian` (the course's
# `helpers.model.attention.softmax_jacobian` stands in until yours passes).

# %% slideshow={"slide_type": "fragment"}
jacobian_by_hand = yours_or("attention.softmax_jacobian", my_jacobian, softmax_jacobian)
torch.set_printoptions(precision=4, sci_mode=True)
for scores, a in (([20.0, 0.0, -20.0], saturated), ([2.5, 0.0, -2.5], relaxed)):
    s = torch.tensor(scores, dtype=torch.float64)
    by_autograd = torch.autograd.functional.jacobian(helper_softmax, s)
    torch.testing.assert_close(jacobian_by_hand(a), by_autograd, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(jacobian_by_hand(a), softmax_jacobian(a), rtol=1e-12, atol=1e-15)
    print(f"scores {scores}: by hand == by autograd; largest entry {by_autograd.abs().max():.3g}")
    print(by_autograd, "\n")
torch.set_printoptions(precision=4, sci_mode=False)
ratio = softmax_jacobian(relaxed).abs().max() / softmax_jacobian(saturated).abs().max()
print(f"largest entry for [2.5, 0, -2.5] / largest entry for [20, 0, -20] = {ratio:.3g}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# For $[20, 0, -20]$ no entry exceeds 2.06e-09: whatever gradient arrives at the weights is
# multiplied by numbers that small on its way back to the scores. For $[2.5, 0, -2.5]$ the largest
# entry is 0.0749, tens of millions of times larger (the ratio is printed last). Sweeping the size
# of the scores, $s = t \cdot [1, 0, -1]$, shows the collapse is exponential:

# %% slideshow={"slide_type": "fragment"}
def jacobian_norm(t: float) -> float:
    """Frobenius norm of the softmax Jacobian at scores t * [1, 0, -1]."""
    a = helper_softmax(t * torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64))
    return jacobian_by_hand(a).norm().item()


logit_scales = torch.linspace(0, 25, 101)
norms = [jacobian_norm(t) for t in logit_scales.tolist()]
fig, ax = plt.subplots(figsize=(8, 4.5))
ax.semilogy(logit_scales, norms)
for t, label, offset in ((2.5, "[2.5, 0, -2.5]", (15, -40)), (20.0, "[20, 0, -20]", (10, 12))):
    ax.plot(t, jacobian_norm(t), "o", markersize=10)
    ax.annotate(f"{label}\n‖J‖ = {jacobian_norm(t):.2g}", (t, jacobian_norm(t)),
                textcoords="offset points",
                xytext=offset, fontsize=12)
ax.set(xlabel="logit scale t   (scores = t · [1, 0, -1])", ylabel="‖J‖ (Frobenius, log scale)",
       title="The softmax Jacobian collapses as the scores grow")
plt.show()
print(f"‖J‖ at t = 2.5: {jacobian_norm(2.5):.3g};  at t = 20: {jacobian_norm(20.0):.3g}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 5c. Where do large scores come from? The variance of $q \cdot k$ grows with $d_k$
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, then
# $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ is a sum of $d_k$ terms of variance 1, so its variance
# is $d_k$ and its typical size $\sqrt{d_k}$. Dividing by $\sqrt{d_k}$ brings the variance back
# to 1, whatever $d_k$ is. We measure it rather than trust it.

# %% slideshow={"slide_type": "fragment"}
D_KS = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
SAMPLES = 10_000
generator = torch.Generator().manual_seed(0)
raw_var, scaled_var = [], []
for d_k in D_KS:
    q_samples = torch.randn(SAMPLES, d_k, generator=generator)
    k_samples = torch.randn(SAMPLES, d_k, generator=generator)
    dots = (q_samples * k_samples).sum(dim=-1)  # SAMPLES independent dot products
    raw_var.append(dots.var().item())
    scaled_var.append((dots / math.sqrt(d_k)).var().item())
print(f"{'d_k':>6} {'var(q.k)':>10} {'var(q.k / sqrt(d_k))':>22}")
for d_k, raw, scaled in zip(D_KS, raw_var, scaled_var, strict=True):
    print(f"{d_k:>6} {raw:>10.1f} {scaled:>22.3f}")

# %% slideshow={"slide_type": "fragment"}
def label_d_k_axis(ax: plt.Axes) -> None:
    """A log-scale d_k axis with one tick per measured head size."""
    ax.set_xscale("log")
    ax.set_xticks(D_KS, labels=[str(d) for d in D_KS])
    ax.minorticks_off()
    ax.set_xlabel("d_k (log scale)")


fig, ax = plt.subplots(figsize=(8, 4.5))
ax.loglog(D_KS, raw_var, "o-", label="var(q·k), measured")
ax.loglog(D_KS, D_KS, "k--", linewidth=1.5, label="the line var = d_k")
ax.loglog(D_KS, scaled_var, "s-", label="var(q·k / √d_k), measured")
ax.loglog(D_KS, [1.0] * len(D_KS), "k:", linewidth=1.5, label="the line var = 1")
ax.set(ylabel="variance (log scale)", title=f"Variance of q·k over {SAMPLES:,} random pairs")
label_d_k_axis(ax)
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The measured variance sits on the line $\mathrm{var} = d_k$, and after dividing by
# $\sqrt{d_k}$ it sits on 1 for every $d_k$. With $d_k = 64$ (a typical head size) unscaled
# scores have a standard deviation of 8, so gaps like the $[20, 0, -20]$ of section 5a are
# common. That is exactly the factor the USF notes divide by: $\sqrt{64} = 8$.

# %% slideshow={"slide_type": "fragment"}
print(f"sqrt(64) = {math.sqrt(64):.0f};  measured std of q.k at d_k = 64: "
      f"{math.sqrt(raw_var[D_KS.index(64)]):.2f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 5d. The gradient that actually reaches $Q$ and $K$
# Now the whole chain, from the output back to $Q$ and $K$. Autograd would do it for us, but the
# chain is short enough to write by hand, and doing so shows exactly where the softmax's
# Jacobian sits: between the gradient of the weights and the gradient of the scores.
#
# #### Exercise 5 (core): the backward pass of attention
# For the forward pass $S = c\,QK^\top$ (the scale $c$ is $1/\sqrt{d_k}$, or 1 unscaled),
# $A = \mathrm{softmax}(S)$ row by row, $O = AV$, and a loss $L$ whose gradient at the output
# $\partial L/\partial O$ is given, write `my_attention_backward(q, k, v, grad_output, scale)`
# returning `(grad_q, grad_k, grad_v)`, the gradients of $L$ with the shapes of `q`
# `(..., N_q, d_k)`, `k` `(..., N_k, d_k)` and `v` `(..., N_k, d_v)`; `grad_output` has the
# output's shape `(..., N_q, d_v)`. The chain rule gives four steps, each a matrix product or
# 5b's Jacobian:
# $\partial L/\partial V = A^\top\,\partial L/\partial O$, $\partial L/\partial A = \partial L/\partial O\,V^\top$,
# each row of $\partial L/\partial S$ is $J^\top$ times that row of $\partial L/\partial A$
# with $J = \mathrm{diag}(a) - aa^\top$ (symmetric, so $J^\top = J$), and from $S = c\,QK^\top$
# the gradients of $Q$ and $K$. Do not build $J$: work out what $J g$ is for one row $g$. The check
# compares with autograd and refuses autograd itself (`torch.autograd.grad`, `.backward()`); the
# experiment below then runs on your function.
#
# <details><summary>Hint 1: the idea</summary>Walk the forward pass backwards. A product passes
# the gradient on to each factor through the other factor (transposed); the softmax passes it
# through its Jacobian, and a row g times diag(a) minus a a-transposed is a times g minus a times
# the a-weighted sum of g.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Recompute the forward pass's weights. (2) Back
# through the last product: the gradients of the values and of the weights. (3) Back through the
# softmax, row by row (Hint 1's shortcut), then through the scale: the gradient of the scores. (4)
# Back through the first product: the gradients of the queries and of the keys.</details>
#
# <details><summary>Hint 3: closer</summary>A product passes the gradient to each factor through the
# other factor, transposed in the last two dimensions only. Through the softmax, a row's gradient is
# the weights times (the weights' gradient minus its weighted row sum), that row sum kept as an axis
# of size 1.</details>

# %% slideshow={"slide_type": "fragment"}
def my_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          grad_output: torch.Tensor,
                          scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of L through output = softmax(scale q k^T) v, given grad_output = dL/d output.

    q (..., N_q, d_k), k (..., N_k, d_k), v (..., N_k, d_v), grad_output (..., N_q, d_v).
    Returns grad_q, grad_k, grad_v with the shapes of q, k, v.
    """
    ### BEGIN SOLUTION
    weights = softmax(q @ k.transpose(-2, -1)
                      * scale)          # (..., N_q, N_k), as in the forward pass
    grad_v = weights.transpose(-2, -1) @ grad_output            # (..., N_k, d_v)
    grad_weights = grad_output @ v.transpose(-2, -1)            # (..., N_q, N_k)
    # one row g through J = diag(a) - a a^T: J g = a * g - a * sum_j(a_j g_j)
    weighted = weights * grad_weights
    row_sums = weighted.sum(dim=-1, keepdim=True)
    grad_scores = weighted - weights * row_sums                 # (..., N_q, N_k)
    grad_scores = grad_scores * scale                           # S = scale * q k^T
    grad_q = grad_scores @ k                                    # (..., N_q, d_k)
    grad_k = grad_scores.transpose(-2, -1) @ q                  # (..., N_k, d_k)
    return grad_q, grad_k, grad_v
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("attention.attention_backward", my_attention_backward)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The gradient, measured
#
# The experiment runs on `attention_backward`: yours once it passes its check, until then a
# stand-in that asks autograd. First a proof that the two agree on a batch of cross-attention
# heads. Then many independent attention problems, each with one query and 16 keys (random, unit
# variance) and a fixed random gradient arriving at the output, pushed back to $Q$ and $K$. For
# each $d_k$ we record the *median* gradient norm over the problems (a typical query, not the
# luckiest one) and the fraction of problems whose softmax is saturated (largest weight above
# 0.99), with and without the $1/\sqrt{d_k}$.

# %% slideshow={"slide_type": "fragment"}
def autograd_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                grad_output: torch.Tensor,
                                scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same gradients from autograd, the stand-in for an unanswered exercise 5."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    output, _ = scaled_dot_product_attention(*leaves, scale=scale)
    return torch.autograd.grad(output, leaves, grad_output)


attention_backward = yours_or("attention.attention_backward", my_attention_backward,
                              autograd_attention_backward)
g = torch.Generator().manual_seed(9)
q, k, v = (torch.randn(2, 3, n, d, generator=g, dtype=torch.float64) for n, d in ((4, 8), (6, 8),
                                                                                  (6, 5)))
grad_output = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
for mine, autograd in zip(attention_backward(q, k, v, grad_output, 8**-0.5),
                          autograd_attention_backward(q, k, v, grad_output, 8**-0.5), strict=True):
    torch.testing.assert_close(mine, autograd, rtol=1e-12, atol=1e-12)
print("grad_q, grad_k, grad_v of attention_backward == autograd's, to 1e-12")

# %% slideshow={"slide_type": "fragment"}
PROBLEMS, N_KEYS, D_V_DEMO = 400, 16, 16


def random_problems(d_k: int, seed: int) -> tuple[torch.Tensor, ...]:
    """PROBLEMS random problems: q (PROBLEMS, 1, d_k), k (PROBLEMS, N_KEYS, d_k),
    v (PROBLEMS, N_KEYS, D_V_DEMO) and upstream = dL/d output (PROBLEMS, 1, D_V_DEMO)."""
    g = torch.Generator().manual_seed(seed)
    # float64: a saturated softmax leaves gradients near float32's round-off, whose digits vary by
    # CPU
    q = torch.randn(PROBLEMS, 1, d_k, generator=g).double()
    k = torch.randn(PROBLEMS, N_KEYS, d_k, generator=g).double()
    v = torch.randn(PROBLEMS, N_KEYS, D_V_DEMO, generator=g).double()
    upstream = torch.randn(PROBLEMS, 1, D_V_DEMO, generator=g).double()
    return q, k, v, upstream


# %% slideshow={"slide_type": "fragment"}
def gradient_reaching_qk(d_k: int, seed: int = 0) -> dict[bool, dict[str, float]]:
    """For scaled False/True: median |dL/dQ| and |dL/dK| over PROBLEMS problems, and the
    saturated share.

    Each problem: q (1, d_k), k (N_KEYS, d_k), v (N_KEYS, D_V_DEMO); L = sum(output * upstream).
    Both variants see the same random problems, so only the scaling differs.
    """
    q, k, v, upstream = random_problems(d_k, seed)
    results = {}
    for scaled in (False, True):
        scale = 1 / math.sqrt(d_k) if scaled else 1.0
        grad_q, grad_k, _ = attention_backward(q, k, v, upstream, scale)
        weights = helper_softmax(q @ k.transpose(-2, -1) * scale)
        results[scaled] = {"grad_q": grad_q.flatten(1).norm(dim=1).median().item(),
                           "grad_k": grad_k.flatten(1).norm(dim=1).median().item(),
                           "saturated": (weights.amax(dim=-1) > 0.99).float().mean().item()}
    return results

per_d_k = [gradient_reaching_qk(d_k) for d_k in D_KS]
grads = {scaled: [result[scaled] for result in per_d_k] for scaled in (False, True)}

# %% slideshow={"slide_type": "fragment"}
print(f"{'':>6} {'---- unscaled: q.k ----':^34} {'---- scaled: q.k / sqrt(d_k) ----':^34}")
print(f"{'d_k':>6} {'|dL/dQ|':>10} {'|dL/dK|':>10} {'saturated':>11}  {'|dL/dQ|':>10} "
      f"{'|dL/dK|':>10} {'saturated':>11}")
for i, d_k in enumerate(D_KS):
    raw, sc = grads[False][i], grads[True][i]
    print(f"{d_k:>6} {raw['grad_q']:>10.3g} {raw['grad_k']:>10.3g} {raw['saturated']:>10.0%}  "
          f"{sc['grad_q']:>10.3g} {sc['grad_k']:>10.3g} {sc['saturated']:>10.0%}")

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(8, 4.5))
for scaled, color in ((False, "tab:blue"), (True, "tab:orange")):
    name = "scaled (÷√d_k)" if scaled else "unscaled"
    ax.loglog(D_KS, [r["grad_q"] for r in grads[scaled]], "o-", color=color,
              label=f"|dL/dQ|, {name}")
    ax.loglog(D_KS, [r["grad_k"] for r in grads[scaled]], "s--", color=color, alpha=0.6,
              label=f"|dL/dK|, {name}")
ax.set(ylabel="median gradient norm (log scale)",
       title="Gradient reaching Q and K through the softmax")
label_d_k_axis(ax)
ax.legend(fontsize=10)
plt.show()
unscaled_last, scaled_last = grads[False][-1], grads[True][-1]
print(f"at d_k = {D_KS[-1]}: median |dL/dQ| is {unscaled_last['grad_q']:.3g} unscaled vs "
      f"{scaled_last['grad_q']:.3g} scaled; {unscaled_last['saturated']:.0%} vs "
      f"{scaled_last['saturated']:.0%} of the softmaxes are saturated")
print(f"scaled / unscaled median |dL/dQ| at d_k = {D_KS[-1]}: "
      f"{scaled_last['grad_q'] / unscaled_last['grad_q']:.0f}")
assert unscaled_last["grad_q"] < scaled_last["grad_q"] / 100
assert unscaled_last["saturated"] > 0.5 > scaled_last["saturated"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# Without scaling, small heads are fine (the gradient is even a little larger, nothing divides
# it), but as $d_k$ grows more and more softmaxes saturate and a typical query and key receive
# less and less gradient: at the largest $d_k$ the median is hundreds of times smaller than
# with scaling (the ratio is printed above), so those queries and keys barely learn. With
# scaling no softmax saturates and the median gradient stays close to 1 for every $d_k$.
#
# ### 5e. Drive it yourself
# The figure below draws, for one query and eight keys, the attention weights without and with
# the $1/\sqrt{d_k}$, next to the gradient curves of 5d with the chosen $d_k$ marked. First the
# static version (for viewers that cannot run widgets), then the widget with a $d_k$ slider.

# %% [markdown] slideshow={"slide_type": "notes"}
# Live: move the d_k slider first with scaling off, then on. Ask a student to call out a value
# of d_k where they expect the gradient to vanish, and check it. If the widget does not render on
# the projector, the static figure above shows the same curves.

# %% slideshow={"slide_type": "fragment"}
def draw_one_query(left, unscaled: torch.Tensor, scaled: torch.Tensor, d_k: int) -> None:
    """Bars of one query's attention weights over 8 keys, (8,) unscaled beside (8,) scaled."""
    positions = torch.arange(8)
    left.bar(positions - 0.2, unscaled, width=0.4, label="softmax(q·k)")
    left.bar(positions + 0.2, scaled, width=0.4, label="softmax(q·k / √d_k)")
    left.set(xticks=positions.tolist(), xticklabels=[f"key {i}" for i in range(8)], ylim=(0, 1.05),
             ylabel="attention weight", title=f"One query, eight keys, d_k = {d_k}")
    left.tick_params(axis="x", rotation=45)
    left.legend(fontsize=10)


def draw_gradient_curves(right, d_k: int) -> None:
    """The median |dL/dQ| against d_k, unscaled and scaled, with the points at `d_k` circled."""
    for scaled_curve, color in ((False, "tab:blue"), (True, "tab:orange")):
        curve = [r["grad_q"] for r in grads[scaled_curve]]
        right.loglog(D_KS, curve, "o-", color=color, label="scaled" if scaled_curve else "unscaled")
        right.plot(d_k, curve[D_KS.index(d_k)], "o", markersize=16, markerfacecolor="none",
                   markeredgecolor="red", markeredgewidth=2.5)
    right.set(ylabel="median |dL/dQ| (log scale)",
              title=f"Gradient reaching Q (circled: d_k = {d_k})")
    label_d_k_axis(right)
    right.legend(fontsize=10)


# %% slideshow={"slide_type": "fragment"}
def draw_saturation(d_k: int) -> dict[str, float]:
    """Attention weights of one random query over 8 keys (unscaled vs scaled) and the 5d curves.

    Returns what was drawn: the largest weight and the median |dL/dQ| at this d_k, both ways.
    """
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, d_k, generator=g).double(), torch.randn(8, d_k, generator=g).double()
    unscaled = helper_softmax(q @ k.T)[0]
    scaled = helper_softmax(q @ k.T / math.sqrt(d_k))[0]
    row = D_KS.index(d_k)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    draw_one_query(left, unscaled, scaled, d_k)
    draw_gradient_curves(right, d_k)
    fig.tight_layout()
    return {"max_weight_unscaled": unscaled.max().item(), "max_weight_scaled": scaled.max().item(),
            "grad_unscaled": grads[False][row]["grad_q"], "grad_scaled": grads[True][row]["grad_q"]}


drawn = draw_saturation(256)
plt.show()
print({name: round(value, 4) for name, value in drawn.items()})

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds ids that change on every run; the static figure above is the same
# drawing.
explorer = Explorer(draw_saturation, d_k=widgets.SelectionSlider(options=D_KS, value=256,
                                                                 description="d_k"))
explorer

# %% slideshow={"slide_type": "fragment"}
mid_head = explorer.reset()  # d_k = 256, as drawn when the widget was made
big_head = explorer.set(d_k=1024)
assert big_head["max_weight_unscaled"] > mid_head["max_weight_unscaled"], (
    "unscaled weights saturate with d_k")
assert big_head["grad_unscaled"] < mid_head["grad_unscaled"], "and the gradient drops"

# %% slideshow={"slide_type": "fragment"}
print(f"slider d_k 256 -> 1024: largest unscaled weight {mid_head['max_weight_unscaled']:.3f} -> "
      f"{big_head['max_weight_unscaled']:.3f}, median unscaled |dL/dQ| "
      f"{mid_head['grad_unscaled']:.3g} -> "
      f"{big_head['grad_unscaled']:.3g}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. The worked examples of the lecture notes (optional)
#
# ### "I like to eat" (the Matrix Magic notes)
# The Matrix Magic notes print a query matrix and a transposed key matrix for the four tokens (with
# $d_q = d_k = 4$), then an attention matrix $QK^\top$ and its scaled version. We read its
# inputs from `data/notes_tables.txt`, where every table the notes print is typed in as on the
# slides, and compute.

# %% [markdown] slideshow={"slide_type": "notes"}
# Optional. Useful when the class has the Matrix Magic or DS 246 slides in front of them: the
# numbers here are the slides' numbers, recomputed. Ask them to check one row against the slide.

# %% slideshow={"slide_type": "fragment"}
catch_up("03_attention", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
TOKENS_MAGIC = ["I", "like", "to", "eat"]
mm = load_notes_tables("matrix_magic")  # the tables the notes print (data/notes_tables.txt)
Q_MAGIC, K_T_MAGIC = mm.Q, mm.K_T                # K^T: rows d1..d4, columns tokens
MATRIX_MAGIC_SCORES, MATRIX_MAGIC_SCALED = mm.SCORES, mm.SCALED
true_scores_magic = Q_MAGIC @ K_T_MAGIC
torch.set_printoptions(precision=2)
print("Q K^T computed from the notes' Q and K^T:\n", true_scores_magic)
print("the notes' printed Q K^T:\n", MATRIX_MAGIC_SCORES)
print("notes' matrix symmetric?", torch.equal(MATRIX_MAGIC_SCORES, MATRIX_MAGIC_SCORES.T),
      "| computed matrix symmetric?", torch.allclose(true_scores_magic, true_scores_magic.T))
print("notes' scaled table == their printed Q K^T / sqrt(4), to rounding?",
      torch.allclose(MATRIX_MAGIC_SCORES / math.sqrt(4), MATRIX_MAGIC_SCALED, atol=0.006))
torch.set_printoptions(precision=4)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The notes' attention matrix does **not** follow from their own $Q$ and $K$: the first entry
# of $QK^\top$ is 23.77, not 28.84. And the notes' matrix is symmetric, which $QK^\top$ is only
# when the queries and the keys coincide. So which product is it? A symmetric matrix of the form
# $MM^\top$ suggests the keys against themselves: $KK^\top$, or the queries against themselves,
# $QQ^\top$. Computed from the printed tables:

# %% slideshow={"slide_type": "fragment"}
K_MAGIC = K_T_MAGIC.T  # (tokens, d): one key per row
candidates = {"Q K^T": Q_MAGIC @ K_MAGIC.T, "Q Q^T": Q_MAGIC @ Q_MAGIC.T,
              "K K^T": K_MAGIC @ K_MAGIC.T}
for name, product in candidates.items():
    print(f"{name}: largest gap to the notes' matrix "
          f"{(product - MATRIX_MAGIC_SCORES).abs().max():6.2f}")
# The printed K is rounded to 2 decimals (each entry off by at most 0.005), so an entry of K K^T
# computed from it can be off by up to 0.005 * (|k_i|_1 + |k_j|_1) + 4 * 0.005^2.
row_l1 = K_MAGIC.abs().sum(dim=1)
rounding_bound = 0.005 * (row_l1[:, None] + row_l1[None, :]) + 4 * 0.005**2
kkt_gap = (candidates["K K^T"] - MATRIX_MAGIC_SCORES).abs()
assert (kkt_gap <= rounding_bound).all()
torch.set_printoptions(precision=2)
print("\nK K^T, computed from the notes' keys:\n", candidates["K K^T"])
print("the notes' 'Q K^T':\n", MATRIX_MAGIC_SCORES)
torch.set_printoptions(precision=4)
print("every entry of K K^T is within the rounding of K",
      f"(largest bound {rounding_bound.max():.2f})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The notes' "attention matrix" is $KK^\top$: every entry agrees with the keys multiplied by
# themselves, within what the two-decimal rounding of $K$ allows (the assert checks it entry by
# entry), while $QK^\top$ and $QQ^\top$ are off by whole units. The notes' code reads
# `wei = q @ k.transpose(-2, -1)`, so the table was most likely made with the keys standing in for
# the queries. Their scaled table is that matrix divided by $\sqrt{4} = 2$, so the
# rest of the example is consistent from there on. Here are the true values next to the notes':

# %% slideshow={"slide_type": "fragment"}
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
heatmap(true_scores_magic / 2, TOKENS_MAGIC, TOKENS_MAGIC, ax=axes[0], title="Q Kᵀ / √4, computed",
        xlabel="key", ylabel="query")
heatmap(MATRIX_MAGIC_SCALED, TOKENS_MAGIC, TOKENS_MAGIC, ax=axes[1],
        title="Q Kᵀ / √4, as the notes print it",
        xlabel="key", ylabel="query")
fig.tight_layout()
plt.show()
weights_magic = helper_softmax(true_scores_magic / 2)
print("softmax rows of the computed scores, unmasked (notebook 4 adds the mask):")
for token, row in zip(TOKENS_MAGIC, weights_magic, strict=True):
    print(f"  {token:>5}: {[round(w, 3) for w in row.tolist()]}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Even after dividing by 2 these scores are large (the entries of $Q$ and $K$ are all positive
# and far from unit variance), so every row already puts most of its weight on "eat": scaling by
# $1/\sqrt{d_k}$ helps only when the inputs are roughly unit-variance, which is what the
# initialisation and the LayerNorm of later notebooks arrange.
#
# ### "The cat sat here" (the DS 246 notes)
# The DS 246 notes give an input $X$ ($N = 4$ tokens, $d_{model} = 6$) and then $Q$, $K$, $V$
# ($4 \times 4$, so $d_k = d_v = 4$). Its weight matrices are printed garbled ($W_Q$ with twelve
# rows of four, $W_V$ partly with rows of three), so $Q$, $K$, $V$ cannot be recomputed from $X$;
# we start from the printed $Q$, $K$, $V$ and compute everything after them.

# %% slideshow={"slide_type": "fragment"}
TOKENS_DS246 = ["The", "cat", "sat", "here"]
ds246 = load_notes_tables("ds246")
X_DS246, Q_DS246, K_DS246, V_DS246 = ds246.X, ds246.Q, ds246.K, ds246.V
DS246_RAW, DS246_WEIGHTS, DS246_OUTPUT = ds246.RAW, ds246.WEIGHTS, ds246.OUTPUT

output_ds246, weights_ds246 = scaled_dot_product_attention(Q_DS246, K_DS246, V_DS246)
torch.set_printoptions(precision=2)
print("raw scores Q K^T, computed:\n", Q_DS246 @ K_DS246.T, "\nas the notes print them:\n",
      DS246_RAW)
print("\nweights from the notes' own scores (softmax(raw / 2)):\n", helper_softmax(DS246_RAW / 2),
      "\nas the notes print them:\n", DS246_WEIGHTS)
print("\noutput A V, computed from Q, K, V:\n", output_ds246, "\nas the notes print it:\n",
      DS246_OUTPUT,
      "\nthe notes' printed weights times their printed V:\n", DS246_WEIGHTS @ V_DS246)
torch.set_printoptions(precision=4)
print(f"\nlargest gap: scores {(Q_DS246 @ K_DS246.T - DS246_RAW).abs().max():.2f}, "
      f"weights {(helper_softmax(DS246_RAW / 2) - DS246_WEIGHTS).abs().max():.3f}, "
      f"outputs {(output_ds246 - DS246_OUTPUT).abs().max():.3f}, "
      f"the notes' outputs vs their own weights x V "
      f"{(DS246_WEIGHTS @ V_DS246 - DS246_OUTPUT).abs().max():.3f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Three findings. The notes' raw scores are not $QK^\top$ of their own $Q$ and $K$ (for example
# "The"·"The" is 4.08, not 4.21). Its weights roughly follow from its own printed scores (off by
# up to 0.026). Its outputs follow neither from the true weights nor from its own printed weights
# times its $V$ (off by 0.058 and 0.040, the last line). The computed attention, with token labels:

# %% slideshow={"slide_type": "fragment"}
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
heatmap(weights_ds246, TOKENS_DS246, TOKENS_DS246, ax=axes[0], vmin=0, vmax=0.4,
        title="Weights, computed from Q, K", xlabel="key (attended to)", ylabel="query")
heatmap(DS246_WEIGHTS, TOKENS_DS246, TOKENS_DS246, ax=axes[1], vmin=0, vmax=0.4,
        title="Weights, as the DS 246 notes print them", xlabel="key (attended to)", ylabel="query")
fig.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The DS 246 notes then count how many numbers each stage holds. We count them from the tensors:

# %% slideshow={"slide_type": "fragment"}
stages = [("input X", "N x d_model", X_DS246.numel()),
          ("W_Q, W_K, W_V", "3 x (d_model x d_k)", 3 * X_DS246.shape[1] * Q_DS246.shape[1]),
          ("Q, K, V", "3 x (N x d_k)", Q_DS246.numel() + K_DS246.numel() + V_DS246.numel()),
          ("scores Q K^T", "N x N", weights_ds246.numel()),
          ("weights softmax", "N x N", weights_ds246.numel()),
          ("output A V", "N x d_v", output_ds246.numel())]
for name, shape, count in stages:
    print(f"{name:<18}{shape:<22}{count:>4} values")
gpt3_n, gpt3_heads = 2048, 96
per_head = gpt3_n * gpt3_n
print(f"\nGPT-3 (N = {gpt3_n}, {gpt3_heads} heads): {per_head:,} attention weights per head, "
      f"{per_head * gpt3_heads:,} per layer")

# %% [markdown] slideshow={"slide_type": "slide"}
# The weight matrix is the only stage that grows with $N^2$: tiny here, over four million
# numbers per head for GPT-3's 2,048-token context, and about 403 million per layer across its
# 96 heads (the last printed line). Notebook 4 thins it out with sparse patterns; notebook 8
# avoids storing it at all.
#
# ## 7. Self-attention cannot see order: permutation equivariance (optional)
#
# Shuffle the input tokens of self-attention and the outputs come out shuffled the same way,
# with exactly the same vectors. In symbols, for a permutation matrix $P$:
# $\mathrm{SelfAttn}(PX) = P\,\mathrm{SelfAttn}(X)$. Proof by computation, on your attention
# layer of exercise 3 (the helper's, until yours passes):

# %% slideshow={"slide_type": "fragment"}
catch_up("03_attention", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(3)
x = torch.randn(5, 6, dtype=torch.float64)
perm = torch.tensor([3, 0, 4, 1, 2])
P = torch.eye(5, dtype=torch.float64)[perm]  # permutation matrix: (P x)[i] = x[perm[i]]
self_attention_layer = MyAttentionLayer(6, 4, 4).double()  # float64: the two sides agree to 1e-12


def self_attention(x: torch.Tensor) -> torch.Tensor:
    """Self-attention of tokens x (N, 6) through self_attention_layer: Q, K, V all from x. Returns
    (N, 4)."""
    with torch.no_grad():
        return self_attention_layer(x, x)[0]


shuffled_then_attended = self_attention(P @ x)
attended_then_shuffled = P @ self_attention(x)
torch.testing.assert_close(shuffled_then_attended, attended_then_shuffled, rtol=1e-12, atol=1e-12)
print("SelfAttn(P X) == P SelfAttn(X) for the permutation", perm.tolist())

# %% [markdown] slideshow={"slide_type": "slide"}
# So self-attention by itself treats a sentence as a bag of tokens; this is why notebook 2 adds
# positions to the embeddings before the first attention layer.
#
# ## 8. Cross-attention vs self-attention, side by side (optional)
# In an encoder-decoder model (the DS 246 notes) the decoder's tokens supply the **queries** and the
# encoder's output supplies the **keys and values**: cross-attention. Self-attention takes all
# three from the same tokens. One layer with the same learned weights serves both: only the inputs
# differ, and with them the shape of the attention weights.

# %% slideshow={"slide_type": "fragment"}
catch_up("03_attention", "8.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(4)
source = ["the", "cat", "sat", "on", "a", "mat"]  # encoder side: N_X = 6
target = ["le", "chat", "est"]                      # decoder side: N_Q = 3
d_model, d_head = 8, 4
enc, dec = torch.randn(len(source), d_model), torch.randn(len(target), d_model)
translation_layer = MyAttentionLayer(d_model, d_head, d_head)  # yours once it passes exercise 3
with torch.no_grad():
    _, cross_weights = translation_layer(dec,
            enc)  # queries from the decoder, keys and values from the encoder
    _, self_weights = translation_layer(dec, dec)   # all three from the decoder
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
heatmap(cross_weights, target, source, ax=axes[0], vmin=0, vmax=1,
        title=f"Cross-attention {tuple(cross_weights.shape)}", xlabel="encoder token (key)",
        ylabel="decoder token (query)")
heatmap(self_weights, target, target, ax=axes[1], vmin=0, vmax=1,
        title=f"Self-attention {tuple(self_weights.shape)}", xlabel="decoder token (key)",
        ylabel="decoder token (query)")
fig.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
# (The projections are random, so *which* tokens attend to which means nothing yet; the shapes
# are the point: $N_Q \times N_X$ for cross-attention, $N \times N$ for self-attention. How peaked
# the maps are depends on how the weights start: `nn.Linear` draws them small, so a fresh layer
# spreads its attention almost evenly; training is what sharpens it.)
#
# ## Check your understanding (optional)
#
# **1. Why does the Transformer scale the attention score before the softmax?**
# <details><summary>Answer</summary>
#
# For unit-variance queries and keys, $q\cdot k$ has variance $d_k$ (section 5c). Large scores
# push the softmax into saturation, where its Jacobian $\mathrm{diag}(a) - aa^\top$ is nearly zero
# and almost no gradient reaches $Q$ and $K$ (5b, 5d). Dividing by $\sqrt{d_k}$ restores
# variance 1 whatever the head size. The cell below computes it for a head of size 512.
# </details>

# %% [markdown] slideshow={"slide_type": "notes"}
# Use two or three of these as a closing poll: read the question, give the room thirty seconds,
# then open the answer. The permutation question is the bridge to notebook 4 (masking) and the
# positional encodings of notebook 2.

# %% slideshow={"slide_type": "fragment"}
catch_up("03_attention", "Check")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
g = torch.Generator().manual_seed(5)
# float64: the unscaled Jacobian is near 1e-7, float32's round-off level, so float32 digits would
# vary
q, k = torch.randn(1, 512, generator=g).double(), torch.randn(16, 512, generator=g).double()
for name, scale in (("unscaled", 1.0), ("scaled", 1 / math.sqrt(512))):
    a = helper_softmax(q @ k.T * scale)[0]
    print(f"{name:>9}: std of scores {(q @ k.T * scale).std():6.2f}, largest weight {a.max():.4f}, "
          f"‖Jacobian‖ {softmax_jacobian(a).norm():.2e}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. What are Q, K and V, and what are their dimensions?**
# <details><summary>Answer</summary>
#
# Queries say what each token is looking for, keys what each token offers to be found by, values
# what it hands over when found. With $N_Q$ queries over $N_X$ data vectors: $Q$ is
# $N_Q \times d_k$, $K$ is $N_X \times d_k$ (it must share $d_k$ with $Q$ for the dot products),
# $V$ is $N_X \times d_v$, the weights $N_Q \times N_X$ and the output $N_Q \times d_v$. In
# self-attention $N_Q = N_X = N$. The cell below checks each shape for a batch of heads.
# </details>

# %% slideshow={"slide_type": "fragment"}
batch, heads, n_q, n_x, d_k, d_v = 2, 8, 3, 7, 16, 32
out, w = scaled_dot_product_attention(torch.randn(batch, heads, n_q, d_k), torch.randn(batch, heads,
                                                                                       n_x, d_k),
                                      torch.randn(batch, heads, n_x, d_v))
assert w.shape == (batch, heads, n_q, n_x) and out.shape == (batch, heads, n_q, d_v)
print("weights", tuple(w.shape), "= (batch, heads, N_Q, N_X);  output", tuple(out.shape),
      "= (batch, heads, N_Q, d_v)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. (The textbook section.) Without positional encoding, compare "the cat sat" with "sat cat
# the": are (a) the per-position outputs, (b) the bag of outputs, (c) the next-token predictions
# the same?**
# <details><summary>Answer</summary>
#
# (a) No: position 0 holds "the"'s output in one sentence and "sat"'s in the other. (b) Yes: by
# permutation equivariance each token gets exactly the same output vector in both orders, so the
# set of outputs is identical. (c) The prediction is read from the last position, which holds a
# different token here ("sat" vs "the"), so it differs; but any two orders that end in the same
# token, such as "the cat sat" and "cat the sat", get *identical* predictions: the model cannot
# tell them apart. (The textbook section's answer sketch says "yes" to (c); that holds only for
# orders that end in the same token.) The cell checks all three.
# </details>

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(6)
vocab = {"the": 0, "cat": 1, "sat": 2}
table = torch.randn(3, 6, dtype=torch.float64)  # one made-up embedding row per word, no positions


def outputs_for(sentence: str) -> torch.Tensor:
    """Section 7's self-attention outputs (3, 4) of a three-word sentence embedded without
    positions."""
    return self_attention(table[[vocab[word] for word in sentence.split()]])


a_out, b_out = outputs_for("the cat sat"), outputs_for("sat cat the")
c_out = outputs_for("cat the sat")
print("(a) per-position outputs equal:", torch.allclose(a_out, b_out))
print("(b) 'sat cat the' outputs, read backwards, equal those of 'the cat sat':",
      torch.allclose(b_out.flip(0), a_out))
print("(c) last position equal, 'the cat sat' vs 'sat cat the':", torch.allclose(a_out[-1],
                                                                                 b_out[-1]),
      "| vs 'cat the sat':", torch.allclose(a_out[-1], c_out[-1]))

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. What parallelises in attention?**
# <details><summary>Answer</summary>
#
# Every query is independent of every other query: one matrix product $QK^\top$ computes all
# $N_Q \times N_X$ scores at once, instead of a loop over tokens as in an RNN. The cell shows
# that a Python loop over the queries, one at a time, gives exactly the batched result.
# </details>

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(7)
q, k, v = torch.randn(6, 8), torch.randn(9, 8), torch.randn(9, 5)
one_at_a_time = torch.cat([scaled_dot_product_attention(q[i:i + 1], k, v)[0]
                           for i in range(len(q))])
all_at_once = scaled_dot_product_attention(q, k, v)[0]
torch.testing.assert_close(one_at_a_time, all_at_once)
print(f"{len(q)} queries one at a time == all {len(q)} in one matrix product")
