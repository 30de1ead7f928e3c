"""Speculative decoding's output distribution is the target's, exactly (enumeration) and in the
loop on two GPTs (helpers.serve.speculative; notebook 14, section 6)."""

import itertools
import math

import pytest
import torch

from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.serve.speculative import (
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
    monkeypatch.setattr(spec_module, "acceptance_probability", lambda p, q, x: 1.0)
    target, draft = _toy(0)
    spec = spec_module.exact_distribution(target, draft, (0,), k=2, n_tokens=2)
    plain = autoregressive_distribution(target, (0,), n_tokens=2)
    assert max(abs(spec[path] - plain[path]) for path in plain) > 1e-3


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
        patch.setattr(spec_module, "acceptance_probability", lambda p, q, x: 1.0)  # always accept
        assert p_value() < 1e-6
    with monkeypatch.context() as patch:
        patch.setattr(spec_module, "residual", lambda p, q: p.clone())  # redraw from p, not p - q
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
