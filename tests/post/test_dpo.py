"""The DPO loss (helpers.post.dpo): against its formula, a second formulation, and TRL's own code."""

from __future__ import annotations

import copy
import math
import random
import re

import pytest
import torch
import torch.nn.functional as F
from dpo_reference import logps, trl_dpo_loss
from shared_tools import full, post_tokenizer, tiny_gpt

from helpers.post import dpo, sft, tasks
from helpers.post.dpo import check_pair, dpo_loss


def test_loss_is_the_formula_and_the_bradley_terry_likelihood():
    pc, pr, rc, rr = logps(0)
    beta = 0.3
    losses, chosen_rewards, rejected_rewards = dpo_loss(pc, pr, rc, rr, beta)
    for i in range(len(pc)):
        z = beta * ((pc[i] - rc[i]) - (pr[i] - rr[i])).item()
        assert math.isclose(losses[i].item(), math.log1p(math.exp(-z)), rel_tol=1e-12)
        # Bradley-Terry: P(chosen > rejected) = e^{r_c} / (e^{r_c} + e^{r_r}); loss = -log P
        p = math.exp(chosen_rewards[i]) / (math.exp(chosen_rewards[i]) + math.exp(rejected_rewards[i]))
        assert math.isclose(losses[i].item(), -math.log(p), rel_tol=1e-9)


def test_gradient_pushes_chosen_up_and_rejected_down():
    pc, pr, rc, rr = logps(1)
    pc.requires_grad_(True)
    pr.requires_grad_(True)
    dpo_loss(pc, pr, rc, rr, 0.5)[0].sum().backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()
    torch.testing.assert_close(pc.grad, -pr.grad)


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_equals_trl_dpo_loss_on_the_same_log_probabilities(beta):
    pytest.importorskip("trl")
    pc, pr, rc, rr = (t.float() for t in logps(2, n=4))
    trl_loss = trl_dpo_loss(pc, pr, rc, rr, beta)
    ours = dpo_loss(pc, pr, rc, rr, beta)[0].mean()
    torch.testing.assert_close(ours, trl_loss)


def test_bad_input_is_refused():
    pc, pr, rc, rr = logps(3)
    for beta in (0.0, -0.1):
        with pytest.raises(ValueError, match="beta"):
            dpo_loss(pc, pr, rc, rr, beta)
    with pytest.raises(ValueError, match="ref_chosen_logps has shape"):
        dpo_loss(pc, pr, rc[:2], rr, 0.1)
    with pytest.raises(ValueError, match="chosen and rejected are both"):
        check_pair("seven", "seven ")
    with pytest.raises(ValueError, match="rejected is ''"):
        check_pair("seven", "")


# helpers.post.dpo, exactly:
#
# answer_kl against PyTorch's own KL divergence (F.kl_div with log targets) and its mask weighting,
# train_dpo against a hand loop with torch.optim.AdamW step for step (frozen parameters untouched,
# the history's first step exact: policy == reference gives loss log 2, accuracy 0, margin 0), the
# preference batch read back as text, and every error message in full.

@pytest.fixture(scope="module")
def tok():
    return post_tokenizer()

_gpt = tiny_gpt


@pytest.mark.parametrize("chosen, rejected, message", [
    ("", "two", "chosen is '', expected a non-empty answer"),
    ("two", "  ", "rejected is '  ', expected a non-empty answer"),
    (None, "two", "chosen is None, expected a non-empty answer"),
    ("two", 2, "rejected is 2, expected a non-empty answer"),
    (" two", "two ", "chosen and rejected are both ' two', expected two different answers: a pair "
                     "of equal answers says nothing to prefer"),
])
def test_check_pair_in_full(chosen, rejected, message):
    with pytest.raises(ValueError, match=full(message)):
        dpo.check_pair(chosen, rejected)


def test_check_pair_accepts_different_answers():
    assert dpo.check_pair("two", "three") is None


def test_preference_batch_reads_back_as_right_and_near_miss_answers(tok):
    facts = tasks.all_facts(3)[:5]
    pad = tok.special_tokens[sft.PAD]
    c_ids, c_mask, r_ids, r_mask = dpo.preference_batch(tok, facts, pad, seed=7)
    rng = random.Random(7)
    misses = [tasks.NUMBER_WORDS[tasks.wrong_result(f, rng)] for f in facts]
    for row, fact in enumerate(facts):
        chosen = tok.decode(c_ids[row][c_mask[row].bool()].tolist())
        rejected = tok.decode(r_ids[row][r_mask[row].bool()].tolist())
        assert chosen == fact.answer() + sft.END and rejected == misses[row] + sft.END
        prompt = tok.decode(c_ids[row][:len(tok.encode(sft.chat_prompt(fact.question())))].tolist())
        assert prompt == sft.chat_prompt(fact.question())
    longest = max(len(sft.encode_example(tok, f.question(), f.answer())[0]) for f in facts)
    assert c_ids.shape == (5, longest)
    assert r_ids.shape[0] == 5 and c_mask.shape == c_ids.shape and r_mask.shape == r_ids.shape


def test_preference_batch_pads_with_pad_id(tok):
    facts = [tasks.Fact(1, "plus", 1), tasks.Fact(2, "plus", 2)]  # "two" and "four": lengths differ
    c_ids, c_mask, *_ = dpo.preference_batch(tok, facts, 5, seed=0)
    assert c_ids[0, -1] == 5 and c_mask[0, -1] == 0 and c_mask[1, -1] == 1


def test_preference_batch_refuses_no_facts(tok):
    with pytest.raises(ValueError, match=full("facts is empty, expected facts to make preference "
                                              "pairs from")):
        dpo.preference_batch(tok, [], 0, 0)


def test_rewards_are_beta_times_the_detached_log_ratios():
    pc = torch.tensor([-1.0, -2.0], requires_grad=True)
    pr = torch.tensor([-3.0, -1.0], requires_grad=True)
    rc, rr = torch.tensor([-1.5, -2.0]), torch.tensor([-2.0, -2.0])
    losses, chosen, rejected = dpo.dpo_loss(pc, pr, rc, rr, 0.5)
    assert chosen.tolist() == [0.25, 0.0] and rejected.tolist() == [-0.5, 0.5]
    assert not chosen.requires_grad and not rejected.requires_grad and losses.requires_grad
    z = torch.tensor([0.75, -0.5])
    assert (losses - F.softplus(-z)).abs().max() < 1e-7


@pytest.mark.parametrize("which", ["policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps"])
def test_each_shape_is_checked_by_name(which):
    args = {n: torch.zeros(3) for n in ("policy_chosen_logps", "policy_rejected_logps",
                                        "ref_chosen_logps", "ref_rejected_logps")}
    args[which] = torch.zeros(2)
    with pytest.raises(ValueError, match=full(f"{which} has shape (2,), expected (3,) like "
                                              "policy_chosen_logps")):
        dpo.dpo_loss(*args.values(), beta=0.1)


@pytest.mark.parametrize("which", ["policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps",
                                   "ref_rejected_logps"])
@pytest.mark.parametrize("spoil, error, message", [
    (lambda t: t.tolist(), TypeError, "{} is a list, expected a floating-point tensor (B,) of summed "
                                      "log-probabilities"),
    (lambda t: t.long(), TypeError, "{} is torch.int64 (3,), expected a floating-point tensor (B,)"),
    (lambda t: t[None], TypeError, "{} is torch.float32 (1, 3), expected a floating-point tensor (B,)"),
    (lambda t: t + float("nan"), ValueError, "{} holds NaN or inf, expected finite log-probabilities"),
])
def test_each_log_probability_must_be_a_finite_float_vector(which, spoil, error, message):
    args = {n: torch.zeros(3) for n in ("policy_chosen_logps", "policy_rejected_logps",
                                        "ref_chosen_logps", "ref_rejected_logps")}
    args[which] = spoil(args[which])
    with pytest.raises(error, match="^" + re.escape(message.format(which))):
        dpo.dpo_loss(*args.values(), beta=0.1)


def test_beta_message_in_full():
    z = torch.zeros(2)
    with pytest.raises(ValueError, match=full("beta is 0, expected a finite number > 0: beta scales "
                                              "the log-ratios; beta <= 0 would reward moving away "
                                              "from the preference or ignore it")):
        dpo.dpo_loss(z, z, z, z, 0)


def test_answer_kl_equals_torch_kl_div_over_the_answer_tokens(tok):
    policy, reference = _gpt(tok, 0), _gpt(tok, 1)
    ids, mask = sft.pad_batch([sft.encode_example(tok, "what is one plus one?", "two"),
                               sft.encode_example(tok, "what is two plus one?", "three")],
                              tok.special_tokens[sft.PAD])
    with torch.no_grad():
        logp = policy(ids)[:, :-1].log_softmax(-1)
        logq = reference(ids)[:, :-1].log_softmax(-1)
    per_token = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)  # KL(p || q)
    weight = mask[:, 1:].float()
    want = ((per_token * weight).sum() / weight.sum()).item()
    got = dpo.answer_kl(policy, reference, ids, mask)
    assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-5)
    assert got > 0 and dpo.answer_kl(policy, policy, ids, mask) == pytest.approx(0.0, abs=1e-6)
    only_first = mask.clone()
    only_first[1] = 0
    first = ((per_token[0] * weight[0]).sum() / weight[0].sum()).item()
    assert math.isclose(dpo.answer_kl(policy, reference, ids, only_first), first, rel_tol=1e-5)


def _batch(tok):
    return dpo.preference_batch(tok, tasks.all_facts(2)[:3], tok.special_tokens[sft.PAD], seed=0)


def test_train_dpo_equals_a_hand_loop_with_adamw(tok):
    reference = _gpt(tok, 0)
    policy = copy.deepcopy(reference)
    policy.embed.position.weight.requires_grad_(False)          # a frozen tensor stays as it is
    frozen = policy.embed.position.weight.detach().clone()
    hand = copy.deepcopy(policy)
    batch = _batch(tok)
    history = dpo.train_dpo(policy, reference, batch, beta=0.2, steps=2, lr=1e-2)

    c_ids, c_mask, r_ids, r_mask = batch
    with torch.no_grad():
        ref_c, ref_r = sft.sequence_logps(reference, c_ids, c_mask), sft.sequence_logps(reference, r_ids, r_mask)
    optimizer = torch.optim.AdamW([p for p in hand.parameters() if p.requires_grad], lr=1e-2,
                                  weight_decay=0.0)
    hand.train()
    losses, margins, accuracies = [], [], []
    for _ in range(2):
        loss, chosen, rejected = dpo.dpo_loss(sft.sequence_logps(hand, c_ids, c_mask),
                                              sft.sequence_logps(hand, r_ids, r_mask), ref_c, ref_r, 0.2)
        optimizer.zero_grad()
        loss.mean().backward()
        optimizer.step()
        losses.append(loss.mean().item())
        margins.append((chosen - rejected).mean().item())
        accuracies.append((chosen > rejected).float().mean().item())
    for (name, p), q in zip(policy.named_parameters(), hand.parameters(), strict=True):
        assert (p - q).abs().max() < 1e-6, name
    assert torch.equal(policy.embed.position.weight, frozen)
    assert history["loss"] == pytest.approx(losses, abs=1e-6)
    assert history["margin"] == pytest.approx(margins, abs=1e-6)
    assert history["accuracy"] == accuracies
    assert history["loss"][0] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference
    assert history["accuracy"][0] == 0.0 and history["margin"][0] == 0.0
    assert history["loss"][-1] < history["loss"][0]
    assert history["accuracy"][-1] > 0 and history["margin"][-1] > 0
    assert set(history) == {"loss", "accuracy", "margin"} and len(history["margin"]) == 2
    assert not policy.training and not reference.training


def test_train_dpo_leaves_the_reference_alone(tok):
    reference = _gpt(tok, 0).train()
    before = [p.detach().clone() for p in reference.parameters()]
    dpo.train_dpo(copy.deepcopy(reference), reference, _batch(tok), beta=0.1, steps=1, lr=1e-2)
    assert all(torch.equal(a, b) for a, b in zip(before, reference.parameters(), strict=True))
    assert not reference.training


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(beta=-1.0), ValueError, "beta is -1.0, expected a finite number > 0"),
    (dict(steps=0), ValueError, "steps is 0, expected a positive int"),
    (dict(lr=0.0), ValueError, "lr is 0.0, expected a finite number > 0"),
])
def test_train_dpo_errors_in_full(tok, kwargs, error, message):
    model = _gpt(tok)
    args = dict(beta=0.1, steps=1, lr=1e-3) | kwargs
    with pytest.raises(error, match=full(message)):
        dpo.train_dpo(model, model, _batch(tok), **args)


@pytest.mark.parametrize("ids, mask, message", [
    (torch.zeros(2, 5, dtype=torch.long), torch.tensor([[1, 0, 0, 0, 0]] * 2),
     "mask has no answer tokens after position 0, expected some to average the KL over (else the "
     "mean is 0 / 0)"),
    (torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 4), "mask has shape (2, 4), expected (2, 5) like ids"),
    (torch.zeros(5, dtype=torch.long), torch.ones(5), "ids has shape (5,), expected (B, N) with N >= 2"),
])
def test_answer_kl_refuses_before_running_the_models(ids, mask, message):
    model = torch.nn.Module()
    model.forward = lambda *a: pytest.fail("a model ran before the checks")
    with pytest.raises(ValueError, match=full(message)):
        dpo.answer_kl(model, model, ids, mask)


def test_answer_kl_with_a_single_answer_token_at_position_1(tok):
    policy, reference = _gpt(tok, 0), _gpt(tok, 1)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        logp = policy(ids)[0, 0].log_softmax(-1)
        logq = reference(ids)[0, 0].log_softmax(-1)
    want = (logp.exp() * (logp - logq)).sum().item()
    assert dpo.answer_kl(policy, reference, ids, torch.tensor([[0, 1, 0]])) == pytest.approx(want, rel=1e-5)
