"""Notebook 10's data and the other two models: the Grammish task, the GRU, MLM masking."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from helpers.families.mlm import IGNORE, Classifier, MaskedLM, mask_tokens, swap_neighbours
from helpers.families.rnn import GRUSeq2Seq, gru_greedy_decode
from helpers.families.seq2seq import Encoder
from helpers.families.translation import (
    _SYLLABLES,
    BOS_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    PAST,
    PLURAL,
    SPECIALS,
    UNK_ID,
    TranslationData,
    WordVocab,
    _reorder_clause,
    check_special_ids,
    english_words,
    make_batch,
    make_lexicon,
    pad_batch,
    score_translations,
    sentence_splits,
    train_translator,
    translate_words,
)
from helpers.text.corpus import is_well_formed
from helpers.training.trainer import learning_rate

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


# helpers.families.translation: Grammish's six steps on crafted clauses, the vocabularies, the
# splits, the batches, training against a loop written out here, and scoring by hand.
#
# Training is
# checked step for step against the same recipe written here with torch's AdamW, cross_entropy and
# clip_grad_norm_ (the reference), on a GRU of width 4 for three steps.

SHORT_SENTENCES = ["Near the river, Maya saw a golden lamp.", "Luca loved to sing songs with Amara.",
             "The dog barked happily.", '"Oh no!" said Ada.', "Tom found two red books."]


def _message(excinfo) -> str:
    return str(excinfo.value)


def test_check_special_ids_messages_and_edges():
    check_special_ids(0, 1, 2, {"a": 3, "b": 3})  # the last id of each vocabulary is inside
    check_special_ids(7, 8, 9, {})  # no vocabulary: only the three checks
    with pytest.raises(ValueError) as excinfo:
        check_special_ids(0, 1, 2, {"source_vocab_size": 10, "target_vocab_size": 2})
    assert _message(excinfo) == "eos_id is 2, outside target_vocab_size 2: expected an id in [0, 1]"
    with pytest.raises(ValueError) as excinfo:
        check_special_ids(3, 1, 2, {"v": 3})
    assert _message(excinfo) == "pad_id is 3, outside v 3: expected an id in [0, 2]"
    with pytest.raises(ValueError) as excinfo:
        check_special_ids(0, 1, 1, {"v": 5})
    assert _message(excinfo) == ("the special ids coincide (pad_id=0, bos_id=1, eos_id=1): expected three "
                                 "different ids, or padding would read as the end of a sentence")
    for name, args in (("pad_id", (-1, 1, 2)), ("bos_id", (0, -1, 2)), ("eos_id", (0, 1, -1))):
        with pytest.raises(ValueError) as excinfo:
            check_special_ids(*args, {"v": 5})
        assert _message(excinfo).startswith(f"{name} ") and "XX" not in _message(excinfo)


def test_english_words():
    assert english_words('"Oh no!" said Ada, at 5.') == ['"', "oh", "no", "!", '"', "said", "ada", ",", "at", "5", "."]
    assert english_words("  The  DOG  ") == ["the", "dog"]
    with pytest.raises(TypeError) as excinfo:
        english_words(["The"])
    assert _message(excinfo) == "sentence is a list, expected a str"
    with pytest.raises(ValueError) as excinfo:
        english_words("   ")
    assert _message(excinfo) == "sentence is '   ', expected at least one word"


def test_make_lexicon_is_one_to_one_fixed_by_the_seed_and_made_of_two_or_three_syllables():
    words = [f"w{i}" for i in range(60)] + ["ba", "baba", "dede"]
    lexicon = make_lexicon(words)
    assert set(lexicon) == set(words)
    assert len(set(lexicon.values())) == len(words)  # one-to-one
    assert all(made != word for word, made in lexicon.items())
    syllables = set(_SYLLABLES)
    lengths = set()
    for made in lexicon.values():
        parts = [made[i:i + 2] for i in range(0, len(made), 2)]
        assert all(p in syllables for p in parts)
        lengths.add(len(parts))
    assert lengths == {2, 3}
    assert make_lexicon(reversed(words)) == lexicon == make_lexicon(words, seed=2014)  # sorted first
    assert make_lexicon(words, seed=2015) != lexicon


def test_make_lexicon_draws_in_sorted_order_from_the_seed():
    rng = random.Random(7)
    expected = {}
    for word in ["ant", "bee", "cat"]:
        expected[word] = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3))))
    assert len(set(expected.values())) == 3  # no collision with this seed: one draw each
    assert make_lexicon(["cat", "bee", "ant", "bee"], seed=7) == expected


def test_make_lexicon_redraws_a_made_up_word_already_used():
    seed = 39405  # searched for: its first two draws are the same made-up word
    rng = random.Random(seed)
    first, second = ("".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3)))) for _ in range(2))
    assert first == second
    lexicon = make_lexicon(["a1", "a2"], seed=seed)
    assert lexicon["a1"] == first and lexicon["a2"] != first and len(set(lexicon.values())) == 2


def test_make_lexicon_redraws_a_made_up_word_equal_to_its_word():
    rng = random.Random(3)
    first = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3))))
    lexicon = make_lexicon([first], seed=3)
    assert lexicon[first] != first


@pytest.mark.parametrize("clause, expected", [
    (["the", "red", "box"], ["box", "red"]),                          # article dropped, adjective after
    (["red"], ["red"]),                                                # an adjective with no noun
    (["a", "big", "red", "box"], ["big", "box", "red"]),             # two adjectives: the second one moves
    (["the", "dog", "was", "red"], ["dog", "red", "was", PAST]),      # adjective before nothing stays
    (["red", "barked"], ["red", "barked", PAST]),                     # an adjective before a verb stays
    (["tom", "saw", "mia", "ran"], ["tom", "mia", "ran", "saw", PAST]),  # only the first verb moves
    (["tom", "found", "two", "books"], ["tom", "two", "book", PLURAL, "found", PAST]),
    (["old", "trees", "fell"], ["tree", PLURAL, "old", "fell", PAST]),
    ([], []),
])
def test_reorder_clause(clause, expected):
    assert _reorder_clause(clause) == expected


def test_translate_words_closes_a_clause_at_each_mark_and_keeps_the_suffixes():
    lexicon = {"tom": "TOM", "saw": "SAW", "box": "BOX", "red": "RED", "book": "BOOK", "ran": "RAN"}
    assert translate_words(["tom", "saw", "the", "red", "box", ",", "tom", "ran", "."], lexicon) == \
        ["TOM", "BOX", "RED", "SAW", PAST, ",", "TOM", "RAN", PAST, "."]
    assert translate_words(["books", "unknown"], lexicon) == ["BOOK", PLURAL, "unknown"]  # no mark at the end
    assert translate_words(["tom", "saw"], {**lexicon, PAST: "xx", PLURAL: "yy"}) == ["TOM", "SAW", PAST]
    assert translate_words(("!",), lexicon) == ["!"]


def test_word_vocab():
    vocab = WordVocab(["dog", "cat", "dog", "<eos>", "ant"])
    assert vocab.itos == list(SPECIALS) + ["ant", "cat", "dog"] and vocab.vocab_size == 8
    assert vocab.stoi == {w: i for i, w in enumerate(vocab.itos)}
    assert vocab.encode(["cat", "<eos>", "ant"]) == [6, 2, 5]
    with pytest.raises(ValueError) as excinfo:
        vocab.encode(["cat", "x", "y", "z", "w"])
    assert _message(excinfo) == "words contains ['x', 'y', 'z'], which are not in this vocabulary of 8 words"
    assert vocab.decode([BOS_ID, 5, PAD_ID, UNK_ID, MASK_ID, 7, EOS_ID, 6]) == ["ant", "<unk>", "<mask>", "dog"]
    assert vocab.decode(torch.tensor([7, 6])) == ["dog", "cat"]
    for bad in (8, -1):
        with pytest.raises(ValueError) as excinfo:
            vocab.decode([5, bad])
        assert _message(excinfo) == f"ids contains {bad}, expected ids in [0, 7]"
    assert vocab.decode([]) == []


def test_translation_data_and_its_pairs():
    data = TranslationData(SHORT_SENTENCES)
    assert data.sentences == SHORT_SENTENCES and data.english[0] == english_words(SHORT_SENTENCES[0])
    # the lexicon holds the singular words, no articles, no marks
    assert "book" in data.lexicon and "books" not in data.lexicon and "the" not in data.lexicon
    assert "." not in data.lexicon and "tom" in data.lexicon
    assert data.grammish[4] == translate_words(data.english[4], data.lexicon)
    assert data.grammish[4][-3:] == ["found" if False else data.lexicon["found"], PAST, "."]
    source, target = data.pair(4)
    assert source == data.source_vocab.encode(data.english[4])
    assert target == data.target_vocab.encode(data.grammish[4]) + [EOS_ID]
    assert set(data.source_vocab.itos) == set(SPECIALS) | {w for ws in data.english for w in ws}
    assert set(data.target_vocab.itos) == set(SPECIALS) | {w for ws in data.grammish for w in ws}


def test_sentence_splits_by_hand():
    train, val, test = sentence_splits(50, (0.1, 0.2), seed=3)
    order = list(range(50))
    random.Random(3).shuffle(order)
    assert (val, test, train) == (order[:5], order[5:15], order[15:])
    assert sentence_splits(50) == sentence_splits(50, (0.1, 0.1), seed=0)
    train, val, test = sentence_splits(50)
    order = list(range(50))
    random.Random(0).shuffle(order)
    assert (val, test, train) == (order[:5], order[5:10], order[10:])
    train, val, test = sentence_splits(3, (0.01, 0.01))  # each share at least one sentence
    assert len(train) == len(val) == len(test) == 1
    with pytest.raises(ValueError) as excinfo:
        sentence_splits(2, (0.01, 0.01))
    assert _message(excinfo) == ("fractions (0.01, 0.01) of 2 sentences leave 0 for training: expected every "
                                 "split to hold at least one sentence (smaller fractions, or more sentences)")
    with pytest.raises(ValueError) as excinfo:
        sentence_splits(10, [0.1, 0.1, 0.1])
    assert _message(excinfo) == "fractions is [0.1, 0.1, 0.1], expected (validation share, test share)"
    with pytest.raises(ValueError) as excinfo:
        sentence_splits(10, 0.1)
    assert _message(excinfo) == "fractions is 0.1, expected (validation share, test share)"
    assert sentence_splits(10, [0.2, 0.3])[1:] == sentence_splits(10, (0.2, 0.3))[1:]  # a list works
    for fractions, name in (((1.0, 0.1), "fractions[0] (validation)"), ((0.1, 1.0), "fractions[1] (test)")):
        with pytest.raises(ValueError) as excinfo:
            sentence_splits(10, fractions)
        assert _message(excinfo).startswith(f"{name} ") and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:
        sentence_splits(0)
    assert _message(excinfo).startswith("n_sentences ") and "XX" not in _message(excinfo)


def test_pad_batch():
    out = pad_batch([[5, 6, 7], [8]])
    assert out.dtype == torch.long and out.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert pad_batch([[5], [8, 9]], pad_id=3).tolist() == [[5, 3], [8, 9]]
    for bad in (0.5, -1, True):  # a float pad would make a float batch, or truncate silently
        with pytest.raises((TypeError, ValueError)) as excinfo:
            pad_batch([[5], [8, 9]], pad_id=bad)
        assert _message(excinfo).startswith("pad_id ")
    for bad in ([], [[5], []]):
        with pytest.raises(ValueError) as excinfo:
            pad_batch(bad)
        assert _message(excinfo) == ("sequences must be a non-empty list of non-empty id lists: an empty "
                                     "sentence has nothing to translate")


def test_make_batch_by_hand():
    data = TranslationData(SHORT_SENTENCES)
    source, decoder_in, target = make_batch(data, [4, 2])
    pairs = [data.pair(4), data.pair(2)]
    assert torch.equal(source, pad_batch([pairs[0][0], pairs[1][0]]))
    assert torch.equal(target, pad_batch([pairs[0][1], pairs[1][1]]))
    for row, (_, t) in enumerate(pairs):
        expected = [BOS_ID] + t[:-1]  # <eos> is never read
        assert decoder_in[row].tolist() == expected + [PAD_ID] * (decoder_in.shape[1] - len(expected))
    assert decoder_in.dtype == torch.long and not (decoder_in == EOS_ID).any()
    with pytest.raises(ValueError) as excinfo:
        make_batch(data, [0, 5, -1, 1.0, 7])
    assert _message(excinfo) == ("indices holds [5, -1, 1.0]: expected a non-empty list of example numbers "
                                 "in [0, 4]")
    assert make_batch(data, [0])[0].shape[0] == 1


def test_make_batch_takes_anything_with_pair_and_len():
    class Pairs:
        sentences = ["not used"]

        def __len__(self):
            return 3

        def pair(self, i):
            return [5 + i, 6], [7, EOS_ID]

    source, decoder_in, target = make_batch(Pairs(), [2, 0])
    assert source.tolist() == [[7, 6], [5, 6]] and target.tolist() == [[7, 2], [7, 2]]
    assert decoder_in.tolist() == [[1, 7], [1, 7]]
    with pytest.raises(ValueError, match=r"in \[0, 2\]"):
        make_batch(Pairs(), [3])


def _train_by_hand(model, data, train, steps, batch_size, lr, seed, label_smoothing):
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step / steps, peak=lr)
        source, target_in, target = make_batch(data, rng.sample(list(train), batch_size))
        logits = model(source, target_in)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD_ID,
                                                 label_smoothing=label_smoothing)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("settings", [dict(lr=3e-2, seed=1, label_smoothing=0.2), dict()])
def test_train_translator_is_the_recipe_step_for_step(settings):
    data = TranslationData(SHORT_SENTENCES)
    torch.manual_seed(0)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=4)
    reference = copy.deepcopy(model)
    steps_seen = []
    losses = train_translator(model, data, range(5), steps=3, batch_size=2, on_step=steps_seen.append, **settings)
    full = dict(lr=3e-3, seed=0, label_smoothing=0.0) | settings
    expected = _train_by_hand(reference, data, range(5), 3, 2, **full)
    assert losses == pytest.approx(expected, rel=1e-6, abs=1e-7)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    assert steps_seen == [0, 1, 2] and not model.training


def test_train_translator_default_batch_is_sixty_four():
    data = TranslationData(SHORT_SENTENCES)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=4)
    with pytest.raises(ValueError) as excinfo:
        train_translator(model, data, range(5), steps=1)
    assert _message(excinfo) == ("batch_size is 64, larger than the 5 training examples in train: expected at "
                                 "most len(train)")
    sizes = []
    original = model.forward
    model.forward = lambda source, target_in: sizes.append(source.shape[0]) or original(source, target_in)
    train_translator(model, data, list(range(5)) * 13, steps=1)  # 65 indices: 64 fit
    assert sizes == [64]


def test_train_translator_trains_in_training_mode():
    data = TranslationData(SHORT_SENTENCES)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=4).eval()
    modes = []
    original = model.forward
    model.forward = lambda source, target_in: modes.append(model.training) or original(source, target_in)
    train_translator(model, data, range(5), steps=2, batch_size=5)
    assert modes == [True, True] and not model.training


def test_train_translator_messages():
    data = TranslationData(SHORT_SENTENCES)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=4)
    for name, changes in (("steps", dict(steps=0)), ("batch_size", dict(batch_size=0)), ("lr", dict(lr=0.0)),
                          ("label_smoothing", dict(label_smoothing=-0.1))):
        with pytest.raises(ValueError) as excinfo:
            train_translator(model, data, range(5), **{"steps": 1, "batch_size": 2, **changes})
        assert _message(excinfo).startswith(f"{name} ") and "XX" not in _message(excinfo)
    train_translator(model, data, range(5), steps=1, batch_size=5, label_smoothing=0.0)  # batch = all works
    with torch.no_grad():
        model.head.bias.fill_(float("inf"))
    with pytest.raises(FloatingPointError) as excinfo:
        train_translator(model, data, range(5), steps=2, batch_size=2)
    assert _message(excinfo) == ("the training loss is nan at step 0: stopped before the update spoils the "
                                 "weights (try a lower lr)")


def test_score_translations_by_hand():
    target = torch.tensor([[5, 6, 2, 0], [7, 2, 0, 0], [5, 2, 0, 0]])
    predicted = torch.tensor([[5, 9, 2], [7, 2, 0], [5, 6, 2]])
    exact, accuracy = score_translations(predicted, target)
    assert exact.tolist() == [False, True, False]
    assert accuracy.tolist() == pytest.approx([2 / 3, 1.0, 1 / 2])
    # a longer prediction than the target: the extra words count against exact, not the accuracy
    exact, accuracy = score_translations(torch.tensor([[5, 2, 0, 0, 7]]), torch.tensor([[5, 2]]))
    assert exact.tolist() == [False] and accuracy.tolist() == [1.0]
    exact, accuracy = score_translations(torch.tensor([[5]]), torch.tensor([[5, 2]]))
    assert exact.tolist() == [False] and accuracy.tolist() == [0.5]


def test_score_translations_messages():
    good = torch.tensor([[5, 2]])
    for predicted, target, name, got in ((torch.tensor([5, 2]), good, "predicted", "(2,)"),
                                         (good, [[5, 2]], "target", "list")):
        with pytest.raises(ValueError) as excinfo:
            score_translations(predicted, target)
        assert _message(excinfo) == f"{name} has shape {got}, expected (B, length) ids"
    with pytest.raises(ValueError) as excinfo:
        score_translations(torch.tensor([[5, 2], [5, 2]]), good)
    assert _message(excinfo) == "predicted has 2 rows and target 1: expected one prediction per target"
    with pytest.raises(ValueError) as excinfo:
        score_translations(torch.tensor([[5, 2], [5, 2], [5, 2]]), torch.tensor([[0, 0], [5, 2], [0, 0]]))
    assert _message(excinfo) == ("target rows [0, 2] hold padding only: expected each to end in <eos> (their "
                                 "accuracy would be 0 / 0)")
    assert math.isclose(score_translations(good, good)[1].item(), 1.0)


def test_from_corpus_takes_each_distinct_sentence_once_sorted(monkeypatch):
    import helpers.families.translation as translation

    text = "The dog barked.\n\nThe cat sat.\nThe dog barked.\n   \nA cat sat.\n"
    monkeypatch.setattr(translation.corpus, "load_corpus", lambda: text)
    data = TranslationData.from_corpus()
    assert isinstance(data, TranslationData)
    assert data.sentences == ["A cat sat.", "The cat sat.", "The dog barked."]
    assert data.english[0] == ["a", "cat", "sat", "."]


def test_train_translator_clips_the_gradient_norm_at_one():
    data = TranslationData(SHORT_SENTENCES)
    torch.manual_seed(0)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=4)
    with torch.no_grad():
        model.head.weight.mul_(30)  # large logits, large gradients: the clip acts
    reference = copy.deepcopy(model)
    norms = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(parameters, max_norm):
        norm = real_clip(parameters, max_norm)
        norms.append(norm.item())
        return norm

    train_translator(model, data, range(5), steps=3, batch_size=2, lr=3e-2)
    torch.nn.utils.clip_grad_norm_ = clip
    try:
        _train_by_hand(reference, data, range(5), 3, 2, lr=3e-2, seed=0, label_smoothing=0.0)
    finally:
        torch.nn.utils.clip_grad_norm_ = real_clip
    assert min(norms) > 2.0  # a clip at 2 would differ
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_a_parameter_without_a_gradient_is_left_alone():
    """zero_grad(set_to_none=True): a parameter unused in a step has no gradient, and AdamW skips it
    (no weight decay, no momentum step); a zeroed gradient would move it."""
    data = TranslationData(SHORT_SENTENCES)
    torch.manual_seed(0)

    class SometimesBiased(GRUSeq2Seq):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.extra = torch.nn.Parameter(torch.ones(self.target_vocab_size))
            self.calls = 0

        def forward(self, source, target_in):
            self.calls += 1
            logits = super().forward(source, target_in)
            return logits + self.extra if self.calls == 2 else logits  # only step 1 uses it (step 0's lr is 0)

    model = SometimesBiased(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=4)
    after_first = []
    train_translator(model, data, range(5), steps=3, batch_size=2, lr=3e-2,
                     on_step=lambda step: after_first.append(model.extra.detach().clone()) if step == 1 else None)
    assert not torch.equal(after_first[0], torch.ones_like(after_first[0]))  # step 1 moved it
    assert torch.equal(model.extra.detach(), after_first[0])  # step 2 did not


FOUR_SENTENCES = ["The dog barked.", "Mia found a red box.", "Tom saw the old tree.", "The cat sat."]


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


def test_the_translator_stops_on_a_nan_loss():
    data = TranslationData(FOUR_SENTENCES)
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
    data = TranslationData(FOUR_SENTENCES)
    model = GRUSeq2Seq(data.source_vocab.vocab_size, data.target_vocab.vocab_size, hidden=8)
    with pytest.raises(ValueError, match=match):
        train_translator(model, data, range(4), **{"steps": 2, "batch_size": 2, **changes})


def test_batch_indices_outside_the_data_and_a_sentence_that_is_not_text():
    import random

    from helpers.families.mlm import swap_neighbours
    from helpers.families.translation import make_batch

    data = TranslationData(FOUR_SENTENCES)
    with pytest.raises(ValueError, match=r"indices holds \[4\]: expected a non-empty list of example numbers in \[0, 3\]"):
        make_batch(data, [0, 4])
    with pytest.raises(ValueError, match="indices holds nothing"):
        make_batch(data, [])
    with pytest.raises(TypeError, match="sentence is a list"):
        swap_neighbours(["The", "dog"], random.Random(0))
    with pytest.raises(TypeError, match="source has dtype torch.float32"):
        GRUSeq2Seq(10, 9, hidden=4)(torch.tensor([[3.0, 4.0]]), torch.tensor([[1, 3]]))
