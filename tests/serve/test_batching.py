"""helpers.serve.batching, exactly:

Sampled batched generation against a reference that runs each row alone without padding or
cache and samples the stacked logits with the same generator (so temperature, top-k, top-p,
min-p and the generator must all reach `sample`), forward_rows against the model's own forward,
the context filled exactly, the pad id and prompt forms accepted, and every message in full.
"""

from __future__ import annotations

import pytest
import torch
from shared_tools import full

from helpers.model.gpt import GPT, GPTConfig
from helpers.serve import sampling
from helpers.serve.batching import (
    check_prompts,
    forward_rows,
    generate_batch,
    left_pad,
    position_ids,
)

VOCAB = 24


def _model(context: int = 24) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, context_length=context, n_layers=2, n_heads=2,
                         d_model=16)).eval()


def _reference(model, prompts, steps, seed, **rule):
    """Each row alone through the model's full forward; the rows' last logits sampled together."""
    gen = torch.Generator().manual_seed(seed)
    rows = [list(p) for p in prompts]
    new = [[] for _ in rows]
    with torch.no_grad():
        for _ in range(steps):
            logits = torch.stack([model(torch.tensor([row]))[0, -1] for row in rows])
            for b, t in enumerate(sampling.sample(logits, generator=gen, **rule).tolist()):
                rows[b].append(t)
                new[b].append(t)
    return new


PROMPTS = [[3, 1, 4, 1, 5], [9], [2, 6, 5]]


@pytest.mark.parametrize("rule", [dict(temperature=1.0), dict(temperature=0.8, top_k=4),
                                  dict(temperature=1.5, top_p=0.7), dict(temperature=1.2, min_p=0.9)])
def test_sampled_batch_equals_each_row_alone_with_the_same_generator(rule):
    model = _model()
    got = generate_batch(model, PROMPTS, 5, generator=torch.Generator().manual_seed(1), **rule)
    assert got == _reference(model, PROMPTS, 5, 1, **rule)


def test_default_is_greedy():
    model = _model()
    assert generate_batch(model, PROMPTS, 4) == _reference(model, PROMPTS, 4, 0, temperature=0)


def test_the_context_can_be_filled_exactly_and_not_beyond():
    model = _model(context=8)
    assert len(generate_batch(model, [[1, 2, 3]], 5)[0]) == 5
    with pytest.raises(ValueError, match=full("the longest prompt plus max_new_tokens is 9 tokens, "
                                              "expected at most context_length = 8")):
        generate_batch(model, [[1], [1, 2, 3]], 6)


def test_generation_puts_the_model_in_eval_mode():
    model = _model().train()
    generate_batch(model, [[1]], 1)
    assert not model.training


def test_tensor_prompts_are_accepted():
    model = _model()
    assert generate_batch(model, [torch.tensor([3, 1, 4]), [9]], 3) == \
        generate_batch(model, [[3, 1, 4], [9]], 3)


@pytest.mark.parametrize("call, error, message", [
    (lambda m: generate_batch(m, [[1]], 0), ValueError, "max_new_tokens is 0, expected a positive int"),
    (lambda m: generate_batch(m, [[1, 24]], 1), ValueError,
     "prompts[0] = [1, 24]... holds a value that is not a token id in [0, 24)"),
])
def test_generate_errors_in_full(call, error, message):
    with pytest.raises(error, match=full(message)):
        call(_model())


# --- prompts, padding, positions -----------------------------------------------------------------

def test_check_prompts_returns_lists():
    assert check_prompts([(1, 2), torch.tensor([3])], 4) == [[1, 2], [3]]
    assert check_prompts([[0, 3]], 4) == [[0, 3]]


@pytest.mark.parametrize("prompts, message", [
    ([], "prompts is list of length 0, expected a non-empty list of prompts, each a list of token ids"),
    (torch.tensor([[1, 2]]), "prompts is Tensor of length 1, expected a non-empty list of prompts, "
                             "each a list of token ids"),
    ({1: [1]}, "prompts is dict of length 1, expected a non-empty list of prompts, each a list of "
               "token ids"),
    (5, "prompts is int of length ?, expected a non-empty list of prompts, each a list of token ids"),
    ([[1], []], "prompts[1] is empty, expected at least one token id"),
    ([[1], [0, 1, 2, 3, 4, 5, 6, 7, 8, -1]],
     "prompts[1] = [0, 1, 2, 3, 4, 5, 6, 7]... holds a value that is not a token id in [0, 10)"),
    ([[1, 2.0]], "prompts[0] = [1, 2.0]... holds a value that is not a token id in [0, 10)"),
    ([[10]], "prompts[0] = [10]... holds a value that is not a token id in [0, 10)"),
])
def test_check_prompts_errors_in_full(prompts, message):
    with pytest.raises(ValueError, match=full(message)):
        check_prompts(prompts, 10)


def test_left_pad_with_a_pad_id_and_any_width():
    ids, mask = left_pad([[5], [6, 7, 8, 9]], pad_id=3)
    assert ids.dtype == torch.long and ids.tolist() == [[3, 3, 3, 5], [6, 7, 8, 9]]
    assert mask.dtype == torch.bool and mask.tolist() == [[False, False, False, True], [True] * 4]
    ids, mask = left_pad([[2**40, 7]])
    assert ids.tolist() == [[2**40, 7]] and mask.all()
    with pytest.raises(ValueError, match=full("pad_id is -1, expected an int >= 0")):
        left_pad([[1]], pad_id=-1)


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert position_ids(mask).dtype == torch.long


@pytest.mark.parametrize("mask, shown", [
    (torch.ones(2, 3, dtype=torch.long), "torch.Size([2, 3])"),
    (torch.ones(3, dtype=torch.bool), "torch.Size([3])"),
    ([[True]], "[[True]]"),
])
def test_position_ids_errors_in_full(mask, shown):
    with pytest.raises(ValueError, match=full(f"attention_mask is {shown}, expected a (B, N) "
                                              "torch.bool tensor, True at real tokens")):
        position_ids(mask)


# --- forward_rows ---------------------------------------------------------------------------------

def test_forward_rows_without_a_cache_is_the_models_forward():
    model = _model()
    ids = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    positions = torch.arange(4).expand(2, 4)
    causal = torch.ones(4, 4, dtype=torch.bool).tril().expand(2, 4, 4)
    with torch.no_grad():
        got, want = forward_rows(model, ids, positions, causal), model(ids)
    assert got.shape == (2, 4, VOCAB) and (got - want).abs().max() < 1e-5


def test_forward_rows_uses_each_rows_positions_and_mask():
    """A row shifted right by pads, with positions restarting at 0 and the pads masked, gives
    the logits of the row alone."""
    model = _model()
    ids = torch.tensor([[0, 0, 7, 8], [1, 2, 3, 4]])
    positions = torch.tensor([[0, 0, 0, 1], [0, 1, 2, 3]])
    real = torch.tensor([[False, False, True, True], [True] * 4])
    mask = torch.ones(4, 4, dtype=torch.bool).tril() & real.unsqueeze(1) | torch.eye(4, dtype=torch.bool)
    with torch.no_grad():
        got = forward_rows(model, ids, positions, mask)
        alone = model(torch.tensor([[7, 8]]))[0]
    assert (got[0, 2:] - alone).abs().max() < 1e-5


def test_forward_rows_position_at_the_last_context_slot():
    model = _model(context=6)
    ids = torch.tensor([[1]])
    with torch.no_grad():
        forward_rows(model, ids, torch.tensor([[5]]), torch.ones(1, 1, 1, dtype=torch.bool))
        forward_rows(model, ids, torch.tensor([[0]]), torch.ones(1, 1, 1, dtype=torch.bool))


@pytest.mark.parametrize("ids, positions, mask, message", [
    (torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 2, 2, dtype=torch.bool),
     "token_ids has shape (1, 2) and positions (1, 3), expected the same (B, n)"),
    (torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.ones(1, 2, 2, dtype=torch.bool),
     "token_ids has shape (2,) and positions (2,), expected the same (B, n)"),
    (torch.zeros(1, 1, dtype=torch.long), torch.tensor([[6]]), torch.ones(1, 1, 1, dtype=torch.bool),
     "positions reach 6, expected positions in [0, context_length = 6)"),
    (torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-1, 2]]), torch.ones(1, 2, 2, dtype=torch.bool),
     "positions reach 2, expected positions in [0, context_length = 6)"),
    (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 1),
     "mask has shape (1, 1, 1) and dtype torch.float32, expected bool (B, n, M) with (B, n) = (1, 1)"),
    (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool),
     "mask has shape (1, 1) and dtype torch.bool, expected bool (B, n, M) with (B, n) = (1, 1)"),
    (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.ones(2, 1, 1, dtype=torch.bool),
     "mask has shape (2, 1, 1) and dtype torch.bool, expected bool (B, n, M) with (B, n) = (1, 1)"),
])
def test_forward_rows_errors_in_full(ids, positions, mask, message):
    with pytest.raises(ValueError, match=full(message)):
        forward_rows(_model(context=6), ids, positions, mask)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=-1.0), ValueError, "temperature is -1.0, expected a number >= 0 (0 = greedy)"),
    (dict(temperature=0, top_k=0), ValueError, "top_k is 0, expected a positive int"),
    (dict(temperature=1.0, top_p=0.0), ValueError, "top_p is 0.0, expected a probability in (0, 1]"),
    (dict(temperature=1.0, min_p=2.0), ValueError, "min_p is 2.0, expected a fraction in [0, 1]"),
    (dict(generator="seed"), TypeError, "generator is a str, expected a torch.Generator"),
])
def test_bad_sampling_arguments_are_refused_before_any_pass(kwargs, error, message):
    model = _model()
    model.forward = lambda *a, **k: pytest.fail("the model ran before the checks")
    model.blocks[0].forward = model.forward
    with pytest.raises(error, match=full(message)):
        generate_batch(model, [[1, 2]], 2, **kwargs)


def test_left_pad_ids_stay_below_2_to_the_62():
    """left_pad knows no vocabulary: it takes any id below 2^62 (an int64 with room to spare)."""
    assert left_pad([[2**62 - 1]])[0].tolist() == [[2**62 - 1]]
    with pytest.raises(ValueError, match=full(f"prompts[0] = [{2**62}]... holds a value that is not "
                                              f"a token id in [0, {2**62})")):
        left_pad([[2**62]])


def test_left_pad_default_pad_id_is_0():
    ids, _ = left_pad([[5], [6, 7]])
    assert ids.tolist() == [[0, 5], [6, 7]]


def test_forward_rows_follows_the_mask_alone():
    """With a full mask the first token sees the later ones (no causal mask is added): its logits
    change, while the last token, which sees everything either way, keeps its causal logits
    (one layer, so that the other tokens' changed outputs do not reach it)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, context_length=8, n_layers=1, n_heads=2, d_model=16)).eval()
    ids = torch.tensor([[3, 1, 4, 1]])
    positions = torch.arange(4).view(1, 4)
    with torch.no_grad():
        everything = forward_rows(model, ids, positions, torch.ones(1, 4, 4, dtype=torch.bool))
        causal = forward_rows(model, ids, positions, torch.ones(1, 4, 4, dtype=torch.bool).tril())
    assert (everything[0, -1] - causal[0, -1]).abs().max() < 1e-5
    assert (everything[0, 0] - causal[0, 0]).abs().max() > 1e-3
