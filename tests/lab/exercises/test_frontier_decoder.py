"""Notebook 12's checkers (helpers/lab/exercises/frontier_decoder.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import pytest
import torch

import helpers.lab.exercises as exercises
from helpers.lab.exercises.frontier_decoder import helper_moe_forward, helper_sliding_decode

from .judging import from_the_checker


def _moe(weights_rule: str = "mixtral", dim: int = -1, per_token: bool = False):
    """A MoE forward answer; `weights_rule` picks the router's convention or a slip."""
    def answer(x, logits, k, experts):
        if weights_rule == "renormalised":                      # softmax, top-k, divide: correct
            probs = logits.softmax(-1)
            kept, chosen = probs.topk(k, dim=-1)
            weights = kept / kept.sum(-1, keepdim=True)
        else:
            values, chosen = logits.topk(k, dim=-1)
            weights = {"mixtral": lambda: values.softmax(-1),
                       "qwen": lambda: logits.softmax(-1).gather(-1, chosen),
                       "unweighted": lambda: torch.ones_like(values),
                       "tokens": lambda: (lambda w: w / w.sum(-1, keepdim=True))(logits.softmax(0).gather(-1, chosen)),
                       "flipped": lambda: values.softmax(-1).flip(-1)}[weights_rule]()
        out = torch.zeros_like(x)
        if per_token:                                           # one token at a time: correct
            for t in range(x.shape[0]):
                for j in range(k):
                    out[t] += weights[t, j] * experts[int(chosen[t, j])](x[t:t + 1])[0]
            return out
        for e, expert in enumerate(experts):
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out
    return answer


def _moe_every_expert_on_every_token(x, logits, k, experts):
    values, chosen = logits.topk(k, dim=-1)
    gates = torch.zeros_like(logits).scatter(-1, chosen, values.softmax(-1))   # (T, E)
    return sum(gates[:, e, None] * expert(x) for e, expert in enumerate(experts))


def _moe_with_k(fixed_k: int):
    return from_the_checker(lambda x, logits, k, experts: helper_moe_forward(x, logits, fixed_k, experts))


@pytest.mark.parametrize("answer, message", [
    (_moe(), None),
    (_moe("renormalised"), None),
    (_moe(per_token=True), None),
    (_moe_every_expert_on_every_token, None),
    (_moe("qwen"), "softmax over all E experts, kept for the top k but not renormalised"),
    (_moe("unweighted"), "without their weights"),
    (_moe("tokens"), "runs over the tokens (dim=0)"),
    (_moe("flipped"), "went to the wrong experts"),
    (_moe_with_k(1), "is the MoE with k = 1"),
    (helper_moe_forward, "helpers.lab.exercises.frontier_decoder.helper_moe_forward"),
])
def test_moe_forward_checker(answer, message):
    passed, said = exercises.evaluate("frontier_decoder.moe_forward", answer,
                                      watched=getattr(answer, "watched", True))
    assert passed == (message is None), said
    assert message is None or message in said


def test_moe_forward_checker_notes_a_forward_that_runs_every_expert_on_every_token():
    said = exercises.evaluate("frontier_decoder.moe_forward", _moe_every_expert_on_every_token)[1]
    assert "every expert ran on more rows than chose it" in said
    assert "Mixtral's MoE layer" in exercises.evaluate("frontier_decoder.moe_forward", _moe())[1]


def test_helper_moe_forward_equals_the_helpers_experts_loop():
    from helpers.model.moe import Experts, route

    torch.manual_seed(0)
    layer, x, logits = Experts(4, 8, 16), torch.randn(10, 8), torch.randn(10, 4)
    with torch.no_grad():
        want = layer.loop(x, *route(logits, 2, "topk_softmax"))
        got = helper_moe_forward(x, logits, 2, [lambda rows, e=e: layer.one(e, rows) for e in range(4)])
    torch.testing.assert_close(got, want)


def _sliding(mistake: str = ""):
    """A sliding_decode answer through a ring of `window` slots, with one usual slip on request."""
    def answer(q, k, v, window):
        batch, heads, steps, head_dim = q.shape
        slots = {"no window": steps, "one too many": window + 1}.get(mistake, window)
        keys, values, outs = q.new_zeros(batch, heads, slots, head_dim), q.new_zeros(batch, heads, slots, head_dim), []
        scale = 1.0 if mistake == "unscaled" else head_dim ** 0.5

        def attend(t: int, filled: int) -> torch.Tensor:
            if not filled:                                     # nothing to see: a zero row
                return torch.zeros_like(q[:, :, t:t + 1])
            scores = q[:, :, t:t + 1] @ keys[:, :, :filled].transpose(-2, -1) / scale
            return torch.softmax(scores, -1) @ values[:, :, :filled]

        for t in range(steps):
            if mistake == "reads first":                       # attends before writing token t
                outs.append(attend(t, min(t, slots)))
            keys[:, :, t % slots], values[:, :, t % slots] = k[:, :, t], v[:, :, t]
            if mistake != "reads first":
                outs.append(attend(t, min(t + 1, slots)))
        return torch.cat(outs, dim=2)
    return answer


def _sliding_by_mask(q, k, v, window):                         # correct: a banded mask, no loop
    behind = torch.arange(q.shape[-2])[:, None] - torch.arange(q.shape[-2])[None, :]  # (T, T): i - j
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill((behind < 0) | (behind >= window), float("-inf")), -1) @ v


def _sliding_by_the_course_mask(q, k, v, window):              # the course's band: refused by name
    from helpers.model.sliding import banded_mask
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~banded_mask(q.shape[-2], window), float("-inf")), -1) @ v


@pytest.mark.parametrize("answer, message", [
    (_sliding(), None),
    (_sliding_by_mask, None),
    (helper_sliding_decode, "helpers.lab.exercises.frontier_decoder.helper_sliding_decode"),
    (_sliding_by_the_course_mask, "helpers.model.sliding.banded_mask"),
    (_sliding("no window"), "the window is missing"),
    (_sliding("one too many"), "window + 1 tokens, one too many"),
    (_sliding("reads first"), "but not its own"),
    (_sliding("unscaled"), "the scores are not scaled"),
    (lambda q, k, v, window: _sliding()(q, k, v, window)[:, :, -1], "join them along the token axis"),
])
def test_sliding_decode_checker(answer, message):
    passed, said = exercises.evaluate("frontier_decoder.sliding_decode", answer)
    assert passed == (message is None), said
    assert message is None or message in said


def test_sliding_decode_helper_refuses_bad_input_by_name():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="q, k, v are"):
        helper_sliding_decode(q, q[:, :, :2], q, 2)
    with pytest.raises(ValueError, match="window"):
        helper_sliding_decode(q, q, q, 0)
