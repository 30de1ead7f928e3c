"""GRPO (helpers.post.grpo): advantages, k3, the clipped loss, and one step's gradient by hand."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from shared_tools import full, post_tokenizer, tiny_gpt

from helpers.post import grpo, sft, tasks
from helpers.post.grpo import completion_logps, group_advantages, grpo_loss, k3_kl


def test_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv = group_advantages(rewards)
    torch.testing.assert_close(adv.mean(dim=1), torch.zeros(3))
    assert torch.equal(adv[1], torch.zeros(4))  # same reward everywhere: nothing to learn
    std = rewards[2].std().item()  # unbiased, as TRL
    torch.testing.assert_close(adv[2], (rewards[2] - 0.25) / (std + 1e-4))


def test_advantages_without_scaling_are_the_centred_rewards():
    """Dr. GRPO drops the division by the group's std (scale=False)."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [3.0, 1.0, 2.0, 2.0]])
    torch.testing.assert_close(group_advantages(rewards, scale=False),
                               torch.tensor([[0.75, -0.25, -0.25, -0.25], [1.0, -1.0, 0.0, 0.0]]))
    with pytest.raises(TypeError, match="scale"):
        group_advantages(rewards, scale="False")


def test_k3_is_non_negative_and_unbiased_for_kl():
    generator = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, generator=generator), 0)
    q = torch.softmax(torch.randn(5, generator=generator), 0)
    samples = torch.multinomial(p, 200_000, replacement=True, generator=generator)
    k3 = k3_kl(p.log()[samples], q.log()[samples])
    assert (k3 >= 0).all()
    exact = (p * (p.log() - q.log())).sum()
    assert abs(k3.mean() - exact) < 0.01


def test_one_step_gradient_equals_the_hand_computation():
    generator = torch.Generator().manual_seed(1)
    b, t, v = 4, 5, 7
    logits = torch.randn(b, t, v, generator=generator, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(v, (b, t), generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]).double()
    ref = torch.log_softmax(torch.randn(b, t, v, generator=generator, dtype=torch.float64), -1)
    ref_logps = ref.gather(-1, tokens[..., None]).squeeze(-1)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64))[0]
    beta = 0.1
    logp_all = logits.log_softmax(-1)
    logps = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    for normalise in ("sequence", "token", "constant"):
        loss, _ = grpo_loss(logps, logps.detach(), ref_logps, adv, mask, beta=beta, normalise=normalise)
        (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
        # By hand: on-policy the ratio is 1 (no clipping); d loss / d logp_t = w_t (-A + beta (1 - e^{ref - logp}))
        weight = {"sequence": mask / mask.sum(1, keepdim=True) / b, "token": mask / mask.sum(),
                  "constant": mask / mask.numel()}[normalise]
        g = weight * (-adv[:, None] + beta * (1 - (ref_logps - logps.detach()).exp()))
        onehot = torch.nn.functional.one_hot(tokens, v).double()
        by_hand = g[..., None] * (onehot - logp_all.detach().exp())  # d logp / d logits
        torch.testing.assert_close(grad, by_hand)


def test_clipping_stops_the_gradient_beyond_the_trust_region():
    logps = torch.tensor([[0.5, -0.5]], requires_grad=True)  # ratios e^0.5 and e^-0.5 vs old 0
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    loss, stats = grpo_loss(logps, old, logps.detach(), torch.tensor([1.0]), mask, epsilon=0.2, beta=0.0)
    loss.backward()
    # A > 0: a ratio above 1 + eps is clipped (no gradient); one below 1 - eps is not.
    assert logps.grad[0, 0] == 0 and logps.grad[0, 1] < 0
    assert stats["clipped"] == 1.0


def test_normalisation_weights_long_answers_differently():
    logps = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1]])
    adv = torch.tensor([1.0, 1.0])
    per_seq, _ = grpo_loss(logps, logps.detach(), logps.detach(), adv, mask, beta=0.0, normalise="sequence")
    (g_seq,) = torch.autograd.grad(per_seq, logps)
    per_tok, _ = grpo_loss(logps, logps.detach(), logps.detach(), adv, mask, beta=0.0, normalise="token")
    (g_tok,) = torch.autograd.grad(per_tok, logps)
    # per sequence: the short answer's one token weighs 4x each token of the long answer
    assert g_seq[0, 0] == 4 * g_seq[1, 0]
    assert g_tok[0, 0] == g_tok[1, 0]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="groups of 1"):
        group_advantages(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match="rewards has shape"):
        group_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="^rewards holds NaN or inf, expected finite rewards"):
        group_advantages(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(TypeError, match="^rewards has dtype torch.int64, expected a floating-point"):
        group_advantages(torch.tensor([[1, 0], [0, 1]]))
    with pytest.raises(TypeError, match="^rewards has a list"):
        group_advantages([[1.0, 0.0]])
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="normalise"):
        grpo_loss(x, x, x, torch.zeros(2), torch.ones(2, 3), normalise="batch")
    with pytest.raises(ValueError, match="advantages has shape"):
        grpo_loss(x, x, x, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="no tokens"):
        grpo_loss(x, x, x, torch.zeros(2), torch.tensor([[1.0, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match="ref_logps has shape"):
        k3_kl(x, torch.zeros(2, 2))
    for position in range(4):
        spoiled = [x, x, x, torch.zeros(2)]
        spoiled[position] = spoiled[position] + float("inf")
        name = ("logps", "old_logps", "ref_logps", "advantages")[position]
        with pytest.raises(ValueError, match=f"^{name} holds NaN or inf"):
            grpo_loss(*spoiled, torch.ones(2, 3))


@pytest.mark.parametrize("groups, max_new_tokens, error, match", [
    ([], 3, ValueError, "^groups is \\[\\], expected a non-empty list"),
    ([(torch.zeros(2, 3, dtype=torch.long), None, None)], 3, ValueError,
     "^groups\\[0\\]'s ids is \\(2, 3\\), expected a \\(G, N\\) tensor with N > max_new_tokens = 3"),
    ([(torch.zeros(5, dtype=torch.long), None, None)], 3, ValueError, "^groups\\[0\\]'s ids is \\(5,\\)"),
    ([(torch.zeros(2, 5, dtype=torch.long), None, None)], 0, ValueError, "^max_new_tokens is 0"),
])
def test_completion_logps_refuses_bad_groups_before_any_forward_pass(groups, max_new_tokens, error, match):
    def model(ids):
        raise AssertionError("the model ran before the arguments were checked")

    with pytest.raises(error, match=match):
        completion_logps(model, groups, max_new_tokens)


# helpers.post.grpo, exactly:
#
# The loss's pieces by hand (k3 at known values, each normalisation, both clipping edges, the
# logged KL and clipped fraction), its defaults (epsilon 0.2, beta 0.04, per sequence), rollouts
# against sample_answers and the exact checker, train_grpo against a hand loop built from the same
# public pieces with the same generator (so every argument must reach the place it is used), and
# every error message in full.

@pytest.fixture(scope="module")
def tok():
    return post_tokenizer()

_gpt = tiny_gpt


def test_advantages_by_hand_with_an_eps():
    adv = group_advantages(torch.tensor([[3.0, 1.0]]), eps=0.5)  # mean 2, unbiased std sqrt(2)
    s = math.sqrt(2) + 0.5
    assert adv[0].tolist() == pytest.approx([1 / s, -1 / s], abs=1e-7)
    default = group_advantages(torch.tensor([[3.0, 1.0]]))
    assert default[0].tolist() == pytest.approx([1 / (math.sqrt(2) + 1e-4), -1 / (math.sqrt(2) + 1e-4)],
                                                abs=1e-7)


@pytest.mark.parametrize("rewards, eps, error, message", [
    (torch.zeros(2), 1e-4, ValueError, "rewards has shape (2,), expected (P, G)"),
    (torch.zeros(2, 1), 1e-4, ValueError, "rewards has groups of 1, expected G >= 2 answers per "
                                          "prompt: a group of one has nothing to be compared with"),
    (torch.zeros(2, 2), 0.0, ValueError, "eps is 0.0, expected a finite number > 0"),
])
def test_advantages_errors_in_full(rewards, eps, error, message):
    with pytest.raises(error, match=full(message)):
        group_advantages(rewards, eps)


def test_k3_at_known_values():
    logps = torch.tensor([0.0, -1.0, -2.0])
    ref = torch.tensor([0.0, -2.0, -1.0])
    got = k3_kl(logps, ref)
    want = [0.0, math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1]
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match=full("ref_logps has shape (2,), expected (3,) like logps")):
        k3_kl(logps, torch.zeros(2))


def _inputs():
    logps = torch.tensor([[-0.5, -1.0, -2.0], [-1.5, -0.2, -0.1]])
    old = torch.tensor([[-1.0, -1.0, -1.5], [-1.0, -0.2, -0.4]])
    ref = torch.tensor([[-0.7, -0.9, -2.5], [-1.2, -0.3, -0.1]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return logps, old, ref, adv, mask


def _by_hand(logps, old, ref, adv, mask, epsilon, beta):
    ratio = (logps - old).exp()
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    per = -torch.min(ratio * adv[:, None], clipped * adv[:, None]) + beta * k3_kl(logps, ref)
    return per * mask, (ratio != clipped).float() * mask


@pytest.mark.parametrize("normalise", ["sequence", "token", "constant"])
def test_each_normalisation_by_hand(normalise):
    logps, old, ref, adv, mask = _inputs()
    per, _ = _by_hand(logps, old, ref, adv, mask, 0.3, 0.1)
    want = {"sequence": (per.sum(1) / mask.sum(1)).mean(), "token": per.sum() / 5,
            "constant": per.sum() / 6}[normalise]
    loss, _ = grpo_loss(logps, old, ref, adv, mask, epsilon=0.3, beta=0.1, normalise=normalise)
    assert (loss - want).abs() < 1e-6


def test_defaults_are_epsilon_0_2_beta_0_04_per_sequence():
    logps, old, ref, adv, mask = _inputs()
    loss, stats = grpo_loss(logps, old, ref, adv, mask)
    want, _ = grpo_loss(logps, old, ref, adv, mask, epsilon=0.2, beta=0.04, normalise="sequence")
    per, clipped = _by_hand(logps, old, ref, adv, mask, 0.2, 0.04)
    assert loss.item() == want.item() and (loss - (per.sum(1) / mask.sum(1)).mean()).abs() < 1e-6
    assert stats["clipped"] == pytest.approx(clipped.sum().item() / 5)


def test_logged_kl_and_clipped_fraction():
    logps, old, ref, adv, mask = _inputs()
    _, stats = grpo_loss(logps, old, ref, adv, mask, epsilon=0.3, beta=0.0)
    kl = k3_kl(logps, ref)
    assert stats["kl"] == pytest.approx(((kl * mask).sum() / 5).item(), abs=1e-7)
    # ratios e^0.5, 1, (masked), e^-0.5, 1, e^0.3: outside [0.7, 1.3] are e^0.5, e^-0.5 and e^0.3
    ratio = (logps - old).exp()
    outside = ((ratio < 0.7) | (ratio > 1.3)).float() * mask
    assert stats["clipped"] == pytest.approx((outside.sum() / 5).item()) == 0.6
    assert isinstance(stats["kl"], float) and isinstance(stats["clipped"], float)


def test_a_negative_advantage_clips_below():
    """A < 0: the ratio below 1 - eps is clipped (no gradient), the one above is not."""
    logps = torch.tensor([[-0.5, 0.5]], requires_grad=True)
    loss, stats = grpo_loss(logps, torch.zeros(1, 2), logps.detach(), torch.tensor([-1.0]),
                            torch.ones(1, 2), epsilon=0.2, beta=0.0)
    loss.backward()
    assert logps.grad[0, 0] == 0 and logps.grad[0, 1] > 0 and stats["clipped"] == 1.0


def test_the_kl_term_is_weighted_by_beta():
    logps, old, ref, adv, mask = _inputs()
    same = grpo_loss(logps, logps, ref, torch.zeros(2), mask, beta=0.5)[0]
    kl = k3_kl(logps, ref) * mask
    assert (same - 0.5 * (kl.sum(1) / mask.sum(1)).mean()).abs() < 1e-6
    assert grpo_loss(logps, logps, ref, torch.zeros(2), mask, beta=0.0)[0].abs() < 1e-7


@pytest.mark.parametrize("kwargs, message", [
    (dict(normalise="batch"), "normalise is 'batch', expected one of 'sequence', 'token', 'constant'"),
    (dict(epsilon=0.0), "epsilon is 0.0, expected a number in (0, 1)"),
    (dict(epsilon=1.0), "epsilon is 1.0, expected a number in (0, 1)"),
    (dict(beta=-0.1), "beta is -0.1, expected a number >= 0"),
    (dict(beta=math.inf), "beta is inf, expected a number >= 0"),
    (dict(old_logps=torch.zeros(2, 2)), "old_logps has shape (2, 2), expected (2, 3)"),
    (dict(ref_logps=torch.zeros(3, 3)), "ref_logps has shape (3, 3), expected (2, 3)"),
    (dict(mask=torch.ones(2)), "mask has shape (2,), expected (2, 3)"),
    (dict(advantages=torch.zeros(2, 1)), "advantages has shape (2, 1), expected (2,), one per answer"),
    (dict(mask=torch.tensor([[0, 0, 0], [1, 1, 1]])),
     "mask has an answer with no tokens, expected at least one per answer"),
])
def test_loss_errors_in_full(kwargs, message):
    x = torch.zeros(2, 3)
    args = dict(logps=x, old_logps=x, ref_logps=x, advantages=torch.zeros(2), mask=torch.ones(2, 3)) | kwargs
    with pytest.raises(ValueError, match=full(message)):
        grpo_loss(**args)


def test_beta_zero_and_an_epsilon_near_one_are_accepted():
    x = torch.zeros(1, 2)
    loss, _ = grpo_loss(x, x, x, torch.ones(1), torch.ones(1, 2), epsilon=0.999, beta=0.0)
    assert loss.item() == -1.0


def test_rollout_is_sample_answers_checked_exactly(tok):
    model = _gpt(tok)
    fact = tasks.Fact(1, "plus", 1)
    ids, mask, rewards = grpo.rollout(model, tok, fact, 3, 4, 0.9, torch.Generator().manual_seed(1))
    prompt = torch.tensor(tok.encode(sft.chat_prompt(fact.question())))
    end = tok.special_tokens[sft.END]
    want_ids, want_mask = sft.sample_answers(model, prompt, 3, 4, end, 0.9, torch.Generator().manual_seed(1))
    assert torch.equal(ids, want_ids) and torch.equal(mask, want_mask)
    texts = [sft.answer_text(tok, row, end) for row in ids[:, len(prompt):].tolist()]
    assert rewards.tolist() == [float(tasks.is_correct(t, fact)) for t in texts]
    assert rewards.dtype == torch.float32


def test_rollout_rewards_a_right_answer_with_one(tok, monkeypatch):
    fact = tasks.Fact(1, "plus", 1)
    end = tok.special_tokens[sft.END]
    right, wrong = tok.encode("two") + [end], tok.encode("three")[:3] + [end]

    def fake(model, prompt, n, max_new_tokens, end_id, temperature, generator):
        assert end_id == end and n == 2
        ids = torch.tensor([prompt.tolist() + right, prompt.tolist() + wrong])
        return ids, torch.ones_like(ids)
    monkeypatch.setattr(grpo, "sample_answers", fake)
    assert grpo.rollout(None, tok, fact, 2, 4, 1.0, None)[2].tolist() == [1.0, 0.0]


def _hand_grpo(policy, reference, tok, facts, steps, prompts_per_step, group_size, lr, iterations,
               epsilon, beta, normalise, temperature, max_new_tokens, seed, scale_rewards=True):
    """train_grpo written out from its docstring with the module's own pieces: one loss over the
    whole batch of P * G answers, padded to nothing (every completion is max_new_tokens long)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=0.0)
    history = {"reward": [], "kl": [], "clipped": []}

    def logps_of(model, groups):
        rows = []
        for ids, _, _ in groups:
            prompt_len = ids.shape[1] - max_new_tokens
            rows.append(sft.token_logps(model(ids), ids)[:, prompt_len - 1:])
        return torch.cat(rows)

    for _ in range(steps):
        chosen = torch.randint(len(facts), (prompts_per_step,), generator=generator).tolist()
        policy.eval()
        groups = [grpo.rollout(policy, tok, facts[i], group_size, max_new_tokens, temperature, generator)
                  for i in chosen]
        rewards = torch.stack([g[2] for g in groups])
        advantages = group_advantages(rewards, scale=scale_rewards).reshape(-1)
        mask = torch.cat([m[:, m.shape[1] - max_new_tokens:] for _, m, _ in groups])
        with torch.no_grad():
            olds, refs = logps_of(policy, groups), logps_of(reference, groups)
        policy.train()
        for _ in range(iterations):
            loss, s = grpo_loss(logps_of(policy, groups), olds, refs, advantages, mask, epsilon, beta,
                                normalise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        history["reward"].append(rewards.mean().item())
        history["kl"].append(s["kl"])
        history["clipped"].append(s["clipped"])
    return history


def test_train_grpo_equals_the_hand_loop(tok):
    facts = tasks.all_facts(2)
    reference = _gpt(tok, 0)
    policy = _gpt(tok, 1)
    policy.embed.position.weight.requires_grad_(False)
    hand = copy.deepcopy(policy)
    args = dict(steps=2, prompts_per_step=2, group_size=3, lr=5e-2, iterations=2, epsilon=0.1,
                beta=0.3, normalise="token", temperature=1.5, max_new_tokens=3, seed=4)
    got = grpo.train_grpo(policy, reference, tok, facts, **args)
    want = _hand_grpo(hand, reference, tok, facts, **args)
    for key in ("reward", "kl", "clipped"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key
    for p, q in zip(policy.parameters(), hand.parameters(), strict=True):
        assert (p - q).abs().max() < 1e-6
    assert got["kl"][-1] > 0 and got["clipped"][-1] > 0  # the ratio moved in the second iteration
    assert not policy.training and not reference.training


@pytest.mark.parametrize("normalise, scale_rewards", [("constant", False), ("sequence", True)])
def test_train_grpo_equals_the_hand_loop_for_dr_grpo_and_grpo(tok, normalise, scale_rewards):
    facts = tasks.all_facts(2)
    reference, policy = _gpt(tok, 0), _gpt(tok, 1)
    hand = copy.deepcopy(policy)
    args = dict(steps=2, prompts_per_step=3, group_size=3, lr=5e-2, iterations=2, epsilon=0.1,
                beta=0.3, normalise=normalise, temperature=1.5, max_new_tokens=4, seed=2,
                scale_rewards=scale_rewards)
    got = grpo.train_grpo(policy, reference, tok, facts, **args)
    want = _hand_grpo(hand, reference, tok, facts, **args)
    for key in ("reward", "kl", "clipped"):
        assert got[key] == pytest.approx(want[key], abs=1e-6), key
    for p, q in zip(policy.parameters(), hand.parameters(), strict=True):
        assert (p - q).abs().max() < 1e-6


def test_token_normalisation_spans_the_whole_batch_not_each_group(tok, monkeypatch):
    """DAPO's token mean is over all answers of the step: with one group of long answers and one
    of short ones, the long group's tokens weigh more than in a mean of the two groups' means."""
    seen = {}

    def spy(logps, old, ref, advantages, mask, epsilon, beta, normalise):
        seen.update(shape=tuple(logps.shape), advantages=advantages.shape, normalise=normalise)
        return grpo_loss(logps, old, ref, advantages, mask, epsilon, beta, normalise)
    monkeypatch.setattr(grpo, "grpo_loss", spy)
    grpo.train_grpo(_gpt(tok, 1), _gpt(tok, 0), tok, tasks.all_facts(2), steps=1, prompts_per_step=3,
                    group_size=4, iterations=1, normalise="token", max_new_tokens=5)
    assert seen == dict(shape=(12, 5), advantages=(12,), normalise="token")  # one call, P * G rows


def test_train_grpo_scale_rewards_reaches_the_advantages(tok, monkeypatch):
    seen = []
    real = grpo.group_advantages

    def spy(rewards, eps=1e-4, scale=True):
        seen.append(scale)
        return real(rewards, eps, scale)
    monkeypatch.setattr(grpo, "group_advantages", spy)
    for scale in (False, True):
        grpo.train_grpo(_gpt(tok, 1), _gpt(tok, 0), tok, tasks.all_facts(2), steps=1,
                        prompts_per_step=1, group_size=2, max_new_tokens=2, scale_rewards=scale)
    assert seen == [False, True]


def test_train_grpo_defaults(tok, monkeypatch):
    seen = {}

    def spy(policy, tokenizer, fact, group_size, max_new_tokens, temperature, generator):
        seen.update(group_size=group_size, max_new_tokens=max_new_tokens, temperature=temperature)
        raise RuntimeError("stop")
    monkeypatch.setattr(grpo, "rollout", spy)
    with pytest.raises(RuntimeError, match="stop"):
        grpo.train_grpo(_gpt(tok), _gpt(tok), tok, tasks.all_facts(2), steps=1)
    assert seen == dict(group_size=8, max_new_tokens=9, temperature=1.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=0), "steps is 0, expected a positive int"),
    (dict(prompts_per_step=0), "prompts_per_step is 0, expected a positive int"),
    (dict(iterations=0), "iterations is 0, expected a positive int"),
    (dict(lr=0.0), "lr is 0.0, expected a finite number > 0"),
    (dict(group_size=1), "group_size is 1, expected >= 2: a group of one has no baseline to compare with"),
    (dict(facts=[]), "facts is empty, expected prompts to train on"),
    (dict(group_size=0), "group_size is 0, expected a positive int"),
    (dict(normalise="batch"), "normalise is 'batch', expected one of 'sequence', 'token', 'constant'"),
    (dict(epsilon=1.0), "epsilon is 1.0, expected a number in (0, 1)"),
    (dict(beta=-1.0), "beta is -1.0, expected a number >= 0"),
    (dict(temperature=-1.0), "temperature is -1.0, expected a number >= 0 (0 = greedy)"),
    (dict(max_new_tokens=0), "max_new_tokens is 0, expected a positive int"),
    (dict(beta=math.inf), "beta is inf, expected a number >= 0"),
    (dict(temperature=math.inf), "temperature is inf, expected a number >= 0 (0 = greedy)"),
])
def test_train_grpo_errors_in_full(tok, kwargs, message):
    """Refused before any rollout: the policy is never called."""
    model = _gpt(tok)
    model.forward = lambda *a, **k: pytest.fail("the model ran before the arguments were checked")
    args = dict(facts=tasks.all_facts(2), steps=1) | kwargs
    with pytest.raises(ValueError, match=full(message)):
        grpo.train_grpo(model, model, tok, **args)


def test_train_grpo_group_size_must_be_an_int(tok):
    with pytest.raises(TypeError, match=full("group_size is 2.5 (a float), expected a positive int")):
        grpo.train_grpo(_gpt(tok), _gpt(tok), tok, tasks.all_facts(2), steps=1, group_size=2.5)


def test_train_grpo_defaults_equal_the_documented_values(tok):
    """prompts_per_step 4, group_size 8, lr 1e-3, iterations 2, epsilon 0.2, beta 0.04, per
    sequence, temperature 1, 9 new tokens, seed 0."""
    facts = tasks.all_facts(2)
    reference, policy = _gpt(tok, 0), _gpt(tok, 1)
    hand = copy.deepcopy(policy)
    got = grpo.train_grpo(policy, reference, tok, facts, steps=1)
    want = _hand_grpo(hand, reference, tok, facts, steps=1, prompts_per_step=4, group_size=8, lr=1e-3,
                      iterations=2, epsilon=0.2, beta=0.04, normalise="sequence", temperature=1.0,
                      max_new_tokens=9, seed=0)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=1e-6), key
    for p, q in zip(policy.parameters(), hand.parameters(), strict=True):
        assert (p - q).abs().max() < 1e-6


def test_train_grpo_accepts_groups_of_two_and_greedy_sampling(tok):
    history = grpo.train_grpo(_gpt(tok, 1), _gpt(tok, 0), tok, tasks.all_facts(2), steps=1,
                              prompts_per_step=1, group_size=2, temperature=0, max_new_tokens=2)
    assert len(history["reward"]) == 1
