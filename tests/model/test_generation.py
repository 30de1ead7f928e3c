"""helpers.model.generation: sample_next's distribution against softmax(logits / T) with top-k,
its edges (T = 0, tiny T, top_k = 1, ties, top_k >= V), and generate's loop run for many steps,
past the context length, against a plain loop that recomputes the whole window every step.

 The model has an untied, scaled output matrix so that
its next-token distributions are far from uniform (a wrong temperature or window shows).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from shared_tools import full, tiny_ids, tiny_model

from helpers.model.generation import generate, sample_next
from helpers.model.gpt import GPT, GPTConfig

CONTEXT = 5


def peaked_model(dropout: float = 0.0) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, context_length=CONTEXT, n_layers=2, n_heads=2, d_model=8,
                          tie_weights=False, dropout=dropout))
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # logits spread over several units, not all near 0
    return model


def frequencies(logits_row: list[float], n: int = 4000, seed: int = 0, **kwargs) -> torch.Tensor:
    """How often each token is drawn from n copies of one row of logits."""
    logits = torch.tensor([logits_row]).repeat(n, 1)
    drawn = sample_next(logits, generator=torch.Generator().manual_seed(seed), **kwargs)
    assert drawn.shape == (n, 1) and drawn.dtype == torch.long
    return torch.bincount(drawn[:, 0], minlength=len(logits_row)).double() / n


def expected(logits_row: list[float], temperature: float, keep: list[int] | None = None) -> torch.Tensor:
    logits = torch.tensor(logits_row, dtype=torch.float64) / temperature
    if keep is not None:
        mask = torch.full_like(logits, float("-inf"))
        mask[keep] = 0
        logits = logits + mask
    return F.softmax(logits, dim=-1)


ROW = [1.0, 0.0, -1.0, 0.5]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_sampling_follows_softmax_of_logits_over_temperature(temperature):
    got = frequencies(ROW, temperature=temperature)
    torch.testing.assert_close(got, expected(ROW, temperature), atol=0.035, rtol=0)


def test_the_default_temperature_is_one():
    torch.testing.assert_close(frequencies(ROW), expected(ROW, 1.0), atol=0.035, rtol=0)


@pytest.mark.parametrize("top_k, keep", [(2, [0, 3]), (3, [0, 1, 3])])
def test_top_k_draws_from_the_k_best_only(top_k, keep):
    got = frequencies(ROW, temperature=1.0, top_k=top_k)
    torch.testing.assert_close(got, expected(ROW, 1.0, keep), atol=0.035, rtol=0)


@pytest.mark.parametrize("top_k", [4, 9])
def test_top_k_of_the_whole_vocabulary_or_more_keeps_every_token(top_k):
    got = frequencies(ROW, temperature=1.0, top_k=top_k)
    torch.testing.assert_close(got, expected(ROW, 1.0), atol=0.035, rtol=0)


def test_top_k_below_the_vocabulary_cuts_even_when_the_batch_is_small():
    # B = 2 < V = 4: the cut compares top_k with the vocabulary, not with the batch
    generator = torch.Generator().manual_seed(0)
    logits = torch.zeros(2, 4)
    drawn = torch.cat([sample_next(logits, top_k=2, generator=generator) for _ in range(60)])
    assert set(drawn.flatten().tolist()) == {0, 1}


def test_sampling_names_its_softmax_axis_and_warns_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an implicit softmax dim warns (deprecated)
        sample_next(torch.zeros(2, 3), generator=torch.Generator().manual_seed(0))
        sample_next(torch.zeros(2, 3), top_k=2, generator=torch.Generator().manual_seed(0))


def test_top_k_among_many_equal_logits_keeps_the_lowest_ids():
    got = frequencies([0.0] * 40, temperature=1.0, top_k=3)  # 40 ties: an unstable sort shuffles
    torch.testing.assert_close(got[:3], torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.035, rtol=0)
    assert got[3:].sum() == 0


def test_greedy_edges_pick_the_lowest_id_of_the_best():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 5.0, 5.0]])
    best = torch.tensor([[1], [0]])
    assert torch.equal(sample_next(logits, temperature=0.0), best)
    assert torch.equal(sample_next(logits, temperature=0), best)
    rows = logits.repeat(500, 1)
    # top_k = 1 is greedy at any temperature, even a flattening one
    assert torch.equal(sample_next(rows, temperature=50.0, top_k=1,
                                   generator=torch.Generator().manual_seed(0)), best.repeat(500, 1))


@pytest.mark.parametrize("temperature", [1e-40, 1e-50, 1e-320])
def test_a_tiny_temperature_is_greedy_in_float64_never_nan(temperature):
    # 1e-50 is 0 in float32 (0 / 0 = NaN without the float64 step); 1e-320 overflows 1 / T to
    # inf unless each row's maximum is subtracted first.
    logits = torch.tensor([[1.0, 0.5, -2.0], [-3.0, 4.0, 3.5]]).repeat(100, 1)
    drawn = sample_next(logits, temperature=temperature, generator=torch.Generator().manual_seed(0))
    assert torch.equal(drawn, torch.tensor([[0], [1]]).repeat(100, 1))


def test_large_logits_with_a_small_temperature_sample_the_best_two():
    # rows whose maximum differs: keepdim=False would subtract each row's maximum from a column
    logits = torch.tensor([[1000.0, 1000.0, 0.0], [0.0, 7.0, 7.0]]).repeat(1000, 1)
    drawn = sample_next(logits, temperature=0.5, generator=torch.Generator().manual_seed(0))
    first, second = drawn[0::2, 0], drawn[1::2, 0]
    assert set(first.tolist()) == {0, 1} and set(second.tolist()) == {1, 2}


def test_the_generator_alone_decides_the_draw():
    logits = torch.tensor([ROW] * 50)
    torch.manual_seed(1)
    a = sample_next(logits, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(2)
    b = sample_next(logits, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("logits, error, message", [
    ([1.0, 2.0], TypeError, "logits is a list, expected a torch.Tensor (B, V)"),
    (torch.ones(2, 3, dtype=torch.long), TypeError,
     "logits has dtype torch.int64, expected a floating-point tensor"),
    (torch.ones(3), ValueError, "logits has shape (3,), expected (B, V) with a vocabulary of V >= 1 tokens"),
    (torch.ones(2, 0), ValueError, "logits has shape (2, 0), expected (B, V) with a vocabulary of V >= 1 tokens"),
    (torch.ones(1, 2, 3), ValueError, "logits has shape (1, 2, 3), expected (B, V) with a vocabulary"),
])
def test_bad_logits_are_refused_by_name(logits, error, message):
    with pytest.raises(error, match="^" + re.escape(message)):
        sample_next(logits)


def test_a_single_token_vocabulary_is_fine():
    assert torch.equal(sample_next(torch.zeros(2, 1)), torch.zeros(2, 1, dtype=torch.long))


def test_nan_logits_name_the_first_row_with_a_nan():
    logits = torch.zeros(4, 5)
    logits[1, 2] = logits[2, 4] = float("nan")
    with pytest.raises(ValueError, match=r"^logits row 1 contains NaN: the model computed NaN \(check "
                                         r"its weights with torch.isfinite\); no token can be chosen "
                                         r"from it$"):
        sample_next(logits)


@pytest.mark.parametrize("bad, shown", [(float("-inf"), "-inf"), (float("inf"), "inf")])
def test_a_row_without_a_finite_best_logit_is_refused(bad, shown):
    logits = torch.zeros(4, 3)
    logits[2] = float("-inf")
    logits[2, 1] = bad
    logits[3] = bad
    with pytest.raises(ValueError, match=rf"^logits row 2 has best value {shown}, expected a finite "
                                         r"maximum: with every logit -inf \(or one \+inf\) no "
                                         r"distribution is defined$"):
        sample_next(logits)
    logits[2:] = 0
    logits[1, 0] = float("-inf")  # one -inf among finite logits is fine: that token is never drawn
    assert (sample_next(logits.repeat(100, 1), generator=torch.Generator().manual_seed(0))[1::4] != 0).all()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=-0.5), ValueError, "temperature is -0.5, expected a number >= 0 (0 = greedy)"),
    (dict(temperature=float("inf")), ValueError, "temperature is inf, expected a number >= 0 (0 = greedy)"),
    (dict(temperature="hot"), TypeError, "temperature is 'hot' (a str), expected a number >= 0 (0 = greedy)"),
    (dict(top_k=0), ValueError, "top_k is 0, expected a positive int"),
    (dict(top_k=2.0), TypeError, "top_k is 2.0 (a float), expected a positive int"),
])
def test_bad_sampling_arguments_are_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=full(message)):
        sample_next(torch.zeros(1, 3), **kwargs)


# --- generate -------------------------------------------------------------------------------

def plain_loop(model: GPT, prompt: torch.Tensor, steps: int, pick) -> torch.Tensor:
    """The definition: recompute the last window every step, pick the next token from its logits."""
    ids = prompt
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, pick(model(ids[:, -CONTEXT:])[:, -1])], dim=1)
    return ids


def spy_on_cached(model: GPT) -> list[int]:
    """Record how many tokens each forward_cached call is fed."""
    fed: list[int] = []
    original = model.forward_cached

    def recording(token_ids, cache, *args, **kwargs):
        fed.append(token_ids.shape[1])
        return original(token_ids, cache, *args, **kwargs)

    model.forward_cached = recording
    return fed


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("prompt_length", [1, 3, 7])
def test_greedy_generation_past_the_context_equals_the_plain_loop(use_cache, prompt_length):
    model = peaked_model().eval()
    prompt = torch.randint(0, 11, (2, prompt_length), generator=torch.Generator().manual_seed(1))
    out = generate(model, prompt, 9, temperature=0.0, use_cache=use_cache)
    reference = plain_loop(model, prompt, 9, lambda logits: logits.argmax(-1, keepdim=True))
    assert out.shape == (2, prompt_length + 9)
    assert torch.equal(out, reference)
    assert len(set(out[:, prompt_length:].flatten().tolist())) > 1  # the test sees several tokens


def test_the_cache_is_fed_one_token_until_full_then_refilled_from_the_window():
    model = peaked_model().eval()
    fed = spy_on_cached(model)
    generate(model, torch.zeros(1, 3, dtype=torch.long), 6, temperature=0.0)
    assert fed == [3, 1, 1, 5, 5, 5]
    fed.clear()
    generate(model, torch.zeros(1, 1, dtype=torch.long), 3, temperature=0.0)
    assert fed == [1, 1, 1]
    fed.clear()
    generate(model, torch.zeros(1, 1, dtype=torch.long), 2, temperature=0.0, use_cache=False)
    assert fed == []


@pytest.mark.parametrize("use_cache", [True, False])
def test_sampled_generation_equals_the_plain_loop_with_the_same_generator(use_cache):
    model = peaked_model().eval()
    prompt = torch.randint(0, 11, (8, 2), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)  # the global generator must not matter
    out = generate(model, prompt, 8, generator=torch.Generator().manual_seed(0), use_cache=use_cache)
    picker = torch.Generator().manual_seed(0)
    reference = plain_loop(model, prompt, 8, lambda logits: sample_next(logits, 1.0, None, picker))
    assert torch.equal(out, reference)
    hotter = plain_loop(model, prompt, 8, lambda logits: sample_next(
        logits, 2.0, None, torch.Generator().manual_seed(0)))
    assert not torch.equal(out, hotter)  # so a wrong default temperature shows


def test_generate_passes_temperature_and_top_k_to_the_sampler():
    model = peaked_model().eval()
    prompt = torch.randint(0, 11, (8, 2), generator=torch.Generator().manual_seed(1))
    greedy = generate(model, prompt, 6, temperature=0.0)
    assert torch.equal(generate(model, prompt, 6, temperature=30.0, top_k=1,
                                generator=torch.Generator().manual_seed(0)), greedy)
    picker = torch.Generator().manual_seed(0)
    reference = plain_loop(model, prompt, 6, lambda logits: sample_next(logits, 0.7, 3, picker))
    assert torch.equal(generate(model, prompt, 6, temperature=0.7, top_k=3,
                                generator=torch.Generator().manual_seed(0)), reference)


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_runs_in_eval_mode_and_restores_the_mode(use_cache):
    model = peaked_model(dropout=0.5)
    prompt = torch.randint(0, 11, (2, 2), generator=torch.Generator().manual_seed(1))
    model.train()
    out = generate(model, prompt, 6, temperature=0.0, use_cache=use_cache)
    assert model.training and all(m.training for m in model.modules())
    model.eval()
    assert torch.equal(out, plain_loop(model, prompt, 6, lambda logits: logits.argmax(-1, keepdim=True)))
    generate(model, prompt, 2, temperature=0.0, use_cache=use_cache)
    assert not any(m.training for m in model.modules())


@pytest.mark.parametrize("call, error, message", [
    (lambda m: generate(m, torch.zeros(1, 2, dtype=torch.long), 0), ValueError,
     "max_new_tokens is 0, expected a positive int"),
    (lambda m: generate(m, torch.zeros(1, 2, dtype=torch.long), 2, use_cache="yes"), TypeError,
     "use_cache is 'yes' (a str), expected True or False"),
    (lambda m: generate(m, [[1, 2]], 2), TypeError,
     "prompt is a list, expected a (B, N) tensor of token ids, e.g. torch.tensor([ids])"),
    (lambda m: generate(m, torch.zeros(3, dtype=torch.long), 2), ValueError,
     "prompt has shape (3,), expected (B, N) with N >= 1"),
    (lambda m: generate(m, torch.zeros(1, 0, dtype=torch.long), 2), ValueError,
     "prompt has shape (1, 0), expected (B, N) with N >= 1"),
    (lambda m: generate(m, torch.zeros(1, 1, 2, dtype=torch.long), 2), ValueError,
     "prompt has shape (1, 1, 2), expected (B, N) with N >= 1"),
    (lambda m: generate(m, torch.tensor([[3, 11]]), 2), ValueError,
     "prompt contains the id 11, expected ids in [0, 10] for a vocabulary of 11 tokens"),
])
def test_generate_refuses_bad_arguments_by_name(call, error, message):
    model = peaked_model()
    model.train()
    with pytest.raises(error, match=full(message)):
        call(model)
    assert model.training


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=-1.0), ValueError, "temperature is -1.0, expected a number >= 0 (0 = greedy)"),
    (dict(top_k=0), ValueError, "top_k is 0, expected a positive int"),
    (dict(generator=7), TypeError, "generator is a int, expected a torch.Generator"),
])
def test_generate_refuses_bad_sampling_arguments_before_any_forward_pass(kwargs, error, message):
    model = peaked_model().eval()
    passes = []
    model.register_forward_pre_hook(lambda module, args: passes.append(1))
    fed = spy_on_cached(model)
    for use_cache in (True, False):
        with pytest.raises(error, match=full(message)):
            generate(model, torch.zeros(1, 2, dtype=torch.long), 3, use_cache=use_cache, **kwargs)
    assert passes == [] and fed == []


def test_sample_next_refuses_a_generator_that_is_not_one():
    with pytest.raises(TypeError, match=r"^generator is a int, expected a torch.Generator$"):
        sample_next(torch.zeros(1, 3), generator=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampling_refuses_nan_logits_instead_of_picking_them(temperature):
    logits = torch.tensor([[0.5, float("nan"), 0.1], [0.2, 0.3, 0.1]])
    with pytest.raises(ValueError, match="logits row 0 contains NaN"):
        sample_next(logits, temperature=temperature)


def test_generate_stops_on_a_model_with_a_nan_weight():
    model = tiny_model()
    with torch.no_grad():
        model.blocks[0].mlp.up.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="logits row 0 contains NaN"):
        generate(model, tiny_ids(), 3, temperature=0.0)


def test_top_k_keeps_exactly_k_tokens_and_breaks_ties_by_the_lower_id():
    logits = torch.tensor([[5.0, 1.0, 5.0, 5.0, 0.0]]).expand(2000, 5)
    drawn = sample_next(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(drawn.flatten().tolist()) == {0, 2}  # of the three tied best (0, 2, 3), the two lowest ids


def test_a_tiny_temperature_is_greedy_not_nan():
    logits = torch.tensor([[0.1, 2.0, 1.9], [3.0, -1.0, 0.0]])
    drawn = sample_next(logits, temperature=1e-40, generator=torch.Generator().manual_seed(0))
    assert drawn.flatten().tolist() == [1, 0]


@pytest.mark.parametrize("logits, error, match", [
    (torch.full((2, 4), float("-inf")), ValueError, "logits row 0 has best value -inf"),
    (torch.zeros(1, 0), ValueError, r"logits has shape \(1, 0\), expected \(B, V\) with a vocabulary of V >= 1"),
    ([[0.1, 0.2]], TypeError, "logits is a list"),
])
def test_sampling_names_logits_it_cannot_sample_from(logits, error, match):
    with pytest.raises(error, match=match):
        sample_next(logits)


def test_generate_names_a_list_prompt():
    with pytest.raises(TypeError, match=r"prompt is a list, expected a \(B, N\) tensor"):
        generate(tiny_model(), [[1, 2, 3]], 2)
