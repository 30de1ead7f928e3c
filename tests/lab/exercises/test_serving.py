"""Notebook 14's checkers (helpers/lab/exercises/serving.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import pytest
import torch

import helpers.lab.exercises as exercises
from helpers.lab.exercises import evaluate
from helpers.serve.speculative import verify_round

from .judging import from_the_checker, named


def _round(accept: str = "right", fix: str = "residual", bonus: str = "right", stop: bool = True):
    """A round answer, right by default, with one of the usual slips on request."""
    def answer(p, q, drafted, generator=None):
        out = []
        for i, x in enumerate(drafted):
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            a = {"right": min(1.0, float(p[i, x] / q[i, x])), "ratio": float(p[i, x] / q[i, x]),
                 "inverted": min(1.0, float(q[i, x] / p[i, x])) if p[i, x] > 0 else 1.0,
                 "p_only": float(p[i, x]), "reversed": 0.0}[accept]
            if (u < a) if accept != "reversed" else (u >= min(1.0, float(p[i, x] / q[i, x]))):
                out.append(x)
                continue
            left = {"residual": (p[i] - q[i]).clamp(min=0), "unclamped": p[i] - q[i], "p": p[i]}[fix]
            out.append(int(torch.multinomial(left / left.sum(), 1, generator=generator)))
            if stop:
                return out
        if bonus == "none":
            return out
        row = {"right": len(drafted), "previous": len(drafted) - 1}[bonus]
        return out + [int(torch.multinomial(p[row], 1, generator=generator))]
    return answer


def _round_with_global_rng(p, q, drafted, generator=None):
    """Right, drawing from torch's global generator and sampling with a cumulative sum."""
    for i, x in enumerate(drafted):
        if torch.rand(()) >= p[i, x] / q[i, x]:
            left = (p[i] - q[i]).clamp(min=0)
            cdf = (left / left.sum()).cumsum(0)
            return list(drafted[:i]) + [int(torch.searchsorted(cdf, torch.rand((), dtype=cdf.dtype)))]
    return list(drafted) + [int(torch.multinomial(p[-1], 1))]


@pytest.mark.parametrize("answer, message", [
    (_round(), None),
    (_round("ratio"), None),
    (_round_with_global_rng, None),
    (lambda p, q, d, g=None: verify_round(p, q, d, g), "helpers.serve.speculative.verify_round"),
    (_round(fix="unclamped"), "clamp it at 0"),
    (_round(fix="p"), "after a rejection you drew from p"),
    (_round("inverted"), "min(1, q/p)"),
    (_round("reversed"), "keep it when u < min(1, p/q)"),
    (_round("p_only"), "your acceptance is p(x) alone"),
    (_round(bonus="previous"), "the bonus token comes from p[k - 1]"),
    (_round(bonus="none"), "ends without the bonus token"),
    (_round(stop=False), "exactly one more token"),
])
def test_accept_or_reject_checker(answer, message):
    passed, said = exercises.evaluate("serving.accept_or_reject", answer)
    assert passed == (message is None), said
    assert message is None or message in said


def test_the_round_checker_leaves_torchs_global_generator_alone():
    state = torch.get_rng_state()
    exercises.evaluate("serving.accept_or_reject", _round())
    assert torch.equal(torch.get_rng_state(), state)


def test_speculative_generate_runs_a_students_round_and_stays_exact():
    """The notebook passes the student's round as `verify`: greedy tokens stay the target's, and
    the default (verify_round) draws the same numbers as the student-style solution above."""
    from helpers.model.generation import generate
    from helpers.model.gpt import GPT, GPTConfig
    from helpers.serve.speculative import speculative_generate

    torch.manual_seed(0)
    target = GPT(GPTConfig(vocab_size=16, context_length=48, n_layers=2, n_heads=2, d_model=32)).eval()
    draft = GPT(GPTConfig(vocab_size=16, context_length=48, n_layers=1, n_heads=2, d_model=16)).eval()
    greedy = generate(target, torch.tensor([[1, 2, 3]]), 15, temperature=0)[0, 3:].tolist()
    assert speculative_generate(target, draft, [1, 2, 3], 15, k=3, temperature=0, verify=_round())[0] == greedy
    sampled = [speculative_generate(target, draft, [1, 2, 3], 10, k=2, verify=verify,
                                    generator=torch.Generator().manual_seed(4))[0]
               for verify in (None, _round())]
    assert sampled[0] == sampled[1]


@pytest.mark.parametrize("call, match", [
    (lambda p, q: verify_round(p, q, [0, 1]), r"for 2 drafted tokens, expected \(3, V\)"),
    (lambda p, q: verify_round(p[0], q, [0]), "expected \\(k \\+ 1, V\\) and \\(k, V\\)"),
    (lambda p, q: verify_round(p[:2], q[:1, :3], [0]), r"expected \(2, V\) and \(1, V\)"),
])
def test_verify_round_refuses_mismatched_shapes(call, match):
    p, q = torch.full((2, 4), 0.25), torch.full((1, 4), 0.25)
    with pytest.raises(ValueError, match=match):
        call(p, q)


def test_speculative_generate_refuses_a_verify_that_is_not_a_round():
    from helpers.model.gpt import GPT, GPTConfig
    from helpers.serve.speculative import speculative_generate

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8, context_length=32, n_layers=1, n_heads=2, d_model=16)).eval()
    with pytest.raises(ValueError, match="verify is int"):
        speculative_generate(model, model, [1], 4, k=2, verify=3)
    with pytest.raises(ValueError, match="verify returned"):
        speculative_generate(model, model, [1], 4, k=2, verify=lambda p, q, d, g: [5, 5, 5, 5])


def _top_p(inclusive: bool = False):
    """A top-p answer; inclusive counts a token's own mass (the usual off-by-one)."""
    def answer(logits, p):
        probs = logits.softmax(-1)
        order = probs.argsort(descending=True)
        mass = probs[order].cumsum(0) - (0 if inclusive else probs[order])
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order] = mass < p
        return logits.masked_fill(~keep, float("-inf"))
    return answer


@pytest.mark.parametrize("answer, message", [
    (_top_p(), None),
    (_top_p(inclusive=True), "the token that crosses top_p belongs to the nucleus"),
    (lambda logits, p: torch.softmax(_top_p()(logits, p), -1), "you return probabilities, not logits"),
    (lambda logits, p: _top_p()(logits, p) - logits.logsumexp(-1), "the kept logits"),
])
def test_top_p_checker(answer, message):
    passed, said = exercises.evaluate("serving.top_p", answer)
    assert passed == (message is None), said
    assert message is None or message in said


@pytest.mark.parametrize("answer, message", [
    (lambda table, position, size: (table[position // size], position % size), None),
    (lambda table, position, size: (position // size, position % size), "the logical block index"),
    (lambda table, position, size: (table[position // size], position // size), "lives at (block, slot)"),
])
def test_block_lookup_checker(answer, message):
    passed, said = exercises.evaluate("serving.block_lookup", answer)
    assert passed == (message is None), said
    assert message is None or message in said


def _int8(rounding: bool = True, per_row: bool = True):
    def answer(w):
        scale = w.abs().amax(dim=1) / 127 if per_row else w.abs().max().expand(w.shape[0]) / 127
        scaled = w / scale[:, None]
        return (scaled.round() if rounding else scaled).to(torch.int8), scale
    return answer


@pytest.mark.parametrize("answer, message", [
    (_int8(), None),
    (_int8(rounding=False), "truncated towards zero"),
    (_int8(per_row=False), "scale has the right shape but wrong values"),
    (lambda w: _int8()(w)[0], "not the pair (q, scale)"),
])
def test_quantize_int8_checker(answer, message):
    passed, said = exercises.evaluate("serving.quantize_int8_rows", answer)
    assert passed == (message is None), said
    assert message is None or message in said


def _int4(swap: bool = False, per_row: bool = False, **slip):
    """An int4 answer built on the checker's reference rule, with one of the usual slips."""
    from helpers.lab.exercises.serving import _int4_values
    from helpers.serve.quantize import pack_int4

    def answer(w, group_size):
        q, scale, zero = _int4_values(w, w.shape[1] if per_row else group_size, **slip)
        packed = pack_int4(q)
        if swap:
            packed = (packed >> 4) | ((packed & 0x0F) << 4)
        return packed, scale, zero
    return from_the_checker(answer)


@pytest.mark.parametrize("answer, message", [
    (_int4(), None),
    (lambda w, g: __import__("helpers.serve.quantize", fromlist=["x"]).quantize_int4(w, g),
     "helpers.serve.quantize.quantize_int4"),
    (_int4(include_zero=False), "does not include 0"),
    (_int4(levels=16), "16 steps"),
    (_int4(rounding=False), "truncated towards zero"),
    (_int4(swap=True), "the two values of each byte are swapped"),
    (_int4(per_row=True), "scale and zero are (3, 2)"),
])
def test_quantize_int4_checker(answer, message):
    passed, said = exercises.evaluate("serving.quantize_int4_groups", answer, watched=getattr(answer, "watched", True))
    assert passed == (message is None), said
    assert message is None or message in said


def int4(w, group_size, strided=False, from_bottom=False):
    """The int4 quantizer of notebook 14, right by default, with one of two slips."""
    out, n_in = w.shape
    groups = (w.reshape(out, group_size, n_in // group_size).transpose(1, 2) if strided
              else w.reshape(out, n_in // group_size, group_size))
    low, high = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    scale = (high - low) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-low / scale)
    steps = (groups - low[..., None]) / scale[..., None] if from_bottom else groups / scale[..., None]
    q = (torch.round(steps) + (0 if from_bottom else zero[..., None])).clamp(0, 15).to(torch.uint8)
    q = q.transpose(1, 2) if strided else q
    q = q.reshape(out, n_in)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale, zero


def test_int4_quantizers_right_and_slipped():
    assert evaluate("serving.quantize_int4_groups", int4)[0]
    named("serving.quantize_int4_groups", lambda w, g: int4(w, g, strided=True), "strided", "consecutive")
    named("serving.quantize_int4_groups", lambda w, g: int4(w, g, from_bottom=True),
          "distance from the group's minimum")
