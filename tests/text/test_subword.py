"""helpers.text.subword: WordPiece and Unigram against Hugging Face's Rust implementations on the same
vocabulary, every segmentation of a word, and clear errors for bad input."""

from __future__ import annotations

from collections import Counter
from functools import cache
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_cases import finishes

from helpers.text.corpus import TOY_SOUP, load_corpus
from helpers.text.subword import UnigramTokenizer, WordPieceTokenizer, segmentations, split_words

# --- every segmentation of a word ----------------------------------------------------------------


def every_substring(word: str) -> set[str]:
    return {word[i:j] for i in range(len(word)) for j in range(i + 1, len(word) + 1)}


def naive_segmentations(word: str, pieces) -> list[list[str]]:
    if not word:
        return [[]]
    return [[word[:end], *rest] for end in range(1, len(word) + 1) if word[:end] in pieces
            for rest in naive_segmentations(word[end:], pieces)]


def test_segmentations_lists_every_cut():
    assert segmentations("abc", {"a", "b", "c", "ab"}) == [["a", "b", "c"], ["ab", "c"]]
    found = segmentations("unigram", every_substring("unigram"))
    assert len(found) == 2 ** 6
    assert all("".join(pieces) == "unigram" for pieces in found)
    assert segmentations("xyz", {"x", "y"}) == []
    assert segmentations("a" * 300, {"a"}) == [["a"] * 300]  # long, but only one way


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abc", max_size=9), st.sets(st.text(alphabet="abc", min_size=1, max_size=3)))
def test_segmentations_agree_with_the_naive_recursion(word, pieces):
    assert segmentations(word, pieces) == naive_segmentations(word, pieces)


# --- WordPiece and Unigram -----------------------------------------------------------------------


@cache
def corpus_wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(load_corpus(), vocab_size=400)


@cache
def corpus_unigram() -> UnigramTokenizer:
    return UnigramTokenizer.train(load_corpus(), vocab_size=400)


def corpus_words_sample() -> list[str]:
    return sorted(set(split_words(load_corpus())))


def test_wordpiece_first_merge_maximises_the_likelihood_score():
    text = "hugs hugs hugs pug pun bun"  # WordPiece picks ##g ##s, BPE would pick ##u ##g
    words = Counter(split_words(text))
    spellings = {w: [w[0]] + ["##" + c for c in w[1:]] for w in words}
    piece_counts, pair_counts = Counter(), Counter()
    for word, n in words.items():
        for piece in spellings[word]:
            piece_counts[piece] += n
        for pair in pairwise(spellings[word]):
            pair_counts[pair] += n
    best = max(pair_counts, key=lambda p: pair_counts[p] / (piece_counts[p[0]] * piece_counts[p[1]]))
    tokenizer = WordPieceTokenizer.train(text, vocab_size=len(piece_counts) + 1 + 1)  # one merge, [UNK]
    assert tokenizer.vocab[-2:] == [best[0] + best[1].removeprefix("##"), "[UNK]"]
    assert best != pair_counts.most_common(1)[0][0], "this text should tell WordPiece from BPE"


def test_wordpiece_and_unigram_reach_the_requested_size_and_spell_every_corpus_word():
    for tokenizer in (corpus_wordpiece(), corpus_unigram()):
        assert tokenizer.vocab_size == 400
        for word in corpus_words_sample():
            pieces = tokenizer.tokenize_word(word)
            assert "".join(p.removeprefix("##") for p in pieces) == word


def test_wordpiece_encoding_matches_the_rust_library_on_the_same_vocabulary():
    from tokenizers import Tokenizer, models, pre_tokenizers

    ours = corpus_wordpiece()
    theirs = Tokenizer(models.WordPiece({p: i for i, p in enumerate(ours.vocab)}, unk_token="[UNK]"))
    theirs.pre_tokenizer = pre_tokenizers.Whitespace()
    for word in [*corpus_words_sample(), "unigram", "tokenization", "Zoë"]:
        assert ours.tokenize(word) == theirs.encode(word).tokens, word


def test_unigram_encoding_matches_the_rust_library_on_the_same_pieces():
    from tokenizers import Tokenizer, models, pre_tokenizers

    ours = corpus_unigram()
    pieces = [("<unk>", 0.0), *sorted(ours.log_probs.items())]
    theirs = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
    theirs.pre_tokenizer = pre_tokenizers.Whitespace()
    for word in [*corpus_words_sample(), "unigram", "tokenization"]:
        assert ours.tokenize(word) == theirs.encode(word).tokens, word


def test_unigram_picks_the_most_probable_segmentation():
    tokenizer = UnigramTokenizer({"u": -3.0, "n": -3.0, "i": -3.0, "un": -2.0, "uni": -4.5, "ni": -1.0})
    cuts = segmentations("uni", tokenizer.log_probs)
    best = max(cuts, key=tokenizer.score)
    assert tokenizer.tokenize_word("uni") == best == ["u", "ni"]
    assert tokenizer.score(["u", "ni"]) == -4.0
    assert tokenizer.score(["q"]) == float("-inf")
    assert tokenizer.tokenize("uni x") == ["u", "ni", "<unk>"]


@pytest.mark.parametrize("train", [lambda: WordPieceTokenizer.train(" ", vocab_size=50),
                                   lambda: UnigramTokenizer.train("", vocab_size=50)])
def test_wordpiece_and_unigram_refuse_empty_text(train):
    with pytest.raises(ValueError, match="text is empty"):
        train()


def test_wordpiece_and_unigram_refuse_a_vocabulary_smaller_than_the_alphabet():
    with pytest.raises(ValueError, match="vocab_size is 3, expected at least 6"):
        WordPieceTokenizer.train("abcde", vocab_size=3)  # a ##b ##c ##d ##e and [UNK]
    with pytest.raises(ValueError, match="vocab_size is 3, expected at least 5"):
        UnigramTokenizer.train("abcde", vocab_size=3)


def test_unigram_with_a_tiny_prune_fraction_still_ends():
    tokenizer = finishes(lambda: UnigramTokenizer.train(TOY_SOUP, vocab_size=20, prune_fraction=1e-12))
    assert tokenizer.vocab_size == 20


def test_unigram_gives_one_unk_per_unseen_character():
    tokenizer = UnigramTokenizer({"u": -3.0, "n": -3.0, "i": -3.0, "un": -2.0, "ni": -1.0})
    assert tokenizer.tokenize_word("uxni") == ["u", "<unk>", "ni"]
    assert tokenizer.tokenize_word("xy") == ["<unk>", "<unk>"]
    assert tokenizer.tokenize("Zoë") == ["<unk>", "<unk>", "<unk>"]


# --- bad input: a clear error that names the argument --------------------------------------------


BAD_INPUT = {
    "wordpiece vocab_size float": (lambda: WordPieceTokenizer.train("abc", 30.5), TypeError, "vocab_size is 30.5"),
    "unigram vocab_size None": (lambda: UnigramTokenizer.train("abc", None), TypeError, "vocab_size is None"),
    "unigram max_piece_length 0": (lambda: UnigramTokenizer.train("abc", 5, max_piece_length=0),
                                   ValueError, "max_piece_length is 0"),
    "wordpiece train None": (lambda: WordPieceTokenizer.train(None, 30), TypeError, "text is None"),
    "wordpiece tokenize bytes": (lambda: corpus_wordpiece().tokenize(b"x"), TypeError, "text is b'x'"),
    "unigram train int": (lambda: UnigramTokenizer.train(5, 30), TypeError, "text is 5"),
    "unigram tokenize_word None": (lambda: corpus_unigram().tokenize_word(None), TypeError, "word is None"),
    "segmentations None": (lambda: segmentations(None, {"a"}), TypeError, "word is None"),
    # an empty Unigram model, and Unigram training that would never end
    "unigram empty": (lambda: UnigramTokenizer({}), ValueError, "log_probs is {}"),
    "unigram prune_fraction 0": (lambda: UnigramTokenizer.train("abc abd", 4, prune_fraction=0),
                                 ValueError, "prune_fraction is 0, expected a fraction strictly between 0 and 1"),
    "unigram prune_fraction negative": (lambda: UnigramTokenizer.train("abc abd", 4, prune_fraction=-0.5),
                                        ValueError, "prune_fraction is -0.5"),
    "unigram prune_fraction 1": (lambda: UnigramTokenizer.train("abc abd", 4, prune_fraction=1),
                                 ValueError, "prune_fraction is 1"),
    "unigram prune_fraction str": (lambda: UnigramTokenizer.train("abc abd", 4, prune_fraction="0.2"),
                                   TypeError, "prune_fraction is '0.2'"),
    # segmentations whose number would take too long to list
    "segmentations too many": (lambda: segmentations("a" * 20, {"a" * k for k in range(1, 21)}),
                               ValueError, "word 'aaaaaaaaaaaaaaaaaaaa' has 524,288 segmentations, expected at most"),
}


@pytest.mark.parametrize("case", BAD_INPUT, ids=str)
def test_bad_input_gets_a_clear_error_naming_the_argument(case):
    call, error_type, message = BAD_INPUT[case]
    with pytest.raises(error_type, match=message):
        finishes(call)
