"""Notebook 13's checkers (helpers/lab/exercises/post_training.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
from helpers.lab.exercises import evaluate

from .judging import named


def _dpo(rule: str = "right", reduce: bool = False, detach: bool = True, rewards_beta: bool = True):
    def answer(pc, pr, rc, rr, beta):
        c, r = pc - rc, pr - rr
        losses = {"right": lambda: -F.logsigmoid(beta * (c - r)),
                  "softplus": lambda: F.softplus(-beta * (c - r)),
                  "log_sigmoid": lambda: -torch.log(torch.sigmoid(beta * (c - r))),
                  "beta_outside": lambda: -beta * F.logsigmoid(c - r),
                  "sign": lambda: F.logsigmoid(beta * (c - r)),
                  "swapped": lambda: -F.logsigmoid(beta * (r - c)),
                  "no_reference": lambda: -F.logsigmoid(beta * (pc - pr)),
                  "no_log": lambda: 1 - torch.sigmoid(beta * (c - r))}[rule]()
        scale = beta if rewards_beta else 1.0
        cr, rr_ = (scale * c, scale * r)
        if detach:
            cr, rr_ = cr.detach(), rr_.detach()
        return (losses.mean() if reduce else losses), cr, rr_
    return answer


@pytest.mark.parametrize("answer, message", [
    (_dpo(), None),
    (_dpo("softplus"), None),
    (_dpo("log_sigmoid"), None),
    (_dpo(detach=False), None),
    (_dpo("beta_outside"), "beta is applied outside the log-sigmoid"),
    (_dpo("sign"), "the sign is flipped"),
    (_dpo("swapped"), "chosen and rejected are swapped"),
    (_dpo("no_reference"), "the reference is left out"),
    (_dpo("no_log"), "the log is missing"),
    (_dpo(reduce=True), "return one loss per pair"),
    (_dpo(rewards_beta=False), "log-ratios without beta"),
    (lambda pc, pr, rc, rr, beta: -F.logsigmoid(beta * ((pc - rc) - (pr - rr))), "return three tensors"),
])
def test_dpo_loss_checker(answer, message):
    passed, said = exercises.evaluate("post_training.dpo_loss", answer)
    assert passed == (message is None), said
    assert message is None or message in said


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_dpo_solution_equals_trl_on_the_same_log_probabilities(beta):
    """The published solution against TRL's own loss code, as tests/post/test_dpo.py does for the helper."""
    pytest.importorskip("trl")
    from dpo_reference import logps, trl_dpo_loss

    pc, pr, rc, rr = (t.float() for t in logps(5, n=4))
    trl_loss = trl_dpo_loss(pc, pr, rc, rr, beta)
    torch.testing.assert_close(_dpo()(pc, pr, rc, rr, beta)[0].mean(), trl_loss)


def _lora(scaling: str = "right", zero_b: bool = True, freeze: bool = True, merged_flag: bool = True,
          merge: bool = True):
    """A LoRA layer class, right by default, with one of the usual slips on request."""
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base = base
            if freeze:
                base.requires_grad_(False)
            self.lora_A = nn.Linear(base.in_features, r, bias=False)
            self.lora_B = nn.Linear(r, base.out_features, bias=False)
            if zero_b:
                nn.init.zeros_(self.lora_B.weight)
            self.scaling = {"right": alpha / r, "alpha": float(alpha)}[scaling]
            self.merged = False

        def forward(self, x):
            if self.merged and merged_flag:
                return self.base(x)
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling

        @torch.no_grad()
        def merge(self):
            if merge:
                self.base.weight += self.scaling * self.lora_B.weight @ self.lora_A.weight
            self.merged = True
    return Layer


def _lora_with_params():
    """Right, with A and B as bare Parameters (A's (r, in) layout) instead of nn.Linear layers."""
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, base, r, alpha):
            super().__init__()
            self.base, self.scaling = base.requires_grad_(False), alpha / r
            self.lora_A = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
            self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
            self.merged = False

        def forward(self, x):
            out = self.base(x)
            return out if self.merged else out + (x @ self.lora_A.T) @ self.lora_B.T * self.scaling

        @torch.no_grad()
        def merge(self):
            self.base.weight.add_(self.scaling * self.lora_B @ self.lora_A)
            self.merged = True
    return Layer


@pytest.mark.parametrize("answer, message", [
    (_lora(), None),
    (_lora_with_params(), None),
    (_lora(scaling="alpha"), "scaling is 8.0"),
    (_lora(zero_b=False), "lora_B does not start at zero"),
    (_lora(freeze=False), "the base layer's weight still trains"),
    (_lora(merged_flag=False), "adds the update a second time"),
    (_lora(merge=False), "merge() leaves the base weight as it was"),
])
def test_lora_layer_checker(answer, message):
    from helpers.post.lora import LoRALinear

    passed, said = exercises.evaluate("post_training.lora_layer", answer)
    assert passed == (message is None), said
    assert message is None or message in said
    passed, said = exercises.evaluate("post_training.lora_layer", LoRALinear)  # the course's own class
    assert not passed and "helpers.post.lora.LoRALinear" in said


@pytest.mark.parametrize("slip, message", [
    ({}, None),
    ({"shift": False}, "the targets are not shifted"),
    ({"mask_of": "input"}, "the mask is read at the input position"),
    ({"mask_of": "none"}, "the mask is ignored"),
    ({"reduce": "sum"}, "the sum over the answer tokens, not the mean"),
    ({"reduce": "per_sequence"}, "you averaged each example first"),
])
def test_answer_only_loss_checker(slip, message):
    from helpers.lab.exercises.post_training import _sft_variant

    # the slips come from the checker's variant: watched=False lets the checker name them
    passed, said = exercises.evaluate("post_training.answer_only_loss",
                                      lambda logits, ids, mask: _sft_variant(logits, ids, mask, **slip),
                                      watched=False)
    assert passed == (message is None), said
    assert message is None or message in said


def test_answer_only_loss_refuses_cross_entropy_even_where_it_is_right():
    from helpers.post.sft import answer_only_loss

    def with_cross_entropy(logits, ids, mask):
        keep = mask[:, 1:].bool()
        return F.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep])

    passed, said = exercises.evaluate("post_training.answer_only_loss", with_cross_entropy)
    assert not passed and "F.cross_entropy" in said
    assert not exercises.passes("post_training.answer_only_loss", answer_only_loss)  # it calls it too
    from helpers.lab.exercises.post_training import _sft_variant

    passed, said = exercises.evaluate("post_training.answer_only_loss", _sft_variant)  # the checker's own
    assert not passed and "helpers.lab.exercises._post_slips._sft_variant" in said

    def by_logsumexp(logits, ids, mask):  # right, with torch only: -log p = logsumexp - the target's logit
        logits, targets, keep = logits[:, :-1], ids[:, 1:], mask[:, 1:].bool()
        return (logits.logsumexp(-1) - logits.gather(-1, targets[..., None])[..., 0])[keep].mean()

    passed, said = exercises.evaluate("post_training.answer_only_loss", by_logsumexp)
    assert passed, said

    passed, said = exercises.evaluate("post_training.answer_only_loss", lambda *a: _sft_variant(*a).detach(),
                                      watched=False)
    assert not passed and "no gradient" in said


@pytest.mark.parametrize("slip, message", [
    ({}, None),
    ({"objective": "unclipped"}, "the ratio is not clipped"),
    ({"objective": "clipped_only"}, "only the clipped objective"),
    ({"objective": "max"}, "the larger of the two objectives"),
    ({"sign": 1.0}, "the sign of the objective is flipped"),
    ({"kl": "k1"}, "the plain log-ratio, not k3"),
    ({"kl": "reversed"}, "k3 is taken the wrong way round"),
    ({"kl": "none"}, "the KL penalty is missing"),
    ({"reduce": "token"}, "DAPO's token mean"),
    ({"reduce": "unmasked"}, "the mask is ignored"),
])
def test_grpo_loss_checker(slip, message):
    from helpers.lab.exercises.post_training import _grpo_variant

    passed, said = exercises.evaluate("post_training.grpo_loss", lambda *args: _grpo_variant(*args, **slip),
                                      watched=False)  # slips from the checker's variant
    assert passed == (message is None), said
    assert message is None or message in said


def test_grpo_loss_checker_refuses_the_helper_and_wants_a_tensor_with_a_gradient():
    from helpers.lab.exercises.post_training import _grpo_variant, helper_grpo_loss

    passed, said = exercises.evaluate("post_training.grpo_loss", helper_grpo_loss)
    assert not passed and "helpers.lab.exercises.post_training.helper_grpo_loss" in said
    passed, said = exercises.evaluate("post_training.grpo_loss", _grpo_variant)
    assert not passed and "helpers.lab.exercises.post_training._grpo_variant" in said
    passed, said = exercises.evaluate("post_training.grpo_loss", lambda *a: _grpo_variant(*a).item(), watched=False)
    assert not passed and "expected a tensor" in said
    passed, said = exercises.evaluate("post_training.grpo_loss", lambda *a: _grpo_variant(*a).detach(), watched=False)
    assert not passed and "no gradient" in said


def test_advantages_without_eps_name_the_nan_of_an_equal_group():
    def without_eps(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / rewards.std(dim=1, keepdim=True)

    named("post_training.group_advantages", without_eps, "NaN", "without eps")


def test_advantages_messages_read_as_sentences():
    def off_by_one(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True) + eps) + 1

    message = named("post_training.group_advantages", off_by_one)
    assert "the advantages has" not in message and "tensor of advantages has" in message

    def population(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True, correction=0) + eps)

    passed, praise = evaluate("post_training.group_advantages", population)
    assert passed and "Correct" not in praise and "population std" in praise


def sft_loss_over_every_position(logits, ids, mask):
    logps = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    weights = mask[:, 1:].to(logps.dtype)
    return -(logps * weights).sum() / weights.numel()


def test_an_sft_loss_divided_by_every_position_is_named():
    named("post_training.answer_only_loss", sft_loss_over_every_position, "every position", "answer tokens")


def test_a_dpo_loss_without_beta_is_named():
    def without_beta(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
        chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
        return -F.logsigmoid(chosen - rejected), beta * chosen.detach(), beta * rejected.detach()

    named("post_training.dpo_loss", without_beta, "beta is missing")
