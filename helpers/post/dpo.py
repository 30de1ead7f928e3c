"""Direct preference optimisation, written from its formula (notebook 13, section 5).

    check_pair          refuse a pair whose chosen and rejected answers are equal, or empty
    preference_batch    for each fact: chosen = the right answer, rejected = a near miss
    dpo_loss            -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), per pair
    answer_kl           the exact KL(pi || ref) per answer token, averaged over answer tokens
    train_dpo           AdamW on dpo_loss with a frozen reference; what it measured

The loss (Rafailov et al., 2023), with log-probabilities of whole answers:

    chosen_rewards   = beta * (policy_chosen_logps   - ref_chosen_logps)
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps)
    loss             = -log sigmoid(chosen_rewards - rejected_rewards)

The names are TRL's; tests/post/test_dpo.py runs TRL's own DPO loss on the same log-probabilities.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.post.sft import check_ids_and_mask, encode_example, pad_batch, sequence_logps
from helpers.post.tasks import NUMBER_WORDS, Fact, wrong_result


def check_pair(chosen: str, rejected: str) -> None:
    """A preference pair needs two different, non-empty answers."""
    for name, answer in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"{name} is {answer!r}, expected a non-empty answer")
    if chosen.strip() == rejected.strip():
        raise ValueError(f"chosen and rejected are both {chosen!r}, expected two different "
                         "answers: a pair of equal answers says nothing to prefer")


def preference_batch(tokenizer, facts: list[Fact], pad_id: int, seed: int
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """chosen ids (B, N), chosen mask, rejected ids (B, N'), rejected mask; rejected answers are
    near misses (off by 1 to 3), drawn with `seed`."""
    if not facts:
        raise ValueError("facts is empty, expected facts to make preference pairs from")
    rng = random.Random(seed)
    chosen, rejected = [], []
    for fact in facts:
        good, bad = fact.answer(), NUMBER_WORDS[wrong_result(fact, rng)]
        check_pair(good, bad)
        chosen.append(encode_example(tokenizer, fact.question(), good))
        rejected.append(encode_example(tokenizer, fact.question(), bad))
    return (*pad_batch(chosen, pad_id), *pad_batch(rejected, pad_id))


def dpo_loss(policy_chosen_logps: Tensor, policy_rejected_logps: Tensor,
             ref_chosen_logps: Tensor, ref_rejected_logps: Tensor, beta: float
             ) -> tuple[Tensor, Tensor, Tensor]:
    """Each argument (B,): log pi(answer | prompt) summed over the answer's tokens.
    Returns losses (B,), chosen_rewards (B,), rejected_rewards (B,); the rewards are detached."""
    beta = checks.positive_float("beta", beta, ": beta scales the log-ratios; beta <= 0 "
                                 "would reward moving away from the preference or ignore it")
    given = (("policy_chosen_logps", policy_chosen_logps), ("policy_rejected_logps", policy_rejected_logps),
             ("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps))
    for name, t in given:
        if not isinstance(t, Tensor) or not t.is_floating_point() or t.dim() != 1:
            got = f"a {type(t).__name__}" if not isinstance(t, Tensor) else f"{t.dtype} {tuple(t.shape)}"
            raise TypeError(f"{name} is {got}, expected a floating-point tensor (B,) of summed "
                            "log-probabilities")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} holds NaN or inf, expected finite log-probabilities (a NaN "
                             "would make every loss and gradient NaN)")
    shape = policy_chosen_logps.shape
    for name, t in given[1:]:
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like "
                             "policy_chosen_logps")
    chosen_logratios = policy_chosen_logps - ref_chosen_logps
    rejected_logratios = policy_rejected_logps - ref_rejected_logps
    losses = -F.logsigmoid(beta * (chosen_logratios - rejected_logratios))
    return losses, beta * chosen_logratios.detach(), beta * rejected_logratios.detach()


@torch.no_grad()
def answer_kl(policy: nn.Module, reference: nn.Module, ids: Tensor, mask: Tensor) -> float:
    """Mean over answer tokens of KL(pi(. | context) || ref(. | context)), exact over the
    vocabulary, on the contexts of `ids` (B, N) where mask[:, 1:] is 1."""
    check_ids_and_mask(ids, mask)
    if not mask[:, 1:].any():
        raise ValueError("mask has no answer tokens after position 0, expected some to average "
                         "the KL over (else the mean is 0 / 0)")
    logp = policy(ids)[:, :-1].log_softmax(-1)
    logq = reference(ids)[:, :-1].log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # (B, N - 1)
    weight = mask[:, 1:].float()
    return float((kl * weight).sum() / weight.sum())


def train_dpo(policy: nn.Module, reference: nn.Module, batch: tuple[Tensor, Tensor, Tensor, Tensor],
              beta: float, steps: int, lr: float) -> dict[str, list[float]]:
    """Full-batch AdamW on the mean dpo_loss; per step: loss, preference accuracy (chosen reward
    above rejected), mean reward margin. The reference is frozen: its log-probs are computed once."""
    checks.positive_float("beta", beta)
    checks.positive_int("steps", steps)
    checks.positive_float("lr", lr)
    chosen_ids, chosen_mask, rejected_ids, rejected_mask = batch
    reference.eval()
    with torch.no_grad():
        ref_c = sequence_logps(reference, chosen_ids, chosen_mask)
        ref_r = sequence_logps(reference, rejected_ids, rejected_mask)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=0.0)
    history: dict[str, list[float]] = {"loss": [], "accuracy": [], "margin": []}
    policy.train()
    for _ in range(steps):
        pol_c = sequence_logps(policy, chosen_ids, chosen_mask)
        pol_r = sequence_logps(policy, rejected_ids, rejected_mask)
        losses, chosen_rewards, rejected_rewards = dpo_loss(pol_c, pol_r, ref_c, ref_r, beta)
        optimizer.zero_grad(set_to_none=True)
        losses.mean().backward()
        optimizer.step()
        history["loss"].append(losses.mean().item())
        history["accuracy"].append((chosen_rewards > rejected_rewards).float().mean().item())
        history["margin"].append((chosen_rewards - rejected_rewards).mean().item())
    policy.eval()
    return history


