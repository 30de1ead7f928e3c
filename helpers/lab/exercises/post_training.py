"""Exercises of notebook 13 (post_training): the LoRA forward, the answer-only loss mask, the
DPO loss, the group-normalised advantages."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close


@exercise(hint="The frozen layer's output plus a low-rank correction: x goes down to r numbers "
               "through A, back up through B, and is scaled by alpha / r.")
def lora_forward(student: Callable) -> str:
    generator = torch.Generator().manual_seed(0)
    base = torch.nn.Linear(6, 4)
    x = torch.randn(3, 6, generator=generator)
    A = torch.randn(2, 6, generator=generator)
    for B in (torch.zeros(4, 2), torch.randn(4, 2, generator=generator)):
        for alpha in (2.0, 8.0):
            got = student(x, base, A, B, alpha)
            expected = base(x) + (x @ A.T) @ B.T * (alpha / 2)
            expect_close(got, expected.detach(), f"the output with alpha={alpha}", atol=1e-5)
    return "With B = 0 that is exactly the base layer: the adapter starts as a no-op."


@exercise(hint="One entry per token of prompt + answer; only the answer's tokens count in the loss.")
def answer_mask(student: Callable) -> str:
    for prompt, answer in (([7, 1, 2, 3, 8], [4, 5, 9]), ([7, 2, 8], [6, 9])):
        got = student(prompt, answer)
        expected = torch.tensor([0] * len(prompt) + [1] * len(answer))
        if not isinstance(got, torch.Tensor):
            raise ExerciseFailed(f"return a tensor, got {type(got).__name__}.")
        if got.shape != expected.shape:
            raise ExerciseFailed(f"the mask should have one entry per token of prompt + answer, "
                                 f"{tuple(expected.shape)}, got {tuple(got.shape)}.")
        if torch.equal(got.long(), 1 - expected):
            raise ExerciseFailed("0 and 1 are swapped: the loss counts the answer, not the prompt.")
        if not torch.equal(got.long(), expected):
            raise ExerciseFailed(f"for a prompt of {len(prompt)} tokens and an answer of "
                                 f"{len(answer)}, the mask is wrong at some positions.")
    return "The prompt's tokens now cost nothing: the model learns to answer, not to ask."


@exercise(hint="Compare each answer's log-probability under the policy with the reference's; the "
               "loss is a logistic loss on beta times the chosen answer's gain over the rejected one's.")
def dpo_loss(student: Callable) -> str:
    generator = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-torch.rand(5, generator=generator) * 8 for _ in range(4))
    for beta in (0.1, 2.0):
        got = student(pc, pr, rc, rr, beta)
        expected = -F.logsigmoid(beta * ((pc - rc) - (pr - rr)))
        if isinstance(got, torch.Tensor) and got.dim() == 0:
            expect_close(got, expected.mean(), f"the mean loss with beta={beta}", atol=1e-5)
        else:
            expect_close(got, expected, f"the per-pair losses with beta={beta}", atol=1e-5)
    return "That is the DPO loss: a logistic loss on the difference of two log-ratios."


@exercise(hint="Each row of rewards is one prompt's group: score every answer against its own "
               "group's mean, in units of its own group's spread.")
def group_advantages(student: Callable) -> str:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    got = student(rewards, 1e-4)
    mean = rewards.mean(dim=1, keepdim=True)
    unbiased = (rewards - mean) / (rewards.std(dim=1, keepdim=True) + 1e-4)
    biased = (rewards - mean) / (rewards.std(dim=1, keepdim=True, correction=0) + 1e-4)
    if isinstance(got, torch.Tensor) and got.shape == rewards.shape:
        if torch.allclose(got, biased, atol=1e-4):
            return "Correct (with the population std; TRL uses the unbiased one, both work)."
        if torch.allclose(got, (rewards - rewards.mean()) / (rewards.std() + 1e-4), atol=1e-4):
            raise ExerciseFailed("you normalised over the whole batch: each prompt's group has "
                                 "its own mean and std (dim=1).")
    expect_close(got, unbiased, "the advantages", atol=1e-4)
    return "Each answer is now scored against its own group: no value model needed."
