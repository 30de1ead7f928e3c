"""helpers.serve.sampling: the gaps its mutation run found (benchmarks/MUTATION.md).

Each rule at its exact boundary against the transformers logits processor of the same name
(probabilities that are powers of two, so the cut falls exactly on a token), the defaults of
`distribution` and `sample` asserted, the dtype and shape the checks return, and every error
message read in full.
"""

from __future__ import annotations

import math

import pytest
import torch
from shared_tools import full

from helpers.serve import sampling

transformers = pytest.importorskip("transformers")

HALF_QUARTERS = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64).log()  # exact in float64


def kept(logits: torch.Tensor) -> list[list[bool]]:
    return (logits > -math.inf).tolist()


# --- each rule at its boundary, against transformers -----------------------------------------

def test_top_p_drops_a_token_when_the_mass_above_it_equals_p():
    """0.5 above the first 0.25: p = 0.5 is reached, so both quarters go (transformers agrees)."""
    ours = sampling.top_p_filter(HALF_QUARTERS, 0.5)
    theirs = transformers.TopPLogitsWarper(0.5)(None, HALF_QUARTERS.clone())
    assert kept(ours) == kept(theirs) == [[True, False, False]]
    assert kept(sampling.top_p_filter(HALF_QUARTERS, 0.75)) == [[True, True, False]]


def test_top_p_keeps_the_most_likely_token_even_when_it_alone_passes_p():
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    assert kept(sampling.top_p_filter(logits, 1e-6)) == [[False, True, False]]


def test_top_p_breaks_ties_by_the_lower_id():
    """Equal tokens, p = 0.5: the first half in id order are kept, a stable sort's choice (an
    unstable sort of 4096 ties puts other ids first; each holds exactly 2^-12 of the mass)."""
    assert kept(sampling.top_p_filter(torch.zeros(1, 4), 0.5)) == [[True, True, False, False]]
    out = sampling.top_p_filter(torch.zeros(1, 4096), 0.5)
    assert kept(out)[0] == [True] * 2048 + [False] * 2048


def test_min_p_keeps_a_token_exactly_min_p_times_the_best():
    ours = sampling.min_p_filter(HALF_QUARTERS, 0.5)  # 0.25 == 0.5 x 0.5: kept
    theirs = transformers.MinPLogitsWarper(0.5)(None, HALF_QUARTERS.clone())
    assert kept(ours) == kept(theirs) == [[True, True, True]]
    assert kept(sampling.min_p_filter(HALF_QUARTERS, 0.51)) == [[True, False, False]]


def test_min_p_ends_of_its_range_are_accepted():
    assert kept(sampling.min_p_filter(HALF_QUARTERS, 0.0)) == [[True, True, True]]
    assert kept(sampling.min_p_filter(HALF_QUARTERS, 1.0)) == [[True, False, False]]


def test_top_k_keeps_ties_with_the_kth():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    ours = sampling.top_k_filter(logits, 2)
    theirs = transformers.TopKLogitsWarper(2)(None, logits.clone())
    assert kept(ours) == kept(theirs) == [[True, False, True, True, False]]
    assert ours.dtype == torch.float64
    assert torch.equal(ours[ours > -math.inf], logits.double()[ours > -math.inf])  # values unchanged


def test_top_k_of_the_whole_vocabulary_or_more_keeps_everything():
    logits = torch.tensor([[3.0, 1.0, 2.0]])
    for top_k in (3, 4):
        out = sampling.top_k_filter(logits, top_k)
        assert out.dtype == torch.float64 and torch.equal(out, logits.double())


def test_temperature_divides_and_works_in_float64():
    logits = torch.tensor([[1.0, -2.0, 4.0]])
    out = sampling.apply_temperature(logits, 0.5)
    assert out.dtype == torch.float64 and out.tolist() == [[2.0, -4.0, 8.0]]


# --- defaults and greedy ----------------------------------------------------------------------

def test_distribution_defaults_are_plain_softmax():
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    out = sampling.distribution(logits)
    assert out.dtype == torch.float64
    assert (out - torch.softmax(logits.double(), dim=-1)).abs().max() < 1e-15


def test_distribution_applies_each_rule_it_is_given():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert (sampling.distribution(logits, top_k=2) > 0).tolist() == [[True, True, False, False, False]]
    assert (sampling.distribution(logits, top_p=0.5) > 0).sum() == 1
    assert (sampling.distribution(logits, min_p=0.3) > 0).tolist() == [[True, True, False, False, False]]


def test_greedy_distribution_puts_all_mass_on_the_lowest_id_among_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]])
    out = sampling.distribution(logits, temperature=0)
    assert out.dtype == torch.float64 and out.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert sampling.sample(logits, temperature=0).tolist() == [1, 0]


def test_sample_defaults_draw_from_the_plain_softmax_with_the_generator():
    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1))
    got = sampling.sample(logits, generator=torch.Generator().manual_seed(7))
    want = torch.multinomial(torch.softmax(logits.double(), dim=-1), 1,
                             generator=torch.Generator().manual_seed(7)).squeeze(-1)
    assert got.shape == (4,) and torch.equal(got, want)


@pytest.mark.parametrize("name, value", [("top_k", 2), ("top_p", 0.6), ("min_p", 0.2)])
def test_sample_passes_each_rule_on(name, value):
    logits = torch.tensor([[2.0, 1.9, 0.0, -1.0]])
    probs = sampling.distribution(logits, **{name: value})
    draws = sampling.sample(logits.expand(200, 4), generator=torch.Generator().manual_seed(0),
                            **{name: value})
    assert set(draws.tolist()) == set(probs[0].nonzero().flatten().tolist())


def test_sample_at_a_low_temperature_still_samples():
    logits = torch.zeros(1, 4).expand(64, 4)
    draws = sampling.sample(logits, temperature=0.5, generator=torch.Generator().manual_seed(0))
    assert len(set(draws.tolist())) > 1


# --- shapes and checks --------------------------------------------------------------------------

def test_an_empty_batch_passes_the_checks():
    assert sampling.check_logits(torch.zeros(0, 3)).shape == (0, 3)


def test_a_vector_is_one_row_and_one_token_is_a_vocabulary():
    assert sampling.check_logits(torch.tensor([1.0, 2.0])).shape == (1, 2)
    rows = torch.zeros(2, 3)
    assert sampling.check_logits(rows) is rows
    assert sampling.distribution(torch.tensor([[0.5]])).tolist() == [[1.0]]
    assert sampling.distribution(torch.tensor([1.0, 1.0])).tolist() == [[0.5, 0.5]]


def test_a_row_with_one_minus_inf_is_fine():
    out = sampling.distribution(torch.tensor([[0.0, -math.inf]]))
    assert out.tolist() == [[1.0, 0.0]]


@pytest.mark.parametrize("call, error, message", [
    (lambda: sampling.check_logits([1.0]), TypeError,
     "logits is a list, expected a torch.Tensor (B, V)"),
    (lambda: sampling.check_logits(torch.tensor([1, 2]), "scores"), TypeError,
     "scores has dtype torch.int64, expected a floating-point tensor"),
    (lambda: sampling.check_logits(torch.zeros(1, 2, 3)), ValueError,
     "logits has shape (1, 2, 3), expected (B, V) or (V,) with V >= 1"),
    (lambda: sampling.check_logits(torch.zeros(())), ValueError,
     "logits has shape (), expected (B, V) or (V,) with V >= 1"),
    (lambda: sampling.check_logits(torch.zeros(2, 0)), ValueError,
     "logits has shape (2, 0), expected (B, V) or (V,) with V >= 1"),
    (lambda: sampling.check_logits(torch.tensor([0.0, math.nan])), ValueError,
     "logits contains NaN: no distribution can be made from it"),
    (lambda: sampling.check_logits(torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]])), ValueError,
     "a row of logits has no finite maximum (all -inf, or a +inf): no distribution is defined"),
    (lambda: sampling.check_logits(torch.tensor([0.0, math.inf])), ValueError,
     "a row of logits has no finite maximum (all -inf, or a +inf): no distribution is defined"),
    (lambda: sampling.apply_temperature(torch.zeros(1, 2), 0), ValueError,
     "temperature is 0, expected a finite number > 0 (use temperature=0 in sample() for greedy)"),
    (lambda: sampling.top_k_filter(torch.zeros(1, 2), 0), ValueError,
     "top_k is 0, expected a positive int"),
    (lambda: sampling.top_p_filter(torch.zeros(1, 2), 0.0), ValueError,
     "top_p is 0.0, expected a probability in (0, 1]"),
    (lambda: sampling.min_p_filter(torch.zeros(1, 2), 1.5), ValueError,
     "min_p is 1.5, expected a fraction in [0, 1]"),
    (lambda: sampling.distribution(torch.zeros(1, 2), temperature=-1), ValueError,
     "temperature is -1, expected a number >= 0 (0 = greedy)"),
    (lambda: sampling.distribution(torch.zeros(1, 2), temperature=math.inf), ValueError,
     "temperature is inf, expected a number >= 0 (0 = greedy)"),
    (lambda: sampling.sample(torch.zeros(1, 2), generator=5), TypeError,
     "generator is a int, expected a torch.Generator"),
])
def test_error_messages_in_full(call, error, message):
    with pytest.raises(error, match=full(message)):
        call()


def test_sample_checks_the_generator_before_the_logits():
    with pytest.raises(TypeError, match="generator"):
        sampling.sample("not logits", generator="nor a generator")


# --- check_rule: the same checks, before a loop's first forward pass ------------------------------

def test_check_rule_accepts_what_sample_accepts():
    assert sampling.check_rule() is None
    sampling.check_rule(0, 1, 1.0, 0.0, torch.Generator())
    sampling.check_rule(2.5, 3, 1e-9, 1.0)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(generator=5), TypeError, "generator is a int, expected a torch.Generator"),
    (dict(temperature=-0.1), ValueError, "temperature is -0.1, expected a number >= 0 (0 = greedy)"),
    (dict(temperature=math.inf), ValueError, "temperature is inf, expected a number >= 0 (0 = greedy)"),
    (dict(top_k=0), ValueError, "top_k is 0, expected a positive int"),
    (dict(temperature=0, top_k=0), ValueError, "top_k is 0, expected a positive int"),
    (dict(top_p=0.0), ValueError, "top_p is 0.0, expected a probability in (0, 1]"),
    (dict(top_p=1.01), ValueError, "top_p is 1.01, expected a probability in (0, 1]"),
    (dict(min_p=-0.5), ValueError, "min_p is -0.5, expected a fraction in [0, 1]"),
    (dict(min_p=1.5), ValueError, "min_p is 1.5, expected a fraction in [0, 1]"),
])
def test_check_rule_errors_equal_the_filters(kwargs, error, message):
    with pytest.raises(error, match=full(message)):
        sampling.check_rule(**kwargs)
