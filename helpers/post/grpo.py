"""GRPO with a verifiable reward (notebook 13, section 6).

    group_advantages    (r - mean of its group) / (std of its group + eps), per prompt
    k3_kl               exp(ref - logp) - (ref - logp) - 1 per token: >= 0, unbiased for KL
    grpo_loss           the clipped-ratio objective with a k3 penalty, normalised per sequence
                        (GRPO), per token (DAPO) or by a constant (Dr. GRPO)
    rollout             a group of sampled answers per prompt, rewarded by the exact checker
    train_grpo          the loop: sample, reward, normalise, a few clipped updates; the rewards

For each prompt, G answers are sampled; the advantage of answer i is its reward measured against
its own group, so no value model is needed to say what a "normal" reward is. Per token t of
answer i, with ratio = pi / pi_old:

    loss_t = -min(ratio * A_i, clip(ratio, 1 - eps, 1 + eps) * A_i) + beta * k3_t

Names as in TRL's GRPO trainer (advantages, kl, beta, epsilon). Shapes: P prompts, G answers
per prompt, T completion tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.post.sft import answer_text, chat_prompt, sample_answers, token_logps
from helpers.post.tasks import Fact, is_correct

NORMALISATIONS = ("sequence", "token", "constant")


def group_advantages(rewards: Tensor, eps: float = 1e-4) -> Tensor:
    """rewards (P, G) -> advantages (P, G): each row centred on its mean and divided by its
    (unbiased) std + eps. A group whose answers all got the same reward has advantage 0."""
    if not isinstance(rewards, Tensor) or not rewards.is_floating_point():
        got = f"dtype {rewards.dtype}" if isinstance(rewards, Tensor) else f"a {type(rewards).__name__}"
        raise TypeError(f"rewards has {got}, expected a floating-point tensor (P, G)")
    if rewards.dim() != 2:
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}, expected (P, G)")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards holds NaN or inf, expected finite rewards (one NaN would make "
                         "its whole group's advantages NaN)")
    if rewards.shape[1] < 2:
        raise ValueError(f"rewards has groups of {rewards.shape[1]}, expected G >= 2 answers per "
                         "prompt: a group of one has nothing to be compared with")
    checks.positive_float("eps", eps)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


def k3_kl(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref) from the sampled tokens' log-probs (same shape)."""
    if logps.shape != ref_logps.shape:
        raise ValueError(f"ref_logps has shape {tuple(ref_logps.shape)}, expected "
                         f"{tuple(logps.shape)} like logps")
    log_ratio = ref_logps - logps
    return log_ratio.exp() - log_ratio - 1


def grpo_loss(logps: Tensor, old_logps: Tensor, ref_logps: Tensor, advantages: Tensor,
              mask: Tensor, epsilon: float = 0.2, beta: float = 0.04,
              normalise: str = "sequence") -> tuple[Tensor, dict[str, float]]:
    """logps, old_logps, ref_logps, mask: (B, T) over the sampled tokens; advantages (B,).

    normalise: "sequence" averages each answer's tokens, then the answers (the GRPO paper);
    "token" averages over every token of the batch (DAPO); "constant" divides the sum by
    B * T (Dr. GRPO). Returns the loss and {"kl", "clipped"} for logging."""
    checks.one_of("normalise", normalise, NORMALISATIONS)
    checks.number_in("epsilon", epsilon, 0.0, 1.0, low_open=True, high_open=True)
    checks.number_in("beta", beta, 0.0, float("inf"), high_open=True, expected="a number >= 0")
    for name, t in (("old_logps", old_logps), ("ref_logps", ref_logps), ("mask", mask)):
        if t.shape != logps.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(logps.shape)}")
    if advantages.shape != logps.shape[:1]:
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected "
                         f"({logps.shape[0]},), one per answer")
    for name, t in (("logps", logps), ("old_logps", old_logps), ("ref_logps", ref_logps),
                    ("advantages", advantages)):
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} holds NaN or inf, expected finite values (they would make "
                             "the loss NaN)")
    mask = mask.float()
    if (mask.sum(dim=1) == 0).any():
        raise ValueError("mask has an answer with no tokens, expected at least one per answer")
    ratio = (logps - old_logps).exp()
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    a = advantages[:, None]
    per_token = -torch.min(ratio * a, clipped * a)
    kl = k3_kl(logps, ref_logps)
    per_token = per_token + beta * kl
    if normalise == "sequence":
        loss = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    elif normalise == "token":
        loss = (per_token * mask).sum() / mask.sum()
    else:
        loss = (per_token * mask).sum() / mask.numel()
    with torch.no_grad():
        stats = {"kl": float((kl * mask).sum() / mask.sum()),
                 "clipped": float(((ratio != clipped).float() * mask).sum() / mask.sum())}
    return loss, stats


@torch.no_grad()
def rollout(policy: nn.Module, tokenizer, fact: Fact, group_size: int, max_new_tokens: int,
            temperature: float, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """G answers to one fact's question: ids (G, P + T), mask (G, P + T) on the answers
    (through END), rewards (G,): 1.0 if the answer is exactly right, else 0.0."""
    end_id = tokenizer.special_tokens["<|end|>"]
    prompt = torch.tensor(tokenizer.encode(chat_prompt(fact.question())))
    ids, mask = sample_answers(policy, prompt, group_size, max_new_tokens, end_id, temperature,
                               generator)
    rewards = torch.tensor([float(is_correct(answer_text(tokenizer, row, end_id), fact))
                            for row in ids[:, len(prompt):].tolist()])
    return ids, mask, rewards


def train_grpo(policy: nn.Module, reference: nn.Module, tokenizer, facts: list[Fact], steps: int,
               prompts_per_step: int = 4, group_size: int = 8, lr: float = 1e-3,
               iterations: int = 2, epsilon: float = 0.2, beta: float = 0.04,
               normalise: str = "sequence", temperature: float = 1.0, max_new_tokens: int = 9,
               seed: int = 0) -> dict[str, list[float]]:
    """Per step: P facts, G sampled answers each, group advantages, then `iterations` AdamW
    updates on grpo_loss against the answers' log-probs at sampling time. Returns per step the
    mean reward of the samples, the k3 KL and the fraction of clipped tokens."""
    checks.positive_int("steps", steps)
    checks.positive_int("prompts_per_step", prompts_per_step)
    checks.positive_int("iterations", iterations)
    checks.positive_float("lr", lr)
    if checks.positive_int("group_size", group_size) < 2:
        raise ValueError(f"group_size is {group_size!r}, expected >= 2: a group of one has no "
                         "baseline to compare with")
    if not facts:
        raise ValueError("facts is empty, expected prompts to train on")
    # grpo_loss and sample_answers check these too, but only after a whole rollout: refuse first
    checks.one_of("normalise", normalise, NORMALISATIONS)
    checks.number_in("epsilon", epsilon, 0.0, 1.0, low_open=True, high_open=True)
    checks.number_in("beta", beta, 0.0, float("inf"), high_open=True, expected="a number >= 0")
    checks.number_in("temperature", temperature, 0.0, float("inf"), high_open=True,
                     expected="a number >= 0 (0 = greedy)")
    checks.positive_int("max_new_tokens", max_new_tokens)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=0.0)
    reference.eval()
    history: dict[str, list[float]] = {"reward": [], "kl": [], "clipped": []}
    for _ in range(steps):
        chosen = torch.randint(len(facts), (prompts_per_step,), generator=generator).tolist()
        policy.eval()
        groups = [rollout(policy, tokenizer, facts[i], group_size, max_new_tokens, temperature,
                          generator) for i in chosen]
        rewards = torch.stack([g[2] for g in groups])  # (P, G)
        advantages = group_advantages(rewards)
        with torch.no_grad():
            olds = [token_logps(policy(ids), ids) for ids, _, _ in groups]
            refs = [token_logps(reference(ids), ids) for ids, _, _ in groups]
        policy.train()
        for _ in range(iterations):
            total, stats = 0.0, {"kl": 0.0, "clipped": 0.0}
            for (ids, mask, _), old, ref, adv in zip(groups, olds, refs, advantages, strict=True):
                loss, s = grpo_loss(token_logps(policy(ids), ids), old, ref, adv, mask[:, 1:],
                                    epsilon, beta, normalise)
                total = total + loss / len(groups)
                stats = {k: stats[k] + s[k] / len(groups) for k in stats}
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            optimizer.step()
        history["reward"].append(rewards.mean().item())
        history["kl"].append(stats["kl"])
        history["clipped"].append(stats["clipped"])
    policy.eval()
    return history
