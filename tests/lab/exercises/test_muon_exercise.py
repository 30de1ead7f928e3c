"""Notebook 9's Newton-Schulz exercise (modern_decoder.newton_schulz): every correct formulation
passes, and each usual slip is named. NS_CASES has the shape of tests/lab/exercises/test_checkers.py's CASES
(name, answer, the words the message must hold, or None for a right answer)."""

from __future__ import annotations

import pytest
import torch

import helpers.lab.exercises as exercises
import helpers.training.muon as muon
from helpers.training.muon import NS_COEFFICIENTS

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
