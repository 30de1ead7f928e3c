"""The rich corpus: byte-identical regeneration, real morphology, and a checker that can say no."""

from __future__ import annotations

import random

import pytest

from helpers.text import lexicon as lx
from helpers.text.corpus_rich import (
    RICH_CORPUS_FILE,
    RICH_CORPUS_MIN_BYTES,
    TEMPLATES,
    data_dir,
    generate_rich_corpus,
    generate_rich_story,
    is_rich_well_formed,
    known_word_fraction,
    load_rich_corpus,
    rich_well_formed_fraction,
    word_forms,
)


def test_committed_rich_corpus_is_byte_identical_to_a_regeneration():
    committed = (data_dir() / RICH_CORPUS_FILE).read_bytes()
    assert generate_rich_corpus().encode("utf-8") == committed


def test_rich_corpus_is_a_few_megabytes_of_varied_text():
    text = load_rich_corpus()
    size = len(text.encode("utf-8"))
    assert RICH_CORPUS_MIN_BYTES <= size <= 3_000_000
    assert len(word_forms()) >= 2_000
    used = set(text.replace('"', " ").replace(",", " ").replace(".", " ").split())
    assert len(used) >= 2_000  # the corpus really uses thousands of distinct forms
    for sample in ("boxes", "berries", "carried", "hopped", "untied", "travelled", "wolves", "bigger", "happiest",
                   "unhappy", "quietly", "children", "went", "forty-two", "4,250", "7:30",
                   "o'clock", "21st"):
        assert sample in text, sample


def test_every_generated_sentence_is_well_formed():
    text = load_rich_corpus()
    assert rich_well_formed_fraction(text) == 1.0
    stories = [story for story in text.split("\n\n") if story.strip()]
    assert len(stories) > 5_000
    kinds = {"tale": 0, "dialogue": 0, "diary": 0}
    for story in stories:
        first = story.splitlines()[0]
        kind = "dialogue" if first.startswith('"') else "diary" if first[:3] in (
            "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun") else "tale"
        kinds[kind] += 1
    assert min(kinds.values()) > len(stories) // 5  # all three forms appear often


def test_fresh_stories_from_other_seeds_are_well_formed_too():
    rng = random.Random(7)
    for _ in range(300):
        for sentence in generate_rich_story(rng):
            assert is_rich_well_formed(sentence), sentence


@pytest.mark.parametrize("broken", [
    "",
    "Once upon a time",  # cut short
    "On Monday, the 3rd of May, Mia walked to the river",  # no full stop
    "On Monday, the 3rd of May, Mia walkd to the river.",  # misspelt past
    "On Monday, the 3rd of May, Mia walk to the river.",  # base form where a past belongs
    "On Funday, the 3rd of May, Mia walked to the river.",  # no such weekday
    "On Monday, the 3th of May, Mia walked to the river.",  # wrong ordinal suffix
    "Once upon a time, a honest baker named Mia lived near the river.",  # a/an wrong
    "Once upon a time, an brave baker named Mia lived near the river.",
    '"I saw seven foxs and 12 owls," said Tom.',  # wrong plural
    '"I saw seven foxes and 12 owls, said Tom.',  # missing quote
    "The weather was sunny, sunnyer than yesterday.",  # wrong comparative
    "At 7:30 I ate seven cookies, which were very delicious",
    "river the to walked Mia",
    "Once upon a time, a brave baker named Mia lived near the river. Extra.",
])
def test_broken_sentences_are_rejected(broken):
    assert not is_rich_well_formed(broken)


def test_valid_hand_written_sentences_are_accepted():
    for sentence in ["On Monday, the 3rd of May, Mia walked to the river.",
                     "Once upon a time, an honest baker named Tom lived near the harbour.",
                     '"I saw seven foxes and 12 owls," said Tom.',
                     "The weather was sunny, sunnier than yesterday.",
                     "Tuesday, 14 March"]:
        assert is_rich_well_formed(sentence), sentence


def test_well_formed_fraction_and_type_check():
    assert rich_well_formed_fraction("") == 0.0
    assert rich_well_formed_fraction("Tuesday, 14 March\nnot a sentence\n\n") == 0.5
    with pytest.raises(TypeError, match="sentence"):
        is_rich_well_formed(3)


@pytest.mark.parametrize(("rule", "cases"), [
    (lx.plural, {"cat": "cats", "box": "boxes", "peach": "peaches", "berry": "berries",
                 "day": "days", "child": "children", "knife": "knives", "sheep": "sheep"}),
    (lx.past, {"walk": "walked", "bake": "baked", "carry": "carried", "stop": "stopped",
               "play": "played", "visit": "visited", "open": "opened", "travel": "travelled",
               "go": "went", "catch": "caught"}),
    (lx.present_participle, {"walk": "walking", "bake": "baking", "tie": "tying", "run": "running",
                             "see": "seeing", "open": "opening", "fix": "fixing"}),
    (lx.third_person, {"run": "runs", "wash": "washes", "carry": "carries", "go": "goes",
                       "play": "plays"}),
    (lx.comparative, {"big": "bigger", "brave": "braver", "happy": "happier", "slow": "slower",
                      "quiet": "quieter", "good": "better"}),
    (lx.superlative, {"big": "biggest", "brave": "bravest", "happy": "happiest", "bad": "worst"}),
    (lx.adverb, {"quick": "quickly", "happy": "happily", "gentle": "gently", "true": "truly",
                 "careful": "carefully"}),
    (lx.ordinal, {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th",
                  21: "21st", 22: "22nd"}),
    (lx.number_word, {0: "zero", 7: "seven", 13: "thirteen", 20: "twenty", 42: "forty-two",
                      99: "ninety-nine"}),
])
def test_spelling_rules_on_hand_picked_words(rule, cases):
    assert {word: rule(word) for word in cases} == cases


def test_number_word_range_is_checked():
    with pytest.raises(ValueError, match="n is 100"):
        lx.number_word(100)


def test_templates_are_all_used():
    text = load_rich_corpus()
    lines = set(text.splitlines())
    # each template's fixed opening (up to its first slot) appears at the start of some line
    for template in TEMPLATES:
        opening = template.split("{", 1)[0]
        assert any(line.startswith(opening) for line in lines), template


def test_known_word_fraction_counts_words_the_grammar_knows():
    assert known_word_fraction(load_rich_corpus()[:50_000].rsplit("\n", 1)[0]) == 1.0
    assert known_word_fraction("Mia walkd to the rivr.") == 3 / 5
    assert known_word_fraction('"It cost 4,250 coins," said the potter at 7:30 on the 21st.') == 1.0
    # letter O for digit 0 and back: "7:3", "O", "forty-tw" and "0" are not words of the grammar
    assert known_word_fraction("At 7:3O, forty-tw0 owls") == 2 / 6
    assert known_word_fraction("") == 0.0 and known_word_fraction(" ,.!? ") == 0.0
    with pytest.raises(TypeError, match="text"):
        known_word_fraction(["Mia"])
