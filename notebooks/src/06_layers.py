# %% [markdown] slideshow={"slide_type": "slide"}
# # 6. LayerNorm, feed-forward networks and residual connections
#
# Attention moves information between tokens. The rest of a transformer block works on each token
# alone: a LayerNorm keeps its features at a steady scale, a feed-forward network (FFN) transforms
# them, and residual connections add each result back onto a running sum, the residual stream.
# This notebook builds each piece, measures why it is there, and assembles the block that the GPT
# of notebook 7 stacks.
#
# **After this notebook you can**
# - write LayerNorm by hand and match `nn.LayerNorm` exactly (biased variance, `eps`), and say
#   why transformers use it rather than BatchNorm;
# - build the FFN `D -> 4D -> D` with ReLU, GELU or SwiGLU and count its parameters;
# - show with numbers why residual connections make deep stacks trainable, how the residual stream
#   grows with Pre-LN and Post-LN, and initialise a stack as GPT-2 does, with `1/sqrt(2N)` on the
#   projections that write into the stream;
# - answer "can the FFN be replaced by attention?" with a measurement;
# - write the Pre-LN and the Post-LN block from their parts, and use the `Block` of
#   `helpers.model.layers`.
#
# **It assumes** notebook 5 (multi-head attention) and basic PyTorch (`nn.Module`, `backward`).

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from helpers.lab.exercises import check
from helpers.lab.plots import heatmap
from helpers.lab.sections import catch_up

# The tensors here are tiny: one thread is faster than splitting each product across several.
torch.set_num_threads(1)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. LayerNorm by hand (core)
#
# LayerNorm standardises each token on its own: subtract the mean of its `D` features, divide by
# their standard deviation, then scale by a learned `gamma` and shift by a learned `beta`
# (both of shape `D`):
#
# `y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta`
#
# Two details decide whether a hand-written version matches PyTorch's: the variance is the
# **biased** one (divide by `D`, not `D - 1`), and `eps` sits **inside** the square root.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: LayerNorm
#
# Write `my_layer_norm(x, weight, bias, eps)`: `x` is `(..., D)`, `weight` (gamma) and `bias` (beta)
# are `(D,)`, and the result has the shape of `x`. The checker compares with `F.layer_norm` and
# tries a token whose features are all equal. The cells after it measure your function against
# `nn.LayerNorm`, and what the two details change.
#
# <details><summary>Hint 1: the idea</summary>
#
# Each token's features are standardised on their own: subtract their mean, divide by their
# standard deviation, then scale and shift.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Each token's mean and biased variance over its own
# features. (2) Standardise the token with them, eps inside the square root. (3) Scale by the weight
# and shift by the bias.</details>
#
# <details><summary>Hint 3: closer</summary>Keep the reduced axis (size 1) so that the statistics
# broadcast over the features; the biased variance divides by D, not D - 1.</details>

# %% slideshow={"slide_type": "fragment"}
def my_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """x: (..., D); weight, bias: (D,) -> (..., D), each token standardised over its own D
    features."""
    ### BEGIN SOLUTION
    mean = x.mean(dim=-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # divide by D: the biased variance
    return (x - mean) / torch.sqrt(variance + eps) * weight + bias
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("layers.layer_norm", my_layer_norm)

# %% [markdown] slideshow={"slide_type": "subslide"}
# From here on the notebook normalises with `norm`: your `my_layer_norm` once it passes its check,
# the course's `helpers.model.layers.layer_norm` until then. The cell compares it with
# `nn.LayerNorm` (with random `gamma` and `beta`), then shows what each of the two details changes.

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises import yours_or
from helpers.model.layers import layer_norm

norm = yours_or("layers.layer_norm", my_layer_norm, layer_norm)

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
x = torch.randn(2, 5, 8) * 3 + 1  # (B, N, D)
reference = nn.LayerNorm(8)
with torch.no_grad():
    reference.weight.normal_()
    reference.bias.normal_()
mine = norm(x, reference.weight, reference.bias, 1e-5)
assert torch.allclose(mine, reference(x), atol=1e-6)
print("norm == nn.LayerNorm:", torch.allclose(mine, reference(x), atol=1e-6))

# %% slideshow={"slide_type": "fragment"}
unbiased = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True)
                                                       + 1e-5) * reference.weight + reference.bias
print(f"with the unbiased variance (D - 1) instead: largest difference "
      f"{(unbiased - reference(x)).abs().max():.4f}")

# %% slideshow={"slide_type": "fragment"}
constant_token = torch.full((1, 8), 3.0)  # every feature equal: variance 0
no_eps = (constant_token - constant_token.mean()) / constant_token.std(correction=0)
print("constant token without eps:", no_eps[0, :3], "...  with eps:",
      norm(constant_token, torch.ones(8), torch.zeros(8), 1e-5)[0, :3], "...")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Dividing by `D - 1` makes every output a factor `sqrt((D-1)/D)` too small (the printed
# difference), and without `eps` a token whose features are all equal becomes `0/0 = nan`.
#
# ### The LayerNorm table of the Matrix Magic notes, reproduced and corrected
#
# The Matrix Magic notes normalise a 4 x 8 matrix (the attention output plus the embeddings of "I like to
# eat") with `eps = 0.001` and prints the mean, the standard deviation and the normalised rows.
# Its mean column agrees to rounding, but the normalised rows do not follow from its own inputs: each should
# have mean 0 and standard deviation 1.

# %% slideshow={"slide_type": "fragment"}
MATRIX_MAGIC_INPUT = torch.tensor([[11.66, 11.78, 13.64, 12.59, 8.05, 10.62, 14.73, 13.10],
                           [19.28, 21.05, 24.34, 22.30, 15.49, 13.45, 22.48, 17.65],
                           [21.42, 17.99, 23.38, 21.38, 14.47, 14.51, 22.37, 17.25],
                           [22.28, 18.14, 24.14, 22.37, 15.86, 16.61, 23.89, 18.85]])
MATRIX_MAGIC_MEAN = torch.tensor([12.02, 19.51, 19.10, 20.27])
MATRIX_MAGIC_STD = torch.tensor([2.05, 3.76, 3.52, 3.29])
MATRIX_MAGIC_NORMALISED = torch.tensor([[-0.25, -0.17, 1.13, 0.40, -2.78, -0.98, 1.89, 0.75],
                                [-0.12, 0.80, 2.50, 1.44, -2.07, -3.12, 1.54, -0.96],
                                [1.24, -0.59, 2.28, 1.22, -2.47, -2.44, 1.74, -0.98],
                                [1.11, -1.17, 2.13, 1.16, -2.43, -2.02, 2.00, -0.78]])
MATRIX_MAGIC_EPS = 0.001

mean = MATRIX_MAGIC_INPUT.mean(-1)
biased_std = MATRIX_MAGIC_INPUT.std(-1, correction=0)
unbiased_std = MATRIX_MAGIC_INPUT.std(-1)
print("row  notes mean  mean   notes std  std (÷D)  std (÷(D-1))")
for i in range(4):
    print(f"{i + 1:>3} {MATRIX_MAGIC_MEAN[i]:>10.2f} {mean[i]:>6.2f} {MATRIX_MAGIC_STD[i]:>9.2f} "
          f"{biased_std[i]:>9.2f} "
          f"{unbiased_std[i]:>13.2f}")

# %% slideshow={"slide_type": "fragment"}
correct = norm(MATRIX_MAGIC_INPUT, torch.ones(8), torch.zeros(8), MATRIX_MAGIC_EPS)
assert torch.allclose(correct, F.layer_norm(MATRIX_MAGIC_INPUT, (8,), eps=MATRIX_MAGIC_EPS),
                      atol=1e-6)
print(f"correct normalised rows (nn.LayerNorm, eps = {MATRIX_MAGIC_EPS}):\n",
      correct.round(decimals=2))
print("the Matrix Magic notes' rows:\n", MATRIX_MAGIC_NORMALISED)
print("std of each row, correct:", correct.std(-1, correction=0).round(decimals=2),
      " notes:", MATRIX_MAGIC_NORMALISED.std(-1, correction=0).round(decimals=2))

what_the_notes_did = (MATRIX_MAGIC_INPUT - mean[:, None]) / torch.sqrt(MATRIX_MAGIC_STD[:, None]
                                                                       + MATRIX_MAGIC_EPS)
gap = (what_the_notes_did - MATRIX_MAGIC_NORMALISED).abs().max()
print(f"(x - mean) / sqrt(notes std + eps) matches the notes' rows to {gap:.3f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Two things went wrong in the notes, and the cells above show both. Their standard deviation
# column is the unbiased one (divide by `D - 1`), which LayerNorm does not use. And their normalised
# rows equal `(x - mean) / sqrt(std + eps)` to within rounding: the slide put the standard deviation
# where the formula wants the variance, so its rows have standard deviation between 1.34 and 1.81
# instead of 1.
#
# The course's `helpers.model.layers.layer_norm` and the module `helpers.model.layers.LayerNorm`
# (learned `weight` = gamma starting at 1, `bias` = beta starting at 0) compute the same. The cell
# checks the module against `nn.LayerNorm` with the same parameters, and the function against `norm`.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.layers import LayerNorm

ours = LayerNorm(8)
ours.load_state_dict(reference.state_dict())
assert torch.allclose(ours(x), reference(x), atol=1e-6)
assert torch.allclose(layer_norm(x, reference.weight, reference.bias), mine, atol=1e-6)
print("helpers.model.layers.LayerNorm == nn.LayerNorm:", torch.allclose(ours(x), reference(x),
                                                                        atol=1e-6))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. BatchNorm vs LayerNorm (optional)
#
# BatchNorm standardises each **feature** over the examples of a batch; LayerNorm standardises each
# **token** over its own features. The DS 246 notes compare them:
#
# | | BatchNorm | LayerNorm |
# |---|---|---|
# | statistics over | the batch, one feature at a time | one token's features |
# | small batches | its statistics get noisy, and a batch of 1 has none | no effect: each token alone |
# | training vs inference | batch statistics in training, running averages in inference | the same computation in both |
#
# The cell measures each row of that table. It takes one token (8 features) and normalises it
# alone (batch size 1), inside a batch of 64, and inside a different batch of 64, in training and
# in evaluation mode.

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
batch = torch.randn(64, 8) * 3 + 5     # 64 tokens, 8 features
other_batch = torch.randn(64, 8) * 3 + 5
other_batch[0] = batch[0]              # the same first token, different company
token = batch[:1]                      # (1, 8)


def normalise_token_0(layer: nn.Module, rows: torch.Tensor, train: bool) -> torch.Tensor | str:
    """layer's output for the first row of `rows`, or the error it raises."""
    layer.train(train)
    try:
        return layer(rows)[0]
    except (ValueError, RuntimeError) as error:
        return f"error: {error}"


# %% slideshow={"slide_type": "fragment"}
for layer in (nn.LayerNorm(8), nn.BatchNorm1d(8)):
    name = type(layer).__name__
    with torch.no_grad():
        in_batch = normalise_token_0(layer, batch, train=True)
        in_other = normalise_token_0(layer, other_batch, train=True)
        alone = normalise_token_0(layer, token, train=True)
        evaluated = normalise_token_0(layer, batch, train=False)
    print(f"{name}:")
    print(f"  batch of 64 vs another batch of 64 (train): largest change "
          f"{(in_batch - in_other).abs().max():.4f}")
    alone_text = alone if isinstance(alone,
            str) else f"largest change {(in_batch - alone).abs().max():.4f}"
    print(f"  batch of 64 vs batch of 1 (train):          {alone_text}")
    print(f"  train vs eval mode (batch of 64):           largest change "
          f"{(in_batch - evaluated).abs().max():.4f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# LayerNorm gives the token the same output in every case (changes of 0). BatchNorm's output for
# the same token depends on which other tokens share its batch, it refuses a batch of one in
# training, and evaluation mode (running averages, here after just two batches) gives yet another
# answer. For text, where sequences have different lengths, batches may be tiny and a model
# generates one token at a time, LayerNorm is the practical choice.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. The feed-forward network (optional)
#
# After attention, every token passes through the same small MLP, on its own: `D -> 4D -> D` with
# a non-linearity in the middle (the USF notes call it a two-layer MLP). The non-linearity has changed
# over the years: ReLU in 2017, GELU in GPT-2, and SwiGLU (a gated unit with the SiLU function)
# in Llama and most recent models.

# %% slideshow={"slide_type": "fragment"}
catch_up("06_layers", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
z = torch.linspace(-4, 4, 401)
fig, ax = plt.subplots(figsize=(8, 4.5))
ax.plot(z, F.relu(z), label="ReLU: max(0, z)")
ax.plot(z, F.gelu(z), label="GELU: z · Φ(z)")
ax.plot(z, F.silu(z), "--", label="SiLU (Swish): z · sigmoid(z)")
ax.set(title="Activation functions of the FFN", xlabel="input z", ylabel="activation(z)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# GELU and SiLU are smooth versions of ReLU that let a little negative signal through. SwiGLU
# uses three matrices: `down(silu(x W_gate) * (x W_up))`. The gate decides, feature by feature, how
# much of the second projection passes. To keep the parameter count of a `4D` MLP (`8D²`), its
# hidden size is `2/3 · 4D = 8D/3`.
#
# **Exact GELU and GPT-2's GELU.** GELU is `z · Φ(z)`, where `Φ` is the standard normal
# cumulative distribution, computed with the error function: `Φ(z) = (1 + erf(z / sqrt 2)) / 2`.
# GPT-2 (like BERT) used a cheaper approximation with `tanh`,
# `0.5 · z · (1 + tanh(sqrt(2/π) · (z + 0.044715 · z³)))`, which PyTorch computes with
# `F.gelu(z, approximate="tanh")`. The cell checks both formulas against PyTorch and measures how
# far apart they are:

# %% slideshow={"slide_type": "fragment"}
z64 = torch.linspace(-6, 6, 12_001, dtype=torch.float64)
exact = F.gelu(z64)
tanh_approximation = F.gelu(z64, approximate="tanh")
assert torch.allclose(exact, z64 * 0.5 * (1 + torch.erf(z64 / math.sqrt(2))), atol=1e-12)
assert torch.allclose(tanh_approximation,
                      0.5 * z64 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z64 + 0.044715
                                                                            * z64**3))), atol=1e-12)
gelu_gap = (exact - tanh_approximation).abs()
print(f"largest |GELU(z) - GELU_tanh(z)| for z in [-6, 6]: {gelu_gap.max():.1e}, "
      f"at z = ±{z64[gelu_gap.argmax()].abs():.2f} (the gap is even in z)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The two never differ by more than the printed gap, invisible in the plot. But every FFN of a
# model applies it, so a model run with the other GELU than it was trained with computes slightly
# different logits: GPT-2's weights must be run with the tanh form (the GPT-2 presets of
# `helpers.model.gpt.GPTConfig` in notebook 7 choose it).
#
# `helpers.model.layers` has both: `FeedForward(d_model, hidden=4·d_model, activation="relu" | "gelu")`
# and `SwiGLUFeedForward(d_model, hidden=8·d_model//3)`. The cell counts their parameters for
# GPT-2 small's `D = 768` without allocating any weights (on PyTorch's `meta` device, where tensors
# have shapes but no memory) and compares with the formulas.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.layers import FeedForward, SwiGLUFeedForward
from helpers.model.multihead import MultiHeadAttention


def n_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


D = 768
with torch.device("meta"):
    counts = {"FFN, ReLU": n_parameters(FeedForward(D, activation="relu")),
              "FFN, GELU": n_parameters(FeedForward(D, activation="gelu")),
              "SwiGLU (8D/3)": n_parameters(SwiGLUFeedForward(D)),
              "attention": n_parameters(MultiHeadAttention(D, n_heads=12))}
formulas = {"FFN, ReLU": 8 * D**2 + 5 * D, "FFN, GELU": 8 * D**2 + 5 * D,
            "SwiGLU (8D/3)": 3 * D * (8 * D // 3), "attention": 4 * D**2 + 4 * D}
for name, count in counts.items():
    assert count == formulas[name]
    print(f"{name:<14} {count:>10,} parameters  (formula: {formulas[name]:,})")
print(f"D = {D}: 8·D² = {8 * D**2:,}; the FFN holds "
      f"{counts['FFN, GELU'] / (counts['FFN, GELU'] + counts['attention']):.1%} "
      "of the block's attention + FFN parameters")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The two-matrix FFN has `8D² + 5D` parameters (two weight matrices `D x 4D` and `4D x D`,
# biases `4D + D`); attention has `4D² + 4D`. So about two thirds of a block's parameters sit in its
# FFN (the share printed above). SwiGLU with hidden size `8D/3` and no biases lands on exactly
# `8D²` for this `D`.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: SwiGLU
#
# Write `my_swiglu(x, w_gate, w_up, w_down)` with weights in the mathematical layout: `x` is
# `(..., D)`, `w_gate` and `w_up` are `(D, hidden)`, `w_down` is `(hidden, D)`; the result is
# `(..., D)`. The cell after the check runs your function on the weights of the course's
# `SwiGLUFeedForward` and compares the two.
#
# <details><summary>Hint 1: the idea</summary>
#
# Two projections of x: one goes through SiLU and gates the other element by element; a third
# projects back.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Two projections of x to the hidden size, the gate
# and the up one. (2) Only the gate goes through SiLU, and it multiplies the other element by
# element. (3) Project the result back with the down matrix.</details>

# %% slideshow={"slide_type": "fragment"}
def my_swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
              w_down: torch.Tensor) -> torch.Tensor:
    """x: (..., D); w_gate, w_up: (D, hidden); w_down: (hidden, D) -> (..., D)."""
    ### BEGIN SOLUTION
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("layers.swiglu", my_swiglu)

# %% slideshow={"slide_type": "fragment"}
def course_swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                  w_down: torch.Tensor) -> torch.Tensor:
    """The course's version: a SwiGLUFeedForward holding these weights. x (..., D) -> (..., D)."""
    module = SwiGLUFeedForward(w_gate.shape[0], hidden=w_gate.shape[1])
    with torch.no_grad():
        for linear, weight in ((module.gate, w_gate), (module.up, w_up), (module.down, w_down)):
            linear.weight.copy_(weight.T)  # nn.Linear keeps (out, in): the transpose
    return module(x)


swiglu = yours_or("layers.swiglu", my_swiglu, course_swiglu)
torch.manual_seed(5)
swiglu_ffn = SwiGLUFeedForward(16)  # hidden 8 * 16 // 3 = 42
tokens_in = torch.randn(2, 5, 16)
with torch.no_grad():
    by_weights = swiglu(tokens_in, swiglu_ffn.gate.weight.T, swiglu_ffn.up.weight.T,
                        swiglu_ffn.down.weight.T)
    torch.testing.assert_close(by_weights, swiglu_ffn(tokens_in))
print("SwiGLU from the module's weights, transposed to (in, out), == SwiGLUFeedForward:",
      tuple(tokens_in.shape), "->", tuple(by_weights.shape))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Dropout: on in training, off in evaluation
#
# Dropout zeroes each value with probability `p` during training and multiplies the survivors by
# `1 / (1 - p)`, so that the mean stays the same; in evaluation mode, and so at inference, it does
# nothing (the Matrix Magic notes). `model.train()` and `model.eval()` switch every
# dropout inside a model at once.

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
dropout = nn.Dropout(p=0.5)
ones = torch.ones(100_000)
dropped = dropout.train()(ones)
print(f"train: {(dropped == 0).float().mean():.3f} of the values zeroed, survivors = "
      f"{dropped.max():.1f}, "
      f"mean {dropped.mean():.3f}")
print(f"eval:  unchanged: {torch.equal(dropout.eval()(ones), ones)}")

ffn = FeedForward(8, dropout=0.1)
x = torch.randn(4, 8)
ffn.train()
print("FFN in train mode, same input twice -> same output?", torch.equal(ffn(x), ffn(x)))
ffn.eval()
print("FFN in eval mode,  same input twice -> same output?", torch.equal(ffn(x), ffn(x)))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Residual connections and gradient flow (core)
#
# A residual connection adds a layer's input to its output: `x + f(x)` instead of `f(x)`. The
# gradient of `x + f(x)` with respect to `x` is `1 + f'(x)`: whatever `f` does, the `1` passes the
# gradient straight through. The cell builds 24 layers of `tanh(Linear(x))` with PyTorch's default
# initialisation, runs the same input through them with and without residuals, and measures the
# gradient norm that reaches each layer's weights.

# %% slideshow={"slide_type": "fragment"}
catch_up("06_layers", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
N_LAYERS, WIDTH = 24, 64
torch.manual_seed(0)
stack = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(N_LAYERS))
inputs = torch.randn(32, WIDTH)


def gradient_norms(residual: bool) -> list[float]:
    """Norm of the loss gradient w.r.t. each layer's weight, first layer first."""
    stack.zero_grad()
    h = inputs
    for layer in stack:
        h = h + torch.tanh(layer(h)) if residual else torch.tanh(layer(h))
    h.pow(2).mean().backward()
    return [layer.weight.grad.norm().item() for layer in stack]


plain, residual = gradient_norms(residual=False), gradient_norms(residual=True)
ratio = residual[0] / plain[0]
print(f"gradient norm at layer 1:  plain {plain[0]:.2e}   residual {residual[0]:.2e}   "
      f"ratio {ratio:.1e}, about 10^{round(math.log10(ratio))}")
print(f"gradient norm at layer {N_LAYERS}: plain {plain[-1]:.2e}   residual {residual[-1]:.2e}")

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(8, 4.5))
layer_numbers = range(1, N_LAYERS + 1)
ax.semilogy(layer_numbers, plain, "o-", label="tanh(Linear(x))")
ax.semilogy(layer_numbers, residual, "s-", label="x + tanh(Linear(x))")
ax.set(title=f"Gradient reaching each layer of a {N_LAYERS}-layer stack",
       xlabel="layer (1 = nearest the input)", ylabel="‖∂loss/∂W‖ (log scale)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Without residuals the gradient shrinks layer after layer on its way down, and the first layer
# receives about 10⁸ times less than with residuals (the ratio printed above): it would barely
# learn. With residuals every layer gets a gradient of the same order. This is the
# "gradient highway" of the textbook section, and the reason a transformer can stack dozens of blocks.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Pre-LN vs Post-LN: how the residual stream grows (core)
#
# Where the LayerNorm goes matters. The 2017 Transformer normalises after the addition, **Post-LN**:
# `x = LN(x + f(x))`. GPT-2 and nearly every model since normalise the input of each branch,
# **Pre-LN**: `x = x + f(LN(x))`, and leave the residual stream itself alone.
#
# The textbook section's exercise: if each sub-layer's output has standard deviation 1, what is
# the stream's standard deviation after `L` layers? Post-LN renormalises after every layer, so it
# stays 1. Pre-LN adds roughly independent unit-variance terms to a unit-variance input, so the
# variance is 1 plus the number of terms. The notes answer `sqrt(1 + 4) ≈ 2.24` for `L = 4`: one
# term per layer. But each layer has two sub-layers, attention and the FFN, and each adds to the
# stream; taken at its word, the question gives `2L` terms and `sqrt(1 + 8) = 3`. The cell
# measures both readings with branches that match the assumption (a random linear map with
# weights of variance `1/D` after a LayerNorm gives unit-std outputs), and then the real attention
# and FFN branches of `helpers.model.layers.Block` at PyTorch's default initialisation.

# %% slideshow={"slide_type": "fragment"}
catch_up("06_layers", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.layers import Block

DEPTH = 24


def stream_stds_unit_branches(pre_norm: bool, branches_per_layer: int = 1, width: int = 128,
                              n_tokens: int = 256) -> list[float]:
    """Std of the stream after each of DEPTH layers, each of whose branches outputs unit-std
    values."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_tokens, width, generator=g)
    stds = [x.std().item()]
    for _ in range(DEPTH):
        for _ in range(branches_per_layer):
            branch = torch.randn(width, width, generator=g) / math.sqrt(width)  # unit-std output
            x = x + layer_norm(x) @ branch if pre_norm else layer_norm(x + x @ branch)
        stds.append(x.std().item())
    return stds

# %% slideshow={"slide_type": "fragment"}
@torch.no_grad()
def stream_stds_blocks(blocks: list[nn.Module], x: torch.Tensor) -> list[float]:
    """Std of the stream after each block."""
    stds = [x.std().item()]
    for block in blocks:
        x = block(x)
        stds.append(x.std().item())
    return stds


# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
x0 = torch.randn(2, 16, 64)
curves = {
    "Pre-LN, unit-std branches": stream_stds_unit_branches(pre_norm=True),
    "Post-LN, unit-std branches": stream_stds_unit_branches(pre_norm=False),
    "Pre-LN Blocks (default init)": stream_stds_blocks([Block(64, 4) for _ in range(DEPTH)], x0),
    "Post-LN Blocks (default init)": stream_stds_blocks(
        [Block(64, 4, pre_norm=False) for _ in range(DEPTH)], x0
    ),
}
pre = curves["Pre-LN, unit-std branches"]
pre_two = stream_stds_unit_branches(pre_norm=True, branches_per_layer=2)  # attention and FFN
print(" L   sqrt(1+L)   Pre-LN measured   Post-LN measured   sqrt(1+2L)   Pre-LN, 2 sub-layers")
for depth in (1, 2, 4, 8, 16, 24):
    print(f"{depth:>2} {math.sqrt(1 + depth):>11.3f} {pre[depth]:>17.3f} "
          f"{curves['Post-LN, unit-std branches'][depth]:>18.3f} {math.sqrt(1 + 2 * depth):>12.3f} "
          f"{pre_two[depth]:>21.3f}")

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(9, 5))
depths = range(DEPTH + 1)
ax.plot(depths, [math.sqrt(1 + d) for d in depths], "k:", label="sqrt(1 + L), the textbook section")
for (name, stds), style in zip(curves.items(), ["o-", "s-", "^-", "v-"], strict=True):
    ax.plot(depths, stds, style, markersize=5, label=name)
ax.set(title="Residual-stream standard deviation through the stack",
       xlabel="layers L", ylabel="std of the stream")
ax.legend(fontsize=11)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# With one unit-std branch per layer the measured Pre-LN stream follows `sqrt(1 + L)` (the notes'
# 2.24 at `L = 4` is in the table above), with two it follows `sqrt(1 + 2L)` (3 at `L = 4`), and
# Post-LN stays at 1. The notes' own reasoning ("each block adds something with std ~ 1") shows
# which they meant: one unit-std contribution per layer, the whole block's, not one per
# sub-layer as their question says. Real blocks at default initialisation add
# smaller branches, so their Pre-LN stream grows more slowly, but it still grows with depth while
# Post-LN is pinned to 1 (the two Post-LN curves lie on top of each other). Each real block has
# two branches (attention and FFN), so its `L` blocks add `2L` terms.
#
# Why Pre-LN trains more easily (the textbook section, part c): the stream is a plain sum, so the gradient
# flows back through the additions untouched, and each branch still sees a normalised input. In
# Post-LN the gradient must pass through a LayerNorm at every layer, and deep Post-LN models need a
# learning-rate warm-up to train at all (Xiong et al., 2020).

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Initialisation: Xavier, and GPT-2's `1/sqrt(2N)` (optional)
#
# The textbook section's standard initialisation is Xavier's (Glorot and Bengio, 2010): draw
# each weight with variance `2 / (fan_in + fan_out)`. A linear layer's output is a sum of `fan_in`
# products, so with unit-variance inputs its variance is `fan_in` times the weights' variance:
# `1/fan_in` keeps it at 1 going forward, `1/fan_out` keeps the gradients at 1 going back, and
# Xavier takes the compromise (the two agree for a square matrix). The cell pushes unit-variance
# inputs through 10 square linear layers of width 512, with Xavier's variance, with "naive"
# weights of variance 1, and with PyTorch's `nn.Linear` default (variance `1/(3 · fan_in)`), in
# float64.

# %% slideshow={"slide_type": "fragment"}
catch_up("06_layers", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
WIDTH_X, LAYERS_X = 512, 10
inits = {
    "Xavier, 2/(fan_in + fan_out)": lambda w: nn.init.xavier_normal_(w),
    "naive, N(0, 1)": lambda w: nn.init.normal_(w),
    "nn.Linear default": lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)),
}
torch.manual_seed(0)
x_in = torch.randn(2048, WIDTH_X, dtype=torch.float64)
print(f"{'initialisation':<30}{'variance after 1 layer':>24}{f'after {LAYERS_X}':>12}")
variances = {}
for name, init in inits.items():
    h, per_layer = x_in, []
    for _ in range(LAYERS_X):
        h = h @ init(torch.empty(WIDTH_X, WIDTH_X, dtype=torch.float64)).T
        per_layer.append(h.var().item())
    variances[name] = per_layer
    print(f"{name:<30}{per_layer[0]:>24.3g}{per_layer[-1]:>12.3g}")
assert 0.8 < variances["Xavier, 2/(fan_in + fan_out)"][-1] < 1.25

# %% [markdown] slideshow={"slide_type": "subslide"}
# Xavier keeps the variance near 1 through the whole stack; weights of variance 1 multiply it by
# about `fan_in = 512` per layer, and PyTorch's default divides it by about 3 per layer (the
# first column). In a transformer the LayerNorms rescale what each branch reads, so GPT-2 can use
# a plain `N(0, 0.02²)` for every weight and fix only the growth of the stream, as follows.
#
# ### GPT-2's `1/sqrt(2N)` on the residual projections
#
# GPT-2 draws every weight from `N(0, 0.02²)`, except the two projections that write into the
# stream in every block (attention's `W_O`, `out_proj`, and the FFN's second matrix, `down`),
# whose standard deviation is divided by `sqrt(2N)` for `N` blocks: two additions per block. Each
# addition then contributes `1/(2N)` of the variance it would otherwise, and the `2N` additions
# together add the same amount whatever the depth. Without the factor, the textbook section points out, the
# stream's variance grows in proportion to the depth.
#
# `helpers.model.layers.init_gpt2_(model, n_layers)` does this; first you write it.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: GPT-2's initialisation
#
# Write `my_gpt2_init(blocks, n_layers, std)`: `blocks` is an `nn.ModuleList` of `n_layers` Pre-LN
# `Block`s; initialise it in place as GPT-2 does and return it. Every `nn.Linear` weight is drawn
# from `N(0, std²)` and every `nn.Linear` bias set to 0, except that each block's two residual
# projections, `block.attn.out_proj.weight` and `block.mlp.down.weight`, are drawn with standard
# deviation `std / sqrt(2 · n_layers)`; the LayerNorms keep their ones and zeros. The checker
# measures the standard deviation of every weight; the cell after it builds stacks with your
# function and measures the stream.
#
# <details><summary>Hint 1: the idea</summary>
#
# Draw everything with the same small standard deviation first, then draw the two projections
# that add to the stream again, smaller, so that the `2N` additions together add a fixed amount.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) The residual standard deviation: std scaled down
# for the 2N additions to the stream. (2) Every linear layer drawn with std, its bias at zero. (3)
# Then, in each block, the two projections that write into the stream drawn again with the residual
# standard deviation.</details>
#
# <details><summary>Hint 3: closer</summary>std over the square root of twice the number of blocks;
# the two projections are attention's output projection and the FFN's down projection; nn.init has a
# function for each draw.</details>

# %% slideshow={"slide_type": "fragment"}
@torch.no_grad()
def my_gpt2_init(blocks: nn.ModuleList, n_layers: int, std: float = 0.02) -> nn.ModuleList:
    """GPT-2's initialisation of a stack of n_layers Pre-LN Blocks, in place; returns `blocks`."""
    ### BEGIN SOLUTION
    residual_std = std / math.sqrt(2 * n_layers)  # two additions to the stream per block
    for module in blocks.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for block in blocks:  # the two projections that write into the residual stream
        nn.init.normal_(block.attn.out_proj.weight, mean=0.0, std=residual_std)
        nn.init.normal_(block.mlp.down.weight, mean=0.0, std=residual_std)
    return blocks
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("layers.gpt2_init", my_gpt2_init)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The cell builds stacks of `N` Pre-LN blocks, initialises them with your `my_gpt2_init` (or the
# course's `init_gpt2_` until yours passes), with and without the `1/sqrt(2N)` factor, feeds them
# a stream of standard deviation 0.02 (like GPT-2's embeddings), and measures the stream at the
# top.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.layers import RESIDUAL_PROJECTIONS, init_gpt2_

gpt2_init = yours_or("layers.gpt2_init", my_gpt2_init, init_gpt2_)
STACK_DEPTHS = (1, 2, 4, 8, 16, 32)


def gpt2_stack(n_blocks: int, scale_residual: bool) -> list[Block]:
    """n_blocks Pre-LN blocks with GPT-2's init, with or without the 1/sqrt(2N) factor."""
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(64, 4) for _ in range(n_blocks))
    gpt2_init(blocks, n_blocks)
    if not scale_residual:
        for name, param in blocks.named_parameters():
            if name.endswith(RESIDUAL_PROJECTIONS):
                nn.init.normal_(param, std=0.02)
    return list(blocks)

# %% slideshow={"slide_type": "fragment"}
embeddings = 0.02 * torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
top_std = {scaled: [stream_stds_blocks(gpt2_stack(n, scaled), embeddings)[-1] for n in STACK_DEPTHS]
           for scaled in (False, True)}
print(" N   std at the top: N(0, 0.02)   with 1/sqrt(2N)")
for i, n in enumerate(STACK_DEPTHS):
    print(f"{n:>2} {top_std[False][i]:>28.4f} {top_std[True][i]:>17.4f}")
growth = {scaled: top_std[scaled][-1] / top_std[scaled][0] for scaled in (False, True)}
print(f"from N = 1 to N = 32 the top std grows x{growth[False]:.2f} without the factor, "
      f"x{growth[True]:.2f} with it (sqrt(32) = {math.sqrt(32):.2f})")

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(8, 4.5))
ax.plot(STACK_DEPTHS, top_std[False], "o-", label="all weights N(0, 0.02²)")
ax.plot(STACK_DEPTHS, top_std[True], "s-", label="residual projections ÷ sqrt(2N)")
ax.set_xscale("log", base=2)
ax.set_xticks(STACK_DEPTHS, labels=[str(n) for n in STACK_DEPTHS])
ax.set(title="GPT-2 initialisation: the stream at the top of N blocks",
       xlabel="number of blocks N (log scale)", ylabel="std of the residual stream")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# Without the factor the stream at the top keeps growing with depth (roughly like `sqrt(N)`: the
# variance gains a fixed amount per block). With it, the top of a 32-block stack looks like the
# top of a 1-block stack: the growth factors are printed above.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Can the FFN be replaced by attention? (optional)
#
# The USF notes ask this (an interview question, pointing to Dong et al., 2021, "Attention is not all
# you need: pure attention loses rank doubly exponentially with depth"). Each attention output is
# a weighted average of the value vectors. Average averages again and again and every token ends
# up with the same vector: the matrix of token representations collapses towards rank one.
#
# We measure how far the `N` token vectors are from all being equal: the size of what is left
# after subtracting the mean token, relative to the whole, `‖X - 1·meanᵀ‖ / ‖X‖`. It is 0 for
# `N` copies of one vector.

# %% slideshow={"slide_type": "fragment"}
catch_up("06_layers", "7.")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: distance from rank one
#
# Write `my_distance_from_rank_one(x)`: `x` is `(..., N, D)`, sets of `N` tokens; the result has
# one number per set, shape `(...)`: `‖X - 1·meanᵀ‖_F / ‖X‖_F`. The matrix `1·meanᵀ`, every row the
# mean token, is what an attention head computes when all its weights are `1/N`: the `N x N` matrix
# of `1/N`s times `X`. Use that, or subtract the mean token directly; the checker compares values.
# The deep-stack measurement after the check runs on your function.
#
# <details><summary>Hint 1: the idea</summary>
#
# Subtract the best rank-one approximation (the mean token repeated) and compare the size of what
# is left with the size of the whole.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) The mean token of each set of tokens. (2) What is
# left of x once every token has lost that mean. (3) The size of what is left relative to the size
# of x, both measured as Frobenius norms of each set.</details>
#
# <details><summary>Hint 3: closer</summary>A matrix whose entries are all one over N, times x,
# gives every token the mean token. Take the norms over the last two axes only, so that any batch
# axes stay.</details>

# %% slideshow={"slide_type": "fragment"}
def my_distance_from_rank_one(x: torch.Tensor) -> torch.Tensor:
    """x: (..., N, D) -> (...): ‖x - mean token‖_F / ‖x‖_F."""
    ### BEGIN SOLUTION
    n = x.shape[-2]  # tokens per set
    uniform = torch.full((n, n), 1 / n, dtype=x.dtype)  # attention weights, all 1/N
    rest = x - uniform @ x  # (..., N, D): every token minus the mean token
    return torch.linalg.matrix_norm(rest) / torch.linalg.matrix_norm(x)
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("layers.distance_from_rank_one", my_distance_from_rank_one)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The helper, through a deep stack
#
# The helper is `helpers.model.layers.distance_from_rank_one`; the cell measures with yours once
# it passes (the helper until then). It pushes 16 random tokens
# (64 features) through 24 layers of five kinds, all with PyTorch's default initialisation and no
# mask: attention alone, attention followed by an FFN, attention with a skip connection, the same
# with an FFN on its own skip (no LayerNorm), and the full Pre-LN block (skips, FFN and LayerNorm).
# All five stacks share one set of attentions and FFNs, so two rows differ only by what their
# names say. One seed could be a lucky draw: the table shows seed 0, and the lines under it the
# range over three seeds.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.layers import distance_from_rank_one as course_distance

distance_from_rank_one = yours_or("layers.distance_from_rank_one", my_distance_from_rank_one,
                                  course_distance)
ATTENTION_SHARPNESS = 1.0  # knob: scales W_Q and W_K; try 6.0 for attention far from uniform
SEEDS = (0, 1, 2)


def sharpened_attentions(n: int) -> list[MultiHeadAttention]:
    """n fresh attention layers (64 wide, 4 heads), W_Q and W_K scaled by ATTENTION_SHARPNESS."""
    attentions = [MultiHeadAttention(64, 4) for _ in range(n)]
    with torch.no_grad():
        for attention in attentions:
            attention.q_proj.weight.mul_(ATTENTION_SHARPNESS)
            attention.k_proj.weight.mul_(ATTENTION_SHARPNESS)
    return attentions


# %% slideshow={"slide_type": "fragment"}
def rank_collapse_stacks(seed: int) -> tuple[dict, torch.Tensor]:
    """Five stacks of DEPTH layers, built from the same attentions and FFNs, and the tokens (1, 16,
    64)."""
    torch.manual_seed(seed)
    attentions = sharpened_attentions(DEPTH)
    ffns = [FeedForward(64) for _ in range(DEPTH)]
    norm = nn.LayerNorm(64)  # weight 1, bias 0, as every LayerNorm starts
    stacks = {
        "attention only": lambda x, i: attentions[i](x),
        "attention + FFN": lambda x, i: ffns[i](attentions[i](x)),
        "attention + skip": lambda x, i: x + attentions[i](x),
        "attention + skip, FFN + skip": lambda x, i: (y := x + attentions[i](x)) + ffns[i](y),
        "full block (skips, FFN, LN)": lambda x, i: (
            (y := x + attentions[i](norm(x))) + ffns[i](norm(y))
        ),
    }
    return stacks, torch.randn(1, 16, 64)


# %% slideshow={"slide_type": "fragment"}
def distances_through(stacks: dict, tokens: torch.Tensor) -> tuple[dict, dict]:
    """Per stack: the distance from rank one after 0, 1, ..., DEPTH layers, and the rank at the
    top."""
    distances, final_rank = {}, {}
    with torch.no_grad():
        for name, layer in stacks.items():
            x = tokens
            distances[name] = [distance_from_rank_one(x).item()]
            for i in range(DEPTH):
                x = layer(x, i)
                distances[name].append(distance_from_rank_one(x).item())
            final_rank[name] = torch.linalg.matrix_rank(x[0]).item()
    return distances, final_rank


runs = {seed: distances_through(*rank_collapse_stacks(seed)) for seed in SEEDS}
distances, final_rank = runs[0]

# %% slideshow={"slide_type": "fragment"}
ROUND_OFF = 1e-5  # below this the digits are float32 round-off, which changes from CPU to CPU


def shown(distance: float) -> str:
    return f"{'< 1e-5':>7}" if distance < ROUND_OFF else f"{distance:>7.1e}"


print("seed 0, layers:               " + "  ".join(f"{i:>7}" for i in (0, 1, 2, 3, DEPTH)))
for name, d in distances.items():
    print(f"{name:<29}" + "  ".join(shown(d[i]) for i in (0, 1, 2, 3, DEPTH))
          + f"   rank at the top: {final_rank[name]}")

# %% slideshow={"slide_type": "fragment"}
top = {name: [runs[seed][0][name][-1] for seed in SEEDS]
       for name in distances}  # after DEPTH layers
ffn_effect = [abs(a - b) for a, b in zip(top["attention + skip, FFN + skip"],
                                         top["attention + skip"], strict=True)]
block_lead = [
    block - max(a, b)
    for block, a, b in zip(
        top["full block (skips, FFN, LN)"],
        top["attention + skip"],
        top["attention + skip, FFN + skip"],
        strict=True,
    )
]
print(f"\nafter {DEPTH} layers, seeds {SEEDS[0]}-{SEEDS[-1]}:")
for name in ("attention + skip", "attention + skip, FFN + skip", "full block (skips, FFN, LN)"):
    print(f"  {name:<29} {min(top[name]):.2f} to {max(top[name]):.2f}")
print(f"  the FFN on its skip moves it by at most {max(ffn_effect):.2f}; "
      f"the full block leads the skip rows by {min(block_lead):+.2f} to {max(block_lead):+.2f}")
assert max(max(top["attention only"]), max(top["attention + FFN"])) < ROUND_OFF
assert min(min(top["attention + skip"]), min(top["attention + skip, FFN + skip"])) > 0.1
assert max(ffn_effect) < 0.25  # small beside the collapse rows' fall from 1 to round-off
if ATTENTION_SHARPNESS == 1.0:  # the default, which the text below describes
    assert min(block_lead) > 0.05

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(9, 5))
for (name, d), style in zip(distances.items(), ["o-", "s-", "^-", "D-", "v-"], strict=True):
    ax.semilogy(range(DEPTH + 1), d, style, markersize=5, label=name)
ax.set(title="Rank collapse: how different the 16 tokens still are (seed 0)",
       xlabel="layers", ylabel="‖X - 1·meanᵀ‖ / ‖X‖ (log scale)")
ax.legend(fontsize=11)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### What the measurement shows
#
# Attention alone wipes out the differences between tokens within a few layers, down to float32
# round-off, and the representations end at rank 1 (the table), on every seed. At initialisation
# the attention weights are nearly uniform, which makes this quick; with `ATTENTION_SHARPNESS = 6.0`
# the collapse takes a little longer but still comes (Dong et al. bound its speed by the size of
# the weights). An FFN after each attention, without skips, does not rescue it: it works on each
# token separately and cannot make equal tokens different again.
#
# Those two rows collapse for want of skips, so they cannot answer the question, which is about
# the FFN. The rows that do keep the skips and differ only by the FFN: over the three seeds,
# adding an FFN on its own skip moves the distance after 24 layers by at most the amount printed,
# small beside the collapse of the rows without skips, and in either direction. With the default
# sharpness the full block, whose LayerNorms keep every branch's input at unit scale, ends highest
# on every seed (the lead printed); turn the knob to 6.0 and that lead shrinks to nothing on some
# seeds, while the skip rows still hold. So at initialisation the skip connections, not the FFN,
# hold off rank collapse, and replacing the FFN by more attention would not bring the collapse back
# as long as the skips stay. The answer is still no, for another reason: the FFN is where each
# token gets its non-linear, per-position transformation, and it holds two thirds of the block's
# parameters (section 3); attention only mixes tokens, by weighted averages.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. The transformer block (optional)
#
# Everything is now in place for the block of GPT-2 (Pre-LN), which notebook 7 stacks:
#
# `x = x + attn(ln1(x))`, then `x = x + mlp(ln2(x))`
#
# and for the Post-LN block of 2017 (section 5): `x = ln1(x + attn(x))`, then `x = ln2(x + mlp(x))`.
# Write both yourself first, from the pieces; `helpers.model.layers.Block` must then agree with
# them. The LayerNorms go through `norm`: your `my_layer_norm` from section 1 once it passes its
# check, the course's `layer_norm` until then.

# %% slideshow={"slide_type": "fragment"}
catch_up("06_layers", "8.")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the transformer block
#
# Write `my_block_forward(x, block, causal)`: the output `(B, N, D)` of `block`, a `Block`, from its
# parts, in the order its `block.pre_norm` says (true: Pre-LN, false: Post-LN). The parts:
# `block.ln1` and `block.ln2` (each with `.weight`, `.bias` and `.eps`, for `norm`), `block.attn`
# (call it as `block.attn(h, causal=causal)`) and the FFN `block.mlp`, whose two `nn.Linear` layers
# `block.mlp.up` and `block.mlp.down` you apply yourself, with the exact GELU (`F.gelu`) between
# them. Calling the block itself does not count. The cell after the check runs your block against
# `Block`, in both orders.
#
# <details><summary>Hint 1: the idea</summary>
#
# In Pre-LN the residual stream `x` is never normalised itself: each branch reads a normalised
# *copy* of it and adds its result back onto `x`. In Post-LN each branch reads `x` itself, and the
# sum is normalised. Either way: attention first, then the FFN, each with its own LayerNorm.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) The FFN once, as a small inner function built from
# the block's MLP weights: up, exact GELU, down. (2) Pre-LN: two residual branches in turn,
# attention then FFN, each reading a normalised copy of the stream and adding its result to it. (3)
# Post-LN: each branch reads the stream itself; add its result, then normalise the sum.</details>
#
# <details><summary>Hint 3: closer</summary>ln1's parameters go with the attention branch and ln2's
# with the FFN, in both orders; pass causal on to the attention.</details>

# %% slideshow={"slide_type": "fragment"}
def my_block_forward(x: torch.Tensor, block: Block, causal: bool = True) -> torch.Tensor:
    """x: (B, N, D) -> (B, N, D): masked self-attention, then the FFN, each on a residual branch."""
    ### BEGIN SOLUTION
    ln1, ln2, mlp = block.ln1, block.ln2, block.mlp

    def ffn(t: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D), each token on its own
        hidden = F.gelu(t @ mlp.up.weight.T + mlp.up.bias)  # (B, N, 4D)
        return hidden @ mlp.down.weight.T + mlp.down.bias

    if block.pre_norm:  # GPT-2: each branch reads a normalised copy; the stream is left alone
        h = norm(x, ln1.weight, ln1.bias, ln1.eps)
        x = x + block.attn(h, causal=causal)
        h = norm(x, ln2.weight, ln2.bias, ln2.eps)
        return x + ffn(h)
    x = norm(x + block.attn(x, causal=causal), ln1.weight, ln1.bias, ln1.eps)  # Post-LN, 2017
    return norm(x + ffn(x), ln2.weight, ln2.bias, ln2.eps)
    ### END SOLUTION

# %% slideshow={"slide_type": "fragment"}
check("layers.block_forward", my_block_forward)

# %% slideshow={"slide_type": "fragment"}
def course_block(x: torch.Tensor, block: Block, causal: bool = True) -> torch.Tensor:
    """The course's block itself, standing in for an unfinished exercise."""
    return block(x, causal=causal)


block_forward = yours_or("layers.block_forward", my_block_forward, course_block)
torch.manual_seed(0)
block = Block(d_model=64, n_heads=4)
post_block = Block(d_model=64, n_heads=4, pre_norm=False)
x = torch.randn(2, 10, 64)
for name, b in (("Pre-LN", block), ("Post-LN", post_block)):
    assert torch.allclose(b(x), block_forward(x, b), atol=1e-5)
    print(f"{name} Block == the block from its parts:", torch.allclose(b(x), block_forward(x, b),
                                                                       atol=1e-5))
print("output", tuple(block(x).shape))

# %% slideshow={"slide_type": "fragment"}
D = 64
for name, part in block.named_children():
    print(f"  {name:<5} {n_parameters(part):>7,} parameters")
assert n_parameters(block) == 12 * D**2 + 13 * D
print(f"total {n_parameters(block):,} = 12·D² + 13·D with D = {D}")

x_changed = x.clone()
x_changed[:, 7:] = torch.randn(2, 3, 64)
assert torch.equal(block(x_changed)[:, :7], block(x)[:, :7])
print("outputs 0-6 unchanged when tokens 7-9 change:", torch.equal(block(x_changed)[:, :7],
                                                                   block(x)[:, :7]))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The block has `12D² + 13D` parameters: `4D² + 4D` in attention, `8D² + 5D` in the FFN and `4D`
# in the two LayerNorms. It keeps the causal property of its attention: changing later tokens
# leaves earlier outputs unchanged. `Block(..., pre_norm=False)` gives the Post-LN order of 2017,
# `n_kv_heads` gives it grouped-query attention, and `init_gpt2_` initialises a stack of them.
#
# The block's attention maps can be read as in notebook 5, from `block.attn.last_weights`:

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(7, 5.5))
positions = [f"t{i}" for i in range(10)]
heatmap(block.attn.last_weights[0, 0], positions, positions, title="Block, head 0, random weights",
        xlabel="key position", ylabel="query position", ax=ax, annotate=False, vmin=0, vmax=1)
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. Why do transformers use residual connections?**
#
# <details><summary>Answer</summary>
#
# The gradient of `x + f(x)` always contains the identity, so it reaches the lowest layers
# undiminished: in section 4 the first of 24 layers got a gradient about 10⁸ times larger with
# residuals than without (the ratio printed there). The stream is also a shared
# channel: each branch reads it and adds its contribution. Without skips, a stack of attention
# layers loses rank (section 7).
# </details>

# %% slideshow={"slide_type": "fragment"}
catch_up("06_layers", "Check")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. Why LayerNorm, and why not BatchNorm?**
#
# <details><summary>Answer</summary>
#
# It keeps each token's features at mean 0 and standard deviation 1 before every branch, so
# the branches see inputs of the same scale at every depth even though the Pre-LN stream grows
# (section 5). It uses only the token's own features, so it works the same for a batch of one,
# for any sequence length, and in training and inference; BatchNorm does not (section 2).
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. What parallelises in a transformer block?**
#
# <details><summary>Answer</summary>
#
# LayerNorm and the FFN treat every token separately, so all `B x N` tokens go through them as one
# big matrix product; attention compares all queries with all keys in one product, all heads at
# once. Attention is the only place where tokens interact. In training nothing is sequential
# across positions; only generation goes one token at a time.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. The textbook section: the residual stream after 4 layers.** Each branch outputs values of standard
# deviation 1. (a) Post-LN: the stream's std after layer 4? (b) Pre-LN? (c) Which is more stable?
#
# <details><summary>Answer</summary>
#
# (a) 1: a LayerNorm ends every layer. (b) The notes answer `sqrt(1 + 4) ≈ 2.24`, counting one
# unit-std addition per layer. Read as written, each of the two sub-layers of a layer adds one,
# and 4 layers give `sqrt(1 + 8) = 3`. The cell prints both formulas and both measurements of
# section 5. (c) Pre-LN: its stream grows only as a sum of independent terms
# and its gradient flows back through the additions without meeting a LayerNorm; Post-LN needs
# learning-rate warm-up to train deep stacks.
# </details>

# %% slideshow={"slide_type": "fragment"}
print(f"one addition per layer:  sqrt(1 + 4) = {math.sqrt(5):.3f}; measured Pre-LN: {pre[4]:.2f}")
print(f"two additions per layer: sqrt(1 + 8) = {math.sqrt(9):.3f}; measured Pre-LN: "
      f"{pre_two[4]:.2f}")
print(f"measured Post-LN: {curves['Post-LN, unit-std branches'][4]:.2f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **5. The textbook section: the FFN's `8d²`.** (a) Check `8d²` from the shapes of the two matrices
# (`d_ff = 4d`). (b) What does halving `d_ff` to `2d` trade? (c) Why `8d/3` for SwiGLU?
#
# <details><summary>Answer</summary>
#
# (a) `W1` is `d x 4d` and `W2` is `4d x d`: `4d² + 4d² = 8d²`, twice attention's `4d²`. The cell
# computes it for `d = 768`. (b) It halves the FFN's parameters and compute, and its capacity: the
# FFN is the only non-linear, per-token transformation and holds much of what a model knows; with
# the parameters saved it is usually better to add layers. (c) SwiGLU has three matrices;
# `3 · d · 8d/3 = 8d²` keeps its size equal to a `4d` two-matrix FFN, as the cell shows.
# </details>

# %% slideshow={"slide_type": "fragment"}
d = 768
w1, w2 = d * 4 * d, 4 * d * d
print(f"W1: {d} x {4 * d} = {w1:,};  W2: {4 * d} x {d} = {w2:,};  sum {w1 + w2:,} = 8·d² = "
      f"{8 * d * d:,}")
print(f"attention's 4·d² = {4 * d * d:,};  with d_ff = 2d: {2 * d * d * 2:,}")
print(f"SwiGLU, hidden {8 * d // 3}: 3 · {d} · {8 * d // 3} = {3 * d * (8 * d // 3):,}")
