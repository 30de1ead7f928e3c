"""Notebook 5's checkers (helpers/lab/exercises/multihead_attention.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.model import multihead
from helpers.model.attention import (
    causal_mask,
    scaled_dot_product_attention,
)
from helpers.model.multihead import MultiHeadAttention, merge_heads, split_heads

from .judging import (
    assert_cases_cover,
    assert_leaves_the_global_random_numbers_alone,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    judge,
    named,
)


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


def mha_answer(slip: str = ""):
    def my_mha_forward(x, mha, causal=False):
        b, n, d = x.shape
        h = mha.n_heads
        if slip == "split_view":
            q, k, v = (p(x).reshape(b, h, n, d // h) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        else:
            q, k, v = (split_heads(p(x), h) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        scale = {"model": d ** -0.5, "none": 1.0}.get(slip, (d // h) ** -0.5)
        scores = q @ k.transpose(-2, -1) * scale
        later = ~causal_mask(n) if slip == "course_mask" else torch.ones(n, n, dtype=torch.bool).triu(1)
        if causal and slip != "no_causal":
            scores = scores.masked_fill(later, -math.inf)
        heads = scores.softmax(-1) @ v
        if slip == "course_attention":
            heads = scaled_dot_product_attention(q, k, v, mask=~later if causal else None)[0]
        merged = heads.reshape(b, n, d) if slip == "merge_view" else merge_heads(heads)
        return merged if slip == "no_out" else mha.out_proj(merged)
    return my_mha_forward


def mha_with_torch(x, mha, causal=False):
    reference = torch.nn.MultiheadAttention(mha.d_model, mha.n_heads, batch_first=True, dtype=x.dtype)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        reference.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        reference.out_proj.load_state_dict(mha.out_proj.state_dict())
    mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1) if causal else None  # True: hidden
    return reference(x, x, x, attn_mask=mask, need_weights=False)[0]


MHA_CASES = [
    (mha_answer(), None),
    (mha_with_torch, None),
    (mha_answer("model"), "1/sqrt(d_model)"),
    (mha_answer("none"), "forgot the 1/sqrt(head_dim) scale"),
    (mha_answer("split_view"), "splits the heads by reading"),
    (mha_answer("merge_view"), "merges the heads by reading"),
    (mha_answer("no_out"), "forgot the output projection"),
    (mha_answer("no_causal"), "ignores causal=True"),
    (lambda x, mha, causal=False: mha(x, causal=causal), "MultiHeadAttention.forward"),
    # the scores, the mask and the softmax are the exercise: the course's versions are refused by name
    (mha_answer("course_mask"), "helpers.model.attention.causal_mask"),
    (mha_answer("course_attention"), "helpers.model.attention.scaled_dot_product_attention"),
    (lambda x, mha, causal=False: mha.attend(*(split_heads(p(x), mha.n_heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj)),
                                             causal=causal), "MultiHeadAttention.attend"),
]


def fuse_answer(slip: str = ""):
    """A student's fuse_heads; `slip` picks a usual mistake."""
    def my_fuse_heads(separate):
        has_bias = separate.out_proj.bias is not None
        fused = MultiHeadAttention(separate.d_model, separate.n_heads,
                                   bias=True if slip == "always_bias" else has_bias)
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj"):
                source = {"q_proj": "k_proj", "k_proj": "q_proj"}.get(name, name) if slip == "swap_qk" else name
                parts = [getattr(head, source) for head in separate.heads]
                if slip == "interleave":
                    weight = torch.stack([p.weight for p in parts], dim=1).flatten(0, 1)
                elif slip == "transpose":
                    weight = torch.cat([p.weight.T for p in parts], dim=1)
                else:
                    weight = torch.cat([p.weight for p in parts])
                if slip == "backwards":
                    for h, p in enumerate(parts):
                        p.weight.copy_(getattr(fused, name).weight[h * p.weight.shape[0]:(h + 1) * p.weight.shape[0]])
                    continue
                getattr(fused, name).weight.copy_(weight)
                if has_bias and slip != "no_bias":
                    getattr(fused, name).bias.copy_(torch.cat([p.bias for p in parts]))
            if slip != "no_out":
                fused.out_proj.weight.copy_(separate.out_proj.weight)
                if has_bias:
                    fused.out_proj.bias.copy_(separate.out_proj.bias)
        return fused
    return my_fuse_heads


def fuse_by_state_dict(separate):
    """Another right answer: rename and stack the entries of the state dict."""
    fused = MultiHeadAttention(separate.d_model, separate.n_heads, bias=separate.out_proj.bias is not None)
    state = {f"out_proj.{k}": v for k, v in separate.out_proj.state_dict().items()}
    for key in fused.state_dict():
        proj, _, kind = key.partition(".")
        if proj != "out_proj":
            state[key] = torch.cat([head.state_dict()[f"{proj}.{kind}"] for head in separate.heads])
    fused.load_state_dict(state)
    return fused


FUSE_CASES = [
    (fuse_answer(), None),
    (fuse_by_state_dict, None),
    (fuse_answer("always_bias"), "has no biases"),
    (fuse_answer("no_bias"), "bias is not the heads' biases"),
    (fuse_answer("interleave"), "interleave the heads"),
    (fuse_answer("transpose"), "is transposed"),
    (fuse_answer("swap_qk"), "q_proj holds the heads' k_proj weights"),
    (fuse_answer("no_out"), "output projection W_O"),
    (fuse_answer("backwards"), "changed the weights of separate"),
    (lambda separate: separate, "returns a SeparateHeadsAttention"),
    (lambda separate: multihead.fuse_heads(separate), "calls helpers.model.multihead.fuse_heads"),
]


def split_heads_interleaved(x, n_heads):
    batch, n, d = x.shape
    return x.view(batch, n, d // n_heads, n_heads).permute(0, 3, 1, 2)


def test_interleaved_heads_are_named():
    message = named("multihead_attention.split_heads", split_heads_interleaved, "interleaved", "block")
    assert "straight" not in message


CASES = [
    ("multihead_attention.split_heads", split_permute, None),
    ("multihead_attention.split_heads", split_one_view, "View as (B, N, H, D_H) first"),
    ("multihead_attention.split_heads", split_no_transpose, "head axis must come before"),
    ("multihead_attention.merge_heads", merge_contiguous, None),
    ("multihead_attention.merge_heads", merge_no_transpose, "Transpose first"),
    ("multihead_attention.merge_heads", merge_view_after_transpose, "use .reshape"),
    ("multihead_attention.kv_cache_bytes_per_token", kv_bytes_reordered, None),
    ("multihead_attention.kv_cache_bytes_per_token", kv_bytes_keys_only, "both K and V"),
    ("multihead_attention.kv_cache_bytes_per_token", kv_bytes_numbers, "numbers, not bytes"),
]
CASES += [("multihead_attention.mha_forward", answer, message) for answer, message in MHA_CASES]
CASES += [("multihead_attention.fuse_heads", answer, message) for answer, message in FUSE_CASES]


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_the_checkers_leave_the_global_random_numbers_alone():
    assert_leaves_the_global_random_numbers_alone([("multihead_attention.mha_forward", mha_answer()), ("multihead_attention.fuse_heads", fuse_answer())])


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("multihead_attention", CASES)


@pytest.mark.parametrize("name", exercise_names("multihead_attention"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
