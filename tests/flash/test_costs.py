"""helpers.flash.costs: every count against one written out by hand at small sizes, every
branch (a tile count that does and does not divide N, causal or not, B_r capped at d or not),
and every argument's refusal.


"""

from __future__ import annotations

import pytest

from helpers.flash import costs


def test_naive_traffic_counted_tensor_by_tensor():
    n, d = 3, 2
    q = k = v = o = n * d          # 6 elements each
    s = p = n * n                  # 9 elements each
    # read Q, K; write S; read S; write P; read P, V; write O
    assert costs.hbm_elements_naive(n, d) == q + k + s + s + p + p + v + o == 60
    assert costs.hbm_elements_naive(2, 5) == 4 * 10 + 4 * 4 == 56


def test_fa1_traffic_counted_tile_by_tile_when_the_tile_does_not_divide_n():
    n, d, block_k = 5, 2, 2        # key tiles of 2, 2, 1 keys: T_c = 3, not 5 // 2 = 2
    k_and_v = 2 * n * d            # read once: 20
    per_key_tile = (n * d          # read Q
                    + n * d + n + n      # read O, l, m
                    + n * d + n + n)     # write O, l, m
    assert per_key_tile == 50
    assert costs.hbm_elements_fa1(n, d, block_k) == k_and_v + 3 * per_key_tile == 170
    # a tile that divides N: T_c = 4 / 2 = 2
    assert costs.hbm_elements_fa1(4, 3, 2) == 2 * 12 + 2 * (3 * 12 + 4 * 4) == 128
    # a tile larger than N is one tile
    assert costs.hbm_elements_fa1(3, 1, 7) == 2 * 3 + 1 * (3 * 3 + 4 * 3) == 27


def test_fa2_traffic_counted_tile_by_tile_when_the_tile_does_not_divide_n():
    n, d, block_q = 5, 2, 2        # query tiles of 2, 2, 1 queries: T_r = 3
    q_in, o_out, lse_out = n * d, n * d, n
    k_and_v_per_query_tile = 2 * n * d
    assert costs.hbm_elements_fa2(n, d, block_q) == q_in + o_out + lse_out \
        + 3 * k_and_v_per_query_tile == 85
    assert costs.hbm_elements_fa2(4, 3, 2) == 12 + 12 + 4 + 2 * 24 == 76
    assert costs.hbm_elements_fa2(3, 1, 7) == 3 + 3 + 3 + 1 * 6 == 15


def test_algorithm1_block_sizes_round_up_and_cap_b_r_at_d():
    # M / 4d = 100 / 12 = 8.33: B_c = 9 (rounded up), B_r = min(9, 3) = 3 (capped at d)
    assert costs.algorithm1_block_sizes(100, 3) == (3, 9)
    # M / 4d = 40 / 32 = 1.25: B_c = 2, B_r = min(2, 8) = 2 (not capped)
    assert costs.algorithm1_block_sizes(40, 8) == (2, 2)
    # exact division: 96 / 24 = 4
    assert costs.algorithm1_block_sizes(96, 6) == (4, 4)
    assert costs.algorithm1_block_sizes(1, 1) == (1, 1)


def test_attention_flops_counted_and_the_causal_half_is_an_int():
    # Q K^T: n_q x n_k dot products of length d, 2 FLOPs per multiply-add; P V the same
    batch, heads, n_q, n_k, d = 2, 3, 5, 7, 4
    qk = 2 * n_q * n_k * d
    pv = 2 * n_q * n_k * d
    full = costs.attention_flops(batch, heads, n_q, n_k, d)
    assert full == batch * heads * (qk + pv) == 3360 and type(full) is int
    half = costs.attention_flops(batch, heads, n_q, n_k, d, causal=True)
    assert half == 1680 and type(half) is int
    assert costs.attention_flops(1, 1, 1, 1, 1) == 4
    assert costs.attention_flops(1, 1, 1, 1, 1, causal=False) == 4
    assert costs.attention_flops(1, 1, 1, 1, 1, causal=True) == 2


SIZES = {
    "hbm_elements_naive": dict(n=3, d=2),
    "hbm_elements_fa1": dict(n=3, d=2, block_k=2),
    "hbm_elements_fa2": dict(n=3, d=2, block_q=2),
    "algorithm1_block_sizes": dict(sram_elements=100, d=2),
    "attention_flops": dict(batch=1, heads=2, n_q=3, n_k=4, d=2),
}
CASES = [(function, argument) for function, sizes in SIZES.items() for argument in sizes]


@pytest.mark.parametrize("function, argument", CASES)
def test_every_size_is_checked_by_name(function, argument):
    sizes = SIZES[function]
    getattr(costs, function)(**sizes)  # the valid sizes pass
    with pytest.raises(ValueError, match=rf"^{argument} is 0, expected a positive int$"):
        getattr(costs, function)(**{**sizes, argument: 0})
    with pytest.raises(TypeError, match=rf"^{argument} is 2.0 \(a float\), expected a positive int$"):
        getattr(costs, function)(**{**sizes, argument: 2.0})


def test_causal_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^causal is 'yes' \(a str\), expected True or False$"):
        costs.attention_flops(1, 1, 2, 2, 2, causal="yes")
    with pytest.raises(TypeError, match="causal is 1 \\(a int\\)"):
        costs.attention_flops(1, 1, 2, 2, 2, causal=1)
