"""The DPO loss (helpers.post.dpo): against its formula, a second formulation, and TRL's own code."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from helpers.post.dpo import check_pair, dpo_loss


def logps(seed: int, n: int = 6) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [-torch.rand(n, generator=generator, dtype=torch.float64) * 10 for _ in range(4)]


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


def trl_stub(beta: float):
    """The attributes TRL's DPOTrainer._compute_loss reads, for the standard sigmoid loss."""
    identity = SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda t: t,
                               gather=lambda t: t)
    return SimpleNamespace(model=SimpleNamespace(training=True), accelerator=identity,
                           aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
                           f_divergence_type="reverse_kl", loss_types=["sigmoid"],
                           loss_weights=[1.0], beta=beta, use_weighting=False,
                           label_smoothing=0.0, _metrics=defaultdict(lambda: defaultdict(list)),
                           _total_train_tokens=0, _tp_size=1)


def trl_dpo_loss(pc: torch.Tensor, pr: torch.Tensor, rc: torch.Tensor, rr: torch.Tensor,
                 beta: float) -> torch.Tensor:
    """TRL's mean DPO loss on four (B,) summed log-probabilities (B = 4)."""
    from trl import DPOTrainer

    # TRL sums per-token log-probs itself: hand it one token per answer holding the whole sum.
    per_token = torch.cat([pc, pr])[:, None]  # (2B, 1): chosen rows, then rejected rows
    outputs = SimpleNamespace(log_probs=per_token, entropy=torch.zeros_like(per_token),
                              mean_logits=torch.zeros_like(per_token),
                              is_top1=torch.zeros_like(per_token, dtype=torch.bool))
    inputs = {"input_ids": torch.zeros(8, 2, dtype=torch.long),
              "attention_mask": torch.ones(8, 2, dtype=torch.long),
              "completion_mask": torch.tensor([[0, 1]] * 8), "ref_chosen_logps": rc,
              "ref_rejected_logps": rr}
    return DPOTrainer._compute_loss(trl_stub(beta), lambda **kw: outputs, inputs, False)


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
