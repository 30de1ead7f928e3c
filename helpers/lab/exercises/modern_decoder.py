"""Exercises of notebook 9 (from GPT-2 to the modern decoder): a RoPE pair, ALiBi's bias and its
attention, RMSNorm, the whole modern block (RMSNorm, RoPE attention with GQA, SwiGLU) written
from its weights, and Muon's Newton-Schulz orthogonalisation."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from helpers.lab.exercises import (
    ExerciseFailed,
    exercise,
    expect_close,
    hidden_round,
    reseed,
    seeded,
)
from helpers.model import modern
from helpers.training.muon import NS_COEFFICIENTS


@exercise(hint="The angle is the position times theta; multiply the pair, read as a complex number, "
               "by the unit complex number at that angle and read off the real and imaginary parts.",
          task="Write rotate_pair(a, b, position, theta) returning the pair turned "
               "counter-clockwise by position * theta. The check tries four pairs, position 0 included.")
def rotate_pair(student: Callable[[float, float, int, float], tuple[float, float]]) -> str:
    cases = [(1.0, 0.0, 1, 0.5), (0.3, -1.2, 7, 0.1), (2.0, 1.0, 0, 1.0), (-0.5, 0.8, 13, 0.01)]
    if hidden_round():  # a pair, a position and a theta drawn from the hidden seed
        a, b, theta = (round(x, 3) for x in torch.randn(3, generator=seeded(53)).tolist())
        cases.insert(0, (a, b, int(torch.randint(2, 500, (), generator=seeded(54))), abs(theta) / 10))
    for a, b, position, theta in cases:
        got = student(a, b, position, theta)
        if not isinstance(got, tuple | list) or len(got) != 2:
            raise ExerciseFailed(f"rotate_pair should return two numbers (a', b'), got {got!r}.",
                                 fix="return the turned pair as a tuple of its two features.")
        angle = position * theta
        expected = (a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle))
        if all(math.isclose(float(g), e, abs_tol=1e-6) for g, e in zip(got, expected, strict=True)):
            continue
        backwards = (a * math.cos(angle) + b * math.sin(angle), -a * math.sin(angle) + b * math.cos(angle))
        if all(math.isclose(float(g), e, abs_tol=1e-6) for g, e in zip(got, backwards, strict=True)):
            raise ExerciseFailed("you turn the pair clockwise: the sign of the sin terms is swapped.",
                                 fix="counter-clockwise, the first feature loses b times the sine and "
                                     "the second gains a times the sine.")
        once = (a * math.cos(theta) - b * math.sin(theta), a * math.sin(theta) + b * math.cos(theta))
        if position != 1 and all(math.isclose(float(g), e, abs_tol=1e-6) for g, e in zip(got, once, strict=True)):
            raise ExerciseFailed(f"rotate_pair(..., position={position}, theta={theta}) turned by theta "
                                 "alone, but the angle is position * theta.",
                                 fix="multiply theta by the position before taking the cosine and sine.")
        raise ExerciseFailed(f"rotate_pair({a}, {b}, position={position}, theta={theta}) gave {got}, "
                             f"expected ({expected[0]:.4f}, {expected[1]:.4f}).",
                             fix="the new first feature is a times the cosine minus b times the sine; the "
                                 "new second one a times the sine plus b times the cosine.")
    return "That is RoPE for one pair; the model does it for D_H / 2 pairs at once."


@exercise(hint="Build the table of distances, the query's position minus the key's, by broadcasting a "
               "column of positions against a row; multiply by each head's slope with the sign flipped "
               "(the slopes need two trailing axes of size one) and put zero where the key comes later.",
          task="Write alibi_bias(slopes, n_tokens) returning the (n_heads, N, N) buffer: "
               "-slope_h * (i - j) for query i and key j <= i, 0 above the diagonal. The check "
               "compares with the course's buffer for 4 and 8 heads.")
def alibi_bias(student: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    cases = ((4, 6), (8, 3))
    if hidden_round():  # 12 heads (not a power of two), a drawn length, one token
        cases = ((12, int(torch.randint(2, 20, (), generator=seeded(52)))), (2, 1)) + cases
    for n_heads, n_tokens in cases:
        slopes = modern.alibi_slopes(n_heads)
        got = student(slopes, n_tokens)
        expected = modern.alibi_bias(n_heads, n_tokens)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape \
                and not torch.allclose(got, expected, atol=1e-6):
            if torch.allclose(got, -expected, atol=1e-6):
                raise ExerciseFailed("the sign is flipped: ALiBi subtracts, so far keys get lower scores.",
                                     fix="multiply the slopes by minus the distance.")
            if n_tokens > 1 and torch.allclose(got, expected.transpose(-2, -1), atol=1e-6):
                raise ExerciseFailed("query and key are swapped: row i is the query and column j the "
                                     "key, so the penalty belongs below the diagonal (keys j <= i, "
                                     "distance i - j) and 0 above it.",
                                     fix="let the query's position vary down the rows (the first axis, a "
                                         "column of positions) and the key's along the columns (a row of "
                                         "positions), and subtract the key's position from the query's.")
            if torch.allclose(got.tril(), expected, atol=1e-6):
                raise ExerciseFailed("below the diagonal it is right, but above it (future keys, "
                                     "masked anyway) the buffer does not hold 0.",
                                     fix="set the entries where the key comes after the query to zero "
                                         "(clamp the distance at zero, or fill them).")
        expect_close(got, expected, f"alibi_bias(slopes, {n_tokens}) for {n_heads} heads")
    return "That is the textbook's (n_heads, N, N) buffer, with ALiBi's geometric slopes."


@exercise(hint="Average the squared features of each token over the last axis (keeping it), add eps, "
               "take the square root, divide the token by it and multiply by the gain. No mean is "
               "subtracted and there is no bias.",
          task="Write rms_norm(x, weight, eps) for x (..., D). The check compares with the "
               "course's RMSNorm on ordinary tokens, tiny ones and a token of zeros.")
def rms_norm(student: Callable[..., torch.Tensor]) -> str:
    generator = seeded(0)
    x = torch.randn(3, 4, 8, generator=generator) * 3 + 1
    weight = torch.randn(8, generator=generator)
    got = student(x, weight, 1e-6)
    expected = modern.rms_norm(x, weight, 1e-6)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        centred = x - x.mean(-1, keepdim=True)
        if torch.allclose(got, modern.rms_norm(centred, weight, 1e-6), atol=1e-5):
            raise ExerciseFailed("you subtract the mean first: that is LayerNorm.",
                                 fix="RMSNorm divides x itself by its root mean square: drop the "
                                     "centring.")
    expect_close(got, expected, "rms_norm(x, weight, eps)", atol=1e-5)
    tiny = x[0] * 1e-4  # mean square ~1e-7, so eps = 1e-6 decides the result
    got = student(tiny, weight, 1e-6)
    if isinstance(got, torch.Tensor) and got.shape == tiny.shape:
        rms_outside = tiny.pow(2).mean(-1, keepdim=True).sqrt() + 1e-6
        if torch.allclose(got, tiny / rms_outside * weight, rtol=1e-4, atol=0):
            raise ExerciseFailed("eps is added outside the square root: sqrt(mean(x**2)) + eps.",
                                 fix="RMSNorm (and torch.nn.RMSNorm) adds eps to the mean square, "
                                     "inside the square root.")
    expect_close(got, modern.rms_norm(tiny, weight, 1e-6), "rms_norm of tiny tokens (x of size 1e-4)",
                 atol=1e-4)
    zeros = student(torch.zeros(2, 8), torch.ones(8), 1e-6)
    if not torch.isfinite(zeros).all():
        raise ExerciseFailed("a token of zeros gives NaN.",
                             fix="add eps to the mean square inside the square root, so that a token "
                                 "of zeros divides by sqrt(eps), not by 0.")
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
    k, v = rope(heads(attn.k_proj(h), attn.n_kv_heads)), heads(attn.v_proj(h), attn.n_kv_heads)
    if mistake == "GQA tiled":  # key/value heads 0, 1, 0, 1 instead of 0, 0, 1, 1
        k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
    k, v = (t.repeat_interleave(groups, dim=1) if mistake != "GQA tiled" else t for t in (k, v))
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
    "GQA tiled": "the key/value heads are repeated in the wrong order: yours cycle (0, 1, 0, 1), but "
                 "consecutive query heads share one key/value head (0, 0, 1, 1 for 4 query heads and 2 "
                 "key/value heads).",
}


BLOCK_FIXES = {
    "post-norm": "normalise the input of each branch (attention and MLP) and add the branch's output "
                 "to the un-normalised x.",
    "LayerNorm": "divide each token by the square root of its mean square plus eps, without centring it.",
    "no RoPE": "turn the queries and the keys (after splitting the heads, before the scores) by the "
               "table's cosines and sines.",
    "interleaved": "split each head's features into a first and a second half and rotate those pairs.",
    "not causal": "fill the scores of keys after their query with minus infinity before the softmax.",
    "gate and up swapped": "apply SiLU to the gate projection and multiply by the up projection.",
    "GQA tiled": "repeat each key/value head in place, n_heads / n_kv_heads times, so that query heads "
                 "0 to n_heads / n_kv_heads - 1 read key/value head 0, and so on; do not repeat the "
                 "whole stack of heads.",
}


def _random_block() -> tuple[modern.ModernBlock, torch.Tensor, modern.RopeTable]:
    reseed(9)
    config = modern.ModernConfig(vocab_size=16, context_length=16, n_layers=1, n_heads=4, n_kv_heads=2,
                                 d_model=32, mlp_hidden=48)
    block = modern.ModernBlock(config).double()
    with torch.no_grad():  # gains away from 1, so that forgetting them shows
        block.norm1.weight.uniform_(0.5, 1.5)
        block.norm2.weight.uniform_(0.5, 1.5)
    x = 2.0 * torch.randn(2, 9, 32, dtype=torch.float64) + 0.5  # a mean away from 0, so LayerNorm shows
    return block, x, modern.RopeTable.build(config.head_dim, 16, dtype=torch.float64)


@exercise(hint="Two residual branches, each on an RMS-normalised copy of the stream: causal "
               "attention with RoPE on the queries and keys and n_kv_heads key/value heads, each "
               "serving consecutive query heads (0, 0, 1, 1 for 4 and 2 heads); then the SwiGLU. "
               "RoPE pairs the first half of each head's features with the second half.",
          points=3,
          task="Write my_modern_block(block, x, table): the ModernBlock's forward from its weights "
               "(block.norm1, block.attn, block.norm2, block.mlp; the sizes are block.attn.n_heads, "
               "block.attn.n_kv_heads and block.attn.head_dim) and the RoPE table, for x (B, N, D). "
               "The check compares with block(x, table) on random weights and names a known slip.")
def modern_block(student: Callable[[modern.ModernBlock, torch.Tensor, modern.RopeTable], torch.Tensor]) -> str:
    block, x, table = _random_block()
    with torch.no_grad():
        expected = block(x, table)
        got = student(block, x.clone(), table)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.allclose(got, expected, atol=1e-9):
            for mistake, message in BLOCK_MISTAKES.items():
                if torch.allclose(got, modern_block_variant(block, x, table, mistake), atol=1e-9):
                    raise ExerciseFailed(message, fix=BLOCK_FIXES[mistake])
    expect_close(got, expected, "the block's output", atol=1e-9)
    return "RMSNorm, RoPE, GQA and SwiGLU: the block of Llama, Mistral and Qwen, from its weights."


ALIBI_MISTAKES = {  # name: (what is wrong, how to fix it)
    "bias before scaling": ("the bias is scaled too: you added it before dividing by sqrt(D_H)",
                            "divide q times k transposed by sqrt(D_H) first, then add the bias."),
    "not causal": ("a query sees the keys after it",
                   "fill the scores of later keys with minus infinity before the softmax."),
    "sign": ("the bias has the wrong sign: far keys get higher scores",
             "subtract the slope times the distance: farther keys must score lower."),
    "no scaling": ("the scores are not divided by sqrt(D_H)",
                   "divide q times k transposed by the square root of the head size."),
    "no bias": ("there is no distance penalty: the weights ignore positions",
                "add each head's slope times minus the distance to the scaled scores."),
}


def alibi_attention_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mistake: str = "") -> torch.Tensor:
    """ALiBi attention, right or with one named `mistake`: q, k, v (B, H, N, D_H) -> (B, H, N, D_H)."""
    n_heads, n = q.shape[-3], q.shape[-2]
    bias = modern.alibi_bias(n_heads, n).to(q.dtype)
    if mistake == "sign":
        bias = -bias
    if mistake == "no bias":
        bias = torch.zeros_like(bias)
    scores = q @ k.transpose(-2, -1)
    if mistake == "bias before scaling":
        scores = (scores + bias) / math.sqrt(q.shape[-1])
    else:
        scores = scores / (1.0 if mistake == "no scaling" else math.sqrt(q.shape[-1])) + bias
    if mistake != "not causal":
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    return scores.softmax(-1) @ v


@exercise(task="Write my_alibi_attention(q, k, v) for q, k, v (B, H, N, D_H): causal attention with "
               "ALiBi's bias (slopes from alibi_slopes(H)) added after the 1/sqrt(D_H) scaling. The "
               "check compares with the course's alibi_attention for 4, 8 and 12 heads.",
          hint="Notebook 4's causal attention with one more term: the scores are scaled first, "
               "then each head's distance penalty (minus its slope times how far back the key is, "
               "nothing for later keys) is added, then the causal mask and the softmax.",
          points=3)
def alibi_attention(student: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    generator = seeded(9)
    for batch, n_heads, n, d_h in ((2, 4, 7, 8), (1, 8, 5, 4), (1, 12, 6, 16)):
        q, k, v = (torch.randn(batch, n_heads, n, d_h, generator=generator, dtype=torch.float64) * 2
                   for _ in range(3))
        expected = modern.alibi_attention(q, k, v)
        got = student(q.clone(), k.clone(), v.clone())
        if isinstance(got, torch.Tensor) and got.shape == expected.shape \
                and not torch.allclose(got.double(), expected, atol=1e-5):
            for mistake, (what, fix) in ALIBI_MISTAKES.items():
                if torch.allclose(got.double(), alibi_attention_variant(q, k, v, mistake), atol=1e-5):
                    raise ExerciseFailed(f"{what} ({n_heads} heads)", fix=fix)
        expect_close(got.double() if isinstance(got, torch.Tensor) else got, expected,
                     f"the output for {n_heads} heads of {n} tokens", atol=1e-5)
    return "That is ALiBi: no positions in q or k, only a distance penalty per head."


# --- Muon: Newton-Schulz ----------------------------------------------------------------------

def _ns_scalar(s: torch.Tensor, steps: int, coefficients: tuple[float, float, float] = NS_COEFFICIENTS) -> torch.Tensor:
    """The quintic f(s) = a s + b s^3 + c s^5 applied `steps` times to each singular value s."""
    a, b, c = coefficients
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


def _known_svd(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random U (rows, r), V (cols, r) with orthonormal columns and spread singular values s (r,)."""
    g, r = seeded(seed), min(rows, cols)
    u = torch.linalg.qr(torch.randn(rows, r, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(cols, r, generator=g, dtype=torch.float64))[0]
    return u, torch.logspace(0.7, -2.5, r, dtype=torch.float64), v


def _ns_diagnosis(got_s: torch.Tensor, s: torch.Tensor, steps: int) -> ExerciseFailed | None:
    """Name the mistake whose singular values match the student's, if one does."""
    def same(t: torch.Tensor) -> bool:
        return bool(torch.allclose(got_s, t.sort(descending=True).values, atol=1e-3, rtol=1e-3))

    normalised = s / s.norm()
    if same(torch.ones_like(s)):
        return ExerciseFailed("every singular value is exactly 1: that is the exact U V^T (an SVD?), not "
                              "the quintic's 5 steps, which leave them between about 0.7 and 1.2.",
                              fix="iterate the polynomial with the coefficients given, steps times.")
    for other in range(0, 11):
        if other != steps and same(_ns_scalar(normalised, other)):
            return ExerciseFailed(f"asked for steps={steps}, your function ran {other}.",
                                  fix="run the loop exactly `steps` times (the argument, not a fixed number).")
    if same(_ns_scalar(s / s.max(), steps)):
        return ExerciseFailed("you scaled by the largest singular value; Muon (and torch.optim.Muon) divides "
                              "by the Frobenius norm, which costs no SVD.",
                              fix="divide by the square root of the sum of the squared entries (the matrix's norm).")
    a, b, c = NS_COEFFICIENTS
    for wrong in ((a, c, b), (b, a, c), (c, b, a), (a, -b, c)):
        if same(_ns_scalar(normalised, steps, wrong)):
            return ExerciseFailed(f"the singular values follow the polynomial with coefficients {wrong}, not "
                                  f"{NS_COEFFICIENTS}: a multiplies X, b the Gram matrix times X, c its square times X.",
                                  fix="a X + (b G + c G G) X, with G = X X^T and (a, b, c) in the given order.")
    if float(got_s.max()) > 3:
        return ExerciseFailed(f"singular values up to {float(got_s.max()):.3g} came out, where the quintic "
                              "keeps them below 1.2: the iteration ran on a matrix that was not scaled first.",
                              fix="divide the matrix by its Frobenius norm (plus a tiny eps) before the first "
                                  "step, so that every singular value starts at most 1.")
    if same(_ns_scalar(normalised, steps)):
        return ExerciseFailed("the singular values are right but the singular vectors are not: the result is not "
                              "U f(S) V^T. Multiply the Gram matrix from the left of X (X X^T X, not X^T X X), "
                              "and if you transposed a tall matrix, transpose the result back.",
                              fix="with G = X X^T, the update is a X + (b G + c G G) X.")
    return None


@exercise(hint="Scale the matrix by its Frobenius norm so every singular value is at most 1; then, steps "
               "times, form the Gram matrix G of X with its own transpose and replace X by a X plus b G X "
               "plus c G G X. A tall matrix may be transposed first (and back at the end): the smaller Gram "
               "matrix is cheaper, the result the same.",
          task="Write my_newton_schulz(m, steps=5): m (A, B) -> the quintic Newton-Schulz iteration's "
               "approximation of U V^T, in m's dtype. The check tries wide, tall and square matrices with "
               "known singular values, in float64, float32 and bfloat16, and a matrix of zeros.",
          points=3,
          forbidden=("torch.linalg.svd", "torch.svd", "helpers.training.muon.newton_schulz"))
def newton_schulz(student: Callable[..., torch.Tensor]) -> str:
    for rows, cols, steps in ((9, 4, 1), (6, 10, 5), (12, 5, 5), (8, 8, 2)):  # one step first: no blow-up
        u, s, v = _known_svd(rows, cols, seed=rows)
        m = u @ torch.diag(s) @ v.T
        expected = u @ torch.diag(_ns_scalar(s / s.norm(), steps)) @ v.T
        for dtype in (torch.float64, torch.float32):
            got = student(m.to(dtype)) if steps == 5 else student(m.to(dtype), steps)
            what = f"my_newton_schulz(m of shape ({rows}, {cols}), {dtype}" + (f", steps={steps})" if steps != 5 else ")")
            if not isinstance(got, torch.Tensor) or got.shape != m.shape:
                expect_close(got, expected, what)  # names the type or the shape
            if got.dtype != dtype:
                raise ExerciseFailed(f"{what} returned {got.dtype}, not m's dtype.",
                                     fix="compute in m's dtype, or convert the result back to it before returning.")
            got = got.double()
            if not bool(torch.isfinite(got).all()):
                raise ExerciseFailed(f"{what} holds NaN or inf: the iteration ran on a matrix that was not "
                                     "scaled first, so its singular values exploded.",
                                     fix="divide the matrix by its Frobenius norm (plus a tiny eps) before the loop.")
            if torch.allclose(got, -expected, atol=1e-4 * float(expected.abs().max()), rtol=0):
                raise ExerciseFailed(f"{what} is minus the right matrix: a sign is flipped.",
                                     fix=f"use the coefficients as given, {NS_COEFFICIENTS}, in a X + (b G + c G G) X.")
            if float((got - expected).abs().max()) > 1e-4 * float(expected.abs().max()):
                raise _ns_diagnosis(torch.linalg.svdvals(got), s, steps) or ExerciseFailed(
                    f"{what} is wrong (largest error {float((got - expected).abs().max()):.3g}).")
    u, s, v = _known_svd(16, 48, seed=1)
    low = student((u @ torch.diag(s) @ v.T).to(torch.bfloat16))
    if not (isinstance(low, torch.Tensor) and low.shape == (16, 48) and low.is_floating_point()
            and bool(torch.isfinite(low).all())):
        raise ExerciseFailed("with a bfloat16 matrix of shape (16, 48) your function did not return a finite "
                             "(16, 48) tensor.", fix="use only matrix products and sums, which work in any dtype.")
    top = torch.linalg.svdvals(low.double())
    if not (float(top.max()) < 1.4 and float(top[:8].min()) > 0.5):
        raise ExerciseFailed(f"in bfloat16 the singular values came out between {float(top.min()):.2f} and "
                             f"{float(top.max()):.2f}; the quintic puts the large ones between about 0.7 and 1.2.")
    zeros = student(torch.zeros(3, 5))
    if not (isinstance(zeros, torch.Tensor) and bool(torch.isfinite(zeros).all()) and not bool(zeros.any())):
        raise ExerciseFailed("a matrix of zeros (a weight with no gradient) gave NaN or non-zero values: "
                             "dividing by its norm, 0, is 0 / 0.",
                             fix="divide by the norm plus a tiny eps (1e-7), or by the norm clamped at eps.")
    return ("Five rounds of three matrix products: every singular value of the update now lies near 1 "
            "(transposing a tall matrix only made the Gram matrix smaller).")
