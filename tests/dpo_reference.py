"""DPO's reference pieces, shared by the tests of helpers.post.dpo (tests/post/test_dpo.py) and of
notebook 13's DPO exercise (tests/lab/exercises/test_post_training.py): random summed
log-probabilities, and TRL's own DPO loss code run on them. Not a test module."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch


def logps(seed: int, n: int = 6) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [-torch.rand(n, generator=generator, dtype=torch.float64) * 10 for _ in range(4)]


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
