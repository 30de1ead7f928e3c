"""GRPO (helpers.post.grpo): advantages, k3, the clipped loss, and one step's gradient by hand."""

from __future__ import annotations

import pytest
import torch

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
