# %% [markdown]
# # 9. From GPT-2 to the modern decoder: RoPE, ALiBi, RMSNorm, SwiGLU, GQA
#
# The GPT of notebook 7 is GPT-2 (2019). Every open model since (Llama, Mistral, Qwen, Gemma) keeps
# its overall shape, a stack of Pre-LN blocks, and changes the parts: positions enter by rotating
# queries and keys (RoPE) instead of being added to the input, RMSNorm replaces LayerNorm, SwiGLU
# replaces the GELU MLP, several query heads share one key/value head (GQA), and the biases are
# gone. The textbook section names these changes ("RoPE has largely replaced sinusoidal positional
# encoding, Pre-LayerNorm is now standard, SwiGLU has replaced ReLU"); this notebook builds each.
#
# **After this notebook you can**
# - derive RoPE, write it in its complex-number and its real "rotate half" forms, and show that
#   the score `q_m · k_n` depends only on the offset `m - n`;
# - build ALiBi's `(n_heads, N, N)` bias buffer with its per-head slopes (the textbook section's
#   exercise 5);
# - write RMSNorm by hand, match `torch.nn.RMSNorm`, and say what it drops from LayerNorm;
# - size SwiGLU's hidden layer at `8/3 · D` so that it costs what GPT-2's `4 · D` MLP costs (the
#   textbook section's exercise 6, computed), and count what GQA saves in the KV cache;
# - assemble the modern decoder from `helpers.model.modern` and check its KV cache against a full pass.
# - measure, on the course corpus, the modern block against GPT-2's at equal size, and which
#   position scheme still works at 4x the context it was trained at.
#
# **It assumes** notebooks 2 (sinusoidal positions), 5 (multi-head attention, GQA), 6 (LayerNorm,
# SwiGLU) and 7 (the GPT and its KV cache).

# %% [setup]

# %%
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from helpers.model.embeddings import sinusoidal_positions
from helpers.lab.exercises import check
from helpers.lab.plots import heatmap

torch.set_num_threads(1)  # every tensor here is small: one thread beats coordinating several

# %% [markdown]
# ## 1. RoPE: positions as rotations
#
# GPT-2 adds a position vector `p_m` to the token vector before the block. The query of token `m`
# is then `(x_m + p_m) W_Q`, and its score with key `n` mixes the tokens' contents with both
# *absolute* positions. What attention should care about is usually how far apart two tokens
# are. RoPE (Su et al., 2021) gets exactly that: it leaves the input alone and, inside every
# attention layer, **rotates** each query and key by an angle proportional to its position.
#
# The `D_H` features of a head form `D_H / 2` pairs. Pair `i` of the vector at position `m` is
# turned by the angle `m · θ_i`, with the frequencies of the sinusoidal table of notebook 2:
# `θ_i = 10000^(-2i / D_H)`. The first pairs turn fast, the last ones barely move. We pair
# feature `i` with feature `i + D_H/2` (the first half with the second half), as Hugging Face's
# Llama does.

# %%
def rope_by_hand(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x: (..., N, D_H), positions: (N,) -> x with pair i of token m turned by m * theta_i."""
    half = x.shape[-1] // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])  # (D_H/2,)
    angle = positions[:, None].double() * theta                                    # (N, D_H/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]  # pair i is (a_i, b_i)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


x = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # one token, D_H = 4: pairs (1, 0) and (0, 1)
for m in (0, 1, 2):
    print(f"position {m}:", rope_by_hand(x, torch.tensor([m]))[0].numpy().round(4))
print(f"theta_0 = 1 rad = {math.degrees(1.0):.1f} degrees per position; "
      f"theta_1 = 10000^(-1/2) = {10000 ** -0.5:.2f} rad")

# %% [markdown]
# At position 0 nothing moves. Pair 0 (`θ_0 = 1`) turns by one radian per position, pair 1
# (`θ_1 = 10000^(-1/2) = 0.01`) by a hundredth of one. A rotation keeps every vector's length.
#
# **Why it works.** Rotating `q` by `mθ` and `k` by `nθ` and taking the dot product gives the same
# number as rotating `q` alone by `(m - n)θ`: the two rotations cancel except for their
# difference. So the score depends on the contents and on `m - n`, never on `m` itself. The cell
# checks it for random vectors, 20 offsets and 40 starting positions each.

# %%
torch.manual_seed(0)
D_H = 16
q, k = torch.randn(D_H, dtype=torch.float64), torch.randn(D_H, dtype=torch.float64)


def rope_score(q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    """q rotated at position m, dotted with k rotated at position n."""
    qm = rope_by_hand(q[None], torch.tensor([m]))[0]
    kn = rope_by_hand(k[None], torch.tensor([n]))[0]
    return float(qm @ kn)


spreads, by_offset = [], {}
for offset in range(20):
    scores = torch.tensor([rope_score(q, k, m, m - offset) for m in range(offset, offset + 400, 10)])
    spreads.append(float(scores.max() - scores.min()))
    by_offset[offset] = float(scores[0])
assert max(spreads) < 1e-9
print("largest spread of q_m·k_(m-offset) over 40 positions m, for any of 20 offsets: < 1e-9")
print("the score at a few offsets:", {o: round(by_offset[o], 3) for o in (0, 1, 2, 5, 10)})

# %% [markdown]
# The score changes with the offset and with nothing else. Compare the two older ways of giving
# positions:
#
# - **learned** positions (GPT-2): a table with one row per position. It has no row for a position
#   past the context it was trained at, and nothing ties row 500 to row 501.
# - **sinusoidal** positions (the 2017 Transformer, notebook 2), added to the input: the same
#   offset gives different scores at different places, because the score of `(x + p_m) W_Q` with
#   `(y + p_n) W_K` holds terms in `p_m` and `p_n` alone. The cell measures it with random
#   projections.

# %%
torch.manual_seed(1)
D = 16
w_q, w_k = torch.randn(D, D, dtype=torch.float64) / 4, torch.randn(D, D, dtype=torch.float64) / 4
x_tok, y_tok = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
table = sinusoidal_positions(500, D).double()
offset = 3
additive = torch.tensor([float(((x_tok + table[m]) @ w_q) @ ((y_tok + table[m - offset]) @ w_k))
                         for m in range(offset, 400, 10)])
rotary = torch.tensor([rope_score(x_tok @ w_q, y_tok @ w_k, m, m - offset) for m in range(offset, 400, 10)])
print(f"offset {offset}, 40 positions: sinusoidal-added scores range over "
      f"{float(additive.max() - additive.min()):.2f}; RoPE scores over < 1e-9")
assert float(rotary.max() - rotary.min()) < 1e-9 and float(additive.max() - additive.min()) > 0.1

# %% [markdown]
# ### The complex-number form
#
# A pair `(a, b)` is the complex number `a + i b`, and turning it by the angle `φ` is multiplying
# by `e^{iφ} = cos φ + i sin φ`. RoPE is then one complex product per pair, with a table of
# `e^{i m θ_j}` computed once. The "rotate half" form does the same in real numbers:
# `x · cos + rotate_half(x) · sin`, where `rotate_half(a, b) = (-b, a)` is a quarter turn. Both now
# live in `helpers.model.modern`, with the table (`RopeTable`); the cell checks them against the
# plain version above and against each other.

# %%
from helpers.model.modern import RopeTable, rope_rotate_complex, rope_rotate_half

torch.manual_seed(2)
rope_table = RopeTable.build(head_dim=16, n_positions=128)
keys = torch.randn(2, 4, 50, 16)  # (B, H, N, D_H)
by_hand = rope_by_hand(keys, torch.arange(50))
as_complex = rope_rotate_complex(keys, rope_table)
as_real = rope_rotate_half(keys, rope_table)
worst = max(float((as_complex - by_hand).abs().max()), float((as_real - as_complex).abs().max()))
assert worst < 1e-5
print("by hand, complex form, rotate-half form: largest difference < 1e-5")
print("the table:", tuple(rope_table.cos.shape), "cos and sin,", tuple(rope_table.complex.shape), "as complex")

# %% [markdown]
# Meta's first Llama code paired neighbouring features `(2i, 2i+1)` instead of the two halves.
# That is a fixed reordering of the features of `q` and `k`, which changes no dot product: the two
# layouts compute the same attention, and a converter only has to reorder the rows of `W_Q` and
# `W_K`.
#
# ### Exercise: rotate one pair
#
# Write the rotation of a single pair `(a, b)` at `position` with frequency `theta`.

# %%
def rotate_pair(a: float, b: float, position: int, theta: float) -> tuple[float, float]:
    """The pair (a, b) turned by the angle position * theta, counter-clockwise."""
    raise NotImplementedError


check("modern_decoder.rotate_pair", rotate_pair)

# %% [markdown]
# <details><summary>Hint</summary>
#
# Multiply `a + ib` by `cos φ + i sin φ` and read off the real and imaginary parts.
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def rotate_pair(a: float, b: float, position: int, theta: float) -> tuple[float, float]:
#     """The pair (a, b) turned by the angle position * theta, counter-clockwise."""
#     angle = position * theta
#     return a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)
#
#
# _ = check("modern_decoder.rotate_pair", rotate_pair)
# ```
# </details>

# %% [markdown]
# ### See it move
#
# Left: the first pair of a query at position `m` and of a key at position `m - offset`, after
# rotation. Right: the score `q_m · k_(m-offset)` of the whole 16-feature vectors against the
# offset. Moving `m` turns both arrows together and leaves the score where it is; moving the
# offset opens the angle between them and moves the score. First a still figure, then the widget.

# %%
torch.manual_seed(3)
demo_q, demo_k = torch.randn(16), torch.randn(16)


def draw_rope(offset: int, position: int) -> dict[str, float]:
    """Draw pair 0 of the rotated q and k and the score against the offset; return what was drawn."""
    rotated_q = rope_rotate_half(demo_q[None], rope_table, positions=torch.tensor([position + offset]))[0]
    rotated_k = rope_rotate_half(demo_k[None], rope_table, positions=torch.tensor([position]))[0]
    offsets = torch.arange(0, 64)
    curve = [float(rope_rotate_half(demo_q[None], rope_table, positions=torch.tensor([int(o)]))[0]
                   @ demo_k) for o in offsets]
    score = float(rotated_q @ rotated_k)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for vector, name, color in ((rotated_q, f"q at {position + offset}", "tab:blue"),
                                (rotated_k, f"k at {position}", "tab:orange")):
        left.annotate("", xy=(float(vector[0]), float(vector[8])), xytext=(0, 0),
                      arrowprops=dict(arrowstyle="->", color=color, linewidth=3))
        left.plot([], [], color=color, label=name)
    radius = 1.2 * max(float(demo_q[[0, 8]].norm()), float(demo_k[[0, 8]].norm()))
    left.set(xlim=(-radius, radius), ylim=(-radius, radius), aspect="equal",
             title="pair 0 (features 0 and 8), rotated", xlabel="feature 0", ylabel="feature 8")
    left.legend(loc="lower left")
    right.plot(offsets, curve)
    right.plot([offset], [score], "o", color="black", markersize=10)
    right.set(title="score q_m · k_n against m - n", xlabel="offset m - n", ylabel="score")
    return {"score": score, "q_pair": (float(rotated_q[0]), float(rotated_q[8])),
            "k_pair": (float(rotated_k[0]), float(rotated_k[8]))}


draw_rope(offset=5, position=10)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
# The widget's output holds model ids that change on every run; the figure above is the same drawing.
from helpers.lab.widgets import Explorer

explorer = Explorer(
    draw_rope,
    offset=widgets.IntSlider(value=5, min=0, max=63, description="offset m - n"),
    position=widgets.IntSlider(value=10, min=0, max=60, description="position n"),
)
explorer

# %% [markdown]
# Moving the controls really redraws the picture: a new position turns the arrows and keeps the
# score, a new offset changes the score.

# %%
first = explorer.last
moved = explorer.set(position=40)
assert moved["q_pair"] != first["q_pair"] and abs(moved["score"] - first["score"]) < 1e-4
wider = explorer.set(offset=20)
assert abs(wider["score"] - moved["score"]) > 1e-3
print("redraws so far:", explorer.redraws)

# %% [markdown]
# ## 2. ALiBi: a bias instead of a rotation
#
# ALiBi (Press et al., 2022) puts no position into `q` or `k` at all. It subtracts from every
# score a penalty proportional to the distance: `score[h, i, j] - m_h · (i - j)`, added **after**
# the `1/sqrt(D_H)` scaling, just before the softmax. Each head gets its own slope `m_h`, so some
# heads look far and others only next door. For `H` heads (a power of two) the slopes are the
# geometric sequence `2^(-8/H), 2^(-16/H), ..., 2^(-8)`. For another head count we use the
# paper's own rule: the slopes of the nearest power of two below, then every other slope of twice
# that power.
#
# The textbook section's exercise 5 asks for the bias as a buffer of shape `(n_heads, max_seq,
# max_seq)` added to the scores; here it is, by hand first.

# %%
def alibi_bias_by_hand(n_heads: int, n_tokens: int) -> torch.Tensor:
    """(H, N, N): -slope_h * (i - j) for key j <= query i, 0 above the diagonal (masked anyway)."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)])
    i, j = torch.arange(n_tokens)[:, None], torch.arange(n_tokens)[None, :]
    return slopes[:, None, None] * (j - i).clamp(max=0)  # j - i = -(i - j); 0 (not -0) above


bias = alibi_bias_by_hand(4, 5)
print("slopes for 4 heads:", [2.0 ** (-2 * (h + 1)) for h in range(4)])
print("head 0 (slope 0.25):\n", bias[0])

# %%
from helpers.model.modern import alibi_attention, alibi_bias, alibi_slopes

assert torch.equal(alibi_bias(4, 5), bias)
print("8 heads: ", [round(s, 5) for s in alibi_slopes(8).tolist()])
print("12 heads:", [round(s, 5) for s in alibi_slopes(12).tolist()])
figure, axes = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained")
for axis, head in zip(axes, (0, 3), strict=True):
    heatmap(alibi_bias(4, 8)[head], title=f"ALiBi bias, head {head} of 4", xlabel="key j",
            ylabel="query i", ax=axis)
plt.show()

# %% [markdown]
# Twelve heads is not a power of two: the first 8 slopes are those of 8 heads, the last 4 are
# slopes 1, 3, 5 and 7 of the 16-head sequence (`2^(-0.5)`, `2^(-1.5)`, ...), whose exponents fall
# halfway between those of the first eight. With queries all equal, the bias alone decides the weights: every head prefers the nearest
# keys, the steep ones much more than the gentle ones.

# %%
flat_q, flat_k = torch.zeros(1, 4, 6, 8), torch.randn(1, 4, 6, 8)
weights = alibi_attention(flat_q, flat_k, torch.eye(6).expand(1, 4, 6, 6))  # values = identity
print("last query's weights on keys 0..5, per head:\n", weights[0, :, 5].numpy().round(3))

# %% [markdown]
# ### Exercise: the ALiBi buffer
#
# Given the slopes `(H,)` and `n_tokens`, return the bias `(H, N, N)`.

# %%
def my_alibi_bias(slopes: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """slopes: (H,) -> (H, N, N) with -slope_h * (i - j) for j <= i and 0 above the diagonal."""
    raise NotImplementedError


check("modern_decoder.alibi_bias", my_alibi_bias)

# %% [markdown]
# <details><summary>Hint</summary>
#
# `torch.arange(n)[:, None] - torch.arange(n)[None, :]` is the `(N, N)` table of `i - j`.
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_alibi_bias(slopes: torch.Tensor, n_tokens: int) -> torch.Tensor:
#     """slopes: (H,) -> (H, N, N) with -slope_h * (i - j) for j <= i and 0 above the diagonal."""
#     positions = torch.arange(n_tokens)
#     behind = (positions[None, :] - positions[:, None]).clamp(max=0)  # j - i, 0 above the diagonal
#     return slopes[:, None, None] * behind
#
#
# _ = check("modern_decoder.alibi_bias", my_alibi_bias)
# ```
# </details>

# %% [markdown]
# ## 3. RMSNorm: LayerNorm without the mean
#
# LayerNorm subtracts each token's mean, divides by its standard deviation, multiplies by `γ` and
# adds `β`. RMSNorm (Zhang and Sennrich, 2019) keeps only the division, by the root mean square,
# and the gain: `y = x / sqrt(mean(x²) + eps) · γ`. No mean, no bias: half the parameters and
# one reduction fewer, and in practice the same quality.

# %%
def rms_norm_by_hand(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x: (..., D) -> (..., D), each token divided by its own root mean square, times weight."""
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


torch.manual_seed(4)
tokens = torch.randn(2, 5, 8) * 3 + 2  # a mean of 2 on purpose
gain = torch.randn(8)
mine = rms_norm_by_hand(tokens, gain)
if hasattr(torch.nn, "RMSNorm"):  # torch >= 2.4
    reference = torch.nn.RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        reference.weight.copy_(gain)
    assert torch.allclose(mine, reference(tokens), atol=1e-5)
    print("by hand == torch.nn.RMSNorm (to 1e-5)")

from helpers.model.modern import RMSNorm

norm = RMSNorm(8)
with torch.no_grad():
    norm.weight.copy_(gain)
assert torch.allclose(norm(tokens), mine, atol=1e-6)
plain_rms = rms_norm_by_hand(tokens, torch.ones(8))
plain_ln = F.layer_norm(tokens, (8,))
assert abs(float(plain_ln[0, 0].mean())) < 1e-5
print(f"mean of a token after LayerNorm: |mean| < 1e-5; after RMSNorm: {float(plain_rms[0, 0].mean()):.2f}")
print(f"root mean square after RMSNorm: {float(plain_rms[0, 0].pow(2).mean().sqrt()):.2f}")
print("parameters for D = 768: LayerNorm", 2 * 768, "| RMSNorm", sum(p.numel() for p in RMSNorm(768).parameters()))

# %% [markdown]
# RMSNorm fixes the size of each token and leaves its mean where it was; LayerNorm centres it too.
#
# ### Exercise: RMSNorm

# %%
def my_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: (..., D); weight: (D,) -> (..., D)."""
    raise NotImplementedError


check("modern_decoder.rms_norm", my_rms_norm)

# %% [markdown]
# <details><summary>Hint</summary>
#
# `x.pow(2).mean(-1, keepdim=True)` is the mean square of each token; `eps` goes inside the root.
# </details>
#
# <details><summary>Solution</summary>
#
# ```python
# def my_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
#     """x: (..., D); weight: (D,) -> (..., D)."""
#     return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
#
#
# _ = check("modern_decoder.rms_norm", my_rms_norm)
# ```
# </details>

# %% [markdown]
# ## 4. SwiGLU at 8/3 width
#
# GPT-2's MLP has two matrices, `D x 4D` and `4D x D`: `8 D²` parameters. SwiGLU (notebook 6) has
# three, `gate`, `up` and `down`. To cost the same, its hidden width is two thirds of `4D`:
# `3 · D · (8D/3) = 8 D²`. Llama then rounds the width up to a multiple of 256 so that the matrix
# products tile well on a GPU (`llama_hidden_size`); for Llama's `D = 4096` that gives 11008.

# %%
from helpers.model.layers import FeedForward, SwiGLUFeedForward
from helpers.model.modern import llama_hidden_size


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


for d in (96, 768):
    gelu = FeedForward(d, 4 * d, bias=False)
    swiglu = SwiGLUFeedForward(d, 8 * d // 3, bias=False)
    print(f"D = {d}: GELU MLP 4D = {4 * d}: {n_params(gelu):,} parameters (8D² = {8 * d * d:,}); "
          f"SwiGLU 8D/3 = {8 * d // 3}: {n_params(swiglu):,}")
print("Llama's D = 4096 with multiple_of = 256:", llama_hidden_size(4096, multiple_of=256))

# %% [markdown]
# For `D = 96` and `D = 768`, `8D/3` is a whole number and the two MLPs have exactly the same
# size. Where it is not, rounding makes SwiGLU a little larger.
#
# ## 5. GQA inside the model, and the cache it saves
#
# Grouped-query attention (notebook 5) lets `H` query heads share `H_kv < H` key/value heads. The
# attention module is the same `helpers.model.multihead.MultiHeadAttention`, with `n_kv_heads`. What it
# saves is the KV cache of generation: `2 · L · H_kv · D_H` numbers per token instead of
# `2 · L · H · D_H`. For a 70B-class shape (80 layers, 64 query heads of 128 features, 8 KV heads,
# 16-bit numbers):

# %%
from helpers.model.multihead import kv_cache_bytes_per_token

full_heads = kv_cache_bytes_per_token(80, 64, 128)
grouped = kv_cache_bytes_per_token(80, 8, 128)
print(f"per token: all 64 heads {full_heads / 2**20:.2f} MiB, 8 KV heads {grouped / 2**20:.3f} MiB "
      f"({full_heads // grouped}x less); a 4096-token context: {4096 * full_heads / 2**30:.1f} GiB "
      f"vs {4096 * grouped / 2**30:.2f} GiB")

# %% [markdown]
# ## 6. The modern decoder, assembled
#
# `helpers.model.modern.ModernGPT` puts the pieces together: a token embedding with **no** position
# table, `n_layers` blocks of `x + attn(RMSNorm(x))` then `x + SwiGLU(RMSNorm(x))` where the
# attention rotates its queries and keys with RoPE and uses GQA, a last RMSNorm, and the output
# matrix, tied to the embedding or not (`tie_weights`; Llama does not tie). No linear layer has
# a bias. It is a sibling of notebook 7's `GPT` rather than a switch inside it, because nearly
# every part differs; the attention module, the SwiGLU MLP and the KV cache are the same objects.
#
# The KV cache stores each key **already rotated at its own position**. A new token at position
# `t` rotates only its own query and key; the stored keys never move, and the scores come out as
# in a full pass. The cell checks it: logits of a 24-token sequence fed one token at a time equal
# those of one full pass.

# %%
from helpers.model.kv_cache import KVCache
from helpers.model.modern import ModernConfig, ModernGPT, modern_generate_logits

torch.manual_seed(5)
config = ModernConfig(vocab_size=64, context_length=64, n_layers=2, n_heads=4, n_kv_heads=2, d_model=64)
model = ModernGPT(config).eval()
tied = ModernGPT(ModernConfig(**{**config.__dict__, "tie_weights": True}))
print(f"{config.n_heads} query heads, {config.n_kv_heads} KV heads, head size {config.head_dim}, "
      f"SwiGLU width {config.hidden}")
print(f"parameters: untied {n_params(model):,}, tied {n_params(tied):,} "
      f"(difference V·D = {config.vocab_size * config.d_model:,})")
print("biases:", [name for name, _ in model.named_parameters() if name.endswith("bias")])

ids = torch.randint(0, 64, (2, 24))
with torch.no_grad():
    full = model(ids)
    step_by_step = modern_generate_logits(model, ids)
gap = float((full - step_by_step).abs().max())
assert gap < 1e-4
print("cached, one token at a time, vs full pass: largest difference < 1e-4")
cache = KVCache.for_model(model, batch_size=2)
mha_cache = KVCache(config.n_layers, 2, config.n_heads, config.context_length, config.head_dim)
print(f"this model's cache: {cache.nbytes():,} bytes with GQA, {mha_cache.nbytes():,} with one KV head per query head")

# %% [markdown]
# The same model, loaded with the weights of Hugging Face's `LlamaForCausalLM`
# (`helpers.model.modern.from_llama_state_dict`), gives Llama's logits to `1e-5`; so do its RoPE,
# RMSNorm and SwiGLU layers on their own. That comparison needs the `transformers` package, so it
# lives in the tests (`tests/test_modern.py`), not here.
#
# ## 7. Measured: the GPT-2 block against the modern block, and longer contexts
#
# Two small experiments on the course corpus, at the character level so that they train in
# seconds. `TRAIN_STEPS` is the knob: raise it for a longer, more convincing run.
#
# **The blocks.** Notebook 7's `GPT` (learned positions, LayerNorm, GELU MLP at `4D`, biases)
# against `ModernGPT` (RoPE, RMSNorm, SwiGLU, no biases), both 2 layers of width 64 and tied
# output, with SwiGLU's width chosen so that the two have the same number of parameters (to 0.1%).
# Same data, same optimizer, same number of steps; the printed times show a step costs about the
# same in both, so equal steps is close to equal time.

# %%
from helpers.text.corpus import load_corpus
from helpers.model.gpt import GPT, GPTConfig
from helpers.timing import format_duration
from helpers.text.chars import CharTokenizer
from helpers.training.trainer import encode_text, random_batch, split_stories
import time

TRAIN_STEPS = 100  # the knob: 300 or more for a clearer picture (each step is a few ms per model)

train_text, val_text = split_stories(load_corpus()[:300_000])
tokenizer = CharTokenizer(sorted(set(train_text + val_text)))
train_ids, val_ids = encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)


def windows(ids: torch.Tensor, length: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` random windows (count, length) of ids and their next-token targets, drawn by
    notebook 7's `random_batch` with their own seed, so that every model sees the same ones."""
    return random_batch(ids, count, length, generator=torch.Generator().manual_seed(seed))


def train(model: torch.nn.Module, steps: int, context: int = 64) -> float:
    """AdamW on random windows of the training text; returns the seconds it took."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    for step in range(steps):
        x, y = windows(train_ids, context, 16, seed=step)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


@torch.no_grad()
def val_loss(model: torch.nn.Module, length: int, last: int = 64) -> float:
    """Validation loss of the `last` positions of windows of `length` tokens."""
    x, y = windows(val_ids, length, 32, seed=12345)
    logits = model.eval()(x)[:, -last:]
    return float(F.cross_entropy(logits.flatten(0, 1), y[:, -last:].flatten()))


sizes = dict(vocab_size=len(tokenizer.chars), context_length=64, n_layers=2, n_heads=4, d_model=64)
torch.manual_seed(0)
gpt2 = GPT(GPTConfig(**sizes))
torch.manual_seed(0)
llama_like = ModernGPT(ModernConfig(**sizes, n_kv_heads=4, mlp_hidden=185, tie_weights=True))
block_losses = {}
for name, net in (("GPT-2 block", gpt2), ("modern block", llama_like)):
    seconds = train(net, TRAIN_STEPS)
    block_losses[name] = val_loss(net, 64)
    print(f"{name:13s} {n_params(net):,} parameters, {TRAIN_STEPS} steps: validation loss "
          f"{block_losses[name]:.2f}; {format_duration(seconds)}")
assert abs(n_params(gpt2) - n_params(llama_like)) < 0.001 * n_params(gpt2)
assert block_losses["modern block"] < block_losses["GPT-2 block"]

# %% [markdown]
# At the same size and the same number of steps the modern block reaches a lower validation loss.
# A run this short mostly measures how fast each learns; raise `TRAIN_STEPS` to see how the gap
# develops over a longer run.
#
# **Longer contexts than in training.** Train four small models at context 64 that differ only in
# how they know positions: learned (a table of 64 rows), sinusoidal (added to the input), RoPE,
# ALiBi. Then read windows of 128 and 256 tokens and measure the loss on the **last 64** positions
# of each window, positions the model never saw in training. The learned table simply has no row
# for position 64: it cannot run at all.

# %%
from helpers.model.layers import SwiGLUFeedForward

LONGEST = 256


class PositionAttention(nn.Module):
    """Causal multi-head attention that knows positions by `scheme`: "rope", "alibi" or neither."""

    def __init__(self, d: int, n_heads: int, scheme: str) -> None:
        super().__init__()
        self.n_heads, self.scheme = n_heads, scheme
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.rope = RopeTable.build(d // n_heads, LONGEST)
        self.register_buffer("alibi", alibi_bias(n_heads, LONGEST), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n, d = x.shape
        q, k, v = self.qkv(x).view(batch, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.scheme == "rope":
            q, k = rope_rotate_half(q, self.rope), rope_rotate_half(k, self.rope)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.n_heads)  # (B, H, N, N)
        if self.scheme == "alibi":
            scores = scores + self.alibi[:, :n, :n]  # after the scaling
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, n, d))


class PositionModel(nn.Module):
    """Two modern blocks; positions enter as `scheme` says: learned, sinusoidal, rope or alibi."""

    def __init__(self, scheme: str, d: int = 64, n_heads: int = 4, n_layers: int = 2) -> None:
        super().__init__()
        self.scheme = scheme
        self.embed = nn.Embedding(len(tokenizer.chars), d)
        self.learned = nn.Embedding(64, d) if scheme == "learned" else None
        self.register_buffer("sinusoidal", sinusoidal_positions(LONGEST, d), persistent=False)
        self.blocks = nn.ModuleList(nn.ModuleList([RMSNorm(d), PositionAttention(d, n_heads, scheme),
                                                   RMSNorm(d), SwiGLUFeedForward(d)])
                                    for _ in range(n_layers))
        self.norm, self.head = RMSNorm(d), nn.Linear(d, len(tokenizer.chars), bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        positions = torch.arange(ids.shape[1])
        if self.scheme == "learned":
            x = x + self.learned(positions)  # fails past row 63: there is no such row
        if self.scheme == "sinusoidal":
            x = x + self.sinusoidal[positions]
        for norm1, attn, norm2, mlp in self.blocks:
            x = x + attn(norm1(x))
            x = x + mlp(norm2(x))
        return self.head(self.norm(x))


lengths = (64, 128, 256)
length_losses = {}
for scheme in ("learned", "sinusoidal", "rope", "alibi"):
    torch.manual_seed(0)
    net = PositionModel(scheme)
    train(net, TRAIN_STEPS)
    row = []
    for length in lengths:
        try:
            row.append(val_loss(net, length))
        except IndexError:  # nn.Embedding asked for a row it does not have
            row.append(float("nan"))
    length_losses[scheme] = row
    print(f"{scheme:10s}", "  ".join(f"N={n}: {'cannot' if math.isnan(v) else f'{v:.2f}'}"
                                     for n, v in zip(lengths, row, strict=True)))

figure, axis = plt.subplots(figsize=(8, 4.5), layout="constrained")
for scheme, row in length_losses.items():
    axis.plot(lengths, row, "o-", label=scheme)
axis.axvline(64, color="gray", linestyle="--")
axis.set(title="Trained at context 64, read at longer contexts", xlabel="window length N",
         ylabel="loss on the last 64 positions", xticks=lengths)
axis.legend()
plt.show()
alibi_row, sin_row, rope_row = length_losses["alibi"], length_losses["sinusoidal"], length_losses["rope"]
assert math.isnan(length_losses["learned"][1])
assert alibi_row[2] < alibi_row[0] + 0.1                      # ALiBi: no worse at 4x the length
assert sin_row[2] > sin_row[0] + 0.2 and rope_row[2] > rope_row[0] + 0.2  # the others degrade

# %% [markdown]
# Learned positions cannot read past their table. Sinusoidal positions and RoPE both run, and both
# get worse once the windows grow past the training length: their waves and rotations reach
# angles they never met in training (which is why long-context models rescale RoPE's angles).
# ALiBi only ever sees distances, and its steep heads ignore the far past, so at 4x the training
# length its loss is no worse. The plot and the printed table are the same numbers.
#
# ## Check your understanding
#
# **1. Why does RoPE rotate `q` and `k` instead of adding a vector to the input?**
#
# <details><summary>Answer</summary>
#
# Because the dot product of two rotated vectors depends only on the difference of their angles:
# the score sees `m - n`, never `m` (section 1 measured a spread below `1e-9` over 40 positions).
# An added position vector leaves terms that depend on each absolute position (the sinusoidal
# scores at a fixed offset ranged over the value printed in section 1). Rotations also keep
# lengths, so RoPE changes no vector's size.
# </details>
#
# **2. The textbook section's exercise 5: an ALiBi-style buffer.** What shape, where is it added,
# and what goes in it?
#
# <details><summary>Answer</summary>
#
# `(n_heads, max_seq, max_seq)`, registered as a buffer; after `QK^T / sqrt(D_H)` and before
# the softmax, `scores + bias[:, :N_q, :N_k]` (broadcast over the batch). A true ALiBi fills it
# with `-m_h · (i - j)` and the geometric slopes, as `alibi_bias` does (the cell prints the first
# slopes for 8 heads).
# </details>
#
# **3. What does RMSNorm drop from LayerNorm, and what does that save?**
#
# <details><summary>Answer</summary>
#
# The subtraction of the mean and the bias `β`. It keeps `D` parameters instead of `2D` (768
# instead of 1536 for `D = 768`, section 3) and one reduction over the features instead of two.
# </details>
#
# **4. The textbook section's exercise 6: why `8d/3` for SwiGLU?**
#
# <details><summary>Answer</summary>
#
# SwiGLU has three matrices where GPT-2's MLP has two. With hidden width `8d/3`,
# `3 · d · 8d/3 = 8d²`, the same as `2 · d · 4d`: the cell below computes both for `d = 768`.
# </details>
#
# **5. How much KV cache does GQA save?**
#
# <details><summary>Answer</summary>
#
# A factor `H / H_kv`: 8 for 64 query heads sharing 8 KV heads (section 5), 2 for the small model
# of section 6. The queries are not cached, so the saving costs no memory elsewhere.
# </details>

# %%
d = 768
print(f"two matrices at 4d: 2 · {d} · {4 * d} = {2 * d * 4 * d:,};  "
      f"three at 8d/3: 3 · {d} · {8 * d // 3} = {3 * d * (8 * d // 3):,}")
print("ALiBi's first slopes for 8 heads:", alibi_slopes(8)[:3].tolist())
print(f"GQA saving: 64 / 8 = {64 // 8};  small model: {config.n_heads} / {config.n_kv_heads} = "
      f"{config.n_heads // config.n_kv_heads}")
