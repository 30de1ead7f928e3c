"""What attention costs, counted: memory traffic and FLOPs (notebook 8, sections 1 and 3).

    hbm_elements_naive(n, d)            standard attention: Q, K, S, P, V, O through GPU memory
    hbm_elements_fa1(n, d, block_k)     Algorithm 1 of FlashAttention (key tiles outside)
    hbm_elements_fa2(n, d, block_q)     the FlashAttention-2 order (query tiles outside)
    algorithm1_block_sizes(M, d)        the paper's tile sizes for an on-chip memory of M elements
    attention_flops(B, H, N_q, N_k, d)  multiply-adds of Q K^T and P V, counted as 2 FLOPs each

Elements are counted per batch and head, moved between HBM (the GPU's main memory) and the
on-chip SRAM; the algorithms themselves are in `helpers.flash.tiled`.

Model code: it imports the standard library and helpers.checks only.
"""

from __future__ import annotations

import math

from helpers import checks


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        checks.positive_int(name, value)


def hbm_elements_naive(n: int, d: int) -> int:
    """Standard attention, one head: read Q, K; write S; read S; write P; read P, V; write O.

    4 N d + 4 N^2 elements: Theta(N d + N^2).
    """
    _check_sizes(n=n, d=d)
    return 4 * n * d + 4 * n * n


def hbm_elements_fa1(n: int, d: int, block_k: int) -> int:
    """Algorithm 1, one head: K and V read once; for each of the T_c key tiles, Q, O, l, m read
    and O, l, m written. 2 N d + T_c (3 N d + 4 N) elements, with T_c = ceil(N / B_c)."""
    _check_sizes(n=n, d=d, block_k=block_k)
    key_tiles = math.ceil(n / block_k)
    return 2 * n * d + key_tiles * (3 * n * d + 4 * n)


def hbm_elements_fa2(n: int, d: int, block_q: int) -> int:
    """FlashAttention-2 order, one head: Q read and O, lse written once; K and V read once per
    query tile. N d + T_r 2 N d + N d + N elements, with T_r = ceil(N / B_r)."""
    _check_sizes(n=n, d=d, block_q=block_q)
    query_tiles = math.ceil(n / block_q)
    return 2 * n * d + query_tiles * 2 * n * d + n


def algorithm1_block_sizes(sram_elements: int, d: int) -> tuple[int, int]:
    """Line 1 of Algorithm 1: (B_r, B_c) = (min(ceil(M / 4d), d), ceil(M / 4d))."""
    _check_sizes(sram_elements=sram_elements, d=d)
    block_c = math.ceil(sram_elements / (4 * d))
    return min(block_c, d), block_c


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, d: int, causal: bool = False) -> int:
    """Multiply-adds counted as 2 FLOPs: Q K^T and P V are 2 N_q N_k d each, so 4 B H N^2 d;
    causal attention needs about half of them."""
    _check_sizes(batch=batch, heads=heads, n_q=n_q, n_k=n_k, d=d)
    checks.boolean("causal", causal)
    flops = 4 * batch * heads * n_q * n_k * d
    return flops // 2 if causal else flops
