"""The other two subword families beside BPE: WordPiece (BERT) and Unigram (SentencePiece).

Derived in notebook 1 ("Tokenization"), section 7 ("BPE, WordPiece and Unigram"): both are
trained there on the course corpus beside byte-level BPE (`helpers.text.bpe`), and `segmentations`
lists the ways to cut the notes' example word "unigram" that a Unigram model scores.

Both work on words (spaces dropped, punctuation split off), as BERT's WordPiece and
SentencePiece's Unigram usually do, and both train on the distinct words with their counts.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from itertools import pairwise

from helpers import checks

MAX_SEGMENTATIONS = 100_000  # the most segmentations `segmentations` lists


# --- Unigram: every segmentation has a probability ---------------------------------------------


def segmentations(word: str, pieces: Collection[str]) -> list[list[str]]:
    """Every way to cut `word` into consecutive pieces that all belong to `pieces`.

    segmentations("abc", {"a", "b", "c", "ab"}) -> [["a", "b", "c"], ["ab", "c"]]. The number of
    ways grows exponentially with the length (2 ** 19 for 20 letters if every substring is a
    piece), so it is counted first, and a word with more than MAX_SEGMENTATIONS is refused.
    """
    word = checks.text("word", word)
    if isinstance(pieces, str | bytes) or not isinstance(pieces, Collection) \
            or not all(isinstance(piece, str) for piece in pieces):
        raise TypeError(f"pieces is {pieces!r:.60} of type {type(pieces).__name__}, expected a collection "
                        "of str such as {'a', 'ab'} (a single str would match any of its substrings)")
    longest = max(map(len, pieces), default=0)
    # ways[start]: how many segmentations word[start:] has; counting is cheap, listing is not.
    ways = [0] * len(word) + [1]
    for start in range(len(word) - 1, -1, -1):
        ways[start] = sum(ways[end] for end in range(start + 1, min(len(word), start + longest) + 1)
                          if word[start:end] in pieces)
    if ways[0] > MAX_SEGMENTATIONS:
        raise ValueError(f"word {word!r:.40} has {ways[0]:,} segmentations, expected at most "
                         f"{MAX_SEGMENTATIONS:,} (MAX_SEGMENTATIONS): listing them all would take too long")
    # Extend cuts of word[:start] piece by piece, only towards ends that can still be completed.
    cuts: list[list[list[str]]] = [[[]]] + [[] for _ in word]
    for start in range(len(word)):
        for end in range(start + 1, min(len(word), start + longest) + 1):
            if cuts[start] and ways[end] and word[start:end] in pieces:
                cuts[end].extend([*cut, word[start:end]] for cut in cuts[start])
    return sorted(cuts[-1], key=lambda cut: [len(piece) for piece in cut]) if ways[0] else []


# --- words: what WordPiece and Unigram train on and encode --------------------------------------

_WORD = re.compile(r"\w+|[^\w\s]")


def split_words(text: str) -> list[str]:
    """Words and punctuation marks, spaces dropped: "Soup is yummy." -> ["Soup", "is", "yummy", "."]."""
    return _WORD.findall(checks.text("text", text))


def _check_unk_token(unk_token: object) -> None:
    if not isinstance(unk_token, str) or not unk_token:
        raise TypeError(f"unk_token is {unk_token!r:.60} of type {type(unk_token).__name__}, expected a "
                        "non-empty str such as '[UNK]'")


def _word_counts(text: str) -> Counter[str]:
    counts = Counter(split_words(text))
    if not counts:
        raise ValueError("text is empty (or only spaces), expected some training text with words in it")
    return counts



# --- WordPiece ---------------------------------------------------------------------------------


class WordPieceTokenizer:
    """WordPiece (BERT): a piece that continues a word is written with "##" in front ("##ing").

    Training merges pairs like BPE but ranks them by count(ab) / (count(a) * count(b)), which
    prefers pairs whose parts rarely appear apart. Encoding takes, from the left, the longest
    piece in the vocabulary; a word it cannot spell becomes `unk_token`.
    """

    def __init__(self, vocab: Sequence[str], unk_token: str = "[UNK]") -> None:
        if isinstance(vocab, str) or not isinstance(vocab, Sequence) \
                or not all(isinstance(piece, str) and piece for piece in vocab):
            raise TypeError(f"vocab is {vocab!r:.60} of type {type(vocab).__name__}, expected a list of "
                            "non-empty str such as ['a', '##b']")
        _check_unk_token(unk_token)
        self.vocab = list(vocab)
        self.unk_token = unk_token
        if unk_token not in self.vocab:
            self.vocab.append(unk_token)
        self._ids = {piece: index for index, piece in enumerate(self.vocab)}
        self._longest = max(len(piece) for piece in self.vocab)

    @classmethod
    def train(cls, text: str, vocab_size: int, unk_token: str = "[UNK]") -> WordPieceTokenizer:
        _check_unk_token(unk_token)
        word_counts = _word_counts(text)
        spellings = {word: [word[0]] + ["##" + char for char in word[1:]] for word in word_counts}
        vocab = sorted({piece for pieces in spellings.values() for piece in pieces})
        vocab_size = checks.size_at_least("vocab_size", vocab_size, len(vocab) + 1, f": the {len(vocab)} "
                                    f"characters (first and continuing) of text plus {unk_token}")
        while len(vocab) + 1 < vocab_size:
            pair = cls._best_pair(spellings, word_counts)
            if pair is None:
                break
            joined = pair[0] + pair[1].removeprefix("##")
            vocab.append(joined)
            spellings = {word: cls._join(pieces, pair, joined) for word, pieces in spellings.items()}
        return cls(vocab, unk_token)

    @staticmethod
    def _best_pair(spellings: Mapping[str, list[str]], word_counts: Mapping[str, int]) -> tuple[str, str] | None:
        piece_counts: Counter[str] = Counter()
        pair_counts: Counter[tuple[str, str]] = Counter()
        for word, pieces in spellings.items():
            for piece in pieces:
                piece_counts[piece] += word_counts[word]
            for pair in pairwise(pieces):
                pair_counts[pair] += word_counts[word]
        if not pair_counts:
            return None
        return min(pair_counts, key=lambda pair: (
            -pair_counts[pair] / (piece_counts[pair[0]] * piece_counts[pair[1]]), pair))

    @staticmethod
    def _join(pieces: list[str], pair: tuple[str, str], joined: str) -> list[str]:
        result: list[str] = []
        for piece in pieces:
            if result and (result[-1], piece) == pair:
                result[-1] = joined
            else:
                result.append(piece)
        return result

    def tokenize_word(self, word: str) -> list[str]:
        """Longest vocabulary piece first, left to right; [unk_token] if some part cannot be spelled."""
        word = checks.text("word", word)
        pieces: list[str] = []
        start = 0
        while start < len(word):
            prefix = "##" if start else ""
            for end in range(min(len(word), start + self._longest), start, -1):
                if prefix + word[start:end] in self._ids:
                    pieces.append(prefix + word[start:end])
                    start = end
                    break
            else:
                return [self.unk_token]
        return pieces

    def tokenize(self, text: str) -> list[str]:
        return [piece for word in split_words(text) for piece in self.tokenize_word(word)]

    def encode(self, text: str) -> list[int]:
        return [self._ids[piece] for piece in self.tokenize(text)]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)



# --- Unigram -----------------------------------------------------------------------------------


class UnigramTokenizer:
    """Unigram language model (SentencePiece): every piece has a probability, a segmentation's
    probability is the product of its pieces', and encoding picks the most probable one.

    log_probs: piece -> natural log of its probability. Each character missing from it becomes
    one `unk_token`, scored 10 below the least likely piece (SentencePiece's penalty).
    """

    def __init__(self, log_probs: Mapping[str, float], unk_token: str = "<unk>") -> None:
        if not isinstance(log_probs, Mapping) or not log_probs:
            raise ValueError(f"log_probs is {log_probs!r:.60}, expected a non-empty dict piece -> log-probability")
        if not all(isinstance(piece, str) and piece for piece in log_probs):
            raise TypeError("log_probs has a key that is not a non-empty str, expected pieces of text as keys")
        _check_unk_token(unk_token)
        self.log_probs = dict(log_probs)
        self.unk_token = unk_token
        self._longest = max(len(piece) for piece in self.log_probs)
        self._unk_score = min(self.log_probs.values()) - 10.0

    @classmethod
    def train(cls, text: str, vocab_size: int, max_piece_length: int = 8,
              prune_fraction: float = 0.2, unk_token: str = "<unk>") -> UnigramTokenizer:
        """A simplified Unigram trainer: start from many frequent substrings, then alternate
        (a) re-estimating each piece's probability from how often the best segmentations use it,
        (b) dropping the `prune_fraction` of pieces whose loss costs the corpus least,
        until `vocab_size` pieces are left. Single characters are never dropped.

        (SentencePiece re-estimates with expected counts over all segmentations; counting only
        the best one, as here, is its common "hard" simplification.)
        """
        _check_unk_token(unk_token)
        word_counts = _word_counts(text)
        chars = {char for word in word_counts for char in word}
        vocab_size = checks.size_at_least("vocab_size", vocab_size, len(chars), ": one piece for each character of text")
        max_piece_length = checks.positive_int("max_piece_length", max_piece_length)
        prune_fraction = checks.number_in(
            "prune_fraction", prune_fraction, 0, 1, low_open=True, high_open=True,
            expected="a fraction strictly between 0 and 1 (with 0 or less no piece is ever dropped, "
                     "so training would never end)")
        substrings: Counter[str] = Counter()
        for word, count in word_counts.items():
            for start in range(len(word)):
                for end in range(start + 1, min(len(word), start + max_piece_length) + 1):
                    substrings[word[start:end]] += count
        seed = {piece for piece, _ in substrings.most_common(4 * vocab_size)} | chars
        model = cls(_normalised({piece: substrings[piece] for piece in seed}), unk_token)
        while True:
            usage = model._usage(word_counts)
            model = cls(_normalised({piece: usage[piece] + 1 for piece in model.log_probs}), unk_token)
            if len(model.log_probs) <= vocab_size:
                return model
            # At least one piece goes each round, however small prune_fraction is.
            keep = max(vocab_size, min(len(model.log_probs) - 1, int(len(model.log_probs) * (1 - prune_fraction))))
            model = model._pruned(model._usage(word_counts), keep, chars)

    def _usage(self, word_counts: Mapping[str, int]) -> Counter[str]:
        """How many times the corpus's best segmentations use each piece."""
        usage: Counter[str] = Counter()
        for word, count in word_counts.items():
            for piece in self.tokenize_word(word):
                usage[piece] += count
        return usage

    def _pruned(self, usage: Mapping[str, int], keep: int, chars: Collection[str]) -> UnigramTokenizer:
        def loss(piece: str) -> float:  # how much log-likelihood the corpus loses without `piece`
            if piece in chars:
                return float("inf")
            alternative, _ = self._best(piece, exclude=piece)
            return usage.get(piece, 0) * (self.log_probs[piece] - alternative)

        ranked = sorted(self.log_probs, key=lambda piece: (-loss(piece), piece))
        return UnigramTokenizer({piece: self.log_probs[piece] for piece in ranked[:keep]}, self.unk_token)

    def _best(self, word: str, exclude: str | None = None) -> tuple[float, list[str] | None]:
        """Viterbi: the most probable segmentation of `word` and its log-probability."""
        best: list[tuple[float, list[str] | None]] = [(0.0, [])]
        for end in range(1, len(word) + 1):
            best.append((float("-inf"), None))
            for start in range(max(0, end - self._longest), end):
                piece = word[start:end]
                score_before, pieces_before = best[start]
                log_p = self.log_probs.get(piece)
                if log_p is None and end - start == 1:  # an unknown character: one unk_token
                    piece, log_p = self.unk_token, self._unk_score
                if pieces_before is None or piece == exclude or log_p is None:
                    continue
                score = score_before + log_p
                if score > best[end][0]:
                    best[end] = (score, [*pieces_before, piece])
        return best[-1]

    def score(self, pieces: Sequence[str]) -> float:
        """log P(segmentation) = the sum of its pieces' log-probabilities (-inf for an unknown piece)."""
        return sum(self.log_probs.get(piece, float("-inf")) for piece in pieces)

    def tokenize_word(self, word: str) -> list[str]:
        _, pieces = self._best(checks.text("word", word))
        return [self.unk_token] if pieces is None else pieces

    def tokenize(self, text: str) -> list[str]:
        return [piece for word in split_words(text) for piece in self.tokenize_word(word)]

    @property
    def vocab_size(self) -> int:
        return len(self.log_probs)


def _normalised(counts: Mapping[str, float]) -> dict[str, float]:
    """piece -> log(count / total)."""
    total = sum(counts.values())
    return {piece: math.log(count / total) for piece, count in counts.items()}
