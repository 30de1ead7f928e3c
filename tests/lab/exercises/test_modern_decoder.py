"""Notebook 9's checkers (helpers/lab/exercises/modern_decoder.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import cmath
import math

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
import helpers.training.muon as muon
from helpers.lab.exercises import evaluate
from helpers.lab.exercises.modern_decoder import BLOCK_MISTAKES, modern_block_variant
from helpers.model import modern
from helpers.model.multihead import split_heads
from helpers.training.muon import NS_COEFFICIENTS

from .judging import (
    assert_cases_cover,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    from_the_checker,
    judge,
    named,
)


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


def block_with_the_helpers(block, x, table):
    """Right, but from the course's own pieces (rms_norm, rope_rotate_half, attend): the exercise
    asks for the block from its weights, so the grade refuses it by name (issue 50)."""
    h = modern.rms_norm(x, block.norm1.weight, block.norm1.eps)
    q = modern.rope_rotate_half(split_heads(block.attn.q_proj(h), block.attn.n_heads), table)
    k, v = block.attn.project_keys_values(h)
    x = x + block.attn.attend(q, modern.rope_rotate_half(k, table), v, causal=True)
    h = modern.rms_norm(x, block.norm2.weight, block.norm2.eps)
    return x + block.mlp.down(F.silu(block.mlp.gate(h)) * block.mlp.up(h))


def test_the_modern_block_checker_refuses_the_helpers_and_names_each_mistake():
    passed, said = evaluate("modern_decoder.modern_block", block_with_the_helpers)
    assert not passed and "helpers.model.modern.rms_norm" in said
    assert evaluate("modern_decoder.modern_block", block_with_the_helpers, watched=False)[0]  # yet right
    for mistake, message in BLOCK_MISTAKES.items():
        passed, said = evaluate("modern_decoder.modern_block",
                                lambda b, x, t, m=mistake: modern_block_variant(b, x, t, m), watched=False)
        assert not passed and message in said, mistake
    passed, said = evaluate("modern_decoder.modern_block", lambda b, x, t: x)
    assert not passed and "wrong values" in said


A, B, C = NS_COEFFICIENTS


NAME = "modern_decoder.newton_schulz"


def _ns(coefficients=NS_COEFFICIENTS, transpose=True, scale="frobenius", eps=1e-7, fixed_steps=None,
        fused=False, gram_side="left", back=True):
    """A Newton-Schulz written one way or another; the keywords plant one slip each."""
    def answer(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
        a, b, c = coefficients
        tall = m.shape[0] > m.shape[1]
        x = m.T if tall and transpose else m
        if scale == "frobenius":
            x = x / (x.norm() + eps)
        elif scale == "spectral":
            x = x / (torch.linalg.matrix_norm(x, ord=2) + eps)
        for _ in range(steps if fixed_steps is None else fixed_steps):
            gram = x @ x.T if gram_side == "left" else x.T @ x
            if fused:
                x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
            else:
                x = a * x + (b * gram + c * gram @ gram) @ x
        return x.T if tall and transpose and back else x
    return answer


def _with_the_course(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    return muon.newton_schulz(m, steps, dtype=m.dtype)


def _square_left_transposed(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Transposes when rows >= columns but back only when rows > columns: a square result is f(X)^T."""
    x = m.T if m.shape[0] >= m.shape[1] else m
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        g = x @ x.T
        x = A * x + (B * g + C * g @ g) @ x
    return x.T if m.shape[0] > m.shape[1] else x


def _by_svd(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    return u @ vh


def _clamped(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """A right answer in another style: the norm clamped at eps, float32 inside, m's dtype out."""
    x = m.float().T if m.shape[0] > m.shape[1] else m.float()
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        g = x @ x.T
        x = A * x + B * g @ x + C * g @ g @ x
    return (x.T if m.shape[0] > m.shape[1] else x).to(m.dtype)


NS_CASES = [
    (NAME, _ns(), None),
    (NAME, _ns(transpose=False), None),                    # the big Gram matrix: slower, same result
    (NAME, _ns(fused=True), None),                         # addmm, as torch.optim.Muon
    (NAME, _clamped, None),
    (NAME, _ns(scale="none"), "not scaled first"),
    (NAME, _ns(eps=0.0), "0 / 0"),
    (NAME, _ns(fixed_steps=5), "your function ran 5"),
    (NAME, _ns(fixed_steps=4), "your function ran 4"),
    (NAME, _ns(coefficients=(A, C, B)), "coefficients"),
    (NAME, _ns(coefficients=(A, -B, C)), "coefficients"),
    (NAME, _ns(coefficients=(-A, -B, -C)), "a sign is flipped"),
    (NAME, _ns(scale="spectral"), "largest singular value"),
    (NAME, _ns(back=False), "has shape"),
    (NAME, _square_left_transposed, "singular vectors are not"),
    (NAME, _by_svd, "torch.linalg.svd"),
    (NAME, _with_the_course, "newton_schulz"),
]


@pytest.mark.parametrize("name,answer,message", NS_CASES)
def test_newton_schulz_checker_judges(name, answer, message):
    passed, said = exercises.evaluate(name, answer, time_limit=None)
    assert passed == (message is None), said
    if message is not None:
        assert message in said and "❌" in said and "raised" not in said, said


def test_not_attempted_says_what_to_write():
    def stub(*args, **kwargs):
        raise NotImplementedError

    passed, said = exercises.evaluate(NAME, stub)
    assert not passed and "not attempted yet" in said and "Write my_newton_schulz" in said
    assert exercises.get(NAME).hint not in said


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


CASES = [
    ("modern_decoder.rotate_pair", pair_complex, None),
    ("modern_decoder.rotate_pair", pair_clockwise, "clockwise"),
    ("modern_decoder.rotate_pair", pair_theta_only, "position * theta"),
    ("modern_decoder.alibi_bias", alibi_good, None),
    ("modern_decoder.alibi_bias", alibi_swapped, "query and key are swapped"),
    ("modern_decoder.alibi_bias", alibi_sign, "sign is flipped"),
    ("modern_decoder.rms_norm", rms_rsqrt, None),
    ("modern_decoder.rms_norm", rms_eps_outside, "outside the square root"),
    ("modern_decoder.rms_norm", rms_centred, "that is LayerNorm"),
    ("modern_decoder.modern_block", block_by_hand, None),
    ("modern_decoder.modern_block", block_post_norm, "post-norm"),
    ("modern_decoder.modern_block", block_interleaved, "pairs feature i with feature i + D_H/2"),
    ("modern_decoder.modern_block", block_by_the_checker, "helpers.lab.exercises.modern_decoder.modern_block_variant"),
    ("modern_decoder.alibi_attention", alibi_attention_by_where, None),
    ("modern_decoder.alibi_attention", alibi_attention_with_the_course_bias, "helpers.model.modern.alibi_bias"),
    ("modern_decoder.alibi_attention", _alibi_slip("bias before scaling"), "before dividing by sqrt(D_H)"),
    ("modern_decoder.alibi_attention", _alibi_slip("not causal"), "sees the keys after it"),
    ("modern_decoder.alibi_attention", _alibi_slip("sign"), "wrong sign"),
    ("modern_decoder.alibi_attention", _alibi_slip("no bias"), "no distance penalty"),
]
CASES += NS_CASES


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("modern_decoder", CASES)


@pytest.mark.parametrize("name", exercise_names("modern_decoder"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
