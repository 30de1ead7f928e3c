"""The checkers of notebooks 1-6, 8, 9 and 11 judge right: a second correct formulation passes,
and each typical mistake fails with a message that names it (issue 22, "Checkers that judge
wrongly"). The notebooks' own solutions are run by tests/notebooks/test_exercises.py."""

from __future__ import annotations

import cmath
import itertools
import math
import time
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from test_core_exercises import CORE_CASES
from test_muon_exercise import NS_CASES

import helpers.lab.exercises as exercises
from helpers.flash import tiled
from helpers.lab.exercises import grader
from helpers.model.gpt import GPTConfig
from helpers.scale.tensor_parallel import (
    split_mlp_weights,  # imported before the watch, as a notebook does
)


def from_the_checker(answer):
    """Mark a slip built from a checker's own variant function: it is judged with watched=False,
    which refuses only the forbidden library calls, so that the test sees how the checker names the
    slip (the watch would refuse the variant itself by name, issue 50)."""
    answer.watched = False
    return answer


# --- notebook 1 -----------------------------------------------------------------------------

def pairs_counter(ids):
    return dict(Counter(itertools.pairwise(ids)))


def pairs_missing_last(ids):
    return dict(Counter(zip(ids[:-2], ids[1:-1], strict=True)))


def pairs_float(ids):
    return {pair: float(count) for pair, count in Counter(itertools.pairwise(ids)).items()}


def pairs_no_overlap(ids):
    counts, i = {}, 0
    while i < len(ids) - 1:
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
        i += 2 if i + 2 < len(ids) and (ids[i + 1], ids[i + 2]) == pair else 1
    return counts


def _merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _chunks(text):
    from helpers.text.chars import pre_split
    return pre_split(text)


def encode_lowest_rank_first(text, merges):
    """tiktoken's way: in each chunk, repeatedly merge the present pair of lowest rank."""
    ranks, out = {pair: r for r, pair in enumerate(merges)}, []
    for chunk in _chunks(text):
        ids = list(chunk.encode("utf-8"))
        while len(ids) > 1:
            pair = min(itertools.pairwise(ids), key=lambda p: ranks.get(p, math.inf))
            if pair not in ranks:
                break
            ids = _merge(ids, pair, 256 + ranks[pair])
        out += ids
    return out


def _replay(text, merges, first_id=256, split=True, rank_order=None):
    out = []
    for chunk in (_chunks(text) if split else [text]):
        ids = list(chunk.encode("utf-8"))
        for rank in (rank_order or range)(len(merges)):
            ids = _merge(ids, merges[rank], first_id + rank)
        out.extend(ids)
    return out


def encode_whole_text(text, merges):
    return _replay(text, merges, split=False)


def encode_wrong_ids(text, merges):
    return _replay(text, merges, first_id=255)


def encode_latest_first(text, merges):
    return _replay(text, merges, rank_order=lambda n: reversed(range(n)))


def encode_code_points(text, merges):
    out = []
    for chunk in _chunks(text):
        ids = [ord(char) for char in chunk]
        for rank, pair in enumerate(merges):
            ids = _merge(ids, pair, 256 + rank)
        out += ids
    return out


def decode_bytearray(ids, vocab):
    buffer = bytearray()
    for i in ids:
        buffer += vocab[i]
    return buffer.decode("utf-8", "replace")


def decode_per_token(ids, vocab):
    return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)


def decode_strict(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8")


# --- notebook 2 -----------------------------------------------------------------------------

def lookup_eye(token_ids, weight):
    return torch.eye(weight.shape[0], dtype=weight.dtype)[token_ids] @ weight


def lookup_by_index(token_ids, weight):
    return weight[token_ids]


def lookup_long_one_hot(token_ids, weight):
    return F.one_hot(token_ids, weight.shape[0]) @ weight


def similar_argsort(query, table, k):
    return F.cosine_similarity(table, query[None], dim=-1).argsort(descending=True)[:k]


def similar_dot(query, table, k):
    return (table @ query).topk(k).indices


def similar_ascending(query, table, k):
    return F.cosine_similarity(table, query[None], dim=-1).topk(k).indices.flip(0)


def sinusoids_loop(n_positions, d_model, base):
    table = torch.zeros(n_positions, d_model)
    for pos in range(n_positions):
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table


def sinusoids_broadcast(n_positions, d_model, base):
    angles = torch.arange(n_positions)[:, None] / base ** (torch.arange(0, d_model, 2) / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def sinusoids_swapped(n_positions, d_model, base):
    return sinusoids_loop(n_positions, d_model, base).view(n_positions, -1, 2).flip(-1).reshape(n_positions, d_model)


def sinusoids_i_over_d(n_positions, d_model, base):
    return sinusoids_loop(n_positions, d_model, base ** 0.5)


# --- notebook 3 -----------------------------------------------------------------------------

def softmax_logsumexp(x):
    return (x - x.logsumexp(dim=-1, keepdim=True)).exp()


def softmax_unshifted(x):
    return x.exp() / x.exp().sum(-1, keepdim=True)


def softmax_columns(x):
    shifted = (x - x.max()).exp()
    return shifted / shifted.sum(0, keepdim=True)


def jacobian_broadcast(a):
    return a[:, None] * (torch.eye(len(a), dtype=a.dtype) - a[None, :])


def jacobian_diag_only(a):
    return torch.diag(a)


def jacobian_sign(a):
    return torch.outer(a, a) - torch.diag(a)


def attention_einsum(q, k, v):
    weights = torch.einsum("...nd,...md->...nm", q, k).div(q.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("...nm,...md->...nd", weights, v), weights


def attention_unscaled(q, k, v):
    weights = (q @ k.transpose(-2, -1)).softmax(-1)
    return weights @ v, weights


def attention_wrong_dim(q, k, v):
    weights = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-2)
    return weights @ v, weights


# --- notebook 4 -----------------------------------------------------------------------------

def causal_triu(scores):
    n_q, n_k = scores.shape[-2:]
    return (scores + torch.full((n_q, n_k), -math.inf, dtype=scores.dtype).triu(n_k - n_q + 1)).softmax(-1)


def causal_zero_fill(scores):
    n_q, n_k = scores.shape[-2:]
    return scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1), 0.0).softmax(-1)


def causal_upside_down(scores):
    n_q, n_k = scores.shape[-2:]
    return scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q - 1), -math.inf).softmax(-1)


def causal_top_left(scores):
    n_q, n_k = scores.shape[-2:]
    return scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), -math.inf).softmax(-1)


def padding_lt(lengths, n, side="right"):
    mask = torch.arange(n).expand(len(lengths), n) < lengths.unsqueeze(1)
    return mask.flip(-1) if side == "left" else mask


def padding_le(lengths, n, side="right"):
    return torch.arange(n)[None, :] <= lengths[:, None]


def padding_inverted(lengths, n, side="right"):
    return torch.arange(n)[None, :] >= lengths[:, None]


def padding_always_right(lengths, n, side="right"):
    return torch.arange(n)[None, :] < lengths[:, None]


def padding_left_gt(lengths, n, side="right"):
    position = torch.arange(n)[None, :]
    return position > n - lengths[:, None] if side == "left" else position < lengths[:, None]


def sparse_answer(slip: str = ""):
    """A student's sparse_mask from triangles and loops; `slip` chooses the usual mistake."""
    def my_sparse_mask(n, window=None, stride=None, global_tokens=(), causal=False):
        ones = torch.ones(n, n, dtype=torch.bool)
        mask = torch.zeros(n, n, dtype=torch.bool)
        if window is not None:
            reach = window - 1 if slip == "short" else window
            mask = mask | (ones.tril(reach) & ones.triu(-reach))
        if stride is not None:
            for i in range(n):
                for j in range(n):
                    if (j if slip == "from_zero" else i - j) % stride == 0:
                        mask[i, j] = True
        for g in global_tokens:
            if slip != "columns_only":
                mask[g, :] = True
            mask[:, g] = True
        if causal and slip != "two_sided":
            mask = mask & ones.tril()
        return mask
    return my_sparse_mask


# --- notebook 5 -----------------------------------------------------------------------------

def split_permute(x, n_heads):
    b, n, d = x.shape
    return x.reshape(b, n, n_heads, d // n_heads).permute(0, 2, 1, 3)


def split_one_view(x, n_heads):
    b, n, d = x.shape
    return x.view(b, n_heads, n, d // n_heads)


def split_no_transpose(x, n_heads):
    b, n, d = x.shape
    return x.view(b, n, n_heads, d // n_heads)


def merge_contiguous(heads):
    b, h, n, dh = heads.shape
    return heads.permute(0, 2, 1, 3).contiguous().view(b, n, h * dh)


def merge_no_transpose(heads):
    b, h, n, dh = heads.shape
    return heads.reshape(b, n, h * dh)


def merge_view_after_transpose(heads):
    b, h, n, dh = heads.shape
    return heads.transpose(1, 2).view(b, n, h * dh)


def kv_bytes_reordered(n_layers, n_kv_heads, head_dim, n_bytes):
    return n_bytes * head_dim * n_kv_heads * n_layers * 2


def kv_bytes_keys_only(n_layers, n_kv_heads, head_dim, n_bytes):
    return n_layers * n_kv_heads * head_dim * n_bytes


def kv_bytes_numbers(n_layers, n_kv_heads, head_dim, n_bytes):
    return 2 * n_layers * n_kv_heads * head_dim


# --- notebook 6 -----------------------------------------------------------------------------

def layer_norm_rsqrt(x, weight, bias, eps):
    centred = x - x.mean(-1, keepdim=True)
    return centred * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps) * weight + bias


def layer_norm_unbiased(x, weight, bias, eps):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias


def layer_norm_eps_outside(x, weight, bias, eps):
    centred = x - x.mean(-1, keepdim=True)
    return centred / (centred.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight + bias


def swiglu_sigmoid_form(x, w_gate, w_up, w_down):
    gate = x @ w_gate
    return (gate * torch.sigmoid(gate) * (x @ w_up)) @ w_down


def swiglu_swapped(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_up) * (x @ w_gate)) @ w_down


def swiglu_glu(x, w_gate, w_up, w_down):
    return (torch.sigmoid(x @ w_gate) * (x @ w_up)) @ w_down


def rank_one_flatten(x):
    centred = x - x.mean(-2, keepdim=True)
    return centred.flatten(-2).norm(dim=-1) / x.flatten(-2).norm(dim=-1)


def rank_one_whole(x):
    return (x - x.mean(-2, keepdim=True)).norm() / x.norm()


def rank_one_no_centring(x):
    return x.flatten(-2).norm(dim=-1) / x.flatten(-2).norm(dim=-1)


# --- notebook 8 -----------------------------------------------------------------------------

def merge_where(max_a, sum_a, max_b, sum_b):
    new_max = torch.maximum(max_a, max_b)
    safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    return new_max, sum_a * torch.exp(max_a - safe) + sum_b * torch.exp(max_b - safe)


def merge_plain_sum(max_a, sum_a, max_b, sum_b):
    return torch.maximum(max_a, max_b), sum_a + sum_b


def merge_nan(max_a, sum_a, max_b, sum_b):
    new_max = torch.maximum(max_a, max_b)
    return new_max, sum_a * torch.exp(max_a - new_max) + sum_b * torch.exp(max_b - new_max)


def step_where(row_max, row_sum, acc, scores, v_tile):
    new_max = torch.maximum(row_max, scores.amax(-1))
    safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    correction = torch.exp(row_max - safe)
    probs = torch.exp(scores - safe[:, None])
    return new_max, row_sum * correction + probs.sum(-1), acc * correction[:, None] + probs @ v_tile


def step_no_rescale(row_max, row_sum, acc, scores, v_tile):
    new_max = torch.maximum(row_max, scores.amax(-1))
    probs = tiled.exp_shifted(scores, new_max[:, None])
    return new_max, row_sum + probs.sum(-1), acc + probs @ v_tile


def step_nan(row_max, row_sum, acc, scores, v_tile):
    new_max = torch.maximum(row_max, scores.amax(-1))
    correction = torch.exp(row_max - new_max)
    probs = torch.exp(scores - new_max[:, None])
    return new_max, row_sum * correction + probs.sum(-1), acc * correction[:, None] + probs @ v_tile


# --- notebook 9 -----------------------------------------------------------------------------

def pair_complex(a, b, position, theta):
    z = complex(a, b) * cmath.exp(1j * position * theta)
    return z.real, z.imag


def pair_clockwise(a, b, position, theta):
    angle = position * theta
    return a * math.cos(angle) + b * math.sin(angle), -a * math.sin(angle) + b * math.cos(angle)


def pair_theta_only(a, b, position, theta):
    return a * math.cos(theta) - b * math.sin(theta), a * math.sin(theta) + b * math.cos(theta)


def alibi_good(slopes, n):
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return -slopes[:, None, None] * (i - j).clamp(min=0)


def alibi_swapped(slopes, n):
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return -slopes[:, None, None] * (j - i).clamp(min=0)


def alibi_sign(slopes, n):
    return -alibi_good(slopes, n)


def rms_rsqrt(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_eps_outside(x, weight, eps):
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight


def rms_centred(x, weight, eps):
    x = x - x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


# --- notebook 11 ----------------------------------------------------------------------------

def ring_rewritten(n_bytes, world_size):
    return 2 * n_bytes * (world_size - 1) / world_size


def ring_half(n_bytes, world_size):
    return n_bytes * (world_size - 1) / world_size


def ring_whole(n_bytes, world_size):
    return 2.0 * n_bytes if world_size > 1 else 0.0


def average_after(model, all_reduce, world_size):
    for p in model.parameters():
        all_reduce(p.grad)
        p.grad /= world_size


def average_before(model, all_reduce, world_size):
    """What DDP does: scale first, then sum."""
    for p in model.parameters():
        p.grad.div_(world_size)
        all_reduce(p.grad)


def average_sum_only(model, all_reduce, world_size):
    for p in model.parameters():
        all_reduce(p.grad)


def average_divide_twice(model, all_reduce, world_size):
    for p in model.parameters():
        p.grad /= world_size
        all_reduce(p.grad)
        p.grad /= world_size


def average_tied_twice(model, all_reduce, world_size):
    for module in model.modules():
        for p in module.parameters(recurse=False):
            all_reduce(p.grad)
            p.grad /= world_size
    all_reduce(model.lm_head.weight.grad)


def split_interleaved(up_weight, up_bias, down_weight, rank, world_size):
    units = slice(rank, None, world_size)
    return up_weight[units], up_bias[units], down_weight[:, units]


def split_down_rows(up_weight, up_bias, down_weight, rank, world_size):
    k, m = up_weight.shape[0] // world_size, down_weight.shape[0] // world_size
    return up_weight[rank * k:(rank + 1) * k], up_bias[rank * k:(rank + 1) * k], down_weight[rank * m:(rank + 1) * m]


def split_mismatched(up_weight, up_bias, down_weight, rank, world_size):
    k = up_weight.shape[0] // world_size
    return up_weight[rank * k:(rank + 1) * k], up_bias[rank * k:(rank + 1) * k], down_weight[:, rank::world_size]


def split_helper(up_weight, up_bias, down_weight, rank, world_size):  # the notebook's fallback: refused
    return split_mlp_weights(up_weight, up_bias, down_weight, rank, world_size)


def split_all_units(up_weight, up_bias, down_weight, rank, world_size):  # every rank keeps everything
    return up_weight, up_bias, down_weight


CASES = [
    ("tokenization.count_pairs", pairs_counter, None),
    ("tokenization.count_pairs", pairs_missing_last, "the last pair"),
    ("tokenization.count_pairs", pairs_float, "should be an int"),
    ("tokenization.count_pairs", pairs_no_overlap, "overlapping pairs both count"),
    ("tokenization.encode_text", encode_lowest_rank_first, None),
    ("tokenization.encode_text", encode_whole_text, "merged across chunk boundaries"),
    ("tokenization.encode_text", encode_wrong_ids, "256 + r"),
    ("tokenization.encode_text", encode_latest_first, "latest first"),
    ("tokenization.encode_text", encode_code_points, "code points"),
    ("tokenization.decode_ids", decode_bytearray, None),
    ("tokenization.decode_ids", decode_per_token, "decoded token by token"),
    ("tokenization.decode_ids", decode_strict, "errors='replace'"),
    ("embeddings.lookup_by_product", lookup_eye, None),
    ("embeddings.lookup_by_product", lookup_by_index, "by index"),
    ("embeddings.lookup_by_product", lookup_long_one_hot, "weight's dtype"),
    ("embeddings.most_similar", similar_argsort, None),
    ("embeddings.most_similar", similar_dot, "ranked by dot product"),
    ("embeddings.most_similar", similar_ascending, "most similar first"),
    ("embeddings.sinusoidal_table", sinusoids_broadcast, None),
    ("embeddings.sinusoidal_table", sinusoids_loop, "loops over the positions"),  # the text asks for one broadcast
    ("embeddings.sinusoidal_table", sinusoids_swapped, "swapped"),
    ("embeddings.sinusoidal_table", sinusoids_i_over_d, "not i/d_model"),
    ("attention.stable_softmax", softmax_logsumexp, None),
    ("attention.stable_softmax", softmax_unshifted, "Subtract the row maximum"),
    ("attention.stable_softmax", softmax_columns, "do not sum to 1"),
    ("attention.softmax_jacobian", jacobian_broadcast, None),
    ("attention.softmax_jacobian", jacobian_diag_only, "only diag(a)"),
    ("attention.softmax_jacobian", jacobian_sign, "sign is flipped"),
    ("attention.scaled_attention", attention_einsum, None),
    ("attention.scaled_attention", attention_unscaled, "divide the scores by"),
    ("attention.scaled_attention", attention_wrong_dim, "columns sum to 1"),
    ("masking.causal_softmax", causal_triu, None),
    ("masking.causal_softmax", causal_zero_fill, "exp(0) = 1"),
    ("masking.causal_softmax", causal_upside_down, "upside down"),
    ("masking.causal_softmax", causal_top_left, "top left corner"),
    ("masking.padding_mask", padding_lt, None),
    ("masking.padding_mask", padding_le, "one real token too many"),
    ("masking.padding_mask", padding_inverted, "inverted"),
    ("masking.padding_mask", padding_always_right, "puts the pads last"),
    ("masking.padding_mask", padding_left_gt, "one real token too few"),
    ("masking.sparse_mask", sparse_answer(), None),
    ("masking.sparse_mask", sparse_answer("two_sided"), "see later keys although causal=True"),
    ("masking.sparse_mask", sparse_answer("short"), "only window - 1 keys"),
    ("masking.sparse_mask", sparse_answer("from_zero"), "counted from position 0"),
    ("masking.sparse_mask", sparse_answer("columns_only"), "only its own pattern"),
    ("multihead_attention.split_heads", split_permute, None),
    ("multihead_attention.split_heads", split_one_view, "View as (B, N, H, D_H) first"),
    ("multihead_attention.split_heads", split_no_transpose, "head axis must come before"),
    ("multihead_attention.merge_heads", merge_contiguous, None),
    ("multihead_attention.merge_heads", merge_no_transpose, "Transpose first"),
    ("multihead_attention.merge_heads", merge_view_after_transpose, "use .reshape"),
    ("multihead_attention.kv_cache_bytes_per_token", kv_bytes_reordered, None),
    ("multihead_attention.kv_cache_bytes_per_token", kv_bytes_keys_only, "both K and V"),
    ("multihead_attention.kv_cache_bytes_per_token", kv_bytes_numbers, "numbers, not bytes"),
    ("layers.layer_norm", layer_norm_rsqrt, None),
    ("layers.layer_norm", layer_norm_unbiased, "D - 1"),
    ("layers.layer_norm", layer_norm_eps_outside, "outside the square root"),
    ("layers.swiglu", swiglu_sigmoid_form, None),
    ("layers.swiglu", swiglu_swapped, "wrong projection"),
    ("layers.swiglu", swiglu_glu, "through sigmoid"),
    ("layers.distance_from_rank_one", rank_one_flatten, None),
    ("layers.distance_from_rank_one", rank_one_whole, "one distance per set"),
    ("layers.distance_from_rank_one", rank_one_no_centring, "subtract the mean token"),
    ("flash_attention.merge_softmax_states", merge_where, None),
    ("flash_attention.merge_softmax_states", merge_plain_sum, "rescale both"),
    ("flash_attention.merge_softmax_states", merge_nan, "NaN"),
    ("flash_attention.tile_step", step_where, None),
    ("flash_attention.tile_step", step_no_rescale, "were not moved to the new max"),
    ("flash_attention.tile_step", step_nan, "NaN"),
    ("modern_decoder.rotate_pair", pair_complex, None),
    ("modern_decoder.rotate_pair", pair_clockwise, "clockwise"),
    ("modern_decoder.rotate_pair", pair_theta_only, "position * theta"),
    ("modern_decoder.alibi_bias", alibi_good, None),
    ("modern_decoder.alibi_bias", alibi_swapped, "query and key are swapped"),
    ("modern_decoder.alibi_bias", alibi_sign, "sign is flipped"),
    ("modern_decoder.rms_norm", rms_rsqrt, None),
    ("modern_decoder.rms_norm", rms_eps_outside, "outside the square root"),
    ("modern_decoder.rms_norm", rms_centred, "that is LayerNorm"),
    ("distributed.ring_bytes", ring_rewritten, None),
    ("distributed.ring_bytes", ring_half, "half the answer"),
    ("distributed.ring_bytes", ring_whole, "not the whole tensor"),
    ("distributed.average_gradients", average_after, None),
    ("distributed.average_gradients", average_before, None),
    ("distributed.average_gradients", average_sum_only, "divide by world_size"),
    ("distributed.average_gradients", average_divide_twice, "divided by world_size twice"),
    ("distributed.average_gradients", average_tied_twice, "exactly once"),
    ("distributed.split_mlp", split_interleaved, None),
    ("distributed.split_mlp", split_down_rows, "you split its rows"),
    ("distributed.split_mlp", split_mismatched, "must use the same units"),
    ("distributed.split_mlp", split_helper, "helpers.scale.tensor_parallel.split_mlp_weights"),
    ("distributed.split_mlp", split_all_units, "expected (6, 6) and (6,)"),
]
CASES += NS_CASES  # notebook 9's Newton-Schulz, written out in tests/lab/exercises/test_muon_exercise.py
CASES += CORE_CASES  # the core exercises of notebooks 1-6, written out in tests/lab/exercises/test_core_exercises.py


# Notebook 11, part two: the 1F1B order and one ring-attention merge.
def f1b_loops(stages, micro_batches):
    orders = []
    for rank in range(stages):
        ahead = [("F", i) for i in range(min(stages - 1 - rank, micro_batches))]
        rest = [op for i in range(len(ahead), micro_batches) for op in (("F", i), ("B", i - len(ahead)))]
        orders.append(ahead + rest + [("B", i) for i in range(micro_batches - len(ahead), micro_batches)])
    return orders


def f1b_gpipe(stages, micro_batches):
    return [[("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
            for _ in range(stages)]


def f1b_no_warmup(stages, micro_batches):
    return [[op for i in range(micro_batches) for op in (("F", i), ("B", i))] for _ in range(stages)]


def f1b_long_warmup(stages, micro_batches):  # one forward too many before the first backward
    orders = []
    for rank in range(stages):
        warmup = min(stages - rank, micro_batches)
        steady = [op for i in range(micro_batches - warmup) for op in (("F", warmup + i), ("B", i))]
        orders.append([("F", i) for i in range(warmup)] + steady
                      + [("B", i) for i in range(micro_batches - warmup, micro_batches)])
    return orders


def f1b_one_list(stages, micro_batches):  # the order of rank 0 only, not one list per rank
    return f1b_loops(stages, micro_batches)[0]


def f1b_course(stages, micro_batches):  # the course's own schedule: refused by name
    from helpers.scale.pipeline import one_f_one_b_order
    return one_f_one_b_order(stages, micro_batches)


def merge_logaddexp(out, lse, o_b, lse_b):
    new = torch.logaddexp(lse, lse_b)
    return out * torch.exp(lse - new)[..., None] + o_b * torch.exp(lse_b - new)[..., None], new


def merge_unweighted(out, lse, o_b, lse_b):
    return out + o_b, torch.logaddexp(lse, lse_b)


def merge_max_lse(out, lse, o_b, lse_b):
    return merge_logaddexp(out, lse, o_b, lse_b)[0], torch.maximum(lse, lse_b)


CASES += [
    ("distributed.one_f_one_b", f1b_loops, None),
    ("distributed.one_f_one_b", f1b_gpipe, "GPipe"),
    ("distributed.one_f_one_b", f1b_no_warmup, "without a warm-up"),
    ("distributed.one_f_one_b", f1b_long_warmup, "its warm-up is off"),
    ("distributed.one_f_one_b", f1b_one_list, "one list of operations for each rank"),
    ("distributed.one_f_one_b", f1b_course, "helpers.scale.pipeline.one_f_one_b_order"),
    ("distributed.ring_merge", merge_logaddexp, None),
    ("distributed.ring_merge", merge_unweighted, "weighted"),
    ("distributed.ring_merge", merge_max_lse, "lse has the right shape"),
]


# --- issue 24's core exercises of notebooks 8, 9 and 11 (more cases in test_core_exercises_middle) ---

def _flash_backward(mistake):
    from helpers.lab.exercises.flash_attention import backward_variant
    return lambda *args: backward_variant(*args, mistake=mistake)


@from_the_checker
def backward_tiled(*args):
    return _flash_backward("")(*args)


def backward_by_the_checker(*args):  # the same function, watched: the checker's own code is refused
    return _flash_backward("")(*args)


@from_the_checker
def backward_d_from_grad_out(*args):
    return _flash_backward("D = rowsum(dO)")(*args)


@from_the_checker
def backward_d_of_one_tile(*args):
    return _flash_backward("D of one tile")(*args)


def _algorithm_1(mistake):
    from helpers.lab.exercises.flash_attention import algorithm_1_variant
    return lambda *args: algorithm_1_variant(*args, mistake=mistake)


@from_the_checker
def algorithm_1_listing(*args):
    return _algorithm_1("")(*args)


def algorithm_1_by_the_checker(*args):
    return _algorithm_1("")(*args)


@from_the_checker
def algorithm_1_not_unnormalised(*args):
    return _algorithm_1("not un-normalised")(*args)


@from_the_checker
def algorithm_1_last_tile_only(*args):
    return _algorithm_1("one tile")(*args)


def _block(mistake):
    from helpers.lab.exercises.modern_decoder import modern_block_variant
    return lambda block, x, table: modern_block_variant(block, x, table, mistake)


@from_the_checker
def block_by_hand(block, x, table):
    return _block("")(block, x, table)


def block_by_the_checker(block, x, table):
    return _block("")(block, x, table)


@from_the_checker
def block_post_norm(block, x, table):
    return _block("post-norm")(block, x, table)


@from_the_checker
def block_interleaved(block, x, table):
    return _block("interleaved")(block, x, table)


def ring_course(rank, world_size, tensors):
    from helpers.scale.workers import ring_all_reduce
    return ring_all_reduce(rank, world_size, tensors)


def ring_blocking_in_turn(rank, world_size, tensors):
    """A ring with blocking sends, even ranks sending first and odd ranks receiving first, the
    chunks kept as views of one flat tensor (the notebook's answer posts its sends without waiting)."""
    import torch
    import torch.distributed as dist

    flat = tensors[rank].flatten().clone()
    chunks = flat.tensor_split(world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size

    def pass_on(send_index, receive_index):
        incoming = torch.empty_like(chunks[receive_index])
        if rank % 2 == 0:
            dist.send(chunks[send_index].contiguous(), right)
            dist.recv(incoming, left)
        else:
            dist.recv(incoming, left)
            dist.send(chunks[send_index].contiguous(), right)
        return incoming

    for step in range(world_size - 1):
        chunks[(rank - step - 1) % world_size].add_(pass_on((rank - step) % world_size,
                                                            (rank - step - 1) % world_size))
    for step in range(world_size - 1):
        chunks[(rank - step) % world_size].copy_(pass_on((rank + 1 - step) % world_size,
                                                         (rank - step) % world_size))
    return flat.reshape(tensors[rank].shape)


def ring_own_tensor(rank, world_size, tensors):
    return tensors[rank].clone()


def ring_collective(rank, world_size, tensors):
    import torch.distributed as dist
    total = tensors[rank].clone()
    dist.all_reduce(total)
    return total


CASES += [
    ("flash_attention.backward", backward_tiled, None),
    ("flash_attention.backward", backward_d_from_grad_out, "you summed dO alone"),
    ("flash_attention.backward", backward_d_of_one_tile, "over one key tile only"),
    ("flash_attention.backward", backward_by_the_checker, "helpers.lab.exercises.flash_attention.backward_variant"),
    ("flash_attention.algorithm_1", algorithm_1_listing, None),
    ("flash_attention.algorithm_1", algorithm_1_not_unnormalised, "must be un-normalised first"),
    ("flash_attention.algorithm_1", algorithm_1_last_tile_only, "only the last key tile counts"),
    ("flash_attention.algorithm_1", algorithm_1_by_the_checker,
     "helpers.lab.exercises.flash_attention.algorithm_1_variant"),
    ("modern_decoder.modern_block", block_by_hand, None),
    ("modern_decoder.modern_block", block_post_norm, "post-norm"),
    ("modern_decoder.modern_block", block_interleaved, "pairs feature i with feature i + D_H/2"),
    ("modern_decoder.modern_block", block_by_the_checker, "helpers.lab.exercises.modern_decoder.modern_block_variant"),
    ("distributed.ring_all_reduce", ring_course, "helpers.scale.workers.ring_all_reduce"),
    ("distributed.ring_all_reduce", ring_blocking_in_turn, None),
    ("distributed.ring_all_reduce", ring_own_tensor, "its own tensor unchanged"),
    ("distributed.ring_all_reduce", ring_collective, "point-to-point"),
]


def piece_course(rank, world_size, grads):
    from helpers.scale.fsdp import gradient_piece
    return gradient_piece(rank, world_size, grads)


def piece_by_all_reduce(rank, world_size, grads):  # correct, if twice the traffic
    import torch.distributed as dist
    total = grads[rank].clone()
    dist.all_reduce(total)
    return (total / world_size).chunk(world_size)[rank]


def piece_summed(rank, world_size, grads):
    return piece_by_all_reduce(rank, world_size, grads) * world_size


def piece_own(rank, world_size, grads):
    return grads[rank].chunk(world_size)[rank]


def piece_whole(rank, world_size, grads):
    import torch.distributed as dist
    total = grads[rank].clone()
    dist.all_reduce(total)
    return total / world_size


CASES += [
    ("distributed.fsdp_grad_piece", piece_course, "helpers.scale.fsdp.gradient_piece"),
    ("distributed.fsdp_grad_piece", piece_by_all_reduce, None),
    ("distributed.fsdp_grad_piece", piece_summed, "divide by world_size"),
    ("distributed.fsdp_grad_piece", piece_own, "its own gradient's piece"),
    ("distributed.fsdp_grad_piece", piece_whole, "the whole mean"),
]


# --- notebook 9's ALiBi attention: another correct way and the usual slips ----------------------

def alibi_attention_by_where(q, k, v):
    """Another correct way: torch.where for the mask, the bias from the slopes by broadcasting."""
    from helpers.model.modern import alibi_slopes
    n = q.shape[-2]
    behind = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).clamp(min=0)  # (N, N): i - j, 0 ahead
    bias = -alibi_slopes(q.shape[-3]).to(q.dtype)[:, None, None] * behind
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias
    later = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.where(later, float("-inf"), scores).softmax(-1) @ v


def alibi_attention_with_the_course_bias(q, k, v):
    """The course's alibi_bias: the exercise asks for the bias built inside the function, so refused."""
    from helpers.model.modern import alibi_bias
    n = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + alibi_bias(q.shape[-3], n).to(q.dtype)
    return scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ v


def _alibi_slip(mistake):
    from helpers.lab.exercises.modern_decoder import alibi_attention_variant

    def answer(q, k, v):
        return alibi_attention_variant(q, k, v, mistake)
    answer.__name__ = "alibi_" + mistake.replace(" ", "_")
    return from_the_checker(answer)


CASES += [
    ("modern_decoder.alibi_attention", alibi_attention_by_where, None),
    ("modern_decoder.alibi_attention", alibi_attention_with_the_course_bias, "helpers.model.modern.alibi_bias"),
    ("modern_decoder.alibi_attention", _alibi_slip("bias before scaling"), "before dividing by sqrt(D_H)"),
    ("modern_decoder.alibi_attention", _alibi_slip("not causal"), "sees the keys after it"),
    ("modern_decoder.alibi_attention", _alibi_slip("sign"), "wrong sign"),
    ("modern_decoder.alibi_attention", _alibi_slip("no bias"), "no distance penalty"),
]


@pytest.mark.parametrize("name, answer, message", CASES, ids=[f"{n}-{a.__name__}" for n, a, _ in CASES])
def test_checker_judges(name, answer, message):
    passed, said = exercises.evaluate(name, answer, time_limit=None, watched=getattr(answer, "watched", True))
    assert passed == (message is None), said
    if message is None and getattr(answer, "watched", True):  # a right answer, however written,
        # passes the grader's hidden tests too (one built from a checker's variant is no student's)
        grader.hidden_check(name, answer, {"check": exercises.check})
    if message is not None:
        assert message in said, said
        assert "❌" in said and "raised" not in said, said  # a named mistake, not a crash report


OWNED = ("tokenization", "embeddings", "attention", "masking", "multihead_attention", "layers",
         "flash_attention", "modern_decoder", "distributed")


def test_every_owned_checker_has_a_right_and_two_wrong_cases():
    names = [n for n in exercises.all_exercises() if n.split(".")[0] in OWNED]
    for name in names:
        right = sum(1 for n, _, m in CASES if n == name and m is None)
        wrong = sum(1 for n, _, m in CASES if n == name and m is not None)
        assert right >= 1 and wrong >= 2, (name, right, wrong)


@pytest.mark.parametrize("name", sorted(n for n in exercises.all_exercises() if n.split(".")[0] in OWNED))
def test_not_attempted_says_the_task_not_the_recipe(name):
    def stub(*args):
        raise NotImplementedError

    passed, said = exercises.evaluate(name, stub)
    assert not passed and "not attempted yet" in said
    assert "Hint" not in said and exercises.get(name).hint not in said
    assert "Write " in said and "The check" in said


def test_split_mlp_weights_refuses_bad_input_by_name():
    up, bias, down = torch.zeros(6, 4), torch.zeros(6), torch.zeros(4, 6)
    with pytest.raises(ValueError, match="rank is 2"):
        split_mlp_weights(up, bias, down, 2, 2)
    with pytest.raises(ValueError, match="multiple of world_size=4"):
        split_mlp_weights(up, bias, down, 0, 4)
    with pytest.raises(ValueError, match="up_bias is"):
        split_mlp_weights(up, bias[None], down, 0, 2)


SMALL = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)


def ids(batch: int = 1, length: int = 4) -> torch.Tensor:
    return torch.randint(0, SMALL.vocab_size, (batch, length), generator=torch.Generator().manual_seed(1))


def test_check_refuses_a_float_count(capsys):
    def as_float(n_layers: int, d_model: int, vocab_size: int, context_length: int) -> float:
        d = d_model
        return float(n_layers * (12 * d * d + 13 * d) + vocab_size * d + context_length * d + 2 * d)

    assert not exercises.passes("gpt.exact_parameters", as_float)
    exercises.check("gpt.exact_parameters", as_float)
    assert "should be an int, but it is a float" in capsys.readouterr().out
    assert exercises.passes("gpt.exact_parameters", lambda *args: int(as_float(*args)))
    assert not exercises.passes("multihead_attention.kv_cache_bytes_per_token",
                                lambda n, h, d, b: 2.0 * n * h * d * b)
    assert not exercises.passes("tokenization.count_pairs",
                                lambda ids: {pair: 1.0 for pair in zip(ids, ids[1:], strict=False)})


def test_check_gives_up_on_a_function_that_never_returns(capsys):
    def endless(*args: int) -> int:
        while True:
            pass

    started = time.perf_counter()
    assert exercises.check("gpt.exact_parameters", endless, time_limit=0.5) is None
    assert time.perf_counter() - started < 10
    out = capsys.readouterr().out
    assert "did not return within 0.5 s" in out and "Traceback" not in out


def test_check_gives_up_outside_the_main_thread_too():
    import threading

    stop = threading.Event()

    def endless_until_stopped(*args: int) -> int:
        while not stop.is_set():
            time.sleep(0.01)
        return 0

    verdict: list[tuple[bool, str]] = []
    worker = threading.Thread(target=lambda: verdict.append(
        exercises.evaluate("gpt.exact_parameters", endless_until_stopped, time_limit=0.3)))
    worker.start()
    worker.join(10)
    stop.set()  # let the abandoned checker thread end
    assert verdict and not verdict[0][0] and "did not return within 0.3 s" in verdict[0][1]


def test_exercise_checkers_refuse_the_usual_mistakes():
    from helpers.lab.exercises import evaluate

    def summed_only(model, all_reduce, world_size):
        for p in model.parameters():
            all_reduce(p.grad)

    def tied_twice(model, all_reduce, world_size):
        for _, p in model.named_parameters(remove_duplicate=False):
            all_reduce(p.grad)
            p.grad /= world_size

    passed, message = evaluate("distributed.average_gradients", summed_only)
    assert not passed and "divide by world_size" in message
    passed, message = evaluate("distributed.average_gradients", tied_twice)
    assert not passed and "twice" in message
    passed, message = evaluate("distributed.ring_bytes", lambda n, p: (p - 1) / p * n)
    assert not passed and "all-gather" in message
    passed, message = evaluate("distributed.split_mlp", lambda up_w, up_b, down_w, r, p: (up_w, up_b, down_w))
    assert not passed and "shape" in message
