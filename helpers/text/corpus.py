"""The course corpus: short stories generated from a small grammar, and a checker for it.

Every sentence of the corpus comes from one of the templates below, with each slot filled from a
word list. Because the grammar is known exactly, `is_well_formed` can tell whether any sentence
(for example one written by a model trained on the corpus) is one the grammar could produce.

The corpus is one sentence per line, with a blank line between stories. It is generated once by
`data/make_corpus.py` and committed as `data/corpus.txt`; a test regenerates it and checks that
the two are byte-identical.
"""

from __future__ import annotations

import random
import re
from functools import cache
from pathlib import Path

from helpers import checks

CORPUS_FILE = "corpus.txt"
CORPUS_SEED = 2017  # the year of "Attention Is All You Need"
CORPUS_MIN_BYTES = 1_000_000

# The toy texts of the lecture notes, kept verbatim as small fixtures.
TOY_SOUP = "I like to eat soup. I am a good cook. Soup is yummy."
TOY_CAT = "The cat sat here"

# --- the word lists -------------------------------------------------------------------------

HEROES = {
    "she": ["Mia", "Lena", "Asha", "Nora", "Zoe", "Ines", "Maya", "Rosa", "Yuki", "Ada", "Lucy",
            "Priya", "Hana", "Ella", "Sofia", "Amara"],
    "he": ["Tom", "Ravi", "Omar", "Leo", "Sam", "Kenji", "Noah", "Ben", "Ivan", "Max", "Felix",
           "Arjun", "Hugo", "Luca", "Theo", "Kofi"],
}
ROLES = ["baker", "farmer", "painter", "sailor", "teacher", "doctor", "gardener", "fisher",
         "potter", "singer", "tailor", "builder", "writer", "inventor", "librarian", "pilot"]
PERSON_ADJECTIVES = ["brave", "kind", "young", "old", "clever", "quiet", "cheerful", "curious",
                     "busy", "gentle", "shy", "honest"]
HOMES = ["small house", "blue cottage", "tall tower", "wooden cabin", "little farm", "busy street",
         "quiet village", "old castle", "big city", "tiny hut"]
PLACES = ["river", "forest", "market", "beach", "hill", "garden", "lake", "bridge", "library",
          "harbour", "meadow", "cave", "park", "mountain", "bakery", "school"]
DAYS = ["morning", "evening", "day", "week", "summer", "winter", "spring", "autumn"]
ACTIVITIES = ["read books", "bake bread", "sing songs", "paint pictures", "plant flowers",
              "watch the birds", "fly a kite", "count the stars", "climb trees", "tell stories",
              "build boats", "draw maps"]
TIMES = ["morning", "afternoon", "evening", "night", "day"]
PETS = ["dog", "cat", "goat", "parrot", "rabbit", "horse", "duck", "turtle"]
PET_ACTIONS = ["barked happily", "ran in circles", "jumped up and down", "wagged its tail",
               "sat down to rest", "looked very proud", "made a funny noise", "fell asleep"]
THING_ADJECTIVES = ["red", "shiny", "old", "heavy", "strange", "golden", "broken", "tiny",
                    "enormous", "blue", "magic", "wet", "orange", "empty"]
THINGS = ["box", "key", "map", "apple", "ball", "book", "lamp", "shell", "hat", "kite", "coin",
          "egg", "drum", "ring", "basket", "umbrella", "violin", "anchor", "ladder", "owl feather"]
EXCLAIMS = ["What a surprise!", "Look at this!", "How wonderful!", "Oh no!", "I can not believe it!",
            "This is amazing!", "Who left this here?", "Come and see!"]
PROBLEMS = ["too heavy to carry", "stuck in the mud", "locked with a chain", "covered in sand",
            "much too big for one person", "hidden under a rock", "tangled in a net"]
FIXES = ["carried it home", "pulled it free", "cleaned it carefully", "opened it slowly",
         "lifted it together", "fixed it with string", "took it to the market"]
FEELINGS = ["happy", "proud", "tired but glad", "grateful", "calm", "excited", "very lucky"]
THANKS = ["Thank you, my friend!", "We make a good team!", "That was fun!", "Let us do it again!",
          "I am glad you asked me!"]


# English picks "a" or "an" by the first *sound*, not the first letter. Two kinds of word break
# the letter rule: a silent "h" starts with a vowel sound ("an honest baker", "an hour"), and a
# "u", "eu" or "o" read as "you" or "w" starts with a consonant sound ("a useful key", "a unique
# map", "a European city", "a one-eyed cat"). The lists cover the grammar's words and their like;
# tests/text/test_corpus.py checks every noun phrase the grammar can write.
SILENT_H = ("honest", "honour", "honor", "hour", "heir")
YOU_SOUND = ("unique", "unicorn", "uniform", "union", "unit", "univers", "use", "usual", "utensil",
             "euro")
W_SOUND = ("one", "once")


def starts_with_vowel_sound(phrase: str) -> bool:
    """True when the first word of `phrase` is read starting with a vowel sound (it takes "an")."""
    checks.instance("phrase", phrase, str, "a str")
    word = re.match(r"[a-z]*", phrase.lower()).group()  # "one-eyed cat" -> "one"
    if word.startswith(SILENT_H):
        return True
    if word.startswith(YOU_SOUND) or word in W_SOUND:
        return False
    return word[:1] in ("a", "e", "i", "o", "u")


def with_article(phrase: str) -> str:
    """`phrase` with "a" or "an" in front, chosen by the sound of its first word."""
    checks.instance("phrase", phrase, str, "a str")
    return ("an " if starts_with_vowel_sound(phrase) else "a ") + phrase


def _noun_phrases(adjectives: list[str], nouns: list[str]) -> list[str]:
    return [with_article(f"{adj} {noun}") for adj in adjectives for noun in nouns]


NAMES = HEROES["she"] + HEROES["he"]
SLOTS: dict[str, list[str]] = {
    "hero": NAMES,
    "friend": NAMES,
    "a_person": _noun_phrases(PERSON_ADJECTIVES, ROLES),
    "a_home": [with_article(home) for home in HOMES],
    "place": PLACES,
    "day": DAYS,
    "activity": ACTIVITIES,
    "time": TIMES,
    "pet": PETS,
    "pet_action": PET_ACTIONS,
    "a_thing": _noun_phrases(THING_ADJECTIVES, THINGS),
    "thing": THINGS,
    "exclaim": EXCLAIMS,
    "problem": PROBLEMS,
    "fix": FIXES,
    "feeling": FEELINGS,
    "thanks": THANKS,
    "subj": ["he", "she"],
    "Subj": ["He", "She"],
    "poss": ["his", "her"],
}

# --- the templates, in story order -----------------------------------------------------------
# Each story uses the lines of every section in order; a section with several lines picks one.
STORY = [
    ["Once upon a time, there was {a_person} named {hero}.",
     "Long ago, {hero} was {a_person} who lived near the {place}."],
    ["{Subj} lived in {a_home} near the {place}.",
     "{hero} lived in {a_home} with {poss} {pet}."],
    ["Every {day}, {subj} liked to {activity}.",
     "{hero} loved to {activity} with {friend}."],
    ["One {time}, {hero} went to the {place} with {poss} {pet}.",
     "One {time}, {hero} walked to the {place} alone."],
    ["There, {subj} found {a_thing}.",
     "Near the {place}, {hero} saw {a_thing}."],
    ['"{exclaim}" said {hero}.'],
    ["{Subj} wanted to give the {thing} to {friend}.",
     "{hero} wanted to show the {thing} to {friend}."],
    ["But the {thing} was {problem}."],
    ["So {hero} asked {friend} for help.",
     "{hero} called {friend} to come and help."],
    ["{friend} and {hero} {fix}.",
     "Together, they {fix}."],
    ["The {pet} {pet_action}."],
    ['{friend} smiled and said, "{thanks}"'],
    ["In the end, {hero} felt {feeling}.",
     "That {time}, {hero} went to sleep feeling {feeling}."],
]
TEMPLATES = [template for section in STORY for template in section]
_SLOT = re.compile(r"\{(\w+)\}")


def _fill(template: str, values: dict[str, str]) -> str:
    return _SLOT.sub(lambda m: values[m.group(1)], template)


def generate_story(rng: random.Random) -> list[str]:
    """One story: a list of sentences in which the names, pet and thing stay consistent."""
    checks.instance("rng", rng, random.Random, "a random.Random")
    gender = rng.choice(["she", "he"])
    hero = rng.choice(HEROES[gender])
    friend = rng.choice([name for name in NAMES if name != hero])
    a_thing = rng.choice(SLOTS["a_thing"])
    values = {slot: rng.choice(words) for slot, words in SLOTS.items()}
    values.update(hero=hero, friend=friend, a_thing=a_thing, thing=a_thing.split(" ", 2)[-1],
                  subj=gender, Subj=gender.capitalize(), poss="her" if gender == "she" else "his")
    # Each section appears with probability 0.9, so stories vary in length as well as words.
    sections = [s for i, s in enumerate(STORY) if i < 2 or rng.random() < 0.9]
    return [_fill(rng.choice(section), values) for section in sections]


def generate_corpus(seed: int = CORPUS_SEED, min_bytes: int = CORPUS_MIN_BYTES) -> str:
    """Stories from the grammar until the text reaches `min_bytes` (UTF-8), one sentence a line."""
    seed = checks.integer("seed", seed)
    min_bytes = checks.non_negative_int("min_bytes", min_bytes)
    rng = random.Random(seed)
    stories: list[str] = []
    size = 0
    while size < min_bytes:
        story = "\n".join(generate_story(rng)) + "\n"
        stories.append(story)
        size += len(story.encode("utf-8")) + 1
    return "\n".join(stories)


@cache
def _template_regexes() -> list[re.Pattern[str]]:
    def slot_pattern(m: re.Match[str]) -> str:
        words = sorted(SLOTS[m.group(1)], key=len, reverse=True)
        return "(?:" + "|".join(re.escape(w) for w in words) + ")"

    patterns = []
    for template in TEMPLATES:
        pieces = _SLOT.split(template)  # literal, slot, literal, slot, ...
        regex = "".join(re.escape(p) if i % 2 == 0 else slot_pattern(re.match(r"(\w+)", p))
                        for i, p in enumerate(pieces))
        patterns.append(re.compile(regex))
    return patterns


def is_well_formed(sentence: str) -> bool:
    """True when the grammar can produce `sentence` (surrounding whitespace ignored)."""
    checks.instance("sentence", sentence, str, "a str")
    sentence = sentence.strip()
    return any(p.fullmatch(sentence) for p in _template_regexes())


def well_formed_fraction(text: str) -> float:
    """Share of the non-empty lines of `text` that the grammar can produce (0.0 for no lines)."""
    checks.instance("text", text, str, "a str")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return 0.0
    return sum(is_well_formed(line) for line in lines) / len(lines)


def data_dir() -> Path:
    """The folder holding the course data, wherever the package was installed from.

    Installed as a wheel, the data travels inside the package (`helpers.coursedata`); in a
    checkout (or an editable install) it is the repository's top-level `data/` folder.
    """
    package = Path(__file__).resolve().parent.parent  # helpers/, this file is helpers/text/corpus.py
    packaged = package / "coursedata"
    if (packaged / CORPUS_FILE).is_file():
        return packaged
    return package.parent / "data"


def load_corpus() -> str:
    """The committed course corpus as one string."""
    path = data_dir() / CORPUS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"course corpus not found at {path}: run python data/make_corpus.py")
    return path.read_text(encoding="utf-8")
