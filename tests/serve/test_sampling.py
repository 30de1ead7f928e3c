"""Sampling rules equal transformers' logits processors; batched generation equals one prompt
at a time (helpers.serve.sampling, helpers.serve.batching; notebook 14, sections 1-2)."""

import pytest
import torch

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
