"""Exercises of notebook 13 (post_training): the LoRA layer, the answer-only loss, the DPO
loss, the group-normalised advantages and the GRPO loss."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close, hidden_round, seeded
from helpers.lab.exercises._post_slips import SFT_SLIPS, _name_dpo_slip, _sft_variant


def _weight(module: object, name: str) -> torch.Tensor:
    """The weight of the student's `lora_A` / `lora_B` (an nn.Linear, or a bare Parameter)."""
    if isinstance(module, nn.Linear):
        return module.weight
    if isinstance(module, torch.Tensor):
        return module
    raise ExerciseFailed(f"{name} is a {type(module).__name__}, expected a bias-free nn.Linear "
                         "(peft's layout).", fix=f"create {name} in the constructor as an nn.Linear "
                         "without bias and keep it as an attribute of the layer.")


@exercise(hint="Freeze the wrapped layer, add two small bias-free layers (down to r numbers, then "
               "back up), start the second one at zero, and scale their product by alpha over r; "
               "merging adds that scaled product to the frozen weight once and stops adding it "
               "in the forward.",
          task="Write the class MyLoRALinear(base, r, alpha) with lora_A, lora_B, scaling, forward "
               "and merge. The check builds one around a small nn.Linear, checks what trains, the "
               "output at the start, after setting A and B, and after merging.",
          points=3)
def lora_layer(student: type) -> str:
    generator = seeded(0)
    base = nn.Linear(6, 4)
    x = torch.randn(3, 6, generator=generator)
    with torch.no_grad():
        plain = base(x)
    layer = student(base, 2, 8.0)
    if not isinstance(layer, nn.Module):
        raise ExerciseFailed(f"MyLoRALinear(...) made a {type(layer).__name__}, expected an nn.Module.",
                             fix="subclass nn.Module and call its constructor first in yours.")
    A, B = _weight(getattr(layer, "lora_A", None), "lora_A"), _weight(getattr(layer, "lora_B", None), "lora_B")
    if tuple(A.shape) != (2, 6) or tuple(B.shape) != (4, 2):
        raise ExerciseFailed(f"for a 6 -> 4 layer and r = 2, lora_A's weight is (r, in) = (2, 6) and "
                             f"lora_B's (out, r) = (4, 2); yours are {tuple(A.shape)} and {tuple(B.shape)}.",
                             fix="A takes the in features down to r numbers, B takes r numbers up to the "
                                 "out features; a bias-free linear layer stores its weight as (out, in).")
    trains = {name for name, p in layer.named_parameters() if p.requires_grad}
    if any(p.requires_grad for p in base.parameters()):
        raise ExerciseFailed("the base layer's weight still trains: LoRA freezes it.",
                             fix="switch off the gradient of every parameter of the base layer.")
    if not A.requires_grad or not B.requires_grad:
        raise ExerciseFailed(f"lora_A and lora_B should both train; the trainable parameters are {sorted(trains)}.",
                             fix="leave the gradient of A and B switched on; freeze only the base layer.")
    if B.abs().max() != 0:
        raise ExerciseFailed("lora_B does not start at zero, so the adapted layer does not start as the base layer.",
                             fix="set B's weight to zeros after creating it; A stays random.")
    if A.abs().max() == 0:
        raise ExerciseFailed("lora_A starts at zero too: with A and B both zero, neither ever gets a gradient.",
                             fix="keep A's random initialisation (peft uses the default one of nn.Linear).")
    scaling = getattr(layer, "scaling", None)
    if isinstance(scaling, torch.Tensor) and scaling.numel() == 1:
        scaling = scaling.item()
    if not isinstance(scaling, (int, float)) or abs(scaling - 4.0) > 1e-12:
        raise ExerciseFailed(f"scaling is {scaling!r} for alpha = 8 and r = 2, expected alpha / r = 4.0.",
                             fix="store alpha divided by the rank as the attribute scaling.")
    with torch.no_grad():
        start = layer(x)
    expect_close(start, plain, "the output at the start (B = 0: the base layer's)", atol=1e-6)
    with torch.no_grad():
        A.copy_(torch.randn(2, 6, generator=generator))
        B.copy_(torch.randn(4, 2, generator=generator))
        expected = plain + (x @ A.T) @ B.T * 4.0
        got = layer(x)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape:
            if torch.allclose(got, plain + (x @ A.T) @ B.T, atol=1e-5):
                raise ExerciseFailed("with A and B set, your output misses the scaling alpha / r.",
                                     fix="multiply the low-rank path's output by the scaling.")
            if torch.allclose(got, plain + (x @ A.T) @ B.T * 8.0, atol=1e-5):
                raise ExerciseFailed("with A and B set, your output is scaled by alpha, not alpha / r.",
                                     fix="divide alpha by the rank r once, in the constructor.")
        expect_close(got, expected, "the output with A and B set", atol=1e-5)
        weight_before = base.weight.clone()
        layer.merge()
        merged_weight = base.weight.clone()
        after = layer(x)
    if torch.equal(merged_weight, weight_before):
        raise ExerciseFailed("merge() leaves the base weight as it was: it should fold the update into it.",
                         fix="add the scaling times B's weight times A's weight (out, in) to the base weight.")
    expect_close(merged_weight, weight_before + 4.0 * B @ A, "the base weight after merge()", atol=1e-5)
    if isinstance(after, torch.Tensor) and after.shape == expected.shape and \
            torch.allclose(after, expected + (x @ A.T) @ B.T * 4.0, atol=1e-5):
        raise ExerciseFailed("after merge() your forward adds the update a second time.",
                             fix="remember in merge() that the layer is merged, and then let forward "
                                 "return the base layer's output alone.")
    expect_close(after, expected, "the output after merge()", atol=1e-5)
    return "A frozen layer, a zero-started low-rank update and a merge that costs nothing at inference."


@exercise(hint="Position t predicts token t + 1; keep the positions whose target is an answer "
               "token, take minus the log-probability the model gave that target, and average "
               "over those positions of the whole batch.",
          task="Write answer_only_loss(logits, ids, mask) -> the loss, one number. The check "
               "compares it with the helpers' answer-only loss on a batch of prompts and answers "
               "of different lengths, and checks that the prompt gets no gradient.",
          forbidden=("torch.nn.functional.cross_entropy",))
def answer_only_loss(student: Callable) -> str:
    generator = seeded(0)
    logits = torch.randn(3, 7, 11, generator=generator, dtype=torch.float64)
    ids = torch.randint(0, 11, (3, 7), generator=generator)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1]])
    from helpers.post.sft import answer_only_loss as helper

    expected = helper(logits, ids, mask)
    mine = logits.clone().requires_grad_(True)
    got = student(mine, ids.clone(), mask.clone())
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        raise ExerciseFailed(f"your loss is {getattr(got, 'shape', got)!r}, expected one number (a tensor).",
                             fix="average the kept positions' losses into one number with torch operations.")
    if not torch.allclose(got.detach().double().reshape(()), expected, atol=1e-9):
        for what, fix, slip in SFT_SLIPS:
            if torch.allclose(got.detach().double().reshape(()), _sft_variant(logits, ids, mask, **slip), atol=1e-9):
                raise ExerciseFailed(f"{what}.", fix=fix)
        expect_close(got.detach().double().reshape(()), expected, "the loss", atol=1e-9)
    if not got.requires_grad:
        raise ExerciseFailed("your loss carries no gradient to the logits.",
                             fix="keep every step a torch operation on the logits (no item, no detach).")
    got.sum().backward()
    prompt = ~mask[:, 1:].bool()
    if mine.grad[:, :-1][prompt].abs().max() > 0:
        raise ExerciseFailed("the positions that predict a prompt token get a gradient.",
                             fix="multiply each position's loss by its target's mask before summing.")
    return "The prompt costs nothing: the model learns to answer, not to ask."


def helper_dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
                    ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
                    beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """helpers.post.dpo.dpo_loss: losses (B,), chosen and rejected rewards (B,)."""
    from helpers.post.dpo import dpo_loss as helper

    return helper(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)


@exercise(hint="Compare each answer's log-probability under the policy with the reference's; the "
               "loss is a logistic loss on beta times the chosen answer's gain over the rejected one's.",
          task="Write dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta) -> "
               "(losses, chosen_rewards, rejected_rewards), each (B,). The check compares them "
               "with the helpers' DPO loss (equal to TRL's) for two betas, on random log-probabilities "
               "and on a policy equal to its reference, and checks the losses' gradient.",
          points=3)
def dpo_loss(student: Callable) -> str:
    generator = seeded(0)
    pc, pr, rc, rr = (-torch.rand(6, generator=generator, dtype=torch.float64) * 8 for _ in range(4))
    cases = [((pc, pr, rc, rr), 0.1), ((pc, pr, rc, rr), 2.0), ((pc, pr, pc, pr), 0.5)]
    three = "return three tensors, (losses, chosen_rewards, rejected_rewards), each with one entry per pair."
    for lp, beta in cases:
        got = student(*(t.clone() for t in lp), beta)
        losses, chosen_rewards, rejected_rewards = helper_dpo_loss(*lp, beta)
        if isinstance(got, torch.Tensor):
            if got.shape == losses.shape:
                _name_dpo_slip(got, lp, beta)
            raise ExerciseFailed(f"you return one tensor of shape {tuple(got.shape)}, not three.", fix=three)
        if not isinstance(got, tuple | list) or len(got) != 3:
            raise ExerciseFailed(f"you return a {type(got).__name__}, not (losses, chosen_rewards, "
                                 "rejected_rewards).", fix=three)
        if isinstance(got[0], torch.Tensor) and got[0].dim() == 0:
            raise ExerciseFailed("your losses are one number.",
                                 fix="return one loss per pair, shape (B,): leave the mean to the training loop.")
        if isinstance(got[0], torch.Tensor) and got[0].shape == losses.shape:
            _name_dpo_slip(got[0], lp, beta)
        expect_close(got[0], losses, f"the losses with beta = {beta}", atol=1e-6)
        for what, mine, want, ratio in (("chosen", got[1], chosen_rewards, lp[0] - lp[2]),
                                        ("rejected", got[2], rejected_rewards, lp[1] - lp[3])):
            if isinstance(mine, torch.Tensor) and mine.shape == want.shape and beta != 1 and \
                    torch.allclose(mine.double(), ratio, atol=1e-6) and ratio.abs().max() > 0:
                raise ExerciseFailed(f"the {what} rewards are the log-ratios without beta.",
                                     fix="the implicit reward is beta times the log-ratio of the "
                                         "policy to the reference.")
            expect_close(mine, want, f"the {what} rewards with beta = {beta}", atol=1e-6)
    grads = [t.clone().requires_grad_(True) for t in (pc, pr)]
    student(grads[0], grads[1], rc, rr, 0.5)[0].sum().backward()
    if grads[0].grad is None or not ((grads[0].grad < 0).all() and (grads[1].grad > 0).all()):
        raise ExerciseFailed("the losses do not carry a gradient that raises log pi(chosen) and "
                             "lowers log pi(rejected).",
                             fix="compute them from the inputs with torch operations, without "
                                 "leaving autograd (no item, no detach on the losses).")
    return "That is the DPO loss, with TRL's rewards: a logistic loss on the difference of two log-ratios."


@exercise(hint="Each row of rewards is one prompt's group: score every answer against its own "
               "group's mean, in units of its own group's spread.",
          task="Write group_advantages(rewards, eps) -> a tensor shaped like rewards (prompts, "
               "answers). The check compares it with GRPO's advantages, with a group whose "
               "rewards are all equal.")
def group_advantages(student: Callable) -> str:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    if hidden_round():  # groups of very different scale drawn from the hidden seed, one all equal again
        rewards = torch.randn(3, 5, generator=seeded(65)) * torch.tensor([[100.0], [0.0], [0.01]])
        rewards[1] = 0.5
    got = student(rewards, 1e-4)
    mean = rewards.mean(dim=1, keepdim=True)
    unbiased = (rewards - mean) / (rewards.std(dim=1, keepdim=True) + 1e-4)
    biased = (rewards - mean) / (rewards.std(dim=1, keepdim=True, correction=0) + 1e-4)
    if isinstance(got, torch.Tensor) and got.shape == rewards.shape:
        if torch.allclose(got, biased, atol=1e-4):
            return "You used the population std; TRL uses the unbiased one, both work."
        if got[1].isnan().all() and not got[[0, 2]].isnan().any():
            raise ExerciseFailed("the group whose rewards are all equal gives NaN: its spread is zero, "
                                 "and you divided by it without eps.",
                                 fix="add eps to each group's standard deviation before dividing.")
        if torch.allclose(got, (rewards - rewards.mean()) / (rewards.std() + 1e-4), atol=1e-4):
            raise ExerciseFailed("you normalised over the whole batch, not within each prompt's group.",
                                 fix="take the mean and the standard deviation of each row on its "
                                     "own (along the answers' axis, keeping it).")
        if torch.allclose(got, rewards - mean, atol=1e-4):
            raise ExerciseFailed("your advantages are centred but not divided by the group's spread.",
                                 fix="divide each row by its own standard deviation plus eps.")
    expect_close(got, unbiased, "your tensor of advantages", atol=1e-4)
    return "Each answer is now scored against its own group: no value model needed."


def helper_grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor,
                     advantages: torch.Tensor, mask: torch.Tensor, epsilon: float,
                     beta: float) -> torch.Tensor:
    """helpers.post.grpo.grpo_loss per sequence, the loss alone (a 0-dim tensor)."""
    from helpers.post.grpo import grpo_loss as helper

    return helper(logps, old_logps, ref_logps, advantages, mask, epsilon=epsilon, beta=beta,
                  normalise="sequence")[0]


def _grpo_variant(lp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, a: torch.Tensor,
                  m: torch.Tensor, eps: float, beta: float, objective: str = "min", kl: str = "k3",
                  reduce: str = "sequence", sign: float = -1.0) -> torch.Tensor:
    """The GRPO loss, right by default, with one of the usual slips on request."""
    ratio = (lp - old).exp()
    clipped = ratio.clamp(1 - eps, 1 + eps)
    plain, cut = ratio * a[:, None], clipped * a[:, None]
    surrogate = {"min": lambda: torch.min(plain, cut), "max": lambda: torch.max(plain, cut),
                 "unclipped": lambda: plain, "clipped_only": lambda: cut}[objective]()
    diff = ref - lp
    penalty = {"k3": lambda: diff.exp() - diff - 1, "k1": lambda: -diff,
               "reversed": lambda: (-diff).exp() + diff - 1, "none": lambda: 0 * diff}[kl]()
    per_token = sign * surrogate + beta * penalty
    if reduce == "token":
        return (per_token * m).sum() / m.sum()
    if reduce == "unmasked":
        return per_token.mean()
    return ((per_token * m).sum(1) / m.sum(1)).mean()


# (what is wrong, how to fix it, the slip as arguments of _grpo_variant)
GRPO_SLIPS = [
    ("the ratio is not clipped: off-policy tokens move without a trust region",
     "clip the ratio to between 1 minus epsilon and 1 plus epsilon and take the smaller of the two "
     "objectives, the clipped one and the plain one.", {"objective": "unclipped"}),
    ("you take only the clipped objective, without the minimum with the unclipped one",
     "take the smaller of the plain ratio times the advantage and the clipped ratio times the "
     "advantage.", {"objective": "clipped_only"}),
    ("you take the larger of the two objectives (max, not min)",
     "the objective is pessimistic: the smaller of the plain and the clipped ones, then negated.",
     {"objective": "max"}),
    ("the sign of the objective is flipped: your loss falls when a bad answer gains",
     "the loss is minus the clipped objective, plus beta times the KL term.", {"sign": 1.0}),
    ("the KL term is the plain log-ratio, not k3",
     "use k3: the exponential of the reference's minus the policy's log-probability, minus that "
     "difference, minus 1.", {"kl": "k1"}),
    ("k3 is taken the wrong way round (the policy's minus the reference's log-probability inside "
     "the exponential)", "the difference inside k3 is the reference's log-probability minus the "
     "policy's.", {"kl": "reversed"}),
    ("the KL penalty is missing", "add beta times k3 to every token's loss.", {"kl": "none"}),
    ("you averaged over every token of the batch at once (DAPO's token mean), not per answer",
     "first average each answer's own tokens (its row of the mask says which), then average the "
     "answers.", {"reduce": "token"}),
    ("the mask is ignored: padding tokens after an answer count in its mean",
     "multiply every token's loss by the mask and divide each answer's sum by its number of "
     "tokens.", {"reduce": "unmasked"}),
]


def _grpo_case(seed: int) -> tuple[torch.Tensor, ...]:
    """Log-probabilities (4, 6) with ratios well outside 1 +- 0.2, advantages of both signs, a
    ragged mask."""
    g = seeded(seed)
    logps = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    old = logps + (torch.rand(4, 6, generator=g, dtype=torch.float64) - 0.5)
    ref = logps + (torch.rand(4, 6, generator=g, dtype=torch.float64) - 0.5) * 2
    advantages = torch.tensor([1.2, -0.7, 0.4, -1.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]],
                        dtype=torch.float64)
    return logps, old, ref, advantages, mask


@exercise(hint="Per token: the probability ratio to the sampling policy times the advantage, "
               "clipped PPO-style and taken pessimistically, negated, plus beta times the k3 "
               "estimate of the KL to the reference; then the mean over each answer's own tokens "
               "and the mean over the answers.",
          task="Write my_grpo_loss(logps, old_logps, ref_logps, advantages, mask, epsilon, beta) "
               "-> the loss, one number. The check compares it with GRPO's loss (averaged per "
               "answer) on log-probabilities whose ratios leave the clip range, for two epsilons "
               "and two betas, and checks its gradient.",
          points=3)
def grpo_loss(student: Callable) -> str:
    for seed, epsilon, beta in ((0, 0.2, 0.04), (1, 0.1, 0.5)):
        inputs = _grpo_case(seed)
        got = student(*(t.clone() for t in inputs), epsilon, beta)
        expected = helper_grpo_loss(*inputs, epsilon, beta)
        if not isinstance(got, torch.Tensor):
            raise ExerciseFailed(f"your loss is a {type(got).__name__}, expected a tensor.",
                                 fix="compute it with torch operations so that it carries a gradient.")
        if got.numel() != 1:
            raise ExerciseFailed(f"your loss has shape {tuple(got.shape)}, expected one number.",
                                 fix="average each answer's tokens, then average the answers.")
        got = got.reshape(())
        if not torch.allclose(got.double(), expected, atol=1e-9, rtol=1e-6):
            for what, fix, slip in GRPO_SLIPS:
                wrong = _grpo_variant(*inputs, epsilon, beta, **slip)
                if torch.allclose(got.double(), wrong, atol=1e-9, rtol=1e-6):
                    raise ExerciseFailed(f"{what} (epsilon = {epsilon}, beta = {beta}).", fix=fix)
            expect_close(got.double(), expected, f"the loss with epsilon = {epsilon}, beta = {beta}", atol=1e-9)
    logps, old, ref, advantages, mask = _grpo_case(2)
    mine = logps.clone().requires_grad_(True)
    theirs = logps.clone().requires_grad_(True)
    loss = student(mine, old, ref, advantages, mask, 0.2, 0.04)
    if not loss.requires_grad:
        raise ExerciseFailed("your loss carries no gradient to logps.",
                             fix="keep every step a torch operation on logps (no item, no detach).")
    loss.sum().backward()
    helper_grpo_loss(theirs, old, ref, advantages, mask, 0.2, 0.04).backward()
    expect_close(mine.grad, theirs.grad, "the gradient of your loss on logps", atol=1e-9)
    return "Clipped ratio, k3 penalty, per-answer mean: GRPO's loss, with no value model in sight."
