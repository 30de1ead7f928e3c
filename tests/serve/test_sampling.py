"""Sampling rules equal transformers' logits processors; batched generation equals one prompt
at a time (helpers.serve.sampling, helpers.serve.batching; notebook 14, sections 1-2)."""

from __future__ import annotations

import math

import pytest
import torch
from shared_tools import full

from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.serve import sampling
from helpers.serve.batching import generate_batch, left_pad, position_ids

transformers = pytest.importorskip("transformers")


def _logits(seed: int, rows: int = 4, vocab: int = 50) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _reference_probs(logits, temperature, top_k, top_p, min_p):
    warpers = [transformers.TemperatureLogitsWarper(temperature)]
    if top_k is not None:
        warpers.append(transformers.TopKLogitsWarper(top_k))
    if top_p is not None:
        warpers.append(transformers.TopPLogitsWarper(top_p))
    if min_p is not None:
        warpers.append(transformers.MinPLogitsWarper(min_p))
    scores = logits.clone()
    for warper in warpers:
        scores = warper(None, scores)
    return torch.softmax(scores.double(), dim=-1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rule", [dict(temperature=0.7), dict(temperature=1.3, top_k=5),
                                  dict(temperature=1.0, top_p=0.8), dict(temperature=0.5, min_p=0.1),
                                  dict(temperature=1.2, top_k=20, top_p=0.9, min_p=0.05)])
def test_distribution_equals_transformers_processors(seed, rule):
    logits = _logits(seed)
    ours = sampling.distribution(logits, **rule)
    full = dict(temperature=1.0, top_k=None, top_p=None, min_p=None) | rule
    theirs = _reference_probs(logits, **full)
    assert torch.equal(ours > 0, theirs > 0)  # the same tokens kept
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_top_p_with_ties_at_the_edge_keeps_the_same_probabilities_as_transformers():
    """Three tokens tie for second place and the nucleus takes one of them: both keep two tokens
    with the same probabilities; ours keeps the lowest id of the tied ones."""
    logits = torch.tensor([[2.0, 1.0, 1.0, 1.0, 0.0]])
    ours = sampling.distribution(logits, top_p=0.6)
    theirs = _reference_probs(logits, 1.0, None, 0.6, None)
    assert (ours > 0).sum() == (theirs > 0).sum() == 2
    assert torch.allclose(ours.sort(descending=True).values, theirs.sort(descending=True).values, atol=1e-12)
    assert (ours[0] > 0).tolist() == [True, True, False, False, False]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = sampling.distribution(logits, top_p=0.75) > 0
    assert kept.tolist() == [[True, True, False, False]]
    assert (sampling.distribution(logits, top_p=1.0) > 0).all()
    assert (sampling.distribution(logits, top_p=1e-9) > 0).sum() == 1


def test_the_generator_owns_the_randomness():
    logits = _logits(0)
    first = sampling.sample(logits, top_p=0.9, generator=torch.Generator().manual_seed(5))
    again = sampling.sample(logits, top_p=0.9, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first, again)
    assert torch.equal(sampling.sample(logits, temperature=0), logits.argmax(dim=-1))


@pytest.mark.parametrize("call, error", [
    (lambda: sampling.top_p_filter(_logits(0), 0.0), ValueError),
    (lambda: sampling.top_p_filter(_logits(0), 1.5), ValueError),
    (lambda: sampling.top_k_filter(_logits(0), 0), ValueError),
    (lambda: sampling.min_p_filter(_logits(0), -0.1), ValueError),
    (lambda: sampling.apply_temperature(_logits(0), 0.0), ValueError),
    (lambda: sampling.distribution(torch.tensor([[float("nan"), 0.0]])), ValueError),
    (lambda: sampling.distribution(torch.tensor([[1, 2]])), TypeError),
    (lambda: sampling.sample(_logits(0), generator=5), TypeError),
])
def test_bad_sampling_arguments_are_refused(call, error):
    with pytest.raises(error):
        call()


def test_top_p_error_names_the_argument():
    with pytest.raises(ValueError, match=r"top_p is 1.5, expected a probability in \(0, 1\]"):
        sampling.top_p_filter(_logits(0), 1.5)


def test_left_padding_mask_and_positions():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[True, True, True], [False, False, True]]
    assert position_ids(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.mark.parametrize("seed", range(3))
def test_batched_greedy_equals_each_prompt_alone(seed):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=24, context_length=32, n_layers=2, n_heads=2, d_model=32)).eval()
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 24, (n,), generator=gen).tolist() for n in (1, 7, 3, 12)]
    batched = generate_batch(model, prompts, 8)
    for prompt, row in zip(prompts, batched, strict=True):
        alone = generate(model, torch.tensor([prompt]), 8, temperature=0)[0, len(prompt):]
        assert row == alone.tolist()


def test_batched_generation_refuses_bad_prompts():
    model = GPT(GPTConfig(vocab_size=24, context_length=16, n_layers=1, n_heads=2, d_model=16))
    with pytest.raises(ValueError, match="empty"):
        generate_batch(model, [[1, 2], []], 3)
    with pytest.raises(ValueError, match="context_length"):
        generate_batch(model, [[1] * 14], 3)
    with pytest.raises(ValueError, match="token id"):
        generate_batch(model, [[99]], 3)


# helpers.serve.sampling, exactly:
#
# Each rule at its exact boundary against the transformers logits processor of the same name
# (probabilities that are powers of two, so the cut falls exactly on a token), the defaults of
# `distribution` and `sample` asserted, the dtype and shape the checks return, and every error
# message read in full.

HALF_QUARTERS = torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64).log()  # exact in float64


def kept(logits: torch.Tensor) -> list[list[bool]]:
    return (logits > -math.inf).tolist()


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
