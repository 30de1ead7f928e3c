"""Notebook 10's data and the other two models: the Grammish task, the GRU, MLM masking."""

from __future__ import annotations

import random

import pytest
import torch

from helpers.families.mlm import IGNORE, Classifier, MaskedLM, mask_tokens, swap_neighbours
from helpers.families.rnn import GRUSeq2Seq, gru_greedy_decode
from helpers.families.seq2seq import Encoder
from helpers.families.translation import (
    EOS_ID,
    PAD_ID,
    TranslationData,
    english_words,
    make_batch,
    make_lexicon,
    pad_batch,
    score_translations,
    sentence_splits,
    translate_words,
)
from helpers.text.corpus import is_well_formed

SENTENCES = ["Near the river, Maya saw a golden lamp.", "Luca loved to sing songs with Amara.",
             "The dog barked happily.", '"Oh no!" said Ada.']


def test_the_rule_reorders_drops_articles_and_adds_suffixes():
    data = TranslationData(SENTENCES)
    g = {tuple(english): grammish for english, grammish in zip(data.english, data.grammish, strict=True)}
    near = g[tuple(english_words(SENTENCES[0]))]
    lex = data.lexicon
    # "near river , maya lamp golden saw -ta ."  (verb last in its clause, adjective after noun)
    assert near == [lex["near"], lex["river"], ",", lex["maya"], lex["lamp"], lex["golden"],
                    lex["saw"], "-ta", "."]
    assert g[tuple(english_words(SENTENCES[1]))][3:5] == [lex["song"], "-ne"]


def test_the_lexicon_is_one_to_one_and_fixed_by_its_seed():
    words = ["dog", "cat", "box", "key"]
    lexicon = make_lexicon(words)
    assert len(set(lexicon.values())) == len(words) and lexicon == make_lexicon(reversed(words))
    assert make_lexicon(words, seed=1) != lexicon


def test_splits_share_no_sentence_and_cover_all():
    train, val, test = sentence_splits(100)
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert sorted(train + val + test) == list(range(100))


def test_batches_shift_the_target_by_one():
    data = TranslationData(SENTENCES)
    source, target_in, target = make_batch(data, [0, 2])
    assert target_in[0, 0] == 1 and torch.equal(target_in[:, 1:][target[:, :-1] != EOS_ID],
                                                target[:, :-1][target[:, :-1] != EOS_ID])
    assert (target == EOS_ID).sum() == 2 and source.shape[0] == 2


def test_scores_count_exact_matches_and_tokens():
    target = torch.tensor([[5, 6, EOS_ID], [5, EOS_ID, PAD_ID]])
    exact, tokens = score_translations(torch.tensor([[5, 6, EOS_ID], [5, 7, PAD_ID]]), target)
    assert exact.tolist() == [True, False] and tokens.tolist() == [1.0, 0.5]


def test_an_empty_sentence_and_an_unknown_word_are_refused():
    with pytest.raises(ValueError, match="at least one word"):
        english_words("  ")
    with pytest.raises(ValueError, match="empty sentence"):
        pad_batch([[3], []])
    with pytest.raises(ValueError, match="not in this vocabulary"):
        TranslationData(SENTENCES).source_vocab.encode(["zebra"])


def test_translate_keeps_punctuation_as_clause_ends():
    assert translate_words(["hi", ",", "there"], {"hi": "bo", "there": "ka"}) == ["bo", ",", "ka"]


def test_the_gru_ignores_padding_and_decodes():
    torch.manual_seed(0)
    gru = GRUSeq2Seq(10, 9, hidden=8).eval()
    source = torch.tensor([[3, 4, 5]])
    padded = torch.tensor([[3, 4, 5, 0, 0]])
    assert torch.allclose(gru.encode(source), gru.encode(padded), atol=1e-6)
    assert gru_greedy_decode(gru, padded, max_length=4).shape[0] == 1
    with pytest.raises(ValueError, match="batch sizes must match"):
        gru(source, torch.tensor([[1, 2], [1, 2]]))


def test_mlm_masking_follows_the_80_10_10_rule():
    ids = torch.randint(5, 50, (400, 50), generator=torch.Generator().manual_seed(0))
    ids[:, 45:] = 0
    inputs, labels = mask_tokens(ids, mask_id=4, vocab_size=50, first_word_id=5,
                                 generator=torch.Generator().manual_seed(1))
    picked = labels != IGNORE
    assert not picked[:, 45:].any() and abs(picked.float().mean().item() / 0.9 - 0.15) < 0.01
    masked = (inputs == 4) & picked
    kept = (inputs == ids) & picked
    assert abs(masked.sum() / picked.sum() - 0.8) < 0.02
    assert abs(kept.sum() / picked.sum() - 0.1 - 0.1 / 45) < 0.02  # a random word may be the same
    assert torch.equal(inputs[~picked], ids[~picked])


def test_the_encoder_heads_have_the_right_shapes():
    encoder = Encoder(20, 8, n_layers=1, n_heads=2, d_model=8)
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0]])
    assert MaskedLM(encoder, 20)(ids).shape == (2, 4, 20)
    assert Classifier(encoder, 2)(ids).shape == (2, 2)


def test_a_swapped_sentence_breaks_the_grammar():
    rng = random.Random(0)
    for sentence in SENTENCES:
        swapped = swap_neighbours(sentence, rng)
        assert swapped is not None and swapped != sentence and not is_well_formed(swapped)
        assert is_well_formed(sentence)


def test_training_lowers_the_loss_and_needs_real_steps():
    from helpers.families.seq2seq import EncoderDecoder, Seq2SeqConfig
    from helpers.families.translation import train_translator

    data = TranslationData(SENTENCES)
    config = Seq2SeqConfig(data.source_vocab.vocab_size, data.target_vocab.vocab_size,
                           context_length=16, n_layers=1, n_heads=2, d_model=16)
    torch.manual_seed(0)
    losses = train_translator(EncoderDecoder(config), data, range(4), steps=80, batch_size=4, lr=1e-2)
    assert len(losses) == 80 and losses[-1] < losses[0] / 2
    with pytest.raises(ValueError, match="steps"):
        train_translator(EncoderDecoder(config), data, range(4), steps=0)
    with pytest.raises(ValueError, match="leave 0 for training"):
        sentence_splits(2)
