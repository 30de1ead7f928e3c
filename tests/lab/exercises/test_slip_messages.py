"""Each slip a student makes often gets a message that names it (issue 51): the checkers of
notebooks 1, 3-5, 7-9, 13 and 14 are fed the slipped answer through `evaluate`, as `check` would
run it, and the message must say what went wrong, not only "wrong values"."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers.lab.exercises import evaluate


def named(name: str, answer, *words: str, watched: bool = True) -> str:
    """The checker's message for a wrong `answer`, asserted to fail and to hold every word
    (watched=False for a slip built from the checker's own variant, which the watch would refuse)."""
    passed, message = evaluate(name, answer, watched=watched)
    assert not passed, message
    for word in words:
        assert word in message, message
    return message


# --- notebook 7 -------------------------------------------------------------------------------

def sampler(crop: int):
    """A generate loop that keeps the last context_length - crop tokens (crop 0 is right)."""
    def my_generate(gpt, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        ids = prompt
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = gpt(ids[:, -(gpt.config.context_length - crop):])[:, -1]
            if temperature == 0 or top_k == 1:
                chosen = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    logits = logits.masked_fill(logits < logits.topk(top_k, -1).values[:, -1:], float("-inf"))
                chosen = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            ids = torch.cat([ids, chosen], dim=1)
        return ids
    return my_generate


def test_a_context_cropped_one_short_is_named_not_blamed_on_the_temperature():
    assert evaluate("gpt.sample_tokens", sampler(0))[0]
    message = named("gpt.sample_tokens", sampler(1), "cropped one token short")
    assert "temperature was not applied" not in message and "came up in" not in message


def adamw_without_bias_correction(p, g, m, v, t, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
    return p * (1 - lr * weight_decay) - lr * m / (v.sqrt() + eps), m, v


def test_adamw_without_bias_correction_is_too_large_with_betas_0_9_and_0_999():
    message = named("gpt.adamw_update", adamw_without_bias_correction, "no bias correction", "too large")
    assert "3.16 times" in message and "too small" not in message


# --- notebook 13 ------------------------------------------------------------------------------

def test_advantages_without_eps_name_the_nan_of_an_equal_group():
    def without_eps(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / rewards.std(dim=1, keepdim=True)

    named("post_training.group_advantages", without_eps, "NaN", "without eps")


def test_advantages_messages_read_as_sentences():
    def off_by_one(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True) + eps) + 1

    message = named("post_training.group_advantages", off_by_one)
    assert "the advantages has" not in message and "tensor of advantages has" in message

    def population(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True, correction=0) + eps)

    passed, praise = evaluate("post_training.group_advantages", population)
    assert passed and "Correct" not in praise and "population std" in praise


def sft_loss_over_every_position(logits, ids, mask):
    logps = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    weights = mask[:, 1:].to(logps.dtype)
    return -(logps * weights).sum() / weights.numel()


def test_an_sft_loss_divided_by_every_position_is_named():
    named("post_training.answer_only_loss", sft_loss_over_every_position, "every position", "answer tokens")


def test_a_dpo_loss_without_beta_is_named():
    def without_beta(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
        chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
        return -F.logsigmoid(chosen - rejected), beta * chosen.detach(), beta * rejected.detach()

    named("post_training.dpo_loss", without_beta, "beta is missing")


# --- notebooks 1, 3, 4 and 5 --------------------------------------------------------------------

def encode_leftmost_first(text, merges):
    """Merges, in each chunk, the leftmost pair that was ever learned, not the earliest learned."""
    from helpers.text.chars import pre_split

    rank_of = {pair: rank for rank, pair in enumerate(merges)}
    ids = []
    for chunk in pre_split(text):
        tokens = list(chunk.encode("utf-8"))
        while (pair := next((p for p in itertools.pairwise(tokens) if p in rank_of), None)) is not None:
            merged, i = [], 0
            while i < len(tokens):
                if tuple(tokens[i:i + 2]) == pair:
                    merged.append(256 + rank_of[pair])
                    i += 2
                else:
                    merged.append(tokens[i])
                    i += 1
            tokens = merged
        ids += tokens
    return ids


def test_encoding_the_leftmost_learned_pair_is_not_called_latest_first():
    message = named("tokenization.encode_text", encode_leftmost_first, "leftmost learned pair")
    assert "latest first" not in message


def test_a_jacobian_with_a_at_a_transposed_names_the_dot_product():
    # a @ a.T, as students write it, is a @ a for a vector (and warns that .T is deprecated there)
    named("attention.softmax_jacobian", lambda a: torch.diag(a) - a @ a, "one number", "outer product")


class KeysFromTheQueries(nn.Module):
    """An attention layer that takes its keys and values from x_query, not from x_data."""

    def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
        super().__init__()
        self.w_q, self.w_k = nn.Linear(d_in, d_k, bias=False), nn.Linear(d_in, d_k, bias=False)
        self.w_v = nn.Linear(d_in, d_v, bias=False)

    def forward(self, x_query, x_data):
        q, k, v = self.w_q(x_query), self.w_k(x_query), self.w_v(x_query)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
        weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
        return weights @ v, weights


def test_keys_from_the_wrong_input_are_named():
    named("attention.attention_layer", KeysFromTheQueries, "keys come from x_query", "x_data")


def causal_softmax_without_diagonal(scores):
    n_q, n_k = scores.shape[-2:]
    later_or_self = torch.arange(n_k)[None, :] >= torch.arange(n_q)[:, None] + (n_k - n_q)
    masked = scores.masked_fill(later_or_self, float("-inf"))
    return masked.exp() / masked.exp().sum(-1, keepdim=True)


def test_a_causal_mask_missing_its_diagonal_is_named():
    message = named("masking.causal_softmax", causal_softmax_without_diagonal, "diagonal", "own key")
    assert "nan" not in message


def split_heads_interleaved(x, n_heads):
    batch, n, d = x.shape
    return x.view(batch, n, d // n_heads, n_heads).permute(0, 3, 1, 2)


def test_interleaved_heads_are_named():
    message = named("multihead_attention.split_heads", split_heads_interleaved, "interleaved", "block")
    assert "straight" not in message


# --- notebooks 8 and 9 --------------------------------------------------------------------------

def merge_through_the_exponentials(max_a, sum_a, max_b, sum_b):
    """Undoes each shift (sum times e to the max), adds, and shifts again: overflows at 1000."""
    merged = torch.maximum(max_a, max_b)
    return merged, (sum_a * max_a.exp() + sum_b * max_b.exp()) / merged.exp()


def test_a_merge_that_overflows_is_not_blamed_on_minus_infinity():
    message = named("flash_attention.merge_softmax_states", merge_through_the_exponentials, "overflowed")
    assert "-inf minus -inf" not in message


def algorithm_1_old_sum_kept(q, k, v, block_r, block_c):
    """Algorithm 1 that moves the old output to the new max but adds to the old sum as it is."""
    n, d = q.shape
    q = q / math.sqrt(d)
    out, ell, m = torch.zeros_like(q), torch.zeros(n, dtype=q.dtype), torch.full((n,), -math.inf, dtype=q.dtype)
    for j in range(0, n, block_c):
        for i in range(0, n, block_r):
            rows = slice(i, i + block_r)
            scores = q[rows] @ k[j:j + block_c].T
            m_new = torch.maximum(m[rows], scores.amax(1))
            p = (scores - m_new[:, None]).exp()
            old = (m[rows] - m_new).exp()
            ell_new = ell[rows] + p.sum(1)                     # the slip: ell[rows] not times old
            out[rows] = (old[:, None] * ell[rows, None] * out[rows] + p @ v[j:j + block_c]) / ell_new[:, None]
            ell[rows], m[rows] = ell_new, m_new
    return out


def test_algorithm_1_names_a_running_sum_left_at_the_old_max():
    message = named("flash_attention.algorithm_1", algorithm_1_old_sum_kept, "running sum", "new max")
    assert "wrong values" not in message


def newton_schulz_in_float64(m, steps=5):
    from helpers.training.muon import NS_COEFFICIENTS

    a, b, c = NS_COEFFICIENTS
    x = m.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def test_newton_schulz_returned_in_another_dtype_is_named():
    named("modern_decoder.newton_schulz", newton_schulz_in_float64, "torch.float64", "m's dtype")


def alibi_bias_transposed(slopes, n_tokens):
    positions = torch.arange(n_tokens)
    distance = (positions[None, :] - positions[:, None]).clamp(min=0)  # key minus query: swapped
    return -slopes[:, None, None] * distance


def test_the_alibi_fix_for_swapped_query_and_key_reads_the_right_way_round():
    message = named("modern_decoder.alibi_bias", alibi_bias_transposed, "query and key are swapped")
    assert "down the rows" in message and "query positions as the column" not in message


def modern_block_tiling_the_key_value_heads(block, x, table):
    from helpers.lab.exercises.modern_decoder import modern_block_variant

    return modern_block_variant(block, x, table, "GQA tiled")


def test_gqa_heads_repeated_in_the_wrong_order_name_the_order():
    message = named("modern_decoder.modern_block", modern_block_tiling_the_key_value_heads,
                    "wrong order", "0, 0, 1, 1", watched=False)
    assert "0, 1, 0, 1" in message


def test_the_modern_block_task_says_where_its_sizes_live():
    def not_yet(block, x, table):
        raise NotImplementedError

    passed, message = evaluate("modern_decoder.modern_block", not_yet)
    assert not passed
    for size in ("block.attn.n_heads", "block.attn.n_kv_heads", "block.attn.head_dim"):
        assert size in message, message


# --- notebook 14 --------------------------------------------------------------------------------

def int4(w, group_size, strided=False, from_bottom=False):
    """The int4 quantizer of notebook 14, right by default, with one of two slips."""
    out, n_in = w.shape
    groups = (w.reshape(out, group_size, n_in // group_size).transpose(1, 2) if strided
              else w.reshape(out, n_in // group_size, group_size))
    low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    scale = (high - low) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-low / scale)
    steps = (groups - low[..., None]) / scale[..., None] if from_bottom else groups / scale[..., None]
    q = (torch.round(steps) + (0 if from_bottom else zero[..., None])).clamp(0, 15).to(torch.uint8)
    q = q.transpose(1, 2) if strided else q
    q = q.reshape(out, n_in)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale, zero


def test_int4_quantizers_right_and_slipped():
    assert evaluate("serving.quantize_int4_groups", int4)[0]
    named("serving.quantize_int4_groups", lambda w, g: int4(w, g, strided=True), "strided", "consecutive")
    named("serving.quantize_int4_groups", lambda w, g: int4(w, g, from_bottom=True),
          "distance from the group's minimum")
