"""helpers.text.lexicon: every spelling rule on hand-picked words, each branch and edge.

 The expected forms are written out by hand
(how the words are spelt in British English), not computed by the rules under test.
"""

from __future__ import annotations

import pytest

from helpers.text import lexicon as lx


def test_third_person_of_a_verb_that_is_an_irregular_noun_is_regular():
    # "fish" has the noun plural "fish", but the verb takes -es: she fishes.
    assert lx.third_person("fish") == "fishes"
    assert lx.plural("fish") == "fish"
    assert lx.third_person("man") == "mans"
    assert lx.third_person("knife") == "knifes"


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: lx.number_word(3.0), TypeError, "n is 3.0 (a float), expected a whole number from 0 to 99"),
    (lambda: lx.number_word(True), TypeError,
     "n is True (a bool), expected a whole number from 0 to 99"),
    (lambda: lx.number_word(-1), ValueError, "n is -1, expected a whole number from 0 to 99"),
    (lambda: lx.number_word(100), ValueError, "n is 100, expected a whole number from 0 to 99"),
    (lambda: lx.ordinal(2.0), TypeError, "n is 2.0 (a float), expected an int >= 0"),
    (lambda: lx.ordinal(True), TypeError, "n is True (a bool), expected an int >= 0"),
    (lambda: lx.ordinal(-3), ValueError, "n is -3, expected an int >= 0"),
])
def test_numbers_refuse_what_is_not_a_whole_number_in_range(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert str(caught.value) == message


# --- the spelling rules, written out by hand -------------------------------------------------

PLURALS = {
    "cat": "cats", "box": "boxes", "bus": "buses", "buzz": "buzzes", "church": "churches",
    "dish": "dishes", "moth": "moths", "berry": "berries", "day": "days", "toy": "toys",
    "y": "ys", "child": "children", "sheep": "sheep", "mouse": "mice", "wolf": "wolves",
    "potato": "potatoes", "fish": "fish", "key": "keys", "fly": "flies",
}
THIRD_PERSONS = {
    "go": "goes", "do": "does", "undo": "undoes", "run": "runs", "wash": "washes",
    "carry": "carries", "play": "plays", "fix": "fixes", "fish": "fishes", "kiss": "kisses",
    "buzz": "buzzes", "catch": "catches", "man": "mans", "sheep": "sheeps", "hurry": "hurries",
}
PASTS = {
    "walk": "walked", "bake": "baked", "carry": "carried", "dry": "dried", "stay": "stayed",
    "stop": "stopped", "hop": "hopped", "clap": "clapped", "hug": "hugged", "strip": "stripped",
    "play": "played", "visit": "visited", "open": "opened", "wait": "waited", "boil": "boiled",
    "travel": "travelled", "label": "labelled", "signal": "signalled", "snow": "snowed",
    "fix": "fixed", "tie": "tied", "free": "freed", "ski": "skied", "go": "went", "eat": "ate",
    "dream": "dreamt", "wind": "wound", "undo": "undid", "bend": "bent",
}
PARTICIPLES = {
    "walk": "walking", "bake": "baking", "hike": "hiking", "use": "using", "tie": "tying",
    "lie": "lying", "die": "dying", "see": "seeing", "flee": "fleeing", "dye": "dyeing",
    "toe": "toeing", "be": "being", "run": "running", "hop": "hopping", "travel": "travelling",
    "open": "opening", "fix": "fixing", "ski": "skiing", "go": "going", "snow": "snowing",
    "play": "playing", "carry": "carrying", "visit": "visiting",
}
COMPARATIVES = {
    "big": "bigger", "wet": "wetter", "hot": "hotter", "thin": "thinner", "red": "redder",
    "brave": "braver", "late": "later", "free": "freer", "happy": "happier", "dry": "drier",
    "grey": "greyer", "slow": "slower", "new": "newer", "tall": "taller", "quiet": "quieter",
    "good": "better", "bad": "worse", "far": "farther",
}
SUPERLATIVES = {
    "big": "biggest", "wet": "wettest", "brave": "bravest", "late": "latest", "happy": "happiest",
    "tall": "tallest", "slow": "slowest", "new": "newest", "good": "best", "bad": "worst",
    "far": "farthest",
}
ADVERBS = {
    "quick": "quickly", "brave": "bravely", "pale": "palely", "sudden": "suddenly",
    "happy": "happily", "busy": "busily", "gentle": "gently", "simple": "simply", "able": "ably",
    "full": "fully", "dull": "dully", "true": "truly", "careful": "carefully", "grey": "greyly",
}
NESSES = {
    "kind": "kindness", "sad": "sadness", "happy": "happiness", "unhappy": "unhappiness",
    "lazy": "laziness", "silly": "silliness", "gentle": "gentleness", "grey": "greyness",
}
AGENTS = {
    "sing": "singer", "dance": "dancer", "ride": "rider", "run": "runner", "swim": "swimmer",
    "jog": "jogger", "knit": "knitter", "travel": "traveller", "climb": "climber",
    "dream": "dreamer", "ski": "skier", "play": "player", "snow": "snower",
}


@pytest.mark.parametrize(("rule", "cases"), [
    (lx.plural, PLURALS), (lx.third_person, THIRD_PERSONS), (lx.past, PASTS),
    (lx.present_participle, PARTICIPLES), (lx.comparative, COMPARATIVES),
    (lx.superlative, SUPERLATIVES), (lx.adverb, ADVERBS), (lx.ness, NESSES), (lx.agent, AGENTS),
], ids=lambda v: getattr(v, "__name__", ""))
def test_rule_on_hand_written_forms(rule, cases):
    assert {word: rule(word) for word in cases} == cases


@pytest.mark.parametrize(("word", "doubles"), [
    ("stop", True), ("big", True), ("cat", True), ("strip", True), ("travel", True),
    ("label", True), ("signal", True),
    ("zaP", True), ("zaX", True),  # only lowercase w, x, y are kept from doubling: X is not x
    ("at", False), ("a", False), ("", False), ("eat", False), ("boat", False), ("visit", False),
    ("open", False), ("quiet", False), ("ski", False), ("snow", False), ("box", False),
    ("play", False), ("start", False), ("bake", False), ("aim", False), ("odd", False),
])
def test_which_words_double_their_last_letter(word, doubles):
    assert lx._ends_cvc(word) is doubles


@pytest.mark.parametrize(("word", "expected"), [
    ("berry", True), ("by", True), ("fly", True), ("day", False), ("key", False), ("y", False),
    ("", False), ("yes", False), ("my", True),
])
def test_consonant_then_y(word, expected):
    assert lx._consonant_y(word) is expected


def test_prefixes():
    assert lx.re_prefixed("paint") == "repaint"
    assert lx.re_prefixed("filled") == "refilled"
    assert lx.un("happy") == "unhappy"
    assert lx.un("lock") == "unlock"


@pytest.mark.parametrize(("n", "word"), [
    (0, "zero"), (1, "one"), (9, "nine"), (10, "ten"), (11, "eleven"), (19, "nineteen"),
    (20, "twenty"), (21, "twenty-one"), (30, "thirty"), (42, "forty-two"), (55, "fifty-five"),
    (69, "sixty-nine"), (77, "seventy-seven"), (88, "eighty-eight"), (90, "ninety"),
    (99, "ninety-nine"),
])
def test_number_words(n, word):
    assert lx.number_word(n) == word


def test_number_word_takes_numpy_integers():
    np = pytest.importorskip("numpy")
    assert lx.number_word(np.int64(42)) == "forty-two"
    assert lx.ordinal(np.int64(22)) == "22nd"


@pytest.mark.parametrize(("n", "word"), [
    (0, "0th"), (1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (10, "10th"), (11, "11th"),
    (12, "12th"), (13, "13th"), (14, "14th"), (21, "21st"), (22, "22nd"), (23, "23rd"),
    (101, "101st"), (102, "102nd"), (103, "103rd"), (111, "111th"), (112, "112th"),
    (113, "113th"), (211, "211th"), (1001, "1001st"),
])
def test_ordinals(n, word):
    assert lx.ordinal(n) == word
