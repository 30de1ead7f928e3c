"""Notebook 10's modules (helpers/families) end bad input in a clear error, before any work."""

from __future__ import annotations

import pytest
import torch

from helpers.families.mlm import Classifier, MaskedLM, mask_tokens
from helpers.families.rnn import AttentionGRUSeq2Seq, GRUSeq2Seq, gru_greedy_decode
from helpers.families.seq2seq import (
    Encoder,
    EncoderDecoder,
    Seq2SeqConfig,
    beam_search,
    exhaustive_search,
    greedy_decode,
    sequence_log_prob,
)
from helpers.families.translation import (
    TranslationData,
    score_translations,
    sentence_splits,
    train_translator,
)

SENTENCES = ["The dog barked.", "Mia found a red box.", "Tom saw the old tree.", "The cat sat."]


def small_seq2seq(**changes) -> EncoderDecoder:
    torch.manual_seed(0)
    settings = dict(source_vocab_size=13, target_vocab_size=11, context_length=8, n_layers=1,
                    n_heads=2, d_model=8)
    return EncoderDecoder(Seq2SeqConfig(**{**settings, **changes})).eval()


# --- special-token ids that coincide, ids outside the vocabulary ------------------------------

@pytest.mark.parametrize("ids", [dict(pad_id=0, bos_id=0, eos_id=0), dict(pad_id=1, bos_id=1, eos_id=2),
                                 dict(pad_id=0, bos_id=2, eos_id=2)])
def test_special_ids_that_coincide(ids):
    with pytest.raises(ValueError, match="special ids coincide"):
        Seq2SeqConfig(13, 11, **ids)
    with pytest.raises(ValueError, match="special ids coincide"):
        GRUSeq2Seq(13, 11, hidden=4, **ids)
    with pytest.raises(ValueError, match="special ids coincide"):
        AttentionGRUSeq2Seq(13, 11, hidden=4, **ids)


def test_special_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match="eos_id is 11, outside target_vocab_size 11"):
        Seq2SeqConfig(13, 11, eos_id=11)
    with pytest.raises(ValueError, match="pad_id is 5, outside source_vocab_size 5"):
        GRUSeq2Seq(5, 11, hidden=4, pad_id=5, bos_id=1, eos_id=2)


def test_a_mask_id_outside_the_vocabulary_or_among_the_words():
    ids = torch.tensor([[5, 6, 7, 0]])
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="mask_id is 50, expected a special token's id below first_word_id = 5"):
        mask_tokens(ids, mask_id=50, vocab_size=20, first_word_id=5, generator=generator)
    with pytest.raises(ValueError, match="mask_id is 7"):
        mask_tokens(ids, mask_id=7, vocab_size=20, first_word_id=5, generator=generator)
    with pytest.raises(ValueError, match="mask_id and pad_id are both 0"):
        mask_tokens(ids, mask_id=0, vocab_size=20, first_word_id=5, generator=generator)
    with pytest.raises(ValueError, match="first_word_id"):
        mask_tokens(ids, mask_id=4, vocab_size=20, first_word_id=20, generator=generator)
    with pytest.raises(ValueError, match="ids contains the id 25"):
        mask_tokens(torch.tensor([[25]]), mask_id=4, vocab_size=20, first_word_id=5, generator=generator)


# --- split fractions that leave a split empty ---------------------------------------------------

@pytest.mark.parametrize("fractions, match", [((0.5, 0.5), "leave 0 for training"),
                                              ((0.0, 0.1), r"fractions\[0\]"),
                                              ((0.1, -0.2), r"fractions\[1\]"),
                                              ((0.1, float("nan")), r"fractions\[1\]"),
                                              ((0.1,), "expected \\(validation share, test share\\)")])
def test_split_fractions_that_leave_a_split_empty(fractions, match):
    with pytest.raises(ValueError, match=match):
        sentence_splits(10, fractions)
    train, val, test = sentence_splits(10, (0.3, 0.3))
    assert len(train) == 4 and len(val) == len(test) == 3  # the edge that still works


# --- a left-padded source for the GRUs, rows of padding only ------------------------------------

@pytest.mark.parametrize("cls", [GRUSeq2Seq, AttentionGRUSeq2Seq])
def test_a_left_padded_source_for_the_gru(cls):
    model = cls(10, 9, hidden=8)
    with pytest.raises(ValueError, match=r"source rows \[1\] have padding before a real token"):
        model(torch.tensor([[3, 4, 5], [0, 4, 5]]), torch.tensor([[1, 3], [1, 3]]))
    with pytest.raises(ValueError, match="right-padded"):
        gru_greedy_decode(model, torch.tensor([[3, 0, 5]]), max_length=3)


@pytest.mark.parametrize("cls", [GRUSeq2Seq, AttentionGRUSeq2Seq])
def test_a_padding_only_row_for_the_gru(cls):
    with pytest.raises(ValueError, match=r"source rows \[0\] hold padding only"):
        cls(10, 9, hidden=8)(torch.tensor([[0, 0], [3, 4]]), torch.tensor([[1, 3], [1, 3]]))


def test_rows_of_padding_only_never_give_nan():
    encoder = Encoder(20, 8, n_layers=1, n_heads=2, d_model=8)
    ids = torch.tensor([[5, 6, 0], [0, 0, 0]])
    for model in (MaskedLM(encoder, 20), Classifier(encoder, 2)):
        with pytest.raises(ValueError, match=r"source rows \[1\] are empty sentences"):
            model(ids)
    with pytest.raises(ValueError, match=r"target rows \[1\] hold padding only"):
        score_translations(torch.tensor([[5, 2], [5, 2]]), torch.tensor([[5, 2], [0, 0]]))
    with pytest.raises(ValueError, match="predicted has 1 rows and target 2"):
        score_translations(torch.tensor([[5, 2]]), torch.tensor([[5, 2], [5, 2]]))


# --- the translator stops after a NaN loss, as the Trainer does ---------------------------------

def test_the_translator_stops_on_a_nan_loss():
    data = TranslationData(SENTENCES)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=8)
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    before = model.source_embed.weight.clone()
    with pytest.raises(FloatingPointError, match="training loss is nan at step 0"):
        train_translator(model, data, range(4), steps=5, batch_size=2)
    assert torch.equal(model.source_embed.weight, before)  # no update was made


@pytest.mark.parametrize("changes, match", [(dict(lr=float("nan")), "lr"), (dict(lr=-1.0), "lr"),
                                            (dict(batch_size=9), "larger than the 4 training"),
                                            (dict(label_smoothing=1.0), "label_smoothing")])
def test_the_translator_refuses_nonsense_settings(changes, match):
    data = TranslationData(SENTENCES)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=8)
    with pytest.raises(ValueError, match=match):
        train_translator(model, data, range(4), **{"steps": 2, "batch_size": 2, **changes})


# --- the decoders' max_length past the context, or 0 --------------------------------------------

@pytest.mark.parametrize("max_length, match", [(0, "max_length"), (9, "past the model's context_length 8"),
                                               (-3, "max_length")])
def test_decoders_refuse_a_max_length_past_the_context_or_zero(max_length, match):
    model = small_seq2seq()
    source = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match=match):
        greedy_decode(model, source, max_length)
    with pytest.raises(ValueError, match=match):
        beam_search(model, source[0], beam_width=2, max_length=max_length)
    with pytest.raises(ValueError, match="max_length"):
        gru_greedy_decode(GRUSeq2Seq(13, 11, hidden=4), source, 0)
    assert greedy_decode(model, source, 8).shape[1] <= 8  # the context's own length still works


def test_sequence_log_prob_and_exhaustive_search_refuse_bad_outputs():
    model = small_seq2seq()
    source = torch.tensor([3, 4, 5])
    with pytest.raises(ValueError, match="past the model's context_length"):
        sequence_log_prob(model, source, torch.full((9,), 3))
    with pytest.raises(ValueError, match="output contains the id 11"):
        sequence_log_prob(model, source, torch.tensor([3, 11]))
    with pytest.raises(ValueError, match="non-empty 1-D"):
        sequence_log_prob(model, source, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="exhaustive search is for tiny"):
        exhaustive_search(model, source, max_length=8)


# --- what a careless user tried beyond the list --------------------------------------------------

def test_batch_indices_outside_the_data_and_a_sentence_that_is_not_text():
    import random

    from helpers.families.mlm import swap_neighbours
    from helpers.families.translation import make_batch

    data = TranslationData(SENTENCES)
    with pytest.raises(ValueError, match=r"indices holds \[4\]: expected a non-empty list of example numbers in \[0, 3\]"):
        make_batch(data, [0, 4])
    with pytest.raises(ValueError, match="indices holds nothing"):
        make_batch(data, [])
    with pytest.raises(TypeError, match="sentence is a list"):
        swap_neighbours(["The", "dog"], random.Random(0))
    with pytest.raises(TypeError, match="source has dtype torch.float32"):
        GRUSeq2Seq(10, 9, hidden=4)(torch.tensor([[3.0, 4.0]]), torch.tensor([[1, 3]]))
