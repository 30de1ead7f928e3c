# %% [markdown] slideshow={"slide_type": "slide"}
# # 2. Embeddings: turning token ids into vectors that know where they stand
#
# Notebook 1 turned text into a list of integers. A network cannot do much with the integer 7:
# it needs a vector of numbers for every token, and it needs to know where each token stands in
# the sentence. This notebook builds both.
#
# **After it you will be able to**
# - say why one-hot vectors carry no meaning and what a dense embedding table adds;
# - prove that `nn.Embedding` is a matrix product with one-hot vectors, and say why nobody
#   computes it that way;
# - measure how alike two vectors are (dot product, cosine, distance);
# - show that self-attention on its own cannot tell "the cat sat" from "sat cat the";
# - build learned and sinusoidal position tables, read their wavelengths, and add positions to
#   token embeddings.
#
# **It assumes** notebook 1 (tokens and ids), PyTorch tensors, and matrix products.

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import math
import re

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from torch import nn

from helpers.text.corpus import TOY_SOUP, load_corpus
from helpers.lab.exercises import check
from helpers.lab.plots import heatmap
from helpers.timing import best_time, format_duration
from helpers.lab.sections import catch_up

# The tensors of this notebook are small: on them one thread is faster than several that spend
# their time waiting for each other (and the results do not depend on the number of cores).
torch.set_num_threads(1)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. The Matrix Magic notes' twelve-token vocabulary (optional)
#
# The Matrix Magic notes start from one tiny training text and give every word and full stop an id.
# We use the order of the slide's embedding table, because the ids are the rows of that table.
# (The slide's vocabulary list puts "." last, while its table puts it on row 9: we follow the
# table.) "Soup" and "soup" share an id, as on the slide.

# %% slideshow={"slide_type": "fragment"}
SOUP_VOCAB = ["I", "like", "to", "eat", "soup", "am", "a", "good", "cook", ".", "is", "yummy"]
SOUP_ID = {token: index for index, token in enumerate(SOUP_VOCAB)}


def soup_ids(text: str) -> torch.Tensor:
    """The ids of the words and full stops of `text`, shape (n_tokens,)."""
    pieces = re.findall(r"\w+|\.", text)
    return torch.tensor([SOUP_ID[piece] if piece in SOUP_ID else SOUP_ID[piece.lower()]
                         for piece in pieces])


ids = soup_ids(TOY_SOUP)
print(TOY_SOUP)
print(f"{len(SOUP_VOCAB)} tokens in the vocabulary, {len(ids)} tokens in the text")
print("ids:", ids.tolist())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. One-hot vectors: every word equally far from every other (optional)
#
# The oldest way to turn id `i` into a vector: a vector as long as the vocabulary, with a 1 in
# place `i` and 0 everywhere else. Stacked for the whole vocabulary, these vectors form the
# identity matrix, which is exactly the slide's 12 x 12 one-hot table.

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
one_hot_table = torch.eye(len(SOUP_VOCAB))  # row i is the one-hot vector of token i
heatmap(one_hot_table, row_labels=SOUP_VOCAB, col_labels=[f"d{j + 1}" for j in range(12)],
        annotate=False, title="The one-hot table of the slide (12 x 12)",
        xlabel="vector component", ylabel="token")
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The slide's first complaint: one-hot vectors say nothing about which words are alike. Every
# pair of different tokens has dot product 0 and lies at the same distance, sqrt(2), so "soup" is
# as far from "yummy" as from ".".

# %% slideshow={"slide_type": "fragment"}
dots = one_hot_table @ one_hot_table.T  # (12, 12): every token's vector against every other
distances = torch.cdist(one_hot_table, one_hot_table)  # (12, 12) Euclidean distances
different = ~torch.eye(len(SOUP_VOCAB), dtype=torch.bool)
print("dot products between different tokens:", sorted(set(dots[different].tolist())))
print("distances between different tokens:", sorted({round(d, 4)
                                                     for d in distances[different].tolist()}),
      f"(sqrt(2) = {math.sqrt(2):.4f})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Its second complaint: the vectors are huge and almost all zeros. With GPT-2's vocabulary of
# 50,257 tokens, every one-hot vector has 50,256 zeros, and the full one-hot table would hold
# about 2.5 billion numbers. A dense table with 768 numbers per token (GPT-2 small) is 65 times
# smaller.

# %% slideshow={"slide_type": "fragment"}
GPT2_VOCAB, GPT2_D_MODEL = 50_257, 768
BYTES_PER_FLOAT32 = 4
one_hot_entries = GPT2_VOCAB**2
dense_entries = GPT2_VOCAB * GPT2_D_MODEL
print(f"zeros in one one-hot vector:  {GPT2_VOCAB - 1:,}")
print(f"one-hot table: {one_hot_entries:,} numbers = "
      f"{one_hot_entries * BYTES_PER_FLOAT32 / 1e9:.1f} GB")
print(
    f"dense table:   {dense_entries:,} numbers = {dense_entries * BYTES_PER_FLOAT32 / 1e6:.0f} MB"
)
print(f"the dense table is {one_hot_entries / dense_entries:.0f} times smaller")

# %% [markdown] slideshow={"slide_type": "subslide"}
# From here on the course uses `helpers.model.embeddings.one_hot(token_ids, vocab_size)`, which builds
# the same rows without making the whole identity matrix, for ids of any shape. It agrees with
# the rows of the identity:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.embeddings import one_hot

assert torch.equal(one_hot(ids, len(SOUP_VOCAB)), one_hot_table[ids])
print("one_hot(ids) has shape", tuple(one_hot(ids, len(SOUP_VOCAB)).shape),
      "and equals the identity rows")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. A dense table: 8 numbers per token (optional)
#
# Instead, give every token a short vector of `d_model` numbers and let training move them. The
# Matrix Magic notes print a 12 x 8 table (`d_model = 8`). We load its numbers, as printed (2
# decimals), into an `nn.Embedding` and "pluck out" the rows of the slide's batch
# `idx = [0, 1, 2, 3]` ("I like to eat").

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
SLIDE_TOKEN_TABLE = torch.tensor([  # the Matrix Magic notes, "Initialize Token Embeddings Table"
    [0.26, 0.38, 0.00, 0.27, 0.18, 0.67, 0.65, 0.57],  # I
    [0.23, 0.72, 0.86, 0.96, 0.33, 0.93, 0.23, 0.31],  # like
    [0.89, 0.42, 0.71, 0.64, 0.51, 0.31, 0.63, 0.15],  # to
    [0.90, 0.53, 0.41, 0.12, 0.52, 0.28, 0.99, 0.00],  # eat
    [0.55, 0.03, 0.98, 0.36, 0.01, 0.24, 0.47, 0.69],  # soup
    [0.12, 0.33, 0.50, 0.34, 0.41, 0.32, 0.57, 0.04],  # am
    [0.89, 0.34, 0.20, 0.76, 0.04, 0.49, 0.65, 0.54],  # a
    [0.39, 0.21, 0.99, 0.55, 0.51, 0.71, 0.05, 0.78],  # good
    [1.00, 0.16, 0.37, 0.49, 0.18, 0.78, 0.94, 0.56],  # cook
    [0.97, 0.66, 0.28, 0.82, 0.71, 0.64, 0.18, 0.04],  # .
    [0.56, 0.00, 0.56, 0.29, 0.37, 0.83, 0.95, 0.56],  # is
    [0.73, 0.67, 0.46, 0.21, 0.18, 0.97, 0.60, 0.38],  # yummy
], dtype=torch.float64)
DIMS = [f"d{j + 1}" for j in range(8)]

token_embedding = nn.Embedding(len(SOUP_VOCAB), 8, dtype=torch.float64)
with torch.no_grad():
    token_embedding.weight.copy_(SLIDE_TOKEN_TABLE)

batch = torch.tensor([0, 1, 2, 3])  # the slide's idx
plucked = token_embedding(batch)  # (4,) -> (4, 8)
print("token_embedding(idx) has shape", tuple(plucked.shape))


# %% [markdown] slideshow={"slide_type": "subslide"}
# Every table in this notebook is printed next to the slide's, and every entry where the slide
# differs from the computed value (rounded the way the slide rounds) is listed under it.

# %% slideshow={"slide_type": "fragment"}
def print_side_by_side(computed: torch.Tensor, slide: torch.Tensor, row_labels: list[str],
                       col_labels: list[str], decimals: int) -> None:
    """Print two (rows, cols) tables side by side: the computed one left, the slide's right."""
    width = decimals + 5
    label_width = max(len(label) for label in row_labels) + 2
    block = len(col_labels) * width

    def cells(values: torch.Tensor) -> str:
        return "".join(f"{value:>{width}.{decimals}f}" for value in values.tolist())

    header = "".join(f"{label:>{width}}" for label in col_labels)
    print(f"{'':<{label_width}}{'computed':>{block}} | {'slide':>{block}}")
    print(f"{'':<{label_width}}{header} | {header}")
    for label, ours, theirs in zip(row_labels, computed, slide, strict=True):
        print(f"{label:<{label_width}}{cells(ours)} | {cells(theirs)}")


# %% slideshow={"slide_type": "fragment"}
def compare_with_slide(computed: torch.Tensor, slide: torch.Tensor, row_labels: list[str],
                       col_labels: list[str], decimals: int) -> list[str]:
    """Print (rows, cols) tables side by side; list and return the entries the slide got wrong.

    An entry is wrong when the computed value, rounded to `decimals` places, is not the slide's.
    """
    print_side_by_side(computed, slide, row_labels, col_labels, decimals)
    half_a_unit = 0.5 * 10**-decimals + 1e-9
    wrong = ((computed.double() - slide.double()).abs() > half_a_unit).nonzero().tolist()
    mismatches = [f"{row_labels[r]}, {col_labels[c]}: computed "
                  f"{computed[r, c].item():.{decimals + 2}f},"
                  f" slide {slide[r, c].item():.{decimals}f}" for r, c in wrong]
    print("entries where the slide differs:", len(mismatches))
    for mismatch in mismatches:
        print("   ", mismatch)
    return mismatches


# the Matrix Magic notes, "Pluck Out the Tokens in Your Batch": rows 0-3
SLIDE_PLUCKED = SLIDE_TOKEN_TABLE[:4]
plucked_mismatches = compare_with_slide(plucked.detach(), SLIDE_PLUCKED, SOUP_VOCAB[:4], DIMS,
                                        decimals=2)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. A lookup is a one-hot matrix product (core)
#
# First a reminder of what a matrix product computes, with the Matrix Magic notes' example:
# entry $(i, j)$ of $AB$ is the dot product of row $i$ of $A$ with column $j$ of $B$, so the
# inner sizes must agree and a (2 x 3) matrix times a (3 x 2) matrix is (2 x 2). The notes show
# only the first entry, 58, the dot product of the first row with the first column; the cell
# computes all four.

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
a_2x3 = torch.tensor([[1, 2, 3], [4, 5, 6]])
b_3x2 = torch.tensor([[7, 8], [9, 10], [11, 12]])
entry_by_entry = [[sum(a_2x3[i, k].item() * b_3x2[k, j].item() for k in range(3)) for j in range(2)]
                  for i in range(2)]
assert (a_2x3 @ b_3x2).tolist() == entry_by_entry
print(f"(2 x 3) @ (3 x 2) -> {tuple((a_2x3 @ b_3x2).shape)}:", (a_2x3 @ b_3x2).tolist())
print("entry (0, 0) = 1*7 + 2*9 + 3*11 =", 1 * 7 + 2 * 9 + 3 * 11)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now the lookup. Write the one-hot vector of token `i` as a row `x` (length V) and the table as
# `W` (V x d). Component `j` of the product is
#
# $(xW)_j = \sum_k x_k W_{kj} = W_{ij}$, because $x_k$ is 1 for $k = i$ and 0 for every other $k$.
#
# So `xW` is row `i` of `W`: multiplying by a one-hot vector *is* looking up a row. Stack the
# one-hot rows of a whole sentence into `X` (n x V) and `XW` (n x d) holds the rows of all its
# tokens, in order. Write it down in code:
#
# ### Exercise 1: look rows up with a product only
# Write `lookup_by_product(token_ids, weight)` that returns the rows of `weight` (V, d) for ids
# of any shape, using `one_hot` and a matrix product. The checker hands you a weight that refuses
# to be indexed, so `weight[token_ids]` will not pass.
#
# <details><summary>Hint 1: the idea</summary>
#
# A one-hot row has a single 1, so multiplying it by the table picks out one row of the table.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Make the one-hot rows of the ids, as many columns as the table has rows, and convert them to
# the table's dtype (a product needs both sides in one dtype). Then take the matrix product of
# those rows with the table: it works on the last dimension of the one-hot rows, whatever shape
# the ids have.
# </details>

# %% slideshow={"slide_type": "fragment"}
def lookup_by_product(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """token_ids (...,) and weight (V, d) -> (..., d), without indexing `weight`."""
    ### BEGIN SOLUTION
    return one_hot(token_ids, len(weight)).type_as(weight) @ weight  # (..., V) @ (V, d)
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("embeddings.lookup_by_product", lookup_by_product)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The rest of this section computes the product with your function once it passes its check, and
# with the course's until then, saying which. Checked on the soup sentence, to the last bit:

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises import yours_or
from helpers.lab.exercises.embeddings import course_lookup_by_product

lookup_rows = yours_or("embeddings.lookup_by_product", lookup_by_product, course_lookup_by_product)
product = lookup_rows(ids, token_embedding.weight)  # (16, 12) one-hot rows @ (12, 8)
lookup = token_embedding(ids)  # (16, 8)
print("one-hot product == nn.Embedding lookup, exactly:", torch.equal(product, lookup))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The two agree while training too. The gradient of a loss with respect to the table is the same
# either way, and it is zero on every row whose token was not in the batch: training on
# "I like to eat" moves 4 rows and leaves the other 8 alone.

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
upstream = torch.randn(4, 8, dtype=torch.float64)  # some gradient arriving from later layers
gradients = []
for embed_batch in (lambda t: lookup_rows(t, token_embedding.weight), token_embedding):
    token_embedding.weight.grad = None
    (embed_batch(batch) * upstream).sum().backward()
    gradients.append(token_embedding.weight.grad.clone())
assert torch.allclose(gradients[0], gradients[1])
moved = gradients[1].abs().sum(dim=1) > 0
print("rows with a non-zero gradient:", [SOUP_VOCAB[i] for i in moved.nonzero().flatten().tolist()])
print("rows untouched:", int((~moved).sum()))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Why then does `nn.Embedding` not multiply? Because the product spends V x d multiply-adds per
# token to copy d numbers. At GPT-2's size, 64 tokens cost about 2.5 billion multiply-adds and a
# 64 x 50,257 one-hot matrix, against 64 x 768 numbers copied by the lookup:

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
gpt2_table = nn.Embedding(GPT2_VOCAB, GPT2_D_MODEL)
some_ids = torch.randint(GPT2_VOCAB, (64,))
with torch.no_grad():
    by_product = best_time(lambda: lookup_rows(some_ids, gpt2_table.weight), repeats=3)
    by_lookup = best_time(lambda: gpt2_table(some_ids), repeats=3)
print(f"multiply-adds in the product: {64 * GPT2_VOCAB * GPT2_D_MODEL / 1e9:.1f} billion")
print(f"one-hot matrix: {64 * GPT2_VOCAB * BYTES_PER_FLOAT32 / 1e6:.1f} MB")
print(f"numbers the lookup copies: 64 x {GPT2_D_MODEL} = {64 * GPT2_D_MODEL:,}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# How much faster the lookup is depends on the machine, so the times below are shown, not
# checked (on the machine that made this notebook the lookup wins by a wide margin).

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Wall-clock times change from run to run and from machine to machine.
print("one-hot product", format_duration(by_product))
print("lookup         ", format_duration(by_lookup),
      f"({by_product / by_lookup:,.0f} times faster)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. How alike are two vectors? (optional)
#
# The Matrix Magic notes illustrate "similar words have close vectors" with boy = [10, 8, 9] and
# girl = [9, 7, 10]. Three ways to compare them:
# - the **dot product** a.b, large when the vectors are long and point the same way;
# - the **cosine** a.b / (|a| |b|), the angle alone, from -1 (opposite) to 1 (same direction);
# - the **distance** |a - b|, small when the vectors are close.

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
boy = torch.tensor([10.0, 8.0, 9.0])
girl = torch.tensor([9.0, 7.0, 10.0])
dot = (boy * girl).sum()
cosine = dot / (boy.norm() * girl.norm())
distance = (boy - girl).norm()
print(f"dot product {dot:.0f}, cosine {cosine:.4f}, distance {distance:.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The helper `helpers.model.embeddings.cosine_similarity(a, b)` computes the cosine along the last
# dimension for whole batches of vectors, and refuses zero vectors, which have no direction.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.embeddings import cosine_similarity

assert torch.isclose(cosine_similarity(boy, girl), cosine)
print(f"cosine_similarity(boy, girl) = {cosine_similarity(boy, girl):.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The slide's 12 x 8 table is untrained, so its cosines mean nothing: all of its numbers lie
# between 0 and 1, so every pair of tokens points roughly the same way. (A fresh `nn.Embedding`
# would not even look like that: it draws from a normal distribution, so about half its numbers
# are negative.)

# %% slideshow={"slide_type": "fragment"}
slide_cosines = cosine_similarity(SLIDE_TOKEN_TABLE[:, None, :], SLIDE_TOKEN_TABLE[None, :,
                                                                                   :])  # (12, 12)
off_diagonal = slide_cosines[different]
print(f"cosines between different slide tokens: {off_diagonal.min():.2f} to "
      f"{off_diagonal.max():.2f}")
print(f"numbers in the slide's table: {SLIDE_TOKEN_TABLE.min():.2f} to "
      f"{SLIDE_TOKEN_TABLE.max():.2f}")
torch.manual_seed(0)
print(f"negative numbers in a fresh nn.Embedding(12, 8): "
      f"{(nn.Embedding(12, 8).weight < 0).float().mean():.0%}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Vectors that learned something
# To see similarity mean something, we learn vectors from the course corpus.
# Each word gets a 16-number row of an `nn.Embedding`; a linear layer must predict, from that
# row alone, which words appear within two places of it. Words used in the same slots of the
# stories ("dog" and "goat", "river" and "lake") have the same neighbours, so training pushes
# their rows the same way. This is the idea behind word2vec; a Transformer learns its table the
# same way, only with a harder prediction task.
#
# ### Exercise 2: the training loop
# Write `train_word_vectors(embedding, predict_neighbour, counts, steps, lr)`. `counts` is a
# `(V, V)` table: entry `[i, j]` counts how often word `j` stands within two places of word `i`.
# Divided by its total it becomes the share of each (word, neighbour) pair, a table summing to 1.
# Train both modules with Adam (learning rate `lr`) for `steps` steps. Each step scores, for every
# word at once, how likely each word is to be its neighbour: the predictor's outputs for all the
# words' rows, turned into log-probabilities one row per word by a log-softmax. The loss is the
# cross-entropy against the pair shares: minus the sum, over all pairs, of share times
# log-probability. Return the loss of every step (before its update) as a list of floats. The
# training below runs on your loop.
#
# <details><summary>Hint 1: the idea</summary>
#
# This is the usual PyTorch training loop: an optimizer made once, then at every step a forward
# pass, a loss, and the three calls that clear the gradients, compute them and take a step.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Before the loop: the optimizer over both modules'
# parameters, the counts as shares that sum to 1, and the ids of every word. (2) Each step: the
# model's predicted distribution of the neighbour of every word, and the cross-entropy of those
# predictions against the shares. (3) The usual three calls of an update; keep each step's loss as a
# plain number.</details>
#
# <details><summary>Hint 3: closer</summary>The cross-entropy here is minus the sum, over every
# (word, neighbour) pair, of the pair's share times the log-probability the model gives that
# neighbour; the log-probabilities are a log-softmax over each word's row of scores. Record the loss
# before the update.</details>

# %% slideshow={"slide_type": "fragment"}
def train_word_vectors(embedding: nn.Embedding, predict_neighbour: nn.Linear, counts: torch.Tensor,
                       steps: int, lr: float = 0.05) -> list[float]:
    """Train both modules with Adam on the neighbour-prediction loss; counts (V, V) -> the loss of
    every step."""
    ### BEGIN SOLUTION
    optimizer = torch.optim.Adam([*embedding.parameters(), *predict_neighbour.parameters()], lr=lr)
    pair_share = counts / counts.sum()  # (V, V): how often each (word, neighbour) pair occurs
    every_word = torch.arange(counts.shape[0])  # (V,)
    losses = []
    for _ in range(steps):
        log_probs = torch.log_softmax(predict_neighbour(embedding(every_word)), dim=-1)  # (V, V)
        loss = -(pair_share * log_probs).sum()  # cross-entropy over all (word, neighbour) pairs
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # the loss before this step's update
    return losses
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("embeddings.train_word_vectors", train_word_vectors)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The neighbour counts: one pass per offset, adding 1 at (word, neighbour) and at (neighbour,
# word) for every pair of words that far apart.

# %% slideshow={"slide_type": "fragment"}
def corpus_words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of `text`, in order."""
    return re.findall(r"[a-z]+|[.,!?\"]", text.lower())


def neighbour_counts(word_ids: torch.Tensor, vocab_size: int, window: int = 2) -> torch.Tensor:
    """(V, V) float64: entry [i, j] counts how often word j appears within `window` places of word
    i."""
    counts = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    for offset in range(1, window + 1):
        left, right = word_ids[:-offset], word_ids[offset:]
        ones = torch.ones(len(left), dtype=torch.float64)
        counts.index_put_((left, right), ones, accumulate=True)
        counts.index_put_((right, left), ones, accumulate=True)
    return counts


# %% [markdown] slideshow={"slide_type": "subslide"}
# The training runs on your loop once it passes its check, and on the course's until then:

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises.embeddings import course_train_word_vectors

TRAIN_STEPS = 150  # the knob: more steps give slightly better vectors, and take longer
train = yours_or("embeddings.train_word_vectors", train_word_vectors, course_train_word_vectors)


def learn_word_vectors(counts: torch.Tensor, d_model: int, steps: int) -> tuple[torch.Tensor,
                                                                                float]:
    """Rows of an nn.Embedding trained to predict each word's neighbours: (V, d_model), final
    loss."""
    vocab_size = counts.shape[0]
    embedding = nn.Embedding(vocab_size, d_model, dtype=torch.float64)
    predict_neighbour = nn.Linear(d_model, vocab_size, dtype=torch.float64)
    losses = train(embedding, predict_neighbour, counts, steps)
    return embedding.weight.detach(), losses[-1]


# %% slideshow={"slide_type": "fragment"}
words = corpus_words(load_corpus())
VOCAB = sorted(set(words))
WORD_ID = {word: index for index, word in enumerate(VOCAB)}
counts = neighbour_counts(torch.tensor([WORD_ID[w] for w in words]), len(VOCAB))
torch.manual_seed(0)
word_vectors, final_loss = learn_word_vectors(counts, d_model=16, steps=TRAIN_STEPS)
print(f"{len(words):,} words, {len(VOCAB)} different; vectors of shape {tuple(word_vectors.shape)}")
print(f"loss after {TRAIN_STEPS} steps: {final_loss:.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 3: nearest neighbours
# Write `most_similar(query, table, k)`: the indices of the `k` rows of `table` (V, d) whose
# cosine with `query` (d,) is largest, most similar first. Careful: ranking by the plain dot
# product lets long vectors win even when they point elsewhere, and the checker knows it.
#
# <details><summary>Hint 1: the idea</summary>
#
# Cosine similarity is the dot product of the two vectors after each is scaled to length 1.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Every row of the table, and the query, scaled to
# length 1. (2) Their dot products, all at once: the cosines. (3) The indices of the k largest
# cosines, largest first.</details>

# %% slideshow={"slide_type": "fragment"}
def most_similar(query: torch.Tensor, table: torch.Tensor, k: int) -> torch.Tensor:
    """query (d,), table (V, d) -> (k,) row indices, most similar by cosine first."""
    ### BEGIN SOLUTION
    unit_rows = table / table.norm(dim=1, keepdim=True)  # (V, d), every row of length 1
    cosines = unit_rows @ (query / query.norm())  # (V,)
    return cosines.topk(k).indices  # largest first
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("embeddings.most_similar", most_similar)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now the nearest neighbours of a word, by cosine, are words that play the same part. The cell
# ranks them with your `most_similar` once it passes its check, and with the course's until then:

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises.embeddings import course_most_similar

rank_rows = yours_or("embeddings.most_similar", most_similar, course_most_similar)


def nearest(word: str, k: int = 3) -> str:
    """The k words whose vectors point most nearly the same way as `word`'s, with their cosines."""
    row = word_vectors[WORD_ID[word]]  # (d,)
    cosines = cosine_similarity(row, word_vectors)  # (V,)
    best = rank_rows(row, word_vectors, k + 1)[1:]  # the first is the word itself
    return ", ".join(f"{VOCAB[i]} {cosines[i]:.2f}" for i in best.tolist())


for word in ["dog", "river", "red", "baker", "morning"]:
    print(f"{word:>8}: {nearest(word)}")

# %% slideshow={"slide_type": "fragment"}
SHOWN = ["dog", "cat", "goat", "river", "lake", "forest", "red", "blue", "golden"]
shown_vectors = word_vectors[[WORD_ID[w] for w in SHOWN]]  # (9, 16)
heatmap(cosine_similarity(shown_vectors[:, None, :], shown_vectors[None, :, :]),
        row_labels=SHOWN, col_labels=SHOWN, vmin=-1, vmax=1, cmap="RdBu",
        title="Cosine similarity of learned word vectors", xlabel="word", ylabel="word")
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Why order is lost: attention sees a bag of vectors (optional)
#
# *A preview of notebook 3.* Self-attention mixes every token's vector with every other's, with
# weights computed from the vectors themselves. Nothing in it looks at where a token stands. The
# textbook section's exercise: feed "the cat sat" and "sat cat the" through one self-attention
# layer with no positional information, using our learned word vectors, and compare.

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.attention import scaled_dot_product_attention

D = word_vectors.shape[1]
torch.manual_seed(0)
W_q, W_k, W_v = (torch.randn(D, D, dtype=torch.float64) / math.sqrt(D) for _ in range(3))


def self_attention(x: torch.Tensor) -> torch.Tensor:
    """One self-attention layer with fixed random weights: x (n, D) -> (n, D)."""
    output, _weights = scaled_dot_product_attention(x @ W_q, x @ W_k, x @ W_v)
    return output


def sentence_vectors(sentence: str) -> torch.Tensor:
    """The learned word vectors of the words of `sentence`, stacked: (n_words, D)."""
    return word_vectors[[WORD_ID[word] for word in sentence.split()]]


# %% slideshow={"slide_type": "fragment"}
def show_outputs(sentence: str, outputs: torch.Tensor) -> None:
    """Print the first four numbers of each position's output vector."""
    for position, (word, vector) in enumerate(zip(sentence.split(), outputs, strict=True)):
        print(f"  position {position} {word:>4}:", " ".join(f"{v:7.3f}"
                                                            for v in vector[:4].tolist()))


for sentence in ["the cat sat", "sat cat the"]:
    print(f'"{sentence}"')
    show_outputs(sentence, self_attention(sentence_vectors(sentence)))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The rows are the same three vectors in a different order: each word gets the same output
# wherever it stands. That is **permutation equivariance**: permute the inputs and the outputs
# are permuted the same way, and nothing else changes. The other parts of a Transformer block
# (LayerNorm, the feed-forward network) work on each token alone, so a whole stack of blocks keeps
# the same symmetry. The textbook section's three questions, answered by computation:

# %% slideshow={"slide_type": "fragment"}
def largest_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """The largest entry of |a - b|, printed to 6 decimals."""
    return f"{(a - b).abs().max().item():.6f}"


from helpers.model.embeddings import sinusoidal_positions


def attend(sentence: str, add_positions: bool) -> torch.Tensor:
    """Self-attention outputs (n_words, D) of `sentence`, with or without sinusoidal positions."""
    x = sentence_vectors(sentence)
    if add_positions:
        x = x + sinusoidal_positions(len(x), D).double()
    return self_attention(x)


# %% slideshow={"slide_type": "fragment"}
def permutation_answers(add_positions: bool) -> dict[str, bool]:
    """The textbook section's (a), (b), (c) for "the cat sat" vs "sat cat the", with or without
    positions."""
    original, reordered, same_end = (attend(sentence, add_positions)
                                     for sentence in ("the cat sat", "sat cat the", "cat the sat"))
    reverse = [2, 1, 0]  # "sat cat the" is "the cat sat" read backwards
    print("(a) largest difference position by position:", largest_difference(original, reordered))
    print("(b) largest difference word by word:        ", largest_difference(original[reverse],
                                                                             reordered))
    print("(c) last outputs, 'the cat sat' vs 'sat cat the':", largest_difference(original[-1],
                                                                                  reordered[-1]))
    print("    last outputs, 'the cat sat' vs 'cat the sat':", largest_difference(original[-1],
                                                                                  same_end[-1]))
    return {"a_same_per_position": torch.allclose(original, reordered),
            "b_same_bag": torch.allclose(original[reverse], reordered),
            "c_same_last_output": torch.allclose(original[-1], reordered[-1]),
            "c_same_when_same_last_word": torch.allclose(original[-1], same_end[-1])}


without_positions = permutation_answers(add_positions=False)
print(without_positions)

# %% [markdown] slideshow={"slide_type": "subslide"}
# - **(a)** The outputs position by position differ: position 0 holds "the" in one sentence and
#   "sat" in the other.
# - **(b)** The bag of outputs is identical: every word's output is the same in both orders.
# - **(c)** The textbook section's sketch answers "yes, the next-token prediction is the same".
#   Computed, the output at the last position differs, because the last word differs ("sat" vs
#   "the"). What is truly lost is subtler and just as fatal: the prediction depends only on the
#   last word and the *bag* of the others, so "the cat sat" and "cat the sat" get exactly the same
#   prediction.
#
# (This holds for attention without a mask. The causal mask of notebook 4 lets each token see
# only earlier ones, which leaks some order; models still add positions.)
#
# Add a position vector to each word (section 8 builds them) and the symmetry is gone: now every
# comparison differs.

# %% slideshow={"slide_type": "fragment"}
with_positions = permutation_answers(add_positions=True)
print(with_positions)
assert not any(with_positions.values())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Positions, option 1: a learned table (optional)
#
# The simplest fix, used by GPT-2 and by the Matrix Magic notes: a second `nn.Embedding` whose row
# `p` is the vector of position `p`, trained like the token table. The notes print one for
# `context_length = 4` positions and `d_model = 8`:

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
# the Matrix Magic notes, "Option 1: Learned Positional Embeddings"
SLIDE_POSITION_TABLE = torch.tensor([
    [0.42, 0.16, 0.05, 0.38, 0.05, 0.79, 0.12, 0.27],
    [0.19, 0.50, 0.26, 0.53, 0.71, 0.16, 0.42, 0.32],
    [0.32, 0.24, 0.36, 0.86, 0.02, 0.60, 0.31, 0.01],
    [0.90, 0.39, 0.44, 0.01, 0.20, 0.66, 0.94, 0.75],
], dtype=torch.float64)
BLOCK_SIZE = 4
position_embedding = nn.Embedding(BLOCK_SIZE, 8, dtype=torch.float64)
with torch.no_grad():
    position_embedding.weight.copy_(SLIDE_POSITION_TABLE)
print("position table:", tuple(position_embedding.weight.shape), "-> rows for positions 0 to",
      BLOCK_SIZE - 1)
print(f"GPT-2's learned position table: 1024 x {GPT2_D_MODEL} = {1024 * GPT2_D_MODEL:,} parameters")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Its limit is built in: there is no row for position 4, so a model with this table cannot read a
# fifth token, however useful the rest of it is.

# %% slideshow={"slide_type": "fragment"}
try:
    position_embedding(torch.tensor([BLOCK_SIZE]))
except IndexError as error:
    print("IndexError:", error)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. Positions, option 2: sines and cosines (core)
#
# "Attention Is All You Need" uses a fixed table instead, with no parameters and a row for every
# position:
#
# $PE_{(pos,\,2i)} = \sin\!\left(pos / 10000^{2i/d_{model}}\right) \qquad
# PE_{(pos,\,2i+1)} = \cos\!\left(pos / 10000^{2i/d_{model}}\right)$
#
# Column pair `i` (columns `2i` and `2i+1`) turns at its own speed: pair 0 once every 2 pi
# positions, later pairs ever more slowly.
#
# ### Exercise 4: write the formula
# Write `sinusoidal_table(n_positions, d_model, base)`, the whole (n_positions, d_model) table,
# without loops over positions: build the angles for all positions and pairs at once, then fill
# the even columns with sines and the odd columns with cosines. Assume `d_model` is even. The
# rest of this section computes its tables with your function.
#
# <details><summary>Hint 1: the idea</summary>
#
# Every entry is a sine or cosine of (position x frequency), the frequency depending only on the
# pair index.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Every angle of the table at once: the positions
# against the pairs' frequencies, arranged so that broadcasting pairs each position with each
# frequency. (2) A table of the full width. (3) The sines of the angles in the even columns, the
# cosines in the odd ones.</details>
#
# <details><summary>Hint 3: closer</summary>Pair i's frequency is one over base to the power 2i over
# d_model. The positions form a column and the pair indices a row; no loop over positions.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "8.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """(n_positions, d_model): sin in column 2i, cos in column 2i+1, of pos / base^(2i/d_model)."""
    ### BEGIN SOLUTION
    positions = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (n_positions, 1)
    pair = torch.arange(d_model // 2, dtype=torch.float64)  # (d_model / 2,)
    angles = positions / base ** (2 * pair / d_model)  # (n_positions, d_model / 2)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("embeddings.sinusoidal_table", sinusoidal_table)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The next cell builds the tables with your `sinusoidal_table` once it passes its check, and with
# the course's `sinusoidal_positions` until then, saying which. The USF notes print this table for
# `d_model = 4`. Computed next to it:

# %% slideshow={"slide_type": "fragment"}
positional_table = yours_or("embeddings.sinusoidal_table", sinusoidal_table, sinusoidal_positions)
USF_TABLE = torch.tensor([  # the USF notes, "Positional Encoding", d_model = 4
    [0.0000, 1.0000, 0.0000, 1.0000],
    [0.8415, 0.5403, 0.0100, 0.9999],
    [0.9093, -0.4161, 0.0200, 0.9998],
    [0.1411, -0.9900, 0.0300, 0.9996],
])
usf_mismatches = compare_with_slide(positional_table(4, 4), USF_TABLE,
                                         ["pos 0", "pos 1", "pos 2", "pos 3"],
                                         ["dim0", "dim1", "dim2", "dim3"], decimals=4)
print(f"cos(1/100) = {math.cos(1 / 100):.10f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The one difference is at the last digit: cos(1/100) = 0.99995000..., which rounds up to
# 1.0000; the USF notes' slide cut it off to 0.9999 instead of rounding it.

# %% [markdown] slideshow={"slide_type": "subslide"}
# The Matrix Magic notes print the same kind of table for the sentence "I am a robot" with `d = 4`
# but base `n = 100` instead of 10000, so its second pair turns at 1/10 instead of 1/100 per
# position. Its printed "1.0" for cos(1/10) is cos(0.1) = 0.995 rounded, which is fine at two
# decimals.

# %% slideshow={"slide_type": "fragment"}
# the Matrix Magic notes, "Option 2: Positional Encoding", d = 4, n = 100
MATRIX_MAGIC_TABLE = torch.tensor([
    [0.00, 1.00, 0.00, 1.00],
    [0.84, 0.54, 0.10, 1.0],
    [0.91, -0.42, 0.20, 0.98],
    [0.14, -0.99, 0.30, 0.96],
])
matrix_magic_mismatches = compare_with_slide(positional_table(4, 4, base=100.0), MATRIX_MAGIC_TABLE,
                                         ["I", "am", "a", "Robot"], ["P_k0", "P_k1", "P_k2",
                                                                     "P_k3"],
                                         decimals=2)
print(f"cos(1/10) = {math.cos(0.1):.4f}")
from helpers.model.embeddings import sinusoid_frequencies

for base in (100.0, 10000.0):
    print(f"base {base:>7g}: the two pairs turn by "
          f"{[round(f, 6) for f in sinusoid_frequencies(4, base).tolist()]} per position")

# %% [markdown] slideshow={"slide_type": "subslide"}
# From here on we use `helpers.model.embeddings.sinusoidal_positions(n_positions, d_model, base)`
# (and `sinusoid_frequencies`, used above, gives each pair's speed). It agrees with the tables
# above, and it also takes an odd `d_model`: its last column is then a sine without a cosine.

# %% slideshow={"slide_type": "fragment"}
for n_positions, d_model, base in [(4, 4, 10000.0), (4, 4, 100.0), (50, 32, 10000.0)]:
    assert torch.allclose(sinusoidal_positions(n_positions, d_model, base).double(),
                          positional_table(n_positions, d_model, base).double(), atol=1e-6)
odd_table = sinusoidal_positions(7, 5).double()  # pairs 0 and 1 in columns 0-3, then column 4
unpaired = torch.sin(torch.arange(7, dtype=torch.float64) / 10000.0 ** (4 / 5))  # pair 2's sine
assert torch.allclose(odd_table[:, 4], unpaired, atol=1e-6)
print("sinusoidal_positions matches the tables above; for d_model = 5 its last column is",
      "sin(pos / 10000^(4/5)), a sine without its cosine")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### What the table looks like
# Each column of the table is a wave along the positions, and the higher the column, the slower
# its wave. Read the picture below one vertical slice at a time: every position gets its own
# pattern of values, a little like the digits of a number, where the last digit changes at every
# step and the first ones only now and then.

# %% slideshow={"slide_type": "fragment"}
table = sinusoidal_positions(64, 32)  # (64 positions, 32 dims)
figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), layout="constrained")
image = left.imshow(table.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
left.grid(False)
figure.colorbar(image, ax=left, label="value")
left.set(title="Sinusoidal positions, d_model = 32", xlabel="position", ylabel="dimension")
for column in [0, 4, 8, 16]:
    right.plot(table[:, column], label=f"column {column}")
right.set(title="Four columns of that table", xlabel="position", ylabel="value", ylim=(-1.1, 1.6))
right.legend(ncol=2, loc="upper right")
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# One more property: the dot product of two position vectors depends only on how far apart they
# are, not on where they are, because $\sin a \sin b + \cos a \cos b = \cos(a - b)$. Position 10
# resembles position 13 exactly as much as position 40 resembles position 43:

# %% slideshow={"slide_type": "fragment"}
dot_products = table @ table.T  # (64, 64)
print(f"PE(10).PE(13) = {dot_products[10, 13]:.4f}   PE(40).PE(43) = {dot_products[40, 43]:.4f}")
for offset in range(1, 64):
    along_diagonal = torch.diagonal(dot_products, offset)
    assert torch.allclose(along_diagonal, along_diagonal[0].expand_as(along_diagonal), atol=1e-4)
print("every diagonal of the 64 x 64 dot-product matrix is constant")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 9. How slow is the slowest wave? (the textbook section's wavelength exercise) (optional)
#
# Pair `i` turns by $1/10000^{2i/d}$ per position, so it repeats every
# $2\pi \cdot 10000^{2i/d}$ positions. With `d = 512` the pairs run from `i = 0` (fastest) to
# `i = 255` (slowest).

# %% slideshow={"slide_type": "fragment"}
from helpers.model.embeddings import sinusoid_wavelengths

wavelengths = sinusoid_wavelengths(512)  # (256,) one per pair
print(f"fastest pair, i = 0:   2 pi x 10000^(0/512)   = {wavelengths[0]:,.4f} positions")
print(f"slowest pair, i = 255: 2 pi x 10000^(510/512) = {wavelengths[255]:,.1f} positions")
print(f"10000^(510/512) = 10^{4 * 510 / 512:.3f} = {10000 ** (510 / 512):,.1f}   (the textbook "
      f"section's answer uses 9655)")
print(f"2 pi x 9655     = {2 * math.pi * 9655:,.0f}   (the textbook section's answer is 60,600)")
print(f"rounded to hundreds: the true {wavelengths[255]:,.1f} -> "
      f"{round(wavelengths[255].item(), -2):,.0f}, "
      f"2 pi x 9655 -> {round(2 * math.pi * 9655, -2):,.0f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The textbook section's 9,655 is an arithmetic slip: 10000^(510/512) is 10^3.984, about 9,646.6,
# so the slowest wavelength is about 60,611 positions. Its 60,600 is the true 60,611 rounded, not
# its own 2 pi x 9655 = 60,664 (which rounds to 60,700), so the slip in 9,655 never reached the
# answer. The conclusion stands: the fastest pair repeats every 6.28 positions, the slowest only
# after about sixty thousand.
#
# Part (c) asks whether a model trained on 512 positions can read 4000. Count the pairs whose
# wave completes a full turn within the first 512 positions: only those have shown the model
# every value they can take. The others reach values at positions 512 to 4000 that training
# never produced.

# %% slideshow={"slide_type": "fragment"}
seen_all_values = wavelengths <= 512
print(f"pairs that turn fully within 512 positions: {int(seen_all_values.sum())} of "
      f"{len(wavelengths)}")
print(f"pairs that meet new values beyond 512:       {int((~seen_all_values).sum())}")
print(f"pairs that do not turn fully even in 4000:   {int((wavelengths > 4000).sum())}")
figure, axis = plt.subplots(figsize=(8, 4.5))
axis.semilogy(wavelengths, label="wavelength of pair i")
axis.axhline(512, color="tab:orange", linestyle="--", label="trained length 512")
axis.axhline(4000, color="tab:red", linestyle=":", label="asked-for length 4000")
axis.set(title="Wavelengths of the sinusoidal pairs, d = 512", xlabel="pair index i",
         ylabel="wavelength (positions, log scale)")
axis.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 10. Explore the sinusoidal table (optional)
#
# The drawing below shows the table (left) and how alike one chosen position's vector is to every
# other position's (right, cosine). First as a still figure, then as a widget: change `d_model`,
# the `base` and the chosen position, and watch the waves and the similarity curve move. A small
# base makes every pair turn fast, so far-away positions start to look alike.

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "10.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def draw_positions(d_model: int, base: float, position: int, n_positions: int = 64) -> dict[str,
        torch.Tensor]:
    """Draw the sinusoidal table and the cosine of `position`'s row with every row; return both."""
    table = sinusoidal_positions(n_positions, d_model, base)  # (n_positions, d_model)
    similarity = cosine_similarity(table[position], table)  # (n_positions,)
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), layout="constrained")
    image = left.imshow(table.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, origin="lower")
    left.grid(False)
    figure.colorbar(image, ax=left, label="value")
    left.axvline(position, color="black", linewidth=1.5)
    left.set(title=f"Sinusoidal table, d_model = {d_model}, base = {base:g}",
             xlabel="position", ylabel="dimension")
    right.plot(similarity)
    right.axvline(position, color="black", linewidth=1.5, linestyle="--")
    right.set(title=f"Cosine with position {position}", xlabel="position", ylabel="cosine",
              ylim=(-1.05, 1.05))
    return {"table": table, "similarity": similarity}


draw_positions(d_model=32, base=10000.0, position=20)
plt.show()

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds model ids that change on every run; the figure above is the same
# drawing.
from helpers.lab.widgets import Explorer

explorer = Explorer(
    draw_positions,
    d_model=widgets.IntSlider(value=32, min=4, max=128, step=4, description="d_model"),
    base=widgets.FloatLogSlider(value=10000.0, base=10, min=1, max=5, step=0.5, description="base"),
    position=widgets.IntSlider(value=20, min=0, max=63, description="position"),
)
explorer

# %% [markdown] slideshow={"slide_type": "subslide"}
# Moving the controls really redraws the picture: a smaller base changes the table, a wider
# `d_model` adds columns, and the similarity curve peaks wherever the chosen position is.

# %% slideshow={"slide_type": "fragment"}
first = explorer.reset()
smaller_base = explorer.set(base=100.0)
assert not torch.allclose(first["table"], smaller_base["table"])
wider = explorer.set(d_model=64)
assert wider["table"].shape == (64, 64) and first["table"].shape == (64, 32)
moved = explorer.set(position=40)
assert int(moved["similarity"].argmax()) == 40
print("redraws so far:", explorer.redraws)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 11. Token + position: the input of the Transformer (core)
#
# The model's input is the token's vector plus its position's vector, entry by entry (the USF
# notes mention concatenation too, but adding keeps `d_model` unchanged and is what GPT-2 and the
# original Transformer do). The Matrix Magic notes add their token rows for "I like to eat" to
# their learned position rows. Computed next to the slide:

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "11.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
# the Matrix Magic notes, "Token Embeddings (4,8) + Position Embeddings (4,8)"
SLIDE_SUM_TABLE = torch.tensor([
    [0.68, 0.54, 0.06, 0.65, 0.23, 1.45, 0.76, 0.84],
    [0.43, 1.22, 1.13, 1.49, 1.04, 1.09, 0.65, 0.62],
    [1.20, 0.66, 1.08, 1.50, 0.54, 0.91, 0.94, 0.16],
    [1.80, 0.92, 0.84, 0.14, 0.72, 0.94, 1.93, 0.76],
], dtype=torch.float64)
sum_by_hand = token_embedding(batch) + position_embedding(torch.arange(BLOCK_SIZE))  # (4, 8)
mismatches = compare_with_slide(sum_by_hand.detach(), SLIDE_SUM_TABLE,
                                ["I @0", "like @1", "to @2", "eat @3"], DIMS, decimals=2)
print(f"{len(mismatches)} of {SLIDE_SUM_TABLE.numel()} entries on the slide are not the sums of "
      f"its own inputs")
errors = (sum_by_hand - SLIDE_SUM_TABLE).abs()
print("sizes of those errors:", sorted({round(e, 4) for e in errors[errors > 0.005].tolist()}))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Each of those entries is off by exactly 0.01: the slide most likely added the unrounded random
# numbers and printed the sum rounded, while it printed the two inputs rounded too (0.00 + 0.05
# shown as 0.06). The sums of the printed inputs are the computed column.
#
# ### Exercise 5: the input layer
# Package the two learned tables as the first layer of a Transformer. Write the class
# `TokenAndPosition(vocab_size, context_length, d_model)`: in `__init__`, a token table
# `self.token` (a row per token) and a position table `self.position` (a row per position), both
# `nn.Embedding`; in `forward(token_ids)`, for ids of shape (batch, seq_len) or (seq_len,), the
# token vectors plus the vectors of positions 0, 1, ... seq_len - 1, shape (..., seq_len,
# d_model). Unlike a bare `nn.Embedding`, it should say what is wrong when the input does not
# fit: raise a `ValueError` naming `token_ids`, what it holds and what was expected, for ids of
# another shape, a sequence longer than `context_length`, or an id outside the vocabulary. The
# cells below load the slide's tables into your layer and feed it two inputs that do not fit.
#
# <details><summary>Hint 1: the idea</summary>
#
# A token's place in the sequence is its position, whatever its id: look the ids up in the token
# table and the positions up in the position table, and add the two.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) In the constructor, one table for the tokens and
# one for the positions. (2) In forward, first refuse, with a ValueError that says what it got, any
# input the tables cannot serve. (3) Look up the tokens and the positions of the sequence, and add
# the two; the positions broadcast over the batch.</details>
#
# <details><summary>Hint 3: closer</summary>Three refusals: not one or two dimensions; longer than
# the position table; an id below 0 or beyond the token table. The positions are 0, 1, 2 ... up to
# the length, made on the ids' device.</details>

# %% slideshow={"slide_type": "fragment"}
class TokenAndPosition(nn.Module):
    """token_ids (batch, seq_len) or (seq_len,) -> token vector + position vector, (..., seq_len,
    d_model)."""

    def __init__(self, vocab_size: int, context_length: int, d_model: int) -> None:
        super().__init__()
        ### BEGIN SOLUTION
        self.token = nn.Embedding(vocab_size, d_model)  # row i: the vector of token i
        self.position = nn.Embedding(context_length, d_model)  # row p: the vector of position p
        ### END SOLUTION

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        if token_ids.dim() not in (1, 2):
            raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}, "
                             "expected (batch, seq_len) or (seq_len,)")
        seq_len, context_length = token_ids.shape[-1], self.position.num_embeddings
        if seq_len > context_length:
            raise ValueError(f"token_ids has {seq_len} positions, expected at most context_length "
                             f"= "
                             f"{context_length}: the position table has no row for the later ones")
        vocab_size = self.token.num_embeddings
        if token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= vocab_size):
            raise ValueError(f"token_ids holds ids from {token_ids.min()} to {token_ids.max()}, "
                             f"expected ids from 0 to vocab_size - 1 = {vocab_size - 1}")
        positions = torch.arange(seq_len, device=token_ids.device)  # (seq_len,)
        return self.token(token_ids) + self.position(positions)  # (..., seq_len, d) + (seq_len, d)
        ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("embeddings.token_and_position", TokenAndPosition)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The next cell builds the layer from your class once it passes its check, and from the course's
# `TokenAndPositionEmbedding` (in `helpers.model.embeddings`) until then, saying which. Loaded with
# the slide's numbers it gives the computed sum, for a whole batch of shape (batch, seq_len):

# %% slideshow={"slide_type": "fragment"}
from helpers.model.embeddings import TokenAndPositionEmbedding

InputLayer = yours_or("embeddings.token_and_position", TokenAndPosition, TokenAndPositionEmbedding)
embed = InputLayer(vocab_size=12, context_length=BLOCK_SIZE, d_model=8).double()
with torch.no_grad():
    embed.token.weight.copy_(SLIDE_TOKEN_TABLE)
    embed.position.weight.copy_(SLIDE_POSITION_TABLE)
x = embed(batch.unsqueeze(0))  # (1, 4) -> (1, 4, 8)
assert torch.allclose(x[0], sum_by_hand)
print("input of shape", tuple(batch.unsqueeze(0).shape), "-> embeddings of shape", tuple(x.shape))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Unlike a bare `nn.Embedding` it explains what is wrong when the input does not fit: the soup
# sentence is 16 tokens long, and 12 is not an id of the 12-token vocabulary.

# %% slideshow={"slide_type": "fragment"}
for bad_input in (ids, torch.tensor([[0, 12]])):
    try:
        embed(bad_input)
    except ValueError as error:
        print("ValueError:", error)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Learned or sinusoidal? Learned positions cost `context_length x d_model` parameters and stop at
# the context length; sinusoids cost nothing and have a row for any position, though a model
# meets new values beyond the lengths it was trained on (section 9). GPT-2 learns its positions;
# most recent models use rotary embeddings (RoPE), which rotate queries and keys instead of
# adding a vector.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. Why does the Transformer use positional encoding?** (the USF notes)
#
# <details><summary>Answer</summary>
#
# Self-attention is permutation equivariant: reorder the inputs and the outputs are reordered the
# same way, nothing more. In section 6, "the cat sat" and "sat cat the" gave every word the same
# output, and "the cat sat" and "cat the sat" the same last output.
# Adding a position vector to each token makes the same word at a different place a different
# input, and all those comparisons then differ.
# </details>

# %% slideshow={"slide_type": "fragment"}
catch_up("02_embeddings", "Check")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
print("without positions:", without_positions)
print("with positions:   ", with_positions)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. Remove positional encoding entirely. For "the cat sat" vs "sat cat the", will (a) the
# per-position outputs, (b) the bag of outputs, (c) the next-token prediction be the same?**
# (the textbook section)
#
# <details><summary>Answer</summary>
#
# (a) No: position 0 holds a different word in each. (b) Yes: the outputs are the same vectors,
# reordered. (c) Not for these two, because the last word differs ("sat" vs "the"); but any two
# orders that end with the same word, like "the cat sat" and "cat the sat", get exactly the same
# prediction, which is what makes a model without positions useless for language. The computed
# answers are the `without_positions` line above.
# </details>
#
# **3. With d = 512, what is the wavelength of (a) the lowest-frequency pair, (b) the
# highest-frequency pair? (c) Will a model trained on length 512 cope with length 4000?**
# (the textbook section)
#
# <details><summary>Answer</summary>
#
# (a) 2 pi x 10000^(510/512), about 60,611 positions. (b) 2 pi, about 6.28 positions. (c) Only
# partly: 123 of the 256 pairs turn fully within 512 positions, so they show nothing new later;
# the other 133 reach values at positions 512 to 4000 that training never produced, and 76 of them
# do not turn fully even by 4000. Models therefore degrade beyond their training length. Newer
# position schemes do not remove the problem by themselves: ALiBi was designed to extrapolate
# (its bias keeps growing with distance in the same way at any length), but RoPE, which most
# recent models use, also degrades beyond its training length unless its rotation frequencies are
# rescaled (position interpolation, YaRN), usually with some fine-tuning at the longer length.
# </details>

# %% slideshow={"slide_type": "fragment"}
print(f"(a) {wavelengths[-1]:,.0f}  (b) {wavelengths[0]:.2f}  (c) {int(seen_all_values.sum())} "
      f"pairs seen in full, "
      f"{int((~seen_all_values).sum())} not, {int((wavelengths > 4000).sum())} not even by 4000")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. Why does `nn.Embedding` look rows up instead of multiplying by one-hot vectors, when the
# two give the same numbers?**
#
# <details><summary>Answer</summary>
#
# The product does V x d multiply-adds per token, almost all by zero, and first builds a V-long
# one-hot vector per token: at GPT-2's size that is 50,257 x 768, about 38.6 million multiply-adds
# per token, to copy 768 numbers. The lookup copies them directly and gives the same values and
# the same gradients.
# </details>

# %% slideshow={"slide_type": "fragment"}
print(f"multiply-adds per token: {GPT2_VOCAB * GPT2_D_MODEL / 1e6:.1f} million, numbers copied: "
      f"{GPT2_D_MODEL}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **5. A model with a learned position table of 1024 rows gets a 1025-token input. What
# happens, and what would a sinusoidal table do?**
#
# <details><summary>Answer</summary>
#
# There is no row for position 1024, so the lookup fails (our helper says so; a bare
# `nn.Embedding` raises an IndexError). A sinusoidal table simply has a row for position 1024,
# though the model never saw it during training. GPT-2's learned table holds
# 1024 x 768 = 786,432 parameters.
# </details>

# %% slideshow={"slide_type": "fragment"}
gpt2_positions = TokenAndPositionEmbedding(vocab_size=10, context_length=1024, d_model=GPT2_D_MODEL)
print(f"parameters in GPT-2's position table: {gpt2_positions.position.weight.numel():,}")
try:
    gpt2_positions(torch.zeros(1, 1025, dtype=torch.long))
except ValueError as error:
    print("ValueError:", error)
row_1024 = sinusoidal_positions(1025, GPT2_D_MODEL)[1024, :4]
print("sinusoidal row 1024, first 4 numbers:", [round(v, 4) for v in row_1024.tolist()])
