"""helpers.text.subword: WordPiece and Unigram against Hugging Face's Rust implementations on the same
vocabulary, every segmentation of a word, and clear errors for bad input."""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import cache
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_tools import raises_exactly
from tokenizer_cases import finishes

from helpers.text import subword
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


# helpers.text.subword, exactly:
#
# Every model here is trained inside its test on a few words, small enough to follow by hand (each
# expected value says how it is derived): tests/text/test_subword.py's corpus models are cached per process,
# trained before mutmut plants a bug. Grouped by the classes: values worked by hand, the
# edge sizes of segmentations, error messages read in full, configuration at non-default values.


def test_segmentations_are_sorted_by_piece_lengths_and_reach_the_longest_piece():
    pieces = ["abc", "a", "bc", "b", "c", "ab"]
    assert segmentations("abc", pieces) == [["a", "b", "c"], ["a", "bc"], ["ab", "c"], ["abc"]]
    assert segmentations("abc", {"abc"}) == [["abc"]]  # the whole word is the longest piece
    assert segmentations("abcd", {"abcd", "d", "abc"}) == [["abc", "d"], ["abcd"]]


def test_segmentations_of_edge_words():
    assert segmentations("", {"a"}) == [[]]  # one way to cut nothing
    assert segmentations("ab", set()) == []
    assert segmentations("a", {"a"}) == [["a"]]
    assert segmentations("ab", {"b"}) == []  # the start cannot be spelled
    assert segmentations("ab", {"a"}) == []  # the end cannot be spelled


def test_segmentations_allows_exactly_max_segmentations(monkeypatch):
    monkeypatch.setattr(subword, "MAX_SEGMENTATIONS", 4)
    every = {"a", "aa", "aaa"}
    assert len(segmentations("aaa", every)) == 4  # a+a+a, a+aa, aa+a, aaa
    with raises_exactly(ValueError, "word 'aaaa' has 7 segmentations, expected at most 4 (MAX_SEGMENTATIONS): "
                                    "listing them all would take too long"):
        segmentations("aaaa", every)


def test_segmentations_message_shortens_a_long_word_and_groups_thousands():
    word = "a" * 45
    with pytest.raises(ValueError, match=rf"^word '{'a' * 39} has 1,836,311,903 segmentations, expected at most 100,000 "):
        segmentations(word, {"a", "aa"})  # cuts of 45 into 1s and 2s: Fibonacci number 46


def test_split_words_keeps_words_and_each_punctuation_mark():
    assert split_words("Soup is yummy, isn't it?!") == ["Soup", "is", "yummy", ",", "isn", "'", "t", "it", "?", "!"]
    assert split_words(" \t\n") == []


def test_wordpiece_training_worked_by_hand():
    # hugs hugs pug: h ##u ##g ##s twice, p ##u ##g. Every pair scores count / (count * count) = 1/3
    # in the first two rounds, so the smallest pair wins: ##g ##s, then ##u ##g; then p ##ug scores
    # 1 / (1 * 1) against 2 / (2 * 2) for the other two.
    tokenizer = WordPieceTokenizer.train("hugs hugs pug", vocab_size=9)
    assert tokenizer.vocab == ["##g", "##s", "##u", "h", "p", "##gs", "##ug", "pug", "[UNK]"]
    assert tokenizer.tokenize("hugs pug pugs") == ["h", "##ug", "##s", "pug", "pug", "##s"]  # longest first
    assert tokenizer.encode("hugs") == [3, 6, 1]


def test_wordpiece_stops_when_every_word_is_one_piece():
    tokenizer = WordPieceTokenizer.train("ab ab", vocab_size=50, unk_token="<?>")
    assert tokenizer.vocab == ["##b", "a", "ab", "<?>"] and tokenizer.vocab_size == 4
    assert tokenizer.tokenize("ab b") == ["ab", "<?>"]


def test_wordpiece_names_vocab_size_with_the_alphabet():
    with raises_exactly(ValueError, "vocab_size is 3, expected at least 4: the 3 characters (first and "
                                    "continuing) of text plus <?>"):
        WordPieceTokenizer.train("abc", vocab_size=3, unk_token="<?>")


def test_wordpiece_takes_the_longest_piece_from_the_left():
    tokenizer = WordPieceTokenizer(["a", "ab", "abc", "##b", "##bc", "##c", "##d"], unk_token="?")
    assert tokenizer.vocab[-1] == "?" and tokenizer.vocab_size == 8
    assert tokenizer.tokenize_word("abcd") == ["abc", "##d"]
    assert tokenizer.tokenize_word("abd") == ["ab", "##d"]
    assert tokenizer.tokenize_word("acbc") == ["a", "##c", "##bc"]
    assert tokenizer.tokenize_word("b") == ["?"]  # "b" only continues a word
    assert tokenizer.tokenize_word("abe") == ["?"]
    assert tokenizer.tokenize_word("") == []
    assert WordPieceTokenizer(["?", "a"], unk_token="?").vocab == ["?", "a"]  # already there: not added


def test_unigram_training_worked_by_hand():
    # "ab" three times: substrings a, b, ab, 3 each, so each has log(1/3). The best cut of ab is ab
    # (log 1/3 beats 2 log 1/3), used 3 times; re-estimated with add-one: a 1, b 1, ab 4, over 6.
    three = UnigramTokenizer.train("ab ab ab", vocab_size=3)
    assert three.log_probs == pytest.approx({"a": math.log(1 / 6), "b": math.log(1 / 6), "ab": math.log(4 / 6)})
    # With two pieces ab goes (single characters never do); a and b are then used 3 times each:
    # 4 and 4 over 8.
    two = UnigramTokenizer.train("ab ab ab", vocab_size=2)
    assert two.log_probs == pytest.approx({"a": math.log(1 / 2), "b": math.log(1 / 2)})


def test_unigram_keeps_the_pieces_whose_loss_costs_most():
    # ab (3 times) and cd (once): pruning to 5 pieces drops cd, the piece the corpus misses least.
    tokenizer = UnigramTokenizer.train("ab ab ab cd", vocab_size=5)
    assert set(tokenizer.log_probs) == {"a", "b", "c", "d", "ab"}
    assert tokenizer.tokenize("ab cd") == ["ab", "c", "d"]


def test_unigram_max_piece_length_bounds_the_pieces():
    tokenizer = UnigramTokenizer.train("abc abc abc", vocab_size=6, max_piece_length=2)
    assert max(map(len, tokenizer.log_probs)) == 2
    longer = UnigramTokenizer.train("abc abc abc", vocab_size=6, max_piece_length=3)
    assert "abc" in longer.log_probs and longer.tokenize_word("abc") == ["abc"]


def test_unigram_seed_is_the_most_frequent_substrings_four_per_piece_plus_the_characters(monkeypatch):
    seen = []
    original = UnigramTokenizer._usage

    def spy(self, word_counts):
        seen.append(set(self.log_probs))
        return original(self, word_counts)

    monkeypatch.setattr(UnigramTokenizer, "_usage", spy)
    # abcdefgh once: 36 substrings of 1 to 8 letters, all counted once, so the 4 * 8 most common
    # are the first 32 counted (Counter keeps ties in order): those starting at a, b, c, d, e, and
    # f, fg; the characters g and h join them.
    UnigramTokenizer.train("abcdefgh", vocab_size=8)
    word = "abcdefgh"
    first_32 = [word[start:end] for start in range(8) for end in range(start + 1, 9)][:32]
    assert seen[0] == {*first_32, "g", "h"}


def test_unigram_prune_fraction_sets_how_many_pieces_go_each_round(monkeypatch):
    sizes = []
    original = UnigramTokenizer._usage

    def spy(self, word_counts):
        sizes.append(len(self.log_probs))
        return original(self, word_counts)

    monkeypatch.setattr(UnigramTokenizer, "_usage", spy)
    UnigramTokenizer.train("abcdefgh", vocab_size=8, prune_fraction=0.5)
    # 34 seed pieces (above); each round (two _usage calls) keeps int(n * (1 - 0.5)), at least 8.
    assert sizes == [34, 34, 17, 17, 8]


def test_unigram_unknown_characters_score_ten_below_the_least_likely_piece():
    tokenizer = UnigramTokenizer({"a": -1.0, "b": -2.0}, unk_token="?")
    assert tokenizer._unk_score == -12.0
    assert tokenizer.tokenize("ab c") == ["a", "b", "?"]
    assert tokenizer.score(["a", "b"]) == -3.0


def test_unigram_viterbi_worked_by_hand():
    # abc: a+bc = -1 - 1.5 = -2.5 beats ab+c = -2 - 1 = -3, abc = -4 and a+b+c = -3.
    tokenizer = UnigramTokenizer({"a": -1.0, "b": -1.0, "c": -1.0, "ab": -2.0, "bc": -1.5, "abc": -4.0})
    assert tokenizer.tokenize_word("abc") == ["a", "bc"]
    assert tokenizer._best("abc") == (-2.5, ["a", "bc"])
    # Without bc: ab+c and a+b+c tie at -3; ab (-2) reached the end of "ab" first, a+b only ties it.
    assert tokenizer._best("abc", exclude="bc") == (-3.0, ["ab", "c"])
    assert tokenizer.tokenize_word("") == []


def test_unigram_refuses_bad_log_probs_in_full():
    with raises_exactly(ValueError, "log_probs is [('a', 1)], expected a non-empty dict piece -> log-probability"):
        UnigramTokenizer([("a", 1)])
    with raises_exactly(TypeError, "log_probs has a key that is not a non-empty str, expected pieces of text as keys"):
        UnigramTokenizer({"a": -1.0, "": -1.0})
    with raises_exactly(TypeError, "log_probs has a key that is not a non-empty str, expected pieces of text as keys"):
        UnigramTokenizer({"a": -1.0, 5: -1.0})


def test_unigram_names_vocab_size_and_prune_fraction_in_full():
    with raises_exactly(ValueError, "vocab_size is 2, expected at least 3: one piece for each character of text"):
        UnigramTokenizer.train("abc", vocab_size=2)
    with raises_exactly(ValueError, "prune_fraction is 1.5, expected a fraction strictly between 0 and 1 (with 0 "
                                    "or less no piece is ever dropped, so training would never end)"):
        UnigramTokenizer.train("abc", vocab_size=3, prune_fraction=1.5)
    with raises_exactly(ValueError, "max_piece_length is 0, expected a positive int"):
        UnigramTokenizer.train("abc", vocab_size=3, max_piece_length=0)


def test_unigram_keeps_its_unk_token_through_training():
    tokenizer = UnigramTokenizer.train("ab ab ab cd", vocab_size=5, unk_token="?")
    assert tokenizer.unk_token == "?" and tokenizer.tokenize_word("az") == ["a", "?"]


def test_empty_training_text_is_named():
    with raises_exactly(ValueError, "text is empty (or only spaces), expected some training text with words in it"):
        WordPieceTokenizer.train(" \n", vocab_size=5)


@pytest.mark.parametrize("pieces", ["ab", None, b"ab", 5, ["a", 5]])
def test_segmentations_refuses_pieces_that_are_not_a_collection_of_str(pieces):
    # A str used to pass as its own substrings: segmentations("ab", "ab") listed a+b and ab.
    with pytest.raises(TypeError, match=rf"^pieces is {re.escape(repr(pieces)[:60])} of type "
                                        rf"{type(pieces).__name__}, expected a collection of str such as"):
        segmentations("ab", pieces)


@pytest.mark.parametrize("vocab", ["abc", None, ["a", ""], ["a", 5]])
def test_wordpiece_refuses_a_vocab_that_is_not_a_list_of_pieces(vocab):
    # "abc" used to become the pieces a, b, c; None failed inside list() with no name.
    with pytest.raises(TypeError, match=rf"^vocab is {re.escape(repr(vocab))} of type {type(vocab).__name__}, "
                                        r"expected a list of non-empty str"):
        WordPieceTokenizer(vocab)


@pytest.mark.parametrize("build", [
    lambda unk: WordPieceTokenizer(["a"], unk_token=unk),
    lambda unk: WordPieceTokenizer.train("ab", 10, unk_token=unk),
    lambda unk: UnigramTokenizer({"a": -1.0}, unk_token=unk),
    lambda unk: UnigramTokenizer.train("ab", 2, unk_token=unk),
])
@pytest.mark.parametrize("unk", [None, "", 0])
def test_unk_token_must_be_a_non_empty_str(build, unk):
    # None used to be appended to WordPiece's vocabulary, and Unigram returned None as a piece.
    with pytest.raises(TypeError, match=rf"^unk_token is {re.escape(repr(unk))} of type {type(unk).__name__}, "
                                        r"expected a non-empty str such as '\[UNK\]'$"):
        build(unk)


def test_unigram_drops_at_least_one_piece_a_round_even_when_the_fraction_rounds_away(monkeypatch):
    sizes = []
    original = UnigramTokenizer._usage

    def spy(self, word_counts):
        sizes.append(len(self.log_probs))
        return original(self, word_counts)

    monkeypatch.setattr(UnigramTokenizer, "_usage", spy)
    # 1 - 1e-17 is 1.0 in floating point, so int(n * (1 - fraction)) is n: one piece goes a round.
    # The seed is all 36 substrings of abcdefgh (4 * 30 is more).
    tokenizer = UnigramTokenizer.train("abcdefgh", vocab_size=30, prune_fraction=1e-17)
    assert sizes == [36, 36, 35, 35, 34, 34, 33, 33, 32, 32, 31, 31, 30] and tokenizer.vocab_size == 30


def test_segmentations_ignore_an_empty_piece():
    assert segmentations("ab", {"", "a", "b"}) == [["a", "b"]]


def test_the_defaults_unk_tokens_and_the_longest_piece():
    assert WordPieceTokenizer(["a"]).vocab == ["a", "[UNK]"]
    assert WordPieceTokenizer.train("ab", 10).unk_token == "[UNK]"
    assert UnigramTokenizer({"a": -1.0}).tokenize("ab") == ["a", "<unk>"]
    assert UnigramTokenizer.train("ab ab", 2).unk_token == "<unk>"
    # abcdefghij: 10 + 9 + ... + 3 = 52 substrings of at most 8 letters, all kept (4 * 60 > 52).
    tokenizer = UnigramTokenizer.train("abcdefghij abcdefghij", vocab_size=60)
    assert tokenizer.vocab_size == 52 and max(map(len, tokenizer.log_probs)) == 8


def test_wordpiece_counts_a_pair_over_every_word_that_holds_it():
    # x ##a ##b and y ##a ##b: (##a, ##b) occurs twice, 2 / (2 * 2) ties (x, ##a) and (y, ##a)
    # at 1 / (1 * 2), and the smallest pair wins; counted once it would score 1 / 4 and lose.
    assert WordPieceTokenizer.train("xab yab", vocab_size=6).vocab == ["##a", "##b", "x", "y", "##ab", "[UNK]"]


def test_unigram_usage_adds_up_every_word():
    tokenizer = UnigramTokenizer({"a": -1.0, "b": -1.0, "ab": -1.5, "c": -1.0})
    # ab: ab (-1.5 beats -2); cab: c + ab; ba: b + a.
    assert tokenizer._usage({"ab": 3, "cab": 1, "ba": 2}) == {"ab": 4, "c": 1, "b": 2, "a": 2}


def test_unigram_prunes_the_piece_the_corpus_misses_least_whatever_its_name():
    # cd (3 times) and ab (once): cd costs the corpus more to lose, though "ab" sorts first.
    tokenizer = UnigramTokenizer.train("cd cd cd ab", vocab_size=5)
    assert set(tokenizer.log_probs) == {"a", "b", "c", "d", "cd"}
    # Add-one re-estimate after pruning: a, b, c, d once each, cd 3 times: 1 + 1 + 2 + 2 + 4 = 10.
    assert tokenizer.log_probs == pytest.approx({"a": math.log(2 / 10), "b": math.log(2 / 10), "c": math.log(1 / 10),
                                                 "d": math.log(1 / 10), "cd": math.log(4 / 10)})


def test_unigram_pruning_keeps_the_unk_token():
    tokenizer = UnigramTokenizer({"a": -1.0, "b": -1.0, "ab": -1.5}, unk_token="?")
    pruned = tokenizer._pruned({"ab": 1}, keep=2, chars={"a", "b"})
    assert set(pruned.log_probs) == {"a", "b"} and pruned.unk_token == "?"


def test_unigram_seed_counts_substrings_over_every_word(monkeypatch):
    seen = []
    original = UnigramTokenizer._usage

    def spy(self, word_counts):
        seen.append(dict(self.log_probs))
        return original(self, word_counts)

    monkeypatch.setattr(UnigramTokenizer, "_usage", spy)
    # b occurs in ab (3 times) and in bcdefghijk (once): 4 against a's 3. Of 54 substrings the 44
    # most common (4 * 11) start with the pieces seen 3 or 4 times, ab among them.
    UnigramTokenizer.train("ab ab ab bcdefghijk", vocab_size=11)
    assert "ab" in seen[0]
    assert seen[0]["b"] - seen[0]["a"] == pytest.approx(math.log(4 / 3))


def test_wordpiece_tokenize_word_names_word():
    with raises_exactly(TypeError, "word is None of type NoneType, expected a str"):
        WordPieceTokenizer(["a"]).tokenize_word(None)


def test_unigram_loss_is_usage_times_the_log_probability_lost():
    # Without ab the corpus spells it a + b: it loses 0 - (-2) = 2 per use, 1 use: 2.
    # Without bc: -1.5 - (-2) = 0.5 per use, 3 uses: 1.5. Unused ba loses nothing.
    tokenizer = UnigramTokenizer({"a": -1.0, "b": -1.0, "c": -1.0, "ab": 0.0, "bc": -1.5, "ba": -0.5})
    pruned = tokenizer._pruned({"ab": 1, "bc": 3}, keep=4, chars={"a", "b", "c"})
    assert set(pruned.log_probs) == {"a", "b", "c", "ab"}
    pruned = tokenizer._pruned({"ab": 1, "bc": 3}, keep=5, chars={"a", "b", "c"})
    assert set(pruned.log_probs) == {"a", "b", "c", "ab", "bc"}
