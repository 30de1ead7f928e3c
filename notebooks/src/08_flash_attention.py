# %% [markdown] slideshow={"slide_type": "slide"}
# # 8. Tiled FlashAttention: from Algorithm 1 to a Triton kernel
#
# **After this notebook you will be able to**
# - count the bytes naive attention moves between GPU memory and the chip, and say why it is
#   memory-bound rather than compute-bound;
# - derive the online softmax, merge two partial softmaxes exactly, and keep a fully masked tile
#   from producing NaN;
# - implement Algorithm 1 of the FlashAttention paper tile by tile in PyTorch, then the
#   FlashAttention-2 loop order, and prove both equal to naive attention;
# - write a backward pass that recomputes the attention weights from a saved log-sum-exp, and
#   check it with `torch.autograd.gradcheck`;
# - measure peak memory against sequence length on your CPU (quadratic against linear);
# - read Triton kernels that do the same thing, forward and backward, and check them on a CPU
#   with Triton's interpreter (their speed needs a GPU);
# - say which tiles, warps, pipeline stages and dtype those kernels get on a T4, an L4, an A100
#   or an H100, and why (shared memory per block, tensor cores);
# - read those kernels' speed, memory and accuracy as measured on an H200, against PyTorch's
#   FlashAttention-2 and cuDNN backends, and say what the remaining gap to cuDNN comes from.
#
# **It assumes** notebooks 3 to 5: `scaled_dot_product_attention(q, k, v, mask)` from
# `helpers.model.attention`, boolean masks (True = may attend), and heads as a batch dimension.

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
# Triton reads TRITON_INTERPRET once, when triton is first imported, and torch's profiler (used
# below to measure memory) imports triton. So, without a GPU, we ask for the interpreter now.
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
print("Triton kernels will be", "interpreted on the CPU"
      if os.environ.get("TRITON_INTERPRET") == "1"
      else "compiled for the GPU")
from helpers.lab.sections import catch_up

# %% slideshow={"slide_type": "fragment"}
import inspect
import math
import textwrap

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch.nn.functional as F
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from helpers.flash import costs, gpu_figures, profiling, tiled
from helpers.model.attention import causal_mask, scaled_dot_product_attention
from helpers.text.corpus import data_dir
from helpers.lab.exercises import check, yours_or
from helpers.lab.plots import heatmap
from helpers.timing import best_time, format_duration
from helpers.lab.widgets import Explorer

# One thread: a tiled loop runs many short operations, and each one waits for every thread; on a
# busy laptop a second thread mostly waits. It also makes the memory peaks below independent of
# the number of cores (PyTorch's fused kernel allocates scratch space per thread).
torch.set_num_threads(1)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Why naive attention is memory-bound (core)
#
# A GPU has two kinds of memory that matter here. **HBM** (high-bandwidth memory) is the large
# one, tens of gigabytes, where tensors live. **SRAM** is on the chip, a small scratchpad inside
# each streaming multiprocessor (SM), an order of magnitude faster but only kilobytes in size.
# Every arithmetic operation reads its inputs from SRAM or registers; anything that does not fit
# there has to travel from HBM and back. The figures below are those of an A100 (40 GB), as the
# FlashAttention paper quotes them.

# %% slideshow={"slide_type": "fragment"}
A100 = {
    "HBM bytes": 40e9, "HBM bytes/s": 1.5e12,                 # FlashAttention paper, Figure 1
    "SRAM bytes per SM": 192 * 1024, "SMs": 108, "SRAM bytes/s": 19e12,
    "fp16 tensor-core FLOP/s": 312e12, "L2 bytes": 40e6,         # A100 data sheet
}
print(f"HBM : {A100['HBM bytes'] / 1e9:.0f} GB at {A100['HBM bytes/s'] / 1e12:.1f} TB/s")
print(f"SRAM: {A100['SRAM bytes per SM'] // 1024} KiB x {A100['SMs']} SMs = "
      f"{A100['SRAM bytes per SM'] * A100['SMs'] / 2**20:.1f} MiB at "
      f"{A100['SRAM bytes/s'] / 1e12:.0f} TB/s")
print(f"SRAM is {A100['SRAM bytes/s'] / A100['HBM bytes/s']:.1f}x faster and "
      f"{A100['HBM bytes'] / (A100['SRAM bytes per SM'] * A100['SMs']):,.0f}x smaller than HBM")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Naive attention runs as separate GPU kernels, and each one reads its inputs from HBM and writes
# its result back: $S = QK^\top$ is written, read back by the softmax, which writes $P$, which is
# read back by $PV$. For one head with $N$ queries and keys of dimension $d$ we count the
# elements moved, in plain code first:

# %% slideshow={"slide_type": "fragment"}
def naive_elements_moved(n: int, d: int) -> int:
    """Elements read or written by naive attention for one head."""
    scores = 2 * n * d + n * n       # read Q and K, write S
    softmax = n * n + n * n          # read S, write P
    output = n * n + n * d + n * d   # read P and V, write O
    return scores + softmax + output


assert naive_elements_moved(1024, 64) == costs.hbm_elements_naive(1024, 64)  # the helper's count

# %% [markdown] slideshow={"slide_type": "subslide"}
# That count lives in `helpers.flash.costs.hbm_elements_naive` (the assertion keeps the two equal).
#
# **Algorithm 1 of FlashAttention** never writes $S$ or $P$. It splits $K, V$ into $T_c$ tiles
# that fit in SRAM together with a tile of $Q$; for each key tile it streams every query tile
# through the chip and updates the output in place. $K$ and $V$ are read once; $Q$, $O$ and the two
# softmax statistics $\ell, m$ are read and written once per key tile. Line 1 of the algorithm
# picks the tile sizes from the SRAM size $M$ (in elements): $B_c = \lceil M / 4d \rceil$,
# $B_r = \min(\lceil M / 4d \rceil, d)$. Here are the counts for one layer of GPT-2 medium
# (16 heads of dimension 64, context 1024) on a batch of 64, in fp16:

# %% slideshow={"slide_type": "fragment"}
BATCH, HEADS, N, D = 64, 16, 1024, 64
BYTES = 2                                                   # fp16
M = A100["SRAM bytes per SM"] // BYTES                      # SRAM size in elements
block_r, block_c = costs.algorithm1_block_sizes(M, D)
FA2_BLOCK_R = 128                                           # query tile of FlashAttention-2
print(f"B={BATCH}, H={HEADS}, N={N}, d={D}; M = {M:,} elements -> B_r = {block_r}, B_c = "
      f"{block_c}, "
      f"T_c = {math.ceil(N / block_c)} key tiles")

# %% slideshow={"slide_type": "fragment"}
traffic = {
    "naive": costs.hbm_elements_naive(N, D),
    "Algorithm 1 (FA-1)": costs.hbm_elements_fa1(N, D, block_c),
    f"FA-2 order, B_r={FA2_BLOCK_R}": costs.hbm_elements_fa2(N, D, FA2_BLOCK_R),
}
flops = costs.attention_flops(BATCH, HEADS, N, N, D)
compute_ms = flops / A100["fp16 tensor-core FLOP/s"] * 1e3
print(f"\n{'':22s} {'elements/head':>14s} {'GB moved':>9s} {'HBM time':>9s} {'FLOP/byte':>10s}")
for name, elements in traffic.items():
    moved = elements * BYTES * BATCH * HEADS
    print(f"{name:22s} {elements:>14,} {moved / 1e9:>9.2f} "
          f"{moved / A100['HBM bytes/s'] * 1e3:>7.2f} ms"
          f" {flops / moved:>10.0f}")
print(f"\n{flops / 1e9:.0f} GFLOP of matrix products take {compute_ms:.2f} ms at "
      f"{A100['fp16 tensor-core FLOP/s'] / 1e12:.0f} TFLOP/s; the chip breaks even at "
      f"{A100['fp16 tensor-core FLOP/s'] / A100['HBM bytes/s']:.0f} FLOP per byte")
print(f"K and V of one head: {2 * N * D * BYTES / 1024:.0f} KiB; the A100's L2 cache: "
      f"{A100['L2 bytes'] / 1e6:.0f} MB")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Read the table from the right: naive attention does far fewer FLOPs per byte than the chip
# needs to stay busy (the break-even, or *ridge point*, printed last), so its time is the time
# of moving bytes, several times the time of the arithmetic. That is what **memory-bound** means.
# Algorithm 1 moves several times fewer bytes, which puts it close to the ridge point.
#
# The paper states the same thing asymptotically: naive attention moves $\Theta(Nd + N^2)$
# elements, Algorithm 1 $\Theta(N^2 d^2 / M)$. The $\Theta$ drops constants; our counts keep
# them: naive is exactly $4Nd + 4N^2$, and Algorithm 1 is $2Nd + T_c(3Nd + 4N)$ with
# $T_c \approx 4Nd/M$, so its dominant term is $12 N^2 d^2 / M$.

# %% slideshow={"slide_type": "fragment"}
theta_naive, theta_fa1 = N * D + N * N, N * N * D * D / M
print(f"naive: counted {traffic['naive']:,} = {traffic['naive'] / theta_naive:.2f} x (Nd + N^2)")
print(f"FA-1 : counted {traffic['Algorithm 1 (FA-1)']:,} = "
      f"{traffic['Algorithm 1 (FA-1)'] / theta_fa1:.1f} x N^2 d^2 / M; 2Nd + 12 N^2 d^2 / M = "
      f"{2 * N * D + 12 * theta_fa1:,.0f} (the rest: T_c rounded up, and l, m)")
for n in (4096, 16384):
    print(f"N = {n:5d}: naive / FA-1 traffic = "
          f"{costs.hbm_elements_naive(n, D) / costs.hbm_elements_fa1(n, D, block_c):.1f}")

# %% [markdown] slideshow={"slide_type": "slide"}
# The FA-2 row moves *more* bytes than Algorithm 1 in this count, because every query tile
# re-reads all of $K$ and $V$. On a real GPU those re-reads come from different programs running
# at the same moment and mostly hit the L2 cache, which is far larger than one head's $K$ and $V$
# (both printed above), so HBM sees far less. FlashAttention-2 is faster for other reasons, which section 4 computes.
#
# ## 2. The online softmax (core)
#
# The obstacle to tiling attention is the softmax: $P_{ij} = e^{S_{ij}} / \sum_{j'} e^{S_{ij'}}$
# needs the whole row before it can normalise anything. The trick is to carry two numbers per
# row instead of the row: its maximum so far, $m$, and the sum of exponentials measured from that
# maximum, $\ell = \sum_j e^{S_j - m}$.
#
# Take a row split into two blocks $a$ and $b$ with states $(m_a, \ell_a)$ and $(m_b, \ell_b)$.
# With $m = \max(m_a, m_b)$,
#
# $$\sum_{j \in a \cup b} e^{S_j - m} = e^{m_a - m} \sum_{j \in a} e^{S_j - m_a} + e^{m_b - m} \sum_{j \in b} e^{S_j - m_b} = e^{m_a - m}\,\ell_a + e^{m_b - m}\,\ell_b .$$
#
# This is an identity, not an approximation: merging two states gives exactly the state of one
# pass over both blocks. Every exponent is $\le 0$, so nothing overflows. In plain code, the
# state of one block:

# %% slideshow={"slide_type": "fragment"}
def block_state(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max, sum of exp(score - max)) of the last dim of scores (..., n)."""
    row_max = scores.amax(dim=-1)
    return row_max, torch.exp(scores - row_max.unsqueeze(-1)).sum(dim=-1)


torch.manual_seed(0)
row = torch.randn(10, dtype=torch.float64)
print("state of the first 6 scores:", block_state(row[:6]))
print("state of the last 4 scores: ", block_state(row[6:]))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### A fully masked tile
# With a mask (causal, or padding) a whole block of a row can be $-\infty$. Its state is then
# $m_b = -\infty$, and even the block's own sum measures each score from $-\infty$:
# $e^{-\infty - (-\infty)}$ is NaN, and the NaN then spreads to the whole output row. The fix:
# where the maximum is $-\infty$, subtract 0 instead; every score of that row is $-\infty$, and
# $e^{-\infty} = 0$ is the right contribution. `tiled.exp_shifted(x, shift)` is $e^{x - \text{shift}}$
# with a shift of $-\infty$ treated as 0, and `tiled.softmax_state` is `block_state` made safe
# with it.

# %% slideshow={"slide_type": "fragment"}
hidden = torch.full((3,), -math.inf, dtype=torch.float64)      # a block where everything is masked
print("block_state of a fully masked block:", block_state(hidden))
print("exp(-inf - (-inf)) =", torch.exp(hidden[0] - hidden[0]).item())
print("helpers.flash.tiled.softmax_state:", tiled.softmax_state(hidden))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 1: merge two softmax states
# Write `merge(max_a, sum_a, max_b, sum_b)` returning `(max, sum)` for the two blocks together,
# the identity above in code. It must survive logits of 1000 and fully masked blocks
# (max $-\infty$) without NaN. The cells after it merge states with your function once it passes.
#
# <details><summary>Hint 1: the idea</summary>
#
# Two partial softmax sums measured from different maxima cannot be added as they are: bring both
# to the same (larger) maximum first.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Take the larger of the two maxima. Rescale each sum by $e^{\text{its max} - \text{new max}}$,
# computed with the course's `exp_shifted` so that a new maximum of $-\infty$ gives no NaN, and
# add the two. Return the new maximum and the new sum.
# </details>

# %% slideshow={"slide_type": "fragment"}
def merge(max_a: torch.Tensor, sum_a: torch.Tensor, max_b: torch.Tensor, sum_b: torch.Tensor):
    """States (rows,) of two blocks of the same rows -> the state (max, sum) of both."""
    ### BEGIN SOLUTION
    new_max = torch.maximum(max_a, max_b)
    new_sum = tiled.exp_shifted(max_a, new_max) * sum_a + tiled.exp_shifted(max_b, new_max) * sum_b
    return new_max, new_sum
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("flash_attention.merge_softmax_states", merge)


# %% slideshow={"slide_type": "fragment"}
def course_merge(max_a, sum_a, max_b, sum_b):
    """helpers.flash.tiled.merge_softmax_states, with merge's arguments."""
    merged = tiled.merge_softmax_states(tiled.SoftmaxState(max_a, sum_a), tiled.SoftmaxState(max_b,
                                                                                             sum_b))
    return merged.row_max, merged.row_sum


merge_states = yours_or("flash_attention.merge_softmax_states", merge, course_merge)
merged_max, merged_sum = merge_states(*block_state(row[:6]), *block_state(row[6:]))
whole_max, whole_sum = block_state(row)
print(f"one pass : max {whole_max:.6f}, sum {whole_sum:.12f}")
print(f"merged   : max {merged_max:.6f}, sum {merged_sum:.12f}")
print("log-sum-exp from the merged state equals torch.logsumexp:",
      torch.isclose(merged_max + merged_sum.log(), row.logsumexp(0), rtol=1e-15, atol=0).item())
print("two fully masked blocks merged:", merge_states(*tiled.softmax_state(hidden),
                                                      *tiled.softmax_state(hidden)))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Because the exponent is always measured from the running maximum, logits of size 1000 are no
# problem, although $e^{1000}$ overflows even a float64:

# %% slideshow={"slide_type": "fragment"}
huge = 1000 * torch.randn(10, dtype=torch.float64)
print(f"largest logit {huge.max().item():.0f}; plain sum of exp:", torch.exp(huge).sum().item())
huge_max, huge_sum = merge_states(*block_state(huge[:6]), *block_state(huge[6:]))
print(f"online log-sum-exp: {(huge_max + huge_sum.log()).item():.6f} | torch.logsumexp: "
      f"{huge.logsumexp(0).item():.6f}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Algorithm 1, tile by tile (core)
#
# The USF notes print Algorithm 1 of the FlashAttention paper. For one head with $Q, K, V$ of
# shape $N \times d$, after line 1 has picked the tile sizes $B_r$ (queries) and $B_c$ (keys):
#
# - line 2: $O = 0$ ($N \times d$), $\ell = 0$ and $m = -\infty$ (one number per query), all in HBM.
# - lines 3 and 4: cut $Q$, $O$, $\ell$, $m$ into tiles of $B_r$ rows, $K$ and $V$ into tiles of $B_c$ rows.
# - line 5: for every key tile $j$:
# - line 6: load $K_j, V_j$ into SRAM;
# - line 7: for every query tile $i$:
# - line 8: load $Q_i, O_i, \ell_i, m_i$;
# - line 9: $S_{ij} = Q_i K_j^\top$;
# - line 10: $\tilde m_{ij} = \text{rowmax}(S_{ij})$, $\tilde P_{ij} = e^{S_{ij} - \tilde m_{ij}}$, $\tilde\ell_{ij} = \text{rowsum}(\tilde P_{ij})$;
# - line 11: $m_i^{new} = \max(m_i, \tilde m_{ij})$, $\ell_i^{new} = e^{m_i - m_i^{new}} \ell_i + e^{\tilde m_{ij} - m_i^{new}} \tilde\ell_{ij}$;
# - line 12: $O_i \leftarrow \left(\ell_i\, e^{m_i - m_i^{new}}\, O_i + e^{\tilde m_{ij} - m_i^{new}}\, \tilde P_{ij} V_j\right) / \ell_i^{new}$, row by row;
# - line 13: $\ell_i \leftarrow \ell_i^{new}$, $m_i \leftarrow m_i^{new}$, written back to HBM.
#
# Line 12 keeps $O$ normalised after every key tile: the old output is un-normalised (times
# $\ell_i$), moved to the new maximum, the new tile's contribution is added, and the sum divided by
# $\ell^{new}_i$. Lines 10 and 11 are the merge of Exercise 1. The paper's listing leaves out the
# $1/\sqrt{d}$ scaling of the scores.

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention", "3.")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 2: Algorithm 1 in PyTorch
# Write `algorithm_1(Q, K, V, block_r, block_c)` for one head, returning $O$ ($N \times d$).
# Slicing a tile out of a tensor stands for "load from HBM to SRAM"; keep `O`, `ell` and `m` as
# full-size tensors, as they live in HBM. Scale the scores by $1/\sqrt{d}$, and write the
# softmax yourself (the check refuses softmax calls). The tiles need not divide $N$: the last one
# is simply shorter. The check compares with naive attention, ragged tiles and scores in the
# thousands included; the cell after it runs your function against naive attention and the
# course's `tiled_attention_fa1`.
#
# <details><summary>Hint 1: the idea</summary>
#
# Each query row carries its running maximum, sum and normalised output across the key tiles;
# every new tile is merged into them exactly as two softmax states are merged, with the output
# moved along.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Scale the queries once, and start every row's
# state: output and sum at zero, maximum at minus infinity. (2) Key tiles outside, query tiles
# inside, as in the listing. (3) For each pair of tiles: the tile's own softmax state (line 10),
# merged into the rows' running state (line 11). (4) The output tile moved to the new state (line
# 12), and the state stored (line 13).</details>
#
# <details><summary>Hint 3: closer</summary>Line 12 un-normalises the old output with the old sum,
# moves both parts to the new maximum, adds the tile's exponentials times the value tile, and
# divides by the new sum. Never build the whole N by N matrix: one tile of scores at a
# time.</details>

# %% slideshow={"slide_type": "fragment"}
def algorithm_1(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, block_r: int,
                block_c: int) -> torch.Tensor:
    """Algorithm 1 of FlashAttention for one head. Q, K, V: (N, d). Returns O: (N, d)."""
    ### BEGIN SOLUTION
    n, d = Q.shape
    Q = Q / math.sqrt(d)
    out = torch.zeros(n, d, dtype=Q.dtype)                                 # line 2: O, l, m
    ell = torch.zeros(n, dtype=Q.dtype)
    m = torch.full((n,), -math.inf, dtype=Q.dtype)
    for j in range(0, n, block_c):                                          # line 5
        K_j, V_j = K[j:j + block_c], V[j:j + block_c]                       # line 6
        for i in range(0, n, block_r):                                      # line 7
            r = slice(i, i
                      + block_r)                                       # line 8: Q_i, O_i, l_i, m_i
            S_ij = Q[r] @ K_j.T                                             # line 9
            m_tile = S_ij.amax(dim=1)                                       # line 10
            P_tile = torch.exp(S_ij - m_tile[:, None])
            ell_tile = P_tile.sum(dim=1)
            m_new = torch.maximum(m[r], m_tile)                             # line 11
            ell_new = torch.exp(m[r] - m_new) * ell[r] + torch.exp(m_tile - m_new) * ell_tile
            out[r] = ((ell[r] * torch.exp(m[r] - m_new))[:, None] * out[r]   # line 12
                    + torch.exp(m_tile - m_new)[:, None] * (P_tile @ V_j)) / ell_new[:, None]
            ell[r], m[r] = ell_new, m_new                                   # line 13
    return out
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("flash_attention.algorithm_1", algorithm_1)


# %% slideshow={"slide_type": "fragment"}
def course_algorithm_1(Q, K, V, block_r, block_c):
    """helpers.flash.tiled.tiled_attention_fa1 (Algorithm 1 for batches of heads), with
    algorithm_1's arguments."""
    return tiled.tiled_attention_fa1(Q, K, V, block_q=block_r, block_k=block_c)


fa1 = yours_or("flash_attention.algorithm_1", algorithm_1, course_algorithm_1)
torch.manual_seed(1)
Q_demo, K_demo, V_demo = (torch.randn(10, 4, dtype=torch.float64) for _ in range(3))
expected, _ = scaled_dot_product_attention(Q_demo, K_demo, V_demo)
for b_r, b_c in ((4, 3), (10, 10), (1, 7)):
    error = (fa1(Q_demo, K_demo, V_demo, b_r, b_c) - expected).abs().max().item()
    assert error < 1e-12
    print(f"B_r={b_r:2d}, B_c={b_c:2d} (N=10): max |Algorithm 1 - naive| < 1e-12")
helper_fa1 = tiled.tiled_attention_fa1(Q_demo, K_demo, V_demo, block_q=4, block_k=3)
assert (helper_fa1 - fa1(Q_demo, K_demo, V_demo, 4, 3)).abs().max() < 1e-12
print("helpers.flash.tiled.tiled_attention_fa1 agrees with it to 1e-12")

# %% [markdown] slideshow={"slide_type": "slide"}
# The differences are float64 rounding, nothing more. `helpers.flash.tiled.tiled_attention_fa1`
# is the same loop for batches of heads, with masks and causal attention (skipping the tiles a
# causal mask hides entirely).
#
# ## 4. The FlashAttention-2 loop order (optional)
#
# FlashAttention-2 swaps the loops: **query tiles outside, key tiles inside**. A query tile then
# stays on the chip from its first key tile to its last, so it can keep an *un-normalised*
# accumulator $\sum_j e^{S_{ij} - m_i} V_j$ and divide by $\ell_i$ once, at the end. It saves the
# log-sum-exp $m_i + \log \ell_i$ of each row for the backward pass. The inner loop body is one
# **tile step**: fold one key tile into the running max, sum and accumulator of a query tile.
#
# ### Exercise 3: one tile step
# Write the inner loop body: given the running `row_max`, `row_sum`, `acc` of a query tile and
# the scores and values of one key tile, return the updated three. The checker runs your step
# over every tile of a causal head where one query is fully masked; the cells after it build
# FlashAttention-2 from your step once it passes.
#
# <details><summary>Hint 1: the idea</summary>
#
# The tile may raise a row's maximum. Everything accumulated so far was measured from the old
# maximum, so rescale it to the new one before adding this tile's contribution.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Each row's new maximum, this tile's scores
# included. (2) Move what was accumulated (the sum and the output accumulator) from the old maximum
# to the new one. (3) Add this tile's part, measured from the new maximum. Every exponential goes
# through the course's exp_shifted.</details>
#
# <details><summary>Hint 3: closer</summary>The correction is e to the power (old maximum minus new
# maximum). This tile's part: its weights (the exponentials of its scores from the new maximum)
# summed per row, and the weights times the value tile. exp_shifted keeps a fully masked row
# (maximum minus infinity) free of NaN.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def my_tile_step(row_max: torch.Tensor, row_sum: torch.Tensor, acc: torch.Tensor,
                 scores: torch.Tensor, v_tile: torch.Tensor):
    """row_max, row_sum: (B_r,); acc: (B_r, d_v); scores: (B_r, B_c), -inf where masked;
    v_tile: (B_c, d_v). Returns the new (row_max, row_sum, acc)."""
    ### BEGIN SOLUTION
    new_max = torch.maximum(row_max, scores.amax(-1))
    correction = tiled.exp_shifted(row_max, new_max)
    weights = tiled.exp_shifted(scores, new_max.unsqueeze(-1))
    new_sum = correction * row_sum + weights.sum(-1)
    new_acc = correction.unsqueeze(-1) * acc + weights @ v_tile
    return new_max, new_sum, new_acc
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("flash_attention.tile_step", my_tile_step)


# %% slideshow={"slide_type": "fragment"}
def course_tile_step(row_max, row_sum, acc, scores, v_tile):
    """helpers.flash.tiled.tile_step, with my_tile_step's arguments."""
    return tuple(tiled.tile_step(tiled.TileState(row_max, row_sum, acc), scores, v_tile))


tile_step = yours_or("flash_attention.tile_step", my_tile_step, course_tile_step)


# %% slideshow={"slide_type": "fragment"}
def flash_attention_2(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, block_r: int,
                      block_c: int):
    """FlashAttention-2 order for one head. Q, K, V: (N, d). Returns O (N, d) and lse (N,)."""
    n, d = Q.shape
    Q = Q / math.sqrt(d)
    out, lse = torch.empty(n, d, dtype=Q.dtype), torch.empty(n, dtype=Q.dtype)
    for i in range(0, n, block_r):              # each query tile is independent of the others
        r = slice(i, i + block_r)
        rows = len(range(n)[r])
        state = (torch.full((rows,), -math.inf, dtype=Q.dtype),   # on chip for the whole inner loop
                 torch.zeros(rows, dtype=Q.dtype), torch.zeros(rows, d, dtype=Q.dtype))
        for j in range(0, n, block_c):
            state = tile_step(*state, Q[r] @ K[j:j + block_c].T, V[j:j + block_c])
        m, ell, acc = state
        out[r] = acc / ell[:, None]             # divide once
        lse[r] = m + torch.log(ell)
    return out, lse

# %% slideshow={"slide_type": "fragment"}
out_fa2, lse_fa2 = flash_attention_2(Q_demo, K_demo, V_demo, 4, 3)
fa2_error = (out_fa2 - expected).abs().max().item()
lse_error = (lse_fa2 - (Q_demo @ K_demo.T / 2).logsumexp(dim=1)).abs().max().item()
assert fa2_error < 1e-12 and lse_error < 1e-12
print("max |FA-2 - naive| < 1e-12; max |lse - logsumexp of the scaled scores| < 1e-12")
helper_out, helper_lse = tiled.tiled_attention_fa2(Q_demo, K_demo, V_demo, block_q=4, block_k=3)
assert torch.allclose(helper_out, out_fa2, rtol=0, atol=1e-12) and torch.allclose(helper_lse,
                                                                                  lse_fa2)
print("helpers.flash.tiled.tiled_attention_fa2 agrees with the notebook's flash_attention_2")

# %% [markdown] slideshow={"slide_type": "subslide"}
# `helpers.flash.tiled.tiled_attention_fa2` is the same loop for batches of heads, with masks; it
# also skips the key tiles that a causal mask hides completely.
#
# ### Why this order parallelises better
# In Algorithm 1 the *inner* loop runs over query tiles, and every key tile $j$ rewrites every
# output tile $O_i$. Two key tiles processed at the same time would race on the same $O_i$, so a
# GPU can only run the $B \cdot H$ (batch, head) pairs in parallel, each with its loops in
# sequence. In the FlashAttention-2 order each query tile owns its output rows: the GPU can run
# one program per (query tile, batch, head). The cell counts them for GPT-2 medium training and
# for one long sequence at inference, against the 108 SMs of an A100. It also counts the
# divisions by $\ell$: FA-1 rescales the whole output once per key tile, FA-2 once in all.

# %% slideshow={"slide_type": "fragment"}
def programs(batch: int, heads: int, n: int, order: str) -> int:
    """Independent pieces of work: (batch, head) pairs for FA-1, times query tiles for FA-2."""
    return batch * heads * (math.ceil(n / FA2_BLOCK_R) if order == "FA-2" else 1)


for label, (batch, heads, n) in {"GPT-2 medium training": (64, 16, 1024),
                                 "one 16k-token sequence": (1, 16, 16384)}.items():
    fa1, fa2 = programs(batch, heads, n, "FA-1"), programs(batch, heads, n, "FA-2")
    print(f"{label:24s} B={batch:2d} H={heads} N={n:5d}: FA-1 {fa1:6,} programs "
          f"({min(fa1 / A100['SMs'], 1):.0%} of the SMs busy), FA-2 {fa2:6,} programs")
key_tiles = math.ceil(N / block_c)
print(f"divisions of output elements per head (N={N}, d={D}): FA-1 {key_tiles * N * D:,}, FA-2 "
      f"{N * D:,}")

# %% [markdown] slideshow={"slide_type": "slide"}
# With a long sequence and a small batch, Algorithm 1's order leaves most of the chip idle, while
# FlashAttention-2 has thousands of programs to hand out. The other savings are non-matrix FLOPs
# (the divisions above, and the rescaling), which run many times slower than tensor-core matrix
# products.
#
# The third idea of FlashAttention-2 is inside one program: how its work is split among the
# **warps** that execute it (a warp is 32 GPU threads working in lockstep; a program runs on a
# few of them). FlashAttention-1 split the key and value tiles across 4 warps ("split-K"): each
# warp computed part of $QK^\top$ for every query of the tile, so before the softmax the warps
# had to write their partial results to shared memory, synchronise and add them up.
# FlashAttention-2 splits the *query* tile instead: each warp owns some rows and sees all of K
# and V, so its rows' running max, sum and output need nothing from the other warps. In Triton the
# compiler does this split; the launch chooses only its size. `num_warps` is how many warps run
# one program (4, or 8 for head dimension 128, where the accumulator is twice as big).
# `num_stages` is software pipelining: how many K/V tiles are being loaded at once, so that the
# next tiles travel from HBM while the current one is being multiplied; each stage costs a tile's
# worth of shared memory, which is why larger head dimensions get fewer. Section 8 chooses all
# of them for the GPU at hand (`helpers.flash.gpu_blocks.choose_blocks`).
#
# ## 5. Watching the tiles (optional)
#
# `helpers.flash.tiled.trace_tiles` runs the FlashAttention-2 loop on one causal head of 16 tokens in
# tiles of 4 and keeps the state after every (query tile, key tile) step. The figure shows one
# step: which tiles are done (tiles above the diagonal are never visited), the running max and
# sum of the current query tile, and its output so far, $acc / \ell$. The title gives the distance
# to the final attention output: it reaches 0 when the tile's last key tile is folded in.

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(2)
N_WATCH, TILE = 16, 4
q_watch, k_watch, v_watch = (torch.randn(N_WATCH, 4, dtype=torch.float64) for _ in range(3))
STEPS = tiled.trace_tiles(q_watch, k_watch, v_watch, block_q=TILE, block_k=TILE, causal=True)
final_watch, _ = scaled_dot_product_attention(q_watch, k_watch, v_watch, mask=causal_mask(N_WATCH))
print(f"{N_WATCH} tokens in tiles of {TILE}: {(N_WATCH // TILE) ** 2} tile pairs, "
      f"{len(STEPS)} visited (the rest lie above the diagonal)")
TILE_COLOURS = ListedColormap(["white", "tab:green", "tab:orange", "lightgrey"])
TILE_LABELS = ["not yet", "done", "this step", "hidden by the causal mask"]


def tile_status(step: int) -> np.ndarray:
    """(T_r, T_c) codes: 0 not yet, 1 done, 2 this step, 3 hidden by the causal mask."""
    n_tiles = N_WATCH // TILE
    status = np.triu(np.full((n_tiles, n_tiles), 3), k=1)
    for done in STEPS[:step]:
        status[done.rows.start // TILE, done.cols.start // TILE] = 1
    current = STEPS[step]
    status[current.rows.start // TILE, current.cols.start // TILE] = 2
    return status


# %% [markdown] slideshow={"slide_type": "subslide"}
# The drawing: which tiles are done, the running statistics of the current query tile, and its
# output so far, compared with the final output.

# %% slideshow={"slide_type": "fragment"}
def draw_tile_map(ax_tiles, step: int, query_tile: int, key_tile: int) -> None:
    """The (N_WATCH // TILE, N_WATCH // TILE) grid of tiles at step `step`, coloured by status."""
    ax_tiles.imshow(tile_status(step), cmap=TILE_COLOURS, vmin=-0.5, vmax=3.5)
    ax_tiles.set(xticks=range(N_WATCH // TILE), yticks=range(N_WATCH // TILE), xlabel="key tile j",
                 ylabel="query tile i",
                 title=f"Step {step + 1} of {len(STEPS)}: tile ({query_tile}, {key_tile})")
    ax_tiles.grid(False)
    ax_tiles.legend(handles=[Patch(facecolor=c, edgecolor="black", label=t)
                             for c, t in zip(TILE_COLOURS.colors, TILE_LABELS, strict=True)],
                    loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=10)


def draw_tile_statistics(ax_stats, rows: list[int], row_max: torch.Tensor,
                         row_sum: torch.Tensor) -> None:
    """The running max m and sum l (TILE,) of the query tile's rows."""
    ax_stats.plot(rows, row_max, "o-", label="running max m")
    ax_stats.plot(rows, row_sum, "s-", label="running sum l")
    ax_stats.set(xticks=rows, xlabel="query", ylabel="value", title="Statistics of this query tile")
    ax_stats.legend(fontsize=10)


# %% slideshow={"slide_type": "fragment"}
def draw_tile_step(step: int) -> dict:
    """Draw step `step` of STEPS; return the numbers drawn."""
    snap = STEPS[step]
    query_tile, key_tile = snap.rows.start // TILE, snap.cols.start // TILE
    error = (snap.output - final_watch[snap.rows]).abs().max().item()
    fig, (ax_tiles, ax_stats, ax_out) = plt.subplots(1, 3, figsize=(16, 5.6))
    draw_tile_map(ax_tiles, step, query_tile, key_tile)
    rows = list(range(snap.rows.start, snap.rows.stop))
    draw_tile_statistics(ax_stats, rows, snap.row_max, snap.row_sum)
    heatmap(snap.output, row_labels=[f"q{r}" for r in rows], col_labels=[f"dim {c}"
                                                                         for c in range(4)],
            ax=ax_out, xlabel="output dimension", ylabel="query", cmap="coolwarm", vmin=-2, vmax=2,
            title=f"Output tile so far (off by {error:.2g})")
    fig.tight_layout()
    return {"query_tile": query_tile, "key_tile": key_tile, "row_max": snap.row_max.tolist(),
            "row_sum": snap.row_sum.tolist(), "error_vs_final": error}


drawn = draw_tile_step(7)
plt.show()
print({name: (round(value, 4) if isinstance(value, float) else value) for name,
       value in drawn.items()
       if name != "row_max" and name != "row_sum"})

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds ids that change on every run; the static figure above is the same
# drawing.
explorer = Explorer(draw_tile_step, step=widgets.IntSlider(value=7, min=0, max=len(STEPS) - 1,
                                                           description="step"))
explorer

# %% slideshow={"slide_type": "fragment"}
first_key_tile = explorer.set(step=6)    # query tile 3 meets key tile 0
last_key_tile = explorer.set(step=9)     # query tile 3 meets key tile 3, its last
assert first_key_tile["query_tile"] == last_key_tile["query_tile"] == 3
assert first_key_tile["row_sum"] != last_key_tile["row_sum"], "the running sum moves"
assert first_key_tile["error_vs_final"] > 0.01 > 1e-12 > last_key_tile["error_vs_final"]
print(f"query tile 3: off by {first_key_tile['error_vs_final']:.3f} after key tile 0, "
      f"by less than 1e-12 after key tile 3")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. A backward pass that recomputes (optional)
#
# Training needs gradients, and autograd through the tiled loop would save every tile of $P$:
# the $N \times N$ matrix we avoided. FlashAttention saves only $Q, K, V$, the output $O$ and the
# log-sum-exp $L_i = m_i + \log \ell_i$ of each row, and rebuilds each tile of $P$ when it needs it:
# $P_{ij} = e^{S_{ij} - L_i}$. With $dO$ the gradient arriving at the output, the chain rule
# through $O = PV$ and the softmax gives, tile by tile:
#
# $$dV_j \mathrel{+}= P_{ij}^\top dO_i, \quad dP_{ij} = dO_i V_j^\top, \quad dS_{ij} = P_{ij} \circ (dP_{ij} - D_i), \quad dQ_i \mathrel{+}= \tfrac{1}{\sqrt{d}}\, dS_{ij} K_j, \quad dK_j \mathrel{+}= \tfrac{1}{\sqrt{d}}\, dS_{ij}^\top Q_i$$
#
# where $D_i = \sum_j P_{ij}\, dP_{ij} = \text{rowsum}(dO_i \circ O_i)$, one number per query,
# computed once from $O$. `helpers.flash.tiled.flash_attention` is a `torch.autograd.Function` with this
# backward. `gradcheck` compares it with finite differences in float64, with a mask and causal:

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(3)
q_check, k_check, v_check = (torch.randn(2, n, 4, dtype=torch.float64, requires_grad=True)
                             for n in (6, 9, 9))
mask_check = torch.rand(2, 6, 9) < 0.8


def tiled_for_gradcheck(q, k, v):
    return tiled.flash_attention(q, k, v, mask=mask_check, causal=True, block_q=4, block_k=4)


print("gradcheck passed:", torch.autograd.gradcheck(tiled_for_gradcheck, (q_check, k_check,
                                                                          v_check)))

# %% [markdown] slideshow={"slide_type": "subslide"}
# And against autograd through naive attention, with a random upstream gradient, on a bigger
# batch of heads whose tiles do not divide $N$:

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(4)
shapes = {"q": (2, 3, 50, 16), "k": (2, 3, 70, 16), "v": (2, 3, 70, 16)}
tensors = {name: torch.randn(shape, dtype=torch.float64) for name, shape in shapes.items()}
upstream = torch.randn(2, 3, 50, 16, dtype=torch.float64)
tiled_inputs = [t.clone().requires_grad_() for t in tensors.values()]
naive_inputs = [t.clone().requires_grad_() for t in tensors.values()]
tiled_grads = torch.autograd.grad(tiled.flash_attention(*tiled_inputs, causal=True, block_q=16,
                                                        block_k=16),
                                  tiled_inputs, upstream)
naive_out, _ = scaled_dot_product_attention(*naive_inputs, mask=causal_mask(50, 70))
naive_grads = torch.autograd.grad(naive_out, naive_inputs, upstream)
for name, mine, theirs in zip(shapes, tiled_grads, naive_grads, strict=True):
    error = (mine - theirs).abs().max().item()
    assert error < 1e-12
    print(f"d{name}: shape {tuple(mine.shape)}, max |tiled - naive| < 1e-12: {error < 1e-12}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 4: the backward pass, tile by tile
#
# Write `my_flash_backward` for one head without a mask: from $Q, K, V$, the saved output $O$ and
# log-sum-exp $L$, and the upstream gradient $dO$, return $(dQ, dK, dV)$, looping over tiles of
# `block` queries and `block` keys (the last tiles may be ragged) and never building the whole
# $P$. The check compares with autograd through naive attention; the cell after it runs the
# backward of a head with your function if it passes, else with the course's.
#
# <details><summary>Hint 1: the idea</summary>
#
# Each tile of $P$ is rebuilt from its scores and the row's saved $L$. Two of the gradients
# accumulate over the tiles, and one number per query, $D$, does not depend on the tile at all:
# compute it once, before the loops.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Before the loops: the three gradients at zero and
# D, one number per query. (2) Query tiles outside, key tiles inside. (3) For each pair: rebuild the
# tile of P from the scores and the saved L; add its contribution to dV; form dS; add its
# contributions to dQ and dK.</details>
#
# <details><summary>Hint 3: closer</summary>D is, per query, the sum over features of dO times O.
# The tile of P is the exponential of the scaled scores minus the rows' L. dS is P times (dP minus
# D), with dP from dO and the value tile. Both dQ and dK carry the scale of the scores.</details>

# %% slideshow={"slide_type": "fragment"}
def my_flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor, grad_out: torch.Tensor, block: int):
    """q (N_q, d), k and v (N_k, d), out and grad_out (N_q, d), lse (N_q,) -> (dq, dk, dv)."""
    ### BEGIN SOLUTION
    scale = q.shape[-1] ** -0.5
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    big_d = (grad_out * out).sum(-1)  # D_i = rowsum(dO_i * O_i), once per query
    query_tiles = [slice(s, s + block) for s in range(0, q.shape[0], block)]
    key_tiles = [slice(s, s + block) for s in range(0, k.shape[0], block)]
    for rows in query_tiles:
        for cols in key_tiles:
            probs = torch.exp(scale * q[rows] @ k[cols].T - lse[rows,
                                                                None])  # this tile of P, rebuilt
            dv[cols] += probs.T @ grad_out[rows]
            d_scores = probs * (grad_out[rows] @ v[cols].T - big_d[rows, None])
            dq[rows] += scale * d_scores @ k[cols]
            dk[cols] += scale * d_scores.T @ q[rows]
    return dq, dk, dv
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("flash_attention.backward", my_flash_backward)

# %% slideshow={"slide_type": "fragment"}
def course_flash_backward(q, k, v, out, lse, grad_out, block):
    """The course's tiled backward (helpers.flash.tiled), with my_flash_backward's arguments."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    return tiled.tiled_attention_backward(q, k, v, out, lse, grad_out, None, False, scale, block,
                                          block)


flash_backward = yours_or("flash_attention.backward", my_flash_backward, course_flash_backward)
torch.manual_seed(5)
q_head, k_head, v_head = (torch.randn(n, 16, dtype=torch.float64) for n in (37, 45, 45))
grad_head = torch.randn(37, 16, dtype=torch.float64)
out_head, lse_head = tiled.tiled_attention_fa2(q_head, k_head, v_head, block_q=16, block_k=16)
mine = flash_backward(q_head, k_head, v_head, out_head, lse_head, grad_head, 16)
leaves = [t.clone().requires_grad_() for t in (q_head, k_head, v_head)]
theirs = torch.autograd.grad(scaled_dot_product_attention(*leaves)[0], leaves, grad_head)
backward_gap = max((a - b).abs().max().item() for a, b in zip(mine, theirs, strict=True))
assert backward_gap < 1e-12
print("a head of 37 queries and 45 keys, tiles of 16: max |tiled backward - autograd| < 1e-12")

# %% [markdown] slideshow={"slide_type": "subslide"}
# What recomputation saves, per layer of GPT-2 medium on a batch of 64: the softmax output $P$
# that autograd would keep, against the log-sum-exp that FlashAttention keeps (in fp32).

# %% slideshow={"slide_type": "fragment"}
p_bytes = BATCH * HEADS * N * N * BYTES
lse_bytes = BATCH * HEADS * N * 4
print(f"P: {p_bytes / 2**30:.1f} GiB per layer; log-sum-exp: {lse_bytes / 2**20:.1f} MiB "
      f"({p_bytes // lse_bytes}x less)")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Peak memory on this CPU: quadratic against linear (optional)
#
# `helpers.flash.profiling.peak_memory_bytes(fn)` runs `fn` under torch's profiler, which records every
# allocation and free of PyTorch's CPU allocator with its running total, including the scratch
# buffers that C++ kernels allocate. The highest total during the call, less the total at its
# start, is the peak. It depends only on tensor sizes, so it repeats exactly from run to run.
#
# We measure, for a few heads in float32 (sizes printed below): naive attention, our tiled FA-2,
# and PyTorch's `F.scaled_dot_product_attention`, whose fused CPU kernel is tiled too
# (for 4-D `(B, H, N, d)` inputs).

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
SEQ_LENS = [256, 512, 1024, 2048, 4096]
HEADS_CPU, TILE_CPU = 2, 256
print(f"B=1, H={HEADS_CPU}, d=64, float32; tiled with {TILE_CPU} x {TILE_CPU} tiles")


def attention_runs(n: int) -> dict:
    """name -> a zero-argument function computing that attention of random (1, HEADS_CPU, n, 64)
    float32 inputs."""
    q, k, v = (torch.randn(1, HEADS_CPU, n, 64) for _ in range(3))
    return {"naive (helpers.model.attention)": lambda: scaled_dot_product_attention(q, k, v),
            "tiled FA-2 (helpers.flash.tiled)": lambda: tiled.tiled_attention_fa2(
                q, k, v, block_q=TILE_CPU, block_k=TILE_CPU),
            "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v)}


torch.manual_seed(5)
measured = [{name: profiling.peak_memory_bytes(run) for name, run in attention_runs(n).items()}
            for n in SEQ_LENS]
peaks = {name: [at_n[name] for at_n in measured] for name in measured[0]}

# %% slideshow={"slide_type": "fragment"}
print(f"{'N':>5s} {'naive MiB':>10s} {'tiled MiB':>10s} {'naive / tiled':>14s}")
for i, n in enumerate(SEQ_LENS):
    naive_mib = peaks["naive (helpers.model.attention)"][i] / 2**20
    tiled_mib = peaks["tiled FA-2 (helpers.flash.tiled)"][i] / 2**20
    print(f"{n:5d} {naive_mib:10.1f} {tiled_mib:10.1f} {naive_mib / tiled_mib:14.1f}")
growth = {name: (values[-1] / values[-2]) for name, values in peaks.items()}
for name, factor in growth.items():
    print(f"{name:32s} grows x{factor:.1f} from N={SEQ_LENS[-2]} to N={SEQ_LENS[-1]}")
assert growth["naive (helpers.model.attention)"] > 3.9, (
    "quadratic: doubling N quadruples the memory")
assert growth["tiled FA-2 (helpers.flash.tiled)"] < 2.1, "linear"
assert growth["F.scaled_dot_product_attention"] < 2.1, "linear"

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(8, 5))
for (name, values), marker in zip(peaks.items(), "os^", strict=True):
    ax.loglog(SEQ_LENS, [v / 2**20 for v in values], marker + "-", label=name)
ax.set_xscale("log", base=2)
ax.set(xlabel="sequence length N", ylabel="peak memory (MiB, log scale)",
       title=f"Peak CPU memory of attention, {HEADS_CPU} heads, d = 64, float32")
ax.legend(fontsize=11)
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# On a log-log plot a power law is a straight line: naive attention's slope is 2 (it holds
# several $N \times N$ matrices at once). The tiled versions hold the output, which grows like
# $N$, and a few tiles whose size does not depend on $N$: their curves bend towards slope 1, so
# doubling $N$ at most doubles their memory (the growth factors printed above).
#
# **And the time?** On a CPU our tiles are a Python loop calling PyTorch operations, each of
# which makes a pass over its tile in memory; PyTorch's fused kernel does the whole inner loop
# in C++ without those passes, so expect it to beat our loop. The cell times the three, taking
# turns so that a busy machine slows them alike (sizes printed). Times depend on the machine and
# its load: the stored copy of this notebook shows the times of the machine that built it, the
# course's checker ignores them, and yours will differ. No assertion compares them here: the budgets (our tiled forward's time against
# PyTorch's, and its memory against naive attention's, at a still longer sequence) are checked
# by `python benchmarks/bench_flash.py`, which repeats the measurement under fixed conditions.

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(6)
q, k, v = (torch.randn(1, 4, 2048, 64) for _ in range(3))
print("B, H, N, d =", tuple(q.shape), "float32")
methods = {"naive (helpers.model.attention)": lambda: scaled_dot_product_attention(q, k, v),
           "tiled FA-2 (helpers.flash.tiled)": lambda: tiled.tiled_attention_fa2(q, k, v),
           "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v)}
times = dict.fromkeys(methods, math.inf)
for _ in range(3):  # in turns: the best of three runs of each
    for name, run in methods.items():
        times[name] = min(times[name], best_time(run, repeats=1, warmup=0))
for name, seconds in times.items():
    print(f"{name:32s} {format_duration(seconds)}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. The same algorithm as a Triton kernel (optional)
#
# [Triton](https://triton-lang.org) writes GPU kernels in Python. A Triton **program** works on
# whole blocks (tiles) at once: `tl.load` reads a tile from memory into the chip, `tl.dot`
# multiplies two tiles, `tl.store` writes a tile back. `tl.dot` runs on the tensor cores for
# float16 and bfloat16 tiles (and for float32 only if allowed to round them to TF32). For float32
# the course's kernels ask for `input_precision="ieee"`: exact float32 products on the ordinary
# arithmetic units, *not* the tensor cores, many times slower, so float32 serves for checking the
# kernels and the speed is measured in float16. The launch **grid**
# says how many programs run: here one per (query tile, batch x head), the FlashAttention-2 order.
#
# `helpers/flash/triton_kernels.py` holds the kernels, `helpers/flash/triton_attention.py` checks the
# inputs and launches them. Things to look for as you read the forward kernel:
# - the inner loop is `tile_step` again, with `exp2` in place of `exp` (scores are multiplied by
#   $\log_2 e$ once; `exp2` is the GPU's fast instruction);
# - two passes over the key tiles: first the tiles every query of the tile sees in full, with no
#   mask arithmetic, then the few tiles that need a mask: the ragged last tile (keys past $N$) and,
#   when causal, the tiles on the diagonal; tiles above the diagonal are never loaded;
# - the $-\infty$ guard of section 2 (`shift`), and a query that sees no key writes 0, not NaN;
# - tile sizes must be powers of two, so a head dimension like 80 is padded to 128 with zeros.

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention", "8.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.flash import triton_attention, triton_kernels

if triton_attention.triton_available():
    for kernel_part in (triton_kernels.fold_key_tiles, triton_kernels.flash_forward_kernel):
        print(textwrap.dedent(inspect.getsource(kernel_part.fn)))
print("a head dimension of 80 is padded to", triton_attention.padded_head_dim(80))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Checking it on this CPU
# Without a GPU the same kernel runs under Triton's interpreter, which executes each program with
# NumPy, one after the other. That is enough to prove it right, on small sizes, against PyTorch's
# `F.scaled_dot_product_attention`: float32 and float16, causal and not, head dimensions from
# the smallest to the largest supported, and a sequence length that is not a multiple of the tile
# size (all printed below). Errors are printed as bounds: their last digits depend on the CPU
# and on the BLAS that NumPy uses. The interpreter's speed says nothing about a GPU's: **timing
# the kernel needs a GPU.** (bfloat16 runs on a GPU only: NumPy, which runs the interpreter, has
# no bfloat16, so the interpreter refuses it with an error that says so.)

# %% slideshow={"slide_type": "fragment"}
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3}
if not triton_attention.triton_available():
    print("Triton is not installed here (it is published for Linux): `pip install triton`.")
else:
    print(f"head dims {triton_attention.MIN_HEAD_DIM} to {triton_attention.MAX_HEAD_DIM}; "
          f"interpreted tiles "
          f"{triton_attention.default_blocks(64)[0]} queries x "
          f"{triton_attention.default_blocks(64)[1]} keys")
    generator = torch.Generator().manual_seed(7)
    kernel_device = "cpu" if triton_attention.interpreting() else "cuda"
    for dtype, d in ((torch.float32, 64), (torch.float16, 64), (torch.float32, 16), (torch.float16,
                                                                                     128)):
        for causal in (False, True):
            q, k, v = (torch.randn(1, 2, 77, d, generator=generator).to(kernel_device, dtype)
                       for _ in range(3))
            out, _ = triton_attention.triton_attention(q, k, v, causal=causal)
            reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                       is_causal=causal)
            error = (out.double() - reference).abs().max().item()
            assert error < TOLERANCE[dtype]
            print(f"{str(dtype):14s} d={d:3d} causal={causal!s:5s} N=77: max error < "
                  f"{TOLERANCE[dtype]:.0e} ok")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Tiles for the GPU you have
# A kernel launch fixes the tile sizes, the warps and the pipeline stages, and they must suit the
# GPU. Each program keeps its tiles in **shared memory**, the fast memory beside each
# multiprocessor, and a program that asks for more than the device allows per block is refused.
# And only from compute capability 8.0 on (A100, L4, H100) does Triton run `tl.dot` on the tensor
# cores; on a T4 (7.5, Colab's free GPU) it multiplies float32 copies of the tiles on the ordinary
# cores, which doubles the bytes each tile takes. A T4 also has no bfloat16 tensor cores, so
# there the kernels get float16. `gpu_blocks.choose_blocks(capability, shared memory, head dim)`
# counts the bytes of the tiles each kernel keeps ("needs" below; with tensor cores an upper
# bound, as the compiler shares some buffers) and takes the first launch of a short list that
# fits; a launch is (B_q, B_k, warps, stages), and its docstring shows the count. It is a plain
# function of three numbers, so this CPU can print what each GPU gets
# (`tests/flash/test_gpu_blocks.py` compiles the kernels for all four ahead of time, with no
# GPU, and checks the compiler's count against the device's limit and this one):

# %% slideshow={"slide_type": "fragment"}
from helpers.flash import gpu_blocks

print(f"{'GPU':22s} {'arch':5s} {'per block':9s} {'d':>4s}  {'dtype':9s} {'tensor cores':13s} "
      f"{'forward':15s} {'needs':7s}  {'backward':15s} needs")
for gpu_name, (capability, shared) in gpu_blocks.STUDENT_GPUS.items():
    for d in (64, 128):
        chosen = gpu_blocks.choose_blocks(capability, shared, d)
        fwd, bwd = chosen.forward, chosen.backward
        print(f"{gpu_name:22s} sm_{capability[0]}{capability[1]} {shared // 1024:3d} KiB  {d:4d}  "
              f"{str(chosen.dtype)[6:]:9s} {'yes' if chosen.tensor_cores else 'no':13s} "
              f"{str(fwd.launch()):15s} {fwd.shared_bytes // 1024:3d} KiB  "
              f"{str(bwd.launch()):15s} {bwd.shared_bytes // 1024:3d} KiB")

# %% [markdown] slideshow={"slide_type": "subslide"}
# On a GPU the next cell asks the same function about yours, with the numbers
# `torch.cuda.get_device_properties` reports, takes bfloat16 only where the GPU has it
# (`torch.cuda.is_bf16_supported(including_emulation=False)`: without that argument a T4 answers
# True, because torch can *emulate* bfloat16 there), runs the kernel with that choice (which
# `triton_attention` also makes by itself) against SDPA on one larger causal problem, and times
# both. On this CPU it prints only which GPU it would ask about.

# %% slideshow={"slide_type": "fragment"}
if not torch.cuda.is_available() or not triton_attention.triton_available():
    print("no CUDA GPU here: the table above is what a T4, an L4, an A100 or an H100 would get")
else:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())  # where "cuda" is
    has_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    gpu_dtype = torch.bfloat16 if has_bf16 else torch.float16
    mine = gpu_blocks.choose_blocks((props.major, props.minor),
                                    props.shared_memory_per_block_optin, 64, gpu_dtype)
    assert triton_attention.default_blocks(64, gpu_dtype) == mine.forward.launch()
    print(f"{props.name}: sm_{props.major}{props.minor}, "
          f"{props.shared_memory_per_block_optin // 1024} KiB per block, {gpu_dtype}; forward "
          f"{mine.forward.launch()}, backward {mine.backward.launch()}")
    q, k, v = (torch.randn(4, 16, 4096, 64, device="cuda", dtype=gpu_dtype) for _ in range(3))
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    runs = {"ours": lambda: triton_attention.triton_attention(
                q, k, v, causal=True, block_q=mine.forward.block_q,
                block_k=mine.forward.block_k)[0],
            "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    errors = {name: (run().float() - reference).abs().max().item() for name, run in runs.items()}
    assert errors["ours"] <= 4 * errors["SDPA"] + 1e-4
    for name, run in runs.items():
        seconds = best_time(lambda run=run: (run(), torch.cuda.synchronize()), repeats=5, warmup=2)
        print(f"{name:5s} B=4 H=16 N=4096 d=64 causal: max error {errors[name]:.1e}, "
              f"{format_duration(seconds)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The tiles a causal mask hides are never loaded
# A query tile whose last query is row $r$ sees no key past $r + N_k - N_q$, so its loop over key
# tiles stops there: FlashAttention-2 computes the loop bound from the tile's index instead of
# loading a tile only to mask all of it. `triton_attention.key_tiles_visited` runs the forward kernel
# with a counter that each program increments once per key tile it loads, and returns the counts,
# one per query tile (sizes printed):

# %% slideshow={"slide_type": "fragment"}
N_COUNT, TILE_COUNT = 256, 32
if triton_attention.triton_available():
    loaded = {causal: triton_attention.key_tiles_visited(N_COUNT, N_COUNT, causal,
                                                         block_q=TILE_COUNT,
                                                     block_k=TILE_COUNT) for causal in (False,
                                                                                        True)}
    for causal, counts in loaded.items():
        print(f"N={N_COUNT}, tiles of {TILE_COUNT}, {'causal' if causal else 'full  '}: key tiles "
              f"loaded "
              f"per query tile {counts}, {sum(counts)} in all")
    skipped = sum(loaded[False]) - sum(loaded[True])
    assert loaded[True] == list(range(1, N_COUNT // TILE_COUNT + 1))  # query tile i loads i + 1
    print(f"causal skips {skipped} of {sum(loaded[False])} tiles "
          f"({skipped / sum(loaded[False]):.0%})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Nearly half of the work disappears; the fraction tends to one half as the tiles get smaller
# against $N$, which is why benchmarks count causal attention as half the FLOPs.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 9. The backward pass as Triton kernels (optional)
#
# Section 6 derived the backward pass and wrote it as a PyTorch loop over tiles. Here it is again,
# the way the kernels compute it. Take one query row $i$, its scores $S_{ij} = \text{scale}\; q_i
# \cdot k_j$, its weights $P_{ij} = e^{S_{ij} - L_i}$ and its output $O_i = \sum_j P_{ij} V_j$.
# Given $dO$, the gradient arriving at the output:
#
# - $O_i$ is linear in each $V_j$ with weight $P_{ij}$, so $dV_j = \sum_i P_{ij}\, dO_i$:
#   $dV = P^\top dO$;
# - and linear in each $P_{ij}$ with vector $V_j$, so $dP_{ij} = dO_i \cdot V_j$: $dP = dO\, V^\top$;
# - the softmax's Jacobian gives $dS_{ij} = P_{ij}\,(dP_{ij} - \sum_l P_{il}\, dP_{il})$, and the
#   sum is $\sum_l P_{il}\, dO_i \cdot V_l = dO_i \cdot O_i$: one number per query,
#   $D = \text{rowsum}(dO \circ O)$, computed once from $O$ before the kernels start. So
#   $dS = P \circ (dP - D)$;
# - $S = \text{scale}\; Q K^\top$, so $dQ = \text{scale}\; dS\, K$ and $dK = \text{scale}\; dS^\top Q$.
#
# Every formula needs $P$, an $N_q \times N_k$ matrix per head, which the forward never wrote.
# The kernels **recompute** each tile of it from $Q$, $K$ and the **log-sum-exp** $L$ that the
# forward saved, one number per query: $P_{ij} = e^{q_i \cdot k_j\,\text{scale} - L_i}$ is the
# finished softmax in one step, with no running max or sum to redo. That is why the forward
# returns $L$: saving it costs $N$ numbers, saving $P$ would cost $N^2$ (section 6 printed both).
# The price is recomputation, paid in FLOPs, which the GPU has to spare.

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention", "9.")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Two kernels.** $dQ_i$ sums over key tiles, $dK_j$ and $dV_j$ over query tiles. One program
# per query tile could compute all three, but then every program would add into the same rows of
# $dK$ and $dV$ at the same time, which needs atomic additions. So, as in the Triton tutorial's
# kernel, one kernel runs a program per **key tile** that keeps $K_j, V_j$ on chip and walks the
# query tiles that see it (accumulating $dK_j$, $dV_j$), and a second runs a program per **query
# tile** that walks its key tiles (accumulating $dQ_i$). Both rebuild $P$ with the same helper,
# and both skip the tiles a causal mask hides: the key-tile program starts at the first query tile
# that sees its first key. `triton_attention.triton_attention` wraps forward and backward in a
# `torch.autograd.Function`, so `out.backward()` runs these kernels.
#
# **What the split costs.** Each kernel rebuilds $P$ itself, and both need $dP = dO\,V^\top$, so
# $QK^\top$ and $dO\,V^\top$ are computed twice: 7 products of $2 N_q N_k d$ FLOPs in the backward.
# FlashAttention-2's backward is one kernel over key tiles that also adds each tile's part of
# $dQ$ into global memory with **atomic additions**: 5 products. The trade: 40 % more backward
# FLOPs here, against no atomics, which serialise when many programs add into the same rows of
# $dQ$ and add in an order that changes from run to run (so FlashAttention-2's $dQ$ is not
# bit-for-bit reproducible). `benchmarks/bench_flash.py` reports TFLOP/s with the paper's count (5
# products) for every method, so that they compare on equal work; for our kernels it also prints
# the FLOPs they really execute. The cell counts both:

# %% slideshow={"slide_type": "fragment"}
forward_products = 2                       # S = Q K^T, O = P V
fa2_backward = ["S = Q K^T (again)", "dV = P^T dO", "dP = dO V^T", "dQ = dS K", "dK = dS^T Q"]
ours_backward = (["S = Q K^T (again)", "dV = P^T dO", "dP = dO V^T",
                  "dK = dS^T Q"]      # dK, dV kernel
                 + ["S = Q K^T (again)", "dP = dO V^T (again)", "dQ = dS K"])        # dQ kernel
for name, products in (("FlashAttention-2, atomics", fa2_backward), ("this course, two kernels",
                                                                     ours_backward)):
    print(f"{name:26s} backward: {len(products)} products = {len(products) / forward_products:.1f} "
          f"x the forward; "
          f"forward + backward {1 + len(products) / forward_products:.1f} x")
print(f"FLOPs of one product at N={N}, d={D}, per head: 2 N^2 d = {2 * N * N * D:,}")

# %% slideshow={"slide_type": "fragment"}
if triton_attention.triton_available():
    for kernel_part in (triton_kernels.recompute_probs, triton_kernels.flash_backward_dk_dv_kernel,
                        triton_kernels.flash_backward_dq_kernel):
        print(textwrap.dedent(inspect.getsource(kernel_part.fn)))
    print(textwrap.dedent(inspect.getsource(triton_attention.TritonAttention)))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Checking the backward on this CPU
# The interpreter runs the backward kernels too. The cell compares their gradients with autograd
# through naive attention in float64 on the same inputs, with a random upstream gradient: float32
# and float16, causal and not, fewer queries than keys, and lengths that are not multiples of the
# tile (sizes printed; errors printed as bounds). Under the interpreter the kernels also run in
# float64, where the last line checks them against finite differences along a random direction
# (gradcheck's fast mode, written out).

# %% slideshow={"slide_type": "fragment"}
GRAD_TOLERANCE = {torch.float32: 2e-5, torch.float16: 6e-3}


def naive_gradients(q, k, v, upstream, causal: bool):
    """dQ, dK, dV by autograd through helpers.model.attention, in float64."""
    inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    n_q, n_k = q.shape[2], k.shape[2]
    mask = causal_mask(n_q, n_k, device=q.device) if causal else None
    out, _ = scaled_dot_product_attention(*inputs, mask=mask)
    return torch.autograd.grad(out, inputs, upstream.double())


# %% slideshow={"slide_type": "fragment"}
if triton_attention.triton_available():
    generator = torch.Generator().manual_seed(8)
    for dtype, d in ((torch.float32, 64), (torch.float16, 64), (torch.float32, 128), (torch.float16,
                                                                                      16)):
        for causal in (False, True):
            q, k, v = (torch.randn(1, 2, n, d, generator=generator).to(kernel_device,
                                                                       dtype).requires_grad_()
                       for n in (40, 57, 57))
            upstream = torch.randn(1, 2, 40, d, generator=generator).to(kernel_device, dtype)
            out, _ = triton_attention.triton_attention(q, k, v, causal=causal)
            kernel_grads = torch.autograd.grad(out, (q, k, v), upstream)
            for got, expected in zip(kernel_grads, naive_gradients(q, k, v, upstream, causal),
                                     strict=True):
                assert (got.double() - expected).abs().max().item() < GRAD_TOLERANCE[dtype]
            print(f"{str(dtype):14s} d={d:3d} causal={causal!s:5s} N_q=40, N_k=57: dQ, dK, dV "
                  f"max error < {GRAD_TOLERANCE[dtype]:.0e} ok")

# %% slideshow={"slide_type": "fragment"}
if triton_attention.triton_available() and triton_attention.interpreting():
    generator = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 1, n, 16, generator=generator, dtype=torch.float64) for n in (19, 37,
                                                                                            37))
    upstream = torch.randn(1, 1, 19, 16, generator=generator, dtype=torch.float64)

    def kernel_attention(q, k, v):
        return triton_attention.triton_attention(q, k, v, causal=True, block_q=16, block_k=16)[0]

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kernel_grads = torch.autograd.grad(kernel_attention(*leaves), leaves, upstream)
    eps = 1e-6
    for i, name in enumerate("qkv"):
        direction = torch.randn(leaves[i].shape, generator=generator, dtype=torch.float64)
        plus, minus = [q, k, v], [q, k, v]
        plus[i], minus[i] = plus[i] + eps * direction, minus[i] - eps * direction
        numerical = ((kernel_attention(*plus) - kernel_attention(*minus)) * upstream).sum() / (2
                * eps)
        analytical = (kernel_grads[i] * direction).sum()
        assert abs(numerical - analytical) < 1e-6 * (1 + abs(analytical)), f"d{name}"
    print("float64, causal, N_q=19, N_k=37, tiles of 16: for dq, dk and dv, "
          "|finite differences - backward kernels| < 1e-6 (1 + |backward kernels|)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### GPU figures: our kernels on an H200
# On a CUDA GPU, `python benchmarks/bench_flash.py --gpu` measures TFLOP/s and peak GPU memory
# against $N$ for naive attention, `F.scaled_dot_product_attention` (SDPA) with each backend forced
# in turn (math, memory-efficient, flash, cuDNN) and our kernels, forward and forward+backward,
# causal and not, and saves the figures to `data/flash_gpu_benchmark.json`. It takes minutes on a
# GPU, so this notebook never runs it: it draws the file the course ships, measured on an H200,
# together with `data/flash_gpu_accuracy.json` (errors at real sizes, and a short training run).
# `helpers.flash.gpu_figures` reads both and refuses a malformed file. The next cell says which
# machine, versions and date made them.

# %% slideshow={"slide_type": "fragment"}
gpu_results = gpu_figures.load_benchmark(data_dir() / "flash_gpu_benchmark.json")
gpu_accuracy = gpu_figures.load_accuracy(data_dir() / "flash_gpu_accuracy.json")
print(f"measured on an {gpu_results['device']} on {gpu_results['date']}: torch "
      f"{gpu_results['torch']}, "
      f"Triton {gpu_results['triton']}, CUDA {gpu_results['cuda']}; {gpu_results['dtype']}, "
      f"batch {gpu_results['batch']}, {gpu_results['heads']} heads")
print("methods:", ", ".join(dict.fromkeys(r["method"] for r in gpu_results["results"])))
if torch.cuda.is_available():
    print(f"This machine has a GPU ({torch.cuda.get_device_name()}):",
          "the command above measures it.")


# %% slideshow={"slide_type": "fragment"}
def draw_gpu_speed(results: dict) -> None:
    """TFLOP/s against N of every method: one row per pass, one column per (head dim, mask)."""
    columns = [(d, causal) for d in (64, 128) for causal in (False, True)]
    fig, axes = plt.subplots(2, len(columns), figsize=(20, 9), sharey="row")
    for ax_row, pass_name in zip(axes, gpu_figures.PASSES, strict=True):
        for ax, (d, causal) in zip(ax_row, columns, strict=True):
            for colour, method in enumerate(dict.fromkeys(r["method"] for r in results["results"])):
                points = sorted((r["n"], r["tflops"]) for r in results["results"]
                                if (r["method"], r["pass"], r["causal"], r["head_dim"]) ==
                                (method, pass_name, causal, d) and r["tflops"] is not None)
                if points:
                    ax.plot(*zip(*points, strict=True), "o-", label=method, color=f"C{colour}",
                            linewidth=3 if method == gpu_figures.OURS else 1.5)
            ax.set_xscale("log", base=2)
            ax.set(xlabel="sequence length N", ylabel=f"{pass_name} TFLOP/s",
                   title=f"{pass_name}, d = {d}, {'causal' if causal else 'full'}")
    axes[0, 0].legend(fontsize=10)
    fig.suptitle(f"{results['device']}, {results['dtype']}, B={results['batch']}, "
                 f"H={results['heads']} ({results['date']})")
    fig.tight_layout()
    plt.show()


draw_gpu_speed(gpu_results)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The next cell computes the fraction of the H200's peak each kernel reaches. The peak is NVIDIA's
# datasheet figure for the **H200 SXM**, "FP16 Tensor Core 1,979 TFLOPS", which is quoted with
# sparsity (a 2:4 pattern of zeros that the tensor cores skip); dense matrix products, which
# attention is, get half of it. The FLOP count is the FlashAttention-2 paper's, the same for
# every method (printed below, as the JSON states it); our backward executes more than that
# count, because each of its two kernels recomputes two products.

# %% slideshow={"slide_type": "fragment"}
peak = gpu_figures.H200_SXM_FP16_DENSE_TFLOPS
big_n = max(r["n"] for r in gpu_results["results"])
kernels_shown = {"ours": gpu_figures.OURS, "flash": "sdpa flash", "cuDNN": "sdpa cuDNN",
                 "mem-eff": "sdpa mem-efficient"}
print(f"H200 SXM dense FP16 tensor-core peak (datasheet): "
      f"{gpu_figures.H200_SXM_FP16_SPARSE_TFLOPS:,.0f} "
      f"/ 2 = {peak:.1f} TFLOP/s")
print("FLOPs counted:", gpu_results["flops"])
print(f"TFLOP/s at N = {big_n} (% of that peak):")
print(f"{'pass':17s}{'mask':7s}{'d':>4s}" + "".join(f"{name:>14s}" for name in kernels_shown))
gpu_summary = {}
for pass_name in gpu_figures.PASSES:
    for causal in (False, True):
        for d in (64, 128):
            row = {name: gpu_figures.tflops(gpu_results, method, pass_name, causal, d, big_n)
                   for name, method in kernels_shown.items()}
            gpu_summary[pass_name, causal, d] = row
            print(f"{pass_name:17s}{'causal' if causal else 'full':7s}{d:4d}"
                  + "".join(f"{t:8.0f} ({t / peak:3.0%})" for t in row.values()))
best_ours = max(row["ours"] for row in gpu_summary.values())
best_cudnn = max(row["cuDNN"] for row in gpu_summary.values())
print(f"best: ours {best_ours:.0f} TFLOP/s = {best_ours / peak:.0%} of peak, "
      f"cuDNN {best_cudnn:.0f} = {best_cudnn / peak:.0%}")

# %% slideshow={"slide_type": "fragment"}
long_n = 4096  # from here on the kernels' own speed shows, not the fixed cost of a call
for pass_name in gpu_figures.PASSES:
    vs_flash = gpu_figures.speed_ratios(gpu_results, "sdpa flash", pass_name, long_n)
    vs_cudnn = gpu_figures.speed_ratios(gpu_results, "sdpa cuDNN", pass_name, long_n)
    print(f"{pass_name}, N >= {long_n}: ours / SDPA flash {min(vs_flash.values()):.2f}-"
          f"{max(vs_flash.values()):.2f}x; ours slower than cuDNN by "
          f"{1 - max(vs_cudnn.values()):.0%}-{1 - min(vs_cudnn.values()):.0%}")
    for (causal, d, n), ratio in sorted(vs_flash.items()):
        if ratio < 1:
            print(f"    below SDPA flash: {'causal' if causal else 'full'}, d = {d}, N = {n}: "
                  f"{ratio:.2f}x")
at_big = [1 - r for p in gpu_figures.PASSES
          for (_, _, n), r in gpu_figures.speed_ratios(gpu_results, "sdpa cuDNN", p, big_n).items()]
print(f"N = {big_n}, both passes: ours slower than cuDNN by {min(at_big):.0%}-{max(at_big):.0%}")
short_ms = [r["ms"] for r in gpu_results["results"] if r["method"] == gpu_figures.OURS
            and r["n"] <= 1024]
short_ratios = [r for p in gpu_figures.PASSES
                for (_, _, n), r in gpu_figures.speed_ratios(gpu_results, "sdpa flash",
                                                             p).items() if n <= 1024]
print(f"N <= 1024: a call of ours takes {min(short_ms):.2f}-{max(short_ms):.2f} ms, "
      f"ours / SDPA flash {min(short_ratios):.2f}-{max(short_ratios):.2f}x")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### What the figures show
#
# **What the figures show.** From $N$ = 4096 on (printed above), our forward kernel runs 1.11 to
# 1.31 times as fast as SDPA's flash backend, which is FlashAttention-2 itself, and our
# forward+backward 0.98 to 1.16 times: faster everywhere except causal attention at $d$ = 64,
# where it is 0.98 times as fast. Against cuDNN's attention, NVIDIA's own, ours is 12 to 35 % slower at
# $N$ = 16384 (27 to 38 % in forward+backward from $N$ = 4096). The best of our kernels reaches
# 45 % of the H200 SXM's dense peak, cuDNN 60 %. Up to $N$ = 1024 a call of ours lasts under a
# millisecond (0.06 to 0.82 ms), and SDPA wins: there the curves measure mostly a fixed cost per
# call paid on the host, in Python and in Triton's launcher (which checks the arguments and picks
# the compiled kernel before the GPU is given any work), not the GPU's work itself. The
# forward+backward figures at the larger head dimension depend on the backward's tiles, warps and pipeline stages: a sweep on the H200 (its figures are in the
# docstring of `gpu_blocks.choose_blocks`) chose the setting that function now returns there for
# every head dimension, with which these figures were measured; the course's first, untuned
# choice was far slower there.
#
# **On the GPU you have.** Every figure in this section was measured on that one H200, in
# float16, with the launches of the H100 / H200 rows of section 8's table. No other GPU was
# measured, so this notebook cannot say how fast the kernels run on yours; the cell in section 8
# times them against SDPA there. What the table and the compiler do say: an A100 runs the same
# launches; an L4 the same forward, and a backward with one pipeline stage instead of two (its
# shared memory is smaller), both with fewer tensor cores and less memory bandwidth than an
# H200, so expect lower TFLOP/s everywhere. A T4 runs our kernels without tensor cores (Triton
# compiles `tl.dot` to fused multiply-adds below compute capability 8.0, which the compile test
# reads in the compiled code), with smaller tiles, while SDPA uses its memory-efficient backend
# there (FlashAttention-2 needs compute capability 8.0), CUDA kernels that do use the T4's float16
# tensor cores: expect ours to be much slower than SDPA there. The curves' shapes
# (memory linear in $N$ for ours and SDPA's fused kernels, quadratic for naive attention) do not
# depend on the GPU.

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Why cuDNN is faster: likely Hopper's features.** Nothing here isolates the cause (that would
# take the same kernel with and without each feature), but the likely one is what
# FlashAttention-3 was written around and cuDNN's attention uses: two pieces of hardware the
# H100 and H200 (the Hopper generation) added, and a way of scheduling warps that they reward. *TMA*,
# the Tensor Memory Accelerator, copies a whole tile between HBM and shared memory
# asynchronously from one instruction, so the threads spend no instructions or registers on
# addresses. *wgmma* (warpgroup matrix multiply-accumulate) lets four warps together run one
# large matrix product on the tensor cores, reading its operands straight from shared memory,
# and returns before it finishes. *Warp specialisation*, a scheduling technique rather than
# hardware (it predates Hopper, which makes it pay), gives those jobs to different warps:
# producer warps only issue TMA copies, consumer warps only issue wgmma and the softmax, and two
# groups of consumers take turns, so that loading the next tile, the matrix products and the
# exponentials all overlap. Our kernels are plain Triton: the compiler chooses the instructions
# and the pipeline from `num_warps` and `num_stages`, and the same source runs on an A100, on
# other vendors' GPUs and in the interpreter. For Hopper it does emit wgmma for our `tl.dot`
# (a test compiles the forward kernel for sm_90 and finds it), but our tiles travel by ordinary
# loads, not TMA copies, and every warp does every job in turn. Triton offers TMA through tensor
# descriptors and warp specialisation as a loop option, but both are recent, change between
# versions and GPU generations, and would tie the kernel to one of them: a portable teaching
# kernel leaves them out for now, and the gap printed above is, most likely, what that costs.

# %% slideshow={"slide_type": "fragment"}
def draw_gpu_memory(results: dict, methods: tuple[str, ...]) -> dict[str, float]:
    """Peak memory against N, log-log, full mask, for each pass and head dim; returns, per
    method, the largest growth of its peak memory per doubling of N."""
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5), sharey=True)
    growth = dict.fromkeys(methods, 0.0)
    colours = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(r["method"]
                                                              for r in results["results"]))}
    panels = [(p, d) for p in gpu_figures.PASSES for d in (64, 128)]
    for ax, (pass_name, d) in zip(axes, panels, strict=True):
        for method in methods:
            memory = gpu_figures.memory_by_n(results, method, pass_name, False, d)
            ax.plot(list(memory), list(memory.values()), "o-", label=method, color=colours[method])
            doublings = [memory[2 * n] / memory[n] for n in memory if 2 * n in memory]
            growth[method] = max(growth[method], *doublings)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel="sequence length N", ylabel="peak GPU memory (MiB)",
               title=f"{pass_name}, d = {d}")
    axes[0].legend(fontsize=10)
    fig.tight_layout()
    plt.show()
    return growth


# %% slideshow={"slide_type": "fragment"}
gpu_growth = draw_gpu_memory(gpu_results, ("naive", "sdpa math", gpu_figures.OURS, "sdpa flash"))
for method, factor in gpu_growth.items():
    print(f"{method:15s} peak memory grows at most x{factor:.2f} per doubling of N")
out_of_memory = {r["method"] for r in gpu_results["results"]
                 if r["n"] == big_n and r["peak_mb"] is None}
print("methods out of memory at the largest N:", sorted(out_of_memory))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Naive attention and SDPA's math backend store the $N \times N$ scores: their memory grows about
# four times per doubling of $N$ until they run out of the H200's memory, while ours and the
# flash backend grow two times, the inputs and the output (printed above).
#
# **Accuracy at real sizes.** The next cell prints, for float16 and bfloat16, the largest error
# of the output and of each gradient, ours and SDPA flash's, both against SDPA in float32 on the
# same rounded inputs; then the forward's error at ragged lengths, and a 300-step bf16 training
# run with each attention from the same seed.

# %% slideshow={"slide_type": "fragment"}
print(f"{'dtype':9s}{'d':>4s}{'N':>6s} {'mask':7s}" + "".join(f"{g + ' ours / flash':>22s}"
                                                              for g in ("O", "dQ", "dK", "dV")))
error_rows = [r for r in gpu_accuracy["rows"] if "ragged" not in r]
for r in error_rows:
    print(f"{r['dtype']:9s}{r['d']:4d}{r['n']:6d} {'causal' if r['causal'] else 'full':7s}"
          + "".join(f"{r[g][0]:11.1e} /{r[g][1]:8.1e}" for g in ("O", "dQ", "dK", "dV")))
above = [r["worst_ratio"] for r in error_rows if r["worst_ratio"] > 1.07]
print(f"ours / flash, worst of the four: at most "
      f"{max(r['worst_ratio'] for r in error_rows if r['worst_ratio'] <= 1.07):.2f} "
      f"in {len(error_rows) - len(above)} of {len(error_rows)} rows; the others: {above}")
for r in gpu_accuracy["rows"]:
    if "ragged" in r:
        print(f"ragged N_q = {r['ragged'][0]}, N_k = {r['ragged'][1]}, "
              f"{'causal' if r['causal'] else 'full'}: "
              f"max |O error| {r['O_err']:.1e}")
losses = gpu_accuracy["train"]
gap = max(abs(a - b) for a, b in zip(losses["sdpa"], losses["ours"], strict=True))
print(f"training, {len(losses['sdpa'])} steps: final loss SDPA {losses['sdpa'][-1]:.4f}, ours "
      f"{losses['ours'][-1]:.4f}, largest difference at any step {gap:.1e}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Our errors match the flash backend's in almost every row: the worst ratio of the four is at
# most 1.07 in 30 of the 32 rows, and in the other two both errors are a few float16 units in
# the last place: one gradient element rounded to the neighbouring float16 value (9.8e-04 against
# 2.4e-04, and 1.2e-04 against 6.1e-05, in the table). The training run with our kernels follows SDPA's to about $10^{-4}$ in the loss at every step.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# The answers use numbers computed in the cell just below.

# %% slideshow={"slide_type": "fragment"}
catch_up("08_flash_attention",
         "Check")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
training, inference = programs(64, 16, 1024, "FA-2"), programs(1, 16, 16384, "FA-2")
naive_intensity = flops / (traffic["naive"] * BYTES * BATCH * HEADS)
ridge = A100["fp16 tensor-core FLOP/s"] / A100["HBM bytes/s"]
softmax_intensity = 5 / (2 * BYTES)  # ~5 operations per score; read S, write P
print(f"FA-2 programs: {training:,} (GPT-2 medium training), {inference:,} (one 16k sequence); "
      f"FA-1: {programs(1, 16, 16384, 'FA-1')} for the 16k sequence")
print(f"FLOP per byte: naive attention {naive_intensity:.0f}, its softmax step "
      f"{softmax_intensity:.2f}; "
      f"A100 ridge point {ridge:.0f}")
forward_flops = costs.attention_flops(1, 1, N, N, D)
tiled_flops = sum(4 * len(range(N)[i:i + block_r]) * len(range(N)[j:j + block_c])
                  * D  # S and P V per tile
                  for i in range(0, N, block_r) for j in range(0, N, block_c))
assert tiled_flops == forward_flops
print(f"forward FLOPs per head at N={N}: naive {forward_flops:,}, tiled {tiled_flops:,} (summed "
      f"over its "
      f"{block_r} x {block_c} tiles); the backward recomputes Q K^T once more: +{2 * N * N * D:,} "
      "(FlashAttention-2; twice in this course's two Triton kernels)")
print(f"memory growth per doubling of N on this CPU: naive "
      f"x{growth['naive (helpers.model.attention)']:.1f}, "
      f"tiled x{growth['tiled FA-2 (helpers.flash.tiled)']:.1f}")
print(f"saved for the backward, per GPT-2-medium layer: P {p_bytes / 2**30:.1f} GiB vs lse "
      f"{lse_bytes / 2**20:.1f} MiB")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **1. What are the aspects of Transformer parallelization? (the USF notes)**
# <details><summary>Answer</summary>
#
# Everything in a layer except the order of layers runs in parallel: all sequences of a batch,
# all heads (one batched matrix product, the USF notes' "compute all H heads in parallel"), and, in
# training, all positions at once, because attention has no recurrence: the causal mask, not a
# loop, keeps position $t$ from seeing the future. Inside attention, FlashAttention-2 adds the
# query tiles: with the numbers above, thousands of independent programs for one 16k-token
# sequence, where Algorithm 1's order has only one per head, far fewer than an A100's 108 SMs.
# The loop over key tiles is the one part that stays sequential, and the online softmax is what
# lets it run tile by tile.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. Why is naive attention memory-bound on a GPU that does 312 TFLOP/s?**
# <details><summary>Answer</summary>
#
# Because it does few FLOPs per byte it moves. Its softmax step does about 5 operations per score
# while reading and writing 2 bytes each: about one FLOP per byte, against the roughly two hundred
# that keep an A100 busy (printed above). The whole of naive attention comes out well below the
# ridge point too, so the GPU waits on HBM. FlashAttention keeps $S$ and $P$ on the chip, moving
# several times fewer bytes (section 1), which makes it faster even though it does the same
# matrix products.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. Time complexity $O(N^2)$, memory complexity $O(N^2)$, or $O(N)$ with Flash Attention
# (the USF notes): does tiling change the FLOPs?**
# <details><summary>Answer</summary>
#
# No. The forward pass computes every score once, exactly as naive attention does: the same
# $4N^2d$ FLOPs per head (printed above). The backward pass even adds one more $QK^\top$ to
# recompute $P$. What tiling changes is memory: the extra memory grows like $N$ (the output and
# one log-sum-exp per query) instead of $N^2$, as the growth factors measured on this CPU show
# (at most x2 against x4 per doubling of $N$).
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. Why store the log-sum-exp instead of $P$ for the backward pass?**
# <details><summary>Answer</summary>
#
# $P$ is $N \times N$ per head; the log-sum-exp is one number per query, and it is all that is
# needed to rebuild any tile of $P$ exactly: $P_{ij} = e^{S_{ij} - L_i}$. For GPT-2 medium on a
# batch of 64 that is gibibytes against mebibytes per layer (printed above). Recomputing $QK^\top$
# costs FLOPs, but FLOPs are what the GPU has in excess.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **5. Why can a tile produce NaN, and what prevents it?**
# <details><summary>Answer</summary>
#
# When every score a query has seen so far is masked, its running maximum is $-\infty$, and the
# rescaling $e^{m_{old} - m_{new}}$ becomes $e^{-\infty - (-\infty)}$ = NaN (section 2). Both the
# PyTorch helpers (`exp_shifted`) and the Triton kernel (`shift`) subtract 0 instead when the
# maximum is $-\infty$, and a query that sees no key at all gets output 0 and log-sum-exp
# $-\infty$.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **6. Why does Algorithm 1 normalise $O$ after every key tile, and FlashAttention-2 only once?**
# <details><summary>Answer</summary>
#
# In Algorithm 1's order an output tile goes back to HBM after every key tile, and what is stored
# there is kept as a finished, normalised output. FlashAttention-2 holds one query tile on the
# chip from its first key tile to its last, so the division by $\ell$ can wait for the end: one
# division per output element instead of one per key tile (section 4).
# </details>
