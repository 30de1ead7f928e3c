"""helpers.families.mlm: BERT's corruption draw by draw, the heads by hand, the swap's rules.

 mask_tokens is
checked against BERT's rule applied here to the same three draws from the same generator (the
notebook's random draws are part of its output); the seeds of the boundary tests were searched
for so that a uniform draw lands exactly on a threshold (0.25, 0.8, 0.9: float32 uniforms are
multiples of 2^-24, so this happens), and each such test asserts that it does.
"""

from __future__ import annotations

import random

import pytest
import torch

from helpers.families.mlm import IGNORE, Classifier, MaskedLM, mask_tokens, swap_neighbours
from helpers.families.seq2seq import Encoder
from helpers.families.translation import score_translations
from helpers.text.corpus import is_well_formed

VOCAB, FIRST, MASK = 20, 5, 4


def _message(excinfo) -> str:
    return str(excinfo.value)


def _ids(shape, seed=0, pad_tail=0, pad_id=0):
    ids = torch.randint(FIRST, VOCAB, shape, generator=torch.Generator().manual_seed(seed))
    if pad_tail:
        ids[:, -pad_tail:] = pad_id
    return ids


def _bert_by_hand(ids, seed, rate, mask_id=MASK, pad_id=0, first=FIRST, vocab=VOCAB):
    generator = torch.Generator().manual_seed(seed)
    pick_draw = torch.rand(ids.shape, generator=generator)
    roll = torch.rand(ids.shape, generator=generator)
    randoms = torch.randint(first, vocab, ids.shape, generator=generator)
    inputs, labels = ids.clone(), torch.full_like(ids, IGNORE)
    for index in torch.cartesian_prod(*[torch.arange(n) for n in ids.shape]).tolist():
        index = tuple(index)
        if ids[index] == pad_id or not pick_draw[index] < rate:
            continue
        labels[index] = ids[index]
        if roll[index] < 0.8:
            inputs[index] = mask_id
        elif roll[index] < 0.9:
            inputs[index] = randoms[index]
    return inputs, labels, pick_draw, roll


@pytest.mark.parametrize("rate, seed, pad_id, mask_id", [(0.15, 0, 0, 4), (0.5, 1, 3, 1), (1.0, 2, 0, 4)])
def test_mask_tokens_is_berts_rule_on_the_same_draws(rate, seed, pad_id, mask_id):
    ids = _ids((3, 9), seed=seed, pad_tail=3, pad_id=pad_id)
    inputs, labels = mask_tokens(ids, mask_id, VOCAB, FIRST, torch.Generator().manual_seed(seed), rate=rate,
                                 pad_id=pad_id)
    expected_inputs, expected_labels, _, _ = _bert_by_hand(ids, seed, rate, mask_id=mask_id, pad_id=pad_id)
    assert torch.equal(inputs, expected_inputs) and torch.equal(labels, expected_labels)
    assert (labels[:, -3:] == IGNORE).all() and torch.equal(inputs[:, -3:], ids[:, -3:])  # padding untouched


def test_mask_tokens_default_rate_is_fifteen_percent_and_default_pad_is_zero():
    ids = _ids((2, 40), seed=3, pad_tail=5)
    inputs, labels = mask_tokens(ids, MASK, VOCAB, FIRST, torch.Generator().manual_seed(3))
    expected_inputs, expected_labels, _, _ = _bert_by_hand(ids, 3, 0.15)
    assert torch.equal(inputs, expected_inputs) and torch.equal(labels, expected_labels)


def test_random_words_are_drawn_from_the_words_only():
    ids = torch.randint(FIRST, 7, (4, 50), generator=torch.Generator().manual_seed(4))
    inputs, _ = mask_tokens(ids, MASK, 7, FIRST, torch.Generator().manual_seed(4), rate=1.0)
    changed = inputs[(inputs != MASK) & (inputs != ids)]
    assert changed.numel() > 0 and set(changed.tolist()) <= {5, 6}


def test_a_draw_exactly_at_the_rate_is_not_picked():
    ids = _ids((8, 256), seed=0)
    _, labels, pick_draw, _ = _bert_by_hand(ids, 17372, 0.25)
    assert (pick_draw == 0.25).any()  # the seed was searched for this
    _, got = mask_tokens(ids, MASK, VOCAB, FIRST, torch.Generator().manual_seed(17372), rate=0.25)
    assert torch.equal(got, labels) and (got[pick_draw == 0.25] == IGNORE).all()


@pytest.mark.parametrize("seed, threshold", [(9037, 0.8), (7831, 0.9)])
def test_a_roll_exactly_at_a_threshold_falls_in_the_upper_share(seed, threshold):
    ids = _ids((8, 256), seed=0)
    expected, _, _, roll = _bert_by_hand(ids, seed, 1.0)
    at = roll == torch.tensor(threshold, dtype=torch.float32)
    assert at.any()  # the seed was searched for this
    inputs, _ = mask_tokens(ids, MASK, VOCAB, FIRST, torch.Generator().manual_seed(seed), rate=1.0)
    assert torch.equal(inputs, expected)
    assert (inputs[at] != MASK).all()  # 0.8 is not masked; 0.9 keeps its word
    if threshold == 0.9:
        assert torch.equal(inputs[at], ids[at])


# --- mask_tokens' checks, in full ----------------------------------------------------------

def test_mask_tokens_messages():
    ids, g = _ids((2, 4)), torch.Generator().manual_seed(0)
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(ids, MASK, VOCAB, FIRST, g, rate=0.0)
    assert _message(excinfo).startswith("rate ") and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(ids, MASK, VOCAB, FIRST, g, rate=1.01)
    assert _message(excinfo).startswith("rate ")
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(ids, MASK, 0, FIRST, g)
    assert _message(excinfo).startswith("vocab_size ") and "XX" not in _message(excinfo)
    for first in (0, VOCAB):
        with pytest.raises(ValueError) as excinfo:
            mask_tokens(ids, MASK, VOCAB, first, g)
        assert _message(excinfo).startswith("first_word_id ") and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:  # first_word_id 1 is allowed, and leaves no room for <mask>
        mask_tokens(ids, MASK, VOCAB, 1, g)
    assert _message(excinfo) == ("mask_id is 4, expected a special token's id below first_word_id = 1 "
                                 "(inside the vocabulary of 20)")
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(ids, 5, VOCAB, FIRST, g)
    assert _message(excinfo) == ("mask_id is 5, expected a special token's id below first_word_id = 5 "
                                 "(inside the vocabulary of 20)")
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(ids, MASK, VOCAB, FIRST, g, pad_id=5)
    assert _message(excinfo) == ("pad_id is 5, expected a special token's id below first_word_id = 5 "
                                 "(inside the vocabulary of 20)")
    for name, args in (("mask_id", dict(mask_id=-1)), ("pad_id", dict(pad_id=-1))):
        with pytest.raises(ValueError) as excinfo:
            mask_tokens(ids, **{"mask_id": MASK, **args}, vocab_size=VOCAB, first_word_id=FIRST, generator=g)
        assert _message(excinfo).startswith(f"{name} ") and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(ids, 3, VOCAB, FIRST, g, pad_id=3)
    assert _message(excinfo) == ("mask_id and pad_id are both 3: expected two different ids, or hidden words "
                                 "would read as padding")
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(ids[0], MASK, VOCAB, FIRST, g)
    assert _message(excinfo) == "ids has shape (4,), expected (B, M)"
    with pytest.raises(ValueError) as excinfo:
        mask_tokens(torch.tensor([[5, 20]]), MASK, VOCAB, FIRST, g)
    assert _message(excinfo) == "ids contains the id 20, expected ids in [0, 19] for a vocabulary of 20 tokens"
    with pytest.raises(TypeError) as excinfo:
        mask_tokens(ids, MASK, VOCAB, FIRST, 0)
    assert _message(excinfo) == "generator is int, expected a torch.Generator"
    # the edges that still work: rate 1, the last word id as first_word_id, pad and mask just below it
    inputs, labels = mask_tokens(ids, 18, VOCAB, 19, g, rate=1.0, pad_id=17)
    assert inputs.shape == labels.shape == ids.shape


# --- the heads -----------------------------------------------------------------------------

def _encoder():
    torch.manual_seed(0)
    return Encoder(20, 8, n_layers=1, n_heads=2, d_model=8).eval()


@pytest.mark.parametrize("pad_id", [0, 3])
def test_masked_lm_is_the_encoder_on_the_real_tokens_then_a_head(pad_id):
    encoder = _encoder()
    model = MaskedLM(encoder, 20, **({} if pad_id == 0 else {"pad_id": pad_id})).eval()
    assert model.pad_id == pad_id and model.head.weight.shape == (20, 8)
    ids = torch.tensor([[5, 6, 7, pad_id], [8, 9, pad_id, pad_id]])
    with torch.no_grad():
        expected = model.head(encoder(ids, ids != pad_id))
        torch.testing.assert_close(model(ids), expected)


@pytest.mark.parametrize("pad_id", [0, 3])
def test_classifier_is_the_mean_of_the_real_tokens_then_a_head(pad_id):
    encoder = _encoder()
    model = Classifier(encoder, 3, **({} if pad_id == 0 else {"pad_id": pad_id})).eval()
    assert model.pad_id == pad_id and model.head.weight.shape == (3, 8)
    ids = torch.tensor([[5, 6, 7, pad_id], [8, 9, pad_id, pad_id], [5, 5, 5, 5]])
    with torch.no_grad():
        h = encoder(ids, ids != pad_id)
        pooled = torch.stack([h[0, :3].mean(0), h[1, :2].mean(0), h[2].mean(0)])
        torch.testing.assert_close(model(ids), model.head(pooled))
    with pytest.raises(ValueError) as excinfo:
        Classifier(encoder, 0)
    assert _message(excinfo).startswith("n_classes ") and "XX" not in _message(excinfo)


# --- swap_neighbours ----------------------------------------------------------------------

class CountingRandom(random.Random):
    def __init__(self, seed):
        super().__init__(seed)
        self.choices = 0

    def choice(self, seq):
        self.choices += 1
        return super().choice(seq)


def _neighbour_swaps(sentence: str) -> list[str]:
    """Every sentence made by swapping two different words that stand one space apart."""
    words = sentence.split(" ")
    out = []
    for i in range(len(words) - 1):
        a, b = words[i], words[i + 1]
        core_a, core_b = a.strip('.,!?"'), b.strip('.,!?"')
        if core_a == a and core_b.isalpha() and b.startswith(core_b) and core_a.isalpha() and core_a != core_b:
            swapped = words[:i] + [core_b, core_a + b[len(core_b):]] + words[i + 2:]
            out.append(" ".join(swapped))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_a_swap_is_one_of_the_neighbour_swaps_and_breaks_the_grammar(seed):
    sentence = "He lived in an old castle near the cave."
    assert is_well_formed(sentence)
    swapped = swap_neighbours(sentence, random.Random(seed))
    assert swapped in _neighbour_swaps(sentence) and not is_well_formed(swapped)


def test_no_spot_means_no_draw_and_a_broken_swap_ends_the_tries():
    rng = CountingRandom(0)
    result = swap_neighbours("Tom Tom", rng)
    assert result is None and rng.choices == 0  # two equal words: no spot, no draw
    rng = CountingRandom(0)
    assert swap_neighbours("Luca,Lena", rng) is None and rng.choices == 0  # not one space apart
    # "o'clock" and "twenty-five" are single words: a swap moves them whole and keeps the punctuation
    for seed in range(8):
        swapped = swap_neighbours("Ada ran at twenty-five past five o'clock, home", random.Random(seed))
        assert swapped in ("ran Ada at twenty-five past five o'clock, home",
                           "Ada at ran twenty-five past five o'clock, home",
                           "Ada ran twenty-five at past five o'clock, home",
                           "Ada ran at past twenty-five five o'clock, home",
                           "Ada ran at twenty-five five past o'clock, home",
                           "Ada ran at twenty-five past o'clock five, home")
    rng = CountingRandom(0)
    broken = "lucky very felt Luca"
    assert not is_well_formed(broken)
    # a sentence whose swaps all stay ill-formed still returns the first swap tried (it breaks the grammar)
    assert swap_neighbours(broken, rng) is not None and rng.choices == 1


def test_the_tries_default_is_twenty_and_counts_each_draw(monkeypatch):
    import helpers.families.mlm as mlm

    monkeypatch.setattr(mlm, "is_well_formed", lambda s: True)  # no swap ever breaks the grammar
    rng = CountingRandom(0)
    assert swap_neighbours("He lived in an old castle", rng) is None and rng.choices == 20
    rng = CountingRandom(0)
    assert swap_neighbours("He lived in an old castle", rng, tries=3) is None and rng.choices == 3
    rng = CountingRandom(0)
    assert swap_neighbours("He lived", rng, tries=1) is None and rng.choices == 1
    with pytest.raises(ValueError) as excinfo:
        swap_neighbours("He lived", rng, tries=0)
    assert _message(excinfo).startswith("tries ") and "XX" not in _message(excinfo)
    with pytest.raises(TypeError) as excinfo:
        swap_neighbours(3, rng)
    assert _message(excinfo) == "sentence is a int, expected a str"


def test_the_swap_keeps_everything_around_the_two_words(monkeypatch):
    import helpers.families.mlm as mlm

    monkeypatch.setattr(mlm, "is_well_formed", lambda s: False)  # the first swap tried is returned
    for seed in range(6):
        sentence = '"Oh no!" said Ada, near the river.'
        swapped = swap_neighbours(sentence, random.Random(seed))
        assert swapped in _neighbour_swaps(sentence) or swapped in (
            '"no Oh!" said Ada, near the river.', '"Oh no!" said Ada, the near river.',
            '"Oh no!" said Ada, near river the.')
        assert sorted(swapped) == sorted(sentence)
    assert swap_neighbours("Ada ran", random.Random(0)) == "ran Ada"
    assert swap_neighbours("go Ada ran", random.Random(0)) in ("Ada go ran", "go ran Ada")
    assert swap_neighbours("a b", random.Random(0)) == "b a"  # one-letter words are words
    for seed in range(4):  # two equal neighbours are never swapped; the next pair is
        assert swap_neighbours("Ada Ada ran", random.Random(seed)) == "Ada ran Ada"


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
