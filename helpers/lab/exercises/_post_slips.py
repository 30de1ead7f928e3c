"""The slips the checkers of notebook 13 name: the answer-only loss and the DPO loss written
with one usual mistake each, and the test that names the mistake a student's DPO losses match.
Kept apart from the checkers so each reads in one sitting."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.lab.exercises import ExerciseFailed


def _sft_variant(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, shift: bool = True,
                 mask_of: str = "target", reduce: str = "mean") -> torch.Tensor:
    """The answer-only loss, right by default, with one of the usual slips on request."""
    if shift:
        logps = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        weights = {"target": mask[:, 1:], "input": mask[:, :-1], "none": torch.ones_like(mask[:, 1:])}[mask_of]
    else:
        logps = logits.log_softmax(-1).gather(-1, ids[..., None])[..., 0]
        weights = mask
    weights = weights.to(logps.dtype)
    if reduce == "sum":
        return -(logps * weights).sum()
    if reduce == "per_sequence":
        return (-(logps * weights).sum(1) / weights.sum(1)).mean()
    if reduce == "every_position":
        return -(logps * weights).sum() / weights.numel()
    return -(logps * weights).sum() / weights.sum()


# (what is wrong, how to fix it, the slip as arguments of _sft_variant)
SFT_SLIPS = [
    ("the targets are not shifted: position t predicts token t + 1, not token t",
     "score the logits of every position but the last against the tokens from the second on.",
     {"shift": False}),
    ("the mask is read at the input position, not at the target's",
     "a position counts when the token it predicts (one to the right) is an answer token: take the "
     "mask from the second position on.", {"mask_of": "input"}),
    ("the mask is ignored: the prompt's tokens count in your loss",
     "weight each position's loss by the mask of its target token and divide by the mask's sum.",
     {"mask_of": "none"}),
    ("your loss is the sum over the answer tokens, not the mean",
     "divide the masked sum by the number of answer tokens in the batch.", {"reduce": "sum"}),
    ("you averaged each example first, then the examples: every answer token of the batch "
     "should weigh the same", "divide the masked sum over the whole batch by the mask's sum over "
     "the whole batch.", {"reduce": "per_sequence"}),
    ("you divided the masked sum by every position of the batch, not by the answer tokens: the "
     "prompt's positions still count in the mean, so the loss is too small",
     "divide by the number of positions whose target is an answer token (the mask's sum), not by "
     "the number of all positions.", {"reduce": "every_position"}),
]


# The usual slips, as (what is wrong, how to fix it, the losses it gives as a function of the
# chosen log-ratio, the rejected log-ratio, beta and the four log-probabilities).
DPO_SLIPS = [
    ("beta is missing: the difference of the log-ratios goes into the log-sigmoid unscaled",
     "multiply the difference of the two log-ratios by beta before taking the log-sigmoid.",
     lambda c, r, b, lp: -F.logsigmoid(c - r)),
    ("beta is applied outside the log-sigmoid (beta times the loss of the plain margin)",
     "beta belongs inside, scaling the difference of the log-ratios before the sigmoid.",
     lambda c, r, b, lp: -b * F.logsigmoid(c - r)),
    ("the sign is flipped: your loss grows as the chosen answer gains",
     "the loss is minus the log-sigmoid of the scaled margin, so that it shrinks as the chosen answer gains.",
     lambda c, r, b, lp: F.logsigmoid(b * (c - r))),
    ("chosen and rejected are swapped (or policy and reference)",
     "the chosen answer's log-ratio comes first, and each log-ratio is the policy's log-probability "
     "minus the reference's.",
     lambda c, r, b, lp: -F.logsigmoid(b * (r - c))),
    ("the reference is left out",
     "measure each answer's log-probability against the reference's: the policy's minus the reference's.",
     lambda c, r, b, lp: -F.logsigmoid(b * (lp[0] - lp[1]))),
    ("the log is missing: your loss is one minus the sigmoid",
     "take minus the log of the sigmoid of the scaled margin (the log-sigmoid does it stably).",
     lambda c, r, b, lp: 1 - torch.sigmoid(b * (c - r))),
    ("the loss is the sigmoid without its log",
     "take minus the log of the sigmoid of the scaled margin (the log-sigmoid does it stably).",
     lambda c, r, b, lp: -torch.sigmoid(b * (c - r))),
]


def _name_dpo_slip(losses: torch.Tensor, lp: tuple, beta: float) -> None:
    """Fail naming the slip that `losses` (B,) match, if they are wrong and match one."""
    chosen, rejected = lp[0] - lp[2], lp[1] - lp[3]
    if torch.allclose(losses.double(), -F.logsigmoid(beta * (chosen - rejected)), atol=1e-6):
        return
    for what, fix, wrong in DPO_SLIPS:
        if torch.allclose(losses.double(), wrong(chosen, rejected, beta, lp), atol=1e-6):
            raise ExerciseFailed(f"{what} (beta = {beta}).", fix=fix)
