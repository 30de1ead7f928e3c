"""A translation task generated from the course grammar (notebook 10, section 1).

Every sentence of the course corpus is turned, by a fixed rule, into a made-up language
("Grammish") whose word order differs from English, so that a translator must reorder words
and cannot copy them one for one:

    1. words are lower-cased; punctuation marks are tokens of their own;
    2. the articles "a", "an", "the" are dropped (Grammish has none);
    3. an adjective follows its noun ("red box" -> "box red");
    4. the first past-tense verb of each clause moves to the end of that clause and takes the
       past-tense suffix "-ta" as a token of its own (verb-final, like Japanese or Turkish);
    5. a plural noun becomes its singular and the suffix "-ne";
    6. every remaining English word is replaced by its Grammish word, from a lexicon drawn with
       a fixed seed.

A clause ends at each punctuation mark. The rule is deterministic, so the dataset is the same
on every machine; `sentence_splits` splits by *sentence*, so no test sentence is seen in training.

Shapes: B batch, M source tokens, N target tokens.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from helpers import checks
from helpers.text import corpus
from helpers.training.trainer import learning_rate

PAD, BOS, EOS, UNK, MASK = "<pad>", "<bos>", "<eos>", "<unk>", "<mask>"
SPECIALS = (PAD, BOS, EOS, UNK, MASK)  # ids 0..4 in every WordVocab
PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = range(len(SPECIALS))
LEXICON_SEED = 2014  # the year of the first neural seq2seq translators
PAST, PLURAL = "-ta", "-ne"
ARTICLES = {"a", "an", "the"}
ADJECTIVES = set(corpus.PERSON_ADJECTIVES + corpus.THING_ADJECTIVES) | {
    home.split()[0] for home in corpus.HOMES}
PAST_VERBS = {"was", "lived", "liked", "loved", "went", "walked", "found", "saw", "said",
              "wanted", "asked", "called", "smiled", "felt", "carried", "pulled", "cleaned",
              "opened", "lifted", "fixed", "took", "barked", "ran", "jumped", "wagged", "sat",
              "looked", "made", "fell", "named", "left"}
PLURALS = {"books": "book", "songs": "song", "pictures": "picture", "flowers": "flower",
           "birds": "bird", "stars": "star", "trees": "tree", "stories": "story",
           "boats": "boat", "maps": "map", "circles": "circle"}
_WORD = re.compile(r"[A-Za-z]+|[^\sA-Za-z]")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def check_special_ids(pad_id: int, bos_id: int, eos_id: int, vocab_sizes: dict[str, int]) -> None:
    """Raise unless pad, bos and eos are three different ids inside every vocabulary given."""
    ids = {"pad_id": pad_id, "bos_id": bos_id, "eos_id": eos_id}
    for name, value in ids.items():
        checks.non_negative_int(name, value)
    if len(set(ids.values())) < 3:
        raise ValueError(f"the special ids coincide (pad_id={pad_id}, bos_id={bos_id}, "
                         f"eos_id={eos_id}): expected three different ids, or padding would read "
                         "as the end of a sentence")
    for vocab_name, size in vocab_sizes.items():
        for name, value in ids.items():
            if value >= size:
                raise ValueError(f"{name} is {value}, outside {vocab_name} {size}: expected an "
                                 f"id in [0, {size - 1}]")


def english_words(sentence: str) -> list[str]:
    """'The dog barked.' -> ['the', 'dog', 'barked', '.']: lower-case words and punctuation."""
    if not isinstance(sentence, str):
        raise TypeError(f"sentence is a {type(sentence).__name__}, expected a str")
    words = [w.lower() for w in _WORD.findall(sentence)]
    if not words:
        raise ValueError(f"sentence is {sentence!r}, expected at least one word")
    return words


def make_lexicon(words: Iterable[str], seed: int = LEXICON_SEED) -> dict[str, str]:
    """English word -> a made-up word of two or three syllables, one-to-one, fixed by `seed`."""
    rng = random.Random(seed)
    lexicon: dict[str, str] = {}
    used: set[str] = set()
    for word in sorted(set(words)):
        made_up = word
        while made_up in used or made_up == word:
            made_up = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3))))
        lexicon[word] = made_up
        used.add(made_up)
    return lexicon


def _reorder_clause(clause: list[str]) -> list[str]:
    """Steps 2-5 on one clause (no punctuation inside), still in English words."""
    words = [w for w in clause if w not in ARTICLES]
    out: list[str] = []
    i = 0
    while i < len(words):  # step 3: adjective after noun
        if words[i] in ADJECTIVES and i + 1 < len(words) and words[i + 1] not in ADJECTIVES \
                and words[i + 1] not in PAST_VERBS:
            out += [words[i + 1], words[i]]
            i += 2
        else:
            out.append(words[i])
            i += 1
    verb = next((w for w in out if w in PAST_VERBS), None)
    if verb is not None:  # step 4: the verb goes last
        out.remove(verb)
        out += [verb, PAST]
    plural_split: list[str] = []
    for w in out:  # step 5
        plural_split += [PLURALS[w], PLURAL] if w in PLURALS else [w]
    return plural_split


def translate_words(words: Sequence[str], lexicon: dict[str, str]) -> list[str]:
    """English words (from `english_words`) -> Grammish words, by the six steps above."""
    out: list[str] = []
    clause: list[str] = []
    for w in list(words) + [None]:
        if w is None or not w.isalpha():  # a punctuation mark (or the end) closes the clause
            out += [lexicon.get(x, x) if x not in (PAST, PLURAL) else x for x in _reorder_clause(clause)]
            if w is not None:
                out.append(w)
            clause = []
        else:
            clause.append(w)
    return out


class WordVocab:
    """Words <-> ids, with the special tokens <pad>, <bos>, <eos>, <unk>, <mask> as ids 0..4."""

    def __init__(self, words: Iterable[str]) -> None:
        self.itos = list(SPECIALS) + sorted(set(words) - set(SPECIALS))
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, words: Sequence[str]) -> list[int]:
        """Words -> ids; a word not in the vocabulary raises (no silent <unk>)."""
        unknown = [w for w in words if w not in self.stoi]
        if unknown:
            raise ValueError(f"words contains {unknown[:3]}, which are not in this vocabulary of "
                             f"{self.vocab_size} words")
        return [self.stoi[w] for w in words]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """ids -> words, stopping at <eos> and skipping <pad> and <bos>."""
        words = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"ids contains {i}, expected ids in [0, {self.vocab_size - 1}]")
            if i not in (PAD_ID, BOS_ID):
                words.append(self.itos[i])
        return words


class TranslationData:
    """The whole task: English sentences, their Grammish translations, both vocabularies."""

    def __init__(self, sentences: Sequence[str]) -> None:
        self.english = [english_words(s) for s in sentences]
        self.lexicon = make_lexicon(PLURALS.get(w, w) for ws in self.english for w in ws
                                    if w.isalpha() and w not in ARTICLES)
        self.grammish = [translate_words(ws, self.lexicon) for ws in self.english]
        self.sentences = list(sentences)
        self.source_vocab = WordVocab(w for ws in self.english for w in ws)
        self.target_vocab = WordVocab(w for ws in self.grammish for w in ws)

    @classmethod
    def from_corpus(cls) -> TranslationData:
        """Every distinct sentence of the course corpus, sorted (so the order is fixed)."""
        return cls(sorted({line for line in corpus.load_corpus().splitlines() if line.strip()}))

    def pair(self, index: int) -> tuple[list[int], list[int]]:
        """(source ids, target ids + <eos>) of sentence `index`."""
        source = self.source_vocab.encode(self.english[index])
        return source, self.target_vocab.encode(self.grammish[index]) + [EOS_ID]


def sentence_splits(n_sentences: int, fractions: tuple[float, float] = (0.1, 0.1),
                    seed: int = 0) -> tuple[list[int], list[int], list[int]]:
    """Indices of train, validation and test sentences: a seeded shuffle cut in three parts.

    fractions: the validation and test shares, each in (0, 1); every split gets at least one sentence.
    """
    checks.positive_int("n_sentences", n_sentences)
    if not isinstance(fractions, (tuple, list)) or len(fractions) != 2:
        raise ValueError(f"fractions is {fractions!r}, expected (validation share, test share)")
    for name, value in zip(("fractions[0] (validation)", "fractions[1] (test)"), fractions, strict=True):
        checks.number_in(name, value, 0.0, 1.0, low_open=True, high_open=True)
    n_val, n_test = (max(1, int(f * n_sentences)) for f in fractions)
    if n_val + n_test >= n_sentences:
        raise ValueError(f"fractions {tuple(fractions)} of {n_sentences} sentences leave "
                         f"{n_sentences - n_val - n_test} for training: expected every split "
                         "to hold at least one sentence (smaller fractions, or more sentences)")
    order = list(range(n_sentences))
    random.Random(seed).shuffle(order)
    return order[n_val + n_test:], order[:n_val], order[n_val:n_val + n_test]


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> Tensor:
    """Lists of ids of different lengths -> (B, longest) long tensor, padded on the right."""
    checks.non_negative_int("pad_id", pad_id)
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("sequences must be a non-empty list of non-empty id lists: an empty "
                         "sentence has nothing to translate")
    out = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        out[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def make_batch(data: TranslationData, indices: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """source (B, M), decoder input (B, N) starting with <bos>, decoder target (B, N) ending <eos>.

    `data` is anything with a `pair(index)` method (TranslationData, or bottleneck.JoinedPairs).
    """
    size = len(data.sentences) if isinstance(data, TranslationData) else len(data)
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < size]
    if bad or not len(indices):
        raise ValueError(f"indices holds {bad[:3] or 'nothing'}: expected a non-empty list of "
                         f"example numbers in [0, {size - 1}]")
    pairs = [data.pair(i) for i in indices]
    source = pad_batch([s for s, _ in pairs])
    target = pad_batch([t for _, t in pairs])
    decoder_in = torch.cat([torch.full((len(pairs), 1), BOS_ID), target[:, :-1]], dim=1)
    decoder_in[decoder_in == EOS_ID] = PAD_ID  # <eos> is predicted, never read
    return source, decoder_in, target


# --- training and measuring a translator (the Transformer and the GRU alike) ---------------

def train_translator(model: torch.nn.Module, data: TranslationData, train: Sequence[int],
                     steps: int, batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
                     label_smoothing: float = 0.0,
                     on_step: Callable[[int], None] | None = None) -> list[float]:
    """Teacher forcing with AdamW (notebook 7's schedule) for `steps` steps on random batches of `train`; returns the losses.

    model(source, target_in) -> logits (B, N, V); the loss skips padding. `data` is anything with
    `pair(index)`; on_step(step), if given, runs after every update (to measure mid-run).
    """
    checks.positive_int("steps", steps)
    checks.positive_int("batch_size", batch_size)
    checks.positive_float("lr", lr)
    checks.number_in("label_smoothing", label_smoothing, 0.0, 1.0, high_open=True)
    if batch_size > len(train):
        raise ValueError(f"batch_size is {batch_size}, larger than the {len(train)} training "
                         "examples in train: expected at most len(train)")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, foreach=True)
    model.train()
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:  # notebook 7's warm-up and cosine decay
            group["lr"] = learning_rate(step / steps, peak=lr)
        source, target_in, target = make_batch(data, rng.sample(list(train), batch_size))
        logits = model(source, target_in)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                                 ignore_index=PAD_ID, label_smoothing=label_smoothing)
        if not math.isfinite(loss.item()):  # as the Trainer does: stop, never train on NaN
            raise FloatingPointError(f"the training loss is {loss.item()} at step {step}: stopped "
                                     "before the update spoils the weights (try a lower lr)")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step)
    model.eval()
    return losses


def score_translations(predicted: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """predicted (B, K), target (B, N) ending in <eos> -> (exact match (B,) bool, token accuracy (B,)).

    Token accuracy: the share of the target's tokens (with <eos>) the prediction has at the same place.
    """
    for name, value in (("predicted", predicted), ("target", target)):
        if not isinstance(value, Tensor) or value.dim() != 2:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"{name} has shape {got}, expected (B, length) ids")
    if predicted.shape[0] != target.shape[0]:
        raise ValueError(f"predicted has {predicted.shape[0]} rows and target {target.shape[0]}: "
                         "expected one prediction per target")
    empty = (target != PAD_ID).sum(1).eq(0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"target rows {empty} hold padding only: expected each to end in <eos> "
                         "(their accuracy would be 0 / 0)")
    width = max(predicted.shape[1], target.shape[1])
    p = torch.nn.functional.pad(predicted, (0, width - predicted.shape[1]), value=PAD_ID)
    t = torch.nn.functional.pad(target, (0, width - target.shape[1]), value=PAD_ID)
    real = t != PAD_ID
    same = (p == t) & real
    exact = (p == t).all(dim=1)  # after <eos> both hold padding
    return exact, same.sum(1) / real.sum(1)
