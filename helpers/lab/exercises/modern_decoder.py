"""Exercises of notebook 9 (from GPT-2 to the modern decoder): a RoPE pair, ALiBi's bias, RMSNorm,
and the whole modern block (RMSNorm, RoPE attention with GQA, SwiGLU) written from its weights."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model import modern


@exercise(hint="A pair (a, b) turned by the angle m * theta is (a cos - b sin, a sin + b cos), "
               "with angle = position * theta.",
          task="Write rotate_pair(a, b, position, theta) returning the pair turned "
               "counter-clockwise by position * theta. The check tries four pairs, position 0 included.")
def rotate_pair(student: Callable[[float, float, int, float], tuple[float, float]]) -> str:
    cases = [(1.0, 0.0, 1, 0.5), (0.3, -1.2, 7, 0.1), (2.0, 1.0, 0, 1.0), (-0.5, 0.8, 13, 0.01)]
    for a, b, position, theta in cases:
        got = student(a, b, position, theta)
        if not isinstance(got, tuple | list) or len(got) != 2:
            raise ExerciseFailed(f"rotate_pair should return two numbers (a', b'), got {got!r}.")
        angle = position * theta
        expected = (a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle))
        if all(math.isclose(float(g), e, abs_tol=1e-6) for g, e in zip(got, expected, strict=True)):
            continue
        backwards = (a * math.cos(angle) + b * math.sin(angle), -a * math.sin(angle) + b * math.cos(angle))
        if all(math.isclose(float(g), e, abs_tol=1e-6) for g, e in zip(got, backwards, strict=True)):
            raise ExerciseFailed("you turn the pair clockwise: the sign of the sin terms is swapped.")
        once = (a * math.cos(theta) - b * math.sin(theta), a * math.sin(theta) + b * math.cos(theta))
        if position != 1 and all(math.isclose(float(g), e, abs_tol=1e-6) for g, e in zip(got, once, strict=True)):
            raise ExerciseFailed(f"rotate_pair(..., position={position}, theta={theta}) turned by theta "
                                 "alone: the angle is position * theta.")
        raise ExerciseFailed(f"rotate_pair({a}, {b}, position={position}, theta={theta}) gave {got}, "
                             f"expected ({expected[0]:.4f}, {expected[1]:.4f}).")
    return "That is RoPE for one pair; the model does it for D_H / 2 pairs at once."


@exercise(hint="distance = (i - j) for query i and key j, i.e. positions[:, None] - positions[None, :], "
               "clamped at 0 above the diagonal; then bias = -slopes[:, None, None] * distance.",
          task="Write alibi_bias(slopes, n_tokens) returning the (n_heads, N, N) buffer: "
               "-slope_h * (i - j) for query i and key j <= i, 0 above the diagonal. The check "
               "compares with the course's buffer for 4 and 8 heads.")
def alibi_bias(student: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    for n_heads, n_tokens in ((4, 6), (8, 3)):
        slopes = modern.alibi_slopes(n_heads)
        got = student(slopes, n_tokens)
        expected = modern.alibi_bias(n_heads, n_tokens)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape \
                and not torch.allclose(got, expected, atol=1e-6):
            if torch.allclose(got, -expected, atol=1e-6):
                raise ExerciseFailed("the sign is flipped: ALiBi subtracts, so far keys get lower scores.")
            if n_tokens > 1 and torch.allclose(got, expected.transpose(-2, -1), atol=1e-6):
                raise ExerciseFailed("query and key are swapped: row i is the query and column j the "
                                     "key, so the penalty belongs below the diagonal (keys j <= i, "
                                     "distance i - j) and 0 above it.")
            if torch.allclose(got.tril(), expected, atol=1e-6):
                raise ExerciseFailed("below the diagonal it is right; above it (future keys, "
                                     "masked anyway) the buffer should hold 0.")
        expect_close(got, expected, f"alibi_bias(slopes, {n_tokens}) for {n_heads} heads")
    return "That is the textbook's (n_heads, N, N) buffer, with ALiBi's geometric slopes."


@exercise(hint="rms = sqrt(mean of x**2 over the last axis + eps), keepdim=True; return x / rms * weight. "
               "No mean is subtracted and there is no bias.",
          task="Write rms_norm(x, weight, eps) for x (..., D). The check compares with the "
               "course's RMSNorm on ordinary tokens, tiny ones and a token of zeros.")
def rms_norm(student: Callable[..., torch.Tensor]) -> str:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 8, generator=generator) * 3 + 1
    weight = torch.randn(8, generator=generator)
    got = student(x, weight, 1e-6)
    expected = modern.rms_norm(x, weight, 1e-6)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        centred = x - x.mean(-1, keepdim=True)
        if torch.allclose(got, modern.rms_norm(centred, weight, 1e-6), atol=1e-5):
            raise ExerciseFailed("you subtract the mean first: that is LayerNorm. RMSNorm divides x "
                                 "itself by its root mean square.")
    expect_close(got, expected, "rms_norm(x, weight, eps)", atol=1e-5)
    tiny = x[0] * 1e-4  # mean square ~1e-7, so eps = 1e-6 decides the result
    got = student(tiny, weight, 1e-6)
    if isinstance(got, torch.Tensor) and got.shape == tiny.shape:
        rms_outside = tiny.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6
        if torch.allclose(got, tiny / rms_outside * weight, rtol=1e-4, atol=0):
            raise ExerciseFailed("eps is added outside the square root: sqrt(mean(x**2)) + eps. "
                                 "RMSNorm (and torch.nn.RMSNorm) uses sqrt(mean(x**2) + eps).")
    expect_close(got, modern.rms_norm(tiny, weight, 1e-6), "rms_norm of tiny tokens (x of size 1e-4)",
                 atol=1e-4)
    zeros = student(torch.zeros(2, 8), torch.ones(8), 1e-6)
    if not torch.isfinite(zeros).all():
        raise ExerciseFailed("a token of zeros gives NaN: eps belongs inside the square root.")
    return "It matches torch.nn.RMSNorm."


def modern_block_variant(block: modern.ModernBlock, x: torch.Tensor, table: modern.RopeTable,
                         mistake: str = "") -> torch.Tensor:
    """The modern block's forward from its weights, right or with one named `mistake` (the
    checker compares a wrong answer with each): x (B, N, D) -> (B, N, D)."""
    import torch.nn.functional as F

    def norm(t: torch.Tensor, layer: modern.RMSNorm) -> torch.Tensor:
        if mistake == "LayerNorm":
            t = t - t.mean(-1, keepdim=True)
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + layer.eps) * layer.weight

    def rope(t: torch.Tensor) -> torch.Tensor:  # (B, H, N, D_H)
        if mistake == "no RoPE":
            return t
        cos, sin = table.cos[:t.shape[-2]], table.sin[:t.shape[-2]]
        if mistake == "interleaved":  # pairs (2i, 2i + 1) instead of (i, i + D_H/2)
            a, b = t[..., 0::2], t[..., 1::2]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
        a, b = t.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    attn, (batch, n, d) = block.attn, x.shape
    heads = lambda t, h: t.view(batch, n, h, -1).transpose(1, 2)  # noqa: E731
    h = x if mistake == "post-norm" else norm(x, block.norm1)
    groups = attn.n_heads // attn.n_kv_heads
    q = rope(heads(attn.q_proj(h), attn.n_heads))
    k = rope(heads(attn.k_proj(h), attn.n_kv_heads)).repeat_interleave(groups, dim=1)
    v = heads(attn.v_proj(h), attn.n_kv_heads).repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mistake != "not causal":
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    x = x + attn.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, n, d))
    if mistake == "post-norm":
        x = norm(x, block.norm1)
    h = x if mistake == "post-norm" else norm(x, block.norm2)
    gate, up = (block.mlp.up, block.mlp.gate) if mistake == "gate and up swapped" else (block.mlp.gate, block.mlp.up)
    x = x + block.mlp.down(F.silu(gate(h)) * up(h))
    return norm(x, block.norm2) if mistake == "post-norm" else x


BLOCK_MISTAKES = {
    "post-norm": "you normalise after each residual addition (GPT-1's post-norm): the modern block "
                 "normalises each branch's input, x + f(norm(x)), and leaves the residual stream alone.",
    "LayerNorm": "you subtract each token's mean: RMSNorm only divides by the root mean square.",
    "no RoPE": "the queries and keys are not rotated: RoPE turns both by their positions before the scores.",
    "interleaved": "you rotate the pairs (0, 1), (2, 3), ...: this course's RoPE (Llama's "
                   "rotate_half) pairs feature i with feature i + D_H/2.",
    "not causal": "a query sees the keys after it: the decoder's attention is causal.",
    "gate and up swapped": "SiLU is applied to up(h) instead of gate(h): SwiGLU is down(silu(gate(h)) * up(h)).",
}


def _random_block() -> tuple[modern.ModernBlock, torch.Tensor, modern.RopeTable]:
    torch.manual_seed(9)
    config = modern.ModernConfig(vocab_size=16, context_length=16, n_layers=1, n_heads=4, n_kv_heads=2,
                                 d_model=32, mlp_hidden=48)
    block = modern.ModernBlock(config).double()
    with torch.no_grad():  # gains away from 1, so that forgetting them shows
        block.norm1.weight.uniform_(0.5, 1.5)
        block.norm2.weight.uniform_(0.5, 1.5)
    x = 2.0 * torch.randn(2, 9, 32, dtype=torch.float64) + 0.5  # a mean away from 0, so LayerNorm shows
    return block, x, modern.RopeTable.build(config.head_dim, 16, dtype=torch.float64)


@exercise(hint="h = RMSNorm(x) with norm1's gain and eps; q, k, v from attn.q_proj/k_proj/v_proj, "
               "split into heads (n_heads for q, n_kv_heads for k and v, repeat_interleave the latter); "
               "rotate q and k: halves (a, b) -> (a cos - b sin, a sin + b cos) with table.cos[:N], "
               "table.sin[:N]; causal softmax(q k^T / sqrt(D_H)) v; merge heads; x + out_proj(...); "
               "then x + mlp.down(silu(mlp.gate(h2)) * mlp.up(h2)) with h2 = RMSNorm(x) by norm2.",
          task="Write my_modern_block(block, x, table): the ModernBlock's forward from its weights "
               "(block.norm1, block.attn, block.norm2, block.mlp) and the RoPE table, for x (B, N, D). "
               "The check compares with block(x, table) on random weights and names a known slip.")
def modern_block(student: Callable[[modern.ModernBlock, torch.Tensor, modern.RopeTable], torch.Tensor]) -> str:
    block, x, table = _random_block()
    with torch.no_grad():
        expected = block(x, table)
        got = student(block, x.clone(), table)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.allclose(got, expected, atol=1e-9):
            for mistake, message in BLOCK_MISTAKES.items():
                if torch.allclose(got, modern_block_variant(block, x, table, mistake), atol=1e-9):
                    raise ExerciseFailed(message)
    expect_close(got, expected, "the block's output", atol=1e-9)
    return "RMSNorm, RoPE, GQA and SwiGLU: the block of Llama, Mistral and Qwen, from its weights."
