"""GRPO with a verifiable reward (notebook 13, section 6).

    group_advantages    r - mean of its group, divided by the group's std + eps (GRPO, DAPO)
                        or not (Dr. GRPO: scale=False)
    k3_kl               exp(ref - logp) - (ref - logp) - 1 per token: >= 0, and unbiased for
                        KL(pi || ref) when the tokens are sampled from pi itself
    grpo_loss           the clipped-ratio objective with a k3 penalty over a batch (B, T),
                        normalised per sequence (GRPO), per token of the whole batch (DAPO) or
                        by the constant B * T (Dr. GRPO)
    rollout             a group of sampled answers per prompt, rewarded by the exact checker
    train_grpo          the loop: sample, reward, advantages, a few clipped updates on the whole
                        batch of P * G answers at once; the rewards

For each prompt, G answers are sampled; the advantage of answer i is its reward measured against
its own group, so no value model is needed to say what a "normal" reward is. Per token t of
answer i, with ratio = pi / pi_old (pi_old: the policy that sampled the answers):

    loss_t = -min(ratio * A_i, clip(ratio, 1 - eps, 1 + eps) * A_i) + beta * k3_t

The three normalisations, for the B = P * G answers of a step, |o_i| tokens in answer i and T
the generation budget (max_new_tokens):

    "sequence"  (1 / B) sum_i (1 / |o_i|) sum_t loss_it      GRPO (Shao et al., 2024)
    "token"     sum_i sum_t loss_it / sum_i |o_i|            DAPO (Yu et al., 2025)
    "constant"  sum_i sum_t loss_it / (B * T)                Dr. GRPO (Liu et al., 2025), with
                                                             scale_rewards=False (no std division)

Names as in TRL's GRPO trainer (advantages, kl, beta, epsilon, scale_rewards). Shapes: P prompts,
G answers per prompt, T completion tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.post.sft import answer_text, chat_prompt, sample_answers, token_logps
from helpers.post.tasks import Fact, is_correct

NORMALISATIONS = ("sequence", "token", "constant")


def group_advantages(rewards: Tensor, eps: float = 1e-4, scale: bool = True) -> Tensor:
    """rewards (P, G) -> advantages (P, G): each row centred on its mean and, if `scale`,
    divided by its (unbiased) std + eps (GRPO, DAPO); scale=False keeps the centred rewards
    (Dr. GRPO). A group whose answers all got the same reward has advantage 0."""
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
    scale = checks.boolean("scale", scale)
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def k3_kl(logps: Tensor, ref_logps: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref) from the sampled tokens' log-probs (same shape).

    Unbiased only when the tokens were sampled from pi, the policy whose log-probs are `logps`:
    after an update on the same samples (pi != pi_old) its mean is biased."""
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
    "token" averages over every token of the batch, all answers together (DAPO); "constant"
    divides the sum by B * T, the whole tensor, whatever the answers' lengths (Dr. GRPO: pass
    T = the generation budget). Returns the loss and {"kl", "clipped"} for logging."""
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
               seed: int = 0, scale_rewards: bool = True) -> dict[str, list[float]]:
    """Per step: P facts, G sampled answers each, group advantages (divided by the group's std
    if scale_rewards), then `iterations` AdamW updates, each on one grpo_loss over the whole
    batch of P * G answers (completion tokens only, (P * G, max_new_tokens)) against the
    answers' log-probs at sampling time. Returns per step the mean reward of the samples, the
    k3 KL and the fraction of clipped tokens."""
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
    scale_rewards = checks.boolean("scale_rewards", scale_rewards)
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
        advantages = group_advantages(rewards, scale=scale_rewards).flatten()  # (P * G,)
        # prompts differ in length, so each group runs alone; its completion is the last T tokens
        mask = torch.cat([m[:, -max_new_tokens:] for _, m, _ in groups]).float()  # (P * G, T)
        with torch.no_grad():
            old = completion_logps(policy, groups, max_new_tokens)
            ref = completion_logps(reference, groups, max_new_tokens)
        policy.train()
        for _ in range(iterations):
            loss, stats = grpo_loss(completion_logps(policy, groups, max_new_tokens), old, ref,
                                    advantages, mask, epsilon, beta, normalise)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        history["reward"].append(rewards.mean().item())
        history["kl"].append(stats["kl"])
        history["clipped"].append(stats["clipped"])
    policy.eval()
    return history


def completion_logps(model: nn.Module, groups: list[tuple[Tensor, Tensor, Tensor]],
                     max_new_tokens: int) -> Tensor:
    """The log-probs of the last `max_new_tokens` tokens of every group's ids, stacked:
    (P * G, max_new_tokens). Each group is one forward pass (its prompt has its own length)."""
    checks.positive_int("max_new_tokens", max_new_tokens)
    if not isinstance(groups, list) or not groups:
        raise ValueError(f"groups is {groups!r:.60}, expected a non-empty list of (ids, ...) tuples")
    for index, (ids, *_) in enumerate(groups):
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] <= max_new_tokens:
            shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"groups[{index}]'s ids is {shape}, expected a (G, N) tensor with "
                             f"N > max_new_tokens = {max_new_tokens} (a prompt before the answer)")
    return torch.cat([token_logps(model(ids), ids)[:, -max_new_tokens:] for ids, _, _ in groups])
