"""Notebook 10's encoder-decoder: shapes, masks, beam search against exhaustive search, bad input."""

from __future__ import annotations

import pytest
import torch

from helpers.families.seq2seq import (
    EncoderDecoder,
    Seq2SeqConfig,
    beam_search,
    exhaustive_search,
    greedy_decode,
    sequence_log_prob,
)
from helpers.model.multihead import MultiHeadAttention

SMALL = Seq2SeqConfig(source_vocab_size=13, target_vocab_size=11, context_length=12, n_layers=2,
                      n_heads=2, d_model=16)


def small_model(seed: int = 0, **changes) -> EncoderDecoder:
    torch.manual_seed(seed)
    return EncoderDecoder(Seq2SeqConfig(**{**SMALL.__dict__, **changes})).eval()


def ids(batch: int, length: int, vocab: int, seed: int = 1, low: int = 3) -> torch.Tensor:
    return torch.randint(low, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_shapes_and_cross_attention_weights():
    model = small_model()
    source, target = ids(3, 7, 13), ids(3, 5, 11)
    logits = model(source, target)
    assert logits.shape == (3, 5, 11)
    assert model.cross_attention_weights().shape == (2, 3, 2, 5, 7)  # (L, B, H, N, M)
    assert all(isinstance(layer.cross_attn, MultiHeadAttention) for layer in model.decoder)


def test_padding_the_source_changes_nothing():
    model = small_model()
    source, target = ids(2, 6, 13), ids(2, 4, 11)
    padded = torch.cat([source, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    assert torch.allclose(model(source, target), model(padded, target), atol=1e-6)
    other_padding = padded.clone()
    other_padding[:, 6:] = 5  # different tokens under an explicit mask that hides them
    mask = padded != 0
    assert torch.allclose(model(padded, target), model(other_padding, target, mask), atol=1e-6)
    # without the mask the same change does reach the output: the test can fail
    assert not torch.allclose(model(padded, target), model(other_padding, target), atol=1e-4)


def test_a_future_target_token_changes_nothing_before_it():
    model = small_model()
    source, target = ids(2, 6, 13), ids(2, 6, 11)
    changed = target.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 11
    before, after = model(source, target), model(source, changed)
    assert torch.allclose(before[:, :4], after[:, :4], atol=1e-6)
    assert not torch.allclose(before[:, 4:], after[:, 4:], atol=1e-4)


def test_every_source_token_reaches_every_target_position():
    model = small_model()
    source, target = ids(1, 6, 13), ids(1, 3, 11)
    changed = source.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 13  # the last source token
    assert not torch.allclose(model(source, target)[:, 0], model(changed, target)[:, 0], atol=1e-5)


def test_greedy_is_beam_search_of_width_one():
    model = small_model(seed=3)
    source = ids(1, 5, 13)[0]
    greedy = greedy_decode(model, source[None], max_length=6)[0]
    greedy = greedy[:int((greedy == 2).nonzero()[0]) + 1] if (greedy == 2).any() else greedy
    beam, score = beam_search(model, source, beam_width=1, max_length=6)
    assert torch.equal(beam, greedy)
    assert score == pytest.approx(sequence_log_prob(model, source, beam), abs=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_beam_search_matches_exhaustive_search_on_a_tiny_vocabulary(seed):
    model = small_model(seed=seed, target_vocab_size=5)
    source = ids(1, 4, 13, seed=seed)[0]
    best, best_score = exhaustive_search(model, source, max_length=2)
    beam, beam_score = beam_search(model, source, beam_width=5, max_length=2)  # width V: exhaustive
    assert torch.equal(beam, best) and beam_score == pytest.approx(best_score, abs=1e-5)
    best3, best3_score = exhaustive_search(model, source, max_length=3)
    for width in (1, 2, 3):
        _, score = beam_search(model, source, beam_width=width, max_length=3)
        assert score <= best3_score + 1e-5


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_at_least_as_likely_as_greedy_here(seed):
    model = small_model(seed=seed)
    source = ids(1, 5, 13, seed=seed)[0]
    greedy = greedy_decode(model, source[None], max_length=5)[0]
    greedy = greedy[:int((greedy == 2).nonzero()[0]) + 1] if (greedy == 2).any() else greedy
    _, beam_score = beam_search(model, source, beam_width=4, max_length=5)
    assert beam_score >= sequence_log_prob(model, source, greedy) - 1e-5


# --- bad input ------------------------------------------------------------------------------

def test_source_and_target_batches_of_different_sizes():
    with pytest.raises(ValueError, match="batch sizes must match"):
        small_model()(ids(2, 5, 13), ids(3, 4, 11))


def test_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"source_mask has shape \(2, 4\), expected \(2, 5\)"):
        small_model()(ids(2, 5, 13), ids(2, 4, 11), torch.ones(2, 4, dtype=torch.bool))


def test_a_mask_that_marks_padding_as_a_real_token_is_refused():
    model = small_model()
    source = ids(2, 5, 13)
    source[1, 3:] = model.config.pad_id
    with pytest.raises(ValueError, match=r"^source_mask marks the padding id 0 as a real token at "
                                         r"\(row, position\) \[\[1, 3\], \[1, 4\]\]"):
        model.encode(source, torch.ones(2, 5, dtype=torch.bool))
    memory, mask = model.encode(source, source != model.config.pad_id)
    assert memory.shape[:2] == (2, 5) and mask[1].tolist() == [True, True, True, False, False]


def test_an_empty_sentence():
    model = small_model()
    with pytest.raises(ValueError, match="empty sentences"):
        model(torch.tensor([[3, 4], [0, 0]]), ids(2, 3, 11))
    with pytest.raises(ValueError, match="M >= 1"):
        model(torch.zeros(2, 0, dtype=torch.long), ids(2, 3, 11))
    with pytest.raises(ValueError, match="not empty"):
        beam_search(model, torch.zeros(0, dtype=torch.long), beam_width=2, max_length=3)


def test_a_token_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"source contains the id 13, expected ids in \[0, 12\]"):
        small_model()(torch.tensor([[3, 13]]), ids(1, 3, 11))
    with pytest.raises(ValueError, match="target_in contains the id 11"):
        small_model()(ids(1, 3, 13), torch.tensor([[1, 11]]))


@pytest.mark.parametrize("width, match", [(0, "beam_width"), (12, "at most the target vocabulary size 11")])
def test_a_beam_width_of_zero_or_above_the_vocabulary(width, match):
    with pytest.raises(ValueError, match=match):
        beam_search(small_model(), ids(1, 4, 13)[0], beam_width=width, max_length=3)
