"""The rich course corpus: tales, conversations and diary pages from a larger grammar.

`helpers.text.corpus` is a 321-word grammar: enough to see a model learn templates, too small for a
tokenizer to find real subwords (its BPE runs out of pairs after a few hundred merges). This
grammar draws on `helpers.text.lexicon`, thousands of word forms made from stems by English spelling
rules (cat/cats, box/boxes, carry/carried/carrying, big/bigger/biggest, happy/unhappy/happily),
and writes three kinds of text: tales with quoted speech, conversations, and diary pages with
dates, clock times and numbers written in digits and in words.

Like the small grammar, it is exact: `is_rich_well_formed` says whether a sentence is one the
grammar can produce, so the text a model writes can be scored. The corpus is generated once by
`data/make_corpus.py` into `data/corpus_rich.txt`; a test checks that the bytes match.
"""

from __future__ import annotations

import random
import re
from functools import cache

from helpers import checks
from helpers.text import lexicon as lx
from helpers.text.corpus import data_dir, with_article

RICH_CORPUS_FILE = "corpus_rich.txt"
RICH_CORPUS_SEED = 2019  # the year of GPT-2
RICH_CORPUS_MIN_BYTES = 2_000_000


def _forms(words: list[str], *rules) -> tuple[str, ...]:
    """Every word of `words` passed through every rule, deduplicated, in a fixed order."""
    return tuple(dict.fromkeys(rule(w) for rule in rules for w in words))


def _same(word: str) -> str:
    return word


_NUMBERS = range(2, 100)
_ADJ_ALL = lx.ADJ_SHORT + lx.ADJ_LONG
_SHORT = set(lx.ADJ_SHORT)

# Every slot of the templates and the words it takes. A trailing digit ({animal2}) is a second,
# independent draw from the same list.
SLOTS: dict[str, tuple[str, ...]] = {
    "hero": tuple(lx.NAMES_SHE + lx.NAMES_HE),
    "friend": tuple(lx.NAMES_SHE + lx.NAMES_HE),
    "name": tuple(lx.NAMES_SHE + lx.NAMES_HE),
    "Subj": ("He", "She"),
    "subj": ("he", "she"),
    "poss": ("his", "her"),
    "a": ("a", "an"),
    "animal": tuple(lx.ANIMALS),
    "animals": _forms(lx.ANIMALS, lx.plural),
    "food": tuple(lx.FOODS),
    "foods": _forms(lx.FOODS, lx.plural),
    "thing": tuple(lx.THINGS),
    "things": _forms(lx.THINGS, lx.plural),
    "place": tuple(lx.PLACES),
    "places": _forms(lx.PLACES, lx.plural),
    "person": tuple(lx.PEOPLE),
    "people": _forms(lx.PEOPLE + lx.FAMILY, lx.plural),
    "relative": tuple(lx.FAMILY),
    "do_thing": tuple(lx.VERBS_THING),
    "did_thing": _forms(lx.VERBS_THING, lx.past),
    "does_thing": _forms(lx.VERBS_THING, lx.third_person),
    "do_food": tuple(lx.VERBS_FOOD),
    "did_food": _forms(lx.VERBS_FOOD, lx.past),
    "doing_food": _forms(lx.VERBS_FOOD, lx.present_participle),
    "did_alone": _forms(lx.VERBS_ALONE, lx.past),
    "does_alone": _forms(lx.VERBS_ALONE, lx.third_person),
    "doing_thing": _forms(lx.VERBS_THING, lx.present_participle),
    "doing_alone": _forms(lx.VERBS_ALONE, lx.present_participle),
    "go": tuple(lx.VERBS_TO),
    "went": _forms(lx.VERBS_TO, lx.past),
    "going": _forms(lx.VERBS_TO, lx.present_participle),
    "undid": tuple(lx.un(lx.past(v)) for v in lx.UN_VERBS),
    "undo": tuple(lx.un(v) for v in lx.UN_VERBS),
    "adj_person": tuple(lx.ADJ_PERSON),
    "adj_thing": tuple(lx.ADJ_THING),
    "adj_food": tuple(lx.ADJ_FOOD),
    "weather": tuple(lx.ADJ_WEATHER),
    "un_adj": _forms(lx.UN_PERSON, lx.un),
    "ness": _forms(lx.NESS_SOURCES, lx.ness),
    "agent": _forms(lx.AGENT_SOURCES, lx.agent),
    "re_did": tuple(lx.re_prefixed(lx.past(v)) for v in lx.RE_VERBS),
    "un_thing": _forms([a for a in lx.UN_ADJECTIVES if a not in lx.UN_PERSON], lx.un),
    "er_person": _forms([a for a in lx.ADJ_PERSON if a in _SHORT], lx.comparative),
    "er_thing": _forms([a for a in lx.ADJ_THING if a in _SHORT], lx.comparative),
    "er_weather": _forms([a for a in lx.ADJ_WEATHER if a in _SHORT], lx.comparative),
    "est_person": _forms([a for a in lx.ADJ_PERSON if a in _SHORT], lx.superlative),
    "est_thing": _forms([a for a in lx.ADJ_THING if a in _SHORT], lx.superlative),
    "long_adj": tuple(lx.ADJ_LONG),
    "long_thing": tuple(a for a in lx.ADJ_THING if a not in _SHORT),
    "adverb": _forms(lx.ADVERB_SOURCES, lx.adverb),
    "weekday": tuple(lx.WEEKDAYS),
    "month": tuple(lx.MONTHS),
    "ordinal": tuple(lx.ordinal(d) for d in range(1, 29)),
    "day": tuple(str(d) for d in range(1, 29)),
    "hour": tuple(lx.number_word(h) for h in range(1, 13)),
    "clock": tuple(f"{h}:{m:02d}" for h in range(1, 13) for m in range(0, 60, 5)),
    "count": tuple(lx.number_word(n) for n in _NUMBERS),
    "digits": tuple(str(n) for n in range(2, 1000)),
    "thousands": tuple(f"{n:,}" for n in range(1000, 10_000, 50)),
}

TALE = [
    ["On {weekday}, the {ordinal} of {month}, {hero} {went} to the {place}.",
     "Once upon a time, {a} {adj_person} {person} named {hero} lived near the {place}."],
    ["There, {subj} {did_thing} {a} {adj_thing} {thing} and {count} {adj_food} {foods}.",
     "{Subj} was {going} to the {place} when {subj} saw {count} {animals}."],
    ['"Why is this {thing} so {adj_thing}?" asked {hero}.',
     '"Who {did_thing} my {things}?" {hero} asked {poss} {animal}.'],
    ['"Because it is {er_thing} than the {thing2}," said {friend}.',
     '"I think the {animals} did," {friend} answered {adverb}.'],
    ["At {clock}, the {animals} were {doing_alone} {adverb} near the {place}.",
     "They {went} past {count} {places} before {clock}."],
    ["{hero} {undid} the {thing} and {did_alone} {adverb}.",
     "Sadly, the {thing} was {un_thing} and {adj_thing}.",
     "{friend} {did_food} the {foods} while {hero} {did_alone}."],
    ['"I have {digits} {foods} and you have {count}," {hero} said to {friend}.',
     '"It cost {thousands} coins," said the {person}.'],
    ["It was the {est_thing} {thing} in the whole {place}.",
     "Everyone said {friend} was the {est_person} {agent} in the {place}.",
     "It was more {long_thing} than any {thing} {subj} had ever seen."],
    ["{hero} felt {un_adj}, but {friend} was {adj_person}.",
     "{hero} was full of {ness}, and so was {poss} {animal}.",
     "The {animal} looked {un_adj}, so {hero} gave it {count} {foods}."],
    ["By {hour} o'clock, everyone was {adj_person} and {adj_person2}.",
     "In the end, {hero} {went} home {adverb}."],
]
DIALOGUE = [
    ['"Good morning, {friend}!" said {hero}.', '"Hello, {friend}, how are you?" asked {hero}.'],
    ['"I am {adj_person}, thank you," said {friend}.', '"A little {adj_person}," said {friend}.'],
    ['"How many {animals} did you see at the {place}?" asked {hero}.',
     '"Are you {doing_thing} the {things} again, {friend}?" asked {hero}.'],
    ['"I saw {count} {animals} and {digits} {animals2}," said {friend}.',
     '"Yes, all {count} of them," said {friend}.'],
    ['"Were they {er_person} than the {animals}?"', '"Were the {animals} {long_adj}?"',
     '"Who is the {est_person} {agent} you know?"'],
    ['"Yes, and the {animal} was the {est_person} of them all."',
     '"No, they were {un_adj} and very {adj_person}."', '"I think it is {name}."'],
    ['"Shall we {do_food} the {foods} at half past {hour}?"',
     '"Can you help me {undo} this {thing}?"'],
    ['"No, let us do it at {clock}," {friend} replied {adverb}.',
     '"Of course, {hero}," said {friend}.'],
    ['"See you on {weekday}!" {hero} called.', '"Goodbye, {friend}!"'],
]
DIARY = [
    ["{weekday}, {day} {month}"],
    ["Dear diary, today I {did_thing} {a} {adj_thing} {thing} at the {place}.",
     "Dear diary, today I {went} to the {place} with {count} {people}."],
    ["At {clock} I {did_food} {count} {foods}, which were very {adj_food}.",
     "I was {doing_food} {foods} when the {animal} came in."],
    ["The weather was {weather}, {er_weather} than yesterday.",
     "My {relative} always {does_alone} when it is {weather}."],
    ["My {relative} {undid} the {thing} while I was {doing_alone}.",
     "My {relative} {does_thing} {things} every {weekday}.",
     "My {relative} {re_did} the {things} {count} times."],
    ["Tomorrow I will {go} to the {place} with {digits} {things}.",
     "Tomorrow I will {do_thing} the {thing} before {hour} o'clock."],
    ["I feel {adj_person}, but a little {un_adj}.", "I am {er_person} than I was on {weekday2}.",
     "I like {doing_alone} more than {doing_thing} {things}."],
]
FORMS = {"tale": TALE, "dialogue": DIALOGUE, "diary": DIARY}
# Answers: these sections take the same choice as the section before them (question i, answer i).
ANSWERS = {"tale": {3}, "dialogue": {3, 5, 7}, "diary": set()}
TEMPLATES = [t for form in FORMS.values() for section in form for t in section]
_SLOT = re.compile(r"\{(\w+)\}")


def _vocab(slot: str) -> tuple[str, ...]:
    """The words a slot takes: {animal2} takes the words of {animal}."""
    return SLOTS[slot.rstrip("0123456789")]


def _fill(template: str, values: dict[str, str], rng: random.Random) -> str:
    """`template` with its slots filled; slots without a story-wide value are drawn from `rng`."""
    names = _SLOT.findall(template)
    chosen = {name: values.get(name) or rng.choice(_vocab(name)) for name in names}
    for name, nxt in zip(names, names[1:] + [""], strict=True):
        if name == "a":  # the article agrees with the word after it: "an old", "a useful"
            chosen[name] = with_article(chosen[nxt]).split(" ")[0]
    return _SLOT.sub(lambda m: chosen[m.group(1)], template)


def generate_rich_story(rng: random.Random) -> list[str]:
    """One tale, conversation or diary page; hero, friend and pronouns stay fixed within it."""
    checks.instance("rng", rng, random.Random, "a random.Random")
    form = rng.choice(list(FORMS))
    she = rng.random() < 0.5
    hero = rng.choice(lx.NAMES_SHE if she else lx.NAMES_HE)
    names = list(SLOTS["hero"])
    names.remove(hero)
    values = {"hero": hero, "friend": rng.choice(names), "Subj": "She" if she else "He",
              "subj": "she" if she else "he", "poss": "her" if she else "his"}
    story, choice = [], 0
    for i, section in enumerate(FORMS[form]):
        if i > 0 and rng.random() >= 0.9:  # each section after the first appears nine times in ten
            continue
        choice = choice % len(section) if i in ANSWERS[form] else rng.randrange(len(section))
        story.append(_fill(section[choice], values, rng))
    return story


def generate_rich_corpus(seed: int = RICH_CORPUS_SEED,
                         min_bytes: int = RICH_CORPUS_MIN_BYTES) -> str:
    """Stories until the text reaches `min_bytes` (UTF-8): one sentence a line, blank line between."""
    seed = checks.integer("seed", seed)
    min_bytes = checks.non_negative_int("min_bytes", min_bytes)
    rng = random.Random(seed)
    stories: list[str] = []
    size = 0
    while size < min_bytes:
        story = "\n".join(generate_rich_story(rng)) + "\n"
        stories.append(story)
        size += len(story.encode("utf-8")) + 1
    return "\n".join(stories)


@cache
def _template_regexes() -> list[tuple[re.Pattern[str], list[str]]]:
    """For each template: a regex with one group per slot, and the slot names in order."""
    compiled = []
    for template in TEMPLATES:
        pieces = _SLOT.split(template)  # literal, slot, literal, slot, ...
        regex = "".join(re.escape(p) if i % 2 == 0 else r"(\S+?)" for i, p in enumerate(pieces))
        compiled.append((re.compile(regex), pieces[1::2]))
    return compiled


@cache
def _vocab_set(slot: str) -> frozenset[str]:
    return frozenset(_vocab(slot))


def _slots_fit(words: tuple[str, ...], slots: list[str]) -> bool:
    if not all(w in _vocab_set(s) for w, s in zip(words, slots, strict=True)):
        return False
    for i, slot in enumerate(slots):
        if slot == "a" and with_article(words[i + 1]).split(" ")[0] != words[i]:
            return False
    return True


def is_rich_well_formed(sentence: str) -> bool:
    """True when the rich grammar can produce `sentence` (surrounding whitespace ignored).

    Each template becomes a regex with a group per slot; a sentence fits when some template
    matches it, every group holds a word its slot takes, and every "a"/"an" suits the next word.
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence is a {type(sentence).__name__}, expected a str")
    sentence = sentence.strip()
    for regex, slots in _template_regexes():
        match = regex.fullmatch(sentence)
        if match and _slots_fit(match.groups(), slots):
            return True
    return False


def rich_well_formed_fraction(text: str) -> float:
    """Share of the non-empty lines of `text` the rich grammar can produce (0.0 for no lines)."""
    if not isinstance(text, str):
        raise TypeError(f"text is a {type(text).__name__}, expected a str")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return 0.0
    return sum(is_rich_well_formed(line) for line in lines) / len(lines)


# A word of the rich corpus: letters (with inner ' or -, as in o'clock and forty-two), or a number
# (with inner , or :, as in 4,250 and 7:30, and an ordinal's ending, as in 21st).
_WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*|\d+(?:[,:]\d+)*(?:st|nd|rd|th)?")


@cache
def _known_words() -> frozenset[str]:
    slot_text = " ".join(word for words in SLOTS.values() for word in words)
    template_text = " ".join(_SLOT.sub(" ", template) for template in TEMPLATES)
    return frozenset(_WORD.findall(slot_text + " " + template_text))


def known_word_fraction(text: str) -> float:
    """Share of the words of `text` that the rich grammar can write somewhere (0.0 for none).

    A gentler measure than `rich_well_formed_fraction`: a line with one misspelt word loses one
    word here, but the whole line there.
    """
    if not isinstance(text, str):
        raise TypeError(f"text is a {type(text).__name__}, expected a str")
    words = _WORD.findall(text)
    if not words:
        return 0.0
    known = _known_words()
    return sum(word in known for word in words) / len(words)


def word_forms() -> set[str]:
    """Every word form the rich grammar can write into a slot (names and numbers included)."""
    return {word for words in SLOTS.values() for word in words}


def load_rich_corpus() -> str:
    """The committed rich corpus as one string."""
    path = data_dir() / RICH_CORPUS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"rich corpus not found at {path}: run python data/make_corpus.py")
    return path.read_text(encoding="utf-8")
