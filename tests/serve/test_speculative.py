"""Speculative decoding's output distribution is the target's, exactly (enumeration) and in the
loop on two GPTs (helpers.serve.speculative; notebook 14, section 6)."""

from __future__ import annotations

import functools
import itertools
import math
import re

import pytest
import torch
from shared_tools import full

from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.serve import sampling
from helpers.serve.speculative import (
    SpeculativeStats,
    _kept,
    accept_or_reject,
    acceptance_probability,
    autoregressive_distribution,
    chi_square,
    exact_distribution,
    residual,
    round_distribution,
    sample_outputs,
    speculative_generate,
    verify_round,
)


def _toy(seed: int, vocab: int = 3):
    """Two made-up conditionals: prefix -> probabilities (V,), different for every prefix."""
    def conditional(salt: int):
        def probs(prefix: tuple[int, ...]) -> torch.Tensor:
            gen = torch.Generator().manual_seed(hash((seed, salt, prefix)) % 2**31)
            return torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * 2, dim=0)
        return probs
    return conditional(0), conditional(1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_every_path_enumerated_gives_the_target_distribution(seed, k):
    target, draft = _toy(seed)
    spec = exact_distribution(target, draft, (0,), k=k, n_tokens=3)
    plain = autoregressive_distribution(target, (0,), n_tokens=3)
    assert set(spec) == set(itertools.product(range(3), repeat=3))
    assert max(abs(spec[path] - plain[path]) for path in plain) < 1e-12
    assert abs(sum(spec.values()) - 1) < 1e-12


def test_a_broken_rule_is_caught_by_the_enumeration(monkeypatch):
    """Accept every drafted token (no rejection): the output is then the draft's, not the target's."""
    import helpers.serve.speculative as spec_module
    monkeypatch.setattr(spec_module, "_acceptance", lambda p, q, x: 1.0)
    target, draft = _toy(0)
    spec = spec_module.exact_distribution(target, draft, (0,), k=2, n_tokens=2)
    plain = autoregressive_distribution(target, (0,), n_tokens=2)
    assert max(abs(spec[path] - plain[path]) for path in plain) > 1e-3


@pytest.mark.parametrize("body, wrong", [("_acceptance", lambda p, q, x: 1.0),
                                         ("_residual", lambda p, q: p.clone())])
def test_a_broken_rule_body_is_caught_by_sampling_too(monkeypatch, body, wrong):
    """verify_round runs the same rule bodies as the enumeration (notebook 14's swap_in relies on
    it): a wrong one fails the chi-square test of sampled outputs."""
    import helpers.serve.speculative as spec_module
    target, draft = _toy(0, vocab=4)
    exact = autoregressive_distribution(target, (0,), n_tokens=2)
    draw = functools.partial(spec_module.sample_outputs, target, draft, (0,), k=2, n_tokens=2,
                             n_samples=1000)
    right = draw(verify=spec_module.verify_round, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(spec_module, body, wrong)
    broken = draw(verify=spec_module.verify_round, generator=torch.Generator().manual_seed(0))
    assert chi_square(right, exact)[1] > 0.01 and chi_square(broken, exact)[1] < 1e-6


def test_the_rule_on_one_token():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    assert acceptance_probability(p, q, 1) == pytest.approx(0.5)
    assert acceptance_probability(p, q, 0) == 1.0
    assert residual(p, q).tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert accept_or_reject(p, q, 1, 0.49)[0] and not accept_or_reject(p, q, 1, 0.51)[0]


def _models():
    torch.manual_seed(0)
    target = GPT(GPTConfig(vocab_size=16, context_length=48, n_layers=2, n_heads=2, d_model=32)).eval()
    draft = GPT(GPTConfig(vocab_size=16, context_length=48, n_layers=1, n_heads=2, d_model=16)).eval()
    return target, draft


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_equals_the_targets_greedy_tokens(k):
    target, draft = _models()
    prompt = [1, 2, 3]
    tokens, stats = speculative_generate(target, draft, prompt, 20, k=k, temperature=0)
    assert tokens == generate(target, torch.tensor([prompt]), 20, temperature=0)[0, 3:].tolist()
    assert stats.target_passes <= 20 and stats.accepted <= stats.proposed


def test_speculating_with_itself_accepts_everything():
    target, _ = _models()
    tokens, stats = speculative_generate(target, target, [4, 5], 12, k=3,
                                         generator=torch.Generator().manual_seed(0))
    assert stats.acceptance_rate == 1.0 and stats.target_passes == 3  # 4 tokens per pass


def test_sampled_first_token_follows_the_target():
    """400 one-token samples: the frequencies match the target's probabilities."""
    target, draft = _models()
    prompt = [1, 2, 3]
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(16)
    for _ in range(400):
        counts[speculative_generate(target, draft, prompt, 1, k=2, generator=gen)[0][0]] += 1
    p = torch.softmax(target(torch.tensor([prompt]))[0, -1].double(), dim=0).float()
    assert (counts / 400 - p).abs().max() < 5 * (p * (1 - p) / 400).sqrt().max() + 1e-3


@pytest.mark.parametrize("call, match", [
    (lambda t, d: speculative_generate(t, d, [1], 5, k=0), "k is 0"),
    (lambda t, d: speculative_generate(t, GPT(GPTConfig(vocab_size=17, context_length=48, n_layers=1,
                                                        n_heads=2, d_model=16)), [1], 5, k=2),
     "vocab_size 17"),
    (lambda t, d: speculative_generate(t, d, [1] * 40, 5, k=4), "longer than the cache"),
    (lambda t, d: accept_or_reject(torch.ones(3) / 3, torch.ones(4) / 4, 0, 0.5), "vocabulary"),
    (lambda t, d: accept_or_reject(torch.ones(3) / 3, torch.ones(3) / 3, 0, 1.0), "u is 1.0"),
    (lambda t, d: residual(torch.ones(3), torch.ones(3) / 3), "sums to 3"),
    (lambda t, d: exact_distribution(lambda x: x, lambda x: x, (), k=0, n_tokens=1), "k is 0"),
    (lambda t, d: round_distribution(lambda x: x, lambda x: x, (), k=0), "k is 0"),
])
def test_bad_speculative_arguments(call, match):
    target, draft = _models()
    with pytest.raises(ValueError, match=match):
        call(target, draft)


def test_round_distribution_refuses_a_list_context_and_a_non_function_before_any_call():
    uniform = lambda context: torch.ones(3) / 3  # noqa: E731 - a conditional over 3 tokens
    with pytest.raises(TypeError, match="^context is .*list.*, expected a tuple of token ids"):
        round_distribution(uniform, uniform, [0], k=1)
    with pytest.raises(TypeError, match="^draft is Tensor, expected a function of a context"):
        round_distribution(uniform, torch.ones(3) / 3, (), k=1)


def test_full_rounds_count_the_rounds_that_kept_all_k():
    target, draft = _models()
    _, same = speculative_generate(target, target, [4, 5], 12, k=3, generator=torch.Generator().manual_seed(0))
    assert same.full_rounds == same.rounds == 3 and same.full_round_share == 1.0
    _, stats = speculative_generate(target, draft, [1, 2, 3], 20, k=3, temperature=0)
    assert stats.full_rounds == stats.rounds - stats.rejected  # a round rejects at most once
    assert 0 < stats.rejected < stats.rounds  # both kinds of round happen here
    assert stats.full_round_share == stats.full_rounds / stats.rounds


# --- the sampled test: Pearson's chi-square over the outputs of a small vocabulary ----------

def _small():
    """The pair notebook 14 tests samples on: 4 tokens, softer distributions (logits x 1)."""
    import functools

    def conditional(salt: int):
        @functools.cache
        def probs(prefix: tuple[int, ...]) -> torch.Tensor:
            gen = torch.Generator().manual_seed(hash((salt, prefix)) % 2**31)
            return torch.softmax(torch.randn(4, generator=gen, dtype=torch.float64), dim=0)
        return probs
    return conditional(0), conditional(1)


def test_chi_square_statistic_and_p_value():
    counts = {(0,): 30, (1,): 50, (2,): 20}
    probs = {(0,): 0.25, (1,): 0.5, (2,): 0.25}
    statistic, p_value = chi_square(counts, probs)
    assert statistic == pytest.approx(25 / 25 + 0 + 25 / 25)
    assert p_value == pytest.approx(math.exp(-statistic / 2))  # 2 degrees of freedom: e^(-x/2)
    assert chi_square({(0,): 25, (1,): 50, (2,): 25}, probs) == (0.0, 1.0)
    assert chi_square({(0,): 1, (3,): 1}, probs) == (math.inf, 0.0)  # an impossible output


def test_the_sampled_test_passes_the_right_rule_and_fails_two_wrong_ones(monkeypatch):
    import helpers.serve.speculative as spec_module
    target, draft = _small()
    exact = autoregressive_distribution(target, (0,), n_tokens=2)
    assert min(exact.values()) * 1000 >= 5  # every expected count at least 5

    def p_value() -> float:
        counts = sample_outputs(target, draft, (0,), k=2, n_tokens=2, n_samples=1000,
                                verify=spec_module.verify_round, generator=torch.Generator().manual_seed(0))
        assert sum(counts.values()) == 1000
        return chi_square(counts, exact)[1]

    assert p_value() > 0.01
    with monkeypatch.context() as patch:
        patch.setattr(spec_module, "_acceptance", lambda p, q, x: 1.0)  # always accept (verify_round's body)
        assert p_value() < 1e-6
    with monkeypatch.context() as patch:
        patch.setattr(spec_module, "_residual", lambda p, q: p.clone())  # redraw from p, not p - q
        assert p_value() < 1e-6


def test_sample_outputs_feeds_verify_the_round_it_drafted():
    """verify sees p (k + 1, V) from the target and q (k, V) from the draft at the drafted prefixes."""
    target, draft = _small()
    seen = []

    def spy(p, q, drafted, generator=None):
        seen.append((p.shape, q.shape, list(drafted)))
        before = (0,) if len(seen) % 2 else (0, *seen[-2][2], 0)  # 2 rounds a sample, 3 tokens each
        assert torch.equal(q[0], draft(before)) and torch.equal(p[0], target(before))
        assert torch.equal(q[1], draft((*before, drafted[0]))) and torch.equal(p[2], target((*before, *drafted)))
        return list(drafted) + [0]  # keep all, bonus token 0

    counts = sample_outputs(target, draft, (0,), k=2, n_tokens=5, n_samples=3, verify=spy,
                            generator=torch.Generator().manual_seed(0))
    assert seen[0][:2] == (torch.Size([3, 4]), torch.Size([2, 4])) and len(seen) == 2 * 3
    assert sum(counts.values()) == 3 and all(len(key) == 5 and key[2] == 0 for key in counts)


@pytest.mark.parametrize("call, match", [
    (lambda: chi_square({}, {(0,): 0.5, (1,): 0.5}), "counts hold 0 samples"),
    (lambda: chi_square({(0,): 2}, {(0,): 0.5, (1,): 0.4}), "summing to 0.9"),
    (lambda: chi_square({(0,): 2}, {(0,): 1.0}), "1 outcomes"),
    (lambda: sample_outputs(*_small(), (0,), 2, 2, 0, verify_round, torch.Generator()), "n_samples is 0"),
    (lambda: sample_outputs(*_small(), (0,), 2, 2, 5, "rule", torch.Generator()), "verify is str"),
    (lambda: sample_outputs(*_small(), (0,), 2, 2, 5, lambda p, q, d, g: [9, 9, 9, 9], torch.Generator()),
     "verify returned"),
])
def test_bad_sampled_test_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sample_outputs_refuses_a_missing_generator():
    with pytest.raises(TypeError, match="generator"):
        sample_outputs(*_small(), (0,), 2, 2, 5, verify_round, None)


# helpers.serve.speculative, exactly:
#
# Fixtures where the behaviour decides the answer: a draft that disagrees with the target (so
# rejection and the residual run), distributions with zeros (so the enumeration must skip the
# impossible paths), a spy on `verify` that records every round (so the counts, the caches'
# rollback and the rule applied to both models are checked against a full forward pass without a
# cache), the exact boundaries of the acceptance rule, and every error message read in full.

F64 = torch.float64


def vec(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_acceptance_is_the_ratio_below_one_and_one_above():
    p, q = vec(0.5, 0.25, 0.25), vec(0.25, 0.5, 0.25)
    assert acceptance_probability(p, q, 1) == 0.5
    assert acceptance_probability(p, q, 0) == 1.0   # p / q = 2, capped
    assert acceptance_probability(p, q, 2) == 1.0   # p == q
    assert acceptance_probability(vec(0.0, 1.0), vec(0.5, 0.5), 0) == 0.0


def test_accept_or_reject_at_the_boundary_of_u():
    p, q = vec(0.5, 0.25, 0.25), vec(0.25, 0.5, 0.25)
    assert accept_or_reject(p, q, 1, 0.0)[0] is True
    assert accept_or_reject(p, q, 1, 0.5)[0] is False        # u == p / q: rejected (u < ratio)
    assert accept_or_reject(p, q, 1, 0.4999)[0] is True
    assert accept_or_reject(p, q, 0, 0.9999)[0] is True      # ratio 1 keeps every u < 1
    kept, fix = accept_or_reject(p, q, 0, 0.3)
    assert kept is True and fix.tolist() == [1.0, 0.0, 0.0]  # the residual either way


def test_residual_is_the_normalised_positive_part():
    p, q = vec(0.5, 0.25, 0.125, 0.125), vec(0.25, 0.25, 0.5, 0.0)
    assert residual(p, q).tolist() == [2 / 3, 0.0, 0.0, 1 / 3]


def test_residual_of_equal_distributions_is_a_copy_of_the_target():
    p = vec(0.5, 0.25, 0.25)
    out = residual(p, p.clone())
    assert out.tolist() == [0.5, 0.25, 0.25] and out is not p
    out[0] = 9.0
    assert p[0] == 0.5


def test_probability_checks_at_their_tolerance():
    residual(vec(0.5, 0.5 + 9e-7), vec(0.5, 0.5))            # within 1e-6 of summing to 1
    with pytest.raises(ValueError, match=full("target sums to 1.000002 or has negative entries, "
                                              "expected a probability distribution")):
        residual(vec(0.5, 0.5 + 2e-6), vec(0.5, 0.5))
    with pytest.raises(ValueError, match=full("draft sums to 0.999998 or has negative entries, "
                                              "expected a probability distribution")):
        residual(vec(0.5, 0.5), vec(0.5, 0.5 - 2e-6))
    with pytest.raises(ValueError, match=full("draft sums to 1.000000 or has negative entries, "
                                              "expected a probability distribution")):
        residual(vec(0.5, 0.5), vec(1.5, -0.5))
    residual(vec(1.0, 0.0), vec(0.0, 1.0))                   # zeros are fine


@pytest.mark.parametrize("bad, shown", [
    (torch.ones(2, 2) / 4, "torch.Size([2, 2])"),
    (torch.tensor([1, 0]), "torch.Size([2])"),
    ([0.5, 0.5], "list"),
])
def test_a_probability_vector_must_be_a_float_vector(bad, shown):
    with pytest.raises(ValueError, match=full(f"target is {shown}, expected a float (V,) "
                                              "probability vector")):
        acceptance_probability(bad, vec(0.5, 0.5), 0)
    with pytest.raises(ValueError, match=full(f"draft is {shown}, expected a float (V,) "
                                              "probability vector")):
        residual(vec(0.5, 0.5), bad)


@pytest.mark.parametrize("call, message", [
    (lambda: acceptance_probability(vec(0.5, 0.5), vec(1.0, 0.0), 1),
     "token 1 has draft probability 0, so the draft cannot propose it"),
    (lambda: acceptance_probability(vec(0.5, 0.5), vec(1.0, 0.0, 0.0), 0),
     "target has 2 tokens and draft 3: the draft must share the target's vocabulary"),
    (lambda: accept_or_reject(vec(0.5, 0.5), vec(0.5, 0.5), 0, -0.1),
     "u is -0.1, expected a uniform draw in [0, 1)"),
])
def test_rule_errors_in_full(call, message):
    with pytest.raises(ValueError, match=full(message)):
        call()


def onehot(*tokens: int, vocab: int = 4) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).to(F64)


def test_a_round_where_the_draft_agrees_keeps_all_and_adds_the_bonus():
    p, q = onehot(2, 1, 3), onehot(2, 1)
    assert verify_round(p, q, [2, 1], torch.Generator().manual_seed(0)) == [2, 1, 3]


def test_a_round_where_the_draft_disagrees_stops_at_the_first_rejection():
    """The second drafted token has target probability 0: rejected for every u, replaced by the
    residual's only token; the third is never looked at."""
    p, q = onehot(2, 0, 1, 3), onehot(2, 1, 1)
    for seed in range(5):
        assert verify_round(p, q, [2, 1, 1], torch.Generator().manual_seed(seed)) == [2, 0]
    assert verify_round(onehot(3, 3), onehot(1), [1]) == [3]


def test_a_round_draws_from_the_generator_only():
    """A sampled round: the same generator state gives the same tokens, whatever the global RNG."""
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(4, 5, generator=gen, dtype=F64), dim=-1)
    q = torch.softmax(torch.randn(3, 5, generator=gen, dtype=F64), dim=-1)
    drafted = [int(torch.multinomial(row, 1, generator=gen)) for row in q]
    outs = []
    for global_seed in range(2):
        torch.manual_seed(global_seed)
        outs.append(verify_round(p, q, drafted, torch.Generator().manual_seed(11)))
    assert outs[0] == outs[1]


def test_a_round_uses_float64_uniforms():
    """u is a float64 draw: with acceptance p / q = 0.5 + 2^-40, the u of the seed below lies
    between 0.5 and the ratio only in float64 (a float32 draw differs from it)."""
    target, draft = vec(0.5 + 2**-41, 0.5 - 2**-41), vec(0.5, 0.5)
    ratio = acceptance_probability(target, draft, 0)
    wins64 = [s for s in range(2000) if float(torch.rand((), generator=torch.Generator().manual_seed(s),
                                                         dtype=F64)) < ratio]
    p, q = torch.stack([target, target]), draft.unsqueeze(0)
    for seed in wins64[:3]:
        assert verify_round(p, q, [0], torch.Generator().manual_seed(seed))[0] == 0
    assert len(wins64) > 0


@pytest.mark.parametrize("p, q, drafted, message", [
    (torch.ones(3) / 3, torch.ones(1, 3) / 3, [0],
     "p and q have shapes torch.Size([3]) and torch.Size([1, 3]), expected (k + 1, V) and (k, V)"),
    (torch.ones(2, 3) / 3, torch.ones(3) / 3, [0],
     "p and q have shapes torch.Size([2, 3]) and torch.Size([3]), expected (k + 1, V) and (k, V)"),
    (torch.ones(2, 3) / 3, torch.ones(2, 3) / 3, [0],
     "p is (2, 3) and q (2, 3) for 1 drafted tokens, expected (2, V) and (1, V)"),
    (torch.ones(3, 3) / 3, torch.ones(1, 3) / 3, [0],
     "p is (3, 3) and q (1, 3) for 1 drafted tokens, expected (2, V) and (1, V)"),
    (torch.ones(2, 4) / 4, torch.ones(1, 3) / 3, [0],
     "p is (2, 4) and q (1, 3) for 1 drafted tokens, expected (2, V) and (1, V)"),
])
def test_round_shapes_in_full(p, q, drafted, message):
    with pytest.raises(ValueError, match=full(message)):
        verify_round(p, q, drafted)


def test_kept_counts_and_refuses_what_no_round_can_return():
    assert _kept([5], [1, 2], 2) == 0
    assert _kept([1, 7], [1, 2], 2) == 1
    assert _kept([1, 2, 9], [1, 2], 2) == 2
    for out in ([], [1, 2, 9, 9], [3, 7], [1, 3, 9]):
        with pytest.raises(ValueError, match=full(f"verify returned {out} for drafted [1, 2]: "
                                                  "expected the kept drafted tokens then one more, "
                                                  "1 to k + 1 tokens")):
            _kept(out, [1, 2], 2)


def _with_zeros(vocab: int = 3):
    """Target and draft with zeros in different places, and one prefix where they are equal."""
    def target(prefix):
        if len(prefix) % 2:
            return vec(0.5, 0.5, 0.0)
        return vec(0.25, 0.25, 0.5)

    def draft(prefix):
        if len(prefix) % 2:
            return vec(0.0, 0.25, 0.75)
        return vec(0.25, 0.25, 0.5)  # equal to the target here: nothing is rejected
    return target, draft


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("n_tokens", [1, 2, 3])
def test_enumeration_lists_exactly_the_possible_paths(k, n_tokens):
    target, draft = _with_zeros()
    spec = exact_distribution(target, draft, (), k=k, n_tokens=n_tokens)
    plain = autoregressive_distribution(target, (), n_tokens=n_tokens)
    assert set(spec) == set(plain)           # no zero-probability path listed
    assert all(len(path) == n_tokens for path in plain)
    assert max(abs(spec[path] - plain[path]) for path in plain) < 1e-12


def test_the_reference_skips_impossible_tokens():
    target, _ = _with_zeros()
    assert autoregressive_distribution(target, (), 2) == {
        (a, b): pa * pb for a, pa in enumerate([0.25, 0.25, 0.5]) for b, pb in enumerate([0.5, 0.5, 0.0])
        if pb > 0}
    assert autoregressive_distribution(target, (7,), 1) == {(0,): 0.5, (1,): 0.5}


def test_enumeration_starts_after_the_prefix():
    target, draft = _with_zeros()
    assert set(exact_distribution(target, draft, (7,), k=2, n_tokens=1)) == {(0,), (1,)}


@pytest.mark.parametrize("call, message", [
    (lambda: exact_distribution(lambda x: x, lambda x: x, (), k=1, n_tokens=0),
     "n_tokens is 0, expected a positive int"),
    (lambda: exact_distribution(lambda x: x, lambda x: x, (), k=0, n_tokens=1),
     "k is 0, expected a positive int"),
    (lambda: autoregressive_distribution(lambda x: x, (), n_tokens=0),
     "n_tokens is 0, expected a positive int"),
])
def test_enumeration_errors_in_full(call, message):
    with pytest.raises(ValueError, match=full(message)):
        call()


def _small_target_and_draft(context: int = 24):
    torch.manual_seed(0)
    target = GPT(GPTConfig(vocab_size=16, context_length=context, n_layers=1, n_heads=2,
                           d_model=16)).eval()
    draft = GPT(GPTConfig(vocab_size=16, context_length=context, n_layers=1, n_heads=1,
                          d_model=8)).eval()
    return target, draft


class Spy:
    """A `verify` that runs verify_round and records each round's arguments and output."""

    def __init__(self) -> None:
        self.rounds: list[tuple[torch.Tensor, torch.Tensor, list[int], list[int]]] = []

    def __call__(self, p, q, drafted, generator):
        out = verify_round(p, q, drafted, generator)
        self.rounds.append((p, q, list(drafted), out))
        return out


@pytest.mark.parametrize("rule", [dict(temperature=1.0), dict(temperature=0.7, top_k=5),
                                  dict(temperature=1.3, top_p=0.8), dict(temperature=0)])
def test_each_round_sees_both_models_full_forward_distributions(rule):
    """p and q of every round equal the rule applied to a forward pass without a cache over the
    sequence so far: the caches are fed and rolled back right, rejections included."""
    target, draft = _small_target_and_draft()
    prompt, spy = [1, 2, 3], Spy()
    k = 3
    tokens, stats = speculative_generate(target, draft, prompt, 9, k=k, verify=spy,
                                         generator=torch.Generator().manual_seed(0), **rule)
    seq = list(prompt)
    with torch.no_grad():
        for p, q, drafted, out in spy.rounds:
            ids = torch.tensor([seq + drafted])
            want_p = sampling.distribution(target(ids)[0, len(seq) - 1:], **rule)
            want_q = sampling.distribution(draft(ids)[0, len(seq) - 1:-1], **rule)
            assert (p - want_p).abs().max() < 1e-5 and (q - want_q).abs().max() < 1e-5
            seq += out
    assert tokens == seq[len(prompt):len(prompt) + 9] and len(tokens) == 9
    assert stats == SpeculativeStats(
        proposed=k * len(spy.rounds), accepted=sum(len(out) - 1 for *_, out in spy.rounds),
        rejected=sum(len(out) - 1 < k for *_, out in spy.rounds),
        target_passes=len(spy.rounds), draft_passes=k * len(spy.rounds),
        full_rounds=sum(len(out) - 1 == k for *_, out in spy.rounds))
    assert stats.rejected > 0 and stats.accepted > 0  # both paths ran


def test_greedy_with_a_disagreeing_draft_is_the_targets_greedy_and_counts_rounds():
    target, draft = _small_target_and_draft()
    spy = Spy()
    tokens, stats = speculative_generate(target, draft, [4], 8, k=2, temperature=0, verify=spy)
    seq = [4]
    with torch.no_grad():
        for _ in range(8):
            seq.append(int(target(torch.tensor([seq]))[0, -1].argmax()))
    assert tokens == seq[1:]
    assert stats.target_passes == len(spy.rounds) and stats.rejected > 0


def test_acceptance_rate():
    assert SpeculativeStats().acceptance_rate == 0.0
    assert SpeculativeStats(accepted=1).acceptance_rate == 1.0
    assert SpeculativeStats(proposed=9, accepted=3, rejected=1).acceptance_rate == 0.75


def test_the_generator_owns_the_randomness():
    target, draft = _small_target_and_draft()
    outs = []
    for global_seed in range(2):
        torch.manual_seed(global_seed)
        outs.append(speculative_generate(target, draft, [1, 2], 5, k=3,
                                         generator=torch.Generator().manual_seed(4))[0])
    assert outs[0] == outs[1]


def test_the_last_round_is_cut_to_max_new_tokens():
    target, _ = _small_target_and_draft()
    tokens, stats = speculative_generate(target, target, [4, 5], 5, k=3,
                                         generator=torch.Generator().manual_seed(0))
    assert len(tokens) == 5 and stats.target_passes == 2 and stats.draft_passes == 6
    assert stats.proposed == 6 and stats.accepted == 6 and stats.rejected == 0


def test_a_request_exactly_filling_the_context_runs():
    target, draft = _small_target_and_draft(context=12)
    tokens, _ = speculative_generate(target, draft, [1, 2, 3], 6, k=3, temperature=0)  # 3 + 6 + 3
    assert len(tokens) == 6
    with pytest.raises(ValueError, match=full("prompt + max_new_tokens + k = 13 tokens, longer "
                                              "than the cache (context 12)")):
        speculative_generate(target, draft, [1, 2, 3], 7, k=3, temperature=0)


def test_the_shorter_context_of_the_two_decides():
    target, _ = _small_target_and_draft(context=24)
    _, draft = _small_target_and_draft(context=10)
    with pytest.raises(ValueError, match=full("prompt + max_new_tokens + k = 11 tokens, longer "
                                              "than the cache (context 10)")):
        speculative_generate(target, draft, [1, 2, 3], 6, k=2)
    with pytest.raises(ValueError, match=full("prompt + max_new_tokens + k = 11 tokens, longer "
                                              "than the cache (context 10)")):
        speculative_generate(draft, target, [1, 2, 3], 6, k=2)


def test_models_are_put_in_eval_mode():
    target, draft = _small_target_and_draft()
    target.train(), draft.train()
    speculative_generate(target, draft, [1], 2, k=1, temperature=0)
    assert not target.training and not draft.training


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(k=0), ValueError, "k is 0, expected a positive int"),
    (dict(k=2.0), TypeError, "k is 2.0 (a float), expected a positive int"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens is 0, expected a positive int"),
    (dict(verify=3), ValueError,
     "verify is int, expected a function (p, q, drafted, generator) -> tokens, like verify_round"),
    (dict(verify=lambda p, q, d, g: [99, 99, 99, 99]), ValueError,
     "verify returned [99, 99, 99, 99] for drafted"),
])
def test_loop_errors_in_full(kwargs, error, message):
    target, draft = _small_target_and_draft()
    args = dict(prompt=[1], max_new_tokens=3, k=2, temperature=0) | kwargs
    pattern = full(message) if not message.endswith("drafted") else "^" + re.escape(message)
    with pytest.raises(error, match=pattern):
        speculative_generate(target, draft, **args)


def test_a_different_vocabulary_is_refused_in_full():
    target, _ = _small_target_and_draft()
    other = GPT(GPTConfig(vocab_size=17, context_length=24, n_layers=1, n_heads=1, d_model=8))
    with pytest.raises(ValueError, match=full("draft has vocab_size 17 and target 16: the draft "
                                              "must use the target's tokenizer")):
        speculative_generate(target, other, [1], 3, k=2)


def test_acceptance_names_a_bad_draft():
    with pytest.raises(ValueError, match=full("draft is torch.Size([2, 2]), expected a float (V,) "
                                              "probability vector")):
        acceptance_probability(vec(0.5, 0.5), torch.ones(2, 2) / 4, 0)


@pytest.mark.parametrize("p, q, shown", [
    ([0.5, 0.5], torch.ones(1, 2) / 2, "[0.5, 0.5] and torch.Size([1, 2])"),
    (torch.ones(2, 2) / 2, "q", "torch.Size([2, 2]) and q"),
])
def test_round_refuses_what_is_not_a_tensor(p, q, shown):
    with pytest.raises(ValueError, match=full(f"p and q have shapes {shown}, expected (k + 1, V) "
                                              "and (k, V)")):
        verify_round(p, q, [0])


def _full_support(seed: int, vocab: int = 3):
    """A target and a draft, prefix -> probabilities (V,), every token possible, every prefix
    different."""
    def conditional(salt: int):
        def probs(prefix: tuple[int, ...]) -> torch.Tensor:
            gen = torch.Generator().manual_seed(hash((seed, salt, prefix)) % 2**31)
            return torch.softmax(torch.randn(vocab, generator=gen, dtype=F64), dim=0)
        return probs
    return conditional(0), conditional(1)


class Counted:
    """A conditional that counts its calls."""

    def __init__(self, probs) -> None:
        self.probs, self.calls = probs, 0

    def __call__(self, prefix):
        self.calls += 1
        return self.probs(prefix)


def test_enumeration_asks_each_conditional_only_what_it_needs():
    """k = 1, n_tokens = 1, a full-support target and draft: the draft is asked once (the empty
    prefix), the target once there and once after each of the 3 drafted tokens (for the bonus).
    A rejected token ends the output: nothing after it is asked."""
    target, draft = (Counted(f) for f in _full_support(0))
    exact_distribution(target, draft, (), k=1, n_tokens=1)
    assert (target.calls, draft.calls) == (4, 1)
    target, draft = (Counted(f) for f in _full_support(0))
    exact_distribution(target, draft, (), k=2, n_tokens=1)
    assert (target.calls, draft.calls) == (1 + 3 + 9, 1 + 3)


class Fed:
    """Wraps a model's forward_cached to record how many tokens each call feeds."""

    def __init__(self, model) -> None:
        self.sizes: list[int] = []
        inner = model.forward_cached

        def record(ids, cache, *args, **kwargs):
            self.sizes.append(ids.shape[1])
            return inner(ids, cache, *args, **kwargs)
        model.forward_cached = record


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_nothing_is_fed_twice(temperature):
    """The target's cache holds every token but the last: after the prompt + k, each round feeds
    exactly the last emitted token and the k new drafted ones. The draft's first pass of a round
    feeds 1 token after a rejection, 2 after a full acceptance (the last drafted one and the
    bonus), and 1 a pass after that."""
    target, draft = _small_target_and_draft()
    fed_t, fed_d, spy = Fed(target), Fed(draft), Spy()
    k, prompt = 3, [1, 2, 3]
    speculative_generate(target, draft, prompt, 12, k=k, temperature=temperature, verify=spy,
                         generator=torch.Generator().manual_seed(1))
    assert fed_t.sizes == [len(prompt) + k] + [k + 1] * (len(spy.rounds) - 1)
    want = [len(prompt), 1, 1]
    for *_, out in spy.rounds[:-1]:
        want += [2 if len(out) == k + 1 else 1, 1, 1]
    assert fed_d.sizes == want


def test_default_temperature_is_one():
    target, draft = _small_target_and_draft()
    spy = Spy()
    speculative_generate(target, draft, [1, 2], 3, k=2, verify=spy,
                         generator=torch.Generator().manual_seed(0))
    p, _, drafted, _ = spy.rounds[0]
    with torch.no_grad():
        want = torch.softmax(target(torch.tensor([[1, 2] + drafted]))[0, 1:].double(), dim=-1)
    assert (p - want).abs().max() < 1e-6


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(prompt=[]), ValueError, "prompts[0] is empty, expected at least one token id"),
    (dict(prompt=[1, 16]), ValueError,
     "prompts[0] = [1, 16]... holds a value that is not a token id in [0, 16)"),
    (dict(temperature=-1.0), ValueError, "temperature is -1.0, expected a number >= 0 (0 = greedy)"),
    (dict(top_k=0), ValueError, "top_k is 0, expected a positive int"),
    (dict(top_p=2.0), ValueError, "top_p is 2.0, expected a probability in (0, 1]"),
    (dict(generator=3), TypeError, "generator is a int, expected a torch.Generator"),
])
def test_bad_prompts_and_rules_are_refused_before_any_pass(kwargs, error, message):
    target, draft = _small_target_and_draft()
    for model in (target, draft):
        model.forward_cached = lambda *a, **k: pytest.fail("a model ran before the checks")
    args = dict(prompt=[1], max_new_tokens=3, k=2) | kwargs
    with pytest.raises(error, match=full(message)):
        speculative_generate(target, draft, **args)


def test_a_tensor_prompt_is_accepted():
    target, draft = _small_target_and_draft()
    a = speculative_generate(target, draft, torch.tensor([1, 2]), 4, k=2, temperature=0)[0]
    assert a == speculative_generate(target, draft, [1, 2], 4, k=2, temperature=0)[0]


def test_verify_round_checks_every_row_once_before_its_loop():
    p, q = torch.tensor([[0.5, 0.5], [0.2, 0.8]]), torch.tensor([[0.6, 0.6]])
    with pytest.raises(ValueError, match=r"^q has a row summing to 1 \+- 0.200000 or negative entries"):
        verify_round(p, q, [0])
    with pytest.raises(ValueError, match=r"^drafted is \[2\], expected token ids in 0 \.\. 1"):
        verify_round(p, torch.tensor([[0.4, 0.6]]), [2])
    assert verify_round(p, torch.tensor([[0.5, 0.5]]), [1], torch.Generator().manual_seed(0))[0] == 1
