"""Exercises of notebook 13 (post_training): the LoRA forward, the answer-only loss mask, the
DPO loss, the group-normalised advantages."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close


@exercise(hint="The frozen layer's output plus a low-rank correction: x goes down to r numbers "
               "through A, back up through B, and is scaled by alpha / r.",
          task="Write lora_forward(x, base, A, B, alpha) -> the adapted layer's output. The check "
               "compares it with the LoRA formula for B = 0 and a random B, for two alphas.")
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


@exercise(hint="One entry per token of prompt + answer; only the answer's tokens count in the loss.",
          task="Write answer_mask(prompt, answer) -> a tensor with one entry per token of prompt + "
               "answer. The check compares it with the answer-only mask on two examples.")
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


def helper_dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
                    ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
                    beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """helpers.post.dpo.dpo_loss: losses (B,), chosen and rejected rewards (B,)."""
    from helpers.post.dpo import dpo_loss as helper

    return helper(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)


# The usual slips, as functions of (chosen log-ratio, rejected log-ratio, beta, the four
# log-probabilities), each named when the answer's losses match it.
DPO_SLIPS = {
    "beta is applied outside the log-sigmoid (-beta * logsigmoid(margin)): it belongs inside, "
    "scaling the log-ratios before the sigmoid": lambda c, r, b, lp: -b * F.logsigmoid(c - r),
    "the sign is flipped: the loss is MINUS log sigmoid, so that it shrinks as the chosen answer "
    "gains": lambda c, r, b, lp: F.logsigmoid(b * (c - r)),
    "chosen and rejected are swapped (or policy and reference): the chosen answer's log-ratio "
    "comes first": lambda c, r, b, lp: -F.logsigmoid(b * (r - c)),
    "the reference is left out: each log-probability is measured against the reference's, "
    "log pi - log pi_ref": lambda c, r, b, lp: -F.logsigmoid(b * (lp[0] - lp[1])),
    "the log is missing: the loss is -log sigmoid(z), not -sigmoid(z) or 1 - sigmoid(z)":
        lambda c, r, b, lp: 1 - torch.sigmoid(b * (c - r)),
    "the loss is sigmoid(-z) without its log: take -log sigmoid(z)":
        lambda c, r, b, lp: -torch.sigmoid(b * (c - r)),
}


def _name_dpo_slip(losses: torch.Tensor, lp: tuple, beta: float) -> None:
    """Fail naming the slip that `losses` (B,) match, if they are wrong and match one."""
    chosen, rejected = lp[0] - lp[2], lp[1] - lp[3]
    if torch.allclose(losses.double(), -F.logsigmoid(beta * (chosen - rejected)), atol=1e-6):
        return
    for slip, wrong in DPO_SLIPS.items():
        if torch.allclose(losses.double(), wrong(chosen, rejected, beta, lp), atol=1e-6):
            raise ExerciseFailed(f"{slip} (beta = {beta}).")


@exercise(hint="Compare each answer's log-probability under the policy with the reference's; the "
               "loss is a logistic loss on beta times the chosen answer's gain over the rejected one's.",
          task="Write dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta) -> "
               "(losses, chosen_rewards, rejected_rewards), each (B,). The check compares them "
               "with the helpers' DPO loss (equal to TRL's) for two betas, on random log-probabilities "
               "and on a policy equal to its reference, and checks the losses' gradient.")
def dpo_loss(student: Callable) -> str:
    generator = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-torch.rand(6, generator=generator, dtype=torch.float64) * 8 for _ in range(4))
    cases = [((pc, pr, rc, rr), 0.1), ((pc, pr, rc, rr), 2.0), ((pc, pr, pc, pr), 0.5)]
    for lp, beta in cases:
        got = student(*(t.clone() for t in lp), beta)
        losses, chosen_rewards, rejected_rewards = helper_dpo_loss(*lp, beta)
        if isinstance(got, torch.Tensor):
            if got.shape == losses.shape:
                _name_dpo_slip(got, lp, beta)
            raise ExerciseFailed("return three tensors, (losses, chosen_rewards, rejected_rewards), "
                                 f"not one tensor of shape {tuple(got.shape)}.")
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise ExerciseFailed(f"return (losses, chosen_rewards, rejected_rewards), got {type(got).__name__}.")
        if isinstance(got[0], torch.Tensor) and got[0].dim() == 0:
            raise ExerciseFailed("your losses are one number: return one loss per pair, shape (B,) "
                                 "(the training loop takes the mean).")
        if isinstance(got[0], torch.Tensor) and got[0].shape == losses.shape:
            _name_dpo_slip(got[0], lp, beta)
        expect_close(got[0], losses, f"the losses with beta = {beta}", atol=1e-6)
        for what, mine, want, ratio in (("chosen", got[1], chosen_rewards, lp[0] - lp[2]),
                                        ("rejected", got[2], rejected_rewards, lp[1] - lp[3])):
            if isinstance(mine, torch.Tensor) and mine.shape == want.shape and beta != 1 and \
                    torch.allclose(mine.double(), ratio, atol=1e-6) and ratio.abs().max() > 0:
                raise ExerciseFailed(f"the {what} rewards are the log-ratios without beta: the "
                                     "implicit reward is beta * (log pi - log pi_ref).")
            expect_close(mine, want, f"the {what} rewards with beta = {beta}", atol=1e-6)
    grads = [t.clone().requires_grad_(True) for t in (pc, pr)]
    student(grads[0], grads[1], rc, rr, 0.5)[0].sum().backward()
    if grads[0].grad is None or not ((grads[0].grad < 0).all() and (grads[1].grad > 0).all()):
        raise ExerciseFailed("the losses do not carry a gradient that raises log pi(chosen) and "
                             "lowers log pi(rejected): compute them from the inputs with torch operations.")
    return "That is the DPO loss, with TRL's rewards: a logistic loss on the difference of two log-ratios."


@exercise(hint="Each row of rewards is one prompt's group: score every answer against its own "
               "group's mean, in units of its own group's spread.",
          task="Write group_advantages(rewards, eps) -> a tensor shaped like rewards (prompts, "
               "answers). The check compares it with GRPO's advantages, with a group whose "
               "rewards are all equal.")
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
